"""Tests for resumewds.fetch and chaos.faultserver against real 127.0.0.1 servers."""

from __future__ import annotations

import errno
import http.server
import os
import pickle
import socket
import subprocess
import sys
import tarfile
import threading
import time
from typing import Any, List

import pytest
import requests
import urllib3

from chaos.faultserver import FaultServer, parse_faults
from http_fixtures import (
    Recorder,
    digest,
    fast_config,
    make_blob,
    make_tar,
)
from resumewds.errors import CacheError, FetchError, PermanentFetchError, ResumeWDSError, TransientFetchError
from resumewds.fetch import FetchConfig, fetch_bytes, fetch_to_file
from resumewds.fetch._errormap import parse_retry_after
from resumewds.fetch._errormap import translate as _translate
from resumewds.fetch._settings import no_sleep

KB = 1024


@pytest.mark.parametrize("fault", ["reset", "500", "503", "429", "truncate", "truncate_nolen", "stall", "down"])
def test_each_transient_fault_is_retried(served, tmp_path, fault):
    root, srv = served
    data = make_blob(os.path.join(root, "a.tar"), 200 * KB)
    srv.script("/a.tar", [fault])
    rec = Recorder()
    out = str(tmp_path / "a.partial")
    res = fetch_to_file(srv.url + "a.tar", out, expected_size=len(data), config=fast_config(read_timeout=0.3),
                        on_event=rec)
    assert open(out, "rb").read() == data
    assert res.attempts == 2 and srv.faults[fault] == 1
    assert len(rec.kinds("retry")) == 1 and rec.kinds("retry")[0]["attempt"] == 1
    assert [k for k, _, _ in rec.events] == ["fetch_start", "retry", "fetch_done"]
    assert rec.kinds("fetch_done")[0]["bytes"] == res.bytes


def test_stall_is_a_read_timeout(served, tmp_path):
    root, srv = served
    data = make_blob(os.path.join(root, "a.tar"), 100 * KB)
    srv.script("/a.tar", ["stall@0.5"])
    rec = Recorder()
    t0 = time.monotonic()
    fetch_to_file(srv.url + "a.tar", str(tmp_path / "p"), expected_size=None,
                  config=fast_config(read_timeout=0.3), on_event=rec)
    assert time.monotonic() - t0 < 1.9  # did not wait for the 2 s stall
    assert "timeout" in rec.kinds("retry")[0]["error"]
    assert open(tmp_path / "p", "rb").read() == data


@pytest.mark.parametrize("status", ["401", "403", "404", "410"])
def test_permanent_status_fails_at_once(served, tmp_path, status):
    root, srv = served
    make_blob(os.path.join(root, "a.tar"), 10 * KB)
    srv.script("/a.tar", [status])
    url = srv.url + "a.tar"
    with pytest.raises(PermanentFetchError) as ei:
        fetch_to_file(url, str(tmp_path / "p"), expected_size=None, config=fast_config())
    assert url in str(ei.value) and status in str(ei.value)
    err: Any = ei.value  # status and url are keyword fields (set as attributes)
    assert err.status == int(status) and err.url == url
    assert srv.requests["/a.tar"] == 1


def test_missing_remote_file_is_404(served, tmp_path):
    _, srv = served
    with pytest.raises(PermanentFetchError, match="404"):
        fetch_to_file(srv.url + "nope.tar", str(tmp_path / "p"), config=fast_config())
    assert srv.requests["/nope.tar"] == 1


def test_unknown_scheme_and_missing_local_file(tmp_path):
    with pytest.raises(PermanentFetchError, match="gs://b/a.tar"):
        fetch_to_file("gs://b/a.tar", str(tmp_path / "p"), config=fast_config())
    missing = str(tmp_path / "missing.tar")
    with pytest.raises(PermanentFetchError, match="missing.tar"):
        fetch_to_file(missing, str(tmp_path / "p"), config=fast_config())
    with pytest.raises(PermanentFetchError):
        fetch_bytes("file://" + missing, fast_config())


def test_transient_gives_up_after_attempts(served, tmp_path):
    root, srv = served
    make_blob(os.path.join(root, "a.tar"), 10 * KB)
    srv.set_faults("500=1.0")
    with pytest.raises(TransientFetchError, match="500"):
        fetch_to_file(srv.url + "a.tar", str(tmp_path / "p"), config=fast_config(attempts=3))
    assert srv.requests["/a.tar"] == 3


def test_range_resume_costs_only_the_rest(served, tmp_path):
    root, srv = served
    size = 1024 * KB
    data = make_blob(os.path.join(root, "a.tar"), size)
    url = srv.url + "a.tar"
    out = str(tmp_path / "a.partial")
    # one attempt that dies at 90%: the bytes stay in the partial file
    srv.script("/a.tar", ["truncate@0.9"])
    with pytest.raises(TransientFetchError, match="short body"):
        fetch_to_file(url, out, expected_size=size, config=fast_config(attempts=1))
    kept = os.path.getsize(out)
    assert kept == int(size * 0.9)
    assert os.path.exists(out + ".etag")
    srv.reset_counters()
    rec = Recorder()
    res = fetch_to_file(url, out, expected_size=size, config=fast_config(), on_event=rec)
    assert open(out, "rb").read() == data
    assert srv.bytes_sent == size - kept  # only the missing 10%
    assert res.resumed_from == kept and res.bytes == size - kept
    assert rec.kinds("fetch_start")[0]["resumed_from"] == kept
    # a partial that is already complete costs one 416 and no body
    srv.reset_counters()
    again = fetch_to_file(url, out, expected_size=size, config=fast_config())
    assert again.bytes == 0 and srv.bytes_sent == 0 and srv.requests["/a.tar"] == 1
    assert open(out, "rb").read() == data


def test_mid_body_cut_within_one_call_is_resumed(served, tmp_path):
    root, srv = served
    size = 1024 * KB
    data = make_blob(os.path.join(root, "a.tar"), size)
    srv.script("/a.tar", ["truncate@0.9"])
    fetch_to_file(srv.url + "a.tar", str(tmp_path / "p"), expected_size=size, config=fast_config())
    assert open(tmp_path / "p", "rb").read() == data
    assert srv.bytes_sent <= size * 1.11


def test_if_range_with_changed_file_restarts(served, tmp_path):
    root, srv = served
    size = 256 * KB
    src = os.path.join(root, "a.tar")
    make_blob(src, size, seed=1)
    url = srv.url + "a.tar"
    out = str(tmp_path / "p")
    srv.script("/a.tar", ["truncate@0.5"])
    with pytest.raises(TransientFetchError):
        fetch_to_file(url, out, expected_size=size, config=fast_config(attempts=1))
    new = make_blob(src, size, seed=2)  # same size, new content and mtime
    os.utime(src, ns=(time.time_ns(), time.time_ns() + 10**9))
    srv.reset_counters()
    res = fetch_to_file(url, out, expected_size=size, config=fast_config())
    assert open(out, "rb").read() == new
    assert srv.bytes_sent == size and res.resumed_from == 0


class _NoRangeHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *a):
        pass


def test_server_ignoring_range_restarts_from_zero(tmp_path):
    root = tmp_path / "plain"
    root.mkdir()
    data = make_blob(str(root / "a.tar"), 64 * KB)
    handler = lambda *a, **kw: _NoRangeHandler(*a, directory=str(root), **kw)
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    t = threading.Thread(target=httpd.serve_forever, daemon=True)
    t.start()
    try:
        out = str(tmp_path / "p")
        with open(out, "wb") as f:
            f.write(b"x" * 1000)  # stale bytes with a validator that the server ignores
        with open(out + ".etag", "w") as f:
            f.write('"whatever"')
        url = f"http://127.0.0.1:{httpd.server_address[1]}/a.tar"
        res = fetch_to_file(url, out, expected_size=len(data), config=fast_config())
        assert open(out, "rb").read() == data and res.resumed_from == 0
        assert fetch_bytes(url, fast_config()) == data
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_retry_after_is_honoured(tmp_path):
    root = tmp_path / "srv"
    root.mkdir()
    data = make_blob(str(root / "a.tar"), 10 * KB)
    waits: List[float] = []
    cfg = fast_config(sleep=waits.append)
    with FaultServer(str(root), retry_after=7) as srv:
        srv.script("/a.tar", ["503", "429"])
        rec = Recorder()
        fetch_to_file(srv.url + "a.tar", str(tmp_path / "p"), config=cfg, on_event=rec)
    assert open(tmp_path / "p", "rb").read() == data
    assert len(waits) == 2 and all(w >= 7 for w in waits)
    assert [r["wait"] for r in rec.kinds("retry")] == waits


def test_backoff_grows_and_is_capped(served, tmp_path):
    root, srv = served
    make_blob(os.path.join(root, "a.tar"), KB)
    srv.script("/a.tar", ["500"] * 5)
    waits: List[float] = []
    fetch_to_file(srv.url + "a.tar", str(tmp_path / "p"),
                  config=fast_config(sleep=waits.append, backoff_initial=0.1, backoff_max=0.5, attempts=8))
    assert len(waits) == 5
    assert 0.1 <= waits[0] <= 0.2 and all(w <= 0.5 for w in waits)


def test_pipe_success_and_failure(tmp_path):
    src = str(tmp_path / "a.tar")
    data = make_blob(src, 50 * KB)
    out = str(tmp_path / "p")
    res = fetch_to_file(f"pipe:cat {src}", out, expected_size=len(data), config=fast_config())
    assert open(out, "rb").read() == data and res.bytes == len(data)
    rec = Recorder()
    with pytest.raises(TransientFetchError) as ei:
        fetch_to_file("pipe:echo partial; echo 'oops: no such bucket' >&2; exit 3", out,
                      config=fast_config(attempts=2), on_event=rec)
    assert "oops: no such bucket" in str(ei.value) and "status 3" in str(ei.value)
    assert len(rec.kinds("retry")) == 1
    assert fetch_bytes(f"pipe:cat {src}", fast_config()) == data


def test_pipe_short_output_is_transient(tmp_path):
    src = str(tmp_path / "a.tar")
    data = make_blob(src, 10 * KB)
    with pytest.raises(TransientFetchError, match="short body"):
        fetch_to_file(f"pipe:head -c 100 {src}", str(tmp_path / "p"), expected_size=len(data),
                      config=fast_config(attempts=1))


def test_local_copy_and_file_url(tmp_path):
    src = str(tmp_path / "a b.tar")
    data = make_blob(src, 30 * KB)
    for url in (src, "file://" + src.replace(" ", "%20")):
        out = str(tmp_path / "p")
        fetch_to_file(url, out, expected_size=len(data), config=fast_config())
        assert open(out, "rb").read() == data


def test_fetch_bytes_retries(served):
    root, srv = served
    data = make_blob(os.path.join(root, "manifest.json"), 3 * KB)
    srv.script("/manifest.json", ["500", "truncate@0.3"])
    assert fetch_bytes(srv.url + "manifest.json", fast_config()) == data
    srv.script("/gone.json", ["410"])
    with pytest.raises(PermanentFetchError, match="410"):
        fetch_bytes(srv.url + "gone.json", fast_config())


def test_connection_refused_is_transient(tmp_path):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    with pytest.raises(TransientFetchError, match="connection error"):
        fetch_to_file(f"http://127.0.0.1:{port}/a.tar", str(tmp_path / "p"), config=fast_config(attempts=2))


def test_down_window_is_survived_with_real_backoff(served, tmp_path):
    root, srv = served
    data = make_blob(os.path.join(root, "a.tar"), 20 * KB)
    srv.set_down(0.3)
    cfg = fast_config(sleep=time.sleep, backoff_initial=0.05, backoff_max=0.2, attempts=10)
    fetch_to_file(srv.url + "a.tar", str(tmp_path / "p"), config=cfg)
    assert open(tmp_path / "p", "rb").read() == data
    assert srv.faults["down"] >= 1


def test_config_pickles_and_reads_env(monkeypatch):
    cfg = FetchConfig(sleep=no_sleep, attempts=3)
    assert pickle.loads(pickle.dumps(cfg)) == cfg
    monkeypatch.setenv("RESUMEWDS_FETCH_ATTEMPTS", "5")
    monkeypatch.setenv("RESUMEWDS_FETCH_READ_TIMEOUT", "2.5")
    c = FetchConfig.from_env(deadline=9.0)
    assert (c.attempts, c.read_timeout, c.deadline) == (5, 2.5, 9.0)
    monkeypatch.setenv("RESUMEWDS_FETCH_ATTEMPTS", "many")
    with pytest.raises(ValueError, match="RESUMEWDS_FETCH_ATTEMPTS"):
        FetchConfig.from_env()
    with pytest.raises(ValueError):
        FetchConfig(attempts=0)


def test_parse_retry_after():
    assert parse_retry_after("5") == 5.0
    assert parse_retry_after("garbage") is None
    future = time.strftime("%a, %d %b %Y %H:%M:%S GMT", time.gmtime(time.time() + 60))
    ra = parse_retry_after(future)
    assert ra is not None and 50 < ra <= 61


def test_every_foreign_exception_is_translated():
    from resumewds.fetch._errormap import _SinkError

    url = "http://127.0.0.1:1/a.tar"
    cases = [
        (urllib3.exceptions.ConnectTimeoutError("x"), TransientFetchError),
        (urllib3.exceptions.ReadTimeoutError(None, url, "x"), TransientFetchError),
        (urllib3.exceptions.NewConnectionError(None, "x"), TransientFetchError),
        (urllib3.exceptions.LocationParseError("x"), PermanentFetchError),
        (urllib3.exceptions.ProtocolError("x"), TransientFetchError),
        (ConnectionResetError(errno.ECONNRESET, "reset"), TransientFetchError),
        (socket.timeout("t"), TransientFetchError),
        (FileNotFoundError(errno.ENOENT, "nope", "/x"), PermanentFetchError),
        (subprocess.SubprocessError("x"), TransientFetchError),
        (_SinkError(OSError(errno.ENOSPC, "full"), "/cache/shards/x.partial"), CacheError),
        (_SinkError(OSError(errno.EROFS, "ro"), "/cache/shards/x.partial"), CacheError),
        (RuntimeError("odd"), FetchError),
    ]
    for exc, want in cases:
        got = _translate(exc, url)
        assert isinstance(got, want) and isinstance(got, ResumeWDSError), (exc, got)
    full = _translate(cases[-3][0], url)
    assert "no space left on device" in str(full) and "/cache/shards" in str(full)


# ---- the fault server itself -----------------------------------------------------
def test_fault_profile_parsing():
    assert parse_faults("reset=0.1, 500=0.05") == (0.0, {"reset": 0.1, "500": 0.05})
    assert parse_faults({"mixed": 0.2, "stall": 0.01}) == (0.2, {"stall": 0.01})
    with pytest.raises(ValueError):
        parse_faults("explode=0.1")
    with pytest.raises(ValueError):
        parse_faults("reset=2")


def _run_profile(root: str, seed: int):
    with FaultServer(root, faults="mixed:0.5", seed=seed, stall_seconds=0.5, retry_after=0,
                     max_faults_per_path=3) as srv:
        for name in ("a.tar", "b.tar"):
            for _ in range(6):
                try:
                    _ = requests.get(srv.url + name, timeout=(1, 0.2)).content  # read the body
                except requests.RequestException:
                    pass
        return dict(srv.faults), dict(srv.requests)


def test_faults_are_deterministic_per_seed_and_bounded(tmp_path):
    root = str(tmp_path)
    make_blob(os.path.join(root, "a.tar"), 20 * KB)
    make_blob(os.path.join(root, "b.tar"), 20 * KB)
    f1, r1 = _run_profile(root, seed=3)
    f2, r2 = _run_profile(root, seed=3)
    assert f1 == f2 and r1 == r2
    assert 0 < sum(f1.values()) <= 6  # at most 3 per path


def test_range_headers_served(served):
    root, srv = served
    data = make_blob(os.path.join(root, "a.tar"), 10 * KB)
    r = requests.get(srv.url + "a.tar", headers={"Range": "bytes=100-199"})
    assert r.status_code == 206 and r.content == data[100:200]
    assert r.headers["Content-Range"] == f"bytes 100-199/{len(data)}"
    etag = r.headers["ETag"]
    r = requests.get(srv.url + "a.tar", headers={"Range": "bytes=100-", "If-Range": '"other"'})
    assert r.status_code == 200 and r.content == data
    r = requests.get(srv.url + "a.tar", headers={"Range": "bytes=-10", "If-Range": etag})
    assert r.status_code == 206 and r.content == data[-10:]
    r = requests.get(srv.url + "a.tar", headers={"Range": f"bytes={len(data)}-"})
    assert r.status_code == 416
    assert requests.get(srv.url + "../../etc/passwd").status_code == 404


def test_flip_faults_corrupt_real_tar(served, tmp_path):
    root, srv = served
    data = make_tar(os.path.join(root, "a.tar"), samples=4)
    srv.script("/a.tar", ["flip_header", "flip_data"])
    hdr = requests.get(srv.url + "a.tar").content
    body = requests.get(srv.url + "a.tar").content
    assert len(hdr) == len(body) == len(data) and hdr != data and body != data
    diff = [i for i in range(len(data)) if hdr[i] != data[i]]
    assert len(diff) == 1
    with tarfile.open(os.path.join(root, "a.tar")) as tf:
        members = tf.getmembers()
    headers = [(m.offset, m.offset_data) for m in members]
    assert any(a <= diff[0] < b for a, b in headers)
    bdiff = [i for i in range(len(data)) if body[i] != data[i]]
    assert len(bdiff) == 1
    assert any(m.offset_data <= bdiff[0] < m.offset_data + m.size for m in members)


def test_truncate_nolen_cuts_at_sample_boundary(tmp_path):
    import json

    root = tmp_path / "srv"
    root.mkdir()
    data = make_tar(str(root / "a.tar"), samples=6)
    with tarfile.open(root / "a.tar") as tf:
        members = tf.getmembers()
    offsets = [m.offset for m in members[::2]] + [len(data) - 1024]
    man = tmp_path / "manifest.json"
    man.write_text(json.dumps({"format": "resumewds.manifest", "version": 1,
                               "shards": [{"url": "a.tar", "samples": 6, "offsets": offsets}]}))
    with FaultServer(str(root), faults="truncate_nolen=1.0", manifest=str(man)) as srv:
        for _ in range(3):
            got = requests.get(srv.url + "a.tar").content
            assert len(got) in offsets[1:] and got == data[: len(got)]


def test_runs_as_a_program(tmp_path):
    make_blob(str(tmp_path / "a.tar"), KB)
    env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    proc = subprocess.Popen([sys.executable, "-m", "chaos.faultserver", str(tmp_path), "--port", "0",
                             "--faults", "mixed:0.0", "--seed", "1"], stdout=subprocess.PIPE,
                            stderr=subprocess.DEVNULL, env=env, text=True)
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        assert url.startswith("http://127.0.0.1:")
        assert len(requests.get(url + "a.tar", timeout=5).content) == KB
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_result_digest_is_the_files_hash_across_cuts_and_resumes(served, tmp_path):
    """The digest is computed from the bytes as they are written, and still
    covers bytes kept from an earlier call (hashed from disk) and bytes kept
    from a cut attempt within the call."""
    root, srv = served
    size = 1024 * KB + 123
    data = make_blob(os.path.join(root, "a.tar"), size)
    url = srv.url + "a.tar"
    out = str(tmp_path / "p")
    res = fetch_to_file(url, out, expected_size=size, config=fast_config())
    assert res.xxh3_64 == digest(data)
    # a cut within one call, resumed by the same call
    srv.script("/a.tar", ["truncate@0.3", "reset"])
    res = fetch_to_file(url, str(tmp_path / "q"), expected_size=size, config=fast_config())
    assert res.xxh3_64 == digest(data) and res.attempts == 3
    # bytes kept from an earlier call
    srv.script("/a.tar", ["truncate@0.6"])
    with pytest.raises(TransientFetchError):
        fetch_to_file(url, str(tmp_path / "r"), expected_size=size, config=fast_config(attempts=1))
    res = fetch_to_file(url, str(tmp_path / "r"), expected_size=size, config=fast_config())
    assert res.resumed_from == int(size * 0.6) and res.xxh3_64 == digest(data)
    # local files and pipe: commands are hashed the same way
    assert fetch_to_file(os.path.join(root, "a.tar"), str(tmp_path / "l")).xxh3_64 == digest(data)
    src = os.path.join(root, "a.tar")
    assert fetch_to_file(f"pipe:cat {src}", str(tmp_path / "c")).xxh3_64 == digest(data)


def test_partial_from_an_earlier_boot_is_not_resumed(served, tmp_path, monkeypatch):
    """Unsynced bytes of a partial may have been lost to the crash that ended
    the boot, so only a partial written in this boot is resumed."""
    import resumewds.fetch as F
    from resumewds.fetch import _partial as partial

    root, srv = served
    size = 256 * KB
    data = make_blob(os.path.join(root, "a.tar"), size)
    url = srv.url + "a.tar"
    out = str(tmp_path / "p")
    srv.script("/a.tar", ["truncate@0.5"])
    with pytest.raises(TransientFetchError):
        fetch_to_file(url, out, expected_size=size, config=fast_config(attempts=1))
    side = __import__("json").load(open(out + ".etag"))
    assert side["boot"] == F.boot_id() and side["validator"]
    # the machine "reboots", and the kept half is garbage now
    monkeypatch.setattr(partial, "_BOOT_ID", "another-boot")
    with open(out, "r+b") as f:
        f.write(b"\xff" * 1000)
    srv.reset_counters()
    res = fetch_to_file(url, out, expected_size=size, config=fast_config())
    assert srv.bytes_sent == size and res.resumed_from == 0
    assert open(out, "rb").read() == data and res.xxh3_64 == digest(data)


class _ChunkedHandler(http.server.BaseHTTPRequestHandler):
    """Sends the body with Transfer-Encoding: chunked, in uneven chunks; a
    request for /cut.tar stops half way without the final chunk."""

    protocol_version = "HTTP/1.1"
    data = b""

    def log_message(self, *a):
        pass

    def do_GET(self):
        self.send_response(200)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        data = self.data if self.path != "/cut.tar" else self.data[: len(self.data) // 2]
        pos, step = 0, 1
        while pos < len(data):
            piece = data[pos:pos + step]
            self.wfile.write(f"{len(piece):x}\r\n".encode() + piece + b"\r\n")
            pos += len(piece)
            step = step * 3 + 7
        if self.path != "/cut.tar":
            self.wfile.write(b"0\r\n\r\n")
        self.wfile.flush()
        self.close_connection = True


def test_chunked_bodies_and_the_direct_read_path(tmp_path):
    from resumewds.fetch._http import _Body

    data = os.urandom(3 * 1024 * KB + 11)
    handler = type("H", (_ChunkedHandler,), {"data": data})
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        base = f"http://127.0.0.1:{httpd.server_address[1]}"
        res = fetch_to_file(base + "/a.tar", str(tmp_path / "a"), config=fast_config())
        assert open(tmp_path / "a", "rb").read() == data and res.xxh3_64 == digest(data)
        with pytest.raises(TransientFetchError):
            fetch_to_file(base + "/cut.tar", str(tmp_path / "c"), config=fast_config(attempts=1))
    finally:
        httpd.shutdown()
        httpd.server_close()
    # with a Content-Length the body is read from the socket straight into our
    # buffer (if urllib3 changes its internals this falls back, and this fails)
    root = tmp_path / "srv"
    root.mkdir()
    make_blob(str(root / "b.tar"), 10 * KB)
    with FaultServer(str(root)) as srv, requests.get(srv.url + "b.tar", stream=True) as r:
        body = _Body(r.raw)
        assert body.kind == "sized"
        buf = memoryview(bytearray(64 * KB))
        got = 0
        while True:
            n = body.readinto(buf)
            if not n:
                break
            got += n
        assert got == 10 * KB


def test_connections_are_reused_across_shards_but_not_after_a_cut(served, tmp_path):
    """A body read to its end gives the connection back to the pool: one TCP
    (and TLS) handshake for many shards.  A cut body's connection is closed."""
    from resumewds.fetch import new_session

    root, srv = served
    datas = [make_blob(os.path.join(root, f"{i}.tar"), 300 * KB, seed=i) for i in range(5)]
    with new_session() as s:
        for i, d in enumerate(datas):
            res = fetch_to_file(srv.url + f"{i}.tar", str(tmp_path / f"p{i}"), config=fast_config(), session=s)
            assert res.xxh3_64 == digest(d)
        assert srv.connections == 1
        srv.script("/0.tar", ["truncate@0.5"])
        res = fetch_to_file(srv.url + "0.tar", str(tmp_path / "q"), config=fast_config(), session=s)
        assert res.xxh3_64 == digest(datas[0]) and res.attempts == 2
        # the cut came on the pooled connection, which is then dropped; the retry opens a new one
        assert srv.connections == 2
        fetch_to_file(srv.url + "1.tar", str(tmp_path / "r"), config=fast_config(), session=s)
        assert srv.connections == 2  # and that one is reused again


def test_the_session_goes_through_the_proxy_the_environment_names(tmp_path, monkeypatch):
    """HTTP_PROXY takes a fetch through a proxy (which sees the absolute URL),
    NO_PROXY keeps a host off it, and credentials in the proxy's URL go as
    Proxy-Authorization."""
    import base64
    import http.server
    import threading

    seen: List[Any] = []

    class Proxy(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            seen.append((self.path, self.headers.get("Proxy-Authorization")))
            body = b"through the proxy"
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *a: Any) -> None:
            pass

    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Proxy)
    threading.Thread(target=srv.serve_forever, daemon=True).start()
    direct = tmp_path / "direct"
    direct.mkdir()
    (direct / "a.bin").write_bytes(b"served directly")
    try:
        monkeypatch.setenv("HTTP_PROXY", f"http://bob:pw@127.0.0.1:{srv.server_address[1]}")
        with FaultServer(str(direct)) as origin:
            monkeypatch.setenv("NO_PROXY", "127.0.0.1")
            assert fetch_bytes(origin.url + "a.bin", fast_config()) == b"served directly"
            assert seen == []  # NO_PROXY: straight to the origin
            monkeypatch.setenv("NO_PROXY", "skip.invalid")
            assert fetch_bytes("http://host.invalid/d/a.tar?x=1", fast_config()) == b"through the proxy"
        assert seen == [("http://host.invalid/d/a.tar?x=1", "Basic " + base64.b64encode(b"bob:pw").decode())]
    finally:
        srv.shutdown()
        srv.server_close()


@pytest.mark.parametrize("cmd", ["sleep {S}", "printf abc; sleep {S}", "(sleep {S} &) ; printf abc"])
def test_a_stalled_pipe_command_is_killed_and_retried(tmp_path, cmd):
    """A pipe: command gets the read timeout an http body gets: no output for
    read_timeout seconds (or a pipe held open by a leftover child) is a
    transient failure, and the command's whole process group is killed."""
    secs = f"{900 + os.getpid() % 97}.{abs(hash(cmd)) % 1000:03d}"  # names this test's sleeps
    rec = Recorder()
    t0 = time.monotonic()
    with pytest.raises(TransientFetchError, match="stalled|did not exit"):
        fetch_to_file("pipe:" + cmd.format(S=secs), str(tmp_path / "p"),
                      config=fast_config(attempts=2, read_timeout=0.3), on_event=rec)
    assert time.monotonic() - t0 < 10
    assert len(rec.kinds("retry")) == 1
    deadline = time.monotonic() + 30  # a killed process is gone once the kernel has reaped it
    while left := subprocess.run(["pgrep", "-f", f"sleep {secs}"], capture_output=True, text=True).stdout.split():
        assert time.monotonic() < deadline, f"processes of the command survived: {left}"
        time.sleep(0.02)
