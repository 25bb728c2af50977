"""The lock file and run-id protocol of a journal file, and its fork safety.

A writer holds an exclusive ``flock`` on ``<file>.lock`` for as long as it
is open (:class:`LockFile`); a second writer of the same rank file gets
``JournalError`` ("already in use by pid N").  Once the journal holds its
run id durably, the writer records ``{"pid", "run_id", "rank", "journal"}``
in the lock file (:meth:`LockFile.write_marker`), so a journal deleted while
its lock file stayed is reported (:func:`deleted_error`) instead of silently
starting a fresh run.  Delete the lock file too to really start over.
Readers take no lock; they only read the marker (:func:`recorded_run_id`).

Fork safety: a flock belongs to the open file description, which ``fork()``
shares.  A DataLoader worker forked while the journal is open would keep
the lock alive after its parent was killed (until the worker notices,
seconds later), and the rerun would be refused.  Every held lock descriptor
is in ``_CHILD_CLOSE``; a forked child closes its copies at once.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
from typing import Any, Dict, Optional, Set

from ..errors import JournalError

# lock descriptors this process holds; a forked child closes its copies
_CHILD_CLOSE: Set[int] = set()


def _close_lock_fds_in_child() -> None:
    for fd in list(_CHILD_CLOSE):
        try:
            os.close(fd)
        except OSError:
            pass
    _CHILD_CLOSE.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_close_lock_fds_in_child)


def lock_path(file: str) -> str:
    """The lock file of the journal file ``file``: ``<file>.lock``."""
    return file + ".lock"


def read_lock_info(lock_file: str) -> Dict[str, Any]:
    """The marker in ``lock_file`` ({} when absent, empty or unreadable)."""
    try:
        fd = os.open(lock_file, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        with os.fdopen(fd, "r") as f:
            text = f.read()
    except OSError:
        return {}
    try:
        info = json.loads(text) if text.strip() else {}
    except ValueError:
        return {}
    return info if isinstance(info, dict) else {}


def recorded_run_id(file: str) -> Optional[str]:
    """The run id the lock file of journal ``file`` records, or None."""
    return read_lock_info(lock_path(file)).get("run_id")


def deleted_error(file: str) -> JournalError:
    """The error for a journal that is gone while its lock file records a run."""
    return JournalError(
        f"{file}: journal was deleted (its lock file {lock_path(file)} records a run); "
        f"refusing to start a fresh run silently. Restore the journal, or delete "
        f"{lock_path(file)} as well to start over")


class LockFile:
    """The writer's exclusive lock on ``<file>.lock`` (``file``: one rank's journal).

    Errors are ``JournalError`` naming ``file`` first, like every journal error.

    Example:
        >>> lock = LockFile("run.db")
        >>> lock.acquire(); lock.write_marker("abc", rank=0)
        >>> recorded_run_id("run.db")
        'abc'
        >>> lock.release()
    """

    def __init__(self, file: str):
        self.file = file
        self.path = lock_path(file)
        self.fd: Optional[int] = None

    def _err(self, what: str, exc: BaseException) -> JournalError:
        return JournalError(f"{self.file}: {what}: {exc}")

    def acquire(self) -> None:
        """Open (create) the lock file and take the lock, without waiting.

        Raises:
            JournalError: the lock file is a symbolic link, cannot be opened,
                or another process holds the lock (the message names its pid).
        """
        try:
            fd = os.open(self.path, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0)
                         | getattr(os, "O_CLOEXEC", 0), 0o644)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise self._err(f"lock file {self.path} is a symbolic link; refusing to follow it",
                                exc) from exc
            raise self._err(f"cannot open lock file {self.path}", exc) from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                pid = read_lock_info(self.path).get("pid", "unknown")
                raise JournalError(f"{self.file}: journal is already in use by pid {pid} "
                                   f"(lock {self.path})") from exc
            raise self._err(f"cannot lock {self.path}", exc) from exc
        self.fd = fd
        _CHILD_CLOSE.add(fd)

    def write_marker(self, run_id: Optional[str], rank: int) -> None:
        """Record this process and the run in the lock file (write, then
        trim, so a kill in between never leaves an empty marker).  Called
        only once the journal holds the run id durably, so the marker never
        points at a journal that was never written."""
        assert self.fd is not None, "write_marker needs the lock"
        payload = json.dumps({"pid": os.getpid(), "run_id": run_id, "rank": rank,
                              "journal": os.path.abspath(self.file)}).encode()
        try:
            os.pwrite(self.fd, payload, 0)
            os.ftruncate(self.fd, len(payload))
            os.fsync(self.fd)
        except OSError as exc:
            raise self._err(f"cannot write lock file {self.path}", exc) from exc

    def release(self) -> None:
        """Drop the lock (closing the descriptor drops the flock); idempotent."""
        if self.fd is not None:
            _CHILD_CLOSE.discard(self.fd)
            try:
                os.close(self.fd)
            except OSError:
                pass
            self.fd = None
