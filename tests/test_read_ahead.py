"""Small steps (a DataLoader worker's share, one sample per step) fetch the ranges of the
steps after them together (resumewds.stepengine.READ_AHEAD), and deliver the same sequence."""

from __future__ import annotations

import os
import threading
from typing import List

import pytest

import resumewds as rw
import resumewds.reading
import resumewds.stepengine
import resumewds.wds.webdataset
from chaos.faultserver import FaultServer
from resumewds.synth import write_shards

pytestmark = pytest.mark.usefixtures("cache_dir")


@pytest.fixture
def manifest_url(tmp_path):
    root = str(tmp_path / "srv")
    paths = write_shards(root, shards=4, samples=30, size_range=(2000, 4000))
    rw.build_manifest(paths, os.path.join(root, "manifest.json"), digests=True)
    srv = FaultServer(root, bytes_per_second=200_000)  # whole downloads take ~0.5 s: ranges serve
    srv.start()
    try:
        yield f"http://{srv.host}:{srv.port}/manifest.json"
    finally:
        srv.stop()


def _worker0_keys(url: str, monkeypatch) -> List[str]:
    """Worker 0 of 2 of a plain DataLoader (its share: one sample per step), in this process."""
    monkeypatch.setattr(resumewds.wds.webdataset, "worker_info", lambda group=None: (0, 1, 0, 2))
    ds = rw.WebDataset(url, seed=5, shuffle=True)
    return [s["__key__"] for s in ds]


def test_a_worker_fetches_the_ranges_of_its_next_steps_at_once(manifest_url, monkeypatch, tmp_path):
    inflight, most = [0], [0]
    lock = threading.Lock()
    real = resumewds.reading.fetch_group

    def counted(*a, **kw):
        with lock:
            inflight[0] += 1
            most[0] = max(most[0], inflight[0])
        try:
            return real(*a, **kw)
        finally:
            with lock:
                inflight[0] -= 1

    monkeypatch.setattr(resumewds.reading, "fetch_group", counted)
    ahead = _worker0_keys(manifest_url, monkeypatch)
    assert most[0] >= 2  # one sample per step, one request at a time, without the read-ahead

    monkeypatch.setattr(resumewds.stepengine, "READ_AHEAD", 0)
    monkeypatch.setenv("RESUMEWDS_CACHE_DIR", str(tmp_path / "cache2"))
    most[0] = 0
    one_by_one = _worker0_keys(manifest_url, monkeypatch)
    assert most[0] == 1
    assert len(ahead) == 60 and ahead == one_by_one


def test_the_first_sample_by_range_goes_before_the_background_downloads(tmp_path):
    root = str(tmp_path / "slow")
    paths = write_shards(root, shards=4, samples=30, size_range=(2000, 4000))
    rw.build_manifest(paths, os.path.join(root, "manifest.json"), digests=True)
    with FaultServer(root, bytes_per_second=100_000) as srv:  # a range: ~30 ms; a whole shard: ~1 s
        ds = rw.WebDataset(f"http://{srv.host}:{srv.port}/manifest.json", seed=5, shuffle=True)
        it = iter(ds)
        next(it)
        asked = [p for p in srv.request_log if p.endswith(".tar")]
        # the first sample's range only: the window's downloads start once it is out
        assert len(asked) == 1, asked
        assert len([next(it) for _ in range(20)]) == 20
        ds.close()
