"""Fetch shards from http(s)://, s3://, file://, local paths and ``pipe:`` commands.

The modules (at import time each uses only those above it)::

    _settings.py  FetchConfig (from the environment through resumewds.config), FetchResult
    _errormap.py  the error map: foreign exception -> our error and message; HTTP status -> error
    _retry.py     FetchBudget (one shard's read, shared by prefetch and reader), the tenacity policy
    _partial.py   the partial-file writer (hashes bytes as they arrive), its .etag sidecar, boot_id()
    _attempt.py   _Attempt (one call's attempts: partial, budget, buffer, copy loop), _Pace
    _transport.py the Transport interface, the TRANSPORTS registry by scheme, _run_attempt
    _local.py     file:// and plain paths
    _http.py      http(s):// on urllib3 (Session), Range/If-Range resume, ranges
    _pipe.py      pipe:CMD, its process group, stall kill
    _s3.py        s3:// through boto3 (imported on first use)
    _download.py  fetch_to_file / fetch_bytes / fetch_range: every request under one retry policy

The caller (:class:`~resumewds.cache.ShardStore`) checks ``FetchResult.xxh3_64``
and size against the manifest and renames the partial into place.  What is
transient or permanent: the error map and each transport's docstring.  The
``RESUMEWDS_FETCH_*`` variables are read by :meth:`FetchConfig.from_env`.

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
