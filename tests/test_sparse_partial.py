"""Sparse partial downloads killed mid-fill: a rerun keeps what was recorded and is exact.

A real FaultServer on 127.0.0.1 serves v3 shards (per-sample digests).  A
cold shuffled epoch in a child process reads its samples by HTTP Range while
the background downloads fill each shard; both write the samples they
checked into the shard's sparse partial (``<entry>.sparse``, recorded in
``<entry>.sparse.map``).  SIGKILLed mid-fill, a rerun asks only for what no
record covers (a block damaged on disk meanwhile is found by the whole-file
check and fetched again) and delivers the uninterrupted run's sequence.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import xxhash

import resumewds as rw
from chaos.faultserver import FaultServer
from http_fixtures import data_bytes, sparse_records, tar_bytes_sent, write_v3
from resumewds.cache import _sparse as sparse

pytestmark = pytest.mark.usefixtures("cache_dir")


SHARDS = 4
SAMPLES = 600
TAGS: set = set()


@pytest.fixture
def v3(tmp_path):
    root = str(tmp_path / "srv")
    TAGS.clear()
    TAGS.update(write_v3(root, SHARDS, SAMPLES))
    return root


def _keys(url, cache, **kw):
    ds = rw.WebDataset(url + "manifest.json", cache_dir=cache, seed=7, **kw)
    try:
        return [(s["__key__"], bytes(s["bin"])) for s in ds]
    finally:
        ds.close()


_CHILD = textwrap.dedent("""
    import sys
    import resumewds as rw
    url, cache = sys.argv[1], sys.argv[2]
    ds = rw.WebDataset(url + "manifest.json", cache_dir=cache, seed=7, shuffle=True)
    for s in ds:
        pass
""")


def _records(path):
    return sparse_records(path, TAGS)


def _killed_mid_fill(v3, tmp_path):
    """A cold shuffled epoch in a child process, SIGKILLed while its shards are
    being filled both by ranged reads and by the background downloads."""
    cache = str(tmp_path / "cold")
    shards = os.path.join(cache, "shards")
    with FaultServer(v3, bytes_per_second=1_000_000) as srv:
        port = srv.port
        env = dict(os.environ, PYTHONPATH=os.getcwd() + os.pathsep + os.environ.get("PYTHONPATH", ""))
        child = subprocess.Popen([sys.executable, "-c", _CHILD, srv.url.rstrip("/") + "/", cache], env=env)
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                maps = [os.path.join(shards, n) for n in os.listdir(shards)] if os.path.isdir(shards) else []
                maps = [m for m in maps if m.endswith(".sparse.map")]
                if sum(b - a for m in maps for a, b in _records(m)) >= data_bytes(v3) // 4:
                    break
                time.sleep(0.02)
            else:
                pytest.fail("no sparse partial filled within 60 s")
        finally:
            child.send_signal(signal.SIGKILL)
            child.wait()
    assert child.returncode == -signal.SIGKILL
    names = os.listdir(shards)
    assert [n for n in names if n.endswith(".sparse")]  # left behind, partly filled
    assert len([n for n in names if n.endswith(".meta")]) < SHARDS
    recorded = sum(b - a for n in names if n.endswith(".sparse.map")
                   for a, b in _records(os.path.join(shards, n)))
    return cache, shards, recorded, port


@pytest.mark.parametrize("corrupt", [False, True])
def test_killed_mid_fill_then_a_rerun_finishes_exact(v3, tmp_path, corrupt):
    with FaultServer(v3) as srv:
        url = srv.url.rstrip("/") + "/"
        _keys(url, str(tmp_path / "w"), shuffle=True)
        warm = _keys(url, str(tmp_path / "w"), shuffle=True)
    cache, shards, recorded, port = _killed_mid_fill(v3, tmp_path)
    maps = sorted((os.path.join(shards, n) for n in os.listdir(shards) if n.endswith(".sparse.map")),
                  key=lambda m: -len(_records(m)))
    if corrupt:
        # a recorded block of a sparse partial is damaged on disk: its record must not be trusted
        m = maps[0]
        a, b = max(_records(m), key=lambda r: r[1] - r[0])
        biggest = b - a
        data = m[: -len(".map")]
        with open(data, "r+b") as f:
            f.seek((a + b) // 2)
            byte = f.read(1)
            f.seek((a + b) // 2)
            f.write(bytes([byte[0] ^ 0xFF]))
    with FaultServer(v3, port=port) as srv:  # the same urls: the same cache entries
        again = _keys(srv.url.rstrip("/") + "/", cache, shuffle=True)
        sent = tar_bytes_sent(srv)
    assert again == warm  # exact: the same samples in the same order as an uninterrupted run
    # what the killed run had fetched and recorded was kept (but a damaged block, fetched again)
    assert sent <= 1.02 * data_bytes(v3) - recorded + (biggest if corrupt else 0), (sent, recorded)
    names = os.listdir(shards)
    assert len([n for n in names if n.endswith(".meta")]) == SHARDS
    assert not [n for n in names if n.endswith((".sparse", ".sparse.map"))]
    # every published shard passes its whole-file check
    manifest = rw.load_manifest(os.path.join(v3, "manifest.json"))
    for n in names:
        if n.endswith(".tar"):
            with open(os.path.join(shards, n), "rb") as f:
                digest = xxhash.xxh3_64_hexdigest(f.read())
            assert digest in {s.xxh3_64 for s in manifest.shards}


def test_a_first_step_range_is_kept_in_a_cache_no_download_created_yet(v3, tmp_path):
    """A DataLoader worker's first step reads by range before any download of its
    process made the cache's directories: its verified samples still go into the
    shard's sparse partial (else the download fetches them a second time)."""
    from resumewds.cache import ShardStore

    manifest = rw.load_manifest(os.path.join(v3, "manifest.json"))
    shard = manifest.shards[1]
    shard = dataclasses.replace(shard, url="http://127.0.0.1:9/" + os.path.basename(shard.url))  # never fetched
    store = ShardStore(cache_dir=str(tmp_path / "fresh"))  # no directory yet
    lo, hi = shard.sample_range(3)
    with open(os.path.join(v3, os.path.basename(shard.url)), "rb") as f:
        f.seek(lo)
        data = f.read(hi - lo)
    with sparse.Writer(store, sparse.entry(store, shard)) as w:
        w.put(lo, data)
    assert w.kept == hi - lo
    base = store.entry_path(shard.url)
    assert [(a, b) for a, b in _records(base + ".sparse.map")] == [(lo, hi)]
    with open(base + ".sparse", "rb") as f:
        f.seek(lo)
        assert f.read(hi - lo) == data


def test_a_published_shard_whose_meta_is_not_written_yet_is_read_from_the_cache(v3, tmp_path):
    """Between a download's rename into the cache and its ``.meta`` (or after a kill
    there), the entry holds the shard: a reader takes it from there (adopted by its
    xxh3_64), and no sample is fetched again by range."""
    cache = str(tmp_path / "c")
    shards = os.path.join(cache, "shards")
    with FaultServer(v3) as srv:
        url = srv.url.rstrip("/") + "/"
        first = _keys(url, cache, shuffle=True)
        metas = [n for n in os.listdir(shards) if n.endswith(".meta")]
        assert len(metas) == SHARDS
        for n in metas:
            os.remove(os.path.join(shards, n))
        srv.reset_counters()
        again = _keys(url, cache, shuffle=True)
        sent = tar_bytes_sent(srv)
    assert again == first
    assert sent == 0, f"{sent} bytes fetched again for shards already in the cache"
    assert sorted(n for n in os.listdir(shards) if n.endswith(".meta")) == sorted(metas)
