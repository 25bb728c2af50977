"""s3:// against a real S3 server: moto's server mode on 127.0.0.1, started here.

Most tests go through :class:`chaos.s3proxy.S3FaultProxy` (also on
127.0.0.1) in front of moto, which injects throttling (503 SlowDown), 500s,
resets mid-body and stalls, and logs every request with its Range and
If-Match headers.  Credentials are fake and set in the environment; the
instance-metadata lookup is disabled, so nothing leaves the loopback.
"""

from __future__ import annotations

import logging
import os
import random
import subprocess
import sys
import uuid
from typing import Any, Dict, List

import pytest
from click.testing import CliRunner

pytest.importorskip("boto3")
moto_server = pytest.importorskip("moto.server")

from chaos.crash import cat_cmd, child_env, committed_samples, compare, make_dataset, run  # noqa: E402
from chaos.s3proxy import S3FaultProxy  # noqa: E402
from resumewds.cli._main import cli  # noqa: E402
from resumewds.errors import PermanentFetchError, SourceError, TransientFetchError  # noqa: E402
from resumewds.fetch import FetchConfig, client_for, fetch_bytes, fetch_to_file, translate_s3_error  # noqa: E402  # noqa: E402
from resumewds.fetch._s3 import S3Options, resolve_options  # noqa: E402
from resumewds.fetch._settings import no_sleep  # noqa: E402
from resumewds.sources._resolve import resolve_sources  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")

CREDS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}
CAT_ARGS = ["--seed", "7", "--shuffle", "--shuffle-window", "3", "--epochs", "2"]


# ---------------------------------------------------------------------------
# servers and data
# ---------------------------------------------------------------------------
@pytest.fixture(scope="module")
def moto():
    """The real S3 endpoint: moto's server mode, on 127.0.0.1."""
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    srv = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    srv.start()
    host, port = srv.get_host_and_port()
    try:
        yield f"http://{host}:{port}"
    finally:
        srv.stop()


@pytest.fixture
def proxy(moto):
    px = S3FaultProxy(moto, stall_seconds=3.0).start()
    try:
        yield px
    finally:
        px.stop()


@pytest.fixture(autouse=True)
def aws_env(monkeypatch, tmp_path, proxy):
    """Fake credentials, the proxy as AWS_ENDPOINT_URL, no profile, no IMDS, no proxies."""
    for k, v in CREDS.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    for var in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SESSION_TOKEN", "AWS_REGION", "AWS_ENDPOINT_URL_S3",
                "RESUMEWDS_S3_ENDPOINT_URL", "RESUMEWDS_S3_ANONYMOUS", "RESUMEWDS_S3_ADDRESSING_STYLE",
                "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI", "AWS_CONTAINER_CREDENTIALS_FULL_URI",
                "HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")


def direct(moto: str):
    """A boto3 client straight to moto (no proxy), for setting up buckets."""
    import boto3

    return boto3.client("s3", endpoint_url=moto, aws_access_key_id="testing", aws_secret_access_key="testing",
                        region_name="us-east-1")


@pytest.fixture
def bucket(moto) -> str:
    name = f"rwds-{uuid.uuid4().hex[:12]}"
    direct(moto).create_bucket(Bucket=name)
    return name


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """5 local shards x 40 samples plus manifest.json (relative urls), and every sample's digest."""
    root = str(tmp_path_factory.mktemp("s3data") / "data")
    return make_dataset(root, shards=5, samples=40, size_range=(1000, 8000), seed=11)


def upload(moto: str, bucket: str, root: str, prefix: str = "data/") -> Dict[str, bytes]:
    c = direct(moto)
    out = {}
    for name in sorted(os.listdir(root)):
        with open(os.path.join(root, name), "rb") as f:
            raw = f.read()
        c.put_object(Bucket=bucket, Key=prefix + name, Body=raw)
        out[name] = raw
    return out


#: for tests that count exactly one request for a permanent error: cfg()'s 0.5 s
#: read timeout is for stalls, and a slow answer from moto on a loaded machine
#: would time out and be retried (rightly), making the count 2
ONE_TRY: Dict[str, Any] = {"read_timeout": 10.0}


def cfg(**kw: Any) -> FetchConfig:
    base: Dict[str, Any] = {"connect_timeout": 2.0, "read_timeout": 0.5, "attempts": 6, "deadline": 60.0,
                            "backoff_initial": 0.01, "backoff_max": 0.05, "sleep": no_sleep}
    base.update(kw)
    return FetchConfig(**base)


def cat(*args: str) -> List[str]:
    res = CliRunner().invoke(cli, ["cat", *args])
    assert res.exit_code == 0, (res.output, res.exception)
    return res.stdout.splitlines()


class Events:
    def __init__(self) -> None:
        self.seen: List[tuple] = []

    def __call__(self, kind: str, url: str, **detail) -> None:
        self.seen.append((kind, detail))

    def kinds(self) -> List[str]:
        return [k for k, _ in self.seen]


# ---------------------------------------------------------------------------
# the transport
# ---------------------------------------------------------------------------
def test_every_fault_kind_is_retried_and_a_cut_body_resumes_under_if_match(moto, bucket, proxy, tmp_path):
    blob = random.Random(1).randbytes(400_000)
    direct(moto).put_object(Bucket=bucket, Key="d/blob.bin", Body=blob)
    path = f"/{bucket}/d/blob.bin"
    proxy.script(path, ["slowdown", "reset@0.4", "500", "503", "stall@0.5", None])
    ev = Events()
    dst = str(tmp_path / "blob.partial")
    res = fetch_to_file(f"s3://{bucket}/d/blob.bin", dst, config=cfg(), on_event=ev)
    with open(dst, "rb") as f:
        assert f.read() == blob
    import xxhash

    assert res.xxh3_64 == xxhash.xxh3_64_hexdigest(blob) and res.size == len(blob)
    assert res.attempts == 6
    assert ev.kinds() == ["fetch_start"] + ["retry"] * 5 + ["fetch_done"]
    errors = [d["error"] for k, d in ev.seen if k == "retry"]
    assert "SlowDown" in errors[0] and "connection" in errors[1] and "InternalError" in errors[2]
    assert "ServiceUnavailable" in errors[3] and "read timeout" in errors[4]
    gets = [r for r in proxy.request_log if r[0] == "GET" and r[1] == path]
    etag = direct(moto).head_object(Bucket=bucket, Key="d/blob.bin")["ETag"]
    # after the reset and the stall: ranged GETs guarded by the object's ETag, never a restart
    ranged = [r for r in gets if r[2]]
    assert len(ranged) >= 3 and all(r[3] == etag for r in ranged)
    starts = [int(r[2][len("bytes="):-1]) for r in ranged]
    assert starts == sorted(starts) and starts[0] > 0
    assert proxy.bytes_by_path[path] < 1.5 * len(blob)  # resumed, not downloaded again


def test_a_body_read_to_its_end_returns_its_connection_to_the_pool(moto, bucket, proxy, tmp_path):
    s3 = direct(moto)
    for i in range(4):
        s3.put_object(Bucket=bucket, Key=f"p{i}.bin", Body=random.Random(i).randbytes(100_000))
    c = cfg(connect_timeout=1.8)  # a client of its own
    proxy.reset_counters()
    for i in range(4):
        fetch_to_file(f"s3://{bucket}/p{i}.bin", str(tmp_path / f"p{i}"), config=c)
    assert proxy.connections == 1  # one handshake for four objects
    proxy.script(f"/{bucket}/p0.bin", ["reset@0.5"])
    os.unlink(str(tmp_path / "p0"))
    fetch_to_file(f"s3://{bucket}/p0.bin", str(tmp_path / "p0"), config=c)
    assert proxy.connections == 2  # a cut body's connection is dropped, the next one is new


def test_client_retries_are_off_one_request_per_attempt(moto, bucket, proxy, tmp_path):
    direct(moto).put_object(Bucket=bucket, Key="a.tar", Body=b"x" * 1000)
    path = f"/{bucket}/a.tar"
    proxy.script(path, ["slowdown"] * 10)
    with pytest.raises(TransientFetchError, match="SlowDown"):
        fetch_to_file(f"s3://{bucket}/a.tar", str(tmp_path / "p"), config=cfg(attempts=3))
    assert proxy.requests[path] == 3  # botocore added none of its own
    c = client_for(f"s3://{bucket}/a.tar", cfg(read_timeout=0.7, connect_timeout=1.5))
    assert c.meta.config.read_timeout == 0.7 and c.meta.config.connect_timeout == 1.5
    assert c.meta.config.retries["total_max_attempts"] == 1


def test_fetch_bytes_retries_stalls_resets_and_throttling(moto, bucket, proxy):
    doc = random.Random(7).randbytes(120_000)
    direct(moto).put_object(Bucket=bucket, Key="m.json", Body=doc)
    proxy.script(f"/{bucket}/m.json", ["stall@0.5", "reset@0.5", "slowdown", None])
    ev = Events()
    assert fetch_bytes(f"s3://{bucket}/m.json", cfg(), on_event=ev) == doc
    errors = [d["error"] for k, d in ev.seen if k == "retry"]
    assert len(errors) == 3 and "read timeout" in errors[0] and "SlowDown" in errors[2], errors


def test_retry_after_of_a_throttled_answer_is_honoured(moto, bucket, proxy, tmp_path):
    direct(moto).put_object(Bucket=bucket, Key="r.bin", Body=b"r" * 100)
    proxy.retry_after = 0.4
    proxy.script(f"/{bucket}/r.bin", ["slowdown", "503"])
    waits: List[float] = []
    res = fetch_to_file(f"s3://{bucket}/r.bin", str(tmp_path / "p"), config=cfg(sleep=waits.append))
    assert res.attempts == 3 and len(waits) == 2
    assert all(w >= 0.4 for w in waits)  # above backoff_max (0.05): the server's word wins


def test_replaced_object_restarts_from_zero(moto, bucket, proxy, tmp_path):
    old = random.Random(2).randbytes(200_000)
    new = random.Random(3).randbytes(150_000)
    s3 = direct(moto)
    s3.put_object(Bucket=bucket, Key="k.bin", Body=old)
    path = f"/{bucket}/k.bin"
    dst = str(tmp_path / "k.partial")
    proxy.script(path, ["reset@0.5"])
    with pytest.raises(TransientFetchError):
        fetch_to_file(f"s3://{bucket}/k.bin", dst, config=cfg(attempts=1))
    kept = os.path.getsize(dst)
    assert 0 < kept < len(old) and os.path.exists(dst + ".etag")
    s3.put_object(Bucket=bucket, Key="k.bin", Body=new)  # replaced while we were away
    res = fetch_to_file(f"s3://{bucket}/k.bin", dst, config=cfg())
    with open(dst, "rb") as f:
        assert f.read() == new
    assert res.attempts == 1 and res.resumed_from == 0
    gets = [r for r in proxy.request_log if r[0] == "GET" and r[1] == path]
    assert gets[1][2] == f"bytes={kept}-" and gets[1][3]  # tried to resume, If-Match said no
    assert gets[2][2] is None  # and started over


def test_a_complete_partial_is_not_downloaded_again(moto, bucket, proxy, tmp_path):
    blob = random.Random(4).randbytes(50_000)
    direct(moto).put_object(Bucket=bucket, Key="c.bin", Body=blob)
    dst = str(tmp_path / "c.partial")
    fetch_to_file(f"s3://{bucket}/c.bin", dst, config=cfg())
    before = proxy.bytes_sent
    res = fetch_to_file(f"s3://{bucket}/c.bin", dst, config=cfg())  # a kill between download and publish
    assert res.bytes == 0 and res.resumed_from == len(blob) and proxy.bytes_sent == before
    with open(dst, "rb") as f:
        assert f.read() == blob
    # replaced by a smaller object: the old partial reaches past its end (416 or 412): start over
    small = random.Random(5).randbytes(30_000)
    direct(moto).put_object(Bucket=bucket, Key="c.bin", Body=small)
    res = fetch_to_file(f"s3://{bucket}/c.bin", dst, config=cfg())
    assert res.attempts == 1 and res.resumed_from == 0
    with open(dst, "rb") as f:
        assert f.read() == small
    # and a complete partial of an object replaced by one of the same size
    same = random.Random(6).randbytes(30_000)
    direct(moto).put_object(Bucket=bucket, Key="c.bin", Body=same)
    res = fetch_to_file(f"s3://{bucket}/c.bin", dst, config=cfg())
    assert res.attempts == 1 and res.resumed_from == 0
    with open(dst, "rb") as f:
        assert f.read() == same


def test_permanent_errors_are_not_retried(moto, bucket, proxy, tmp_path, monkeypatch):
    direct(moto).put_object(Bucket=bucket, Key="ok.tar", Body=b"y" * 100)
    with pytest.raises(PermanentFetchError, match=rf"s3://{bucket}/nope.tar: S3 NoSuchKey"):
        fetch_to_file(f"s3://{bucket}/nope.tar", str(tmp_path / "p"), config=cfg(**ONE_TRY))
    assert proxy.requests[f"/{bucket}/nope.tar"] == 1
    with pytest.raises(PermanentFetchError, match="NoSuchBucket"):
        fetch_bytes("s3://no-such-bucket-here/manifest.json", cfg(**ONE_TRY))
    proxy.script(f"/{bucket}/ok.tar", ["403"])
    with pytest.raises(PermanentFetchError, match="AccessDenied"):
        fetch_to_file(f"s3://{bucket}/ok.tar", str(tmp_path / "p"), config=cfg(**ONE_TRY))
    assert proxy.requests[f"/{bucket}/ok.tar"] == 1
    with pytest.raises(PermanentFetchError, match="expected s3://BUCKET/KEY"):
        fetch_to_file(f"s3://{bucket}", str(tmp_path / "p"), config=cfg(**ONE_TRY))
    for var in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY"):
        monkeypatch.delenv(var)
    # (a client is made once per process and settings; other timeouts make a new one)
    with pytest.raises(PermanentFetchError, match="no usable AWS credentials"):
        fetch_to_file(f"s3://{bucket}/ok.tar", str(tmp_path / "p"), config=cfg(connect_timeout=1.9))


def test_unreachable_endpoint_is_transient(bucket, tmp_path, monkeypatch):
    import socket

    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()  # nothing listens there now
    monkeypatch.setenv("AWS_ENDPOINT_URL", f"http://127.0.0.1:{port}")
    ev = Events()
    with pytest.raises(TransientFetchError, match="connect"):
        fetch_to_file(f"s3://{bucket}/a.tar", str(tmp_path / "p"), config=cfg(attempts=2), on_event=ev)
    assert ev.kinds().count("retry") == 1


def test_endpoint_precedence_and_explicit_option(moto, bucket, proxy, tmp_path, monkeypatch):
    direct(moto).put_object(Bucket=bucket, Key="e.bin", Body=b"e" * 10)
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")
    monkeypatch.setenv("AWS_ENDPOINT_URL_S3", "http://127.0.0.1:10")
    assert resolve_options().endpoint_url == "http://127.0.0.1:10"
    monkeypatch.setenv("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS", "true")
    assert resolve_options().endpoint_url is None
    monkeypatch.delenv("AWS_IGNORE_CONFIGURED_ENDPOINT_URLS")
    monkeypatch.setenv("RESUMEWDS_S3_ENDPOINT_URL", "http://127.0.0.1:11")
    assert resolve_options().endpoint_url == "http://127.0.0.1:11"
    explicit = cfg(s3=S3Options(endpoint_url=proxy.url, addressing_style="path"))
    assert resolve_options(explicit) == S3Options(endpoint_url=proxy.url, region="us-east-1",
                                                  addressing_style="path")
    assert fetch_bytes(f"s3://{bucket}/e.bin", explicit) == b"e" * 10
    monkeypatch.setenv("RESUMEWDS_S3_ADDRESSING_STYLE", "sideways")
    with pytest.raises(PermanentFetchError, match="RESUMEWDS_S3_ADDRESSING_STYLE"):
        fetch_bytes(f"s3://{bucket}/e.bin", cfg())


@pytest.mark.parametrize("code,status,kind", [
    ("NoSuchKey", 404, PermanentFetchError), ("NoSuchBucket", 404, PermanentFetchError),
    ("AccessDenied", 403, PermanentFetchError), ("InvalidAccessKeyId", 403, PermanentFetchError),
    ("SlowDown", 503, TransientFetchError), ("Throttling", 400, TransientFetchError),
    ("RequestTimeout", 400, TransientFetchError), ("InternalError", 500, TransientFetchError),
    ("Whatever", 502, TransientFetchError), ("Whatever", 429, TransientFetchError),
    ("Whatever", 400, PermanentFetchError),
])
def test_error_code_table(code, status, kind):
    from botocore.exceptions import ClientError

    exc = ClientError({"Error": {"Code": code, "Message": "m"},
                       "ResponseMetadata": {"HTTPStatusCode": status, "HTTPHeaders": {}}}, "GetObject")
    got = translate_s3_error(exc, "s3://b/k")
    assert type(got) is kind and "s3://b/k" in str(got) and code in str(got)


def test_boto3_is_imported_only_when_an_s3_url_is_fetched(tmp_path):
    code = ("import sys, resumewds, resumewds.cli._main, resumewds.fetch._s3, resumewds.cache\n"
            "from resumewds.sources._resolve import resolve_sources\n"
            "m = resolve_sources('s3://bkt/data/shard-{0..3}.tar')\n"
            "assert [s.url for s in m.shards][-1] == 's3://bkt/data/shard-3.tar'\n"
            "print(sorted(x for x in ('boto3', 'botocore', 'torch') if x in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=child_env(),
                         timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "[]"


# ---------------------------------------------------------------------------
# sources and manifests in a bucket
# ---------------------------------------------------------------------------
def test_manifest_in_a_bucket_resolves_relative_urls(moto, bucket, data):
    upload(moto, bucket, data.root)
    m = resolve_sources(f"s3://{bucket}/data/manifest.json", fetch_config=cfg())
    assert [s.url for s in m.shards] == [f"s3://{bucket}/data/shard-{i:06d}.tar" for i in range(5)]
    assert m.indexed and m.digest() == resolve_sources(data.manifest).digest()
    with pytest.raises(SourceError, match="gs://bkt/a.tar: unsupported URL scheme.*storage.googleapis.com"):
        resolve_sources("gs://bkt/a.tar")
    with pytest.raises(SourceError, match="S3-compatible gateway"):
        resolve_sources("az://container/a.tar")


def test_cat_over_s3_prints_what_it_prints_over_local_files(moto, bucket, data, proxy, cache_dir):
    upload(moto, bucket, data.root)
    want = cat(data.manifest, *CAT_ARGS)
    assert len(want) == 2 * data.samples and want[: data.samples] != want[data.samples:]
    assert cat(f"s3://{bucket}/data/manifest.json", *CAT_ARGS) == want

    def shard_bytes() -> int:
        return sum(n for p, n in proxy.bytes_by_path.items() if p.endswith(".tar"))

    sent = shard_bytes()
    assert sent == sum(os.path.getsize(os.path.join(data.root, f"shard-{i:06d}.tar")) for i in range(5))
    # the verified cache: a second run downloads no shard (only the manifest again)
    assert cat(f"s3://{bucket}/data/manifest.json", *CAT_ARGS) == want
    assert shard_bytes() == sent
    # brace patterns on s3 urls (unindexed shards: indexed from the cached copies)
    local_pattern = os.path.join(data.root, "shard-{000000..000004}.tar")
    assert cat(f"s3://{bucket}/data/shard-{{000000..000004}}.tar", *CAT_ARGS) == cat(local_pattern, *CAT_ARGS)


@pytest.mark.slow  # each fault kind over s3: test_every_fault_kind_is_retried_and_a_cut_body_resumes_under_if_match
def test_cat_with_injected_faults_prints_the_same(moto, bucket, data, proxy, cache_dir):
    upload(moto, bucket, data.root)
    want = cat(data.manifest, *CAT_ARGS)
    kinds = ["slowdown", "reset@0.5", "500", "stall@0.6", "503"]
    proxy.script(f"/{bucket}/data/manifest.json", ["slowdown", "reset@0.3"])
    for i, k in enumerate(kinds):
        proxy.script(f"/{bucket}/data/shard-{i:06d}.tar", [k, "slowdown" if i % 2 else "reset@0.8"])
    got = cat(f"s3://{bucket}/data/manifest.json", *CAT_ARGS, "--timeout", "1", "--workers", "2")
    assert got == want
    assert proxy.faults == {"slowdown": 4, "reset": 5, "500": 1, "stall": 1, "503": 1}
    assert any(r[2] and r[3] for r in proxy.request_log)  # a ranged resume under If-Match


def test_corrupt_cache_entry_is_repaired_and_a_bad_object_is_a_clear_error(moto, bucket, data, proxy,
                                                                             cache_dir):
    files = upload(moto, bucket, data.root)
    url = f"s3://{bucket}/data/manifest.json"
    want = cat(data.manifest, *CAT_ARGS)
    assert cat(url, *CAT_ARGS) == want
    entries = [os.path.join(dp, f) for dp, _, fs in os.walk(cache_dir) for f in fs
               if os.path.getsize(os.path.join(dp, f)) == len(files["shard-000002.tar"])]
    assert len(entries) == 1
    with open(entries[0], "r+b") as f:
        f.seek(700)
        b = f.read(1)
        f.seek(700)
        f.write(bytes([b[0] ^ 0xFF]))
    before = dict(proxy.bytes_by_path)
    assert cat(url, *CAT_ARGS) == want
    refetched = {p for p, n in proxy.bytes_by_path.items() if n != before.get(p, 0)}
    assert refetched == {f"/{bucket}/data/shard-000002.tar", f"/{bucket}/data/manifest.json"}
    # the object in the bucket itself differs from the manifest
    bad = bytearray(files["shard-000003.tar"])
    bad[900] ^= 0xFF
    direct(moto).put_object(Bucket=bucket, Key="data/shard-000003.tar", Body=bytes(bad))
    res = CliRunner().invoke(cli, ["cat", url, *CAT_ARGS, "--cache-dir", os.path.join(cache_dir, "fresh")])
    assert res.exit_code == 1
    assert f"s3://{bucket}/data/shard-000003.tar" in res.output and "mismatch" in res.output
    assert "Traceback" not in res.output


# ---------------------------------------------------------------------------
# real processes: DataLoader workers, a journal, SIGKILL
# ---------------------------------------------------------------------------
@pytest.mark.slow  # cat over s3: test_cat_over_s3_prints_what_it_prints_over_local_files (default run)
def test_cat_subprocess_with_workers_and_journal(moto, bucket, data, proxy, tmp_path):
    upload(moto, bucket, data.root)
    want = cat(data.manifest, *CAT_ARGS)
    journal = str(tmp_path / "run.db")
    proxy.set_faults("mixed:0.3")
    proxy.max_faults_per_path = 2
    cmd = cat_cmd(f"s3://{bucket}/data/manifest.json", journal=journal, cache_dir=str(tmp_path / "cache"),
                  commit_every=10, workers=2, epochs=2, seed=7) + ["--timeout", "1"]
    p = run(cmd, env=child_env(), bound=180)
    assert p.rc == 0, p.err
    assert p.lines == want
    assert committed_samples(journal) == len(want)
    # a rerun of a finished run prints nothing more
    p2 = run(cmd, env=child_env(), bound=120)
    assert p2.rc == 0 and p2.lines == [], p2.err


def _run_and_kill(cmd: List[str], cache: str, kill_when: str, lines: int = 0, bound: float = 120.0):
    """Run ``cmd`` in its own session; SIGKILL its group when a partial download
    has bytes (``kill_when="download"``) or once it printed ``lines`` lines
    (``"lines"``); ``"end"``: let it finish.

    Returns ``(printed lines, killed)``.
    """
    import glob
    import signal
    import tempfile
    import time

    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        p = subprocess.Popen(cmd, stdout=out, stderr=err, stdin=subprocess.DEVNULL, env=child_env(),
                             start_new_session=True)
        killed = False
        t0 = time.monotonic()
        try:
            while p.poll() is None:
                if kill_when == "end":
                    hit = False
                elif kill_when == "download":
                    hit = any(os.path.getsize(f) > 0 for f in glob.glob(os.path.join(cache, "shards", "*.partial")))
                else:
                    # pread, not seek+read: ``out`` shares its file offset with the
                    # child's stdout, so a seek here would make the child overwrite
                    # what it already printed
                    size = os.fstat(out.fileno()).st_size
                    hit = os.pread(out.fileno(), size, 0).count(b"\n") >= lines
                if hit:
                    os.killpg(p.pid, signal.SIGKILL)
                    killed = True
                    break
                assert time.monotonic() - t0 < bound, "hung"
                time.sleep(0.01)
            p.wait()
        finally:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()
        if not killed:
            try:
                os.killpg(p.pid, signal.SIGKILL)  # orphaned workers, if any
            except (ProcessLookupError, PermissionError):
                pass
            err.seek(0)
            assert p.returncode == 0, err.read().decode(errors="replace")[-2000:]
        out.seek(0)
        return out.read().decode().splitlines(), killed


@pytest.mark.slow  # kill -9 of cat over http: tests/test_crash.py (default run)
def test_cat_survives_sigkill_mid_run(moto, bucket, data, proxy, tmp_path):
    """kill -9 of ``cat --journal`` inside a download, then twice mid-output;
    the committed output of the runs, joined, is the uninterrupted output."""
    upload(moto, bucket, data.root)
    want = cat(data.manifest, *CAT_ARGS)
    proxy.bytes_per_second = 100_000  # a download lasts long enough to be killed inside it
    proxy.set_faults("mixed:0.1")
    proxy.max_faults_per_path = 1
    journal = str(tmp_path / "run.db")
    cache = str(tmp_path / "cache")
    cmd = cat_cmd(f"s3://{bucket}/data/manifest.json", journal=journal, cache_dir=cache, commit_every=7,
                  workers=2, epochs=2, seed=7) + ["--timeout", "2"]
    kept: List[str] = []
    plan = [("download", 0), ("lines", 60), ("lines", 90), ("end", 0)]
    kills = 0
    for when, n in plan:
        before = committed_samples(journal)
        lines, killed = _run_and_kill(cmd, cache, when, n, bound=180)
        after = committed_samples(journal)
        assert after >= before and len(lines) >= after - before
        kept.extend(lines[: after - before])
        kills += killed
        proxy.bytes_per_second = None  # only the first kill needs slow downloads
        if not killed:
            break
    assert kills == 3
    tally = compare(want, kept, data.digests)
    assert tally.ok, tally
    assert kept == want  # nothing lost, nothing twice, same order
    # the download killed in the first run was resumed (Range + If-Match), not restarted
    assert any(r[2] and r[2] != "bytes=0-" and r[3] for r in proxy.request_log)


def test_index_of_s3_shards_then_cat_of_that_manifest(moto, bucket, data, proxy, cache_dir, tmp_path):
    upload(moto, bucket, data.root)
    out = str(tmp_path / "s3-manifest.json")
    res = CliRunner().invoke(cli, ["index", f"s3://{bucket}/data/shard-{{000000..000004}}.tar", "-o", out])
    assert res.exit_code == 0, res.output
    import json

    with open(out) as f:
        doc = json.load(f)
    assert [s["url"] for s in doc["shards"]] == [f"s3://{bucket}/data/shard-{i:06d}.tar" for i in range(5)]
    with open(data.manifest) as f:
        local = json.load(f)
    assert [(s["size"], s["xxh3_64"], s["samples"]) for s in doc["shards"]] == \
        [(s["size"], s["xxh3_64"], s["samples"]) for s in local["shards"]]
    assert cat(out, *CAT_ARGS) == cat(data.manifest, *CAT_ARGS)


def test_index_of_s3_shards_in_two_processes_and_a_v4_manifest_read_from_s3(moto, bucket, data, proxy, cache_dir,
                                                                             tmp_path):
    """``resumewds index -j 2`` over s3 (each process fetching through the fetch core) into a
    version-4 manifest; that manifest and its index files in a bucket: each index comes
    through the cache when its shard is first read, and cat prints what it prints locally."""
    upload(moto, bucket, data.root)
    out = str(tmp_path / "v4" / "m.json")
    os.makedirs(os.path.dirname(out))
    res = CliRunner().invoke(cli, ["index", f"s3://{bucket}/data/shard-{{000000..000004}}.tar", "-o", out,
                                   "-j", "2", "--offsets", "index"])
    assert res.exit_code == 0, res.output
    with open(out, "rb") as f:
        direct(moto).put_object(Bucket=bucket, Key="v4/m.json", Body=f.read())
    upload(moto, bucket, out + ".index", prefix="v4/m.json.index/")
    assert cat(f"s3://{bucket}/v4/m.json", *CAT_ARGS) == cat(data.manifest, *CAT_ARGS)
    assert sorted(n for p, n in proxy.requests.items() if p.endswith(".idx")) == [1] * 5, proxy.requests


def test_explicit_endpoint_reaches_dataloader_workers(moto, bucket, data, proxy, cache_dir, monkeypatch):
    """FetchConfig(s3=S3Options(...)) pickles into worker processes and beats AWS_ENDPOINT_URL."""
    import pickle

    from resumewds import WebDataset, WebLoader
    from resumewds.cli._main import cat_line

    upload(moto, bucket, data.root)
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing there
    fc = cfg(s3=S3Options(endpoint_url=proxy.url, addressing_style="path"))
    assert pickle.loads(pickle.dumps(fc)).s3 == fc.s3
    ds = WebDataset(f"s3://{bucket}/data/manifest.json", seed=7, shuffle=True, shuffle_window=3, fetch=fc)
    loader = WebLoader(ds, batch_size=None, num_workers=2)
    try:
        got = [cat_line(s) for s in loader]
    finally:
        loader.close()
    assert got == cat(data.manifest, *CAT_ARGS)[: data.samples]
    assert sum(n for p, n in proxy.bytes_by_path.items() if p.endswith(".tar")) > 0


def test_without_boto3_an_s3_url_is_a_one_line_error(tmp_path):
    code = ("import sys\nsys.modules['boto3'] = None  # as if the [s3] extra were not installed\n"
            "from resumewds.cli._main import main\nmain(['cat', 's3://bkt/data/manifest.json'])\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                         env=child_env(RESUMEWDS_CACHE_DIR=str(tmp_path / "cache")))
    assert out.returncode == 1
    assert "Traceback" not in out.stderr
    assert "s3://bkt/data/manifest.json" in out.stderr and "pip install 'resumewds[s3]'" in out.stderr


def test_prefetch_fills_the_cache_ahead_of_a_run(moto, bucket, data, proxy, cache_dir):
    upload(moto, bucket, data.root)
    url = f"s3://{bucket}/data/manifest.json"
    res = CliRunner().invoke(cli, ["prefetch", url, "--no-progress"])
    assert res.exit_code == 0, res.output
    shard_bytes = sum(n for p, n in proxy.bytes_by_path.items() if p.endswith(".tar"))
    assert shard_bytes == sum(os.path.getsize(os.path.join(data.root, f"shard-{i:06d}.tar")) for i in range(5))
    assert cat(url, *CAT_ARGS) == cat(data.manifest, *CAT_ARGS)
    assert sum(n for p, n in proxy.bytes_by_path.items() if p.endswith(".tar")) == shard_bytes


# ---------------------------------------------------------------------------
# the fetch hardening holds for s3 too: one shared budget, the deadline inside
# an attempt and over Retry-After, a minimum rate, max_bytes, HTML pages,
# corrupt and incomplete downloads spending the budget, GOPEN_VERBOSE
# ---------------------------------------------------------------------------
def _in_thread(fn, bound: float):
    """Run ``fn`` in a thread; (finished, result or exception) after at most ``bound`` s."""
    import threading

    box: dict = {}

    def go():
        try:
            box["value"] = fn()
        except BaseException as exc:
            box["error"] = exc

    t = threading.Thread(target=go, daemon=True)
    t.start()
    t.join(bound)
    return (not t.is_alive()), box.get("error", box.get("value"))


def test_trickling_body_fails_the_attempt_and_is_retried(moto, bucket, proxy, tmp_path):
    blob = random.Random(8).randbytes(60_000)
    direct(moto).put_object(Bucket=bucket, Key="t.bin", Body=blob)
    path = f"/{bucket}/t.bin"
    proxy.trickle_bytes_per_second = 400  # every read arrives well within read_timeout
    proxy.script(path, ["trickle", None])
    ev = Events()
    c = cfg(read_timeout=5.0, min_rate=20_000, rate_window=0.5)
    done, res = _in_thread(lambda: fetch_to_file(f"s3://{bucket}/t.bin", str(tmp_path / "p"), config=c,
                                                 on_event=ev), 60)
    assert done and not isinstance(res, BaseException), res  # a trickle alone would take 150 s
    with open(str(tmp_path / "p"), "rb") as f:
        assert f.read() == blob
    errors = [d["error"] for k, d in ev.seen if k == "retry"]
    assert len(errors) == 1 and "too slow" in errors[0] and "RESUMEWDS_FETCH_MIN_RATE" in errors[0], errors


def test_retry_after_past_the_deadline_gives_up_at_once(moto, bucket, proxy, tmp_path):
    direct(moto).put_object(Bucket=bucket, Key="ra.bin", Body=b"r" * 100)
    path = f"/{bucket}/ra.bin"
    proxy.retry_after = 3600
    proxy.script(path, ["slowdown"] * 5)
    waits: List[float] = []
    with pytest.raises(TransientFetchError, match=r"SlowDown.*retry after 3600s, beyond what is left of the 30s"):
        fetch_to_file(f"s3://{bucket}/ra.bin", str(tmp_path / "p"), config=cfg(deadline=30.0, sleep=waits.append))
    assert proxy.requests[path] == 1 and waits == []  # no wait, no second attempt


def test_the_deadline_holds_inside_one_attempt(moto, bucket, tmp_path):
    blob = random.Random(9).randbytes(200_000)
    direct(moto).put_object(Bucket=bucket, Key="s.bin", Body=blob)
    with S3FaultProxy(moto, stall_seconds=60.0) as px:
        px.script(f"/{bucket}/s.bin", ["stall@0.5"] * 10)
        # min_rate=0: the deadline counts from the first attempt
        c = cfg(read_timeout=30.0, deadline=1.5, min_rate=0, s3=S3Options(endpoint_url=px.url))
        done, res = _in_thread(lambda: fetch_to_file(f"s3://{bucket}/s.bin", str(tmp_path / "p"), config=c), 20)
        # without the deadline inside the attempt: the 30 s read timeout, then a 60 s stall
        assert done and isinstance(res, TransientFetchError), res
        # each attempt's timeouts are cut to what is left (a second, shorter attempt may fit)
        assert 1 <= px.requests[f"/{bucket}/s.bin"] <= 4
        # with a min_rate (the default) the deadline runs from the last progress: each stalled
        # attempt is still cut at the deadline (not the 30 s read timeout), and the resumes finish it
        px.script(f"/{bucket}/s.bin", ["stall@0.5"] * 4)
        c = cfg(read_timeout=30.0, deadline=1.5, s3=S3Options(endpoint_url=px.url))
        done, res = _in_thread(lambda: fetch_to_file(f"s3://{bucket}/s.bin", str(tmp_path / "q"), config=c), 25)
        assert done and not isinstance(res, Exception), res
        assert open(str(tmp_path / "q"), "rb").read() == blob


def test_prefetch_and_reader_share_one_budget(moto, bucket, proxy, tmp_path, data):
    import time

    from resumewds.cache import ShardStore
    from resumewds.manifest._manifest import ShardInfo

    with open(os.path.join(data.root, "shard-000000.tar"), "rb") as f:
        raw = f.read()
    direct(moto).put_object(Bucket=bucket, Key="b.tar", Body=raw)
    path = f"/{bucket}/b.tar"
    proxy.script(path, ["500"] * 100)
    import xxhash

    shard = ShardInfo(url=f"s3://{bucket}/b.tar", size=len(raw), xxh3_64=xxhash.xxh3_64_hexdigest(raw))
    st = ShardStore(cache_dir=str(tmp_path / "cache"), fetch=cfg(attempts=3))
    try:
        st.prefetch([shard], depth=1)
        for _ in range(1000):
            if st.counters["prefetch_error"]:
                break
            time.sleep(0.01)
        assert st.counters["prefetch_error"] == 1
        with pytest.raises(TransientFetchError, match="InternalError"):
            st.acquire(shard)
        assert proxy.requests[path] == 3  # not 3 by the prefetch + 3 by the reader
        proxy._scripts.clear()  # the next read has a budget of its own
        with st.acquire(shard) as ls:
            with open(ls.path, "rb") as f:
                assert f.read() == raw
    finally:
        st.close()


def test_corrupt_and_incomplete_downloads_spend_the_budget(moto, bucket, proxy, tmp_path, data):
    import xxhash

    from resumewds.cache import ShardStore
    from resumewds.errors import ChecksumMismatch, ShardFormatError
    from resumewds.manifest._manifest import ShardInfo

    with open(os.path.join(data.root, "shard-000001.tar"), "rb") as f:
        raw = f.read()
    bad = bytearray(raw)
    bad[700] ^= 0xFF
    s3 = direct(moto)
    s3.put_object(Bucket=bucket, Key="c.tar", Body=bytes(bad))
    st = ShardStore(cache_dir=str(tmp_path / "cache"), fetch=cfg(attempts=4))
    shard = ShardInfo(url=f"s3://{bucket}/c.tar", size=len(raw), xxh3_64=xxhash.xxh3_64_hexdigest(raw))
    with pytest.raises(ChecksumMismatch):
        st.ensure(shard)
    assert proxy.requests[f"/{bucket}/c.tar"] == 4  # the fetch budget decides
    # no checksum known: the download must be a complete tar (cut inside a member)
    s3.put_object(Bucket=bucket, Key="u.tar", Body=raw[: len(raw) // 2 + 100])
    with pytest.raises(ShardFormatError, match=f"download of s3://{bucket}/u.tar"):
        st.ensure(ShardInfo(url=f"s3://{bucket}/u.tar"))
    assert proxy.requests[f"/{bucket}/u.tar"] == 4
    assert not os.path.exists(st.entry_path(f"s3://{bucket}/u.tar"))
    s3.put_object(Bucket=bucket, Key="u.tar", Body=raw)
    with open(st.ensure(ShardInfo(url=f"s3://{bucket}/u.tar")), "rb") as f:
        assert f.read() == raw
    st.close()


def test_an_object_replaced_between_two_requests_is_named_by_every_reader(moto, bucket, proxy, tmp_path, data):
    """The object is replaced between the first reader's two requests (the first cut
    at half); that reader, and the next one on the same cache (another DataLoader
    worker), which only ever gets the new object, both say it changed."""
    import xxhash

    from resumewds.cache import ShardStore
    from resumewds.errors import ChecksumMismatch
    from resumewds.manifest._manifest import ShardInfo

    with open(os.path.join(data.root, "shard-000001.tar"), "rb") as f:
        raw = f.read()
    new = bytearray(raw)
    new[700] ^= 0xFF
    s3 = direct(moto)
    s3.put_object(Bucket=bucket, Key="r.tar", Body=raw)
    path = f"/{bucket}/r.tar"
    proxy.script(path, ["truncate@0.5"])
    proxy.at_request(path, 1, lambda: s3.put_object(Bucket=bucket, Key="r.tar", Body=bytes(new)))
    shard = ShardInfo(url=f"s3://{bucket}/r.tar", size=len(raw), xxh3_64=xxhash.xxh3_64_hexdigest(raw))
    for _ in range(2):
        with pytest.raises(ChecksumMismatch, match="changed on the server"):
            ShardStore(cache_dir=str(tmp_path / "cache"), fetch=cfg()).ensure(shard)
    assert proxy.requests[path] == 4  # cut, If-Match refused, the new object; the next reader: once


def test_max_bytes_html_pages_and_gopen_verbose(moto, bucket, proxy, tmp_path, capfd):
    s3 = direct(moto)
    s3.put_object(Bucket=bucket, Key="big.json", Body=b"{" + b" " * 5000 + b"}")
    with pytest.raises(PermanentFetchError, match=r"big.json: larger than the 1000 bytes accepted"):
        fetch_bytes(f"s3://{bucket}/big.json", cfg(**ONE_TRY), max_bytes=1000)
    assert proxy.requests[f"/{bucket}/big.json"] == 1
    s3.put_object(Bucket=bucket, Key="page.tar", Body=b"<!DOCTYPE html><html><body>MinIO Console</body></html>",
                  ContentType="text/html")
    with pytest.raises(PermanentFetchError, match=r"page.tar: .*HTML page.*text/html.*S3 API endpoint"):
        fetch_to_file(f"s3://{bucket}/page.tar", str(tmp_path / "p"), config=cfg(**ONE_TRY))
    assert proxy.requests[f"/{bucket}/page.tar"] == 1 and not os.path.exists(str(tmp_path / "p"))
    s3.put_object(Bucket=bucket, Key="v.bin", Body=b"v" * 1234)
    capfd.readouterr()
    fetch_to_file(f"s3://{bucket}/v.bin", str(tmp_path / "v"), config=cfg(log_opens=True))
    err = capfd.readouterr().err
    assert f"[gopen] s3://{bucket}/v.bin open" in err and f"[gopen] s3://{bucket}/v.bin closed: 1234 bytes" in err


def test_s3_settings_are_read_by_config(monkeypatch):
    from resumewds import config

    assert "RESUMEWDS_S3_ENDPOINT_URL" in config.all_variables()
    monkeypatch.setenv("RESUMEWDS_S3_ANONYMOUS", "perhaps")
    with pytest.raises(ValueError, match="RESUMEWDS_S3_ANONYMOUS"):
        S3Options.from_env()
    monkeypatch.setenv("RESUMEWDS_S3_ANONYMOUS", "1")
    monkeypatch.setenv("RESUMEWDS_S3_ADDRESSING_STYLE", " Path ")
    monkeypatch.setenv("AWS_REGION", "eu-west-3")
    o = S3Options.from_env()
    assert (o.anonymous, o.addressing_style, o.region) == (True, "path", "eu-west-3")
    with open(os.path.join(os.path.dirname(config.__file__), "fetch", "_s3.py")) as f:  # the transport
        src = f.read()
    assert "os.environ" not in src and "getenv(" not in src  # config is the one place


def test_verify_replaces_an_incomplete_cached_copy_without_checksum(moto, bucket, proxy, tmp_path, data):
    """The cache's tar check of unchecksummed copies applies to s3:// entries too."""
    import xxhash

    from resumewds.cache import ShardStore
    from resumewds.manifest._manifest import ShardInfo

    with open(os.path.join(data.root, "shard-000002.tar"), "rb") as f:
        raw = f.read()
    direct(moto).put_object(Bucket=bucket, Key="v.tar", Body=raw)
    shard = ShardInfo(url=f"s3://{bucket}/v.tar")
    st = ShardStore(cache_dir=str(tmp_path / "cache"), fetch=cfg())
    st._ensure_dirs()
    base = st.entry_path(shard.url)
    cut = raw[: len(raw) // 2 + 100]  # kept by an older version: not a complete tar
    with open(base, "wb") as f:
        f.write(cut)
    st._write_meta(base, shard.url, xxhash.xxh3_64_hexdigest(cut), synced=True)
    [(_, ok, err)] = st.verify_all([shard])
    assert ok and err is None
    with open(base, "rb") as f:
        assert f.read() == raw
    assert proxy.requests[f"/{bucket}/v.tar"] == 1
    st.close()
