"""A fault-injecting HTTP proxy in front of an S3 endpoint (moto, MinIO), on 127.0.0.1.

Clients use the proxy's url as their S3 endpoint (``AWS_ENDPOINT_URL``);
every request is forwarded to ``upstream`` and the answer sent back, except
that an object GET may be hit by a fault chosen like
:class:`chaos.faultserver.FaultServer` chooses them: a seeded RNG keyed on
``(seed, path, n)`` (``n`` counts the GETs of that path), scripted faults
first, ``max_faults_per_path`` to keep a bounded retry budget sufficient.

Fault kinds (GET only; path-style urls ``/bucket/key``):

    slowdown   503 with S3's ``SlowDown`` error body (throttling)
    500        500 ``InternalError``
    503        503 ``ServiceUnavailable``
    reset      the real status and headers, part of the body, then an RST
    stall      the real status and headers, part of the body, then silence
               for ``stall_seconds`` (longer than the client's read timeout)
    truncate   the real Content-Length, part of the body, then a clean close
    truncate_nolen  no Content-Length, the body cut at a sample's start inside
               it (else a member's header), then a clean close
    flip       one byte of the body flipped (anywhere)
    flip_data / flip_header  one byte flipped in member data / in a tar header
    403        403 ``AccessDenied`` (permanent)
    trickle    the real answer, its body at ``trickle_bytes_per_second``
               (every read arrives in time: only a minimum transfer rate
               catches it); not part of ``mixed``
    range416   a ranged GetObject answered 416 ``InvalidRange`` (a GetObject
               without Range is served as usual); not part of ``mixed``

``reset@0.5`` / ``stall@0.9`` cut the body at that fraction.  Profiles:
``"slowdown=0.1,reset=0.05"``, ``"mixed:0.2"`` (one of slowdown, 500, 503,
reset, stall), or a dict; ``profile="mixed30"`` (or ``--profile``) a named
profile of :data:`chaos.loopback.PROFILES`, as for the file server.  The tar
layout of a body (where a flip or a cut lands) is read from the bytes
themselves (:func:`chaos.faultserver.tar_layout`), at the offset its
``Content-Range`` gives.

Run it::

    python -m chaos.s3proxy http://127.0.0.1:5000 --port 9000 --faults mixed:0.2
    python -m chaos.s3proxy http://127.0.0.1:5000 --profile cut50

Example:
    >>> p = S3FaultProxy("http://127.0.0.1:1")
    >>> p.script("/bkt/a.tar", ["slowdown", None])
    >>> parse_s3_faults("mixed:0.1,stall=0.05")
    (0.1, {'stall': 0.05})
"""

from __future__ import annotations

import argparse
import http.client
import http.server
import random
import signal
import socket
import struct
import sys
import threading
import time
import urllib.parse
from typing import Dict, List, Optional, Sequence, Tuple, Union

from .faultserver import tar_layout
from .loopback import PROFILES, LoopbackFaultServer, QuietServer

TRANSPORT_FAULTS = ("slowdown", "500", "503", "reset", "stall")
BODY_FAULTS = ("truncate", "truncate_nolen", "flip", "flip_data", "flip_header")
ALL_FAULTS = TRANSPORT_FAULTS + ("403", "trickle", "range416") + BODY_FAULTS
_ERRORS = {
    "slowdown": (503, "SlowDown", "Please reduce your request rate."),
    "500": (500, "InternalError", "We encountered an internal error. Please try again."),
    "503": (503, "ServiceUnavailable", "Service is unable to handle request."),
    "403": (403, "AccessDenied", "Access Denied"),
    "range416": (416, "InvalidRange", "The requested range is not satisfiable"),  # Range requests only
}
_HOP = {"connection", "keep-alive", "proxy-connection", "transfer-encoding", "te", "trailer", "upgrade",
        "proxy-authenticate", "proxy-authorization"}


def parse_s3_faults(faults: Union[str, Dict[str, float], None]) -> Tuple[float, Dict[str, float]]:
    """Parse a profile into ``(mixed_rate, {kind: rate})``.

    Raises:
        ValueError: an unknown kind or a rate outside [0, 1].
    """
    mixed = 0.0
    rates: Dict[str, float] = {}
    if not faults:
        return mixed, rates
    items: List[Tuple[str, float]] = []
    if isinstance(faults, dict):
        items = [(k, float(v)) for k, v in faults.items()]
    else:
        for part in str(faults).split(","):
            part = part.strip()
            if not part:
                continue
            if part.startswith("mixed:"):
                items.append(("mixed", float(part[6:])))
            elif "=" in part:
                name, rate = part.split("=", 1)
                items.append((name.strip(), float(rate)))
            else:
                raise ValueError(f"bad fault spec {part!r}: use kind=rate or mixed:rate")
    for k, v in items:
        if not 0.0 <= v <= 1.0:
            raise ValueError(f"fault rate for {k!r} must be in [0, 1], got {v}")
        if k == "mixed":
            mixed = v
        elif k in ALL_FAULTS:
            rates[k] = v
        else:
            raise ValueError(f"unknown fault kind {k!r}; known: mixed, {', '.join(ALL_FAULTS)}")
    return mixed, rates


class S3FaultProxy(LoopbackFaultServer):
    """Forward to ``upstream`` (``http://host:port``), injecting faults into GETs.

    Args:
        upstream: the real S3 endpoint (http only; loopback in tests).
        host: address to bind (127.0.0.1).
        port: 0 picks a free port.
        faults: a profile (see the module docstring).
        seed: RNG seed.
        max_faults_per_path: stop injecting into a path after this many faults.
        stall_seconds: how long ``stall`` keeps silent.
        bytes_per_second: throttle every object body (None: as fast as possible).
        retry_after: a Retry-After header on ``slowdown`` and ``503`` answers
            (None: none, as S3 itself sends).
        trickle_bytes_per_second: the body rate of a ``trickle`` fault.
        profile: a named profile (:data:`chaos.loopback.PROFILES`): its faults
            replace ``faults``, and its stall and Retry-After the proxy's.

    Counters: ``requests`` (GETs per path), ``faults`` (per kind),
    ``connections`` (TCP connections accepted),
    ``bytes_sent`` / ``bytes_by_path`` (object bytes of 2xx answers sent to clients),
    ``request_log`` ((method, path, Range, If-Match) in arrival order).
    """

    thread_name = "s3proxy"
    handler_attr = "px"
    all_faults = ALL_FAULTS
    transport_faults = TRANSPORT_FAULTS

    def __init__(self, upstream: str, host: str = "127.0.0.1", port: int = 0,
                 faults: Union[str, Dict[str, float], None] = "", seed: int = 0,
                 max_faults_per_path: Optional[int] = None, stall_seconds: float = 5.0,
                 bytes_per_second: Optional[float] = None, retry_after: Optional[float] = None,
                 trickle_bytes_per_second: float = 200.0, profile: Optional[str] = None):
        u = urllib.parse.urlsplit(upstream)
        if u.scheme != "http" or not u.hostname:
            raise ValueError(f"upstream must be http://host:port, got {upstream!r}")
        self.upstream_host = u.hostname
        self.upstream_port = u.port or 80
        self.stall_seconds = stall_seconds
        self.bytes_per_second = bytes_per_second
        self.retry_after = retry_after
        self.trickle_bytes_per_second = trickle_bytes_per_second
        self._setup(host, port, seed, max_faults_per_path, *parse_s3_faults(faults))
        if profile is not None:
            self.use_profile(profile)

    # ---- configuration -------------------------------------------------------
    def set_faults(self, faults: Union[str, Dict[str, float], None]) -> None:
        """Replace the fault profile."""
        mixed, rates = parse_s3_faults(faults)
        with self._lock:
            self.mixed, self.rates = mixed, rates


_QuietServer = QuietServer  # the old name


class _Handler(http.server.BaseHTTPRequestHandler):
    px: S3FaultProxy
    protocol_version = "HTTP/1.1"

    def log_message(self, format: str, *args) -> None:  # quiet
        pass

    def setup(self) -> None:
        super().setup()
        with self.px._lock:
            self.px.connections += 1

    def finish(self) -> None:
        try:
            super().finish()
        except OSError:
            pass

    def do_GET(self) -> None:
        self._proxy("GET")

    def do_HEAD(self) -> None:
        self._proxy("HEAD")

    def do_PUT(self) -> None:
        self._proxy("PUT")

    def do_POST(self) -> None:
        self._proxy("POST")

    def do_DELETE(self) -> None:
        self._proxy("DELETE")

    # ---- helpers -----------------------------------------------------------------
    def _read_request_body(self) -> bytes:
        if "chunked" in (self.headers.get("Transfer-Encoding") or "").lower():
            out = bytearray()
            while True:
                line = self.rfile.readline()
                n = int(line.split(b";", 1)[0].strip() or b"0", 16)
                if n == 0:
                    while self.rfile.readline() not in (b"\r\n", b"\n", b""):
                        pass
                    return bytes(out)
                out += self.rfile.read(n)
                self.rfile.readline()
        n = int(self.headers.get("Content-Length") or 0)
        return self.rfile.read(n) if n else b""

    def _abort(self) -> None:
        """Close the connection with an RST."""
        try:
            self.wfile.flush()
        except OSError:
            pass
        try:
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
            self.connection.close()
        except OSError:
            pass
        self.close_connection = True

    def _s3_error(self, kind: str, key: str) -> None:
        status, code, msg = _ERRORS[kind]
        body = (f'<?xml version="1.0" encoding="UTF-8"?>\n<Error><Code>{code}</Code><Message>{msg}</Message>'
                f"<Resource>{key}</Resource><RequestId>s3proxy</RequestId></Error>").encode()
        self.send_response(status)
        if status == 503 and self.px.retry_after is not None:
            self.send_header("Retry-After", f"{self.px.retry_after:g}")
        self.send_header("Content-Type", "application/xml")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _proxy(self, method: str) -> None:
        px = self.px
        path = urllib.parse.urlsplit(self.path).path
        with px._lock:
            px.request_log.append((method, path, self.headers.get("Range"), self.headers.get("If-Match")))
        body = self._read_request_body() if method in ("PUT", "POST") else b""
        is_object = method == "GET" and path.count("/") >= 2 and not path.endswith("/")
        kind: Optional[str] = None
        frac: Optional[float] = None
        rng = random.Random(0)
        if is_object:
            kind, rng = px._decide(path, self.headers.get("Range") or "")
            if kind is not None and "@" in kind:
                kind, f = kind.split("@", 1)
                frac = float(f)
        if kind == "range416" and not self.headers.get("Range"):
            kind = None  # a whole GetObject is served as usual
        if kind in _ERRORS:
            self._s3_error(kind, path)
            return
        headers = {k: v for k, v in self.headers.items() if k.lower() not in _HOP}
        if body or method in ("PUT", "POST"):
            headers["Content-Length"] = str(len(body))
        conn = http.client.HTTPConnection(px.upstream_host, px.upstream_port, timeout=60)
        try:
            conn.request(method, self.path, body=body or None, headers=headers)
            resp = conn.getresponse()
            data = resp.read() if method != "HEAD" else b""
            status, reason = resp.status, resp.reason
            out_headers = [(k, v) for k, v in resp.getheaders() if k.lower() not in _HOP]
        except OSError:
            self._abort()  # upstream gone: the client sees a reset
            return
        finally:
            conn.close()
        cut = len(data)
        if status >= 300 or not data:
            kind = kind if kind in ("reset", "stall", "trickle") else None  # body faults hit object bytes only
        if kind in ("reset", "stall", "truncate", "truncate_nolen") and data:
            at = frac if frac is not None else rng.uniform(0.1, 0.9)
            cut = max(0, min(len(data) - 1, int(len(data) * at)))
            if kind == "truncate_nolen" and frac is None:
                base = _range_start(out_headers)
                bounds = tar_layout(data, base).cuts(base, base + len(data))
                if bounds:
                    cut = rng.choice(bounds) - base
        if kind in ("flip", "flip_data", "flip_header") and data:
            data = _flipped(data, _range_start(out_headers), kind, rng)
        self.send_response(status, reason)
        for k, v in out_headers:
            if k.lower() != "content-length":
                self.send_header(k, v)
        if method == "HEAD":
            cl = next((v for k, v in out_headers if k.lower() == "content-length"), "0")
            self.send_header("Content-Length", cl)
        elif kind == "truncate_nolen":
            self.send_header("Connection", "close")
            self.close_connection = True
        else:
            self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if method == "HEAD":
            return
        pos = 0
        step = 64 * 1024
        bps = px.bytes_per_second if is_object else None
        if kind == "trickle":
            bps = px.trickle_bytes_per_second
        if bps:
            step = max(1, min(step, int(bps / 20)))
        t0 = time.monotonic()
        while pos < cut:
            if px._stopping.is_set():
                self._abort()
                return
            chunk = data[pos:min(cut, pos + step)]
            if is_object and status < 300:  # object bytes, not error documents
                px._count(path, len(chunk))
            try:
                self.wfile.write(chunk)
            except OSError:
                self.close_connection = True
                return
            pos += len(chunk)
            if bps:
                ahead = pos / bps - (time.monotonic() - t0)
                if ahead > 0:
                    px._stopping.wait(ahead)
        if cut < len(data):
            if kind in ("truncate", "truncate_nolen"):  # a clean close: the client sees an early end
                try:
                    self.wfile.flush()
                    self.connection.shutdown(socket.SHUT_WR)
                except OSError:
                    pass
                self.close_connection = True
                return
            if kind == "stall":
                try:
                    self.wfile.flush()
                except OSError:
                    pass
                px._stopping.wait(px.stall_seconds)
            self._abort()


def _range_start(headers: Sequence[Tuple[str, str]]) -> int:
    """Where in the object a body starts (its ``Content-Range``; 0 without one)."""
    for k, v in headers:
        if k.lower() == "content-range":
            try:
                return int(v.split()[1].split("-", 1)[0])
            except (IndexError, ValueError):
                return 0
    return 0


def _flipped(data: bytes, base: int, kind: str, rng: random.Random) -> bytes:
    """``data`` (object bytes from offset ``base``) with one byte flipped: anywhere
    (``flip``), in member data or in a tar header (else anywhere)."""
    at = rng.randrange(len(data))
    if kind != "flip":
        lay = tar_layout(data, base)
        regions = lay.data if kind == "flip_data" else lay.headers
        regions = [(max(a, base), min(b, base + len(data))) for a, b in regions
                   if a < base + len(data) and b > base]
        if regions:
            a, b = rng.choice(regions)
            at = rng.randrange(a, b) - base
    out = bytearray(data)
    out[at] ^= 0xFF
    return bytes(out)


S3FaultProxy.handler_class = _Handler


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(prog="python -m chaos.s3proxy", description=__doc__.split("\n\n")[0])
    ap.add_argument("upstream", help="the real S3 endpoint, http://host:port")
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--faults", default="")
    ap.add_argument("--profile", default=None, choices=sorted(PROFILES),
                    help="a named fault profile (replaces --faults and --stall-seconds)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--max-faults-per-path", type=int, default=None)
    ap.add_argument("--stall-seconds", type=float, default=5.0)
    ap.add_argument("--bytes-per-second", type=float, default=None)
    args = ap.parse_args(argv)
    px = S3FaultProxy(args.upstream, port=args.port, faults=args.faults, seed=args.seed,
                      max_faults_per_path=args.max_faults_per_path, stall_seconds=args.stall_seconds,
                      bytes_per_second=args.bytes_per_second, profile=args.profile).start()
    print(px.url, flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *a: stop.set())
    try:
        while not stop.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass
    px.stop()
    return 0


if __name__ == "__main__":
    sys.exit(main())
