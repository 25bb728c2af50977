"""``http://`` and ``https://`` on urllib3: one client, Range/If-Range resume, ranged reads.

Every http(s) byte goes through a :class:`Session`: urllib3 pools, redirects
followed by us (a loop is permanent), the proxy from ``HTTP(S)_PROXY`` /
``NO_PROXY``, the CA bundle from ``REQUESTS_CA_BUNDLE`` / ``CURL_CA_BUNDLE`` /
``SSL_CERT_FILE`` or certifi, credentials from the URL or ``~/.netrc`` (sent
to that host only).  urllib3's own retries are off.  Whole downloads::

    partial has N > 0 bytes and a validator in <partial>.etag
        -> GET  Range: bytes=N-   If-Range: <ETag or Last-Modified>
           206 (Content-Range starts at N, same validator)  append
           206 with another validator (server ignored If-Range)  start over
           200 (file changed, or server ignores Range)  restart from zero
           200 with the Content-Range of a part, or shorter than the known
               size (a broken server)  transient; then whole GETs from byte 0
           416 (bytes */N)  the partial is already complete
    otherwise
        -> GET (no Range), truncate, save the response's validator

A Content-Encoding, or an HTML page for a shard of known size, is
transient; an HTML page for a shard of unknown size is permanent.

Example:
    >>> TRANSPORT.name, TRANSPORT.resumable
    ('http', True)
"""

from __future__ import annotations

import base64
import http.client
import netrc
import os
import re
import urllib.parse
import urllib.request
from typing import TYPE_CHECKING, Any, Dict, Iterator, Optional, Tuple

from ..errors import PermanentFetchError, RangeIgnored, TransientFetchError
from ._attempt import _Attempt, _HtmlBody, _Pace
from ._errormap import _status_error
from ._partial import _ETAG_SUFFIX, _read_validator, _remove_quietly, _Sink, _size_of, _write_validator
from ._transport import Transport

if TYPE_CHECKING:  # urllib3 is imported at the first http(s) fetch
    pass

_CONTENT_RANGE = re.compile(r"^\s*bytes\s+(\d+)-(\d+)/(\d+|\*)\s*$")
_CONTENT_RANGE_UNSAT = re.compile(r"^\s*bytes\s+\*/(\d+)\s*$")
_REDIRECTS = (301, 302, 303, 307, 308)


def _cafile() -> Optional[str]:
    """The CA bundle: ``REQUESTS_CA_BUNDLE``, ``CURL_CA_BUNDLE``, ``SSL_CERT_FILE``, else certifi's."""
    for var in ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "SSL_CERT_FILE"):
        v = os.environ.get(var)
        if v:
            return v
    try:
        import certifi  # lazy: only for https
    except ImportError:  # pragma: no cover - certifi is a dependency
        return None
    return str(certifi.where())


def _netrc_auth(host: str) -> Optional[Tuple[str, str]]:
    """``(login, password)`` for ``host`` from ``$NETRC`` or ``~/.netrc`` (None if none)."""
    path = os.environ.get("NETRC") or os.path.join(os.path.expanduser("~"), ".netrc")
    if not os.path.isfile(path):
        return None
    try:
        found = netrc.netrc(path).authenticators(host)
    except (OSError, netrc.NetrcParseError):
        return None
    if not found:
        return None
    login, _, password = found
    return login or "", password or ""


def _basic(user: str, password: str) -> str:
    return "Basic " + base64.b64encode(f"{user}:{password}".encode("latin-1", "replace")).decode("ascii")


class Response:
    """One response of :class:`Session` (a urllib3 response, its body not read yet).

    Attributes:
        url: the URL that answered (after redirects).
        raw: the urllib3 ``HTTPResponse``.
    """

    def __init__(self, raw: Any, url: str):
        self.raw = raw
        self.url = url
        self.status_code = int(raw.status)
        self.reason = raw.reason or ""
        self.headers = raw.headers

    def iter_content(self, chunk_size: int = 1 << 16) -> Iterator[bytes]:
        """The body in pieces of up to ``chunk_size`` bytes, as they arrive."""
        while True:
            data = self.raw.read1(chunk_size) if hasattr(self.raw, "read1") else self.raw.read(chunk_size)
            if not data:
                return
            yield data

    def close(self) -> None:
        """Hand the connection back when the body was read to its end, else close it."""
        raw = self.raw
        try:
            fp = getattr(raw, "_fp", None)
            done = fp is None or fp.isclosed() or getattr(fp, "length", None) == 0
            if done:
                raw.release_conn()
            else:
                raw.close()
        except Exception:  # pragma: no cover - closing is best effort
            pass

    def __enter__(self) -> Response:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class Session:
    """The package's http(s) client: urllib3 pools, redirects, proxies, credentials.

    One per thread (a thread's own pool keeps its connections warm); a forked
    child's first request starts new pools.

    Example:
        >>> with Session() as s:                                             # doctest: +SKIP
        ...     with s.get("http://127.0.0.1:8000/a.tar", {"Range": "bytes=0-511"}, (10, 30)) as r:
        ...         r.status_code
        206
    """

    def __init__(self) -> None:
        self.headers: Dict[str, str] = {"User-Agent": "resumewds", "Accept-Encoding": "identity"}
        self.max_redirects = 10
        self._managers: Dict[Optional[str], Any] = {}
        self._pid = os.getpid()

    def _manager(self, scheme: str, host: str) -> Any:
        import urllib3

        if self._pid != os.getpid():  # a forked child: the parent's connections are not ours
            self._managers = {}
            self._pid = os.getpid()
        proxy = None
        proxies = urllib.request.getproxies()
        candidate = proxies.get(scheme) or proxies.get("all")
        if candidate and not urllib.request.proxy_bypass(host):
            proxy = candidate if "://" in candidate else "http://" + candidate
        mgr = self._managers.get(proxy)
        if mgr is None:
            kw: Dict[str, Any] = dict(num_pools=32, maxsize=4, retries=False, cert_reqs="CERT_REQUIRED",
                                      ca_certs=_cafile())
            if proxy is None:
                mgr = urllib3.PoolManager(**kw)
            else:
                p = urllib.parse.urlsplit(proxy)
                headers = None
                if p.username is not None:
                    headers = urllib3.make_headers(
                        proxy_basic_auth=f"{urllib.parse.unquote(p.username)}:"
                                         f"{urllib.parse.unquote(p.password or '')}")
                mgr = urllib3.ProxyManager(proxy, proxy_headers=headers, **kw)
            self._managers[proxy] = mgr
        return mgr

    def get(self, url: str, headers: Optional[Dict[str, str]] = None,
            timeout: Tuple[Optional[float], Optional[float]] = (None, None)) -> Response:
        """GET ``url`` (its body not read yet), following redirects.

        Raises:
            PermanentFetchError: a malformed URL, or more than ``max_redirects`` redirects.
            urllib3 / OSError exceptions: mapped by the caller's error map.
        """
        import urllib3

        hdrs = dict(self.headers)
        hdrs.update(headers or {})
        first = urllib.parse.urlsplit(url)
        auth_host = first.hostname
        auth: Optional[str] = None
        if first.username is not None:
            auth = _basic(urllib.parse.unquote(first.username), urllib.parse.unquote(first.password or ""))
        elif first.hostname and "authorization" not in {k.lower() for k in hdrs}:
            creds = _netrc_auth(first.hostname)
            if creds is not None:
                auth = _basic(*creds)
        tmo = urllib3.Timeout(connect=timeout[0], read=timeout[1])
        asked, seen = url, 0
        while True:
            parts = urllib.parse.urlsplit(url)
            scheme = parts.scheme.lower()
            if scheme not in ("http", "https") or not parts.hostname:
                raise PermanentFetchError(f"{asked}: invalid URL: {url!r} is not an http(s) URL with a host", asked)
            send = dict(hdrs)
            if auth is not None and parts.hostname == auth_host:
                send["Authorization"] = auth
            netloc = parts.hostname if ":" not in parts.hostname else f"[{parts.hostname}]"
            if parts.port is not None:
                netloc += f":{parts.port}"
            bare = urllib.parse.urlunsplit((scheme, netloc, parts.path or "/", parts.query, ""))
            raw = self._manager(scheme, parts.hostname).urlopen(
                "GET", bare, headers=send, redirect=False, retries=False, preload_content=False,
                decode_content=False, timeout=tmo, assert_same_host=False)
            location = raw.headers.get("Location")
            if raw.status not in _REDIRECTS or not location:
                return Response(raw, url)
            raw.drain_conn()
            raw.release_conn()
            seen += 1
            if seen > self.max_redirects:
                raise PermanentFetchError(
                    f"{asked}: too many redirects (a redirect loop?; more than RESUMEWDS_FETCH_MAX_REDIRECTS "
                    f"are not followed): exceeded {self.max_redirects} redirects (the last to {location})",
                    asked, int(raw.status))
            url = urllib.parse.urljoin(url, location)

    def close(self) -> None:
        """Close every pooled connection."""
        managers, self._managers = self._managers, {}
        if self._pid != os.getpid():
            return  # a forked child: the sockets are the parent's
        for mgr in managers.values():
            try:
                mgr.clear()
            except Exception:  # pragma: no cover - closing is best effort
                pass

    def __enter__(self) -> Session:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def new_session() -> Session:
    """A :class:`Session` for fetching shards (urllib3 is imported at its first request).

    Example:
        >>> s = new_session(); s.close()
    """
    return Session()


class _Body:
    """Reads a response body into our buffer, what one socket read gives (``readinto(buf) -> n``, 0 at the end).

    A sized body is read from the socket under ``http.client`` directly;
    chunked and close-delimited ones through ``read1``.
    """

    def __init__(self, raw: Any):
        self.raw = raw
        self.left: Optional[int] = None
        self.kind = "raw"
        fp = getattr(raw, "_fp", None)
        if isinstance(fp, http.client.HTTPResponse):
            self.fp = fp
            self.sock_file: Any = getattr(fp, "fp", None)
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
        """After a complete sized body: mark http.client's response done and return the connection
        to the pool (idempotent; botocore's body does not release it itself)."""
        if self.kind != "sized" or self.left != 0:
            return
        self.fp.length = 0
        self.fp.close()
        self.raw.release_conn()


def _refuse_partial_200(state: _Attempt, resp: Response, have: int, length: Optional[int]) -> None:
    """Refuse a 200 that says (a part's ``Content-Range``) or shows (shorter than the known size)
    that it is not the whole file; the next attempts are whole GETs from byte 0."""
    cr = resp.headers.get("Content-Range")
    why = None
    if cr is not None:
        m = _CONTENT_RANGE.match(cr)
        whole = m is not None and int(m.group(1)) == 0 and m.group(3) != "*" \
            and int(m.group(2)) + 1 == int(m.group(3))
        if not whole:
            why = f"HTTP 200 carrying Content-Range {cr!r}: a part of the file, not the whole"
    elif have and length is not None and state.expected_size is not None and length < state.expected_size:
        why = (f"HTTP 200 with {length} bytes in answer to a Range request (bytes={have}-); "
               f"the file has {state.expected_size}")
    if why is None:
        return
    state.no_range = True
    _remove_quietly(state.path + _ETAG_SUFFIX)
    _remove_quietly(state.path)
    raise TransientFetchError(f"{state.url}: {why}; the server mishandles Range: starting over from byte 0 "
                              f"without Range", state.url, 200)


def _refuse_encoding(url: str, resp: Response) -> None:
    enc = (resp.headers.get("Content-Encoding") or "").strip().lower()
    if enc not in ("", "identity"):
        # transient: one such answer (a cache or proxy's glitch) is retried; a server that
        # always does it ends the read with this message when the budget is spent
        raise TransientFetchError(
            f"{url}: the server sent a {enc}-encoded body (Content-Encoding: {enc}) although "
            f"resumewds asks for identity; its bytes are not the file's. Serve the file as it is "
            f"(no compression on the fly)", url, resp.status_code)


def _validator(headers: Any) -> Optional[str]:
    """A response's validator as a partial's sidecar keeps it (comparable with it):
    its strong ETag, else its Last-Modified."""
    etag = headers.get("ETag")
    return etag if etag and not etag.startswith("W/") else headers.get("Last-Modified")


def _resumed(state: _Attempt, resp: Response, have: int, validator: Optional[str]) -> Tuple[int, Optional[int]]:
    """A 206 for a resume at byte ``have``: its first byte and end, once its Content-Range
    and validator show the rest is of the same version."""
    m = _CONTENT_RANGE.match(resp.headers.get("Content-Range", ""))
    if not m or int(m.group(1)) != have:
        _remove_quietly(state.path + _ETAG_SUFFIX)
        raise TransientFetchError(f"{state.url}: HTTP 206 with unexpected Content-Range "
                                  f"{resp.headers.get('Content-Range')!r} for byte {have}; restarting",
                                  state.url, 206)
    # a server that ignores If-Range sends the range of whatever
    # the file is now: the rest must come from the same version
    got = resp.headers.get("ETag") if (validator or "").startswith(('"', "W/")) \
        else resp.headers.get("Last-Modified")
    if got != validator:
        _remove_quietly(state.path + _ETAG_SUFFIX)
        _remove_quietly(state.path)
        raise TransientFetchError(f"{state.url}: the file changed on the server during the download "
                                  f"(HTTP 206 with validator {got!r}, the partial download was of "
                                  f"{validator!r}; the server ignored If-Range); starting over",
                                  state.url, 206)
    return int(m.group(1)), int(m.group(2)) + 1


def _whole(state: _Attempt, resp: Response, have: int) -> Tuple[Optional[int], Optional[str]]:
    """A 200: its announced length (refused over ``max_bytes``, or as a part) and its strong ETag."""
    want_total = None
    cl = resp.headers.get("Content-Length")
    if cl is not None and cl.isdigit():
        want_total = int(cl)
        if state.max_bytes is not None and want_total > state.max_bytes:
            raise state._too_big(want_total)
    _refuse_partial_200(state, resp, have, want_total)
    # the validator goes first: a crash mid-body leaves a resumable pair
    etag = resp.headers.get("ETag")
    if etag and etag.startswith("W/"):
        etag = None  # If-Range needs a strong validator
    return want_total, etag


def _write_body(state: _Attempt, resp: Response, pace: _Pace, append: bool, etag: Optional[str]) -> None:
    """The body into the partial (appended for a resume; a new download records its validator
    first); an HTML page where a shard was expected is refused."""
    try:
        with _Sink(state, append=append) as sink:
            if not append:
                # emptied before the validator is recorded, so the pair always agrees
                _write_validator(state.path, etag or resp.headers.get("Last-Modified"))
            state.keeps = bool(append or etag or resp.headers.get("Last-Modified"))
            body = _Body(resp.raw)
            state._copy(body.readinto, sink, pace, sniff=not append)
            body.finish()
    except _HtmlBody as html:
        _remove_quietly(state.path + _ETAG_SUFFIX)
        _remove_quietly(state.path)
        ctype = resp.headers.get("Content-Type") or "none"
        snippet = " ".join(html.head.decode("utf-8", "replace").split())[:80]
        # known size (a manifest): a wrong body, retried like a corrupt one; unknown: nothing
        # says a retry would get a shard (a login page, a wrong URL): a clear error at once
        cls = PermanentFetchError if state.expected_size is None else TransientFetchError
        raise cls(f"{state.url}: HTTP {resp.status_code} but the body is an HTML page, not a shard "
                  f"(Content-Type: {ctype}; it begins {snippet!r})", state.url, resp.status_code) from None


class HTTPTransport(Transport):
    """http(s): one GET per attempt, through ``state.session`` (a :class:`Session`, made on first use)."""

    name = "http"
    resumable = True
    ranged = True

    def attempt(self, state: _Attempt) -> None:
        cfg = state.config
        pace = _Pace(state.url, cfg, state.budget)
        have = _size_of(state.path)
        validator = _read_validator(state.path) if have else None
        if have and (validator is None or state.no_range
                     or (state.expected_size is not None and have > state.expected_size)):
            have = 0  # cannot prove the bytes belong to the current file (or no Range here): restart
        headers = {"Accept-Encoding": "identity"}  # byte counts must be the file's, whatever the session
        if have:
            headers["Range"] = f"bytes={have}-"
            headers["If-Range"] = validator  # type: ignore[assignment]
        if state.session is None:
            state.session = new_session()
        state.session.max_redirects = cfg.max_redirects
        resp = state.session.get(state.url, headers,
                                 (pace.timeout(cfg.connect_timeout), pace.timeout(cfg.read_timeout)))
        with resp:
            code = resp.status_code
            if code in (200, 206):
                state.budget.saw(_validator(resp.headers))
            if code == 416 and have:
                m = _CONTENT_RANGE_UNSAT.match(resp.headers.get("Content-Range", ""))
                if m and int(m.group(1)) == have:
                    return  # the partial is already complete
                _remove_quietly(state.path + _ETAG_SUFFIX)
                raise TransientFetchError(f"{state.url}: HTTP 416 for a resume at byte {have}; restarting",
                                          state.url, 416)
            if code == 206 and have:
                (start, want_total), etag = _resumed(state, resp, have, validator), None
            elif code == 200:
                start, (want_total, etag) = 0, _whole(state, resp, have)
            else:
                raise _status_error(state.url, resp)
            _refuse_encoding(state.url, resp)
            _write_body(state, resp, pace, append=code == 206, etag=etag)
        size = _size_of(state.path)
        if want_total is not None and size < want_total:
            raise TransientFetchError(f"{state.url}: short body: got {size - start} of {want_total - start} bytes",
                                      state.url, code)
        state._check_expected(size)

    def open_range(self, url: str, start: int, end: int, session: Any, config: Any,
                   pace: _Pace) -> Tuple[Iterator[bytes], Optional[str], Any]:
        """GET bytes ``[start, end)``: ``(chunks, validator, closer)``; RangeIgnored for a 200, 416,
        another range or an encoded body."""
        if session is None:
            session = new_session()
        session.max_redirects = config.max_redirects
        resp = session.get(url, {"Range": f"bytes={start}-{end - 1}", "Accept-Encoding": "identity"},
                           (pace.timeout(config.connect_timeout), pace.timeout(config.read_timeout)))
        try:
            if resp.status_code == 200:
                raise RangeIgnored(f"{url}: the server ignored Range (HTTP 200)", url, 200)
            if resp.status_code == 416:  # a plain GET may well serve it: read the shard whole
                raise RangeIgnored(f"{url}: HTTP 416 for bytes {start}-{end - 1} (Content-Range "
                                   f"{resp.headers.get('Content-Range')!r})", url, 416)
            if resp.status_code != 206:
                raise _status_error(url, resp)
            check_content_range(url, "Content-Range", resp.headers.get("Content-Range"), start, end)
            enc = (resp.headers.get("Content-Encoding") or "").strip().lower()
            if enc not in ("", "identity"):
                raise RangeIgnored(f"{url}: {enc}-encoded range body", url, 206)
        except BaseException:
            resp.raw.close()
            raise
        return resp.iter_content(1 << 18), _validator(resp.headers), resp


def check_content_range(url: str, field: str, got: Optional[str], start: int, end: int) -> None:
    """Refuse (RangeIgnored) a ``Content-Range`` (http) or ``ContentRange`` (s3) other than bytes ``start..end-1``.

    Example:
        >>> check_content_range("http://h/a", "Content-Range", "bytes 0-9/100", 0, 10)
    """
    m = _CONTENT_RANGE.match(got or "")
    if not m or int(m.group(1)) != start or int(m.group(2)) != end - 1:
        raise RangeIgnored(f"{url}: asked for bytes {start}-{end - 1}, got {field} {got!r}", url, 206)


TRANSPORT = HTTPTransport()
