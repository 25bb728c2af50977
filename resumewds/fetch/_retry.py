"""The retry policy: one :class:`FetchBudget` per shard and read, spent by tenacity.

Every request for a shard's bytes runs under :func:`_retry` and draws from
the shard's one budget, shared by this process's threads.  A fault costs an
attempt only without progress (bytes verified since the last fault), so a
network that breaks a third of the responses still delivers every shard.
A read ends after ``attempts`` faults in a row without progress (of the
shard, or of one request while others progress), or ``deadline`` seconds
without progress, waits included; with ``min_rate=0`` the deadline counts
from the read's start.  Permanent errors are never retried.  The policy::

    retry   only a :class:`~resumewds.errors.TransientFetchError`
    wait    none after an attempt that brought bytes; else exponential jitter by
            the request's faults in a row, at least Retry-After, never past the deadline
    stop    the budget is spent, or a Retry-After reaches past the deadline
    sleep   ``FetchConfig.sleep`` (injectable: tests do not wait)

Example:
    >>> from resumewds.fetch import FetchConfig, no_sleep
    >>> b = FetchBudget(FetchConfig(attempts=2, sleep=no_sleep))
    >>> b.fault(OSError("reset")); b.exhausted
    False
    >>> b.fault(OSError("reset")); b.exhausted
    True
    >>> b.progress(); b.exhausted
    False
"""

from __future__ import annotations

import functools
import inspect
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, List, Optional, Tuple

if TYPE_CHECKING:
    from tenacity import RetryCallState

from ..errors import CorruptSample, FetchError, IntegrityError, ResumeWDSError, TransientFetchError
from ..events import EventKind
from ._settings import EventFn, FetchConfig


class FetchBudget:
    """What one read of one shard may still spend, shared by its requests.

    Attributes:
        faults: faults in a row without progress (any request of the shard).
        deadline_at: ``time.monotonic()`` past which nothing more is tried.
        done_at: when the read ended in failure (a failed budget is kept a
            while, so that a reader meets a prefetch's failure at once).

    Example:
        >>> b = FetchBudget(FetchConfig(attempts=3, deadline=5))
        >>> b.remaining() <= 5, b.exhausted
        (True, False)
    """

    def __init__(self, config: FetchConfig):
        self.config = config
        self.faults = 0
        self.progressed = 0
        self.started = time.monotonic()
        self.deadline_at = self.started + float(config.deadline)
        self.last_error: Optional[BaseException] = None
        self.done_at: Optional[float] = None
        #: the first validator (ETag, else Last-Modified) a response of the shard carried, and
        #: ``(that, another)`` once a later one carried another: the object changed on the server
        self.validator: Optional[str] = None
        self.changed: Optional[Tuple[str, str]] = None
        self._lock = threading.Lock()
        self._mine = threading.local()  # progress made by the calling thread (one request at a time)

    def remaining(self) -> float:
        """Seconds left before the deadline (0 when past it)."""
        return max(0.0, self.deadline_at - time.monotonic())

    def progress(self) -> None:
        """Bytes were verified: the faults in a row start from 0, and (with a ``min_rate``) the deadline from now."""
        with self._lock:
            self.faults = 0
            self.progressed += 1
            self._mine.n = getattr(self._mine, "n", 0) + 1
            if self.config.min_rate:
                self.deadline_at = max(self.deadline_at, time.monotonic() + float(self.config.deadline))

    def saw(self, validator: Optional[str]) -> None:
        """A response carried ``validator``; another one later means the object changed on the server."""
        if not validator:
            return
        with self._lock:
            if self.validator is None:
                self.validator = validator
            elif validator != self.validator and self.changed is None:
                self.changed = (self.validator, validator)

    def changed_note(self) -> str:
        """What to add to a final error when the object changed on the server ("" if not)."""
        if self.changed is None:
            return ""
        return (f" (validator {self.changed[0]}, then {self.changed[1]}): the bytes the manifest describes "
                f"are no longer served there; index the shard again, or restore the object")

    def mine(self) -> int:
        """How many times the calling thread reported progress."""
        return int(getattr(self._mine, "n", 0))

    def fault(self, exc: BaseException) -> None:
        """A request failed without progress since the last fault (or at all)."""
        with self._lock:
            self.faults += 1
            if isinstance(exc, (FetchError, IntegrityError)):
                self.last_error = exc

    @property
    def exhausted(self) -> bool:
        """``attempts`` faults in a row without progress, or no time left."""
        return self.faults >= int(self.config.attempts) or self.remaining() <= 0

    def exhausted_error(self, url: str) -> ResumeWDSError:
        """The error to raise when nothing is left (the last failure, if known)."""
        if isinstance(self.last_error, ResumeWDSError):
            return self.last_error
        used = time.monotonic() - self.started
        if self.faults >= int(self.config.attempts):
            return TransientFetchError(f"{url}: {self.config.attempts} fetch attempts in a row failed without "
                                       f"progress (RESUMEWDS_FETCH_ATTEMPTS)", url)
        return TransientFetchError(f"{url}: fetch deadline of {self.config.deadline:g}s without progress reached "
                                   f"after {used:.1f}s (RESUMEWDS_FETCH_DEADLINE)", url)


@functools.cache
def _strategies() -> Tuple[Any, Any, str]:
    """Our tenacity strategies, made on first use (a process reading local shards never imports tenacity)."""
    from tenacity import wait_exponential_jitter
    from tenacity.stop import stop_base
    from tenacity.wait import wait_base

    class _WaitHonouringRetryAfter(wait_base):
        """Exponential jitter by the request's faults in a row, at least Retry-After, within the deadline."""

        def __init__(self, base: Any, budget: FetchBudget, own: List[int]):
            self.base = base
            self.budget = budget
            self.own = own

        def __call__(self, rs: RetryCallState) -> float:
            exc = rs.outcome.exception() if rs.outcome is not None else None
            if self.own[1] or isinstance(exc, CorruptSample):
                return 0.0  # it brought bytes before it broke, or bytes that were wrong: no need to back off
            # the backoff grows with the faults in a row, not with the attempts
            saved = rs.attempt_number
            rs.attempt_number = max(1, self.own[0])
            try:
                wait = float(self.base(rs))
            finally:
                rs.attempt_number = saved
            ra = getattr(exc, "retry_after", None)
            if ra is not None:
                wait = max(wait, float(ra))
            return min(wait, self.budget.remaining())

    class _StopWhenBudgetSpent(stop_base):
        """Stop when the budget or the request's faults are spent, or Retry-After reaches past the deadline."""

        def __init__(self, budget: FetchBudget, own: List[int]):
            self.budget = budget
            self.own = own
            self.reason: Optional[str] = None

        def __call__(self, rs: RetryCallState) -> bool:
            b = self.budget
            if b.exhausted or self.own[0] >= int(b.config.attempts):
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
    """Call ``fn(*args)`` until it succeeds, fails for good, or ``budget`` is spent.

    Each failure is a fault of the budget; ``fn`` reports its own progress
    (:meth:`FetchBudget.progress`, as bytes are verified).
    """
    own = [0, 0]  # this request's faults in a row without progress of its own; whether the last one progressed

    def call(*a: Any) -> Any:
        if budget.exhausted:
            raise budget.exhausted_error(url)
        before = budget.mine()
        try:
            return fn(*a)
        except BaseException as exc:
            if isinstance(exc, TransientFetchError):
                own[1] = int(budget.mine() != before)
                own[0] = 1 if own[1] else own[0] + 1
                budget.fault(exc)
            elif isinstance(exc, FetchError):
                budget.last_error = exc
            raise

    def before_sleep(rs: RetryCallState) -> None:
        if on_event is not None:
            exc = rs.outcome.exception() if rs.outcome is not None else None
            wait = rs.next_action.sleep if rs.next_action is not None else 0.0
            on_event(EventKind.RETRY, url, attempt=rs.attempt_number, error=str(exc), wait=wait)

    from tenacity import Retrying, retry_if_exception_type, wait_exponential_jitter

    _WaitHonouringRetryAfter, _StopWhenBudgetSpent, jitter_start = _strategies()
    base = wait_exponential_jitter(**{jitter_start: config.backoff_initial}, max=config.backoff_max,
                                   jitter=config.backoff_initial)
    stop = _StopWhenBudgetSpent(budget, own)
    retrying = Retrying(
        retry=retry_if_exception_type(TransientFetchError),
        stop=stop,
        wait=_WaitHonouringRetryAfter(base, budget, own),
        sleep=config.sleep,
        reraise=True,
        before_sleep=before_sleep,
    )
    try:
        return retrying(call, *args)
    except TransientFetchError as exc:
        if stop.reason:
            err = TransientFetchError(f"{exc}: {stop.reason}", url, getattr(exc, "status", None),
                                      retry_after=getattr(exc, "retry_after", None))
            budget.last_error = err
            budget.faults = max(budget.faults, int(config.attempts))  # the server said not before the deadline
            raise err from None
        raise
