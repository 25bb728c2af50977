"""Preemption signals: the loader stops at a step boundary; its workers outlive the signal, and still
leave when the loader shuts them down (:func:`_stop_flag`).

Example:
    >>> import signal
    >>> _preempt_signals(True) == (signal.SIGTERM, signal.SIGUSR1)
    True
"""

from __future__ import annotations

import atexit
import contextlib
import multiprocessing
import os
import signal
import threading
from multiprocessing import resource_tracker
from typing import Any, Dict, Iterator, List, Optional, Sequence, Tuple, Union

__all__ = ["Preemptible"]


def _preempt_signals(preempt: Union[bool, Sequence[int]]) -> Tuple[int, ...]:
    if preempt is False or preempt is None:
        return ()
    if preempt is True:
        return (signal.SIGTERM, signal.SIGUSR1)
    if isinstance(preempt, int):
        return (int(preempt),)
    return tuple(int(s) for s in preempt)


def _worker_signals(signals: Sequence[int], stopping: Any) -> None:
    """In a worker: outlive the preemption signals the main process handles.  A signal to the whole
    process group must not kill the workers before the main process reaches its step boundary, yet
    torch and multiprocessing stop workers with SIGTERM too: once ``stopping`` is set a SIGTERM ends
    the worker.  A signal sent before this point waited, blocked (:func:`_blocked_for_start`), and
    reaches the handlers installed here when unblocked."""
    def on_term(signum: int, frame: Any) -> None:
        if stopping is None or stopping.value:
            os._exit(0)  # being shut down: leave quietly (a signal death would be reported)

    for sig in signals:
        if sig == signal.SIGTERM:
            signal.signal(sig, on_term)
        else:
            signal.signal(sig, signal.SIG_IGN)
    if hasattr(signal, "pthread_sigmask"):
        signal.pthread_sigmask(signal.SIG_UNBLOCK, signals)  # a pending one runs on_term now


@contextlib.contextmanager
def _blocked_for_start(signals: Sequence[int], context: Any = None) -> Iterator[None]:
    """``signals`` blocked around the start of a loader's workers: torch's worker start-up installs its
    own SIGTERM handler long before :func:`_worker_signals` runs, and a group signal in between would
    kill the worker.  Nothing is blocked for ``forkserver`` (its server would keep the mask).

    Example:
        >>> import signal
        >>> with _blocked_for_start([signal.SIGUSR1], "fork"):
        ...     pass                       # iter(DataLoader(..., num_workers=2))
    """
    method = _start_method(context) if signals and hasattr(signal, "pthread_sigmask") else None
    if method not in ("fork", "spawn"):
        yield
        return
    if method == "spawn":
        # a spawn starts multiprocessing's resource tracker the first time, and
        # that start unblocks SIGTERM and SIGINT again: started first, here
        resource_tracker.ensure_running()
    old = signal.pthread_sigmask(signal.SIG_BLOCK, signals)
    try:
        yield
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, old)


def _start_method(context: Any) -> Optional[str]:
    """How a DataLoader with ``multiprocessing_context=context`` starts its workers."""
    if context is None:
        return multiprocessing.get_start_method()  # what the DataLoader would use (and fix) a moment later
    if isinstance(context, str):
        return context
    get = getattr(context, "get_start_method", None)
    return get() if callable(get) else None


_LIVE_FLAGS: List[Any] = []  # flags of iterations still running (set at exit, see below)


def _set_live_flags() -> None:
    # runs before multiprocessing's own exit handler (registered earlier, so
    # called later), which terminates daemonic workers and joins them
    for flag in _LIVE_FLAGS:
        flag.value = 1


def _stop_flag() -> Any:
    """A flag in shared memory, set when the loader shuts its workers down."""
    try:
        flag = multiprocessing.RawValue("b", 0)
    except Exception:  # pragma: no cover - no shared memory: workers die with SIGTERM
        return None
    if not _LIVE_FLAGS:
        atexit.unregister(_set_live_flags)
        atexit.register(_set_live_flags)
    _LIVE_FLAGS.append(flag)
    return flag


class Preemptible:
    """A loader's side of preemption: ``preempted``, :meth:`request_stop`, and the handlers ``preempt=``
    installs.

    Example:
        >>> p = Preemptible(); p.preempted = False; p.request_stop(); p.preempted
        True
    """

    preempted: bool
    preempt_signal: Optional[int]
    _old_handlers: Dict[int, Any]
    _preempt_signals: Tuple[int, ...]

    def request_stop(self) -> None:
        """Stop at the next step boundary, as a preemption signal would (safe from a signal handler or
        another thread); :meth:`clear_stop` continues in this process."""
        self.preempted = True

    def clear_stop(self) -> None:
        """Forget a stop request (``preempted`` back to False)."""
        self.preempted = False
        self.preempt_signal = None

    def _on_signal(self, signum: int, frame: Any) -> None:
        if self.preempted and self.preempt_signal == signum:
            # the second one: the previous handler (the default ends the process)
            self.release_signals()
            os.kill(os.getpid(), signum)
            return
        self.preempt_signal = signum  # nothing else here: no locks, no I/O in a signal handler
        self.preempted = True

    def _install_preemption(self) -> None:
        if not self._preempt_signals:
            return
        if threading.current_thread() is not threading.main_thread():
            raise ValueError("WebLoader(preempt=...) installs signal handlers: create the loader in "
                             "the main thread, or call loader.request_stop() from your own handler")
        for sig in self._preempt_signals:
            self._old_handlers[sig] = signal.signal(sig, self._on_signal)

    def release_signals(self) -> None:
        """Give the signals ``preempt=`` took back to their previous handlers (``close()`` does).

        Example:
            >>> p = Preemptible(); p._old_handlers = {}; p.release_signals()
        """
        for sig, old in self._old_handlers.items():
            try:
                signal.signal(sig, old if old is not None else signal.SIG_DFL)
            except (ValueError, OSError):  # not the main thread any more
                pass
        self._old_handlers = {}
