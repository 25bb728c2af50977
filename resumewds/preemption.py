"""Preemption signals: the loader stops at a step boundary; its workers outlive the signal.

A scheduler about to preempt a job signals it (SIGTERM, SIGUSR1...).  The
loader (:class:`resumewds.WebLoader` with ``preempt=``) catches the signal in
the main process and stops at the end of the current step; its DataLoader
workers must not die first (:func:`_worker_signals`), but must still leave
when the loader shuts them down (the shared flag of :func:`_stop_flag`).

Example:
    >>> import signal
    >>> _preempt_signals(True) == (signal.SIGTERM, signal.SIGUSR1)
    True
"""

from __future__ import annotations

import atexit
import multiprocessing
import os
import signal
from typing import Any, List, Sequence, Tuple, Union

__all__: List[str] = []


def _preempt_signals(preempt: Union[bool, Sequence[int]]) -> Tuple[int, ...]:
    if preempt is False or preempt is None:
        return ()
    if preempt is True:
        return (signal.SIGTERM, signal.SIGUSR1)
    if isinstance(preempt, int):
        return (int(preempt),)
    return tuple(int(s) for s in preempt)


def _worker_signals(signals: Sequence[int], stopping: Any) -> None:
    """In a worker: outlive the preemption signals the main process handles.

    A scheduler that signals the whole process group must not kill the
    workers before the main process reaches its step boundary (torch would
    then raise "worker exited unexpectedly" anywhere in the training step).
    But torch (and multiprocessing at exit) stop workers with SIGTERM too:
    once the main process has flagged ``stopping`` a SIGTERM ends the worker.
    """
    def on_term(signum: int, frame: Any) -> None:
        if stopping is None or stopping.value:
            os._exit(0)  # being shut down: leave quietly (a signal death would be reported)

    for sig in signals:
        if sig == signal.SIGTERM:
            signal.signal(sig, on_term)
        else:
            signal.signal(sig, signal.SIG_IGN)


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
