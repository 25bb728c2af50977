"""Small steps (a DataLoader worker's share, one sample per step) fetch the ranges of the
steps after them together (resumewds.read._engine.READ_AHEAD), and deliver the same sequence."""

from __future__ import annotations

import os
from typing import List

import pytest

import resumewds as rw
import resumewds.read._engine
import resumewds.read._ranged
import resumewds.wds.webdataset
from chaos.faultserver import FaultServer
from resumewds.synth import write_shards

pytestmark = pytest.mark.usefixtures("cache_dir")


def _worker0_keys(url: str, monkeypatch) -> List[str]:
    """Worker 0 of 2 of a plain DataLoader (its share: one sample per step), in this process."""
    monkeypatch.setattr(resumewds.wds.webdataset, "worker_info", lambda group=None: (0, 1, 0, 2))
    ds = rw.WebDataset(url, seed=5, shuffle=True)
    return [s["__key__"] for s in ds]


def _most_at_once(url: str, monkeypatch, srv: FaultServer) -> List[str]:
    srv.reset_counters()
    keys = _worker0_keys(url, monkeypatch)
    return keys


def test_a_worker_fetches_the_ranges_of_its_next_steps_at_once(tmp_path, monkeypatch):
    """Worker 0's steps hold one sample each: with the read-ahead, the ranges of its
    next steps are asked for together (neighbours in one request: fewer requests
    than samples); without it, one request per sample; the same samples either way."""
    root = str(tmp_path / "srv")
    paths = write_shards(root, shards=4, samples=30, size_range=(2000, 4000))
    rw.build_manifest(paths, os.path.join(root, "manifest.json"), digests=True)
    with FaultServer(root, bytes_per_second=200_000) as srv:  # whole downloads take ~0.5 s: ranges serve
        url = f"http://{srv.host}:{srv.port}/manifest.json"
        monkeypatch.setenv("RESUMEWDS_CACHE_SIZE", "1")  # no background download: ranges only
        ahead = _most_at_once(url, monkeypatch, srv)
        n_ahead = sum(n for p, n in srv.ranged.items() if p.endswith(".tar"))
        monkeypatch.setattr(resumewds.read._engine, "READ_AHEAD", 0)
        monkeypatch.setenv("RESUMEWDS_CACHE_DIR", str(tmp_path / "cache2"))
        one_by_one = _most_at_once(url, monkeypatch, srv)
        n_plain = sum(n for p, n in srv.ranged.items() if p.endswith(".tar"))
    assert n_ahead < n_plain // 2, (n_ahead, n_plain)
    assert len(ahead) == 60 and ahead == one_by_one


def test_the_first_sample_by_range_goes_before_the_background_downloads(tmp_path):
    """A shuffled pass's first sample comes by a range of its own, handed to the range
    connections first; until it is out, the server is asked for ranges of the first
    step only (the background downloads start after it)."""
    root = str(tmp_path / "slow")
    paths = write_shards(root, shards=4, samples=30, size_range=(2000, 4000))
    rw.build_manifest(paths, os.path.join(root, "manifest.json"), digests=True)
    with FaultServer(root, bytes_per_second=100_000) as srv:  # a range: ~30 ms; a whole shard: ~1 s
        ds = rw.WebDataset(f"http://{srv.host}:{srv.port}/manifest.json", seed=5, shuffle=True)
        it = iter(ds)
        first = next(it)
        asked = [(p, r) for p, r in srv.range_log if p.endswith(".tar")]
        assert asked and all(r is not None for _, r in asked), asked  # ranges only
        # its own range, handed out first: the step's other ranges go out at the same time on
        # the other connections, so the server may see up to RANGE_THREADS - 1 of them first
        own = [(p, r) for p, r in asked[:resumewds.read._ranged.RANGE_THREADS]
               if p.endswith(first["__url__"].rsplit("/", 1)[1])
               and int(r.split("=")[1].split("-")[1]) + 1 - int(r.split("=")[1].split("-")[0]) <= 8000]
        assert own, asked
        assert len([next(it) for _ in range(20)]) == 20
        ds.close()
