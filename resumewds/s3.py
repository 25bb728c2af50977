"""``s3://bucket/key``: Amazon S3 and S3-compatible stores as a fetch transport.

The same contract as :mod:`resumewds.fetch`'s http path, through boto3
(``pip install 'resumewds[s3]'``; imported only when an s3 url is fetched):

* one retry policy, ours (tenacity, :class:`~resumewds.fetch.FetchConfig`):
  botocore's own retries are off (``total_max_attempts=1``);
* the shared :class:`~resumewds.fetch.FetchBudget` (``attempts`` and
  ``deadline`` of one read of one shard, shared by the prefetch thread and the
  reader; a corrupt download counts against it, in the cache);
* ``connect_timeout`` / ``read_timeout`` from the FetchConfig (a stalled body
  is a read timeout), both shortened to what is left of the deadline; the
  body goes through fetch's own pacing (``_Pace``: the deadline inside an
  attempt and the minimum transfer rate, ``min_rate`` over ``rate_window``,
  checked after every read, as for http); a Retry-After beyond the deadline
  ends the fetch at once;
* ``max_bytes`` (remote manifests), an HTML page where an object was
  expected (a wrong endpoint: a web console) is permanent, ``GOPEN_VERBOSE``
  logs each open;
* ranged resume of a partial download, guarded by the object's ETag::

      partial has N > 0 bytes and the object's ETag in <partial>.etag
          -> GetObject Range: bytes=N-  If-Match: <ETag>
             206 (Content-Range starts at N)  append
             412 PreconditionFailed (the object was replaced)  restart from zero
             416 InvalidRange  HeadObject If-Match: complete when its size is N
      otherwise
          -> GetObject, truncate, save the response's ETag

* bytes hashed as they are written, the partial file, its sidecar and the
  events (``fetch_start``, ``retry``, ``fetch_done``) are fetch.py's own;
* errors mapped into our tree::

      PermanentFetchError  NoSuchKey, NoSuchBucket, AccessDenied,
                           InvalidAccessKeyId, SignatureDoesNotMatch, other
                           4xx, no credentials, a malformed s3 url
      TransientFetchError  SlowDown, Throttling*, RequestTimeout, InternalError,
                           ServiceUnavailable, any 5xx or 429, connection
                           resets, connect/read timeouts, a short body

A stored ``Content-Encoding`` is object metadata: S3 serves the stored bytes
as they are (no decoding on the fly), so unlike http it is not refused; the
size and checksum of the manifest still guard the bytes.

Settings (defaults, then environment, then ``FetchConfig(s3=S3Options(...))``;
the environment is read by :func:`resumewds.config.s3_settings`):

    credentials        boto3's standard chain: AWS_ACCESS_KEY_ID /
                       AWS_SECRET_ACCESS_KEY / AWS_SESSION_TOKEN, AWS_PROFILE
                       and ~/.aws/{credentials,config}, SSO, web identity,
                       container and instance roles
    endpoint_url       RESUMEWDS_S3_ENDPOINT_URL, else AWS_ENDPOINT_URL_S3,
                       else AWS_ENDPOINT_URL (MinIO, R2, GCS interoperability);
                       AWS_IGNORE_CONFIGURED_ENDPOINT_URLS=true ignores the AWS_ ones
    region             AWS_REGION, else AWS_DEFAULT_REGION (else boto3's default)
    profile            AWS_PROFILE (read by boto3)
    addressing_style   RESUMEWDS_S3_ADDRESSING_STYLE: auto (default), path, virtual
    anonymous          RESUMEWDS_S3_ANONYMOUS=1: unsigned requests (public buckets)

Example:
    >>> parse_s3_url("s3://bucket/data/shard-000.tar")
    ('bucket', 'data/shard-000.tar')
    >>> S3Options(endpoint_url="http://127.0.0.1:9000").addressing_style
    'auto'
"""

from __future__ import annotations

import dataclasses
import http.client
import os
import re
import threading
import time
from dataclasses import dataclass
from typing import Any, Dict, Optional, Tuple

import urllib3.exceptions

from .config import S3_ADDRESSING
from .errors import FetchError, PermanentFetchError, ResumeWDSError, TransientFetchError

# fetch.py's partial-file machinery (sidecar validator, hashing writer, body
# reader, retry policy, error map), shared so that both transports keep one contract
from .fetch import (
    _CONTENT_RANGE,
    _ETAG_SUFFIX,
    EventFn,
    FetchBudget,
    FetchConfig,
    FetchResult,
    _Attempt,
    _Body,
    _fetched,
    _gopen_log,
    _HtmlBody,
    _Pace,
    _read_validator,
    _remove_quietly,
    _retry,
    _Sink,
    _SinkError,
    _size_of,
    _translate,
    _write_validator,
)

_ADDRESSING = S3_ADDRESSING


@dataclass(frozen=True)
class S3Options:
    """Where and how to reach an S3 (or S3-compatible) store.

    Every field left at None (``addressing_style`` at "auto", ``anonymous``
    at False) falls back to the environment (see the module docstring);
    credentials always come from boto3's standard chain.

    Attributes:
        endpoint_url: e.g. ``http://127.0.0.1:9000`` (MinIO),
            ``https://<account>.r2.cloudflarestorage.com`` (R2),
            ``https://storage.googleapis.com`` (GCS with HMAC keys).
        region: the bucket's region (``auto`` for R2).
        profile: a profile of ``~/.aws/config``.
        addressing_style: ``auto``, ``path`` (most self-hosted stores) or
            ``virtual``.
        anonymous: send unsigned requests (public buckets).

    Example:
        >>> cfg = FetchConfig(s3=S3Options(endpoint_url="http://127.0.0.1:9000",
        ...                                addressing_style="path"))
        >>> resolve_options(cfg).endpoint_url
        'http://127.0.0.1:9000'
    """

    endpoint_url: Optional[str] = None
    region: Optional[str] = None
    profile: Optional[str] = None
    addressing_style: str = "auto"
    anonymous: bool = False

    def __post_init__(self) -> None:
        if self.addressing_style not in _ADDRESSING:
            raise ValueError(f"S3Options.addressing_style must be one of {', '.join(_ADDRESSING)}, "
                             f"got {self.addressing_style!r}")

    @classmethod
    def from_env(cls) -> "S3Options":
        """The options the environment gives.

        Raises:
            ValueError: RESUMEWDS_S3_ADDRESSING_STYLE or RESUMEWDS_S3_ANONYMOUS
                has a value it cannot have.
        """
        from . import config

        return cls(**config.s3_settings())


def resolve_options(config: Optional[FetchConfig] = None) -> S3Options:
    """The environment's options, overridden by the fields set in ``config.s3``.

    Raises:
        PermanentFetchError: the environment holds a bad value.
    """
    try:
        opts = S3Options.from_env()
    except ValueError as exc:
        raise PermanentFetchError(str(exc)) from exc
    explicit = getattr(config, "s3", None)
    if explicit is None:
        return opts
    if isinstance(explicit, dict):
        explicit = S3Options(**explicit)
    changes = {f.name: getattr(explicit, f.name) for f in dataclasses.fields(S3Options)
               if getattr(explicit, f.name) != f.default}
    return dataclasses.replace(opts, **changes)


def parse_s3_url(url: str) -> Tuple[str, str]:
    """``(bucket, key)`` of an ``s3://bucket/key`` url.

    Raises:
        PermanentFetchError: no bucket or no key.

    Example:
        >>> parse_s3_url("s3://b-1/a/b.tar")
        ('b-1', 'a/b.tar')
    """
    m = re.match(r"^[sS]3://([^/?#]+)/([^?#]*)$", url)
    if not m or not m.group(2):
        raise PermanentFetchError(f"{url}: not an s3 object url (expected s3://BUCKET/KEY)", url)
    return m.group(1), m.group(2)


_HINTS = {
    "gs": "; for Google Cloud Storage use s3://BUCKET/KEY with AWS_ENDPOINT_URL=https://storage.googleapis.com "
          "and an HMAC key as AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY (pip install 'resumewds[s3]')",
    "az": "; for Azure Blob Storage use s3:// through an S3-compatible gateway (AWS_ENDPOINT_URL), or "
          "'pipe:az storage blob download --account-name A -c C -n KEY -f /dev/stdout'",
}
for _alias in ("gcs",):
    _HINTS[_alias] = _HINTS["gs"]
for _alias in ("azure", "abfs", "abfss", "wasb", "wasbs", "adl"):
    _HINTS[_alias] = _HINTS["az"]


def scheme_hint(scheme: str) -> str:
    """How a user of another object store connects (appended to an unsupported-scheme error).

    Example:
        >>> "storage.googleapis.com" in scheme_hint("gs"), scheme_hint("ftp")
        (True, '')
    """
    return _HINTS.get(scheme.lower(), "")


# ---------------------------------------------------------------------------
# clients: one per (process, options, timeouts), shared by threads (boto3
# clients are thread-safe, their creation is not)
# ---------------------------------------------------------------------------
_CLIENTS: Dict[Tuple[Any, ...], Any] = {}
_CLIENTS_LOCK = threading.Lock()


def _reset_after_fork() -> None:
    global _CLIENTS_LOCK
    _CLIENTS_LOCK = threading.Lock()
    _CLIENTS.clear()  # the parent's connections are not ours to reuse


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_reset_after_fork)


def _import_boto(url: str) -> Any:
    try:
        import boto3  # the optional extra
        import botocore  # noqa: F401
    except ImportError as exc:
        raise PermanentFetchError(f"{url}: s3:// urls need boto3: pip install 'resumewds[s3]' ({exc})",
                                  url) from exc
    return boto3


def client_for(url: str, config: FetchConfig, timeouts: Optional[Tuple[float, float]] = None) -> Any:
    """The boto3 S3 client this process uses for ``config`` (created once).

    Its own retries are off and its timeouts are ``config``'s (or
    ``timeouts``: ``(connect, read)``, shorter ones near a fetch deadline).

    Raises:
        PermanentFetchError: boto3 is missing, or the endpoint is malformed.
    """
    opts = resolve_options(config)
    connect, read = timeouts or (config.connect_timeout, config.read_timeout)
    key = (os.getpid(), opts, float(connect), float(read))
    client = _CLIENTS.get(key)
    if client is not None:
        return client
    boto3 = _import_boto(url)
    import botocore
    import botocore.config
    import botocore.exceptions

    kw: Dict[str, Any] = {
        "connect_timeout": connect,
        "read_timeout": read,
        "retries": {"total_max_attempts": 1, "mode": "standard"},  # one retry policy: ours
        "s3": {"addressing_style": opts.addressing_style},
        "user_agent_extra": "resumewds",
    }
    if opts.anonymous:
        kw["signature_version"] = botocore.UNSIGNED
    params = botocore.config.Config.OPTION_DEFAULTS if hasattr(botocore.config.Config, "OPTION_DEFAULTS") else {}
    if "response_checksum_validation" in params:
        # we hash every byte ourselves; botocore's CRC would be a second pass
        kw["response_checksum_validation"] = "when_required"
        kw["request_checksum_calculation"] = "when_required"
    with _CLIENTS_LOCK:
        client = _CLIENTS.get(key)
        if client is None:
            try:
                session = boto3.session.Session(profile_name=opts.profile)
                client = session.client("s3", endpoint_url=opts.endpoint_url, region_name=opts.region,
                                        config=botocore.config.Config(**kw))
            except botocore.exceptions.ProfileNotFound as exc:
                raise PermanentFetchError(f"{url}: AWS profile {opts.profile!r} not found: {exc}", url) from exc
            except ValueError as exc:  # botocore: "Invalid endpoint: ..."
                raise PermanentFetchError(f"{url}: bad S3 endpoint {opts.endpoint_url!r}: {exc}", url) from exc
            except botocore.exceptions.BotoCoreError as exc:
                raise PermanentFetchError(f"{url}: cannot create an S3 client: {exc}", url) from exc
            _CLIENTS[key] = client
    return client


# ---------------------------------------------------------------------------
# error translation: botocore's errors into our tree (the rest is fetch's)
# ---------------------------------------------------------------------------
TRANSIENT_CODES = frozenset({
    "SlowDown", "Throttling", "ThrottlingException", "ThrottledException", "RequestThrottled",
    "RequestThrottledException", "TooManyRequestsException", "RequestLimitExceeded",
    "BandwidthLimitExceeded", "ProvisionedThroughputExceededException", "RequestTimeout",
    "RequestTimeoutException", "InternalError", "ServiceUnavailable", "PriorRequestNotComplete",
    "OperationAborted", "EC2ThrottledException",
})
"""Error codes that retrying may fix, whatever their status (RequestTimeout is a 400)."""

PERMANENT_CODES = frozenset({
    "NoSuchKey", "NoSuchBucket", "NotFound", "AccessDenied", "AllAccessDisabled", "AccountProblem",
    "InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidBucketName", "InvalidObjectState",
    "ExpiredToken", "InvalidToken", "RequestTimeTooSkewed", "PermanentRedirect", "InvalidRequest",
    "AuthorizationHeaderMalformed", "InvalidArgument", "MethodNotAllowed",
})
"""Error codes that retrying will not fix (any other 4xx is permanent too)."""


def _client_error_parts(exc: Any) -> Tuple[str, int, str, Optional[float]]:
    from .fetch import parse_retry_after

    resp = getattr(exc, "response", None) or {}
    err = resp.get("Error") or {}
    meta = resp.get("ResponseMetadata") or {}
    status = int(meta.get("HTTPStatusCode") or 0)
    code = str(err.get("Code") or status or "unknown")
    msg = str(err.get("Message") or "")
    ra = parse_retry_after((meta.get("HTTPHeaders") or {}).get("retry-after"))
    return code, status, msg, ra


def translate_s3_error(exc: BaseException, url: str) -> ResumeWDSError:
    """Map an exception met while reading ``url`` from S3 to one of ours.

    Example:
        >>> from botocore.exceptions import ClientError
        >>> e = ClientError({"Error": {"Code": "SlowDown", "Message": "Reduce your request rate"},
        ...                  "ResponseMetadata": {"HTTPStatusCode": 503}}, "GetObject")
        >>> type(translate_s3_error(e, "s3://b/k")).__name__
        'TransientFetchError'
    """
    if isinstance(exc, ResumeWDSError):
        return exc
    try:
        import botocore.exceptions as bx
    except ImportError:  # pragma: no cover - only reached with boto3 installed
        return _translate(exc, url)
    if isinstance(exc, bx.ClientError):
        code, status, msg, ra = _client_error_parts(exc)
        text = f"{url}: S3 {code} (HTTP {status})" + (f": {msg}" if msg else "")
        if code in PERMANENT_CODES:
            return PermanentFetchError(text, url, status or None)
        if code in TRANSIENT_CODES or status == 429 or status >= 500:
            if ra is not None:
                text += f" (Retry-After {ra:g}s)"
            return TransientFetchError(text, url, status or None, retry_after=ra)
        return PermanentFetchError(text, url, status or None)
    if isinstance(exc, (bx.NoCredentialsError, bx.PartialCredentialsError)):
        return PermanentFetchError(
            f"{url}: no usable AWS credentials ({exc}); set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or "
            "AWS_PROFILE, use an instance role, or RESUMEWDS_S3_ANONYMOUS=1 for a public bucket", url)
    if isinstance(exc, bx.CredentialRetrievalError):
        return TransientFetchError(f"{url}: could not retrieve AWS credentials: {exc}", url)
    if isinstance(exc, bx.ConnectTimeoutError):
        return TransientFetchError(f"{url}: connect timeout: {exc}", url)
    if isinstance(exc, bx.ReadTimeoutError):
        return TransientFetchError(f"{url}: read timeout (stalled): {exc}", url)
    if isinstance(exc, bx.EndpointConnectionError):
        return TransientFetchError(f"{url}: cannot connect to the S3 endpoint: {exc}", url)
    if isinstance(exc, (bx.ConnectionClosedError, bx.ResponseStreamingError, bx.IncompleteReadError,
                        bx.HTTPClientError)):
        return TransientFetchError(f"{url}: connection error: {exc}", url)
    if isinstance(exc, (bx.ParamValidationError, bx.NoRegionError, bx.UnknownEndpointError)):
        return PermanentFetchError(f"{url}: bad S3 request: {exc}", url)
    if isinstance(exc, bx.BotoCoreError):
        return FetchError(f"{url}: unexpected {type(exc).__name__}: {exc}", url)
    return _translate(exc, url)


def _run(state: "_S3Attempt") -> None:
    """One attempt, drawn from the shared budget; every foreign error mapped."""
    budget = state.budget
    if not budget.take():
        raise budget.exhausted_error(state.url)
    state.attempts += 1
    try:
        state.s3()
    except ResumeWDSError as exc:
        budget.last_error = exc
        raise
    except Exception as exc:  # botocore's, urllib3's, OSError, our sink's: all mapped, none leaks
        if not _is_mapped(exc):
            raise
        err = translate_s3_error(exc, state.url)
        budget.last_error = err
        raise err from exc


def _is_mapped(exc: BaseException) -> bool:
    if isinstance(exc, (OSError, _SinkError, urllib3.exceptions.HTTPError, http.client.HTTPException)):
        return True
    try:
        import botocore.exceptions as bx
    except ImportError:  # pragma: no cover
        return False
    return isinstance(exc, (bx.BotoCoreError, bx.ClientError))


_MIN_TIMEOUT = 0.125


def _near_deadline(t: float, left: float) -> float:
    """``t``, or when less than that is left of the deadline, the largest power
    of two (>= 1/8 s) not above what is left: a few clients, not one per call."""
    if left >= t:
        return float(t)
    v = _MIN_TIMEOUT
    while v * 2 <= left:
        v *= 2
    return v


# ---------------------------------------------------------------------------
# the transport
# ---------------------------------------------------------------------------
class _S3Attempt(_Attempt):
    """fetch.py's attempt state (partial file, hasher, counters, budget), over S3."""

    def __init__(self, url: str, path: str, expected_size: Optional[int], config: FetchConfig,
                 budget: FetchBudget, max_bytes: Optional[int] = None):
        super().__init__(url, path, expected_size, config, None, budget, max_bytes)
        self.bucket, self.key = parse_s3_url(url)

    def _client(self) -> Any:
        left = self.budget.remaining()
        return client_for(self.url, self.config, (_near_deadline(self.config.connect_timeout, left),
                                                  _near_deadline(self.config.read_timeout, left)))

    def _get(self, **kw: Any) -> Any:
        return self._client().get_object(Bucket=self.bucket, Key=self.key, **kw)

    def _complete(self, have: int, validator: Optional[str]) -> bool:
        """After a 416 for ``bytes=have-``: is the partial the whole, unchanged object?"""
        import botocore.exceptions as bx

        try:
            head = self._client().head_object(Bucket=self.bucket, Key=self.key, IfMatch=validator)
        except bx.ClientError as exc:
            if _client_error_parts(exc)[1] == 412:
                return False  # replaced meanwhile
            raise
        return int(head.get("ContentLength", -1)) == have

    def s3(self) -> None:
        import botocore.exceptions as bx

        pace = _Pace(self.url, self.config, self.budget)
        have = _size_of(self.path)
        validator = _read_validator(self.path) if have else None
        if have and (validator is None or (self.expected_size is not None and have > self.expected_size)):
            have = 0  # cannot prove the bytes belong to the current object: restart
        resp = None
        if have:
            try:
                resp = self._get(Range=f"bytes={have}-", IfMatch=validator)
            except bx.ClientError as exc:
                code, status, _, _ = _client_error_parts(exc)
                if status == 412 or code == "PreconditionFailed":
                    have = 0  # the object was replaced since the partial began: start over
                elif status == 416 or code == "InvalidRange":
                    if self._complete(have, validator):
                        return  # the partial is already complete
                    have = 0
                else:
                    raise
        if resp is None:
            resp = self._get()
        status = int(resp["ResponseMetadata"]["HTTPStatusCode"])
        body = resp["Body"]
        raw = getattr(body, "_raw_stream", None)
        try:
            length = int(resp.get("ContentLength") or 0)
            etag: Optional[str] = None
            if have and status == 206:
                m = _CONTENT_RANGE.match(resp.get("ContentRange") or "")
                if not m or int(m.group(1)) != have:
                    _remove_quietly(self.path + _ETAG_SUFFIX)
                    raise TransientFetchError(f"{self.url}: S3 206 with unexpected Content-Range "
                                              f"{resp.get('ContentRange')!r} for byte {have}; restarting",
                                              self.url, 206)
                start, append = have, True
            elif status in (200, 206):  # a store that ignored the Range sends it all
                start, append = 0, False
                etag = resp.get("ETag") or None
                if etag and etag.startswith("W/"):
                    etag = None  # If-Match needs a strong validator
            else:
                raise TransientFetchError(f"{self.url}: S3 GetObject answered HTTP {status}", self.url, status)
            want_total = start + length
            if self.max_bytes is not None and want_total > self.max_bytes:
                raise self._too_big(want_total)
            try:
                with _Sink(self, append=append) as sink:
                    if not append:
                        # emptied before the validator is recorded, so the pair always agrees
                        _write_validator(self.path, etag)
                    if raw is not None:
                        raw.enforce_content_length = False  # we check lengths ourselves
                        reader = _Body(raw)
                        self._copy(reader.readinto, sink, pace, sniff=not append)
                        reader.finish()
                    else:  # pragma: no cover - a botocore without _raw_stream
                        self._copy(lambda buf: _read_into(body, buf), sink, pace, sniff=not append)
            except _HtmlBody as html:
                _remove_quietly(self.path + _ETAG_SUFFIX)
                _remove_quietly(self.path)
                ctype = (resp.get("ContentType") or "none")
                snippet = " ".join(html.head.decode("utf-8", "replace").split())[:80]
                raise PermanentFetchError(f"{self.url}: S3 GetObject answered HTTP {status} but the body is an "
                                          f"HTML page, not the object (Content-Type: {ctype}; it begins "
                                          f"{snippet!r}); is the endpoint an S3 API endpoint?", self.url,
                                          status) from None
        finally:
            body.close()
        size = _size_of(self.path)
        if size < want_total:
            raise TransientFetchError(f"{self.url}: short body: got {size - start} of {want_total - start} bytes",
                                      self.url, status)
        self._check_expected(size)


def _read_into(body: Any, buf: memoryview) -> int:  # pragma: no cover - fallback
    data = body.read(len(buf))
    buf[: len(data)] = data
    return len(data)


def s3_fetch_to_file(url: str, partial_path: str, *, expected_size: Optional[int] = None,
                     config: Optional[FetchConfig] = None, on_event: Optional[EventFn] = None,
                     budget: Optional[FetchBudget] = None, max_bytes: Optional[int] = None) -> FetchResult:
    """:func:`resumewds.fetch.fetch_to_file` for an ``s3://`` url.

    Args:
        url: ``s3://bucket/key``.
        partial_path: destination; bytes already in it are kept when the
            object's ETag (in ``partial_path + ".etag"``) still matches.
        expected_size: size the finished file must reach, if known.
        config: retry, timeout and S3 settings (default
            :meth:`FetchConfig.from_env`).
        on_event: ``on_event(kind, url, **detail)`` for ``fetch_start``,
            ``fetch_done`` and ``retry``.
        budget: the attempts and deadline to draw from, shared with others
            fetching the same shard for the same read (a fresh one if None).
        max_bytes: refuse (permanently) an object larger than this.

    Returns:
        A :class:`~resumewds.fetch.FetchResult` with the file's xxh3_64.

    Raises:
        TransientFetchError: still failing when the budget is spent.
        PermanentFetchError: NoSuchKey, AccessDenied, no credentials, an HTML
            page, more than ``max_bytes``, ...
        CacheError: ``partial_path`` cannot be written.

    Example:
        >>> s3_fetch_to_file("s3://b", "/tmp/x")  # doctest: +IGNORE_EXCEPTION_DETAIL
        Traceback (most recent call last):
        resumewds.errors.PermanentFetchError: s3://b: not an s3 object url (expected s3://BUCKET/KEY)
    """
    cfg = config or FetchConfig.from_env()
    budget = budget or FetchBudget(cfg)
    state = _S3Attempt(url, partial_path, expected_size, cfg, budget, max_bytes)
    t0 = time.monotonic()
    resumed_from = _size_of(partial_path) if _read_validator(partial_path) else 0
    if on_event is not None:
        on_event("fetch_start", url, resumed_from=resumed_from)
    if cfg.log_opens:
        _gopen_log(url, "open" + (f" from byte {resumed_from}" if resumed_from else ""))
    try:
        _retry(cfg, url, on_event, budget, _run, state)
    except BaseException as exc:
        if cfg.log_opens:
            _gopen_log(url, f"failed after {state.received} bytes: {exc}")
        raise
    return _fetched(url, partial_path, state, cfg, on_event, t0)


def s3_fetch_bytes(url: str, config: Optional[FetchConfig] = None, *,
                   on_event: Optional[EventFn] = None, max_bytes: Optional[int] = None) -> bytes:
    """:func:`resumewds.fetch.fetch_bytes` for an ``s3://`` url (a manifest).

    The same path as every other object (through a temporary file).

    Raises:
        TransientFetchError, PermanentFetchError: as for :func:`s3_fetch_to_file`.
    """
    from .fetch import fetch_bytes

    return fetch_bytes(url, config, on_event=on_event, max_bytes=max_bytes)


__all__ = [
    "PERMANENT_CODES",
    "S3Options",
    "TRANSIENT_CODES",
    "client_for",
    "parse_s3_url",
    "resolve_options",
    "s3_fetch_bytes",
    "s3_fetch_to_file",
    "scheme_hint",
    "translate_s3_error",
]
