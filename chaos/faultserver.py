"""A static-file HTTP server that injects faults, for tests and chaos runs.

It serves the files under a root directory with Range support (206,
Content-Range, ETag, Last-Modified, If-Range) and, per request, may inject a
fault chosen by a seeded RNG.  The RNG of a request is keyed on
``(seed, path, n)`` where ``n`` counts the requests for that path, so thread
interleaving between different paths does not change which requests are hit.

Fault kinds:

    reset           send part of the body, then close with SO_LINGER 0 (RST)
    500, 503, 429   error status (503 and 429 carry Retry-After)
    truncate        Content-Length says N, send fewer bytes, close
    truncate_nolen  no Content-Length, close early: at a sample's start inside
                    the range (the manifest's offsets when one was given, else
                    the tar's own), else at a member's header, else anywhere
    flip            flip one byte anywhere in the body
    flip_data       flip one byte inside a tar member's data
    flip_header     flip one byte inside a tar header block
    stall           send part of the body, then sleep ``stall_seconds``
    down            close every connection for ``down_seconds`` from now
    401, 403, 404, 410  a permanent error status

Fetch-hardening kinds (only used when named):

    retry_after_huge  429 with ``Retry-After: 86400``
    retry_after_date  503 with Retry-After as an HTTP date a day ahead
    trickle         send the body one byte every ``trickle_seconds``
    gzip            200 with the file gzip-compressed, ``Content-Encoding: gzip``
    html200         200 with an HTML error page (``Content-Type: text/html``)
    redirect_loop   302 to the same URL, for ever
    ignore_range    a Range request answered 200 with the whole file, no
                    ``Accept-Ranges`` (a server or proxy without range support)
    html502         502 with an HTML error page (a proxy's "Bad Gateway")
    range416        a Range request answered 416 (``Content-Range: bytes */size``)
    range200_tail   a Range request answered 200 carrying ``Content-Range`` and
                    only the requested bytes (a broken server: a 200 is whole)
    range200_partial  a Range request answered 200 with only the requested
                    bytes, no ``Content-Range``
    (the three range* kinds serve a request without Range as usual)

``honour_if_range=False`` makes the server ignore If-Range (it serves the
requested range of the file as it is now, with the current ETag), like the
servers that spliced two versions of a changed file; ``ignore_range=True``
makes every Range request an ``ignore_range`` fault (counted in ``faults``);
``range_fault="range416"`` (or any other kind, e.g. ``"flip_data"``) gives
every Range request, and no other, that fault (counted in ``faults``); with
``range_variant=".v2"`` every Range request is served from ``<file>.v2``, as
if the file had been replaced between two requests.

Profiles: ``"reset=0.1,500=0.05,stall=0.02"`` gives per-request rates;
``"mixed:0.1"`` hits 10% of requests with one of the transport faults
(reset, 500, 503, 429, truncate, truncate_nolen, stall); both forms combine:
``"mixed:0.1,flip_data=0.01"``.  Integrity faults (flip_*) and ``down`` are
only used when named.  A dict ``{"reset": 0.1}`` works too.  Tests can also
script the next faults of one path exactly with :meth:`FaultServer.script`.
``profile="mixed30"`` (or ``--profile``) injects a named profile of
:data:`chaos.loopback.PROFILES` instead (what a user on a bad network sees).

Run it::

    python -m chaos.faultserver ROOT --port 8000 --faults "mixed:0.1" --seed 1
    python -m chaos.faultserver ROOT --profile mixed30 --seed 2

Example:
    >>> import tempfile
    >>> with FaultServer(tempfile.mkdtemp()) as srv:
    ...     srv.url.startswith("http://127.0.0.1:")
    True
"""

from __future__ import annotations

import argparse
import email.utils
import http.server
import json
import os
import posixpath
import signal
import socket
import struct
import sys
import threading
import time
import urllib.parse
from typing import Dict, List, Optional, Sequence, Tuple, Union

from .loopback import PROFILES, LoopbackFaultServer, QuietServer

TRANSPORT_FAULTS = ("reset", "500", "503", "429", "truncate", "truncate_nolen", "stall")
STATUS_FAULTS = ("401", "403", "404", "410")
HARDENING_FAULTS = ("retry_after_huge", "retry_after_date", "trickle", "gzip", "html200", "redirect_loop",
                    "ignore_range", "html502", "range416", "range200_tail", "range200_partial")
RANGE_FAULTS = ("range416", "range200_tail", "range200_partial")
ALL_FAULTS = TRANSPORT_FAULTS + ("flip", "flip_data", "flip_header", "down") + STATUS_FAULTS + HARDENING_FAULTS


def parse_faults(faults: Union[str, Dict[str, float], None]) -> Tuple[float, Dict[str, float]]:
    """Parse a fault profile into ``(mixed_rate, {kind: rate})``.

    Example:
        >>> parse_faults("mixed:0.1,reset=0.05")
        (0.1, {'reset': 0.05})
    """
    mixed = 0.0
    rates: Dict[str, float] = {}
    if not faults:
        return mixed, rates
    items = faults.items() if isinstance(faults, dict) else None
    if items is None:
        pairs: List[Tuple[str, float]] = []
        for part in str(faults).split(","):
            part = part.strip()
            if not part:
                continue
            if part.startswith("mixed:"):
                pairs.append(("mixed", float(part[6:])))
            elif "=" in part:
                k, v = part.split("=", 1)
                pairs.append((k.strip(), float(v)))
            else:
                raise ValueError(f"bad fault spec {part!r}: use kind=rate or mixed:rate")
        items = pairs
    for k, v in items:
        v = float(v)
        if not 0.0 <= v <= 1.0:
            raise ValueError(f"fault rate for {k!r} must be in [0, 1], got {v}")
        if k == "mixed":
            mixed = v
        elif k in ALL_FAULTS:
            rates[k] = v
        else:
            raise ValueError(f"unknown fault kind {k!r}; known: mixed, {', '.join(ALL_FAULTS)}")
    return mixed, rates


class _Layout:
    """Byte regions of a tar file: header blocks, member data, sample starts.

    ``boundaries`` are where samples start (a manifest's offsets when the
    server was given one, else ``samples``, read from the tar itself).
    """

    def __init__(self, headers: List[Tuple[int, int]], data: List[Tuple[int, int]], samples: List[int]):
        self.headers = headers
        self.data = data
        self.samples = samples
        self.boundaries = samples

    def cuts(self, start: int, end: int) -> List[int]:
        """Where a body of ``[start, end)`` can be cut at a sample's start, else
        at a member's header (empty: neither lies strictly inside)."""
        inside = [b for b in self.boundaries if start < b < end]
        return inside or [h for h, _ in self.headers if start < h < end]


_EXTENDED = b"xgLK"  # pax and GNU long-name headers: part of the member that follows


def tar_layout(data: bytes, base: int = 0) -> _Layout:
    """The tar headers, member data and sample starts found in ``data``, the
    bytes at offset ``base`` of a tar file (a whole file or a range of one).

    A header is a 512-byte block at a multiple of 512 of the file whose
    checksum is right; a sample starts at the first member (or its extended
    header) of each key, the name up to the first dot of its base name, as
    webdataset groups them.

    Example:
        >>> import io, tarfile
        >>> buf = io.BytesIO()
        >>> with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tf:
        ...     for name in ("a.txt", "a.cls", "b.txt"):
        ...         tf.addfile(tarfile.TarInfo(name), io.BytesIO(b""))
        >>> tar_layout(buf.getvalue()).samples
        [0, 1024]
    """
    headers: List[Tuple[int, int]] = []
    regions: List[Tuple[int, int]] = []
    samples: List[int] = []
    key: Optional[bytes] = None
    pending: Optional[int] = None  # an extended header's offset, waiting for its member
    pos = -(-base // 512) * 512
    end = base + len(data)
    while pos + 512 <= end:
        block = data[pos - base:pos - base + 512]
        size = _header_size(block)
        if size is None:
            pos += 512
            continue
        headers.append((pos, pos + 512))
        if size:
            regions.append((pos + 512, pos + 512 + size))
        if block[156:157] in (b"x", b"g", b"L", b"K"):
            pending = pos if pending is None else pending
        else:
            name = block[:100].split(b"\0", 1)[0]
            if block[257:262] == b"ustar" and block[345:500].strip(b"\0"):
                name = block[345:500].split(b"\0", 1)[0] + b"/" + name
            stem, _, base_name = name.rpartition(b"/")
            k = stem + b"/" + base_name.split(b".", 1)[0]
            if k != key:
                samples.append(pending if pending is not None else pos)
                key = k
            pending = None
        pos += 512 + -(-size // 512) * 512
    return _Layout(headers, regions, samples)


def _header_size(block: bytes) -> Optional[int]:
    """The member size of a valid tar header block, else None."""
    if len(block) != 512 or block.count(0) == 512:
        return None
    try:
        want = int(block[148:156].replace(b"\0", b" ").strip() or b"x", 8)
    except ValueError:
        return None
    if want != sum(block[:148]) + 256 + sum(block[156:]):
        return None
    raw = block[124:136]
    if raw[0] & 0x80:  # base-256 (GNU)
        return int.from_bytes(raw[1:], "big")
    try:
        return int(raw.replace(b"\0", b" ").strip() or b"0", 8)
    except ValueError:
        return None


def _tar_layout(path: str) -> _Layout:
    try:
        with open(path, "rb") as f:
            return tar_layout(f.read())
    except OSError:
        return _Layout([], [], [])


class FaultServer(LoopbackFaultServer):
    """Serve ``root_dir`` over HTTP on 127.0.0.1 with injected faults.

    Args:
        root_dir: directory whose files are served.
        host: address to bind (loopback only makes sense).
        port: 0 picks a free port.
        faults: a profile string or dict (see the module docstring).
        seed: RNG seed; same seed + same per-path request order = same faults.
        max_faults_per_path: stop injecting into a path after this many faults,
            so that a bounded retry budget always succeeds.
        stall_seconds: how long ``stall`` sleeps (longer than the client's read
            timeout).
        retry_after: the Retry-After value of 429/503 responses.
        down_seconds: the window a ``down`` fault opens.
        manifest: optional resumewds manifest.json, to cut ``truncate_nolen``
            at sample boundaries.
        bytes_per_second: throttle every body (None = as fast as possible).
        trickle_seconds: the pause between two bytes of a ``trickle`` body.
        honour_if_range: False: ignore If-Range (serve the range anyway).
        range_variant: a suffix: a Range request for ``X`` is served from
            ``X + range_variant`` when that file exists (the file "changed"
            since the first request), with that file's ETag.
        ignore_range: True: answer every Range request with 200 and the
            whole file, without ``Accept-Ranges`` (each counted as an
            ``ignore_range`` fault); the ``ignore_range`` script kind does
            it for one request.
        range_fault: a fault kind (one of :data:`RANGE_FAULTS`, or e.g.
            ``"flip_data"``) given to every Range request, and to no other
            (each counted as that fault).
        profile: a named profile (:data:`chaos.loopback.PROFILES`): its faults
            replace ``faults``, and its stall and Retry-After the server's.

    Counters (read them, or :meth:`reset_counters`): ``bytes_sent``,
    ``bytes_by_path``, ``requests`` (per path), ``faults`` (per kind).
    """

    thread_name = "faultserver"
    url_suffix = "/"
    handler_attr = "fs"
    all_faults = ALL_FAULTS
    transport_faults = TRANSPORT_FAULTS

    def __init__(self, root_dir: str, host: str = "127.0.0.1", port: int = 0,
                 faults: Union[str, Dict[str, float], None] = "", seed: int = 0,
                 max_faults_per_path: Optional[int] = None, stall_seconds: float = 5.0,
                 retry_after: float = 1, down_seconds: float = 1.0, manifest: Optional[str] = None,
                 bytes_per_second: Optional[float] = None, trickle_seconds: float = 0.5,
                 honour_if_range: bool = True, range_variant: Optional[str] = None,
                 ignore_range: bool = False, range_fault: Optional[str] = None,
                 profile: Optional[str] = None):
        self.root_dir = os.path.abspath(root_dir)
        self.stall_seconds = stall_seconds
        self.retry_after = retry_after
        self.down_seconds = down_seconds
        self.bytes_per_second = bytes_per_second
        self.trickle_seconds = trickle_seconds
        self.honour_if_range = honour_if_range
        self.range_variant = range_variant
        self.ignore_range = ignore_range
        if range_fault is not None and range_fault not in ALL_FAULTS:
            raise ValueError(f"unknown fault kind {range_fault!r} for range_fault")
        self.range_fault = range_fault
        self._layouts: Dict[Tuple[str, int, int], _Layout] = {}
        self._boundaries: Dict[str, List[int]] = {}
        if manifest:
            self._load_manifest(manifest)
        self._setup(host, port, seed, max_faults_per_path, *parse_faults(faults))
        if profile is not None:
            self.use_profile(profile)

    # ---- configuration ---------------------------------------------------
    def set_faults(self, faults: Union[str, Dict[str, float], None]) -> None:
        """Replace the fault profile."""
        mixed, rates = parse_faults(faults)
        with self._lock:
            self.mixed, self.rates = mixed, rates

    def set_down(self, seconds: float) -> None:
        """Close every connection for the next ``seconds``."""
        with self._lock:
            self._down_until = time.monotonic() + seconds

    def _load_manifest(self, manifest: str) -> None:
        with open(manifest, "rb") as f:
            data = json.load(f)
        for s in data.get("shards", []):
            offs = s.get("offsets")
            if offs:
                name = posixpath.basename(urllib.parse.urlparse(s["url"]).path or s["url"])
                self._boundaries[name] = [int(x) for x in offs]

    def _log_request(self, path: str) -> None:
        self.request_log.append(path)  # paths in the order requests arrived

    def _layout(self, fs_path: str, st: os.stat_result) -> _Layout:
        key = (fs_path, st.st_size, st.st_mtime_ns)
        with self._lock:
            lay = self._layouts.get(key)
        if lay is None:
            lay = _tar_layout(fs_path)
            lay.boundaries = self._boundaries.get(os.path.basename(fs_path)) or lay.samples
            with self._lock:
                self._layouts[key] = lay
        return lay


_QuietServer = QuietServer  # the old name


def _http_date(ts: float) -> str:
    return email.utils.formatdate(ts, usegmt=True)


class _Handler(http.server.BaseHTTPRequestHandler):
    fs: FaultServer
    protocol_version = "HTTP/1.1"
    server_version = "faultserver/1"
    disable_nagle_algorithm = True  # TCP_NODELAY, as real servers: no 40 ms delayed-ACK stall per small response

    def log_message(self, format: str, *args) -> None:  # quiet
        pass

    def setup(self) -> None:
        super().setup()
        with self.fs._lock:
            self.fs.connections += 1

    def finish(self) -> None:
        try:
            super().finish()
        except OSError:
            pass

    def do_HEAD(self) -> None:
        self._serve(head=True)

    def do_GET(self) -> None:
        fs = self.fs
        with fs._lock:
            fs.inflight += 1
            fs.most_inflight = max(fs.most_inflight, fs.inflight)
        try:
            self._serve(head=False)
        finally:
            with fs._lock:
                fs.inflight -= 1

    # ---- helpers -------------------------------------------------------------
    def _abort(self) -> None:
        """Close the connection with an RST."""
        try:
            self.wfile.flush()
        except OSError:
            pass
        try:
            self.connection.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        except OSError:
            pass
        try:
            self.connection.close()
        except OSError:
            pass
        self.close_connection = True

    def _status_only(self, code: int, retry_after: Union[float, str, None] = None) -> None:
        body = f"{code} injected fault\n".encode()
        self.send_response(code)
        if retry_after is not None:
            self.send_header("Retry-After", retry_after if isinstance(retry_after, str) else f"{retry_after:g}")
        self.send_header("Content-Type", "text/plain")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def _resolve(self) -> Tuple[str, Optional[str]]:
        raw = urllib.parse.urlparse(self.path).path
        path = posixpath.normpath(urllib.parse.unquote(raw))
        if not path.startswith("/"):
            path = "/" + path
        parts = [p for p in path.split("/") if p and p not in (".", "..")]
        fs_path = os.path.join(self.fs.root_dir, *parts)
        if not os.path.isfile(fs_path):
            return path, None
        return path, fs_path

    def _serve(self, head: bool) -> None:
        fs = self.fs
        path, fs_path = self._resolve()
        fs.wait_if_held(path)
        kind, rng = fs._decide(path, self.headers.get("Range") or "")
        frac: Optional[float] = None
        if kind is not None and "@" in kind:
            kind, f = kind.split("@", 1)
            frac = float(f)
        if kind == "down":
            self._abort()
            return
        if kind == "500" or kind in STATUS_FAULTS:
            self._status_only(int(kind))
            return
        if kind in ("503", "429"):
            self._status_only(int(kind), fs.retry_after)
            return
        if kind == "retry_after_huge":
            self._status_only(429, 86400)
            return
        if kind == "retry_after_date":
            self._status_only(503, _http_date(time.time() + 86400))
            return
        if kind == "redirect_loop":
            self.send_response(302)
            self.send_header("Location", self.path)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        if kind == "html200":
            body = (b"<!DOCTYPE html>\n<html><head><title>503 Service Unavailable</title></head>"
                    b"<body><h1>Try again later</h1></body></html>\n")
            self.send_response(200)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if not head:
                self.wfile.write(body)
            return
        if kind == "html502":
            body = (b"<!DOCTYPE html>\n<html><head><title>502 Bad Gateway</title></head>"
                    b"<body><h1>502 Bad Gateway</h1></body></html>\n")
            self.send_response(502)
            self.send_header("Content-Type", "text/html; charset=utf-8")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if not head:
                self.wfile.write(body)
            return
        if fs_path is None:
            self._status_only(404)
            return
        if fs.range_variant and self.headers.get("Range") and os.path.isfile(fs_path + fs.range_variant):
            fs_path += fs.range_variant  # the file "changed" since the first request
        st = os.stat(fs_path)
        size = st.st_size
        etag = f'"{st.st_size:x}-{st.st_mtime_ns:x}"'
        last_mod = _http_date(st.st_mtime)
        start, end = 0, size  # [start, end)
        partial = False
        rng_hdr = self.headers.get("Range")
        with fs._lock:
            fs.range_log.append((path, rng_hdr))
            if rng_hdr:
                fs.ranged[path] += 1
        ignored = bool(rng_hdr) and (kind == "ignore_range" or fs.ignore_range)
        if ignored:
            if kind != "ignore_range":
                with fs._lock:
                    fs.faults["ignore_range"] += 1
            rng_hdr = None  # served as if there were none: 200, the whole file
        if rng_hdr and fs.range_fault and kind != fs.range_fault:
            with fs._lock:
                if kind is not None:  # the drawn fault is not injected: it is not counted either
                    fs.faults[kind] -= 1
                    fs._faults_by_path[path] -= 1
                kind = fs.range_fault
                fs.faults[kind] += 1
        if rng_hdr and kind in RANGE_FAULTS:
            self._range_fault(kind, fs_path, path, rng_hdr, size, etag, head)
            return
        if rng_hdr:
            if_range = self.headers.get("If-Range")
            honour = if_range is None or if_range.strip() in (etag, last_mod) or not fs.honour_if_range
            parsed = _parse_range(rng_hdr, size) if honour else None
            if parsed == "unsatisfiable":
                self.send_response(416)
                self.send_header("Content-Range", f"bytes */{size}")
                self.send_header("Content-Length", "0")
                self.end_headers()
                return
            if parsed is not None:
                start, end = parsed
                partial = True
        length = end - start
        cut = end
        if kind in ("reset", "truncate", "stall", "truncate_nolen") and length > 0:
            f = frac if frac is not None else rng.uniform(0.1, 0.9)
            cut = start + max(0, min(length - 1, int(length * f)))
            if kind == "truncate_nolen" and frac is None:
                bounds = fs._layout(fs_path, st).cuts(start, end)
                if bounds:
                    cut = rng.choice(bounds)
        flip_at: Optional[int] = None
        if kind == "flip" and length > 0:
            flip_at = rng.randrange(start, end)
        if kind in ("flip_data", "flip_header"):
            lay = fs._layout(fs_path, st)
            regions = lay.data if kind == "flip_data" else [(h, h + 512) for h, _ in lay.headers]
            regions = [(a, b) for a, b in regions if a < end and b > start]
            if regions:
                a, b = rng.choice(regions)
                flip_at = rng.randrange(max(a, start), min(b, end))
            elif length > 0:
                flip_at = rng.randrange(start, end)

        if kind == "gzip" and not partial:
            import gzip

            with open(fs_path, "rb") as f:
                body = gzip.compress(f.read(), mtime=0)
            self.send_response(200)
            self.send_header("Content-Type", "application/x-tar")
            self.send_header("Content-Encoding", "gzip")
            self.send_header("ETag", etag)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            if not head:
                self.wfile.write(body)
            return
        self.send_response(206 if partial else 200)
        if not ignored:
            self.send_header("Accept-Ranges", "bytes")
        self.send_header("ETag", etag)
        self.send_header("Last-Modified", last_mod)
        self.send_header("Content-Type", "application/x-tar")
        if partial:
            self.send_header("Content-Range", f"bytes {start}-{end - 1}/{size}")
        if kind == "truncate_nolen":
            self.send_header("Connection", "close")
            self.close_connection = True
        else:
            self.send_header("Content-Length", str(length))
        self.end_headers()
        if head:
            return
        sent = self._send_body(fs_path, path, start, cut, flip_at, trickle=kind == "trickle")
        if sent < cut - start:
            self._abort()  # client went away or server stopping
            return
        if kind == "reset" and cut < end:
            self._abort()
        elif kind == "stall" and cut < end:
            fs._stopping.wait(fs.stall_seconds)
            self._abort()
        elif kind in ("truncate", "truncate_nolen") and cut < end:
            try:
                self.wfile.flush()
                self.connection.shutdown(socket.SHUT_WR)
            except OSError:
                pass
            self.close_connection = True

    def _range_fault(self, kind: str, fs_path: str, path: str, rng_hdr: str, size: int, etag: str,
                     head: bool) -> None:
        """Answer a Range request wrongly (:data:`RANGE_FAULTS`)."""
        parsed = _parse_range(rng_hdr, size)
        if kind == "range416" or not isinstance(parsed, tuple):
            self.send_response(416)
            self.send_header("Content-Range", f"bytes */{size}")
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        start, end = parsed
        self.send_response(200)  # a 200 is the whole file; this one is not
        self.send_header("ETag", etag)
        self.send_header("Content-Type", "application/x-tar")
        if kind == "range200_tail":
            self.send_header("Content-Range", f"bytes {start}-{end - 1}/{size}")
        self.send_header("Content-Length", str(end - start))
        self.end_headers()
        if not head:
            self._send_body(fs_path, path, start, end, None)

    def _send_body(self, fs_path: str, path: str, start: int, stop: int, flip_at: Optional[int],
                   trickle: bool = False) -> int:
        fs = self.fs
        sent = 0
        chunk = 64 * 1024
        bps = fs.bytes_per_second
        if trickle:
            chunk, bps = 1, 1.0 / max(1e-3, fs.trickle_seconds)
        if bps:
            chunk = max(1, min(chunk, int(bps / 20)))
        t0 = time.monotonic()
        with open(fs_path, "rb") as f:
            f.seek(start)
            pos = start
            while pos < stop:
                if fs._stopping.is_set():
                    break
                data = f.read(min(chunk, stop - pos))
                if not data:
                    break
                if flip_at is not None and pos <= flip_at < pos + len(data):
                    b = bytearray(data)
                    b[flip_at - pos] ^= 0xFF
                    data = bytes(b)
                fs._count(path, len(data))  # before the write, so a client that is done sees it counted
                try:
                    self.wfile.write(data)
                    if trickle:
                        self.wfile.flush()
                except OSError:
                    break
                pos += len(data)
                sent += len(data)
                if bps:
                    ahead = sent / bps - (time.monotonic() - t0)
                    if ahead > 0:
                        fs._stopping.wait(ahead)
        return sent


def _parse_range(header: str, size: int):
    """``(start, end)`` for a single ``bytes=`` range, "unsatisfiable", or None."""
    h = header.strip()
    if not h.startswith("bytes=") or "," in h:
        return None
    spec = h[6:].strip()
    a, _, b = spec.partition("-")
    try:
        if a == "":
            n = int(b)
            if n <= 0:
                return "unsatisfiable"
            return max(0, size - n), size
        start = int(a)
        end = int(b) + 1 if b else size
    except ValueError:
        return None
    if start >= size:
        return "unsatisfiable"
    return start, min(end, size)


FaultServer.handler_class = _Handler


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m chaos.faultserver ROOT [--port N] [--faults P] [--seed S]``."""
    p = argparse.ArgumentParser(prog="python -m chaos.faultserver",
                                description="Serve ROOT over HTTP with injected faults.")
    p.add_argument("root")
    p.add_argument("--host", default="127.0.0.1")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--faults", default="", help='e.g. "reset=0.1,500=0.05" or "mixed:0.1"')
    p.add_argument("--profile", default=None, choices=sorted(PROFILES),
                   help="a named fault profile (replaces --faults and --stall-seconds)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--max-faults-per-path", type=int, default=None)
    p.add_argument("--stall-seconds", type=float, default=5.0)
    p.add_argument("--retry-after", type=float, default=1)
    p.add_argument("--manifest", default=None, help="manifest.json, to cut at sample boundaries")
    p.add_argument("--bytes-per-second", type=float, default=None)
    p.add_argument("--ignore-range", action="store_true", help="answer Range requests with 200 and the whole file")
    a = p.parse_args(argv)
    srv = FaultServer(a.root, host=a.host, port=a.port, faults=a.faults, seed=a.seed,
                      max_faults_per_path=a.max_faults_per_path, stall_seconds=a.stall_seconds,
                      retry_after=a.retry_after, manifest=a.manifest, bytes_per_second=a.bytes_per_second,
                      ignore_range=a.ignore_range, profile=a.profile)
    srv.start()
    print(srv.url, flush=True)
    stop = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: stop.set())
    try:
        while not stop.wait(0.5):
            pass
    except KeyboardInterrupt:
        pass
    finally:
        srv.stop()
        print(json.dumps({"bytes_sent": srv.bytes_sent, "requests": dict(srv.requests),
                          "faults": dict(srv.faults)}), file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
