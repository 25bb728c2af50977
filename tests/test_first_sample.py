"""The first sample, on the path from the user's first call.

* Direct iteration hands out each sample as soon as it is read: the first
  sample of a pass waits for its own shard (a local shard's whole-file
  check, a remote shard's first range), not for the rest of its step; the
  sequence and the exact resume from any point of the first step are those
  of the whole-step reads.
* A manifest without offsets (a ``DataPipeline`` or a plain list of shards)
  is indexed several shards at once, with the same result and the same
  first error as one by one.
* A loader without a journal does not import sqlite-utils.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading
from typing import Any, List

import pytest

import resumewds as rw
from chaos.faultserver import FaultServer
from resumewds import synth
from resumewds.cache import ShardStore
from resumewds.errors import ShardNotFoundError
from resumewds.manifest._manifest import Manifest
from resumewds.sources import _indexing as indexing
from resumewds.sources._resolve import resolve_sources
from resumewds.tar import _io as tario

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SHARDS, SAMPLES = 4, 30  # a shuffled window of 4 shards: the first step of 64 touches all of them


def _v3(root: str, shards: int = SHARDS, samples: int = SAMPLES, **kw: Any) -> str:
    synth.write_shards(root, shards=shards, samples=samples, **kw)
    m = os.path.join(root, "manifest.json")
    rw.build_manifest(os.path.join(root, f"shard-{{000000..{shards - 1:06d}}}.tar"), m, digests=True)
    return m


def _marks(cache_dir: str) -> List[str]:
    d = os.path.join(cache_dir, "verified")
    return sorted(os.listdir(d)) if os.path.isdir(d) else []


def _keys(it: Any) -> List[Any]:
    return [(s["__key__"], s["__url__"].rsplit("/", 1)[-1]) for s in it]


# ---- direct iteration: each sample as soon as it is read ---------------------------------------

def test_first_sample_waits_for_no_whole_shard(tmp_path, monkeypatch):
    """Local v3 shards, fresh cache, shuffled window of 4 shards: the first sample (and
    the whole epoch) is read without hashing any shard whole on the reading thread (each
    sample is checked against its own digest; the whole-file checks that set the marks run
    behind, on their own thread); the whole sequence is that of a run in a warm cache."""
    import threading

    from resumewds.cache import _local as local

    m = _v3(str(tmp_path / "s"))
    warm = str(tmp_path / "warm")
    _keys(rw.WebDataset(m, shuffle=True, seed=5, cache_dir=warm))
    assert local.wait_checks(120)
    want = _keys(rw.WebDataset(m, shuffle=True, seed=5, cache_dir=warm))
    hashed = []
    real = local.check_local

    def counted(*args, **kw):
        hashed.append(threading.current_thread().name)
        return real(*args, **kw)

    monkeypatch.setattr(local, "check_local", counted)
    cache = str(tmp_path / "cold")
    ds = rw.WebDataset(m, shuffle=True, seed=5, cache_dir=cache)
    it = iter(ds)
    first = next(it)
    assert _keys([first]) + _keys(it) == want
    assert set(hashed) <= {"resumewds-verify"}
    assert local.wait_checks(120)
    assert len(_marks(cache)) == SHARDS


@pytest.mark.parametrize("n", [1, 2, 63, 64, 65, 100])
def test_state_inside_the_first_step_resumes_exactly(tmp_path, n):
    """A state taken after ``n`` samples (inside the first step of 64 and after it),
    in a fresh cache, resumes with exactly the rest of the uninterrupted sequence."""
    m = _v3(str(tmp_path / "s"))
    full = _keys(rw.WebDataset(m, shuffle=True, seed=5, cache_dir=str(tmp_path / "ref")))
    ds = rw.WebDataset(m, shuffle=True, seed=5, cache_dir=str(tmp_path / "a"))
    it = iter(ds)
    head = _keys(next(it) for _ in range(n))
    state = ds.state_dict()
    ds2 = rw.WebDataset(m, shuffle=True, seed=5, cache_dir=str(tmp_path / "b"))
    ds2.load_state_dict(state)
    assert head + _keys(ds2) == full


def test_first_sample_over_http_fetches_one_range_first(tmp_path):
    """Remote v3 shards, cold cache, a server at 1 MB/s per connection: the first request
    for a shard is the first sample's own range (not the 64 samples of its step, nor the
    shard), and it is handed out before the shard is downloaded; the epoch is the warm run's."""
    root = str(tmp_path / "srv")
    _v3(root, shards=3, samples=200, size_range=(1000, 4000), seed=5)
    with FaultServer(root) as srv:
        url = srv.url.rstrip("/") + "/manifest.json"
        warm = str(tmp_path / "warm")
        _keys(rw.WebDataset(url, shuffle=True, seed=5, cache_dir=warm))
        want = _keys(rw.WebDataset(url, shuffle=True, seed=5, cache_dir=warm))
    with FaultServer(root, bytes_per_second=1_000_000) as srv:
        url = srv.url.rstrip("/") + "/manifest.json"
        ds = rw.WebDataset(url, shuffle=True, seed=5, cache_dir=str(tmp_path / "cold"))
        it = iter(ds)
        first = next(it)
        path = "/" + first["__url__"].rsplit("/", 1)[1]
        shard = next(s for s in ds.manifest.shards if s.url == first["__url__"])
        keys = [x["__key__"] for x in tario.iter_samples_file(os.path.join(root, path[1:]))]
        j = keys.index(first["__key__"])
        a, b = shard.sample_range(j)
        assert (path, f"bytes={a}-{b - 1}") in srv.range_log  # the first sample's own range
        assert srv.bytes_by_path[path] < os.path.getsize(os.path.join(root, path[1:]))  # the shard: not yet
        got = _keys([first]) + _keys(it)
        ds.close()
    assert got == want


def test_datapipeline_first_sample_waits_for_its_own_shard_only(tmp_path, monkeypatch):
    """A DataPipeline over local shards (indexed on first use, shuffled): when its first
    sample is handed out, one shard has been hashed; the sequence is a warm run's."""
    synth.write_shards(str(tmp_path / "s"), shards=SHARDS, samples=SAMPLES)
    urls = [str(tmp_path / "s" / f"shard-{i:06d}.tar") for i in range(SHARDS)]

    def pipeline(cache: str) -> Any:
        monkeypatch.setenv("RESUMEWDS_CACHE_DIR", cache)
        return rw.DataPipeline(rw.SimpleShardList(urls), rw.shuffle(100), rw.tarfile_to_samples(),
                               rw.shuffle(1000))

    warm = str(tmp_path / "warm")
    _keys(pipeline(warm))
    want = _keys(pipeline(warm))
    cache = str(tmp_path / "cold")
    it = iter(pipeline(cache))
    first = next(it)
    assert len(_marks(cache)) == 1
    assert _keys([first]) + _keys(it) == want
    assert len(_marks(cache)) == SHARDS


@pytest.mark.parametrize("n", [1, 63, 64, 65])
def test_datapipeline_state_inside_the_first_step_resumes_exactly(tmp_path, monkeypatch, n):
    synth.write_shards(str(tmp_path / "s"), shards=SHARDS, samples=SAMPLES)
    urls = [str(tmp_path / "s" / f"shard-{i:06d}.tar") for i in range(SHARDS)]

    def pipeline(cache: str) -> Any:
        monkeypatch.setenv("RESUMEWDS_CACHE_DIR", str(tmp_path / cache))
        return rw.DataPipeline(rw.SimpleShardList(urls), rw.shuffle(100), rw.tarfile_to_samples(),
                               rw.shuffle(1000))

    full = _keys(pipeline("ref"))
    p = pipeline("a")
    it = iter(p)
    head = _keys(next(it) for _ in range(n))
    state = p.state_dict()
    p2 = pipeline("b")
    p2.load_state_dict(state)
    assert head + _keys(p2) == full


# ---- a manifest without offsets: several shards indexed at once ------------------------------

class _CountingStore(ShardStore):
    """A real store that records how many ``ensure`` calls run at once; with ``meet``, each
    call waits (30 s at most) until ``meet`` calls have been in it together."""

    def __init__(self, meet: int = 0, **kw: Any):
        super().__init__(**kw)
        self.cond = threading.Condition()
        self.now = self.most = 0
        self.meet = meet

    def ensure(self, shard: Any, *args: Any, **kw: Any) -> str:
        with self.cond:
            self.now += 1
            self.most = max(self.most, self.now)
            self.cond.notify_all()
            self.cond.wait_for(lambda: self.most >= self.meet, timeout=30)
        try:
            return super().ensure(shard, *args, **kw)
        finally:
            with self.cond:
                self.now -= 1


def _plain_manifest(m: Manifest) -> List[Any]:
    return [(s.url, s.samples, s.size, s.xxh3_64, list(s.offsets or [])) for s in m.shards]


def test_index_manifest_indexes_shards_at_once_with_the_same_result(tmp_path, monkeypatch):
    synth.write_shards(str(tmp_path / "s"), shards=6, samples=20)
    pattern = str(tmp_path / "s" / "shard-{000000..000005}.tar")
    store = _CountingStore(meet=2, cache_dir=str(tmp_path / "c1"))
    at_once = indexing.index_manifest(resolve_sources(pattern), store)
    assert store.most > 1
    monkeypatch.setattr(indexing, "INDEX_THREADS", 1)
    store1 = _CountingStore(cache_dir=str(tmp_path / "c2"))
    one_by_one = indexing.index_manifest(resolve_sources(pattern), store1)
    assert store1.most == 1
    assert _plain_manifest(at_once) == _plain_manifest(one_by_one)


def test_index_manifest_raises_the_first_failing_shard_in_order(tmp_path):
    synth.write_shards(str(tmp_path / "s"), shards=6, samples=20)
    m = resolve_sources(str(tmp_path / "s" / "shard-{000000..000005}.tar"))
    os.remove(str(tmp_path / "s" / "shard-000002.tar"))
    os.remove(str(tmp_path / "s" / "shard-000004.tar"))
    with pytest.raises(ShardNotFoundError) as ei:
        indexing.index_manifest(m, ShardStore(cache_dir=str(tmp_path / "c")))
    assert "shard-000002.tar" in str(ei.value)


def test_datapipeline_over_http_gives_the_one_by_one_sequence(tmp_path, monkeypatch):
    """A DataPipeline over http shards without a manifest: the same samples, in the same
    order, whether its shards are indexed at once or one by one."""
    root = str(tmp_path / "srv")
    synth.write_shards(root, shards=5, samples=25, seed=3)
    names = sorted(x for x in os.listdir(root) if x.endswith(".tar"))

    def run(cache: str) -> List[Any]:
        monkeypatch.setenv("RESUMEWDS_CACHE_DIR", cache)
        with FaultServer(root) as srv:
            urls = [srv.url.rstrip("/") + "/" + n for n in names]
            p = rw.DataPipeline(rw.SimpleShardList(urls), rw.shuffle(100), rw.split_by_worker,
                                rw.tarfile_to_samples(), rw.shuffle(1000))
            return [s["__key__"] for s in p]

    at_once = run(str(tmp_path / "c1"))
    monkeypatch.setattr(indexing, "INDEX_THREADS", 1)
    assert run(str(tmp_path / "c2")) == at_once
    assert sorted(at_once) == sorted(set(at_once)) and len(at_once) == 125


# ---- imports ---------------------------------------------------------------------------------

def test_a_loader_without_a_journal_does_not_import_sqlite_utils(tmp_path):
    code = f"""
        import json, os, sys
        import resumewds as rw
        from resumewds import synth
        d = {str(tmp_path)!r}
        synth.write_shards(os.path.join(d, "s"), shards=2, samples=20)
        ds = rw.WebDataset(os.path.join(d, "s", "shard-{{000000..000001}}.tar"), cache_dir=os.path.join(d, "c"))
        loader = rw.WebLoader(ds, batch_size=4, num_workers=0)
        next(iter(loader))
        before = "sqlite_utils" in sys.modules
        journal = rw.WebLoader(ds, batch_size=4, num_workers=0, journal=os.path.join(d, "j.db"))
        next(iter(journal))
        print(json.dumps([before, "sqlite_utils" in sys.modules]))
    """
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                         env=env, timeout=300)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout.strip().splitlines()[-1]) == [False, True]
