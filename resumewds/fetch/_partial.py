"""The partial-file writer: ``<entry>.partial``, hashed as written, and its ``.etag`` sidecar.

The sidecar, ``{"validator": "<ETag or Last-Modified>", "boot": "<boot id>"}``,
proves the partial's bytes are of the source's current version, for a ranged
resume.  Write errors are :class:`~resumewds.fetch._errormap._SinkError`
(the error map makes them a CacheError: the destination's fault).

Example:
    >>> import os, tempfile
    >>> p = os.path.join(tempfile.mkdtemp(), "a.partial")
    >>> _write_validator(p, '"v1"'); _read_validator(p)
    '"v1"'
"""

from __future__ import annotations

import json
import os
from typing import Any, Optional

import xxhash

_ETAG_SUFFIX = ".etag"
_HASH_BUF = 1 << 20


_UNSET = object()
_BOOT_ID: object = _UNSET  # boot_id's cache (tests replace it: resumewds.fetch._partial._BOOT_ID)


def _sink_error(exc: OSError, path: str) -> Exception:
    """The error for a failed write of ``path`` (the error map's, loaded with the first one)."""
    from ._errormap import _SinkError  # lazy: the error map, which a local read never needs

    return _SinkError(exc, path)


def boot_id() -> Optional[str]:
    """This boot's id (Linux), or None where the kernel does not say.

    Unsynced bytes are lost only by a kernel crash or a power cut, which end the
    boot: data written in this boot and still readable is as good as written.

    Example:
        >>> b = boot_id()
        >>> b is None or len(b) > 0
        True
    """
    global _BOOT_ID
    if _BOOT_ID is _UNSET:
        try:
            with open("/proc/sys/kernel/random/boot_id") as f:
                _BOOT_ID = f.read().strip() or None
        except OSError:
            _BOOT_ID = None
    return _BOOT_ID  # type: ignore[return-value]


def _read_validator(partial_path: str) -> Optional[str]:
    """The partial's validator, or None when its bytes cannot be trusted (written in an earlier
    boot, which may have lost unsynced bytes).  A plain-text sidecar is accepted as it is."""
    try:
        with open(partial_path + _ETAG_SUFFIX) as f:
            raw = f.read().strip()
    except OSError:
        return None
    if raw.startswith("{"):
        try:
            d = json.loads(raw)
        except ValueError:
            return None
        if not isinstance(d, dict) or not isinstance(d.get("validator"), str):
            return None
        if d.get("boot") != boot_id():
            return None
        return d["validator"] or None
    return raw or None


def _write_validator(partial_path: str, value: Optional[str]) -> None:
    side = partial_path + _ETAG_SUFFIX
    if value is None:
        _remove_quietly(side)
        return
    try:
        fd = os.open(side, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0), 0o666)
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps({"validator": value, "boot": boot_id()}))
    except OSError as exc:
        raise _sink_error(exc, side) from exc


def _remove_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


def _size_of(path: str) -> int:
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return 0


class _Partial:
    """A partial file and the xxh3_64 of its first ``hashed`` bytes (bytes kept from an earlier
    call are hashed from disk once: :meth:`hash_prefix`)."""

    def __init__(self, path: str):
        self.path = path
        self.received = 0
        self.hasher = xxhash.xxh3_64()
        self.hashed = -1  # unknown until the file is opened

    def hash_prefix(self) -> None:
        """Make ``hasher`` cover the bytes already in the file."""
        have = _size_of(self.path)
        if self.hashed == have:
            return
        self.hasher.reset()
        self.hashed = 0
        try:
            fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        except OSError as exc:
            raise _sink_error(exc, self.path) from exc
        try:
            while True:
                b = os.read(fd, _HASH_BUF)
                if not b:
                    break
                self.hasher.update(b)
                self.hashed += len(b)
        except OSError as exc:
            raise _sink_error(exc, self.path) from exc
        finally:
            os.close(fd)

    def digest(self) -> str:
        """xxh3_64 of the whole file."""
        self.hash_prefix()
        return self.hasher.hexdigest()


class _Sink:
    """The partial file, open for writing, and the xxh3_64 of its bytes."""

    def __init__(self, state: _Partial, append: bool):
        self.state = state
        self.path = state.path
        flags = os.O_WRONLY | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0)
        flags |= os.O_APPEND if append else os.O_TRUNC
        try:
            if not append:
                # a new file, not a truncated one: ext4 flushes a file that was
                # truncated and rewritten when it is closed (auto_da_alloc),
                # which would make every download wait for the disk
                _remove_quietly(self.path)
            self.fd = os.open(self.path, flags, 0o666)
        except OSError as exc:
            raise _sink_error(exc, self.path) from exc
        try:
            if append:
                state.hash_prefix()
            else:
                state.hasher.reset()
                state.hashed = 0
        except BaseException:
            os.close(self.fd)
            raise

    def put(self, data: memoryview) -> None:
        """Write all of ``data`` (a short write is continued, an error raised)."""
        n = len(data)
        done = 0
        try:
            while done < n:
                done += os.write(self.fd, data[done:])
        except OSError as exc:
            # what did reach the file is kept (and hashed) for a later resume
            self._account(data[:done])
            raise _sink_error(exc, self.path) from exc
        self._account(data)

    def _account(self, data: memoryview) -> None:
        st = self.state
        st.hasher.update(data)
        st.hashed += len(data)
        st.received += len(data)

    def close(self) -> None:
        os.close(self.fd)

    def __enter__(self) -> _Sink:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

