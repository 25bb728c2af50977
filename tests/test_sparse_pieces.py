"""Sparse partials: every byte fetched once, a download killed mid-way resumed from its records.

Real FaultServers on 127.0.0.1 count the bytes they send; real DataLoader
workers; real SIGKILL.  A cold epoch over http asks the server for at most
1.02x the data set's bytes, shuffled and in order, with 0 and 2 workers.  A
download killed mid-way is resumed from its records (it asks only for what
no record covers) and published verified.  A map left by a kill between the
publish (``os.replace``) and its removal is dropped by the next open.
"""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest
import xxhash

import resumewds as rw
from chaos.faultserver import FaultServer
from http_fixtures import data_bytes, sparse_records, tar_bytes_sent, write_v3
from resumewds.cache import ShardStore
from resumewds.cache import _sparse as sparse
from resumewds.fetch import FetchConfig

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


def _epoch(url, cache, shuffle, workers, **kw):
    ds = rw.WebDataset(url + "manifest.json", cache_dir=cache, seed=7, shuffle=shuffle, **kw)
    try:
        if not workers:
            return [(s["__key__"], bytes(s["bin"])) for s in ds]
        # batches of 64: each worker's first step (read by range before its downloads start) is
        # 5% of the data set, so bytes it fetched and did not keep would show
        loader = rw.WebLoader(ds, batch_size=64, num_workers=workers, collate_fn=list)
        return [(s["__key__"], bytes(s["bin"])) for batch in loader for s in batch]
    finally:
        ds.close()


@pytest.mark.parametrize("shuffle,workers", [(True, 0), (True, 2), (False, 0),
                                             pytest.param(False, 2, marks=pytest.mark.slow)])
def test_a_cold_epoch_asks_for_each_byte_once_by_default(v3, tmp_path, shuffle, workers):
    data = data_bytes(v3)
    with FaultServer(v3) as srv:
        url = srv.url.rstrip("/") + "/"
        _epoch(url, str(tmp_path / "w"), shuffle, workers)
        warm = _epoch(url, str(tmp_path / "w"), shuffle, workers)
    # per connection as slow as an object store's stream: the readers outrun the downloads
    with FaultServer(v3, bytes_per_second=4_000_000) as srv:
        cold = _epoch(srv.url.rstrip("/") + "/", str(tmp_path / "cold"), shuffle, workers)
        sent = tar_bytes_sent(srv)
    assert cold == warm  # exact: the uninterrupted warm run's sequence
    assert sent <= 1.02 * data, f"{sent} bytes sent for {data} bytes of shards ({sent / data:.3f}x)"
    names = os.listdir(tmp_path / "cold" / "shards")
    assert len([n for n in names if n.endswith(".meta")]) == SHARDS  # every shard published, verified
    assert not [n for n in names if n.endswith((".sparse", ".sparse.map", ".partial"))]


def _records(path):
    return sparse_records(path, TAGS)


def _spans(recs):
    r = sparse.Ranges()
    for a, b in recs:
        r.add(a, b)
    return r.spans


_DOWNLOAD = textwrap.dedent("""
    import dataclasses, sys
    import resumewds as rw
    from resumewds.cache import ShardStore
    root, url, cache, name = sys.argv[1:5]
    m = rw.load_manifest(root + "/manifest.json")
    shard = next(s for s in m.shards if s.url.endswith(name))
    store = ShardStore(cache_dir=cache)
    store.ensure(dataclasses.replace(shard, url=url + name))
""")


def test_a_download_killed_then_resumed_asks_only_for_what_no_record_covers(v3, tmp_path):
    """A download records its checked samples as they arrive; SIGKILL mid-way;
    the next download asks only for what no record covers and publishes the
    shard verified."""
    name = "shard-000000.tar"
    cache = str(tmp_path / "c")
    shards = os.path.join(cache, "shards")
    size = os.path.getsize(os.path.join(v3, name))
    env = dict(os.environ, PYTHONPATH=os.getcwd() + os.pathsep + os.environ.get("PYTHONPATH", ""))
    with FaultServer(v3, bytes_per_second=500_000) as srv:
        port = srv.port
        child = subprocess.Popen([sys.executable, "-c", _DOWNLOAD, v3, srv.url.rstrip("/") + "/", cache, name],
                                 env=env)
        seen = []
        try:
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                maps = [os.path.join(shards, n) for n in os.listdir(shards)] if os.path.isdir(shards) else []
                maps = [m for m in maps if m.endswith(".sparse.map")]
                seen = _spans(_records(maps[0])) if maps else []
                if sum(b - a for a, b in seen) >= size // 8:
                    break
                assert child.poll() is None, "the download ended before it was killed"
                time.sleep(0.01)
            else:
                pytest.fail(f"nothing recorded within 60 s: {seen}")
        finally:
            child.send_signal(signal.SIGKILL)
            child.wait()
    recorded = sum(b - a for a, b in _spans(_records(os.path.join(shards, [n for n in os.listdir(shards)
                                                                             if n.endswith(".sparse.map")][0]))))
    m = rw.load_manifest(os.path.join(v3, "manifest.json"))
    shard = next(s for s in m.shards if s.url.endswith(name))
    with FaultServer(v3, port=port) as srv:
        store = ShardStore(cache_dir=cache)
        path = store.ensure(dataclasses.replace(shard, url=srv.url.rstrip("/") + "/" + name))
        sent = tar_bytes_sent(srv)
    with open(path, "rb") as f:
        assert xxhash.xxh3_64_hexdigest(f.read()) == shard.xxh3_64  # published verified
    assert sent <= size - recorded + 64 * 1024, (sent, size, recorded)  # only what no record covered
    assert not [n for n in os.listdir(shards) if n.endswith((".sparse", ".sparse.map"))]


_KILLED_AT_PUBLISH = textwrap.dedent("""
    import os, signal, sys
    import resumewds as rw
    from resumewds.cache import _sparse as sparse
    url, cache = sys.argv[1], sys.argv[2]

    def publish(base):  # killed between the rename and the map's removal
        os.replace(base + sparse.SUFFIX, base)
        os.kill(os.getpid(), signal.SIGKILL)

    sparse.publish = publish
    ds = rw.WebDataset(url + "manifest.json", cache_dir=cache, seed=7, shuffle=True)
    for s in ds:
        pass
""")


def test_a_map_left_by_a_kill_after_publish_is_dropped(v3, tmp_path):
    cache = str(tmp_path / "c")
    shards = os.path.join(cache, "shards")
    with FaultServer(v3) as srv:
        url = srv.url.rstrip("/") + "/"
        _epoch(url, str(tmp_path / "w"), True, 0)
        warm = _epoch(url, str(tmp_path / "w"), True, 0)
    with FaultServer(v3, bytes_per_second=4_000_000) as srv:
        port = srv.port
        env = dict(os.environ, PYTHONPATH=os.getcwd() + os.pathsep + os.environ.get("PYTHONPATH", ""))
        child = subprocess.run([sys.executable, "-c", _KILLED_AT_PUBLISH, srv.url.rstrip("/") + "/", cache],
                               env=env, timeout=120)
    assert child.returncode == -signal.SIGKILL
    names = os.listdir(shards)
    stale = [n for n in names if n.endswith(".sparse.map") and n[: -len(".map")] not in names]
    assert stale  # the published entry's map, left behind
    entry = stale[0][: -len(".sparse.map")]
    assert entry in names and entry + ".meta" not in names
    with FaultServer(v3, port=port) as srv:  # the same urls: the same cache entries
        again = _epoch(srv.url.rstrip("/") + "/", cache, True, 0)
        by_path = dict(srv.bytes_by_path)
    assert again == warm  # exact
    names = os.listdir(shards)
    assert len([n for n in names if n.endswith(".meta")]) == SHARDS
    assert not [n for n in names if n.endswith((".sparse", ".sparse.map"))]  # the stale map is gone
    assert by_path.get("/" + entry.split("-", 1)[1], 0) < os.path.getsize(os.path.join(shards, entry)) // 2  # adopted


def _refused_first_shard(v3, srv, tmp_path, refusals):
    """Shard 0 served by ``srv`` with its first ``refusals`` requests answered 503, a store
    that tries 3 times, and the shard's budget (what the readers' progress resets)."""
    name = "shard-000000.tar"
    m = rw.load_manifest(os.path.join(v3, "manifest.json"))
    shard = dataclasses.replace(next(s for s in m.shards if s.url.endswith(name)),
                                url=srv.url.rstrip("/") + "/" + name)
    srv.script("/" + name, ["503"] * refusals)
    store = ShardStore(cache_dir=str(tmp_path / "c"), fetch=FetchConfig(attempts=3))
    return shard, store, store.budget_for(shard.url)


def test_a_piece_that_fails_its_own_attempts_while_readers_progress_is_asked_for_again(v3, tmp_path):
    """The download's first piece gets ``attempts`` 503s in a row while the shard's
    readers keep verifying samples (a thread reports their progress to the shard's
    budget, as a reader's ranges do): the piece is asked for again, and the shard
    is published verified."""
    with FaultServer(v3, retry_after=0.2) as srv:
        shard, store, budget = _refused_first_shard(v3, srv, tmp_path, 3)
        done = threading.Event()

        def readers() -> None:
            while not done.wait(0.02):
                budget.progress()

        t = threading.Thread(target=readers)
        t.start()
        try:
            path = store.ensure(shard)
        finally:
            done.set()
            t.join()
        assert srv.faults["503"] == 3
    with open(path, "rb") as f:
        assert xxhash.xxh3_64_hexdigest(f.read()) == shard.xxh3_64


def test_a_piece_the_server_never_serves_ends_the_download_once_readers_stop_progressing(v3, tmp_path):
    """The same piece always refused: asked for again only while the readers
    progress; after they stop, ``attempts`` faults in a row end the download
    with an error that names the shard."""
    with FaultServer(v3, retry_after=0.05) as srv:
        shard, store, budget = _refused_first_shard(v3, srv, tmp_path, 1000)
        t0 = time.monotonic()

        def readers() -> None:  # verified samples for 0.5 s, then none
            while time.monotonic() - t0 < 0.5:
                budget.progress()
                time.sleep(0.02)

        t = threading.Thread(target=readers)
        t.start()
        try:
            with pytest.raises(rw.TransientFetchError, match="shard-000000.tar"):
                store.ensure(shard)
        finally:
            t.join()
        assert 4 <= srv.faults["503"] < 1000
