"""The error map: every foreign exception met while fetching becomes one of ours here.

One table per boundary, read top to bottom, first match wins;
:func:`resumewds.fetch._transport._run_attempt` maps what a transport
``catches`` through its table, ``raise Ours(msg) from exc``.  Classes of
lazily imported libraries (urllib3, botocore) are dotted strings: such a row
matches nothing until its module is imported.

:data:`FETCH_ERRORS` (the s3 transport puts its botocore rows in front)::

    _SinkError (writing the partial)         CacheError  (ENOSPC, EROFS, EACCES, ...)
    urllib3 LocationParseError, URL-         permanent   invalid URL
      SchemeUnknown, ProxySchemeUnknown
    a TLS certificate that does not verify   permanent   TLS certificate verification failed
    urllib3 SSLError, ssl.SSLError           transient   TLS error (a handshake cut short)
    urllib3 NewConnectionError               transient   connection error (refused, no route, DNS)
    urllib3 ConnectTimeoutError              transient   connect timeout
    urllib3 ReadTimeoutError, socket.timeout transient   read timeout (stalled)
    urllib3 ProxyError                       transient   proxy error
    urllib3 ProtocolError / HTTPError,       transient   broken response body
      http.client HTTPException
    FileNotFoundError                        permanent   no such file
    IsADirectory/NotADirectory/Permission    permanent   cannot read
    ConnectionError, any other OSError       transient   connection error
    subprocess.SubprocessError               transient   command failed
    anything else                            FetchError  unexpected <type>

HTTP statuses (:func:`_status_error`): 429 and 5xx are transient, whatever
the body; other failures are permanent.

Example:
    >>> type(translate(FileNotFoundError(2, "gone", "/d/a.tar"), "/d/a.tar")).__name__
    'PermanentFetchError'
    >>> str(translate(ConnectionResetError(104, "reset"), "http://h/a.tar"))
    'http://h/a.tar: connection error: [Errno 104] reset'
"""

from __future__ import annotations

import email.utils
import http.client
import os
import socket
import ssl
import subprocess
import sys
import time
from dataclasses import dataclass
from typing import Any, Callable, Optional, Sequence, Tuple, Union

from ..errors import CacheError, FetchError, PermanentFetchError, ResumeWDSError, TransientFetchError, os_problem
from ..redact import scrub

Builder = Callable[[Any, str], ResumeWDSError]
"""``build(exc, url) -> our error`` (raised ``from exc`` by the caller)."""

TypeRef = Union[type, str]
"""An exception class, or the dotted name of one in a library imported lazily."""


class _SinkError(Exception):
    """An OSError while writing the destination (not the source's fault)."""

    def __init__(self, exc: OSError, path: str):
        super().__init__(str(exc))
        self.exc = exc
        self.path = path


def resolve_types(refs: Sequence[TypeRef]) -> Tuple[type, ...]:
    """The classes ``refs`` name that exist now (a dotted name whose module is not imported names nothing).

    Example:
        >>> resolve_types((OSError, "no.such.module.Error"))
        (<class 'OSError'>,)
    """
    out = []
    for ref in refs:
        if isinstance(ref, type):
            out.append(ref)
            continue
        module, _, name = ref.rpartition(".")
        cls = getattr(sys.modules.get(module), name, None)
        if isinstance(cls, type):
            out.append(cls)
    return tuple(out)


@dataclass(frozen=True)
class ErrorRule:
    """One row of an error map: the exceptions it matches, how to build ours, an optional condition."""

    types: Tuple[TypeRef, ...]
    build: Builder
    when: Optional[Callable[[Any], bool]] = None

    def matches(self, exc: BaseException) -> bool:
        types = resolve_types(self.types)
        return bool(types) and isinstance(exc, types) and (self.when is None or self.when(exc))


def says(error: Callable[..., ResumeWDSError], message: Callable[[Any, str], str]) -> Builder:
    """A :data:`Builder`: ``error(f"{url}: {message(exc, url)}", url)``."""
    def build(exc: Any, url: str) -> ResumeWDSError:
        return error(f"{url}: {message(exc, url)}", url)
    return build


def _cannot_write(exc: Any, url: str) -> ResumeWDSError:
    inner = exc.exc
    problem = os_problem(inner)
    return CacheError(f"{os.path.dirname(exc.path) or '.'}: cannot write {os.path.basename(exc.path)}"
                      f" while fetching {url}: {problem}")


def _tls_reason(exc: Any) -> str:
    """What the TLS layer said of a certificate that does not verify."""
    inner = exc.args[0] if exc.args and isinstance(exc.args[0], BaseException) else exc
    return str(getattr(inner, "verify_message", None) or getattr(inner, "strerror", None) or inner)


def _cert_failure(exc: Any) -> bool:
    """urllib3 wraps a certificate that does not verify (or a hostname mismatch) in its SSLError."""
    inner = exc.args[0] if exc.args else None
    return isinstance(inner, ssl.SSLCertVerificationError) or "CERTIFICATE_VERIFY_FAILED" in str(exc)


_U3 = "urllib3.exceptions."
_PERM, _TRANS = PermanentFetchError, TransientFetchError
_TLS_FAILED = says(_PERM, lambda e, u: f"TLS certificate verification failed: {_tls_reason(e)} (REQUESTS_CA_BUNDLE "
                                       f"/ SSL_CERT_FILE name the CA bundle to trust)")

#: http(s), file://, local paths and ``pipe:``: foreign exception -> ours (first match wins)
FETCH_ERRORS: Tuple[ErrorRule, ...] = (
    ErrorRule((_SinkError,), _cannot_write),
    ErrorRule((_U3 + "LocationParseError", _U3 + "LocationValueError", _U3 + "URLSchemeUnknown",
               _U3 + "ProxySchemeUnknown"),
              says(_PERM, lambda e, u: f"invalid URL: {e}")),
    ErrorRule((ssl.SSLCertVerificationError,), _TLS_FAILED),
    ErrorRule((_U3 + "SSLError",), _TLS_FAILED, when=_cert_failure),
    ErrorRule((_U3 + "SSLError", ssl.SSLError), says(_TRANS, lambda e, u: f"TLS error: {e}")),
    ErrorRule((_U3 + "NewConnectionError",), says(_TRANS, lambda e, u: f"connection error: {e}")),
    ErrorRule((_U3 + "ConnectTimeoutError",), says(_TRANS, lambda e, u: f"connect timeout: {e}")),
    ErrorRule((_U3 + "ReadTimeoutError", socket.timeout, TimeoutError),
              says(_TRANS, lambda e, u: f"read timeout (stalled): {e}")),
    ErrorRule((_U3 + "ProxyError",), says(_TRANS, lambda e, u: f"proxy error: {e}")),
    ErrorRule((_U3 + "HTTPError", http.client.HTTPException),
              says(_TRANS, lambda e, u: f"broken response body: {e}")),
    ErrorRule((FileNotFoundError,), says(_PERM, lambda e, u: f"no such file: {e.filename or u}")),
    ErrorRule((IsADirectoryError, NotADirectoryError, PermissionError),
              says(_PERM, lambda e, u: f"cannot read: {e.strerror or e}")),
    # resets, refused, broken pipe (socket.error is OSError: any other OSError lands here)
    ErrorRule((ConnectionError, socket.error), says(_TRANS, lambda e, u: f"connection error: {e}")),
    ErrorRule((subprocess.SubprocessError,), says(_TRANS, lambda e, u: f"command failed: {e}")),
)


def translate(exc: BaseException, url: str, rules: Sequence[ErrorRule] = FETCH_ERRORS) -> ResumeWDSError:
    """Map a foreign exception met while fetching ``url`` to one of ours, by ``rules``.

    One of ours is returned as it is; an exception no rule matches becomes a
    plain :class:`~resumewds.errors.FetchError`.  The caller raises it ``from exc``.

    Example:
        >>> str(translate(ValueError("odd"), "http://h/a.tar"))
        'http://h/a.tar: unexpected ValueError: odd'
    """
    if isinstance(exc, ResumeWDSError):
        return exc
    scrub(exc)  # the error is raised from it: its message must not print a secret either
    for rule in rules:
        if rule.matches(exc):
            return rule.build(exc, url)
    return FetchError(f"{url}: unexpected {type(exc).__name__}: {exc}", url)


def _status_error(url: str, resp: Any) -> FetchError:
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
