"""Fetch shards from http(s)://, s3://, file://, local paths and ``pipe:`` commands.

A map of the package (read it top to bottom: at import time each module
uses only those above it)::

    settings.py   FetchConfig (timeouts, attempts, deadline, rates; from the
                  environment through resumewds.config), FetchResult
    errormap.py   the error map: one table from a foreign exception (requests,
                  urllib3, OSError, subprocess) to our error class and message;
                  HTTP status -> error; Retry-After parsing
    retry.py      FetchBudget (attempts + deadline of one shard and read, shared
                  by prefetch thread and reader) and the tenacity policy
    partial.py    the partial-file writer: <partial> written and hashed as bytes
                  arrive, its <partial>.etag validator sidecar (with the boot id:
                  boot_id() lives here in __init__, tests replace its _BOOT_ID)
    attempt.py    _Attempt (the state of one call's attempts: partial, budget,
                  buffer, copy loop), _Pace (deadline and minimum rate inside an
                  attempt), _run_attempt (one attempt, errors mapped)
    transport.py  scheme_of / local_path / is_remote_url, the Transport
                  interface and TRANSPORTS, the registry keyed by scheme
    local.py      file:// and plain paths                    TRANSPORTS["file"], ["local"]
    http.py       http(s):// with Range/If-Range resume      TRANSPORTS["http"], ["https"]
    pipe.py       pipe:CMD, its process group, stall kill    TRANSPORTS["pipe"]
    s3.py         s3:// through boto3 (imported on first     TRANSPORTS["s3"]
                  use; resumewds.s3 re-exports it)
    download.py   fetch_to_file / fetch_bytes: the one driver of every scheme

One download (``fetch_to_file(url, partial)``; the cache does the last two)::

    budget     FetchBudget: attempts and deadline, shared per shard and read
      -> attempt   retry._retry runs _run_attempt until success or budget spent;
                   a TransientFetchError is retried, anything else is final
      -> transport TRANSPORTS[scheme_of(url)].attempt(state): opens the source,
                   resumes (http Range / s3 If-Match) when the sidecar proves the
                   partial's bytes, reads into one buffer, paced by _Pace;
                   what it raises is mapped by its error table
      -> partial writer   _Sink writes and hashes every byte as it arrives
      -> verify    the caller checks FetchResult.xxh3_64 / size against the
                   manifest (resumewds.cache.ShardStore; no read-back)
      -> publish   the caller renames the partial into place (os.replace)

Events: ``fetch_start`` and ``fetch_done`` (download.py) and ``retry``
(retry.py), as :class:`resumewds.events.EventKind`, through
``on_event(kind, url, **detail)``.

Where to add a transport: a module here with a :class:`Transport`
subclass and ``TRANSPORT = ...``, one line in
:data:`~resumewds.fetch.transport.TRANSPORTS` (see
:mod:`resumewds.fetch.transport`).  Budget, retries, events, the partial
file, hashing and the gopen log come with it.

Classification (each transport's docstring has its own rows; the error map
has the foreign exceptions)::

    transient   connection refused/reset, connect and read timeouts (a stalled
                body is a read timeout), a body slower than ``min_rate``, 5xx
                whatever its body (an HTML error page too), 429, 503
                (honouring Retry-After up to the deadline), a body shorter
                than Content-Length / Content-Range / ``expected_size``, a 206
                of another version, a 200 that is a part of the file, a
                Content-Encoding other than identity, an HTML page (200)
                where a shard of known size was expected, a ``pipe:``
                command exiting non-zero or writing nothing for
                ``read_timeout`` seconds (its process group is killed)
    permanent   401, 403, 404, 410 and other 4xx, more than ``max_redirects``
                redirects (a loop), an HTML page (200) where a shard of
                unknown size was expected, an object larger than
                ``max_bytes``, unknown scheme, missing local file
    CacheError  the destination cannot be written (read-only, disk full)

Environment: every ``RESUMEWDS_FETCH_*`` variable (and ``GOPEN_VERBOSE``) is
read by :meth:`FetchConfig.from_env` through :mod:`resumewds.config`, which
lists them; :class:`~resumewds.cache.ShardStore`, the CLI and remote manifest
fetches all use it.  requests (and urllib3) is imported at the first http(s)
fetch and boto3 at the first s3 fetch, not with this package.

Example:
    >>> cfg = FetchConfig(attempts=3, sleep=no_sleep)
    >>> cfg.attempts
    3
"""

from __future__ import annotations

from typing import Optional

# the names below are the package's API, and (underscored) the internals other
# modules and tests reach for, importable as resumewds.fetch.X as before the split
from .attempt import _HTML_STARTS as _HTML_STARTS
from .attempt import _NET_BUF as _NET_BUF
from .attempt import _TLS as _TLS
from .attempt import _Attempt as _Attempt
from .attempt import _HtmlBody as _HtmlBody
from .attempt import _looks_like_html as _looks_like_html
from .attempt import _Pace as _Pace
from .attempt import _run_attempt as _run_attempt
from .download import _fetched as _fetched
from .download import _gopen_log as _gopen_log
from .download import fetch_bytes, fetch_to_file
from .errormap import FETCH_ERRORS as FETCH_ERRORS
from .errormap import ErrorRule as ErrorRule
from .errormap import _SinkError as _SinkError
from .errormap import _status_error as _status_error
from .errormap import _translate as _translate
from .errormap import parse_retry_after
from .http import _CONTENT_RANGE as _CONTENT_RANGE
from .http import _CONTENT_RANGE_UNSAT as _CONTENT_RANGE_UNSAT
from .http import _Body as _Body
from .http import _requests as _requests
from .http import _session_class as _session_class
from .http import new_session
from .partial import _ETAG_SUFFIX as _ETAG_SUFFIX
from .partial import _HASH_BUF as _HASH_BUF
from .partial import _read_validator as _read_validator
from .partial import _remove_quietly as _remove_quietly
from .partial import _Sink as _Sink
from .partial import _size_of as _size_of
from .partial import _write_validator as _write_validator
from .pipe import _die_with_parent_fn as _die_with_parent_fn
from .pipe import _exit_message as _exit_message
from .pipe import _kill_group as _kill_group
from .pipe import _popen as _popen
from .retry import _JITTER_START as _JITTER_START
from .retry import FetchBudget
from .retry import _retry as _retry
from .retry import _StopWhenBudgetSpent as _StopWhenBudgetSpent
from .retry import _WaitHonouringRetryAfter as _WaitHonouringRetryAfter
from .settings import EventFn as EventFn
from .settings import FetchConfig, FetchResult, copy_config, no_sleep
from .transport import TRANSPORTS as TRANSPORTS
from .transport import Transport as Transport
from .transport import TransportEntry as TransportEntry
from .transport import is_remote_url, local_path, scheme_of
from .transport import transport_for as transport_for

_UNSET = object()
_BOOT_ID: object = _UNSET  # boot_id's cache: here, where tests replace it (resumewds.fetch._BOOT_ID)


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
            with open("/proc/sys/kernel/random/boot_id") as f:
                _BOOT_ID = f.read().strip() or None
        except OSError:
            _BOOT_ID = None
    return _BOOT_ID  # type: ignore[return-value]


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
