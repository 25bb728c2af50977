"""``s3://bucket/key``: Amazon S3 and S3-compatible stores as a fetch transport.

The contract of :mod:`resumewds.fetch` through boto3 (``pip install
'resumewds[s3]'``, imported only when an s3 url is fetched): our retry
policy and :class:`~resumewds.fetch.FetchBudget` (botocore's retries off),
the FetchConfig's timeouts cut to the deadline, fetch's pacing of the body,
``max_bytes``, an HTML page (a wrong endpoint) permanent, and a ranged
resume guarded by the object's ETag::

    partial has N > 0 bytes and the object's ETag in <partial>.etag
        -> GetObject Range: bytes=N-  If-Match: <ETag>
           206 (Content-Range starts at N)  append
           412 PreconditionFailed (the object was replaced)  restart from zero
           416 InvalidRange  HeadObject If-Match: complete when its size is N
    otherwise
        -> GetObject, truncate, save the response's ETag

Errors: :data:`S3_ERRORS` (by error code: :data:`TRANSIENT_CODES`,
:data:`PERMANENT_CODES`, else 5xx and 429 transient, other 4xx permanent),
in front of :data:`~resumewds.fetch._errormap.FETCH_ERRORS`.  A stored
``Content-Encoding`` is metadata (S3 serves the stored bytes), so unlike
http it is not refused.  Settings: defaults, then the environment
(:func:`resumewds.config.s3_settings`), then ``FetchConfig(s3=S3Options(...))``;
docs/S3.md has the table.

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
from dataclasses import dataclass
from typing import Any, Dict, Iterator, Optional, Tuple

import urllib3.exceptions

from ..config import S3_ADDRESSING, s3_settings
from ..errors import FetchError, PermanentFetchError, RangeIgnored, ResumeWDSError, TransientFetchError

# the package's partial-file machinery (sidecar validator, hashing writer, body
# reader, pacing, error map), shared so that every transport keeps one contract
from ._attempt import _Attempt, _HtmlBody, _Pace
from ._download import _download, fetch_bytes
from ._errormap import FETCH_ERRORS, ErrorRule, _SinkError, parse_retry_after, says, translate
from ._http import _CONTENT_RANGE, _Body, check_content_range
from ._partial import _ETAG_SUFFIX, _read_validator, _remove_quietly, _Sink, _size_of, _write_validator
from ._retry import FetchBudget
from ._settings import EventFn, FetchConfig, FetchResult
from ._transport import Transport

_ADDRESSING = S3_ADDRESSING


@dataclass(frozen=True)
class S3Options:
    """Where and how to reach an S3 (or S3-compatible) store; fields left at their defaults
    come from the environment, credentials from boto3's standard chain.

    Attributes:
        endpoint_url: e.g. ``http://127.0.0.1:9000`` (MinIO), ``https://storage.googleapis.com`` (GCS).
        region: the bucket's region (``auto`` for R2).
        addressing_style: ``auto``, ``path`` (most self-hosted stores) or ``virtual``.
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
    def from_env(cls) -> S3Options:
        """The options the environment gives (ValueError for a bad RESUMEWDS_S3_* value)."""
        return cls(**s3_settings())


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


# ---- clients: one per (process, options, timeouts), shared by threads (boto3 clients are
# thread-safe, their creation is not); keyed by the pid: a forked child makes its own, and its own lock
_CLIENTS: Dict[Tuple[Any, ...], Any] = {}
_LOCKS: Dict[int, threading.Lock] = {}


def _clients_lock() -> threading.Lock:
    pid = os.getpid()
    lock = _LOCKS.get(pid)
    if lock is None:
        lock = _LOCKS.setdefault(pid, threading.Lock())
    return lock


def _import_boto(url: str) -> Any:
    try:
        import boto3  # the optional extra
        import botocore  # noqa: F401
    except ImportError as exc:
        raise PermanentFetchError(f"{url}: s3:// urls need boto3: pip install 'resumewds[s3]' ({exc})",
                                  url) from exc
    return boto3


def client_for(url: str, config: FetchConfig, timeouts: Optional[Tuple[float, float]] = None) -> Any:
    """The boto3 S3 client this process uses for ``config`` (created once), its retries off.

    ``timeouts``: ``(connect, read)``, shorter ones near a fetch deadline.

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
    with _clients_lock():
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


# ---- error translation: botocore's errors into our tree (the rest is fetch's) ----
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
    resp = getattr(exc, "response", None) or {}
    err = resp.get("Error") or {}
    meta = resp.get("ResponseMetadata") or {}
    status = int(meta.get("HTTPStatusCode") or 0)
    code = str(err.get("Code") or status or "unknown")
    msg = str(err.get("Message") or "")
    ra = parse_retry_after((meta.get("HTTPHeaders") or {}).get("retry-after"))
    return code, status, msg, ra


def _client_error(exc: Any, url: str) -> ResumeWDSError:
    """A botocore ClientError: by its code (:data:`TRANSIENT_CODES`, :data:`PERMANENT_CODES`), else its status."""
    code, status, msg, ra = _client_error_parts(exc)
    text = f"{url}: S3 {code} (HTTP {status})" + (f": {msg}" if msg else "")
    if code in PERMANENT_CODES:
        return PermanentFetchError(text, url, status or None)
    if code in TRANSIENT_CODES or status == 429 or status >= 500:
        if ra is not None:
            text += f" (Retry-After {ra:g}s)"
        return TransientFetchError(text, url, status or None, retry_after=ra)
    return PermanentFetchError(text, url, status or None)


_BX = "botocore.exceptions."
_PERM, _TRANS = PermanentFetchError, TransientFetchError

#: botocore's exceptions -> ours (first match wins), then :data:`FETCH_ERRORS` for the rest
S3_ERRORS: Tuple[ErrorRule, ...] = (
    ErrorRule((_BX + "ClientError",), _client_error),
    ErrorRule((_BX + "NoCredentialsError", _BX + "PartialCredentialsError"),
              says(_PERM, lambda e, u: f"no usable AWS credentials ({e}); set AWS_ACCESS_KEY_ID/"
                                       "AWS_SECRET_ACCESS_KEY or AWS_PROFILE, use an instance role, or "
                                       "RESUMEWDS_S3_ANONYMOUS=1 for a public bucket")),
    ErrorRule((_BX + "CredentialRetrievalError",),
              says(_TRANS, lambda e, u: f"could not retrieve AWS credentials: {e}")),
    ErrorRule((_BX + "ConnectTimeoutError",), says(_TRANS, lambda e, u: f"connect timeout: {e}")),
    ErrorRule((_BX + "ReadTimeoutError",), says(_TRANS, lambda e, u: f"read timeout (stalled): {e}")),
    ErrorRule((_BX + "EndpointConnectionError",),
              says(_TRANS, lambda e, u: f"cannot connect to the S3 endpoint: {e}")),
    ErrorRule((_BX + "ConnectionClosedError", _BX + "ResponseStreamingError", _BX + "IncompleteReadError",
               _BX + "HTTPClientError"), says(_TRANS, lambda e, u: f"connection error: {e}")),
    ErrorRule((_BX + "ParamValidationError", _BX + "NoRegionError", _BX + "UnknownEndpointError"),
              says(_PERM, lambda e, u: f"bad S3 request: {e}")),
    ErrorRule((_BX + "BotoCoreError",), says(FetchError, lambda e, u: f"unexpected {type(e).__name__}: {e}")),
) + FETCH_ERRORS


def translate_s3_error(exc: BaseException, url: str) -> ResumeWDSError:
    """Map an exception met while reading ``url`` from S3 to one of ours (by :data:`S3_ERRORS`).

    Example:
        >>> from botocore.exceptions import ClientError
        >>> e = ClientError({"Error": {"Code": "SlowDown", "Message": "Reduce your request rate"},
        ...                  "ResponseMetadata": {"HTTPStatusCode": 503}}, "GetObject")
        >>> type(translate_s3_error(e, "s3://b/k")).__name__
        'TransientFetchError'
    """
    return translate(exc, url, S3_ERRORS)


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


# ---- the transport ----
def _write_object(state: _Attempt, resp: Any, pace: _Pace, append: bool, etag: Optional[str], status: int) -> None:
    """A GetObject body into the partial file (appended for a resume; a new download
    records its validator first); an HTML page where the object was expected is refused."""
    body = resp["Body"]
    raw = getattr(body, "_raw_stream", None)
    try:
        with _Sink(state, append=append) as sink:
            if not append:
                # emptied before the validator is recorded, so the pair always agrees
                _write_validator(state.path, etag)
            state.keeps = bool(append or etag)
            if raw is not None:
                raw.enforce_content_length = False  # we check lengths ourselves
                reader = _Body(raw)
                state._copy(reader.readinto, sink, pace, sniff=not append)
                reader.finish()
            else:  # pragma: no cover - a botocore without _raw_stream
                state._copy(lambda buf: _read_into(body, buf), sink, pace, sniff=not append)
    except _HtmlBody as html:
        _remove_quietly(state.path + _ETAG_SUFFIX)
        _remove_quietly(state.path)
        ctype = (resp.get("ContentType") or "none")
        snippet = " ".join(html.head.decode("utf-8", "replace").split())[:80]
        raise PermanentFetchError(f"{state.url}: S3 GetObject answered HTTP {status} but the body is an "
                                  f"HTML page, not the object (Content-Type: {ctype}; it begins "
                                  f"{snippet!r}); is the endpoint an S3 API endpoint?", state.url,
                                  status) from None


class S3Transport(Transport):
    """``s3://bucket/key``: GetObject per attempt, resumed with Range and If-Match on the ETag."""

    name = "s3"
    resumable = True
    ranged = True
    # botocore's, urllib3's, OSError, our sink's: all mapped, none leaks
    catches = (_BX + "BotoCoreError", _BX + "ClientError", OSError, _SinkError, urllib3.exceptions.HTTPError,
               http.client.HTTPException)
    errors = S3_ERRORS

    def check(self, url: str) -> None:
        parse_s3_url(url)

    @staticmethod
    def _client(state: _Attempt) -> Any:
        left = state.budget.remaining()
        return client_for(state.url, state.config, (_near_deadline(state.config.connect_timeout, left),
                                                    _near_deadline(state.config.read_timeout, left)))

    def _complete(self, state: _Attempt, bucket: str, key: str, have: int, validator: Optional[str]) -> bool:
        """After a 416 for ``bytes=have-``: is the partial the whole, unchanged object?"""
        import botocore.exceptions as bx

        try:
            head = self._client(state).head_object(Bucket=bucket, Key=key, IfMatch=validator)
        except bx.ClientError as exc:
            if _client_error_parts(exc)[1] == 412:
                return False  # replaced meanwhile
            raise
        return int(head.get("ContentLength", -1)) == have

    def _get(self, state: _Attempt, bucket: str, key: str, have: int, validator: Optional[str]) -> Tuple[Any, int]:
        """GetObject for this attempt: the rest after byte ``have`` of the same object
        (``IfMatch``), or the whole object; ``(response, have)``, ``have`` 0 when it
        starts over, None for the response when the partial is already complete."""
        import botocore.exceptions as bx

        client = self._client(state)
        if have:
            try:
                return client.get_object(Bucket=bucket, Key=key, Range=f"bytes={have}-", IfMatch=validator), have
            except bx.ClientError as exc:
                code, status, _, _ = _client_error_parts(exc)
                if status == 412 or code == "PreconditionFailed":
                    pass  # the object was replaced since the partial began: start over
                elif status == 416 or code == "InvalidRange":
                    if self._complete(state, bucket, key, have, validator):
                        return None, have  # the partial is already complete
                else:
                    raise
        return client.get_object(Bucket=bucket, Key=key), 0

    def attempt(self, state: _Attempt) -> None:
        bucket, key = parse_s3_url(state.url)
        pace = _Pace(state.url, state.config, state.budget)
        have = _size_of(state.path)
        validator = _read_validator(state.path) if have else None
        if have and (validator is None or (state.expected_size is not None and have > state.expected_size)):
            have = 0  # cannot prove the bytes belong to the current object: restart
        resp, have = self._get(state, bucket, key, have, validator)
        if resp is None:
            return
        status = int(resp["ResponseMetadata"]["HTTPStatusCode"])
        body = resp["Body"]
        state.budget.saw(resp.get("ETag"))
        try:
            length = int(resp.get("ContentLength") or 0)
            etag: Optional[str] = None
            if have and status == 206:
                m = _CONTENT_RANGE.match(resp.get("ContentRange") or "")
                if not m or int(m.group(1)) != have:
                    _remove_quietly(state.path + _ETAG_SUFFIX)
                    raise TransientFetchError(f"{state.url}: S3 206 with unexpected Content-Range "
                                              f"{resp.get('ContentRange')!r} for byte {have}; restarting",
                                              state.url, 206)
                start, append = have, True
            elif status in (200, 206):  # a store that ignored the Range sends it all
                start, append = 0, False
                etag = resp.get("ETag") or None
                if etag and etag.startswith("W/"):
                    etag = None  # If-Match needs a strong validator
            else:
                raise TransientFetchError(f"{state.url}: S3 GetObject answered HTTP {status}", state.url, status)
            want_total = start + length
            if state.max_bytes is not None and want_total > state.max_bytes:
                raise state._too_big(want_total)
            _write_object(state, resp, pace, append, etag, status)
        finally:
            body.close()
        size = _size_of(state.path)
        if size < want_total:
            raise TransientFetchError(f"{state.url}: short body: got {size - start} of {want_total - start} bytes",
                                      state.url, status)
        state._check_expected(size)

    def open_range(self, url: str, start: int, end: int, session: Any, config: Any,
                   pace: _Pace) -> Tuple[Iterator[bytes], Optional[str], Any]:
        """A ranged GetObject of bytes ``[start, end)``: ``(chunks, ETag, body)``.

        Raises:
            RangeIgnored: another status or range (a 416: a whole GetObject may serve it).
        """
        bucket, key = parse_s3_url(url)
        client = client_for(url, config, (pace.timeout(config.connect_timeout), pace.timeout(config.read_timeout)))
        try:
            resp = client.get_object(Bucket=bucket, Key=key, Range=f"bytes={start}-{end - 1}")
        except Exception as exc:
            err = translate_s3_error(exc, url)
            if getattr(err, "status", None) == 416:
                raise RangeIgnored(f"{err} (bytes {start}-{end - 1})", url, 416) from None
            raise
        body = resp["Body"]
        try:
            status = int(resp["ResponseMetadata"]["HTTPStatusCode"])
            if status != 206:
                raise RangeIgnored(f"{url}: S3 answered a Range GetObject with HTTP {status}", url, status)
            check_content_range(url, "ContentRange", resp.get("ContentRange"), start, end)
        except BaseException:
            body.close()
            raise
        return iter(lambda: body.read(1 << 18), b""), resp.get("ETag") or None, body


def _read_into(body: Any, buf: memoryview) -> int:  # pragma: no cover - fallback
    data = body.read(len(buf))
    buf[: len(data)] = data
    return len(data)


TRANSPORT = S3Transport()


def s3_fetch_to_file(url: str, partial_path: str, *, expected_size: Optional[int] = None,
                     config: Optional[FetchConfig] = None, on_event: Optional[EventFn] = None,
                     budget: Optional[FetchBudget] = None, max_bytes: Optional[int] = None) -> FetchResult:
    """:func:`resumewds.fetch.fetch_to_file` for an ``s3://`` url (its arguments, its errors).

    Example:
        >>> s3_fetch_to_file("s3://b", "/tmp/x")  # doctest: +IGNORE_EXCEPTION_DETAIL
        Traceback (most recent call last):
        resumewds.errors.PermanentFetchError: s3://b: not an s3 object url (expected s3://BUCKET/KEY)
    """
    cfg = config or FetchConfig.from_env()
    return _download(TRANSPORT, url, partial_path, expected_size=expected_size, config=cfg, on_event=on_event,
                     session=None, budget=budget, max_bytes=max_bytes)


def s3_fetch_bytes(url: str, config: Optional[FetchConfig] = None, *,
                   on_event: Optional[EventFn] = None, max_bytes: Optional[int] = None) -> bytes:
    """:func:`resumewds.fetch.fetch_bytes` for an ``s3://`` url (a manifest)."""
    return fetch_bytes(url, config, on_event=on_event, max_bytes=max_bytes)
