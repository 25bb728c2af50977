"""One attempt: the state the attempts of one fetch share (:class:`_Attempt`), and its pacing.

:meth:`_Attempt._copy` is every transport's copy loop: read into the
thread's buffer, sniff for an HTML page, write through the sink, tick the pace.

Example:
    >>> from resumewds.fetch import FetchBudget, FetchConfig
    >>> cfg = FetchConfig(min_rate=0, deadline=60)
    >>> _Pace("http://h/a.tar", cfg, FetchBudget(cfg)).timeout(5.0)
    5.0
"""

from __future__ import annotations

import threading
import time
from typing import Any, Callable, Optional

from ..errors import PermanentFetchError, TransientFetchError
from ._partial import _Partial, _Sink
from ._retry import FetchBudget
from ._settings import FetchConfig

_NET_BUF = 1 << 20  # most bytes one socket read may return (fewer GIL round trips on fast links)
_TLS = threading.local()


class _Pace:
    """Bounds one attempt in time: a minimum rate, or the fetch deadline.

    ``tick(n)`` after every read: slower than ``min_rate`` bytes/s over
    ``rate_window`` seconds (a trickle no per-read timeout catches) fails the
    attempt (transient).  A body keeping the minimum rate may finish past the
    deadline; with ``min_rate=0`` the deadline ends it.
    """

    def __init__(self, url: str, config: FetchConfig, budget: FetchBudget, what: str = "body"):
        self.url = url
        self.config = config
        self.budget = budget
        self.what = what
        self.n = 0
        self.mark_t = time.monotonic()
        self.mark_n = 0

    def tick(self, n: int) -> None:
        self.n += n
        now = time.monotonic()
        if now >= self.budget.deadline_at and not self.config.min_rate:
            raise TransientFetchError(f"{self.url}: fetch deadline of {self.config.deadline:g}s reached while "
                                      f"receiving the {self.what} ({self.n} bytes this attempt)", self.url)
        span = now - self.mark_t
        if self.config.min_rate and span >= self.config.rate_window:
            got = self.n - self.mark_n
            if got < self.config.min_rate * span:
                raise TransientFetchError(
                    f"{self.url}: {self.what} too slow: {got} bytes in {span:.1f}s, below the minimum of "
                    f"{self.config.min_rate:g} bytes/s (RESUMEWDS_FETCH_MIN_RATE); giving up on this attempt",
                    self.url)
            self.mark_t, self.mark_n = now, self.n

    def timeout(self, t: float) -> float:
        """``t``, shortened to what is left of the deadline (at least 10 ms)."""
        return max(0.01, min(t, self.budget.remaining()))

    def body_timeout(self, t: float) -> float:
        """The wait for a body's next bytes: ``t``, or without a minimum rate what is left of the deadline."""
        return t if self.config.min_rate else self.timeout(t)


_HTML_STARTS = (b"<!doctype html", b"<html", b"<head", b"<body", b"<?xml")


def _looks_like_html(head: bytes) -> bool:
    return head[:512].lstrip().lower().startswith(_HTML_STARTS)


class _HtmlBody(Exception):
    def __init__(self, head: bytes):
        super().__init__("html")
        self.head = head


class _Attempt(_Partial):
    """State shared by the attempts of one fetch_to_file call (the partial file, hashed as written)."""

    def __init__(self, url: str, path: str, expected_size: Optional[int], config: FetchConfig,
                 session: Any, budget: FetchBudget, max_bytes: Optional[int] = None):
        super().__init__(path)
        self.url = url
        self.expected_size = expected_size
        self.config = config
        self.session = session  # a requests Session (http), else None
        self.budget = budget
        self.max_bytes = max_bytes
        self.attempts = 0
        self.no_range = False  # the server answered a Range request wrongly: whole GETs only
        #: this attempt's bytes are kept for a resume (a validator proves them): they are progress
        self.keeps = False
        self._buf: Optional[memoryview] = None

    def buffer(self) -> memoryview:
        if self._buf is None:
            size = min(self.config.chunk_size, _NET_BUF)
            buf = getattr(_TLS, "buf", None)
            if buf is None or len(buf) != size:
                buf = _TLS.buf = memoryview(bytearray(size))  # one per thread, reused
            self._buf = buf
        return self._buf

    def _too_big(self, n: int) -> PermanentFetchError:
        return PermanentFetchError(f"{self.url}: larger than the {self.max_bytes} bytes accepted "
                                   f"({n} bytes; manifest_max_bytes=, RESUMEWDS_MANIFEST_MAX_BYTES)", self.url)

    def _put(self, sink: _Sink, data: memoryview, pace: _Pace) -> None:
        sink.put(data)
        if self.max_bytes is not None and pace.n + len(data) > self.max_bytes:
            raise self._too_big(pace.n + len(data))
        pace.tick(len(data))
        if self.keeps:
            self.budget.progress()  # kept in the partial for a resume: a fault after it costs no attempt

    def _copy(self, readinto: Callable[[memoryview], int], sink: _Sink, pace: _Pace,
              sniff: bool = False) -> None:
        buf = self.buffer()
        while True:
            n = readinto(buf)
            if not n:
                return
            if sniff:
                sniff = False
                if _looks_like_html(bytes(buf[:n])):
                    raise _HtmlBody(bytes(buf[:min(n, 200)]))
            self._put(sink, buf[:n], pace)

    def _check_expected(self, size: int) -> None:
        if self.expected_size is not None and size < self.expected_size:
            raise TransientFetchError(f"{self.url}: short body: file has {size} of the expected "
                                      f"{self.expected_size} bytes", self.url)
