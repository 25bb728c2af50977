"""No password or presigned signature of a shard URL is ever recorded or
printed: a run over a real HTTP server with ``http://user:pass@...?...&
X-Amz-Signature=...`` URLs, then every file it wrote (journal, cache, HTML
report) and every line it printed (``cat``, ``status``, ``status --json``,
errors) is searched for the secrets.  Also: the cache is private to the
user, and a rotated signature finds the shards already cached.
"""

from __future__ import annotations

import json
import logging
import os
import stat
import subprocess
import sys

import pytest

from resumewds.errors import PermanentFetchError
from resumewds.redact import cache_key_url, redact_text, redact_url

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SECRETS = ("s3cretPW", "SIGSECRET", "CREDSECRET", "TOKSECRET", "GOOGSECRET")


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    env["NO_PROXY"] = "127.0.0.1,localhost"
    return env


def _cli(*args, check=True):
    p = subprocess.run([sys.executable, "-m", "resumewds", *args], env=_env(), capture_output=True, text=True,
                       timeout=300)
    if check:
        assert p.returncode == 0, p.stderr
    return p


def _signed(url: str, n: int) -> str:
    return (url.replace("http://", "http://alice:s3cretPW@") + f"?versionId=1&X-Amz-Algorithm=AWS4-HMAC-SHA256"
            f"&X-Amz-Credential=CREDSECRET%2F20250101%2Fus-east-1&X-Amz-Date=2025010{n}T000000Z"
            f"&X-Amz-Expires=3600&X-Amz-Security-Token=TOKSECRET&X-Amz-Signature=SIGSECRET{n}"
            f"&X-Goog-Signature=GOOGSECRET")


def _manifest(tmp_path, root, srv, n: int, name: str, missing: bool = False) -> str:
    from resumewds.dataset import build_manifest
    from resumewds.synth import write_shards

    if not os.path.exists(os.path.join(root, "shard-000000.tar")):
        write_shards(root, shards=4, samples=20, size_range=(10, 200), seed=3)
    paths = sorted(os.path.join(root, f) for f in os.listdir(root) if f.endswith(".tar"))
    local = str(tmp_path / "local-manifest.json")
    build_manifest(paths, local)
    with open(local) as f:
        doc = json.load(f)
    for sh in doc["shards"]:
        base = os.path.basename(sh["url"])
        sh["url"] = _signed(srv.url + (("missing-" + base) if missing else base), n)
    out = str(tmp_path / name)
    with open(out, "w") as f:
        json.dump(doc, f)
    return out


def _files_under(*dirs):
    for d in dirs:
        for dirpath, _, names in os.walk(d):
            for n in names:
                yield os.path.join(dirpath, n)


def _assert_clean(what: str, text: str) -> None:
    for s in SECRETS:
        assert s not in text, f"{s} in {what}: ...{text[max(0, text.find(s) - 200):text.find(s) + 50]}..."


def test_redact_forms():
    url = _signed("http://127.0.0.1:1/a.tar", 1)
    red = redact_url(url)
    _assert_clean("redact_url", red)
    assert red.startswith("http://***@127.0.0.1:1/a.tar?versionId=1&") and "X-Amz-Signature=REDACTED" in red
    assert redact_url(red) == red
    _assert_clean("html", redact_text(url.replace("&", "&amp;")))
    _assert_clean("quoted", redact_text(json.dumps({"u": url})))
    assert cache_key_url(url) == "http://127.0.0.1:1/a.tar?versionId=1" == cache_key_url(_signed(
        "http://127.0.0.1:1/a.tar", 2))
    assert redact_url("http://h/a.tar?x=1") == "http://h/a.tar?x=1" == cache_key_url("http://h/a.tar?x=1")
    exc = PermanentFetchError(f"{url}: HTTP 403", url)
    _assert_clean("str(error)", str(exc) + repr(exc))
    assert exc.url == url  # the field keeps what was given, for code that retries it


def test_log_lines_are_redacted(caplog):
    with caplog.at_level(logging.WARNING, logger="resumewds"):
        logging.getLogger("resumewds").warning("skipping shard %s: %s", _signed("http://h/a.tar", 1), "boom")
    _assert_clean("log", caplog.text)
    assert "skipping shard http://***@h/a.tar" in caplog.text


def test_no_secret_is_recorded_or_printed(served, tmp_path):
    root, srv = served
    manifest = _manifest(tmp_path, root, srv, 1, "signed.json")
    work = tmp_path / "work"
    work.mkdir()
    journal, cache = str(work / "run.db"), str(work / "cache")
    html = str(work / "report.html")
    printed = []
    p = _cli("cat", manifest, "--journal", journal, "--cache-dir", cache, "--commit-every", "7",
             "--workers", "2", "--shuffle", "--stats")
    assert len(p.stdout.splitlines()) == 80
    printed += [("cat stdout", p.stdout), ("cat stderr", p.stderr)]
    for args in (("status", journal), ("status", journal, "--json")):
        q = _cli(*args)
        printed += [(" ".join(args[:1] + args[2:]), q.stdout + q.stderr)]
    r = _cli("report", journal, "-o", html, check=False)
    if r.returncode != 0:
        assert "plotly" in r.stderr, r.stderr  # the optional dependency is missing: the rest still counts
    printed.append(("report", r.stdout + r.stderr))
    # a failing run prints the URL it could not fetch
    bad = _manifest(tmp_path, root, srv, 1, "missing.json", missing=True)
    f = _cli("cat", bad, "--journal", str(work / "bad.db"), "--cache-dir", cache, check=False)
    assert f.returncode != 0 and "Error:" in f.stderr and "***@127.0.0.1" in f.stderr, f.stderr
    printed.append(("failing cat", f.stdout + f.stderr))
    s = _cli("cat", bad, "--cache-dir", cache, "--on-error", "skip", "--workers", "0", check=False)
    printed.append(("skipping cat", s.stdout + s.stderr))
    for what, text in printed:
        _assert_clean(what, text)
    written = list(_files_under(str(work)))
    assert any(w.endswith(".meta") for w in written) and journal in written
    for path in written:
        with open(path, "rb") as fh:
            _assert_clean(path, fh.read().decode("latin-1"))
    # the shards really were fetched with their credentials
    assert all(srv.requests[f"/shard-{i:06d}.tar"] == 1 for i in range(4)), srv.requests
    # the cache is private to the user
    for path in written:
        if path.startswith(cache) and path.endswith((".meta", ".tar")):
            assert stat.S_IMODE(os.stat(path).st_mode) & 0o077 == 0, path
    assert stat.S_IMODE(os.stat(cache).st_mode) == 0o700


def test_rotated_signature_finds_the_cached_shards(served, tmp_path):
    root, srv = served
    cache = str(tmp_path / "cache")
    for n in (1, 2):
        manifest = _manifest(tmp_path, root, srv, n, f"signed{n}.json")
        p = _cli("cat", manifest, "--cache-dir", cache, "--workers", "0")
        assert len(p.stdout.splitlines()) == 80
    entries = [f for f in os.listdir(os.path.join(cache, "shards")) if f.endswith(".tar")]
    assert len(entries) == 4, entries
    assert all(srv.requests[f"/shard-{i:06d}.tar"] == 1 for i in range(4)), srv.requests


@pytest.mark.parametrize("url", ["http://h/a.tar", "s3://b/k.tar", "/local/a.tar", "pipe:curl -s http://h/a"])
def test_plain_urls_are_unchanged(url):
    assert redact_url(url) == url == cache_key_url(url)
