"""Fetch shards from http(s)://, s3://, file://, local paths and ``pipe:`` commands.

A map of the package (read it top to bottom: at import time each module
uses only those above it)::

    _settings.py  FetchConfig (timeouts, attempts, deadline, rates; from the
                  environment through resumewds.config), FetchResult
    _errormap.py  the error map: one table from a foreign exception (requests,
                  urllib3, OSError, subprocess) to our error class and message;
                  HTTP status -> error; Retry-After parsing
    _retry.py     FetchBudget (attempts + deadline of one shard and read, shared
                  by prefetch thread and reader) and the tenacity policy
    _partial.py   the partial-file writer: <partial> written and hashed as bytes
                  arrive, its <partial>.etag validator sidecar (with the boot
                  id, boot_id())
    _attempt.py   _Attempt (the state of one call's attempts: partial, budget,
                  buffer, copy loop), _Pace (deadline and minimum rate inside an
                  attempt)
    _transport.py the Transport interface and transport_for (the registry,
                  TRANSPORTS, keyed by scheme_of, is resumewds.fetch);
                  _run_attempt (one attempt through a transport, errors mapped)
    _local.py     file:// and plain paths                    TRANSPORTS["file"], ["local"]
    _http.py      http(s):// on urllib3 (Session: the one       TRANSPORTS["http"], ["https"]
                  http client), Range/If-Range resume, ranges
    _pipe.py      pipe:CMD, its process group, stall kill    TRANSPORTS["pipe"]
    _s3.py        s3:// through boto3 (imported on first     TRANSPORTS["s3"]
                  use)
    _download.py  fetch_to_file / fetch_bytes / fetch_range: the drivers of
                  every scheme, every request under the one retry policy

One download (``fetch_to_file(url, partial)``; the cache does the last two)::

    budget     FetchBudget: faults in a row without progress and time without
               progress, shared per shard and read (every request of the shard)
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
:data:`~resumewds.fetch._transport.TRANSPORTS` (see
:mod:`resumewds.fetch`).  Budget, retries, events, the partial
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
                ``read_timeout`` seconds (its process group is killed), a
                sample whose bytes fail its digest (a verifying sink)
    permanent   401, 403, 404, 410 and other 4xx, more than ``max_redirects``
                redirects (a loop), an HTML page (200) where a shard of
                unknown size was expected, an object larger than
                ``max_bytes``, a TLS certificate that does not verify, a
                malformed URL, unknown scheme, missing local file
    CacheError  the destination cannot be written (read-only, disk full)

Environment: every ``RESUMEWDS_FETCH_*`` variable (and ``GOPEN_VERBOSE``) is
read by :meth:`FetchConfig.from_env` through :mod:`resumewds.config`, which
lists them; :class:`~resumewds.cache.ShardStore`, the CLI and remote manifest
fetches all use it.  urllib3 is imported at the first http(s) fetch and boto3
at the first s3 fetch, not with this package.

Example:
    >>> cfg = FetchConfig(attempts=3, sleep=no_sleep)
    >>> cfg.attempts
    3
"""

from __future__ import annotations

import typing as _typing

from .. import _lazy

if _typing.TYPE_CHECKING:  # (the names as the type checker sees them)
    from ._download import RangeSink, fetch_bytes, fetch_range, fetch_to_file
    from ._errormap import parse_retry_after
    from ._http import Session, new_session
    from ._partial import boot_id
    from ._retry import FetchBudget
    from ._s3 import S3Options, client_for, parse_s3_url, scheme_hint, translate_s3_error
    from ._schemes import is_local_url, is_remote_object, is_remote_url, local_path, scheme_of
    from ._settings import FetchConfig, FetchResult, no_sleep
    from ._transport import transport_for

# every name loads its module on first use (PEP 562): importing one module of this
# package (or the package) loads nothing else of it
_LAZY: _typing.Dict[str, str] = {
    "boot_id": "_partial",
    "client_for": "_s3",
    "fetch_bytes": "_download",
    "fetch_range": "_download",
    "fetch_to_file": "_download",
    "FetchBudget": "_retry",
    "FetchConfig": "_settings",
    "FetchResult": "_settings",
    "is_local_url": "_schemes",
    "is_remote_object": "_schemes",
    "is_remote_url": "_schemes",
    "local_path": "_schemes",
    "new_session": "_http",
    "no_sleep": "_settings",
    "parse_retry_after": "_errormap",
    "parse_s3_url": "_s3",
    "RangeSink": "_download",
    "S3Options": "_s3",
    "scheme_hint": "_s3",
    "scheme_of": "_schemes",
    "Session": "_http",
    "translate_s3_error": "_s3",
    "transport_for": "_transport",
}

__all__ = ["S3Options", "boot_id", "client_for", "fetch_bytes", "fetch_range", "fetch_to_file", "FetchBudget",
           "FetchConfig", "FetchResult", "is_local_url", "is_remote_object", "is_remote_url", "local_path",
           "new_session", "no_sleep", "parse_retry_after", "parse_s3_url", "RangeSink", "scheme_hint",
           "scheme_of", "Session", "translate_s3_error", "transport_for"]

__getattr__, __dir__ = _lazy.attach(__name__, _LAZY)
