"""Sparse partial downloads: every byte of a cold epoch fetched once.

A real FaultServer on 127.0.0.1 serves v3 shards (per-sample digests).  A
cold epoch reads its first samples by HTTP Range (verified) while the
background download fills each shard; the samples fetched by range are
written into the shard's sparse partial (``<entry>.sparse``, recorded in
``<entry>.sparse.map``) and the download asks only for the rest.  The
server's byte counter is compared with the data set's bytes; the delivered
sequence with an uninterrupted warm run.
"""

from __future__ import annotations

import os

import pytest

import resumewds as rw
from chaos.faultserver import FaultServer
from resumewds import synth
from resumewds.cache import sparse

pytestmark = pytest.mark.usefixtures("cache_dir")

SHARDS = 4
SAMPLES = 300


@pytest.fixture
def v3(tmp_path):
    root = tmp_path / "srv"
    synth.write_shards(str(root), shards=SHARDS, samples=SAMPLES, size_range=(2000, 8000), seed=3)
    rw.build_manifest(str(root / f"shard-{{000000..{SHARDS - 1:06d}}}.tar"), str(root / "manifest.json"),
                      digests=True)
    return str(root)


def _data_bytes(root):
    return sum(os.path.getsize(os.path.join(root, n)) for n in os.listdir(root) if n.endswith(".tar"))


def _keys(url, cache, **kw):
    ds = rw.WebDataset(url + "manifest.json", cache_dir=cache, seed=7, **kw)
    try:
        got = [(s["__key__"], bytes(s["bin"])) for s in ds]
        rr = ds._reader.ranged if ds._reader is not None else None
        return got, dict(rr.counters) if rr is not None else {}
    finally:
        ds.close()


def _tar_bytes(srv):
    return sum(n for p, n in srv.bytes_by_path.items() if p.endswith(".tar"))


@pytest.mark.parametrize("shuffle", [True, False])
def test_a_cold_epoch_fetches_each_byte_once(v3, tmp_path, shuffle):
    data = _data_bytes(v3)
    with FaultServer(v3) as srv:
        url = srv.url.rstrip("/") + "/"
        warm, _ = _keys(url, str(tmp_path / "w"), shuffle=shuffle, ranged_reads=False)
        warm, _ = _keys(url, str(tmp_path / "w"), shuffle=shuffle, ranged_reads=False)
    # per connection as slow as an object store's stream: the reader outruns the downloads
    with FaultServer(v3, bytes_per_second=4_000_000) as srv:
        cold, counters = _keys(srv.url.rstrip("/") + "/", str(tmp_path / "cold"), shuffle=shuffle)
        sent = _tar_bytes(srv)
    assert cold == warm
    assert counters["range_bytes"] > 0 and counters["range_kept"] > 0  # ranges did happen, and were kept
    assert sent <= 1.02 * data, f"{sent} bytes sent for {data} bytes of shards ({sent / data:.3f}x)"
    shards_dir = tmp_path / "cold" / "shards"
    names = os.listdir(shards_dir)
    assert len([n for n in names if n.endswith(".meta")]) == SHARDS  # every shard published, verified
    assert not [n for n in names if n.endswith((".sparse", ".sparse.map", ".partial"))]
