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
from resumewds.cache import sparse

pytestmark = pytest.mark.usefixtures("cache_dir")


@pytest.fixture(autouse=True)
def _default(monkeypatch):
    monkeypatch.setattr(sparse, "SPARSE_PARTIALS", None)  # the default: on
    monkeypatch.delenv("RESUMEWDS_SPARSE_PARTIALS", raising=False)

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
        got = [(s["__key__"], bytes(s["bin"])) for s in ds]
        rr = ds._reader.ranged if ds._reader is not None else None
        return got, dict(rr.counters) if rr is not None else {}
    finally:
        ds.close()


@pytest.mark.parametrize("shuffle", [True, False])
def test_a_cold_epoch_fetches_each_byte_once(v3, tmp_path, shuffle):
    data = data_bytes(v3)
    with FaultServer(v3) as srv:
        url = srv.url.rstrip("/") + "/"
        warm, _ = _keys(url, str(tmp_path / "w"), shuffle=shuffle, ranged_reads=False)
        warm, _ = _keys(url, str(tmp_path / "w"), shuffle=shuffle, ranged_reads=False)
    # per connection as slow as an object store's stream: the reader outruns the downloads
    with FaultServer(v3, bytes_per_second=4_000_000) as srv:
        cold, counters = _keys(srv.url.rstrip("/") + "/", str(tmp_path / "cold"), shuffle=shuffle)
        sent = tar_bytes_sent(srv)
    assert cold == warm
    if shuffle:  # a shuffled window reads ahead of every download: ranges, and kept
        assert counters["range_bytes"] > 0 and counters["range_kept"] > 0
    else:  # in order a sample is read by range, or waited for in the growing download
        assert counters.get("range_kept", 0) == counters.get("range_bytes", 0)
    assert sent <= 1.02 * data, f"{sent} bytes sent for {data} bytes of shards ({sent / data:.3f}x)"
    shards_dir = tmp_path / "cold" / "shards"
    names = os.listdir(shards_dir)
    assert len([n for n in names if n.endswith(".meta")]) == SHARDS  # every shard published, verified
    assert not [n for n in names if n.endswith((".sparse", ".sparse.map", ".partial"))]


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
        env = dict(os.environ, PYTHONPATH=os.getcwd() + os.pathsep + os.environ.get("PYTHONPATH", ""),
                   RESUMEWDS_SPARSE_PARTIALS="1")  # the user's switch, end to end
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
        _keys(url, str(tmp_path / "w"), shuffle=True, ranged_reads=False)
        warm, _ = _keys(url, str(tmp_path / "w"), shuffle=True, ranged_reads=False)
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
        again, _ = _keys(srv.url.rstrip("/") + "/", cache, shuffle=True)
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


def test_a_damaged_block_is_dropped_when_the_partial_is_reopened(v3, tmp_path):
    cache, shards, _, _ = _killed_mid_fill(v3, tmp_path)
    m = max((os.path.join(shards, n) for n in os.listdir(shards) if n.endswith(".sparse.map")),
            key=lambda m: len(_records(m)))
    recs = _records(m)
    a, b = max(recs, key=lambda r: r[1] - r[0])
    with open(m[: -len(".map")], "r+b") as f:
        f.seek((a + b) // 2)
        byte = f.read(1)
        f.seek((a + b) // 2)
        f.write(bytes([byte[0] ^ 0xFF]))
    base = m[: -len(".sparse.map")]
    manifest = rw.load_manifest(os.path.join(v3, "manifest.json"))
    name = os.path.basename(base).split("-", 1)[1]
    shard = next(s for s in manifest.shards if s.url.endswith(name))
    st = sparse.SparseState(base, int(shard.size), int(shard.xxh3_64, 16))
    sparse._open(st)  # what a download does first
    assert not st.have.covers((a + b) // 2, (a + b) // 2 + 1)  # the damaged block is not trusted
    assert st.have.total() > 0  # the others are kept
    assert len(_records(m)) == len(recs) - 1 or st.have.total() < sum(r[1] - r[0] for r in recs)


def test_sparse_partials_are_on_by_default_and_the_environment_turns_them_off(monkeypatch):
    """On by default; ``RESUMEWDS_SPARSE_PARTIALS=0`` turns them off; the module attribute wins."""
    from resumewds import config

    monkeypatch.setattr(sparse, "SPARSE_PARTIALS", None)
    monkeypatch.delenv("RESUMEWDS_SPARSE_PARTIALS", raising=False)
    assert config.sparse_partials(sparse.SPARSE_PARTIALS) is True
    monkeypatch.setenv("RESUMEWDS_SPARSE_PARTIALS", "0")
    assert config.sparse_partials(sparse.SPARSE_PARTIALS) is False
    monkeypatch.setattr(sparse, "SPARSE_PARTIALS", True)
    assert config.sparse_partials(sparse.SPARSE_PARTIALS) is True
    monkeypatch.setenv("RESUMEWDS_SPARSE_PARTIALS", "1")
    monkeypatch.setattr(sparse, "SPARSE_PARTIALS", False)
    assert config.sparse_partials(sparse.SPARSE_PARTIALS) is False
    monkeypatch.setenv("RESUMEWDS_SPARSE_PARTIALS", "maybe")
    monkeypatch.setattr(sparse, "SPARSE_PARTIALS", None)
    with pytest.raises(ValueError, match="RESUMEWDS_SPARSE_PARTIALS"):
        config.sparse_partials(sparse.SPARSE_PARTIALS)


def test_a_first_step_range_is_kept_in_a_cache_no_download_created_yet(v3, tmp_path):
    """A DataLoader worker's first step reads by range before any download of its
    process made the cache's directories: its verified samples still go into the
    shard's sparse partial (else the download fetches them a second time)."""
    from resumewds.cache import ShardStore

    manifest = rw.load_manifest(os.path.join(v3, "manifest.json"))
    shard = manifest.shards[1]
    shard = dataclasses.replace(shard, url="http://127.0.0.1:9/" + os.path.basename(shard.url))  # never fetched
    store = ShardStore(cache_dir=str(tmp_path / "fresh"))  # no directory yet
    store.ranged_fill = True
    lo, hi = shard.sample_range(3)
    with open(os.path.join(v3, os.path.basename(shard.url)), "rb") as f:
        f.seek(lo)
        data = f.read(hi - lo)
    kept = sparse.keep_verified(store, shard, lo, data, sparse.verified_spans(shard, lo, hi, data, set()))
    assert kept == hi - lo
    base = store.entry_path(shard.url)
    assert [(a, b) for a, b in _records(base + ".sparse.map")] == [(lo, hi)]
    with open(base + ".sparse", "rb") as f:
        f.seek(lo)
        assert f.read(hi - lo) == data
