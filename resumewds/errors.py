"""The resumewds error tree.

Every failure the library reports is one of these; foreign exceptions
(``requests``', ``OSError``, ``sqlite3``'s) are translated at the module
boundary that meets them, with ``raise Ours(msg) from exc``.  Callers can
decide what is transient by type alone::

    ResumeWDSError
    ├── SourceError               bad URL, pattern, manifest or scheme
    │   └── UnsafeSourceError     pipe: from an untrusted manifest, pickles off
    ├── FetchError
    │   ├── TransientFetchError   timeouts, resets, 5xx, 429, short body
    │   └── PermanentFetchError   401/403/404, unknown scheme, missing file
    ├── CacheError                cache dir unusable (read-only, full, symlink)
    ├── IntegrityError
    │   └── ChecksumMismatch      size or xxh3_64 differs from the manifest
    ├── ShardFormatError          not a tar, truncated, bad checksum, no EOF
    ├── DecodeError               a stage could not decode a sample
    ├── StateError                a loader state that does not fit this loader
    └── JournalError              unreadable, schema too new, locked
        ├── JournalConfigMismatch resume with an incompatible configuration
        └── JournalIncompleteCommit a step that not every rank committed

Example:
    >>> from resumewds.errors import ShardFormatError, ResumeWDSError
    >>> issubclass(ShardFormatError, ResumeWDSError)
    True
"""

from __future__ import annotations

from typing import Optional


class ResumeWDSError(Exception):
    """Base class of every error raised by resumewds."""


class SourceError(ResumeWDSError):
    """A shard source (URL, pattern, manifest) is malformed or unusable."""


class UnsafeSourceError(SourceError):
    """A source would run code or commands the user did not allow."""


class FetchError(ResumeWDSError):
    """A shard could not be fetched.

    Attributes:
        url: the URL (or pipe command) that failed.
        status: the HTTP status, if there was one.
    """

    def __init__(self, msg: str, url: str = "", status: Optional[int] = None):
        super().__init__(msg)
        self.url = url
        self.status = status


class TransientFetchError(FetchError):
    """A failure that may go away on retry (timeout, reset, 5xx, short body)."""

    def __init__(self, msg: str, url: str = "", status: Optional[int] = None,
                 retry_after: Optional[float] = None):
        super().__init__(msg, url, status)
        self.retry_after = retry_after


class PermanentFetchError(FetchError):
    """A failure that retrying will not fix (404, 403, unknown scheme)."""


class CacheError(ResumeWDSError):
    """The shard cache cannot be used (read-only, full, unsafe path)."""


class IntegrityError(ResumeWDSError):
    """Bytes do not match what the manifest promises."""


class ChecksumMismatch(IntegrityError):
    """Size or xxh3_64 digest of a shard differs from the expected value.

    Attributes:
        url: the shard.
        expected: expected digest or size (as text).
        actual: what was found.
    """

    def __init__(self, url: str, expected: str, actual: str, what: str = "xxh3_64"):
        super().__init__(f"{url}: {what} mismatch: expected {expected}, got {actual}")
        self.url = url
        self.expected = expected
        self.actual = actual
        self.what = what


class ShardFormatError(ResumeWDSError):
    """A shard is not a well-formed tar archive.

    Attributes:
        shard: the shard's URL or path.
        offset: byte offset where the problem was found.
    """

    def __init__(self, shard: str, offset: int, problem: str):
        super().__init__(f"{shard}: at byte {offset}: {problem}")
        self.shard = shard
        self.offset = offset
        self.problem = problem


class DecodeError(ResumeWDSError):
    """A decoder failed on a sample member."""


class StateError(ResumeWDSError):
    """A loader state dict that does not fit the loader it is loaded into."""


class JournalError(ResumeWDSError):
    """The journal cannot be used: unreadable, corrupt, locked, newer schema."""


class JournalConfigMismatch(JournalError):
    """Resuming with a configuration that differs from the journal's."""


class JournalIncompleteCommit(JournalError):
    """A step that not every rank of its layout committed."""


__all__ = [
    "CacheError",
    "ChecksumMismatch",
    "DecodeError",
    "FetchError",
    "IntegrityError",
    "JournalConfigMismatch",
    "JournalError",
    "JournalIncompleteCommit",
    "PermanentFetchError",
    "ResumeWDSError",
    "ShardFormatError",
    "SourceError",
    "StateError",
    "TransientFetchError",
    "UnsafeSourceError",
]
