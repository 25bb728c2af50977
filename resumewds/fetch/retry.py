"""The retry policy: one :class:`FetchBudget` per shard and read, spent by tenacity.

Budget: the attempts of one shard for one read draw from one
:class:`FetchBudget` (``attempts`` and ``deadline``), shared by the prefetch
thread and the reader.  The deadline bounds everything: waits between
attempts (a Retry-After past it ends the fetch at once), each attempt's
timeouts (:class:`resumewds.fetch.attempt._Pace`), and the body itself
(checked after every read, with a minimum transfer rate, so a trickle ends
too).

The policy is tenacity's ``Retrying`` with two strategies of ours, small
callables in tenacity's own style (``wait_base`` / ``stop_base``, so ``+``
and ``|`` compose them):

    retry   only a :class:`~resumewds.errors.TransientFetchError`
    wait    exponential backoff with jitter, at least the server's
            Retry-After, never past the deadline (:class:`_WaitHonouringRetryAfter`)
    stop    the budget has no attempt or time left, or a Retry-After reaches
            past the deadline (:class:`_StopWhenBudgetSpent`)
    sleep   ``FetchConfig.sleep`` (injectable: tests do not wait)

Every request for a shard's bytes draws from that budget: whole-shard
attempts (:func:`resumewds.fetch.transport._run_attempt`) and ranged reads and
repairs (:func:`resumewds.repair.fetch_range`, which gives a successful
request's attempt back with :meth:`FetchBudget.refund`).

Example:
    >>> from resumewds.fetch import FetchConfig, no_sleep
    >>> b = FetchBudget(FetchConfig(attempts=1, sleep=no_sleep))
    >>> b.take(), b.exhausted
    (True, True)
"""

from __future__ import annotations

import functools
import inspect
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Optional, Tuple

if TYPE_CHECKING:
    from tenacity import RetryCallState

from ..errors import FetchError, ResumeWDSError, TransientFetchError
from ..events import EventKind
from .settings import EventFn, FetchConfig


class FetchBudget:
    """The attempts and the time one read of one shard may spend, shared.

    The prefetch thread and the reader that later wants the same shard draw
    from one budget, so a dead server costs one ``deadline`` (or one run of
    ``attempts``), not two.  Waiting for another thread's download of the
    shard spends the same deadline.

    Every request for the shard draws an attempt with :meth:`hold` (whole
    downloads and ranged reads alike) and ends it with :meth:`spend` (it
    failed, or a whole download's attempt) or :meth:`refund` (a ranged
    request that succeeded gives its attempt back).  While every attempt
    left is held by requests in flight, :meth:`hold` waits for one of them
    to end: the requests in flight never exceed the attempts left.

    Attributes:
        attempts_left: attempts not yet made (or held by requests in flight).
        held: requests in flight holding an attempt.
        deadline_at: ``time.monotonic()`` past which nothing more is tried.
        last_error: the error of the last attempt that failed, if any.
        fetched: a whole-shard download of this read succeeded (a ranged
            request that finds no attempt left reads the shard whole instead).

    Example:
        >>> b = FetchBudget(FetchConfig(attempts=2, deadline=5))
        >>> b.take(), b.take(), b.take()
        (True, True, False)
    """

    def __init__(self, config: FetchConfig):
        self.config = config
        self.attempts_left = int(config.attempts)
        self.held = 0
        self.fetched = False
        self.started = time.monotonic()
        self.deadline_at = self.started + float(config.deadline)
        self.last_error: Optional[BaseException] = None
        self.done_at: Optional[float] = None
        self._lock = threading.Condition()

    def remaining(self) -> float:
        """Seconds left before the deadline (0 when past it)."""
        return max(0.0, self.deadline_at - time.monotonic())

    def take(self) -> bool:
        """Use one attempt (not held: spent at once); False when none (or no time) is left."""
        with self._lock:
            if self.attempts_left <= 0 or self.remaining() <= 0:
                return False
            self.attempts_left -= 1
            return True

    def hold(self) -> bool:
        """Take one attempt for a request about to be made, to be ended by
        :meth:`spend` or :meth:`refund`; while the attempts left are all held
        by requests in flight, wait for one to end.  False when none (or no
        time) is left."""
        with self._lock:
            while self.attempts_left <= 0 and self.held > 0 and self.remaining() > 0:
                self._lock.wait(min(self.remaining(), 1.0))
            if self.attempts_left <= 0 or self.remaining() <= 0:
                return False
            self.attempts_left -= 1
            self.held += 1
            return True

    def spend(self) -> None:
        """End a held attempt: it stays used (a failure, or a whole download)."""
        with self._lock:
            self.held = max(0, self.held - 1)
            self._lock.notify_all()

    def refund(self) -> None:
        """End a held attempt by giving it back (a ranged request that
        succeeded), and restart the deadline: only failed requests stay
        spent, and a read that keeps succeeding is not running out of time."""
        with self._lock:
            self.held = max(0, self.held - 1)
            self.attempts_left = min(int(self.config.attempts), self.attempts_left + 1)
            self.deadline_at = max(self.deadline_at, time.monotonic() + float(self.config.deadline))
            self._lock.notify_all()

    @property
    def exhausted(self) -> bool:
        """No time left, or no attempt left and none held by a request in flight."""
        return (self.attempts_left <= 0 and self.held <= 0) or self.remaining() <= 0

    def exhausted_error(self, url: str) -> ResumeWDSError:
        """The error to raise when nothing is left (the last failure, if known:
        a fetch error, or the mismatch of a corrupt download)."""
        if isinstance(self.last_error, ResumeWDSError):
            return self.last_error
        used = time.monotonic() - self.started
        if self.attempts_left <= 0:
            return TransientFetchError(f"{url}: all {self.config.attempts} fetch attempts used "
                                       f"(RESUMEWDS_FETCH_ATTEMPTS)", url)
        return TransientFetchError(f"{url}: fetch deadline of {self.config.deadline:g}s reached after "
                                   f"{used:.1f}s (RESUMEWDS_FETCH_DEADLINE)", url)


@functools.cache
def _strategies() -> Tuple[Any, Any, str]:
    """tenacity's strategies of ours, made on the first retry policy (tenacity is
    imported then: a process that reads local shards only never imports it)."""
    from tenacity import wait_exponential_jitter
    from tenacity.stop import stop_base
    from tenacity.wait import wait_base

    class _WaitHonouringRetryAfter(wait_base):
        """Exponential jitter, but at least the server's Retry-After, and never
        past the budget's deadline."""

        def __init__(self, base: Callable[[RetryCallState], float], budget: FetchBudget):
            self.base = base
            self.budget = budget

        def __call__(self, rs: RetryCallState) -> float:
            wait = float(self.base(rs))
            exc = rs.outcome.exception() if rs.outcome is not None else None
            ra = getattr(exc, "retry_after", None)
            if ra is not None:
                wait = max(wait, float(ra))
            return min(wait, self.budget.remaining())

    class _StopWhenBudgetSpent(stop_base):
        """Stop when the shared budget has no attempt or time left, or when the
        server's Retry-After reaches past the deadline (waiting for it would
        leave no time to try again: give up now, and say why)."""

        def __init__(self, budget: FetchBudget):
            self.budget = budget
            self.reason: Optional[str] = None

        def __call__(self, rs: RetryCallState) -> bool:
            b = self.budget
            if b.exhausted:
                return True
            exc = rs.outcome.exception() if rs.outcome is not None else None
            ra = getattr(exc, "retry_after", None)
            if ra is not None and ra >= b.remaining():
                self.reason = (f"the server asks to retry after {ra:g}s, beyond what is left of the "
                               f"{b.config.deadline:g}s fetch deadline ({b.remaining():.1f}s); giving up")
                return True
            return False

    # tenacity 9 renamed wait_exponential_jitter's ``initial`` to ``multiplier``
    params = inspect.signature(wait_exponential_jitter.__init__).parameters
    start = "multiplier" if "multiplier" in params else "initial"
    return _WaitHonouringRetryAfter, _StopWhenBudgetSpent, start


def _retry(config: FetchConfig, url: str, on_event: Optional[EventFn], budget: FetchBudget,
           fn: Callable[..., Any], *args: Any) -> Any:
    """Call ``fn(*args)`` until it succeeds or ``budget`` is spent."""
    def before_sleep(rs: RetryCallState) -> None:
        if on_event is not None:
            exc = rs.outcome.exception() if rs.outcome is not None else None
            wait = rs.next_action.sleep if rs.next_action is not None else 0.0
            on_event(EventKind.RETRY, url, attempt=rs.attempt_number, error=str(exc), wait=wait)

    from tenacity import Retrying, retry_if_exception_type, wait_exponential_jitter

    _WaitHonouringRetryAfter, _StopWhenBudgetSpent, jitter_start = _strategies()
    base = wait_exponential_jitter(**{jitter_start: config.backoff_initial}, max=config.backoff_max,
                                   jitter=config.backoff_initial)
    stop = _StopWhenBudgetSpent(budget)
    retrying = Retrying(
        retry=retry_if_exception_type(TransientFetchError),
        stop=stop,
        wait=_WaitHonouringRetryAfter(base, budget),
        sleep=config.sleep,
        reraise=True,
        before_sleep=before_sleep,
    )
    try:
        return retrying(fn, *args)
    except TransientFetchError as exc:
        if stop.reason:
            err = TransientFetchError(f"{exc}: {stop.reason}", url, getattr(exc, "status", None),
                                     retry_after=getattr(exc, "retry_after", None))
            budget.last_error = err
            budget.attempts_left = 0  # the server said not before the deadline: nobody may ask sooner
            raise err from exc
        budget.last_error = exc
        raise
    except FetchError as exc:
        budget.last_error = exc
        raise

