"""What one fetch may do (:class:`FetchConfig`) and what it did (:class:`FetchResult`).

Environment: every ``RESUMEWDS_FETCH_*`` variable (and ``GOPEN_VERBOSE``) is
read by :meth:`FetchConfig.from_env` through :mod:`resumewds.config`, which
lists them; :class:`~resumewds.cache.ShardStore`, the CLI and remote manifest
fetches all use it.  Nothing in :mod:`resumewds.fetch` reads ``os.environ``
itself.

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
    """How hard to try when fetching one shard.

    Build it with :meth:`from_env` to honour ``RESUMEWDS_FETCH_*`` (defaults,
    then the environment, then your keywords; see :mod:`resumewds.config`).

    Attributes:
        connect_timeout: seconds to establish a connection.
        read_timeout: seconds to wait for the next bytes of a response; a
            stalled body fails with a (transient) read timeout.
        attempts: attempts per shard and read, the first one included.  A
            download that arrives corrupt counts as a failed attempt.
        deadline: seconds per shard and read over all attempts and waits
            (a server's Retry-After that goes past it ends the fetch at once;
            no attempt starts after it, and the timeouts of one are cut to
            it).  A body still arriving at ``min_rate`` or faster is let
            finish; with ``min_rate=0`` the deadline also ends a body.
        backoff_initial: first wait between attempts, doubled each time, plus
            up to ``backoff_initial`` of jitter.
        backoff_max: cap on one wait (a server's Retry-After may exceed it,
            never the deadline).
        chunk_size: bytes per read/write.
        min_rate: bytes per second a body (or a ``pipe:`` command's output)
            must keep up over ``rate_window`` seconds; a slower one (a
            trickle) fails the attempt (transient).  0 disables it.
        rate_window: seconds over which ``min_rate`` is measured.
        max_redirects: redirects followed before a URL fails (permanent: a
            redirect loop does not heal by retrying).
        log_opens: one stderr line per source opened and closed, with url
            and byte count (``GOPEN_VERBOSE=1``, as webdataset's gopen).
        sleep: how to wait; injectable so tests do not wait.  Must be a
            module-level function so that the config pickles.
        s3: a :class:`resumewds.fetch._s3.S3Options` (endpoint, region, ...) for
            ``s3://`` urls; None: from the environment.
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
        """Defaults, then ``RESUMEWDS_FETCH_*`` variables, then ``overrides``.

        ``None`` overrides are ignored (an unset CLI flag).

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
        url: the source.
        path: the file written (``partial_path``).
        size: the file's final size.
        bytes: bytes received by this call (all attempts).
        resumed_from: bytes already in the file when the call began and kept.
        seconds: wall time of the call.
        attempts: attempts made.
        xxh3_64: hex xxh3_64 of the whole file, computed from the bytes as
            they were written (bytes kept from an earlier call are hashed from
            disk), so that a caller need not read the file back to verify it.
    """

    url: str
    path: str
    size: int
    bytes: int
    resumed_from: int
    seconds: float
    attempts: int
    xxh3_64: str = ""
