"""``http://`` and ``https://``: a requests GET per attempt, resumed with Range/If-Range.

requests (and urllib3 under it) is imported at the first http(s) attempt,
not with this module: local, ``file://`` and ``pipe:`` reads never load it
(about 0.1 s in each DataLoader worker).

Range resume::

    partial has N > 0 bytes and a validator in <partial>.etag
        -> GET  Range: bytes=N-   If-Range: <ETag or Last-Modified>
           206 (Content-Range starts at N, same validator)  append
           206 with another validator (server ignored If-Range)  start over
           200 (file changed, or server ignores Range)  restart from zero
           200 with the Content-Range of a part, or shorter than the known
               size (a broken server)  transient; the next attempts are
               whole GETs without Range, from byte 0
           416 (bytes */N)  the partial is already complete
    otherwise
        -> GET (no Range), truncate, save the response's validator

Refused (permanent): an HTML page where a shard of unknown size was
expected, more than ``max_redirects`` redirects, a body larger than
``max_bytes``.  Transient (retried within the budget, and the error once it
is spent): a Content-Encoding other than identity (its bytes are not the
file's), an HTML page where a shard of known size was expected, a body
shorter than its Content-Length / Content-Range.  Statuses are mapped by
:func:`~resumewds.fetch.errormap._status_error`, whatever the body (an HTML
page with a 5xx is a 5xx: transient).

Example:
    >>> TRANSPORT.name, TRANSPORT.resumable
    ('http', True)
"""

from __future__ import annotations

import http.client
import re
import urllib.parse
from typing import TYPE_CHECKING, Any, Dict, Optional

from ..errors import PermanentFetchError, TransientFetchError
from .attempt import _Attempt, _HtmlBody, _Pace
from .errormap import _status_error
from .partial import _ETAG_SUFFIX, _read_validator, _remove_quietly, _Sink, _size_of, _write_validator
from .transport import Transport

if TYPE_CHECKING:  # requests (and urllib3 under it) is imported at the first http(s) fetch: ~0.1 s
    import requests  # that local shards, file:// and pipe: never pay, in each DataLoader worker

_CONTENT_RANGE = re.compile(r"^\s*bytes\s+(\d+)-(\d+)/(\d+|\*)\s*$")
_CONTENT_RANGE_UNSAT = re.compile(r"^\s*bytes\s+\*/(\d+)\s*$")


def _requests() -> Any:
    """The requests module, imported at the first http(s) fetch (not at import:
    local, file:// and pipe: reads, e.g. in every DataLoader worker, never load it)."""
    import requests

    return requests


_SESSION_CLASS: Optional[type] = None


def _session_class() -> type:
    """``_Session`` (below), defined at the first http(s) fetch, when requests is imported."""
    global _SESSION_CLASS
    if _SESSION_CLASS is None:
        base: Any = _requests().Session

        class _Session(base):
            """A Session that reads the environment (proxies, CA bundle) once per
            origin instead of on every request (requests scans ``os.environ`` twice
            per request: about 0.4 ms, several % of a shard's download)."""

            def __init__(self) -> None:
                super().__init__()
                self._env_cache: Dict[Any, Dict[str, Any]] = {}

            def merge_environment_settings(self, url, proxies, stream, verify, cert):
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
        """After a complete sized body: mark http.client's response done (as
        its own reads would have) and return the connection to the pool."""
        if self.kind != "sized" or self.left != 0:
            return
        self.fp.length = 0
        self.fp.close()
        self.raw.release_conn()


def _refuse_partial_200(state: _Attempt, resp: Any, have: int, length: Optional[int]) -> None:
    """A 200 is the whole file: refuse one that says (``Content-Range`` of a
    part) or shows (shorter than the known size, in answer to a Range
    request) that it is not, and make the next attempts whole GETs without
    Range, from byte 0 (a broken server must never get a tail published as
    the whole shard)."""
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


class HTTPTransport(Transport):
    """http(s): one GET per attempt, through ``state.session`` (created on first use)."""

    name = "http"
    resumable = True

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
        resp = state.session.get(state.url, headers=headers, stream=True,
                                 timeout=(pace.timeout(cfg.connect_timeout), pace.timeout(cfg.read_timeout)),
                                 allow_redirects=True)
        etag: Optional[str] = None
        with resp:
            code = resp.status_code
            if code == 416 and have:
                m = _CONTENT_RANGE_UNSAT.match(resp.headers.get("Content-Range", ""))
                if m and int(m.group(1)) == have:
                    return  # the partial is already complete
                _remove_quietly(state.path + _ETAG_SUFFIX)
                raise TransientFetchError(f"{state.url}: HTTP 416 for a resume at byte {have}; restarting",
                                          state.url, 416)
            if code == 206 and have:
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
                start, end_incl = int(m.group(1)), int(m.group(2))
                want_total: Optional[int] = end_incl + 1
                append = True
            elif code == 200:
                start, append = 0, False
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
            else:
                raise _status_error(state.url, resp)
            enc = (resp.headers.get("Content-Encoding") or "").strip().lower()
            if enc not in ("", "identity"):
                # transient: one such answer (a cache or proxy's glitch) is retried; a server that
                # always does it ends the read with this message when the budget is spent
                raise TransientFetchError(
                    f"{state.url}: the server sent a {enc}-encoded body (Content-Encoding: {enc}) although "
                    f"resumewds asks for identity; its bytes are not the file's. Serve the file as it is "
                    f"(no compression on the fly)", state.url, code)
            try:
                with _Sink(state, append=append) as sink:
                    if not append:
                        # emptied before the validator is recorded, so the pair always agrees
                        _write_validator(state.path, etag or resp.headers.get("Last-Modified"))
                    raw = resp.raw
                    # we check lengths ourselves; urllib3's check would drop the bytes of a short last read
                    raw.enforce_content_length = False
                    body = _Body(raw)
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
                raise cls(f"{state.url}: HTTP {code} but the body is an HTML page, not a shard "
                          f"(Content-Type: {ctype}; it begins {snippet!r})", state.url, code) from None
        size = _size_of(state.path)
        if want_total is not None and size < want_total:
            raise TransientFetchError(f"{state.url}: short body: got {size - start} of {want_total - start} bytes",
                                      state.url, code)
        state._check_expected(size)


TRANSPORT = HTTPTransport()
