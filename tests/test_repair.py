"""Block repair: a corrupt cached copy or download is fixed by re-fetching only
the byte ranges of the samples that fail their digests (real HTTP server on
127.0.0.1 that counts the bytes it sends)."""

from __future__ import annotations

import functools
import http.server
import os
import threading

import pytest
import xxhash

from chaos.diskfaults import flip_byte as _flip
from chaos.faultserver import FaultServer
from resumewds.cache import ShardStore
from resumewds.cache._repair import coalesce
from resumewds.manifest._manifest import load_manifest
from resumewds.writer import ShardWriter
from tests.http_fixtures import Recorder
from tests.http_fixtures import fast_config as _fast_config

MB = 1 << 20
SAMPLE = 100 * 1024


@pytest.fixture(scope="module")
def big(tmp_path_factory):
    """One ~32 MB shard of 330 samples of 100 KB (random bytes), written with its v3 manifest."""
    root = tmp_path_factory.mktemp("big")
    rng = __import__("random").Random(5)
    with ShardWriter(str(root / "big-%02d.tar"), maxcount=10_000, verbose=0, mtime=0, encoder=False) as w:
        for i in range(330):
            w.write({"__key__": f"s{i:04d}", "bin": rng.randbytes(SAMPLE)})
    return root


def fast_config(**kw):
    """No fault here is a stall: a read timeout long enough that a loaded machine
    never turns a slow 32 MB transfer into a retry (these tests count bytes)."""
    kw.setdefault("read_timeout", 30.0)
    return _fast_config(**kw)


def _setup(big, tmp_path, srv, **kw):
    m = load_manifest(str(big / "manifest.json"))
    shard = m.shards[0]
    shard.url = srv.url.rstrip("/") + "/" + os.path.basename(shard.url)
    rec = Recorder()
    st = ShardStore(cache_dir=str(tmp_path / "cache"), fetch=fast_config(), verify="always", on_event=rec, **kw)
    return shard, st, rec


def _hash(path):
    with open(path, "rb") as f:
        return xxhash.xxh3_64_hexdigest(f.read())


def test_coalesce():
    assert coalesce([(50, 60), (0, 10), (10, 20), (10_000, 10_001)], gap=100) == [(0, 60), (10_000, 10_001)]
    assert coalesce([(5, 5), (0, 1)], gap=0) == [(0, 1)]


def test_flipped_byte_in_cache_costs_one_sample(big, tmp_path):
    with FaultServer(str(big)) as srv:
        shard, st, rec = _setup(big, tmp_path, srv)
        path = st.ensure(shard)
        assert shard.size > 32 * MB
        a, b = shard.sample_range(123)
        _flip(path, a + 5000)
        srv.reset_counters()
        again = st.ensure(shard)
        sent = srv.bytes_sent
    assert _hash(again) == shard.xxh3_64
    assert sent <= 0.01 * shard.size, sent  # one sample's range + the tar trailer, not the shard
    assert sent >= b - a
    bad = rec.kinds("range_repair")
    assert [(d["sample"], d["key"], d["start"], d["end"]) for d in bad] == [(123, "s0123", a, b)]
    assert rec.kinds("range_repair_done")[0]["bytes"] == sent  # every byte sent was a range body


def test_flipped_byte_in_download_costs_one_sample(big, tmp_path):
    """Each sample of a download is checked as it arrives: the one that arrives
    corrupt is asked for again, alone, while the rest of the body is kept."""
    with FaultServer(str(big)) as srv:
        shard, st, rec = _setup(big, tmp_path, srv)
        srv.script("/" + os.path.basename(shard.url), ["flip_data"])
        path = st.ensure(shard)
        sent = srv.bytes_sent
    assert _hash(path) == shard.xxh3_64
    assert srv.faults["flip_data"] == 1
    assert shard.size <= sent <= 1.01 * shard.size, sent  # the download + one sample, not two downloads
    corrupt = [d["error"] for d in rec.kinds("retry") if "arrived corrupt" in d["error"]]
    assert len(corrupt) == 1 and "sample " in corrupt[0]


def test_reset_during_ranged_read_is_retried(big, tmp_path):
    with FaultServer(str(big)) as srv:
        shard, st, rec = _setup(big, tmp_path, srv)
        path = st.ensure(shard)
        _flip(path, shard.sample_range(7)[0] + 2000)
        srv.reset_counters()
        srv.script("/" + os.path.basename(shard.url), ["reset@0.5"])
        again = st.ensure(shard)
        sent = srv.bytes_sent
    assert _hash(again) == shard.xxh3_64 and srv.faults["reset"] == 1
    assert sent <= 0.02 * shard.size and rec.kinds("retry")


def test_without_digests_the_whole_shard_is_fetched(big, tmp_path):
    with FaultServer(str(big)) as srv:
        shard, st, rec = _setup(big, tmp_path, srv)
        shard.sample_digests = None  # a v1/v2 manifest
        path = st.ensure(shard)
        _flip(path, 4000)
        srv.reset_counters()
        again = st.ensure(shard)
        sent = srv.bytes_sent
    assert _hash(again) == shard.xxh3_64 and sent >= shard.size and not rec.kinds("range_repair")


def test_too_much_damage_fetches_the_whole_shard(big, tmp_path):
    with FaultServer(str(big)) as srv:
        shard, st, rec = _setup(big, tmp_path, srv)
        path = st.ensure(shard)
        with open(path, "r+b") as f:
            f.truncate(shard.size // 2)  # half the samples gone
        srv.reset_counters()
        again = st.ensure(shard)
        sent = srv.bytes_sent
    assert _hash(again) == shard.xxh3_64 and sent >= shard.size and not rec.kinds("range_repair_done")


def test_truncated_tail_is_repaired_by_range(big, tmp_path):
    with FaultServer(str(big)) as srv:
        shard, st, rec = _setup(big, tmp_path, srv)
        path = st.ensure(shard)
        with open(path, "r+b") as f:
            f.truncate(shard.size - 3 * SAMPLE)  # the last samples and the trailer
        srv.reset_counters()
        again = st.ensure(shard)
        sent = srv.bytes_sent
    assert _hash(again) == shard.xxh3_64 and sent <= 0.02 * shard.size
    cut = shard.size - 3 * SAMPLE
    assert [d["sample"] for d in rec.kinds("range_repair")] == \
        [i for i in range(shard.samples) if shard.sample_range(i)[1] > cut] == [327, 328, 329]


class _NoRange(http.server.SimpleHTTPRequestHandler):
    """The stdlib handler: ignores Range (always 200 with the whole file)."""

    sent = 0

    def log_message(self, *a):
        pass

    def copyfile(self, source, outputfile):
        data = source.read()
        type(self).sent += len(data)
        outputfile.write(data)


def test_server_that_ignores_range_falls_back(big, tmp_path):
    srv = http.server.ThreadingHTTPServer(("127.0.0.1", 0), functools.partial(_NoRange, directory=str(big)))
    t = threading.Thread(target=srv.serve_forever, daemon=True)
    t.start()
    try:
        m = load_manifest(str(big / "manifest.json"))
        shard = m.shards[0]
        shard.url = f"http://127.0.0.1:{srv.server_address[1]}/{os.path.basename(shard.url)}"
        rec = Recorder()
        st = ShardStore(cache_dir=str(tmp_path / "cache"), fetch=fast_config(), verify="always", on_event=rec)
        path = st.ensure(shard)
        _flip(path, shard.sample_range(3)[0] + 1000)
        _NoRange.sent = 0
        again = st.ensure(shard)
    finally:
        srv.shutdown()
        srv.server_close()
    assert _hash(again) == shard.xxh3_64
    assert rec.kinds("range_repair") and not rec.kinds("range_repair_done")  # tried, fell back
    assert _NoRange.sent >= shard.size


def test_cli_verify_names_and_repairs_remote_samples(big, tmp_path):
    from click.testing import CliRunner

    from resumewds.cli._main import cli

    cache = str(tmp_path / "cache")
    with FaultServer(str(big)) as srv:
        url = srv.url.rstrip("/") + "/manifest.json"
        res = CliRunner().invoke(cli, ["verify", url, "--cache-dir", cache, "--no-progress"])
        assert res.exit_code == 0, res.stderr
        m = load_manifest(str(big / "manifest.json"))
        shard = m.shards[0]
        entry = ShardStore(cache_dir=cache).entry_path(srv.url.rstrip("/") + "/" + os.path.basename(shard.url))
        a, b = shard.sample_range(42)
        _flip(entry, a + 3000)
        srv.reset_counters()
        res = CliRunner().invoke(cli, ["verify", url, "--cache-dir", cache, "--no-progress"])
        sent = srv.bytes_sent - srv.bytes_by_path.get("/manifest.json", 0)
    assert res.exit_code == 0, res.stderr
    assert f"sample 42 (key s0042, bytes {a}-{b}) in the cached copy" in res.stderr
    assert "repaired " in res.stderr and "verify: 1 ok, 0 failed" in res.stderr
    assert _hash(entry) == shard.xxh3_64 and sent <= 0.01 * shard.size


def _states_valid(rec):
    """Replay the events through the journal's shard-state table: no invalid move."""
    from resumewds.events import shard_effects
    from resumewds.journal._states import TRANSITIONS

    effects, state, bad = shard_effects(), "pending", []
    for kind, _, _ in rec.events:
        new = effects.get(kind, (None, None))[0]
        if new is not None and new != state:
            if new not in TRANSITIONS[state]:
                bad.append((state, new, kind))
            state = new
    return state, bad


def test_range_repairs_keep_the_journal_states_valid(big, tmp_path):
    with FaultServer(str(big)) as srv:
        shard, st, rec = _setup(big, tmp_path, srv)
        srv.script("/" + os.path.basename(shard.url), ["flip_data"])
        path = st.ensure(shard)  # a sample of the download arrived corrupt: asked for again
        _flip(path, shard.sample_range(9)[0] + 900)
        st.ensure(shard)  # corrupt entry, repaired by range
    assert _states_valid(rec) == ("verified", [])
    assert st.counters["repair"] == 1 and st.counters["range_repair_done"] == 1
