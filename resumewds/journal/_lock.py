"""The lock file and run-id protocol of a journal file, and its fork safety.

A writer holds an exclusive ``flock`` on ``<file>.lock`` while open
(:class:`LockFile`).  Once the journal holds its run id durably the lock file
records ``{"pid", "run_id", "rank", "journal"}`` and, overwritten in place
after every commit, ``"last_commit": "<step> <ts>"``: a journal deleted while
its lock file stayed (:func:`deleted_error`), or one whose ``-wal`` was lost
(:func:`lost_commits_error`), is refused instead of silently starting over or
rewinding.  Readers take no lock.

A flock belongs to the open file description, which ``fork()`` shares: a
loader's forked workers close their copies first thing
(:func:`close_inherited`), so the lock dies with its owner.  Nothing else in
the process is touched (the descriptor is close-on-exec).
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import time
from typing import Any, Dict, Optional, Set, Tuple

from ..errors import JournalError

# lock descriptors this process holds (with the pid that opened them): a loader's forked
# worker closes its copies (close_inherited)
_CHILD_CLOSE: Set[Tuple[int, int]] = set()


def close_inherited() -> None:
    """In a process forked while journals were open (a loader's worker): close the
    copies of their lock descriptors it inherited, so that the lock dies with its
    owner.  A no-op in the process that opened them.

    Example:
        >>> close_inherited()
    """
    me = os.getpid()
    for pid, fd in list(_CHILD_CLOSE):
        if pid != me:
            try:
                os.close(fd)
            except OSError:
                pass
            _CHILD_CLOSE.discard((pid, fd))


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


#: width of the ``last_commit`` field of the marker ("<step> <ts>" padded with spaces)
COMMIT_FIELD = 48


def commit_record(step: int, ts: float) -> str:
    """The ``last_commit`` field for a commit of ``step`` at ``ts`` (fixed width).

    Example:
        >>> parse_commit_record(commit_record(12, 1700000000.25))
        (12, 1700000000.25)
    """
    return f"{int(step)} {float(ts)!r}".ljust(COMMIT_FIELD)[:COMMIT_FIELD]


def parse_commit_record(text: Any) -> Optional[Tuple[int, float]]:
    """``(step, ts)`` from a ``last_commit`` field; None when empty or malformed."""
    try:
        step, ts = text.split()
        return int(step), float(ts)
    except (AttributeError, TypeError, ValueError):  # not a string, or not two numbers
        return None


def lost_commits_error(file: str, recorded: Tuple[int, float], newest: Optional[int]) -> JournalError:
    """The error for a journal that no longer holds the commit its lock file records."""
    step, ts = recorded
    when = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))
    holds = f"its newest step is {newest}" if newest is not None else "it holds no commit"
    resume = f"resume from step {newest}" if newest is not None else "start over"
    return JournalError(
        f"{file}: journal lost committed steps: its lock file {lock_path(file)} records step {step} "
        f"(committed {when}), but {holds}; its write-ahead log {file}-wal was deleted or truncated "
        f"(or the journal was copied without it, or the machine lost power with synchronous=NORMAL). "
        f"Refusing to resume from an older step, which would deliver committed samples again. "
        f"Restore {file}-wal next to it (stop the run, copy the journal together with its -wal), "
        f"or delete {lock_path(file)} to {resume} anyway")


class LockFile:
    """The writer's exclusive lock on ``<file>.lock`` (``file``: one rank's journal).

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
        self._commit_at: Optional[int] = None  # offset of the last_commit field in the file

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
                raise self._err(f"lock file {self.path} is a symbolic link; refusing to follow it", exc) from exc
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
        _CHILD_CLOSE.add((os.getpid(), fd))

    def write_marker(self, run_id: Optional[str], rank: int,
                     last_commit: Optional[Tuple[int, float]] = None) -> None:
        """Record this process, the run and its newest commit ``(step, ts)``
        (write, then trim: a kill in between never leaves an empty marker)."""
        assert self.fd is not None, "write_marker needs the lock"
        record = commit_record(*last_commit) if last_commit is not None else " " * COMMIT_FIELD
        # last key: its value ends 2 bytes ('"}') before the end of the payload
        payload = json.dumps({"pid": os.getpid(), "run_id": run_id, "rank": rank,
                              "journal": os.path.abspath(self.file), "last_commit": record}).encode()
        try:
            os.pwrite(self.fd, payload, 0)
            os.ftruncate(self.fd, len(payload))
            os.fsync(self.fd)
        except OSError as exc:
            raise self._err(f"cannot write lock file {self.path}", exc) from exc
        self._commit_at = len(payload) - 2 - COMMIT_FIELD

    def record_commit(self, step: int, ts: float) -> None:
        """Overwrite the marker's ``last_commit`` in place: one ``pwrite``, no
        fsync (a record older than the journal only weakens the check)."""
        if self.fd is None or self._commit_at is None:
            return
        try:
            os.pwrite(self.fd, commit_record(step, ts).encode(), self._commit_at)
        except OSError:
            pass

    def unlinked(self) -> bool:
        """True when the lock file this lock holds was deleted or replaced (one ``fstat``)."""
        if self.fd is None:
            return False
        try:
            return os.fstat(self.fd).st_nlink == 0
        except OSError:
            return False

    def release(self) -> None:
        """Drop the lock (closing the descriptor drops the flock); idempotent."""
        if self.fd is not None:
            _CHILD_CLOSE.discard((os.getpid(), self.fd))
            try:
                os.close(self.fd)
            except OSError:
                pass
            self.fd = None
        self._commit_at = None
