"""The layout of resumewds.fetch: one transport registry keyed by
scheme, one error map as a table, a face of public names only, and
fetch_bytes on the same transports as fetch_to_file."""

from __future__ import annotations

import errno
import http.client
import os
import re
import socket
import ssl
import subprocess
import sys
import types
from typing import Any, List, cast

import pytest
import urllib3
import xxhash

import resumewds.fetch as F
from resumewds.errors import CacheError, FetchError, PermanentFetchError, TransientFetchError
from resumewds.events import EventKind
from resumewds.fetch import FetchConfig, fetch_bytes, fetch_to_file, is_remote_url, scheme_of, transport_for
from resumewds.fetch._errormap import FETCH_ERRORS, _SinkError, translate
from resumewds.fetch._partial import _Sink
from resumewds.fetch._schemes import TRANSPORTS, TransportEntry
from resumewds.fetch._settings import no_sleep
from resumewds.fetch._transport import Transport

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

FETCH_NAMES = ["FetchBudget", "FetchConfig", "FetchResult", "RangeSink", "S3Options", "Session", "boot_id",
               "client_for", "fetch_bytes", "fetch_range", "fetch_to_file", "is_local_url", "is_remote_object",
               "is_remote_url", "local_path", "new_session", "no_sleep", "parse_retry_after", "parse_s3_url",
               "scheme_hint", "scheme_of", "translate_s3_error", "transport_for"]


def test_the_package_face_is_its_api_and_internals_live_in_their_modules():
    """resumewds.fetch hands on its API alone; an internal name is imported
    from the module that defines it, and s3 lives at resumewds.fetch."""
    import resumewds
    import resumewds.fetch._s3

    assert sorted(F.__all__) == FETCH_NAMES and all(hasattr(F, n) for n in FETCH_NAMES)
    # (beside the lazy face's own table and imports: each name loads its module on first use)
    assert not [n for n in vars(F) if n.startswith("_") and not n.startswith("__")
                and n not in ("_LAZY", "_importlib", "_typing") and not isinstance(getattr(F, n), types.ModuleType)]
    from resumewds.fetch import boot_id

    assert F.boot_id is boot_id  # its cache, partial._BOOT_ID, is what tests replace
    assert not os.path.exists(os.path.join(os.path.dirname(resumewds.__file__), "s3.py"))  # one path: fetch.s3
    assert resumewds.S3Options is resumewds.fetch._s3.S3Options


def test_registry_has_one_entry_per_scheme():
    assert {s: e.module.rsplit(".", 1)[1].lstrip("_") for s, e in TRANSPORTS.items()} == {
        "file": "local", "local": "local", "http": "http", "https": "http", "pipe": "pipe", "s3": "s3"}
    for url, name in [("/d/a.tar", "local"), ("file:///d/a.tar", "local"), ("http://h/a.tar", "http"),
                      ("HTTPS://h/a.tar", "http"), ("pipe:cat a.tar", "pipe"), ("s3://b/a.tar", "s3")]:
        assert transport_for(url).name == name, url
    with pytest.raises(PermanentFetchError, match=r"^gs://b/k: unsupported URL scheme 'gs' \(use http, https, s3, "
                                                  r"file, a path or pipe:\)$"):
        transport_for("gs://b/k")


@pytest.mark.parametrize("url", ["/d/a.tar", "rel/a.tar", "file:///d/a.tar", "http://h/a", "https://h/a",
                                 "s3://b/k", "S3://b/k", "pipe:cat a", "gs://b/k", "ftp://h/a", "hdfs://n/a"])
def test_is_remote_url_is_the_registry_s_remote_flag(url):
    assert is_remote_url(url) == (scheme_of(url) in ("http", "https", "s3", "pipe"))


# url -> (is_remote_url, is_remote_object, is_local_url): the one classification every module uses
URL_CLASSES = [
    ("/data/a.tar", (False, False, True)),
    ("rel/a.tar", (False, False, True)),
    ("file:///data/a.tar", (False, False, True)),
    ("http://h/a.tar", (True, True, False)),
    ("https://h/a.tar", (True, True, False)),
    ("HTTPS://h/a.tar", (True, True, False)),
    ("s3://bucket/a.tar", (True, True, False)),
    ("pipe:curl -s http://h/a.tar", (True, False, False)),  # downloaded (cached), but no object to join or range
    ("gs://bucket/a.tar", (False, False, False)),  # unknown: refused with a hint (see resumewds.fetch.scheme_hint)
    ("-", (False, False, True)),  # a path named "-" (stdin is the webdataset drop-in's business)
]


@pytest.mark.parametrize("url,expected", URL_CLASSES, ids=[u for u, _ in URL_CLASSES])
def test_is_this_url_remote_has_one_answer(url, expected):
    from resumewds.fetch import is_local_url, is_remote_object

    assert (is_remote_url(url), is_remote_object(url), is_local_url(url)) == expected
    # the modules that ask use the registry's answer
    import resumewds.manifest._manifest as manifest
    from resumewds.sources import (
        _urls as urls,  # enforce_security's "may this be opened?": the same table, "-" (stdin) allowed
    )

    urls.enforce_security = True
    try:
        refused = False
        try:
            urls.check_source_allowed(url)
        except urls.EnforcedSecurityError:
            refused = True
    finally:
        urls.enforce_security = False
    assert refused is (expected[2] and url != "-") or url.startswith("pipe:")
    assert not hasattr(manifest, "is_remote")
    if expected[1]:
        assert manifest.resolve_url("b.tar", url).endswith("/b.tar") and "://" in manifest.resolve_url("b.tar", url)


def test_a_new_transport_is_one_registry_entry(tmp_path, monkeypatch):
    """Budget, retries, error map, events, hashing and the result come with the entry."""

    class Mem(Transport):
        name = "mem"

        def attempt(self, state: Any) -> None:
            if state.attempts == 1:
                raise ConnectionResetError(errno.ECONNRESET, "reset")  # FETCH_ERRORS: transient
            with _Sink(state, append=False) as sink:
                sink.put(memoryview(b"hello"))

    monkeypatch.setitem(TRANSPORTS, "mem", TransportEntry("unused.module", remote=True, loaded=Mem()))
    kinds: List[str] = []
    res = fetch_to_file("mem://x", str(tmp_path / "p"), config=FetchConfig(sleep=no_sleep, backoff_initial=0),
                        on_event=lambda kind, url, **d: kinds.append(kind))
    assert (res.attempts, res.size, res.xxh3_64) == (2, 5, xxhash.xxh3_64_hexdigest(b"hello"))
    assert kinds == ["fetch_start", "retry", "fetch_done"] and is_remote_url("mem://x")


def test_fetch_emits_event_kinds_and_no_literals_are_left(tmp_path):
    src = tmp_path / "a.bin"
    src.write_bytes(b"x" * 1000)
    got: List[Any] = []
    fetch_to_file(str(src), str(tmp_path / "p"), on_event=lambda kind, url, **d: got.append(kind))
    assert got == [EventKind.FETCH_START, EventKind.FETCH_DONE] and all(isinstance(k, EventKind) for k in got)
    pkg = os.path.join(REPO, "resumewds", "fetch")
    for name in sorted(os.listdir(pkg)):
        if name.endswith(".py"):
            with open(os.path.join(pkg, name)) as f:
                assert not re.findall(r'on_event\(\s*"', f.read()), name


def test_fetch_bytes_pipe_has_the_stall_timeout():
    """fetch_bytes goes through the same pipe: transport (no parallel copy without a timeout)."""
    cfg = FetchConfig(read_timeout=0.5, attempts=1, sleep=no_sleep)
    with pytest.raises(TransientFetchError, match=r"^pipe:sleep 30: command wrote nothing for 0.5s \(stalled\); "
                                                  r"killed it$"):
        fetch_bytes("pipe:sleep 30", cfg)
    assert fetch_bytes("pipe:printf abc", cfg) == b"abc"


U = "http://127.0.0.1:9/a.tar"
_U3 = urllib3.exceptions
_VERIFY = ssl.SSLCertVerificationError(1, "[SSL: CERTIFICATE_VERIFY_FAILED] certificate verify failed")
ERROR_CASES = [
    (_SinkError(OSError(errno.ENOSPC, "No space left"), "/c/a.partial"), CacheError,
     "/c: cannot write a.partial while fetching " + U + ": no space left on device"),
    (_U3.LocationParseError("bad"), PermanentFetchError, U + ": invalid URL: Failed to parse: bad"),
    (_VERIFY, PermanentFetchError,
     U + ": TLS certificate verification failed: [SSL: CERTIFICATE_VERIFY_FAILED] certificate verify "
         "failed (REQUESTS_CA_BUNDLE / SSL_CERT_FILE name the CA bundle to trust)"),
    (_U3.SSLError(_VERIFY), PermanentFetchError,
     U + ": TLS certificate verification failed: [SSL: CERTIFICATE_VERIFY_FAILED] certificate verify "
         "failed (REQUESTS_CA_BUNDLE / SSL_CERT_FILE name the CA bundle to trust)"),
    (_U3.SSLError("EOF in handshake"), TransientFetchError, U + ": TLS error: EOF in handshake"),
    (_U3.NewConnectionError(cast(Any, None), "refused"), TransientFetchError,
     U + ": connection error: None: refused"),
    (_U3.ConnectTimeoutError("slow"), TransientFetchError, U + ": connect timeout: slow"),
    (_U3.ReadTimeoutError(cast(Any, None), "/a.tar", "read timed out"), TransientFetchError,
     U + ": read timeout (stalled): None: read timed out"),
    (socket.timeout("timed out"), TransientFetchError, U + ": read timeout (stalled): timed out"),
    (_U3.ProxyError("no", OSError("down")), TransientFetchError, U + ": proxy error: ('no', OSError('down'))"),
    (_U3.ProtocolError("cut"), TransientFetchError, U + ": broken response body: cut"),
    (http.client.IncompleteRead(b"ab", 10), TransientFetchError,
     U + ": broken response body: IncompleteRead(2 bytes read, 10 more expected)"),
    (FileNotFoundError(errno.ENOENT, "No such file", "/d/a.tar"), PermanentFetchError, U + ": no such file: /d/a.tar"),
    (FileNotFoundError("gone"), PermanentFetchError, U + ": no such file: " + U),
    (IsADirectoryError(errno.EISDIR, "Is a directory"), PermanentFetchError, U + ": cannot read: Is a directory"),
    (PermissionError(errno.EACCES, "Permission denied"), PermanentFetchError,
     U + ": cannot read: Permission denied"),
    (ConnectionResetError(errno.ECONNRESET, "reset"), TransientFetchError,
     U + ": connection error: [Errno 104] reset"),
    (OSError(errno.EIO, "I/O error"), TransientFetchError, U + ": connection error: [Errno 5] I/O error"),
    (subprocess.SubprocessError("bad"), TransientFetchError, U + ": command failed: bad"),
    (ValueError("odd"), FetchError, U + ": unexpected ValueError: odd"),
]


@pytest.mark.parametrize("exc,cls,message", ERROR_CASES, ids=lambda v: type(v).__name__ if isinstance(v, Exception)
                         else None)
def test_error_map_rows(exc, cls, message):
    err = translate(exc, U, FETCH_ERRORS)
    assert type(err) is cls and str(err) == message


def test_every_row_of_the_error_map_is_exercised():
    used = {i for exc, _, _ in ERROR_CASES for i, rule in enumerate(FETCH_ERRORS) if rule.matches(exc)
            and all(not r.matches(exc) for r in FETCH_ERRORS[:i])}
    assert used == set(range(len(FETCH_ERRORS)))


def test_local_and_pipe_fetches_load_neither_urllib3_nor_boto3(tmp_path):
    src = tmp_path / "a.bin"
    src.write_bytes(b"y" * 100)
    code = ("import sys\nfrom resumewds.fetch import fetch_bytes\n"
            f"assert fetch_bytes({str(src)!r}) == fetch_bytes('pipe:cat {src}') == b'y' * 100\n"
            "print(sorted(m for m in ('requests', 'urllib3', 'boto3', 'botocore', 'resumewds.fetch._s3', 'torch')"
            " if m in sys.modules))\n")
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"
