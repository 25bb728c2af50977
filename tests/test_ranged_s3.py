"""Verified ranged reads over s3://: moto's server mode on 127.0.0.1
behind the S3 fault proxy; ranged GetObject through the s3 transport's client."""

from __future__ import annotations

import logging
import os
import uuid

import pytest

pytest.importorskip("boto3")
moto_server = pytest.importorskip("moto.server")

import resumewds as rw  # noqa: E402
from chaos.s3proxy import S3FaultProxy  # noqa: E402
from resumewds import synth  # noqa: E402
from resumewds.tar import _io as tario  # noqa: E402

CREDS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1"}


@pytest.fixture(scope="module")
def moto():
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
def aws_env(monkeypatch, tmp_path, proxy, cache_dir):
    for k, v in CREDS.items():
        monkeypatch.setenv(k, v)
    monkeypatch.setenv("AWS_ENDPOINT_URL", proxy.url)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
    for var in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SESSION_TOKEN", "AWS_REGION", "AWS_ENDPOINT_URL_S3",
                "RESUMEWDS_S3_ENDPOINT_URL", "RESUMEWDS_S3_ANONYMOUS", "RESUMEWDS_S3_ADDRESSING_STYLE"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("RESUMEWDS_S3_ADDRESSING_STYLE", "path")
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")


def _bucket(moto, root):
    import boto3

    c = boto3.client("s3", endpoint_url=moto, aws_access_key_id="testing", aws_secret_access_key="testing",
                     region_name="us-east-1")
    name = f"rwds-{uuid.uuid4().hex[:12]}"
    c.create_bucket(Bucket=name)
    for n in sorted(os.listdir(root)):
        with open(os.path.join(root, n), "rb") as f:
            c.put_object(Bucket=name, Key="data/" + n, Body=f.read())
    return name


def _epoch(url, cache):
    ds = rw.WebDataset(url, cache_dir=cache, seed=4, shuffle=True)
    try:
        return [(s["__key__"], s["__index__"], bytes(s["bin"])) for s in ds]
    finally:
        ds.close()


def _shard_gets(proxy, ranged, bucket):
    """GetObjects of the bucket's shards the proxy saw, with a Range header (``ranged``) or without."""
    return [r for r in proxy.request_log if r[0] == "GET" and r[1].startswith(f"/{bucket}/") and r[1].endswith(".tar")
            and bool(r[2]) == ranged]


def test_s3_samples_are_read_by_verified_ranges(moto, proxy, tmp_path, monkeypatch):
    root = str(tmp_path / "data")
    synth.write_shards(root, shards=3, samples=50, size_range=(1000, 6000), seed=2)
    rw.build_manifest(os.path.join(root, "shard-{000000..000002}.tar"), os.path.join(root, "manifest.json"),
                      digests=True)
    bucket = _bucket(moto, root)
    url = f"s3://{bucket}/data/manifest.json"
    _epoch(url, str(tmp_path / "warm"))
    warm = _epoch(url, str(tmp_path / "warm"))
    assert len(warm) == 150
    monkeypatch.setenv("RESUMEWDS_CACHE_SIZE", "1")  # nothing is prefetched: every sample by range
    for i in range(3):
        proxy.script(f"/{bucket}/data/shard-{i:06d}.tar", ["reset@0.5", "slowdown"])
    proxy.reset_counters()
    cold = _epoch(url, str(tmp_path / "cold"))
    assert proxy.faults["reset"] == 3 and proxy.faults["slowdown"] == 3  # each retried
    assert cold == warm
    assert len(_shard_gets(proxy, True, bucket)) >= 3 and not _shard_gets(proxy, False, bucket)  # ranged only


def test_s3_invalid_range_falls_back_to_the_whole_object(moto, proxy, tmp_path, monkeypatch):
    """A ranged GetObject answered 416 InvalidRange: the shard is read whole (one
    GetObject without Range), not failed."""
    root = str(tmp_path / "data")
    synth.write_shards(root, shards=2, samples=40, size_range=(1000, 6000), seed=3)
    rw.build_manifest(os.path.join(root, "shard-{000000..000001}.tar"), os.path.join(root, "manifest.json"),
                      digests=True)
    bucket = _bucket(moto, root)
    url = f"s3://{bucket}/data/manifest.json"
    monkeypatch.setenv("RESUMEWDS_CACHE_SIZE", "1")  # nothing is prefetched: every read starts as a range
    for i in range(2):
        proxy.script(f"/{bucket}/data/shard-{i:06d}.tar", ["range416"] * 50)
    got = _epoch(url, str(tmp_path / "cold"))
    assert proxy.faults["range416"] >= 2
    truth = sorted((s["__key__"], bytes(s["bin"])) for n in sorted(os.listdir(root)) if n.endswith(".tar")
                   for s in tario.iter_samples_file(os.path.join(root, n)))
    assert sorted((k, b) for k, _, b in got) == truth


def test_s3_shards_fill_sparse_partials_around_the_ranged_reads(moto, proxy, tmp_path, monkeypatch):
    """Ranged GetObject for the samples and for the background download's gaps: the
    bytes the ranged reads kept are not downloaded again (the server's count), the epoch is exact."""
    root = str(tmp_path / "data")
    synth.write_shards(root, shards=3, samples=200, size_range=(2000, 8000), seed=5)
    rw.build_manifest(os.path.join(root, "shard-{000000..000002}.tar"), os.path.join(root, "manifest.json"),
                      digests=True)
    data = sum(os.path.getsize(os.path.join(root, n)) for n in os.listdir(root) if n.endswith(".tar"))
    bucket = _bucket(moto, root)
    url = f"s3://{bucket}/data/manifest.json"
    _epoch(url, str(tmp_path / "warm"))
    warm = _epoch(url, str(tmp_path / "warm"))
    proxy.reset_counters()
    cold = _epoch(url, str(tmp_path / "cold"))
    sent = sum(n for p, n in proxy.bytes_by_path.items() if p.startswith(f"/{bucket}/") and p.endswith(".tar"))
    assert cold == warm
    assert len(_shard_gets(proxy, True, bucket)) > 3  # the ranged reads and the downloads' pieces
    assert sent <= 1.02 * data, (sent, data)  # none of the ranged reads' bytes downloaded again
    names = os.listdir(tmp_path / "cold" / "shards")
    assert len([n for n in names if n.endswith(".meta")]) == 3
    assert not [n for n in names if n.endswith((".sparse", ".sparse.map", ".partial"))]
