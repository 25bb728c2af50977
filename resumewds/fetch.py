"""Fetch shards from http(s)://, file://, local paths and ``pipe:`` commands.

One *attempt* downloads what is missing of a shard into a ``.partial`` file;
a tenacity ``Retrying`` loop repeats attempts that failed with a
:class:`~resumewds.errors.TransientFetchError`.  Every foreign exception
(requests', urllib3's, ``OSError``, ``subprocess``') is turned into one of
ours in exactly one place, :func:`_translate`.
requests (and urllib3) is imported at the first http(s) fetch, not with this
module: local, ``file://`` and ``pipe:`` reads never load it.

Range resume (http/https only)::

    partial has N > 0 bytes and a validator in <partial>.etag
        -> GET  Range: bytes=N-   If-Range: <ETag or Last-Modified>
           206 (Content-Range starts at N, same validator)  append
           206 with another validator (server ignored If-Range)  start over
           200 (file changed, or server ignores Range)  restart from zero
           416 (bytes */N)  the partial is already complete
    otherwise
        -> GET (no Range), truncate, save the response's validator

``file://``, plain paths and ``pipe:CMD`` always restart from zero.

Budget: the attempts of one shard for one read draw from one
:class:`FetchBudget` (``attempts`` and ``deadline``), shared by the prefetch
thread and the reader.  The deadline bounds everything: waits between
attempts (a Retry-After past it ends the fetch at once), each attempt's
timeouts, and the body itself (checked after every read, with a minimum
transfer rate, so a trickle ends too).

Classification:

    transient   connection refused/reset, connect and read timeouts (a stalled
                body is a read timeout), a body slower than ``min_rate``, 5xx,
                429, 503 (honouring Retry-After up to the deadline), a body
                shorter than Content-Length / Content-Range /
                ``expected_size``, a 206 of another version, a ``pipe:``
                command exiting non-zero or writing nothing for
                ``read_timeout`` seconds (its process group is killed)
    permanent   401, 403, 404, 410 and other 4xx, more than ``max_redirects``
                redirects (a loop), a Content-Encoding other than identity, an
                HTML page where a shard was expected, an object larger than
                ``max_bytes``, unknown scheme, missing local file
    CacheError  the destination cannot be written (read-only, disk full)

Environment: every ``RESUMEWDS_FETCH_*`` variable (and ``GOPEN_VERBOSE``) is
read by :meth:`FetchConfig.from_env` through :mod:`resumewds.config`, which
lists them; :class:`~resumewds.cache.ShardStore`, the CLI and remote manifest
fetches all use it.

Example:
    >>> cfg = FetchConfig(attempts=3, sleep=no_sleep)
    >>> cfg.attempts
    3
"""

from __future__ import annotations

import dataclasses
import email.utils
import errno
import http.client
import inspect
import json
import os
import re
import select
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.parse
from dataclasses import dataclass
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any, Callable, Dict, Optional, Tuple

import xxhash
from tenacity import RetryCallState, Retrying, retry_if_exception_type, wait_exponential_jitter

if TYPE_CHECKING:  # requests (and urllib3 under it) is imported at the first http(s) fetch: ~0.1 s
    import requests  # that local shards, file:// and pipe: never pay, in each DataLoader worker

from .errors import (
    CacheError,
    FetchError,
    PermanentFetchError,
    ResumeWDSError,
    TransientFetchError,
)

EventFn = Callable[..., None]


class _NotImported(Exception):
    """Stands for an exception class of a library not imported yet: nothing is an
    instance of it (no requests/urllib3 exception exists before they are imported)."""


_REQ_NAMES = ("InvalidURL", "MissingSchema", "InvalidSchema", "TooManyRedirects", "ConnectTimeout",
              "ReadTimeout", "ConnectionError", "ChunkedEncodingError", "ContentDecodingError",
              "RequestException")
_NO_REQUESTS = SimpleNamespace(**dict.fromkeys(_REQ_NAMES, _NotImported))
_NO_URLLIB3 = SimpleNamespace(ReadTimeoutError=_NotImported, HTTPError=_NotImported)


def _requests() -> Any:
    """The requests module, imported at the first http(s) fetch (not at import:
    local, file:// and pipe: reads, e.g. in every DataLoader worker, never load it)."""
    import requests

    return requests


def _foreign_exceptions() -> Tuple[Any, Any]:
    """``requests.exceptions`` and ``urllib3.exceptions``, or stand-ins matching
    nothing while they are not imported (then no exception of theirs can exist)."""
    rx = sys.modules.get("requests.exceptions")
    ux = sys.modules.get("urllib3.exceptions")
    return (rx if rx is not None else _NO_REQUESTS), (ux if ux is not None else _NO_URLLIB3)

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
        s3: a :class:`resumewds.s3.S3Options` (endpoint, region, ...) for
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
    def from_env(cls, **overrides: Any) -> "FetchConfig":
        """Defaults, then ``RESUMEWDS_FETCH_*`` variables, then ``overrides``.

        ``None`` overrides are ignored (an unset CLI flag).

        Raises:
            ValueError: a variable or override is not a valid value.

        Example:
            >>> FetchConfig.from_env(attempts=2).attempts
            2
        """
        from . import config

        return cls(**config.fetch_settings(**{k: v for k, v in overrides.items() if v is not None}))


class FetchBudget:
    """The attempts and the time one read of one shard may spend, shared.

    The prefetch thread and the reader that later wants the same shard draw
    from one budget, so a dead server costs one ``deadline`` (or one run of
    ``attempts``), not two.  Waiting for another thread's download of the
    shard spends the same deadline.

    Attributes:
        attempts_left: attempts not yet made.
        deadline_at: ``time.monotonic()`` past which nothing more is tried.
        last_error: the error of the last attempt that failed, if any.

    Example:
        >>> b = FetchBudget(FetchConfig(attempts=2, deadline=5))
        >>> b.take(), b.take(), b.take()
        (True, True, False)
    """

    def __init__(self, config: FetchConfig):
        self.config = config
        self.attempts_left = int(config.attempts)
        self.started = time.monotonic()
        self.deadline_at = self.started + float(config.deadline)
        self.last_error: Optional[BaseException] = None
        self.done_at: Optional[float] = None
        self._lock = threading.Lock()

    def remaining(self) -> float:
        """Seconds left before the deadline (0 when past it)."""
        return max(0.0, self.deadline_at - time.monotonic())

    def take(self) -> bool:
        """Use one attempt; False when none (or no time) is left."""
        with self._lock:
            if self.attempts_left <= 0 or self.remaining() <= 0:
                return False
            self.attempts_left -= 1
            return True

    @property
    def exhausted(self) -> bool:
        return self.attempts_left <= 0 or self.remaining() <= 0

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


# ---------------------------------------------------------------------------
# error translation: the one place where foreign exceptions become ours
# ---------------------------------------------------------------------------
class _SinkError(Exception):
    """An OSError while writing the destination (not the source's fault)."""

    def __init__(self, exc: OSError, path: str):
        super().__init__(str(exc))
        self.exc = exc
        self.path = path


_SINK_PROBLEMS = {
    errno.ENOSPC: "no space left on device",
    errno.EDQUOT: "disk quota exceeded",
    errno.EROFS: "read-only file system",
    errno.EACCES: "permission denied",
    errno.EPERM: "operation not permitted",
    errno.EFBIG: "file too large",
    errno.ELOOP: "refusing to follow a symlink",
}


def _translate(exc: BaseException, url: str) -> ResumeWDSError:
    """Map a foreign exception met while fetching ``url`` to one of ours.

    The caller raises the result ``from exc``.
    """
    if isinstance(exc, ResumeWDSError):
        return exc
    if isinstance(exc, _SinkError):
        inner = exc.exc
        problem = _SINK_PROBLEMS.get(inner.errno or 0, inner.strerror or str(inner))
        return CacheError(f"{os.path.dirname(exc.path) or '.'}: cannot write {os.path.basename(exc.path)}"
                          f" while fetching {url}: {problem}")
    rx, ux = _foreign_exceptions()
    if isinstance(exc, rx.InvalidURL) or isinstance(exc, rx.MissingSchema) \
            or isinstance(exc, rx.InvalidSchema):
        return PermanentFetchError(f"{url}: invalid URL: {exc}", url)
    if isinstance(exc, rx.TooManyRedirects):
        return PermanentFetchError(f"{url}: too many redirects (a redirect loop?; more than "
                                   f"RESUMEWDS_FETCH_MAX_REDIRECTS are not followed): {exc}", url)
    if isinstance(exc, (rx.ConnectTimeout,)):
        return TransientFetchError(f"{url}: connect timeout: {exc}", url)
    if isinstance(exc, (rx.ReadTimeout, socket.timeout, TimeoutError,
                        ux.ReadTimeoutError)):
        return TransientFetchError(f"{url}: read timeout (stalled): {exc}", url)
    if isinstance(exc, rx.ConnectionError):
        # requests wraps read timeouts met while streaming a body here too
        inner = exc.args[0] if exc.args else None
        if isinstance(inner, ux.ReadTimeoutError):
            return TransientFetchError(f"{url}: read timeout (stalled): {exc}", url)
        return TransientFetchError(f"{url}: connection error: {exc}", url)
    if isinstance(exc, (rx.ChunkedEncodingError, rx.ContentDecodingError,
                        ux.HTTPError, http.client.HTTPException)):
        return TransientFetchError(f"{url}: broken response body: {exc}", url)
    if isinstance(exc, rx.RequestException):
        return TransientFetchError(f"{url}: request failed: {exc}", url)
    if isinstance(exc, FileNotFoundError):
        return PermanentFetchError(f"{url}: no such file: {exc.filename or url}", url)
    if isinstance(exc, (IsADirectoryError, NotADirectoryError, PermissionError)):
        return PermanentFetchError(f"{url}: cannot read: {exc.strerror or exc}", url)
    if isinstance(exc, (ConnectionError, socket.error)):  # resets, refused, broken pipe
        return TransientFetchError(f"{url}: connection error: {exc}", url)
    if isinstance(exc, subprocess.SubprocessError):
        return TransientFetchError(f"{url}: command failed: {exc}", url)
    return FetchError(f"{url}: unexpected {type(exc).__name__}: {exc}", url)


def _status_error(url: str, resp: requests.Response) -> FetchError:
    """The error for a non-success HTTP status."""
    code = resp.status_code
    reason = resp.reason or ""
    if code == 429 or code >= 500:
        ra = parse_retry_after(resp.headers.get("Retry-After"))
        extra = f" (Retry-After {ra:g}s)" if ra is not None else ""
        return TransientFetchError(f"{url}: HTTP {code} {reason}{extra}", url, code, retry_after=ra)
    return PermanentFetchError(f"{url}: HTTP {code} {reason}", url, code)


def parse_retry_after(value: Optional[str]) -> Optional[float]:
    """Seconds from a Retry-After header (delta-seconds or HTTP date).

    Example:
        >>> parse_retry_after("3")
        3.0
        >>> parse_retry_after(None) is None
        True
    """
    if not value:
        return None
    value = value.strip()
    try:
        return max(0.0, float(value))
    except ValueError:
        pass
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    if when is None:
        return None
    return max(0.0, when.timestamp() - time.time())


# ---------------------------------------------------------------------------
# retry policy
# ---------------------------------------------------------------------------
class _WaitHonouringRetryAfter:
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


class _StopWhenBudgetSpent:
    """Stop when the shared budget has no attempt or time left, or when the
    server's Retry-After reaches past the deadline (waiting for it would
    leave no time to try again: give up now, and say why)."""

    def __init__(self, budget: FetchBudget):
        self.budget = budget
        self.reason: Optional[str] = None

    def __call__(self, rs: RetryCallState) -> bool:
        b = self.budget
        if b.attempts_left <= 0 or b.remaining() <= 0:
            return True
        exc = rs.outcome.exception() if rs.outcome is not None else None
        ra = getattr(exc, "retry_after", None)
        if ra is not None and ra >= b.remaining():
            self.reason = (f"the server asks to retry after {ra:g}s, beyond what is left of the "
                           f"{b.config.deadline:g}s fetch deadline ({b.remaining():.1f}s); giving up")
            return True
        return False


# tenacity 9 renamed wait_exponential_jitter's ``initial`` to ``multiplier``
_JITTER_START = ("multiplier" if "multiplier" in inspect.signature(wait_exponential_jitter.__init__).parameters
                 else "initial")


def _retry(config: FetchConfig, url: str, on_event: Optional[EventFn], budget: FetchBudget,
           fn: Callable[..., Any], *args: Any) -> Any:
    """Call ``fn(*args)`` until it succeeds or ``budget`` is spent."""
    def before_sleep(rs: RetryCallState) -> None:
        if on_event is not None:
            exc = rs.outcome.exception() if rs.outcome is not None else None
            wait = rs.next_action.sleep if rs.next_action is not None else 0.0
            on_event("retry", url, attempt=rs.attempt_number, error=str(exc), wait=wait)

    base = wait_exponential_jitter(**{_JITTER_START: config.backoff_initial}, max=config.backoff_max,
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
            err = TransientFetchError(f"{exc}: {stop.reason}", url, exc.status, retry_after=exc.retry_after)
            budget.last_error = err
            budget.attempts_left = 0  # the server said not before the deadline: nobody may ask sooner
            raise err from exc
        budget.last_error = exc
        raise
    except FetchError as exc:
        budget.last_error = exc
        raise


# ---------------------------------------------------------------------------
# sources
# ---------------------------------------------------------------------------
def scheme_of(url: str) -> str:
    """``http``, ``https``, ``file``, ``pipe`` or ``local``; else the raw scheme.

    Example:
        >>> scheme_of("/data/a.tar"), scheme_of("pipe:cat a.tar"), scheme_of("s3://b/a.tar")
        ('local', 'pipe', 's3')
    """
    if url.startswith("pipe:"):
        return "pipe"
    m = re.match(r"^([A-Za-z][A-Za-z0-9+.-]*)://", url)
    if not m:
        return "local"
    return m.group(1).lower()


def local_path(url: str) -> str:
    """The filesystem path of a ``file://`` URL or plain path."""
    if url.startswith("file://"):
        return urllib.parse.unquote(urllib.parse.urlparse(url).path)
    return url


def is_remote_url(url: str) -> bool:
    """True for sources that must be downloaded (http, https, s3, pipe:)."""
    return scheme_of(url) in ("http", "https", "s3", "pipe")


_SESSION_CLASS: Optional[type] = None


def _session_class() -> type:
    """``_Session`` (below), defined at the first http(s) fetch, when requests is imported."""
    global _SESSION_CLASS
    if _SESSION_CLASS is None:
        requests = _requests()

        class _Session(requests.Session):
            """A Session that reads the environment (proxies, CA bundle) once per
            origin instead of on every request (requests scans ``os.environ`` twice
            per request: about 0.4 ms, several % of a shard's download)."""

            def __init__(self) -> None:
                super().__init__()
                self._env_cache: Dict[Any, Dict[str, Any]] = {}

            def merge_environment_settings(self, url, proxies, stream, verify, cert):  # type: ignore[override]
                if proxies or not self.trust_env:
                    return super().merge_environment_settings(url, proxies, stream, verify, cert)
                p = urllib.parse.urlsplit(url)
                key = (p.scheme, p.netloc, stream, verify, cert)
                try:
                    hit = self._env_cache.get(key)
                except TypeError:  # an unhashable verify/cert: no caching
                    return super().merge_environment_settings(url, proxies, stream, verify, cert)
                if hit is None:
                    hit = super().merge_environment_settings(url, proxies, stream, verify, cert)
                    if len(self._env_cache) > 256:
                        self._env_cache.clear()
                    self._env_cache[key] = hit
                return dict(hit, proxies=dict(hit["proxies"]))

        _SESSION_CLASS = _Session
    return _SESSION_CLASS


def new_session() -> requests.Session:
    """A requests Session for fetching shards (imports requests on first use)."""
    s = _session_class()()
    s.headers["Accept-Encoding"] = "identity"  # byte counts must be the file's
    s.headers["User-Agent"] = "resumewds"
    return s


_ETAG_SUFFIX = ".etag"
_NET_BUF = 1 << 20  # most bytes one socket read may return (fewer GIL round trips on fast links)
_HASH_BUF = 1 << 20


def boot_id() -> Optional[str]:
    """This boot's id (Linux), or None where the kernel does not say.

    Bytes written without an fsync can only be lost by a kernel crash or a
    power cut, and both end the boot; data written in *this* boot and still
    readable is therefore as good as it was when it was written.

    Example:
        >>> b = boot_id()
        >>> b is None or len(b) > 0
        True
    """
    global _BOOT_ID
    if _BOOT_ID is _UNSET:
        try:
            with open("/proc/sys/kernel/random/boot_id", "r") as f:
                _BOOT_ID = f.read().strip() or None
        except OSError:
            _BOOT_ID = None
    return _BOOT_ID  # type: ignore[return-value]


_TLS = threading.local()
_UNSET = object()
_BOOT_ID: object = _UNSET


def _read_validator(partial_path: str) -> Optional[str]:
    """The partial's validator, or None when its bytes cannot be trusted.

    The sidecar is ``{"validator": V, "boot": B}``.  A partial written in an
    earlier boot may have lost unsynced bytes to the crash that ended it, so
    it is not resumed.  (A plain-text sidecar from an older version is
    accepted as it is.)
    """
    try:
        with open(partial_path + _ETAG_SUFFIX, "r") as f:
            raw = f.read().strip()
    except OSError:
        return None
    if raw.startswith("{"):
        try:
            d = json.loads(raw)
        except ValueError:
            return None
        if not isinstance(d, dict) or not isinstance(d.get("validator"), str):
            return None
        if d.get("boot") != boot_id():
            return None
        return d["validator"] or None
    return raw or None


def _write_validator(partial_path: str, value: Optional[str]) -> None:
    side = partial_path + _ETAG_SUFFIX
    if value is None:
        _remove_quietly(side)
        return
    try:
        fd = os.open(side, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | getattr(os, "O_NOFOLLOW", 0), 0o666)
        with os.fdopen(fd, "w") as f:
            f.write(json.dumps({"validator": value, "boot": boot_id()}))
    except OSError as exc:
        raise _SinkError(exc, side) from exc


def _remove_quietly(path: str) -> None:
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass


class _Sink:
    """The partial file, open for writing, and the xxh3_64 of its bytes."""

    def __init__(self, state: "_Attempt", append: bool):
        self.state = state
        self.path = state.path
        flags = os.O_WRONLY | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0)
        flags |= os.O_APPEND if append else os.O_TRUNC
        try:
            if not append:
                # a new file, not a truncated one: ext4 flushes a file that was
                # truncated and rewritten when it is closed (auto_da_alloc),
                # which would make every download wait for the disk
                _remove_quietly(self.path)
            self.fd = os.open(self.path, flags, 0o666)
        except OSError as exc:
            raise _SinkError(exc, self.path) from exc
        try:
            if append:
                state.hash_prefix()
            else:
                state.hasher.reset()
                state.hashed = 0
        except BaseException:
            os.close(self.fd)
            raise

    def put(self, data: memoryview) -> None:
        """Write all of ``data`` (a short write is continued, an error raised)."""
        n = len(data)
        done = 0
        try:
            while done < n:
                done += os.write(self.fd, data[done:])
        except OSError as exc:
            # what did reach the file is kept (and hashed) for a later resume
            self._account(data[:done])
            raise _SinkError(exc, self.path) from exc
        self._account(data)

    def _account(self, data: memoryview) -> None:
        st = self.state
        st.hasher.update(data)
        st.hashed += len(data)
        st.received += len(data)

    def close(self) -> None:
        os.close(self.fd)

    def __enter__(self) -> "_Sink":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class _Body:
    """Reads a response body into our buffer: ``readinto(buf) -> n``, 0 at
    its end, returning what one socket read gives (bytes reach the partial
    file as they arrive, so a kill loses almost nothing).

    With a Content-Length the socket under urllib3's ``http.client``
    response is read directly, and a body read to its end hands the
    connection back to the pool (:meth:`finish`), so the next shard from the
    same server skips the TCP (and TLS) handshake and slow start.  Chunked
    and close-delimited bodies go through ``http.client``'s ``read1``;
    anything else falls back to ``raw.read`` (one copy more).
    """

    def __init__(self, raw: Any):
        self.raw = raw
        self.left: Optional[int] = None
        self.kind = "raw"
        fp = getattr(raw, "_fp", None)
        if isinstance(fp, http.client.HTTPResponse):
            self.fp = fp
            self.sock_file = getattr(fp, "fp", None)
            if not fp.chunked and isinstance(fp.length, int) and hasattr(self.sock_file, "readinto1"):
                self.kind, self.left = "sized", fp.length
            else:
                self.kind = "read1"

    def readinto(self, buf: memoryview) -> int:
        if self.kind == "sized":
            left = self.left or 0
            if left <= 0:
                return 0
            n = self.sock_file.readinto1(buf if left >= len(buf) else buf[:left])
            self.left = left - n
            return n
        if self.kind == "read1":
            data = self.fp.read1(len(buf))
        else:
            data = self.raw.read(len(buf), decode_content=False)
        buf[: len(data)] = data
        return len(data)

    def finish(self) -> None:
        """After a complete sized body: mark http.client's response done (as
        its own reads would have) and return the connection to the pool."""
        if self.kind != "sized" or self.left != 0:
            return
        self.fp.length = 0
        self.fp.close()
        self.raw.release_conn()


def _size_of(path: str) -> int:
    try:
        return os.stat(path).st_size
    except FileNotFoundError:
        return 0


_CONTENT_RANGE = re.compile(r"^\s*bytes\s+(\d+)-(\d+)/(\d+|\*)\s*$")
_CONTENT_RANGE_UNSAT = re.compile(r"^\s*bytes\s+\*/(\d+)\s*$")


class _Pace:
    """Bounds one attempt in time: a minimum rate, or the fetch deadline.

    ``tick(n)`` after every read: slower than ``min_rate`` bytes/s over
    ``rate_window`` seconds (a body that trickles, which no per-read timeout
    ever catches), the attempt fails (transient).  A body that keeps the
    minimum rate is let finish even past the deadline (a large shard on a
    slow link is not a failure); with ``min_rate=0`` the deadline ends it.
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
        """The wait for the next bytes of a body: ``t``, or with no minimum
        rate (then the deadline is the body's only bound) what is left of it."""
        return t if self.config.min_rate else self.timeout(t)


_HTML_STARTS = (b"<!doctype html", b"<html", b"<head", b"<body", b"<?xml")


def _looks_like_html(head: bytes) -> bool:
    return head[:512].lstrip().lower().startswith(_HTML_STARTS)


class _Attempt:
    """State shared by the attempts of one fetch_to_file call.

    ``hasher`` holds the xxh3_64 of the first ``hashed`` bytes of the partial
    file, updated as bytes are written, so the finished file need not be read
    back to be verified.
    """

    def __init__(self, url: str, path: str, expected_size: Optional[int], config: FetchConfig,
                 session: Optional[requests.Session], budget: FetchBudget, max_bytes: Optional[int] = None):
        self.url = url
        self.path = path
        self.expected_size = expected_size
        self.config = config
        self.session = session
        self.budget = budget
        self.max_bytes = max_bytes
        self.received = 0
        self.attempts = 0
        self.hasher = xxhash.xxh3_64()
        self.hashed = -1  # unknown until the file is opened
        self._buf: Optional[memoryview] = None

    def buffer(self) -> memoryview:
        if self._buf is None:
            size = min(self.config.chunk_size, _NET_BUF)
            buf = getattr(_TLS, "buf", None)
            if buf is None or len(buf) != size:
                buf = _TLS.buf = memoryview(bytearray(size))  # one per thread, reused
            self._buf = buf
        return self._buf

    def hash_prefix(self) -> None:
        """Make ``hasher`` cover the bytes already in the file."""
        have = _size_of(self.path)
        if self.hashed == have:
            return
        self.hasher.reset()
        self.hashed = 0
        try:
            fd = os.open(self.path, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        except OSError as exc:
            raise _SinkError(exc, self.path) from exc
        try:
            while True:
                b = os.read(fd, _HASH_BUF)
                if not b:
                    break
                self.hasher.update(b)
                self.hashed += len(b)
        except OSError as exc:
            raise _SinkError(exc, self.path) from exc
        finally:
            os.close(fd)

    def digest(self) -> str:
        """xxh3_64 of the whole file."""
        self.hash_prefix()
        return self.hasher.hexdigest()

    def _too_big(self, n: int) -> PermanentFetchError:
        return PermanentFetchError(f"{self.url}: larger than the {self.max_bytes} bytes accepted "
                                   f"({n} bytes; RESUMEWDS_MANIFEST_MAX_BYTES)", self.url)

    def _put(self, sink: "_Sink", data: memoryview, pace: _Pace) -> None:
        sink.put(data)
        if self.max_bytes is not None and pace.n + len(data) > self.max_bytes:
            raise self._too_big(pace.n + len(data))
        pace.tick(len(data))

    def _copy(self, readinto: Callable[[memoryview], int], sink: "_Sink", pace: _Pace,
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

    # -- http ---------------------------------------------------------------
    def http(self) -> None:
        cfg = self.config
        pace = _Pace(self.url, cfg, self.budget)
        have = _size_of(self.path)
        validator = _read_validator(self.path) if have else None
        if have and (validator is None or (self.expected_size is not None and have > self.expected_size)):
            have = 0  # cannot prove the bytes belong to the current file: restart
        headers = {"Accept-Encoding": "identity"}  # byte counts must be the file's, whatever the session
        if have:
            headers["Range"] = f"bytes={have}-"
            headers["If-Range"] = validator  # type: ignore[assignment]
        if self.session is None:
            self.session = new_session()
        self.session.max_redirects = cfg.max_redirects
        resp = self.session.get(self.url, headers=headers, stream=True,
                                timeout=(pace.timeout(cfg.connect_timeout), pace.timeout(cfg.read_timeout)),
                                allow_redirects=True)
        etag: Optional[str] = None
        with resp:
            code = resp.status_code
            if code == 416 and have:
                m = _CONTENT_RANGE_UNSAT.match(resp.headers.get("Content-Range", ""))
                if m and int(m.group(1)) == have:
                    return  # the partial is already complete
                _remove_quietly(self.path + _ETAG_SUFFIX)
                raise TransientFetchError(f"{self.url}: HTTP 416 for a resume at byte {have}; restarting",
                                          self.url, 416)
            if code == 206 and have:
                m = _CONTENT_RANGE.match(resp.headers.get("Content-Range", ""))
                if not m or int(m.group(1)) != have:
                    _remove_quietly(self.path + _ETAG_SUFFIX)
                    raise TransientFetchError(f"{self.url}: HTTP 206 with unexpected Content-Range "
                                              f"{resp.headers.get('Content-Range')!r} for byte {have}; restarting",
                                              self.url, 206)
                # a server that ignores If-Range sends the range of whatever
                # the file is now: the rest must come from the same version
                got = resp.headers.get("ETag") if (validator or "").startswith(('"', "W/")) \
                    else resp.headers.get("Last-Modified")
                if got != validator:
                    _remove_quietly(self.path + _ETAG_SUFFIX)
                    _remove_quietly(self.path)
                    raise TransientFetchError(f"{self.url}: the file changed on the server during the download "
                                              f"(HTTP 206 with validator {got!r}, the partial download was of "
                                              f"{validator!r}; the server ignored If-Range); starting over",
                                              self.url, 206)
                start, end_incl = int(m.group(1)), int(m.group(2))
                want_total: Optional[int] = end_incl + 1
                append = True
            elif code == 200:
                start, append = 0, False
                want_total = None
                cl = resp.headers.get("Content-Length")
                if cl is not None and cl.isdigit():
                    want_total = int(cl)
                    if self.max_bytes is not None and want_total > self.max_bytes:
                        raise self._too_big(want_total)
                # the validator goes first: a crash mid-body leaves a resumable pair
                etag = resp.headers.get("ETag")
                if etag and etag.startswith("W/"):
                    etag = None  # If-Range needs a strong validator
            else:
                raise _status_error(self.url, resp)
            enc = (resp.headers.get("Content-Encoding") or "").strip().lower()
            if enc not in ("", "identity"):
                raise PermanentFetchError(
                    f"{self.url}: the server sent a {enc}-encoded body (Content-Encoding: {enc}) although "
                    f"resumewds asks for identity; its bytes are not the file's. Serve the file as it is "
                    f"(no compression on the fly)", self.url, code)
            try:
                with _Sink(self, append=append) as sink:
                    if not append:
                        # emptied before the validator is recorded, so the pair always agrees
                        _write_validator(self.path, etag or resp.headers.get("Last-Modified"))
                    raw = resp.raw
                    # we check lengths ourselves; urllib3's check would drop the bytes of a short last read
                    raw.enforce_content_length = False
                    body = _Body(raw)
                    self._copy(body.readinto, sink, pace, sniff=not append)
                    body.finish()
            except _HtmlBody as html:
                _remove_quietly(self.path + _ETAG_SUFFIX)
                _remove_quietly(self.path)
                ctype = resp.headers.get("Content-Type") or "none"
                snippet = " ".join(html.head.decode("utf-8", "replace").split())[:80]
                raise PermanentFetchError(f"{self.url}: HTTP {code} but the body is an HTML page, not a shard "
                                          f"(Content-Type: {ctype}; it begins {snippet!r})", self.url, code) \
                    from None
        size = _size_of(self.path)
        if want_total is not None and size < want_total:
            raise TransientFetchError(f"{self.url}: short body: got {size - start} of {want_total - start} bytes",
                                      self.url, code)
        self._check_expected(size)

    def _check_expected(self, size: int) -> None:
        if self.expected_size is not None and size < self.expected_size:
            raise TransientFetchError(f"{self.url}: short body: file has {size} of the expected "
                                      f"{self.expected_size} bytes", self.url)

    # -- file:// and plain paths ---------------------------------------------
    def local(self) -> None:
        src = local_path(self.url)
        pace = _Pace(self.url, self.config, self.budget, what="file")
        with open(src, "rb", buffering=0) as fin, _Sink(self, append=False) as sink:
            self._copy(fin.readinto, sink, pace)
        _remove_quietly(self.path + _ETAG_SUFFIX)
        self._check_expected(_size_of(self.path))

    # -- pipe:CMD ----------------------------------------------------------
    def pipe(self) -> None:
        """Run the command (in its own process group) and keep its stdout.

        A command that writes nothing for ``read_timeout`` seconds, writes
        slower than ``min_rate``, runs past the fetch deadline, or does not
        exit ``read_timeout`` seconds after closing its stdout, is stalled:
        its whole process group is killed and the attempt fails (transient).
        The command gets SIGKILL if this process dies (PR_SET_PDEATHSIG).
        """
        cmd = self.url[len("pipe:"):]
        pace = _Pace(self.url, self.config, self.budget, what="command's output")
        timeout = self.config.read_timeout
        _remove_quietly(self.path + _ETAG_SUFFIX)
        with tempfile.TemporaryFile() as err, _Sink(self, append=False) as sink:
            proc = _popen(cmd, stdout=subprocess.PIPE, stderr=err)
            try:
                assert proc.stdout is not None
                fd = proc.stdout.fileno()
                poller = select.poll()
                poller.register(fd, select.POLLIN | select.POLLHUP | select.POLLERR)
                buf = self.buffer()
                while True:
                    wait = pace.body_timeout(timeout)
                    if not poller.poll(max(1, int(wait * 1000))):
                        # someone in the group still holds the pipe open: kill the group
                        _kill_group(proc, reap=False)
                        if wait < timeout:
                            raise TransientFetchError(f"{self.url}: fetch deadline of {self.config.deadline:g}s "
                                                      f"reached while the command ran; killed it", self.url)
                        raise TransientFetchError(f"{self.url}: command wrote nothing for {timeout:g}s "
                                                  f"(stalled); killed it", self.url)
                    n = os.readv(fd, [buf])
                    if not n:
                        break
                    try:
                        self._put(sink, buf[:n], pace)
                    except TransientFetchError as exc:
                        _kill_group(proc, reap=False)
                        raise TransientFetchError(f"{exc}; killed it", self.url) from None
                try:
                    rc = proc.wait(timeout=pace.body_timeout(timeout))
                except subprocess.TimeoutExpired:
                    raise TransientFetchError(f"{self.url}: command closed its output but did not exit within "
                                              f"{timeout:g}s; killed it", self.url) from None
            finally:
                if proc.poll() is None:
                    _kill_group(proc)
                proc.stdout.close()  # type: ignore[union-attr]
            if rc != 0:
                raise TransientFetchError(f"{self.url}: {_exit_message(rc, err)}", self.url)
        self._check_expected(_size_of(self.path))


class _HtmlBody(Exception):
    def __init__(self, head: bytes):
        super().__init__("html")
        self.head = head


def _exit_message(rc: int, err: Any) -> str:
    """``command exited with status N: <stderr tail>`` (or says stderr was empty)."""
    err.seek(0, os.SEEK_END)
    n = err.tell()
    err.seek(max(0, n - 2000))
    tail = err.read().decode("utf-8", "replace").strip()
    what = f"killed by signal {-rc}" if rc < 0 else f"exited with status {rc}"
    return f"command {what}: {tail}" if tail else f"command {what} (stderr was empty)"


_PR_SET_PDEATHSIG = 1
_LIBC: Any = None


def _die_with_parent_fn() -> Optional[Callable[[], None]]:
    """A ``preexec_fn`` making the child get SIGKILL when we die (Linux), else None."""
    global _LIBC
    if not os.path.exists("/proc/self"):
        return None
    if _LIBC is None:
        try:
            import ctypes

            _LIBC = ctypes.CDLL(None, use_errno=True)
            _LIBC.prctl  # noqa: B018  (raises if missing)
        except (OSError, AttributeError):
            _LIBC = False
    if not _LIBC:
        return None
    prctl, parent = _LIBC.prctl, os.getpid()

    def fn() -> None:
        prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
        if os.getppid() != parent:  # died before prctl took effect
            os._exit(137)
    return fn


def _popen(cmd: str, **kw: Any) -> subprocess.Popen:
    """Start a ``pipe:`` command: a shell in its own process group, that dies with us."""
    return subprocess.Popen(cmd, shell=True, stdin=subprocess.DEVNULL, start_new_session=True,
                            preexec_fn=_die_with_parent_fn(), **kw)


def _kill_group(proc: subprocess.Popen, reap: bool = True) -> None:
    """SIGKILL a ``pipe:`` command's process group (and reap the command).

    Only called while a member is known to be alive (the command itself, or
    whoever holds its stdout open), so the group id cannot have been reused.
    """
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
    if reap:
        proc.wait()


def _run_attempt(state: _Attempt, kind: str) -> None:
    if not state.budget.take():
        raise state.budget.exhausted_error(state.url)
    state.attempts += 1
    try:
        getattr(state, kind)()
    except ResumeWDSError as exc:
        state.budget.last_error = exc
        raise
    except (_foreign_exceptions()[0].RequestException, _foreign_exceptions()[1].HTTPError,
            http.client.HTTPException, OSError, subprocess.SubprocessError, _SinkError) as exc:
        err = _translate(exc, state.url)
        state.budget.last_error = err
        raise err from exc


def _kind_for(url: str) -> str:
    scheme = scheme_of(url)
    if scheme in ("http", "https"):
        return "http"
    if scheme in ("file", "local"):
        return "local"
    if scheme == "pipe":
        return "pipe"
    raise PermanentFetchError(f"{url}: unsupported URL scheme {scheme!r} (use http, https, s3, file, a path or "
                              "pipe:)", url)


def _gopen_log(url: str, what: str) -> None:
    print(f"[gopen] {url} {what}", file=sys.stderr, flush=True)


def fetch_to_file(url: str, partial_path: str, *, expected_size: Optional[int] = None,
                  config: Optional[FetchConfig] = None, on_event: Optional[EventFn] = None,
                  session: Optional[requests.Session] = None, budget: Optional[FetchBudget] = None,
                  max_bytes: Optional[int] = None) -> FetchResult:
    """Download ``url`` into ``partial_path``, resuming what is already there.

    Args:
        url: http(s)://, s3:// (:mod:`resumewds.s3`), file://, a local path, or ``pipe:CMD``.
        partial_path: destination; bytes already in it are kept when the server
            proves (If-Range, and the validator of the 206) that they belong
            to the same file.  The validator lives in ``partial_path + ".etag"``.
        expected_size: size the finished file must reach, if known.
        config: retry and timeout policy (default :meth:`FetchConfig.from_env`).
        on_event: ``on_event(kind, url, **detail)`` for ``fetch_start``,
            ``fetch_done`` and ``retry``.
        session: a requests Session to use (one is created if None).
        budget: the attempts and deadline to draw from, shared with others
            fetching the same shard for the same read (a fresh one if None).
        max_bytes: refuse (permanently) a source larger than this.

    Returns:
        A :class:`FetchResult` (with the file's xxh3_64).  The file is
        written, not fsynced.

    Raises:
        TransientFetchError: still failing when the budget is spent.
        PermanentFetchError: a status or source that retrying will not fix
            (4xx, a redirect loop, an HTML page or an encoded body for a
            shard, more than ``max_bytes``).
        CacheError: ``partial_path`` cannot be written.

    Example:
        >>> fetch_to_file("/data/a.tar", "/tmp/a.partial").size  # doctest: +SKIP
        10240
    """
    cfg = config or FetchConfig.from_env()
    if scheme_of(url) == "s3":  # resumewds/s3.py (boto3 is imported there, on first use)
        from .s3 import s3_fetch_to_file
        return s3_fetch_to_file(url, partial_path, expected_size=expected_size, config=cfg, on_event=on_event,
                                budget=budget, max_bytes=max_bytes)
    kind = _kind_for(url)
    budget = budget or FetchBudget(cfg)
    t0 = time.monotonic()
    resumed_from = _size_of(partial_path) if kind == "http" and _read_validator(partial_path) else 0
    if on_event is not None:
        on_event("fetch_start", url, resumed_from=resumed_from)
    if cfg.log_opens:
        _gopen_log(url, "open" + (f" from byte {resumed_from}" if resumed_from else ""))
    state = _Attempt(url, partial_path, expected_size, cfg, session, budget, max_bytes)
    own_session = session is None
    try:
        _retry(cfg, url, on_event, budget, _run_attempt, state, kind)
    except BaseException as exc:
        if cfg.log_opens:
            _gopen_log(url, f"failed after {state.received} bytes: {exc}")
        raise
    finally:
        if own_session and state.session is not None:
            state.session.close()
    return _fetched(url, partial_path, state, cfg, on_event, t0)


def _fetched(url: str, partial_path: str, state: "_Attempt", cfg: FetchConfig,
             on_event: Optional[EventFn], t0: float) -> FetchResult:
    """A finished download's result, its ``fetch_done`` event and gopen line (every transport)."""
    size = _size_of(partial_path)
    kept = max(0, size - state.received)
    seconds = time.monotonic() - t0
    if on_event is not None:
        on_event("fetch_done", url, bytes=state.received, seconds=seconds, resumed_from=kept)
    if cfg.log_opens:
        _gopen_log(url, f"closed: {state.received} bytes in {seconds:.2f}s")
    return FetchResult(url=url, path=partial_path, size=size, bytes=state.received, resumed_from=kept,
                       seconds=seconds, attempts=state.attempts, xxh3_64=state.digest())


def fetch_bytes(url: str, config: Optional[FetchConfig] = None, *, on_event: Optional[EventFn] = None,
                session: Optional[requests.Session] = None, max_bytes: Optional[int] = None) -> bytes:
    """Fetch a small object (e.g. a remote manifest.json) into memory.

    The same code as :func:`fetch_to_file` (sources, classification, retry
    budget, stall and rate limits, Range resume within the call), through a
    temporary file.

    Args:
        url: as for :func:`fetch_to_file`.
        config: default :meth:`FetchConfig.from_env`.
        on_event: receives ``retry`` (and ``fetch_start``/``fetch_done``).
        session: a requests Session to use.
        max_bytes: refuse (permanently) anything larger.

    Raises:
        TransientFetchError, PermanentFetchError: as for :func:`fetch_to_file`.

    Example:
        >>> fetch_bytes("http://127.0.0.1:8000/manifest.json")  # doctest: +SKIP
        b'{"format": ...'
    """
    with tempfile.TemporaryDirectory(prefix="resumewds-") as d:
        path = os.path.join(d, "object.partial")
        try:
            fetch_to_file(url, path, config=config, on_event=on_event, session=session, max_bytes=max_bytes)
            with open(path, "rb") as f:
                return f.read()
        except CacheError as exc:
            raise CacheError(f"{url}: cannot buffer the download in {d}: {exc}") from exc
        except FetchError:
            raise  # an OSError too (webdataset's type for fetch failures), but not a local one
        except OSError as exc:
            raise CacheError(f"{url}: cannot read back the download from {d}: {exc}") from exc


def copy_config(config: FetchConfig, **changes: Any) -> FetchConfig:
    """A copy of ``config`` with some fields changed."""
    return dataclasses.replace(config, **changes)


__all__ = [
    "FetchBudget",
    "FetchConfig",
    "FetchResult",
    "boot_id",
    "copy_config",
    "fetch_bytes",
    "fetch_to_file",
    "is_remote_url",
    "local_path",
    "new_session",
    "no_sleep",
    "parse_retry_after",
    "scheme_of",
]
