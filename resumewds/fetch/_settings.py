"""What one fetch may do (:class:`FetchConfig`, the one settings object) and what it did (:class:`FetchResult`).

Example:
    >>> cfg = FetchConfig(attempts=3, sleep=no_sleep)
    >>> cfg.attempts
    3
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any, Callable

from ..config import fetch_settings

EventFn = Callable[..., None]
"""``on_event(kind, url, **detail)``: kind is a :class:`resumewds.events.EventKind`."""


def no_sleep(seconds: float) -> None:
    """A ``sleep`` that does not wait (for tests; module level so it pickles)."""


@dataclass
class FetchConfig:
    """How hard to try when fetching one shard (:meth:`from_env` honours ``RESUMEWDS_FETCH_*``).

    Attributes:
        read_timeout: seconds to wait for the next bytes (a stalled body is a
            transient read timeout).
        attempts: attempts per shard and read, the first included; a corrupt
            download counts as a failed attempt.
        deadline: seconds per shard and read without progress, attempts and waits
            included (a Retry-After past it ends the fetch at once).  A body
            arriving at ``min_rate`` is let finish; with ``min_rate=0`` the
            deadline also ends a body.
        backoff_initial: first wait between attempts, doubled each time, plus up
            to as much jitter; ``backoff_max`` caps one wait (not a Retry-After).
        min_rate: bytes per second a body (or a ``pipe:`` command's output) must
            keep up over ``rate_window`` seconds, else the attempt fails; 0: off.
        max_redirects: redirects followed before a URL fails (permanent).
        log_opens: a stderr line per source opened and closed (``GOPEN_VERBOSE=1``).
        sleep: how to wait (tests inject one); module-level so the config pickles.
        s3: a :class:`resumewds.fetch._s3.S3Options`; None: from the environment.
    """

    connect_timeout: float = 10.0
    read_timeout: float = 30.0
    attempts: int = 8
    deadline: float = 600.0
    backoff_initial: float = 0.5
    backoff_max: float = 30.0
    chunk_size: int = 1 << 20
    sleep: Callable[[float], None] = time.sleep
    min_rate: float = 1024.0
    rate_window: float = 30.0
    max_redirects: int = 10
    log_opens: bool = False
    s3: Any = None

    def __post_init__(self) -> None:
        if not isinstance(self.attempts, int) or isinstance(self.attempts, bool) or self.attempts < 1:
            raise ValueError(f"FetchConfig.attempts must be >= 1, got {self.attempts}")
        if self.chunk_size < 1:
            raise ValueError(f"FetchConfig.chunk_size must be >= 1, got {self.chunk_size}")
        for name in ("connect_timeout", "read_timeout", "deadline", "rate_window"):
            v = getattr(self, name)
            if not v > 0:
                raise ValueError(f"FetchConfig.{name} must be > 0, got {v}")
        for name in ("backoff_initial", "backoff_max", "min_rate", "max_redirects"):
            v = getattr(self, name)
            if not v >= 0:
                raise ValueError(f"FetchConfig.{name} must be >= 0, got {v}")

    @classmethod
    def from_env(cls, **overrides: Any) -> FetchConfig:
        """Defaults, then ``RESUMEWDS_FETCH_*`` variables, then ``overrides`` (``None`` ones ignored).

        Raises:
            ValueError: a variable or override is not a valid value.

        Example:
            >>> FetchConfig.from_env(attempts=2).attempts
            2
        """
        return cls(**fetch_settings(**{k: v for k, v in overrides.items() if v is not None}))


@dataclass
class FetchResult:
    """What one :func:`fetch_to_file` call did.

    Attributes:
        path: the file written (``partial_path``).
        bytes: bytes received by this call (all attempts).
        resumed_from: bytes already in the file when the call began, kept.
        xxh3_64: hex xxh3_64 of the whole file, computed as the bytes were
            written, so the caller need not read the file back to verify it.
    """

    url: str
    path: str
    size: int
    bytes: int
    resumed_from: int
    seconds: float
    attempts: int
    xxh3_64: str = ""
