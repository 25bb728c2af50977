"""The manifest and the ranged reads over http(s) without requests (resumewds.fetch.lite).

* The first sample of a run over http imports no requests; the whole
  sequence equals the one read with ``RESUMEWDS_FETCH_LITE=0`` and the one
  read from the local files.
* :class:`LiteSession` against a real server on 127.0.0.1: keep-alive reuse,
  a stale kept connection sent again, redirects and a redirect loop,
  statuses through the error map, Retry-After, a refused connection, https
  with ``REQUESTS_CA_BUNDLE``, and the urls it leaves to requests (a proxy,
  credentials, a ``.netrc``).
"""

from __future__ import annotations

import http.server
import json
import os
import ssl
import subprocess
import sys
import textwrap
import threading
from typing import Any, Iterator, List

import pytest

import resumewds as rw
from chaos.faultserver import FaultServer
from resumewds import synth
from resumewds.errors import PermanentFetchError, TransientFetchError
from resumewds.fetch import FetchBudget, FetchConfig, LiteSession, fetch_bytes, new_lite_session, new_session, no_sleep
from resumewds.manifest import parse_manifest_bytes
from resumewds.repair import fetch_range

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
CFG = FetchConfig(attempts=3, sleep=no_sleep, connect_timeout=5, read_timeout=10)


def _v3(root: str, shards: int = 3, samples: int = 20) -> str:
    synth.write_shards(root, shards=shards, samples=samples, size_range=(2000, 9000))
    m = os.path.join(root, "manifest.json")
    rw.build_manifest(os.path.join(root, f"shard-{{000000..{shards - 1:06d}}}.tar"), m, digests=True)
    return m


@pytest.fixture
def data(tmp_path) -> str:
    root = str(tmp_path / "data")
    _v3(root)
    return root


@pytest.fixture
def server(data) -> Iterator[FaultServer]:
    with FaultServer(data) as srv:
        yield srv


def _child(code: str, **env: str) -> str:
    full = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""), **env)
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=full, capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-3000:]
    return out.stdout.strip().splitlines()[-1]


RUN = """
    import json, sys
    import torch
    import resumewds as rw
    ds = rw.WebDataset({url!r}, seed=1, shuffle=True, cache_dir={cache!r})
    it = iter(ds)
    first = next(it)
    had = "requests" in sys.modules
    keys = [first["__key__"]] + [s["__key__"] for s in it]
    print(json.dumps([had, keys]))
"""


def test_the_first_sample_over_http_imports_no_requests_and_the_sequence_is_unchanged(data, server, tmp_path):
    url = server.url + "/manifest.json"
    had, lite = json.loads(_child(RUN.format(url=url, cache=str(tmp_path / "c1")), RESUMEWDS_FETCH_LITE="1"))
    had_off, off = json.loads(_child(RUN.format(url=url, cache=str(tmp_path / "c2")), RESUMEWDS_FETCH_LITE="0"))
    local = [s["__key__"] for s in rw.WebDataset(os.path.join(data, "manifest.json"), seed=1, shuffle=True,
                                                 cache_dir=str(tmp_path / "c3"))]
    assert (had, had_off) == (False, True)
    assert lite == off == local and len(lite) == 60


def test_a_kept_connection_is_reused_and_a_stale_one_is_sent_again(data, server):
    raw = open(os.path.join(data, "shard-000000.tar"), "rb").read()
    url = server.url + "/shard-000000.tar"
    with LiteSession() as s:
        for a, b in [(0, 511), (512, 2047), (100, 100)]:
            with s.get(url, headers={"Range": f"bytes={a}-{b}"}, timeout=(5, 10)) as r:
                assert r.status_code == 206 and b"".join(r.iter_content(4096)) == raw[a:b + 1]
        assert server.connections == 1  # three requests, one connection
        for c in s._pool.values():  # the server closes the idle connection: the next GET goes on a new one
            assert c.sock is not None
            c.sock.shutdown(2)
        with s.get(url, headers={"Range": "bytes=0-9"}, timeout=(5, 10)) as r:
            assert r.status_code == 206 and r.content == raw[:10]
        assert server.connections == 2


def test_an_unread_body_closes_its_connection(data, server):
    url = server.url + "/shard-000000.tar"
    with LiteSession() as s:
        with s.get(url, timeout=(5, 10)) as r:
            assert r.status_code == 200 and next(r.iter_content(100))  # most of the body left unread
        assert not s._pool
        with s.get(url, headers={"Range": "bytes=0-9"}, timeout=(5, 10)) as r:
            assert len(r.content) == 10
        assert server.connections == 2


class _Redirects(http.server.BaseHTTPRequestHandler):
    """/hop/N -> /hop/N-1 ... /hop/0 -> the data server's shard; /loop -> /loop."""

    target = ""

    def log_message(self, *a: Any) -> None:
        pass

    def do_GET(self) -> None:
        if self.path.startswith("/hop/"):
            n = int(self.path.rsplit("/", 1)[1])
            loc = f"/hop/{n - 1}" if n > 0 else self.target
        else:
            loc = "/loop"
        self.send_response(307 if self.path.startswith("/hop/") else 302)
        self.send_header("Location", loc)
        self.send_header("Content-Length", "0")
        self.end_headers()


@pytest.fixture
def redirector(server) -> Iterator[str]:
    handler = type("H", (_Redirects,), {"target": server.url + "/shard-000001.tar"})
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    t = threading.Thread(target=httpd.serve_forever, daemon=True)
    t.start()
    try:
        yield f"http://127.0.0.1:{httpd.server_address[1]}"
    finally:
        httpd.shutdown()
        httpd.server_close()


def test_redirects_are_followed_and_a_loop_is_a_permanent_error(data, redirector):
    raw = open(os.path.join(data, "shard-000001.tar"), "rb").read()
    got = fetch_range(redirector + "/hop/3", 1000, 3000, config=CFG, budget=FetchBudget(CFG),
                      session=LiteSession())
    assert got == raw[1000:3000]
    with LiteSession() as s:
        s.max_redirects = 2
        with pytest.raises(PermanentFetchError, match=r"/hop/3: too many redirects .*RESUMEWDS_FETCH_MAX_REDIRECTS"):
            s.get(redirector + "/hop/3", timeout=(5, 10))
    with pytest.raises(PermanentFetchError, match="too many redirects"):
        fetch_bytes(redirector + "/loop", CFG)


def test_statuses_and_errors_are_classified_as_with_requests(data, server):
    m = server.url + "/manifest.json"
    server.script("/manifest.json", ["503", "500"])
    assert parse_manifest_bytes(fetch_bytes(m, CFG), m).total_samples == 60
    assert server.requests["/manifest.json"] == 3
    with pytest.raises(PermanentFetchError, match=r"/nothing.json: HTTP 404"):
        fetch_bytes(server.url + "/nothing.json", CFG)
    server.script("/manifest.json", ["retry_after_huge"])
    with pytest.raises(TransientFetchError, match=r"HTTP 429 .*Retry-After 86400s"):
        fetch_bytes(m, FetchConfig(attempts=3, sleep=no_sleep, deadline=30))
    closed = server.url.rsplit(":", 1)[0] + ":9/manifest.json"  # nothing listens on port 9
    with pytest.raises(TransientFetchError, match=r":9/manifest.json: connection error"):
        fetch_bytes(closed, FetchConfig(attempts=2, sleep=no_sleep))
    with pytest.raises(PermanentFetchError, match="invalid URL"):
        LiteSession().get("http://127.0.0.1:notaport/x", timeout=(5, 10))


def test_a_url_requests_would_treat_otherwise_goes_through_requests(server, monkeypatch, tmp_path):
    monkeypatch.delenv("NETRC", raising=False)
    monkeypatch.setenv("HOME", str(tmp_path))
    for var in ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY", "no_proxy", "NO_PROXY"):
        monkeypatch.delenv(var, raising=False)
    url = server.url + "/manifest.json"
    assert LiteSession().routes(url)
    assert not LiteSession().routes("http://user:pw@127.0.0.1:1/manifest.json")
    monkeypatch.setenv("http_proxy", "http://127.0.0.1:9")
    assert not LiteSession().routes(url)
    monkeypatch.setenv("no_proxy", "127.0.0.1")
    assert LiteSession().routes(url)
    monkeypatch.delenv("http_proxy")
    (tmp_path / ".netrc").write_text("machine 127.0.0.1 login u password p\n")
    s = LiteSession()
    assert not s.routes(url)
    with s.get(url, timeout=(5, 10)) as r:  # sent by requests, which reads the .netrc
        assert type(r).__module__.startswith("requests") and r.status_code == 200
    s.close()
    monkeypatch.setenv("RESUMEWDS_FETCH_LITE", "0")
    assert type(new_lite_session()) is type(new_session())


def _self_signed(tmp_path) -> List[str]:
    pytest.importorskip("cryptography")
    import datetime

    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.timezone.utc)
    import ipaddress

    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    crt, pem = str(tmp_path / "c.pem"), str(tmp_path / "k.pem")
    with open(crt, "wb") as f:
        f.write(cert.public_bytes(serialization.Encoding.PEM))
    with open(pem, "wb") as f:
        f.write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                  serialization.NoEncryption()))
    return [crt, pem]


def test_https_checks_the_certificate_against_requests_bundle(data, tmp_path, monkeypatch):
    crt, pem = _self_signed(tmp_path)
    handler = type("H", (http.server.SimpleHTTPRequestHandler,),
                   {"log_message": lambda *a: None, "__init__": lambda self, *a, **k:
                    http.server.SimpleHTTPRequestHandler.__init__(self, *a, directory=data, **k)})
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(crt, pem)
    httpd.socket = ctx.wrap_socket(httpd.socket, server_side=True)
    t = threading.Thread(target=httpd.serve_forever, daemon=True)
    t.start()
    try:
        url = f"https://127.0.0.1:{httpd.server_address[1]}/manifest.json"
        monkeypatch.delenv("CURL_CA_BUNDLE", raising=False)
        monkeypatch.delenv("REQUESTS_CA_BUNDLE", raising=False)
        with pytest.raises(TransientFetchError, match="CERTIFICATE_VERIFY_FAILED"):
            fetch_bytes(url, FetchConfig(attempts=1, sleep=no_sleep))
        monkeypatch.setenv("REQUESTS_CA_BUNDLE", crt)
        raw = fetch_bytes(url, CFG)
        assert raw == open(os.path.join(data, "manifest.json"), "rb").read()
    finally:
        httpd.shutdown()
        httpd.server_close()
