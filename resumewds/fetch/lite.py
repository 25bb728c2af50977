"""A standard-library http(s) session for small GETs and ranged reads: no requests import.

Importing requests (and urllib3, charset_normalizer, idna under it) costs
0.1-0.2 s of CPU in a process that has imported torch: mostly a full
garbage collection of torch's objects that the import's allocations set
off.  The first sample of a run over http comes from two small requests,
the manifest and one verified range; :class:`LiteSession` sends them with
``http.client`` (already imported by torch and by the standard library's
own modules), so the first sample does not wait for requests.  Whole-shard
downloads keep requests' Session (:func:`resumewds.fetch.http.new_session`).

It speaks the part of requests' ``Session`` / ``Response`` interface that
:mod:`resumewds.fetch.http` and :func:`resumewds.repair.fetch_range` use
(``get(url, headers=, stream=, allow_redirects=, timeout=)``,
``status_code``, ``reason``, ``headers``, ``raw``, ``iter_content``, the
context manager), with requests' semantics where they matter:

* **environment**: a url that requests would send through a proxy
  (``http_proxy``, ``https_proxy``, ``all_proxy``, less ``no_proxy``),
  with credentials in it, or for which a ``.netrc`` could hold credentials
  (``NETRC`` or ``~/.netrc`` exists) is handed to a requests Session
  instead (made on first need), as is every url after a redirect to one;
* **TLS**: certificates are checked against ``REQUESTS_CA_BUNDLE`` or
  ``CURL_CA_BUNDLE`` when set, else certifi's bundle (requests' default),
  else the system's; host names are checked;
* **connections**: one idle keep-alive connection per origin and session
  (a session is per thread); a body read to its end hands its connection
  back, anything else closes it; a request on a reused connection that
  the server had closed is sent once more on a new one (as urllib3 does);
* **redirects**: 301, 302, 303, 307 and 308 are followed (GET; headers
  kept, ``Authorization`` dropped on another host) up to ``max_redirects``,
  then a :class:`~resumewds.errors.PermanentFetchError` that names
  ``RESUMEWDS_FETCH_MAX_REDIRECTS``;
* **errors**: the standard library's own (``socket.timeout``,
  ``ConnectionError``, ``http.client.HTTPException``), which the error map
  (:mod:`resumewds.fetch.errormap`) classifies like requests' wrappers of
  them; a connect timeout is a :class:`~resumewds.errors.TransientFetchError`
  that says so; a malformed url a :class:`~resumewds.errors.PermanentFetchError`.

``RESUMEWDS_FETCH_LITE=0`` sends everything through requests.

Example:
    >>> s = LiteSession()
    >>> s.routes("http://127.0.0.1:8000/manifest.json")   # no proxy set here
    True
    >>> s.close()
"""

from __future__ import annotations

import http.client
import os
import socket
import ssl
import urllib.parse
import urllib.request
from typing import Any, Dict, Iterator, List, Optional, Tuple

from .. import config
from ..errors import PermanentFetchError, TransientFetchError
from .http import new_session

__all__ = ["LiteResponse", "LiteSession", "lite_enabled", "new_lite_session"]

_REDIRECTS = (301, 302, 303, 307, 308)
_STALE = (ConnectionResetError, BrokenPipeError, http.client.RemoteDisconnected, http.client.BadStatusLine)

_context: Dict[Optional[str], ssl.SSLContext] = {}


def lite_enabled() -> bool:
    """``RESUMEWDS_FETCH_LITE`` (default on): small GETs and ranged reads without requests.

    Example:
        >>> isinstance(lite_enabled(), bool)
        True
    """
    return config.fetch_lite()


def new_lite_session() -> Any:
    """A :class:`LiteSession`, or requests' Session with ``RESUMEWDS_FETCH_LITE=0``.

    Example:
        >>> s = new_lite_session(); s.close()
    """
    return LiteSession() if lite_enabled() else new_session()


def _cafile() -> Optional[str]:
    """The CA bundle requests would use: its environment variables, else certifi's."""
    for var in ("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE"):
        v = os.environ.get(var)
        if v:
            return v
    try:
        import certifi  # lazy: requests' own CA bundle, only for https
    except ImportError:
        return None
    return str(certifi.where())


def _ssl_context() -> ssl.SSLContext:
    cafile = _cafile()
    ctx = _context.get(cafile)
    if ctx is None:
        ctx = _context[cafile] = ssl.create_default_context(cafile=cafile)
    return ctx


def _netrc_present() -> bool:
    if os.environ.get("NETRC"):
        return True
    home = os.path.expanduser("~")
    return any(os.path.exists(os.path.join(home, n)) for n in (".netrc", "_netrc"))


class _Raw:
    """``resp.raw`` as :class:`resumewds.fetch.http._Body` reads it: ``_fp`` is the
    ``http.client.HTTPResponse``; ``release_conn()`` hands the connection back."""

    def __init__(self, owner: LiteResponse, fp: http.client.HTTPResponse):
        self._owner = owner
        self._fp = fp
        self.enforce_content_length = True  # (read by nobody here: http.client checks lengths itself)

    def read(self, n: int = -1, decode_content: bool = False) -> bytes:
        return self._fp.read(n if n is not None and n >= 0 else None)

    def release_conn(self) -> None:
        self._owner._release()


class LiteResponse:
    """One response of :class:`LiteSession` (requests' ``Response`` names)."""

    def __init__(self, session: LiteSession, key: Tuple[str, str, int], conn: http.client.HTTPConnection,
                 resp: http.client.HTTPResponse, url: str):
        self._session = session
        self._key = key
        self._conn: Optional[http.client.HTTPConnection] = conn
        self._resp = resp
        self.url = url
        self.status_code = resp.status
        self.reason = resp.reason
        self.headers = resp.msg  # case-insensitive .get, like requests' CaseInsensitiveDict
        self.raw = _Raw(self, resp)

    def iter_content(self, chunk_size: int = 1 << 16) -> Iterator[bytes]:
        """The body in pieces of up to ``chunk_size`` bytes, as they arrive."""
        while True:
            data = self._resp.read1(chunk_size)
            if not data:
                return
            yield data

    @property
    def content(self) -> bytes:
        data = self._resp.read()
        self._release()
        return data

    def _release(self) -> None:
        """Back to the session's idle connection if the body was read to its end, else closed."""
        conn, self._conn = self._conn, None
        if conn is None:
            return
        resp = self._resp
        done = resp.isclosed() or resp.length == 0  # read to its end (http.client closes it one read later)
        resp.close()
        if done and not resp.will_close:
            self._session._idle(self._key, conn)
        else:
            conn.close()

    def close(self) -> None:
        self._release()

    def __enter__(self) -> LiteResponse:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


class LiteSession:
    """A per-thread http(s) session on ``http.client`` (see the module's docstring).

    Example:
        >>> with LiteSession() as s:                                   # doctest: +SKIP
        ...     with s.get(url, headers={"Range": "bytes=0-511"}, timeout=(10, 60)) as r:
        ...         r.status_code, b"".join(r.iter_content(1 << 16))[:5]
        (206, b'./a.t')
    """

    def __init__(self) -> None:
        self.headers: Dict[str, str] = {"User-Agent": "resumewds", "Accept-Encoding": "identity"}
        self.max_redirects = 30
        self.trust_env = True
        self._pool: Dict[Tuple[str, str, int], http.client.HTTPConnection] = {}
        self._fallback: Any = None
        self._routes: Dict[Tuple[str, str], bool] = {}

    def __enter__(self) -> LiteSession:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def routes(self, url: str) -> bool:
        """Whether ``url`` goes through this session (else through requests: a proxy, credentials)."""
        p = urllib.parse.urlsplit(url)
        scheme = p.scheme.lower()
        if scheme not in ("http", "https") or p.username is not None or p.password is not None:
            return False
        key = (scheme, p.netloc)
        hit = self._routes.get(key)
        if hit is None:
            hit = not (self.trust_env and (_netrc_present() or self._proxied(scheme, p.hostname or "")))
            self._routes[key] = hit
        return hit

    @staticmethod
    def _proxied(scheme: str, host: str) -> bool:
        proxies = urllib.request.getproxies()
        if not (proxies.get(scheme) or proxies.get("all")):
            return False
        return not urllib.request.proxy_bypass(host)

    def _requests_session(self) -> Any:
        if self._fallback is None:
            self._fallback = new_session()
        self._fallback.max_redirects = self.max_redirects
        return self._fallback

    def get(self, url: str, headers: Optional[Dict[str, str]] = None, stream: bool = True,
            allow_redirects: bool = True, timeout: Any = None) -> Any:
        """GET ``url``: a :class:`LiteResponse` (or requests' Response for a url it does not route).

        ``timeout`` is ``(connect, read)`` seconds or one number for both;
        the body is streamed whatever ``stream`` says (read it, or close the response).
        """
        hdrs = dict(self.headers)
        hdrs.update(headers or {})
        connect_t, read_t = timeout if isinstance(timeout, tuple) else (timeout, timeout)
        seen, asked = 0, url
        while True:
            if not self.routes(url):
                return self._requests_session().get(url, headers=hdrs, stream=True,
                                                    allow_redirects=allow_redirects, timeout=timeout)
            resp = self._send(url, hdrs, connect_t, read_t)
            if not (allow_redirects and resp.status_code in _REDIRECTS and resp.headers.get("Location")):
                return resp
            seen += 1
            if seen > self.max_redirects:
                resp.close()
                raise PermanentFetchError(
                    f"{asked}: too many redirects (a redirect loop?; more than RESUMEWDS_FETCH_MAX_REDIRECTS "
                    f"are not followed): exceeded {self.max_redirects} redirects (the last to {url})", asked,
                    resp.status_code)
            nxt = urllib.parse.urljoin(url, resp.headers["Location"])
            resp._resp.read()  # a small redirect body: read it so that the connection is kept
            resp.close()
            if urllib.parse.urlsplit(nxt).netloc != urllib.parse.urlsplit(url).netloc:
                hdrs = {k: v for k, v in hdrs.items() if k.lower() != "authorization"}
            url = nxt

    def _send(self, url: str, hdrs: Dict[str, str], connect_t: Optional[float],
              read_t: Optional[float]) -> LiteResponse:
        p = urllib.parse.urlsplit(url)
        scheme = p.scheme.lower()
        try:
            port = p.port or (443 if scheme == "https" else 80)
        except ValueError as exc:
            raise PermanentFetchError(f"{url}: invalid URL: {exc}", url) from None
        host = p.hostname
        if not host:
            raise PermanentFetchError(f"{url}: invalid URL: no host", url)
        target = urllib.parse.urlunsplit(("", "", p.path or "/", p.query, ""))
        key = (scheme, host, port)
        for fresh in (False, True):
            conn = None if fresh else self._pool.pop(key, None)
            reused = conn is not None
            if conn is None:
                conn = self._connect(url, scheme, host, port, connect_t)
            if conn.sock is not None:
                conn.sock.settimeout(read_t)
            try:
                conn.request("GET", target, headers=hdrs)
                resp = conn.getresponse()
            except _STALE:
                conn.close()
                if reused:
                    continue  # the server closed an idle connection: once more on a new one
                raise
            except BaseException:
                conn.close()
                raise
            return LiteResponse(self, key, conn, resp, url)
        raise AssertionError("unreachable")  # pragma: no cover

    @staticmethod
    def _connect(url: str, scheme: str, host: str, port: int,
                 connect_t: Optional[float]) -> http.client.HTTPConnection:
        conn: http.client.HTTPConnection
        if scheme == "https":
            conn = http.client.HTTPSConnection(host, port, timeout=connect_t, context=_ssl_context())
        else:
            conn = http.client.HTTPConnection(host, port, timeout=connect_t)
        try:
            conn.connect()
        except socket.timeout as exc:
            conn.close()
            raise TransientFetchError(f"{url}: connect timeout: {exc}", url) from exc
        except BaseException:
            conn.close()
            raise
        return conn

    def _idle(self, key: Tuple[str, str, int], conn: http.client.HTTPConnection) -> None:
        old = self._pool.pop(key, None)
        if old is not None:
            old.close()
        self._pool[key] = conn

    def close(self) -> None:
        """Close the idle connections (and the requests Session, if one was made)."""
        conns: List[http.client.HTTPConnection] = list(self._pool.values())
        self._pool.clear()
        for c in conns:
            c.close()
        if self._fallback is not None:
            self._fallback.close()
            self._fallback = None
