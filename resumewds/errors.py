"""The resumewds error tree.

Foreign exceptions are translated where they are met (``raise Ours(msg)
from exc``); what is transient is told by type alone::

    ResumeWDSError                               also a subclass of (webdataset 1.0.2)
    ├── SourceError               bad URL, pattern, manifest or scheme    ValueError
    │   └── UnsafeSourceError     pipe: from an untrusted manifest, pickles off
    ├── FetchError                                                        OSError
    │   ├── TransientFetchError   timeouts, resets, 5xx, 429, short body
    │   │   └── CorruptSample     a sample arrived that fails its digest (retried)
    │   ├── RangeIgnored          a Range request answered otherwise (read the shard whole)
    │   └── PermanentFetchError   401/403/404, unknown scheme, missing file
    │       └── ShardNotFoundError  a local shard file does not exist     FileNotFoundError
    ├── CacheError                cache dir unusable (read-only, full)    OSError
    ├── IntegrityError                                                    ValueError
    │   └── ChecksumMismatch      size or xxh3_64 differs from the manifest
    ├── ShardFormatError          not a tar, truncated, bad checksum,     tarfile.ReadError,
    │                             no EOF, a repeated extension            ValueError
    ├── DecodeError               a stage could not decode a sample       ValueError
    │   └── MissingKeyError       a sample lacks a field a stage needs    KeyError
    ├── StateError                a loader state that does not fit        ValueError
    └── JournalError              unreadable, schema too new, locked
        ├── JournalConfigMismatch resume with an incompatible configuration
        └── JournalIncompleteCommit a step that not every rank committed

The second column is what webdataset 1.0.2 raises there.  Every class is
``Cls(message, *, field=value)`` and pickles with its fields across a DataLoader
worker; the older positional forms of ChecksumMismatch and ShardFormatError work.

Example:
    >>> from resumewds.errors import ShardFormatError, ResumeWDSError
    >>> issubclass(ShardFormatError, ResumeWDSError)
    True
"""

from __future__ import annotations

import errno as _errno
import tarfile
from typing import Any, Optional

from .redact import redact_text


class ResumeWDSError(Exception):
    """Base class of every error raised by resumewds.

    ``str(exc)`` is the one-line message (``exc.args == (message,)``),
    redacted (:func:`resumewds.redact.redact_text`); the keyword fields are
    attributes, kept as given.
    """

    def __init__(self, msg: str = "", **fields: Any):
        super().__init__(redact_text(msg) if isinstance(msg, str) else msg)
        for k, v in fields.items():
            setattr(self, k, v)

    def __str__(self) -> str:  # KeyError and OSError bases format args their own way
        return str(self.args[0]) if self.args else ""


class SourceError(ResumeWDSError, ValueError):
    """A shard source (URL, pattern, manifest) is malformed or unusable."""


class UnsafeSourceError(SourceError):
    """A source would run code or commands the user did not allow."""


class FetchError(ResumeWDSError, OSError):
    """A shard could not be fetched.

    Attributes:
        url: the URL (or pipe command) that failed.
        status: the HTTP status, if there was one.
    """

    url: str
    status: Optional[int]

    def __init__(self, msg: str = "", url: str = "", status: Optional[int] = None, **fields: Any):
        super().__init__(msg, url=url, status=status, **fields)


class TransientFetchError(FetchError):
    """A failure that may go away on retry (timeout, reset, 5xx, short body)."""

    retry_after: Optional[float]

    def __init__(self, msg: str = "", url: str = "", status: Optional[int] = None,
                 retry_after: Optional[float] = None, **fields: Any):
        super().__init__(msg, url, status, retry_after=retry_after, **fields)


class CorruptSample(TransientFetchError):
    """A sample arrived with bytes that fail its digest (retried from that sample).

    Attributes:
        sample: its index in the shard.
        expected, actual: the digests, in hex.
    """

    sample: int
    expected: str
    actual: str


class PermanentFetchError(FetchError):
    """A failure that retrying will not fix (404, 403, unknown scheme)."""


class RangeIgnored(FetchError):
    """The server answered a Range request with something other than that range
    (a 200, a 416, another range): the shard is read whole instead."""


class ShardNotFoundError(PermanentFetchError, FileNotFoundError):
    """A local shard file does not exist (webdataset: ``FileNotFoundError``,
    with ``errno`` ENOENT)."""

    def __init__(self, msg: str = "", url: str = "", status: Optional[int] = None, **fields: Any):
        super().__init__(msg, url, status, **fields)
        self.errno = _errno.ENOENT


class CacheError(ResumeWDSError, OSError):
    """The shard cache cannot be used (read-only, full, unsafe path)."""


class IntegrityError(ResumeWDSError, ValueError):
    """Bytes do not match what the manifest promises."""


class ChecksumMismatch(IntegrityError):
    """Size or xxh3_64 digest of a shard differs from the expected value.

    Attributes:
        url: the shard.
        expected: expected digest or size (as text).
        actual: what was found.
        what: ``"xxh3_64"`` or ``"size"``.
    """

    url: str
    expected: Optional[str]
    actual: Optional[str]
    what: str

    def __init__(self, msg: str = "", *positional: str, url: Optional[str] = None,
                 expected: Optional[str] = None, actual: Optional[str] = None,
                 what: str = "xxh3_64", **fields: Any):
        if positional:  # the older (url, expected, actual) form
            expected, actual = positional[0], positional[1] if len(positional) > 1 else None
            url = msg if url is None else url
            msg = f"{url}: {what} mismatch: expected {expected}, got {actual}"
        super().__init__(msg, url=url or "", expected=expected, actual=actual, what=what, **fields)


class ShardFormatError(ResumeWDSError, tarfile.ReadError, ValueError):
    """A shard is not a well-formed tar archive.

    Attributes:
        shard: the shard's URL or path.
        offset: byte offset where the problem was found.
        problem: what is wrong there.
    """

    shard: str
    offset: Optional[int]
    problem: str

    def __init__(self, msg: str = "", *positional: Any, shard: Optional[str] = None,
                 offset: Optional[int] = None, problem: Optional[str] = None, **fields: Any):
        if positional:  # the older (shard, offset, problem) form
            offset, problem = positional[0], positional[1] if len(positional) > 1 else ""
            shard = msg if shard is None else shard
            msg = f"{shard}: at byte {offset}: {problem}"
        super().__init__(msg, shard=shard or "", offset=offset, problem=problem or "", **fields)


class DecodeError(ResumeWDSError, ValueError):
    """A decoder or stage failed on a sample (webdataset: ``ValueError``
    for a missing ``to_tuple`` field)."""


class MissingKeyError(DecodeError, KeyError):
    """A sample lacks a field a stage needs (webdataset: ``KeyError`` from
    ``map_dict``).

    Attributes:
        key: the missing field.
    """


class StateError(ResumeWDSError, ValueError):
    """A loader state dict that does not fit the loader it is loaded into."""


class JournalError(ResumeWDSError):
    """The journal cannot be used: unreadable, corrupt, locked, newer schema."""


class JournalConfigMismatch(JournalError):
    """Resuming with a configuration that differs from the journal's."""


class JournalIncompleteCommit(JournalError):
    """A step that not every rank of its layout committed."""


# ---- the one errno table ------------------------------------------------------------
#: the words an OSError's errno is reported with, where they say more than ``strerror``
OS_PROBLEMS = {
    _errno.ENOSPC: "no space left on device",
    _errno.EDQUOT: "disk quota exceeded",
    _errno.EROFS: "read-only file system",
    _errno.EACCES: "permission denied (not writable?)",
    _errno.EPERM: "operation not permitted",
    _errno.EFBIG: "file too large",
    _errno.ELOOP: "is a symlink, refusing to follow it",
    _errno.ENOTDIR: "a path component is not a directory",
}


def os_problem(exc: OSError) -> str:
    """What went wrong, in a few words, for a one-line error message.

    Example:
        >>> os_problem(OSError(_errno.ENOSPC, "No space left on device"))
        'no space left on device'
        >>> os_problem(OSError(_errno.EIO, "Input/output error"))
        'Input/output error'
    """
    return OS_PROBLEMS.get(exc.errno or 0, exc.strerror or str(exc))


def naming(subject: str, problem: object) -> str:
    """``subject: problem``, naming the subject once: an error's message
    usually starts with its shard or file already.

    Example:
        >>> naming("/d/a.tar", "/d/a.tar: no such file"), naming("/d/a.tar", "no such file")
        ('/d/a.tar: no such file', '/d/a.tar: no such file')
    """
    text = str(problem)
    return text if text.startswith(f"{subject}:") else f"{subject}: {text}"


class HandlerStop(Exception):
    """A handler returned False (``ignore_and_stop``, ``warn_and_stop``): stop iterating.

    Caught where the iteration can end quietly (:func:`resumewds.stages.until_stop`);
    a signal, not a failure (not a :class:`ResumeWDSError`).

    Attributes:
        skipped: raised by a stage's handler: the item's ``SkippedSample``, until
            whatever runs the stage records it; else None.
    """

    skipped: Any = None


__all__ = ["HandlerStop", "CacheError", "ChecksumMismatch", "CorruptSample", "DecodeError", "FetchError",
           "IntegrityError", "JournalConfigMismatch", "JournalError", "JournalIncompleteCommit", "MissingKeyError",
           "PermanentFetchError", "RangeIgnored", "ResumeWDSError", "ShardFormatError", "ShardNotFoundError",
           "SourceError", "StateError", "TransientFetchError", "UnsafeSourceError"]
