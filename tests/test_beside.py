"""A manifest.json beside shards named one by one (resumewds.sources), and the manifest
resolved before a WebLoader's workers fork."""

from __future__ import annotations

import logging
import os
import time
from typing import List

import pytest
from torch.utils.data import DataLoader

import resumewds as rw
from chaos.faultserver import FaultServer
from resumewds.synth import write_shards

pytestmark = pytest.mark.usefixtures("cache_dir")


def _pipeline(urls: List[str]) -> rw.DataPipeline:
    return rw.DataPipeline(rw.SimpleShardList(urls), rw.shuffle(100), rw.split_by_worker,
                           rw.tarfile_to_samples(), rw.shuffle(1000))


def _keys(it) -> List[str]:
    return [x["__key__"] for x in it]


@pytest.fixture
def served_shards(tmp_path):
    """4 shards of ~0.5 MB with a manifest.json beside them, on a server at 1 MB/s per connection."""
    root = str(tmp_path / "srv")
    paths = write_shards(root, shards=4, samples=24, size_range=(15000, 25000))
    rw.build_manifest(paths, os.path.join(root, "manifest.json"), digests=True)
    srv = FaultServer(root, bytes_per_second=1_000_000)
    srv.start()
    try:
        yield paths, srv, [f"http://{srv.host}:{srv.port}/{os.path.basename(p)}" for p in paths]
    finally:
        srv.stop()


def _shard_bytes(srv: FaultServer) -> int:
    return sum(n for path, n in srv.bytes_by_path.items() if path.endswith(".tar"))


def test_pipeline_takes_the_manifest_beside_instead_of_downloading_every_shard(served_shards):
    paths, srv, urls = served_shards
    total = sum(os.path.getsize(p) for p in paths)
    it = iter(_pipeline(urls))
    next(it)
    sent = _shard_bytes(srv)
    assert sent < total / 2, (sent, total)  # indexing the shards itself downloads all of them first
    assert "/manifest.json" in srv.request_log
    # before the first sample: the manifest beside the shards and the first step's ranges
    # (the first sample's own first), no whole-shard GET
    assert all(r is not None for p, r in srv.range_log if p.endswith(".tar")), srv.range_log


def test_pipeline_with_the_manifest_beside_delivers_the_sequence_of_indexing(served_shards, monkeypatch,
                                                                             tmp_path):
    paths, srv, urls = served_shards
    found = _keys(_pipeline(urls))
    assert "/manifest.json" in srv.request_log
    bare = tmp_path / "bare"  # the same shards with no manifest beside them: indexed from their bytes
    bare.mkdir()
    for p in paths:
        os.link(p, bare / os.path.basename(p))
    monkeypatch.setenv("RESUMEWDS_CACHE_DIR", str(tmp_path / "cache2"))
    with FaultServer(str(bare)) as other:
        indexed = _keys(_pipeline([f"http://{other.host}:{other.port}/{os.path.basename(p)}" for p in paths]))
        assert other.requests.get("/manifest.json", 0) == 1 and "/manifest.json" not in other.bytes_by_path
    assert len(found) == 4 * 24 and found == indexed


def test_a_manifest_that_does_not_list_the_shards_is_ignored(tmp_path, caplog):
    paths = write_shards(str(tmp_path / "d"), shards=3, samples=10)
    rw.build_manifest(paths[:2], str(tmp_path / "d" / "manifest.json"))  # the third shard is not in it
    ref = _keys(rw.WebDataset(rw.index_manifest(rw.Manifest([rw.ShardInfo(url=p) for p in paths])), seed=3,
                              shuffle=True))
    with caplog.at_level(logging.DEBUG, logger="resumewds"):
        ds = rw.WebDataset(paths, seed=3, shuffle=True)
        assert _keys(ds) == ref
    assert any("does not list" in r.getMessage() and "shard-000002.tar" in r.getMessage()
               for r in caplog.records)


def test_a_local_shard_newer_than_the_manifest_beside_is_indexed(tmp_path, caplog):
    paths = write_shards(str(tmp_path / "d"), shards=2, samples=10)
    rw.build_manifest(paths, str(tmp_path / "d" / "manifest.json"))
    write_shards(str(tmp_path / "d"), shards=2, samples=7)  # rewritten after the manifest: it is stale
    later = time.time() + 5
    for p in paths:
        os.utime(p, (later, later))
    with caplog.at_level(logging.DEBUG, logger="resumewds"):
        assert len(_keys(rw.WebDataset(paths))) == 14
    assert any("not used" in r.getMessage() for r in caplog.records)


def test_a_webloaders_workers_do_not_fetch_the_manifest(served_shards):
    """The WebLoader resolves the manifest before its workers fork: one fetch. A plain
    torch DataLoader forks before anything of ours runs: each worker fetches it once
    (nothing of ours waits at a fork), and the data is the same."""
    _, srv, urls = served_shards
    manifest_url = urls[0].rsplit("/", 1)[0] + "/manifest.json"
    ds = rw.WebDataset(manifest_url, seed=1, shuffle=True)
    with rw.WebLoader(ds, batch_size=8, num_workers=2, collate_fn=list) as ld:
        mine = sorted(s["__key__"] for b in ld for s in b)
    assert len(mine) == 4 * 24
    assert srv.request_log.count("/manifest.json") == 1, srv.request_log
    srv.reset_counters()
    ds = rw.WebDataset(manifest_url, seed=1, shuffle=True)
    dl = DataLoader(ds, batch_size=8, num_workers=2, collate_fn=list, multiprocessing_context="fork")
    assert sorted(s["__key__"] for b in dl for s in b) == mine
    assert srv.request_log.count("/manifest.json") <= 2, srv.request_log
