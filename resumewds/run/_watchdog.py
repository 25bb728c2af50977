"""The life of a loader's DataLoader workers: they die with the parent (:func:`die_with_parent`), a
stopped one is named and killed (:class:`WorkerStallError`), and they fork with the parent's
objects frozen (:func:`frozen_for_fork`).

A worker stopped by a signal (state ``T``) never delivers its steps, and the loader, which takes
them in order, would wait forever.  :class:`WorkerWatchdog` counts time only while the worker is
stopped *and* the loader waits (a stop of the whole process group counts nothing); past the limit
(``stall_timeout=``, ``RESUMEWDS_WORKER_STALL``, :data:`DEFAULT_STALL_SECONDS`) it kills the worker.
However an iteration ends, stopped workers are killed: a shutdown would wait to join them.

Example:
    >>> _proc_state(os.getpid()) in ("R", "S", None)
    True
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import signal
import sys
import threading
import time
import weakref
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

from .. import config
from ..errors import ResumeWDSError

__all__ = ["DEFAULT_STALL_SECONDS", "WorkerStallError", "WorkerWatchdog", "die_with_parent", "frozen_for_fork",
           "stall_limit", "worker_died"]

log = logging.getLogger("resumewds")

#: seconds a worker may stay stopped while the loader waits for it (RESUMEWDS_WORKER_STALL)
DEFAULT_STALL_SECONDS = 60.0

_HINT = ("the limit is WebLoader(stall_timeout=SECONDS) or RESUMEWDS_WORKER_STALL=SECONDS "
         "(0: never); send SIGCONT (kill -CONT) to a worker you stopped on purpose")


class WorkerStallError(ResumeWDSError, RuntimeError):
    """A DataLoader worker stopped delivering batches (stopped by a signal).

    Attributes:
        pid: the worker's process id.
        worker: the DataLoader worker id.
        seconds: how long the loader waited while the worker was stopped.
    """

    def __init__(self, message: str, pid: int, worker: int, seconds: float):
        super().__init__(message)
        self.pid = pid
        self.worker = worker
        self.seconds = seconds

    def __reduce__(self) -> Any:
        return (type(self), (str(self), self.pid, self.worker, self.seconds))


def stall_limit(explicit: Optional[float] = None) -> float:
    """Seconds a stopped worker may hold the loader up: ``explicit``, else ``RESUMEWDS_WORKER_STALL``,
    else :data:`DEFAULT_STALL_SECONDS` (0: no limit)."""
    if explicit is not None and not float(explicit) >= 0:
        raise ValueError(f"stall_timeout={explicit!r}: must be >= 0 seconds (0: no limit)")
    return float(config.value("worker_stall", None if explicit is None else float(explicit)))


def _proc_state(pid: int) -> Optional[str]:
    """The state letter of ``/proc/PID/stat`` (``R``, ``S``, ``T``, ``Z``...), None if unknown."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            data = f.read()
    except (OSError, NameError):  # NameError: a loader closed at interpreter exit, builtins gone
        return None
    end = data.rfind(b")")  # the command name may hold spaces and parentheses
    fields = data[end + 2:].split(b" ", 1) if end >= 0 else []
    return fields[0].decode("ascii", "replace") if fields and fields[0] else None


def _stop_pending(pid: int) -> bool:
    """Whether a SIGSTOP waits to be taken by ``pid`` (it stops when it next runs)."""
    bit = 1 << (int(signal.SIGSTOP) - 1)
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith((b"SigPnd:", b"ShdPnd:")) and int(line.split()[1], 16) & bit:
                    return True
    except (OSError, ValueError, IndexError, NameError):  # NameError: at interpreter exit
        pass
    return False


def _gone(pid: int) -> bool:
    """Whether process ``pid`` is dead (no such process, or a zombie)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return True
    except OSError:  # exists, not ours to signal
        return False
    return _proc_state(pid) in ("Z", "X")


@contextlib.contextmanager
def frozen_for_fork() -> Iterator[None]:
    """The parent's objects frozen (``gc.freeze()``) while the workers fork, unfrozen after; left alone
    when the process froze objects itself or disabled the collector.

    Example:
        >>> with frozen_for_fork():
        ...     pass                       # iter(DataLoader(..., num_workers=2))
    """
    if not gc.isenabled() or gc.get_freeze_count():
        yield
        return
    gc.freeze()
    try:
        yield
    finally:
        gc.unfreeze()


def die_with_parent(parent: Optional[int]) -> None:
    """In a DataLoader worker: be killed (SIGKILL) when the main process dies (Linux).  torch's workers
    notice a SIGKILLed parent only while idle, and one blocked flushing its result queue would keep
    cache pins and memory forever.  ``parent``: the main process's pid, recorded before the workers
    started; if it died before ``prctl`` took effect the worker exits now (our parent may differ from
    it: a ``forkserver`` worker)."""
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
    except Exception:  # pragma: no cover - exotic libc
        return
    if parent is not None and os.getppid() != parent and _gone(parent):
        os._exit(1)  # orphaned before prctl took effect (adopted by init or a subreaper)


def worker_died(exc: BaseException) -> Optional[ResumeWDSError]:
    """Our error for torch's "DataLoader worker ... exited unexpectedly"
    (a worker killed by a signal or the OOM killer); None for anything else."""
    text = str(exc)
    if isinstance(exc, RuntimeError) and "DataLoader worker" in text and (
            "exited unexpectedly" in text or "killed by signal" in text):
        return ResumeWDSError(f"{text.strip()} (killed, or out of memory?); progress up to the last "
                              "commit is intact: rerun to continue")
    return None


_LIVE: weakref.WeakSet[WorkerWatchdog] = weakref.WeakSet()  # iterations still running


def _close_live() -> None:
    # at exit, before multiprocessing's own handler (registered earlier, so run
    # later) joins the workers: a live iterator's stopped worker would hang it
    for watch in list(_LIVE):
        watch.close()


class WorkerWatchdog:
    """Watches the workers of one DataLoader iterator for stops (see the module doc); with a ``limit``
    of 0 or less no thread runs, but stopped workers are still named in errors and killed at :meth:`close`."""

    def __init__(self, it: Any, limit: float):
        self._it = it
        workers = (getattr(it, "_workers", None) or []) if sys.platform.startswith("linux") else []
        self.workers: List[Tuple[int, int]] = [(i, int(w.pid)) for i, w in enumerate(workers) if w.pid]
        self.limit = float(limit)
        self.waiting = False  # the loader is inside next(it)
        self.stalled: Optional[WorkerStallError] = None  # set when this watchdog killed a worker
        self._stopped_for: Dict[int, float] = {}
        self._killed: List[int] = []
        self._done = threading.Event()
        self._thread: Optional[threading.Thread] = None
        if self.workers:
            if not _LIVE:
                import atexit

                atexit.unregister(_close_live)
                atexit.register(_close_live)
            _LIVE.add(self)
        if self.limit > 0 and self.workers:
            self._thread = threading.Thread(target=self._run, name="resumewds-worker-watchdog", daemon=True)
            self._thread.start()

    def next_of(self) -> Callable[[], Any]:
        """``next(it)``, marking the time spent in it as waiting."""
        nxt = self._it.__next__
        if self._thread is None:
            return nxt

        def call() -> Any:
            self.waiting = True
            try:
                return nxt()
            finally:
                self.waiting = False

        return call

    def _run(self) -> None:
        poll = min(1.0, max(0.05, self.limit / 20))
        last = time.monotonic()
        while not self._done.wait(poll):
            now = time.monotonic()
            dt, last = now - last, now
            if dt > poll + 5.0:  # this process was stopped itself (or the machine slept): start over
                self._stopped_for.clear()
                continue
            for wid, pid in self.workers:
                if pid in self._killed:
                    continue
                if _proc_state(pid) != "T":
                    self._stopped_for.pop(pid, None)
                    continue
                if self.waiting:
                    held = self._stopped_for[pid] = self._stopped_for.get(pid, 0.0) + dt
                    if held >= self.limit and self.stalled is None:
                        self.stalled = self._error(wid, pid, held, "it was killed")
                        log.info("killing a stopped DataLoader worker: %s", self.stalled)
                        self._kill(pid)

    def _error(self, wid: int, pid: int, held: float, what: str) -> WorkerStallError:
        return WorkerStallError(
            f"DataLoader worker {wid} (pid {pid}) is stopped (SIGSTOP or similar: state T) and delivered "
            f"nothing for {held:.0f} s while the loader waited for its batches; {what}. Progress up to "
            f"the last commit is intact: rerun to continue; {_HINT}", pid, wid, held)

    def _kill(self, pid: int) -> None:
        """SIGKILL a worker, first taken out of torch's SIGCHLD check so that its death raises inside
        ``next(it)``, not anywhere in the main thread."""
        self._killed.append(pid)
        try:
            from torch.utils.data._utils import signal_handling

            if getattr(self._it, "_worker_pids_set", False):
                key = id(self._it)
                signal_handling._remove_worker_pids(key)
                signal_handling._set_worker_pids(
                    key, tuple(p for _, p in self.workers if p not in self._killed))
        except Exception as exc:  # pragma: no cover - another torch: its handler raises at once
            log.debug("could not unregister worker %d from torch's SIGCHLD check: %s", pid, exc)
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass

    def stopped(self) -> List[Tuple[int, int]]:
        """``(worker id, pid)`` of the workers stopped now (or about to stop: SIGSTOP pending)."""
        return [(w, p) for w, p in self.workers
                if p not in self._killed and (_proc_state(p) == "T" or _stop_pending(p))]

    def explain(self, exc: BaseException) -> Optional[ResumeWDSError]:
        """The error to raise for ``exc`` from ``next(it)``: the stall, a stopped worker named when
        DataLoader's own ``timeout`` expired, else :func:`worker_died`'s (or None)."""
        if self.stalled is not None:
            return self.stalled
        if isinstance(exc, RuntimeError) and "DataLoader timed out" in str(exc):
            stopped = self.stopped()
            if stopped:
                wid, pid = stopped[0]
                held = max(self._stopped_for.get(pid, 0.0), float(getattr(self._it, "_timeout", 0) or 0))
                return self._error(wid, pid, held, f"{str(exc).strip()}; the stopped worker was killed")
        return worker_died(exc)

    def close(self) -> None:
        """Stop watching and kill the workers stopped now (a shutdown could not join them).  Idempotent."""
        self._done.set()
        _LIVE.discard(self)
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5.0)
        for wid, pid in self.stopped():
            log.warning("killing DataLoader worker %d (pid %d): it is stopped (state T) and would "
                        "block the shutdown", wid, pid)
            self._kill(pid)
