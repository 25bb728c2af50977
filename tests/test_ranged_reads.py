"""Verified sample-granular remote reads.

A real FaultServer on 127.0.0.1 serves v3 shards (per-sample digests).
From a cold cache the first samples come by HTTP Range or from the sparse
partial download, each checked against its digest, while the whole shard
downloads in the background; the delivered sequence is compared, whole, with
an uninterrupted warm-cache run, and what was fetched with the server's own
counters (requests with a ``Range`` header, bytes sent).
"""

from __future__ import annotations

import os
import shutil

import pytest

import resumewds as rw
from chaos.faultserver import FaultServer
from resumewds import synth
from resumewds.errors import ChecksumMismatch
from resumewds.tar import _io as tario

pytestmark = pytest.mark.usefixtures("cache_dir")

SHARDS = 3
SAMPLES = 400


@pytest.fixture
def v3(tmp_path):
    """A directory with SHARDS shards and a v3 manifest.json (sample digests)."""
    root = tmp_path / "srv"
    synth.write_shards(str(root), shards=SHARDS, samples=SAMPLES, size_range=(1000, 4000), seed=5)
    rw.build_manifest(str(root / f"shard-{{000000..{SHARDS - 1:06d}}}.tar"), str(root / "manifest.json"),
                      digests=True)
    return str(root)


def _truth(root):
    """Every sample's bytes, by key, read locally."""
    out = {}
    for name in sorted(os.listdir(root)):
        if name.endswith(".tar"):
            for s in tario.iter_samples_file(os.path.join(root, name)):
                out[s["__key__"]] = {k: bytes(v) for k, v in s.items() if not k.startswith("__")}
    return out


def _plain(s):
    return (s["__key__"], s["__index__"], tuple(sorted((k, bytes(v)) for k, v in s.items()
                                                       if not k.startswith("__"))))


def _run(url, cache, **kw):
    """The whole epoch, direct iteration: the plain samples."""
    ds = rw.WebDataset(url + "manifest.json", cache_dir=cache, seed=11, **kw)
    try:
        return [_plain(s) for s in ds]
    finally:
        ds.close()


def _ranged(srv):
    """Requests for shards with a ``Range`` header the server answered."""
    return sum(n for p, n in srv.ranged.items() if p.endswith(".tar"))


def _warm(root, tmp_path, **kw):
    """The reference: a warm cache (every shard downloaded and published by a first epoch)."""
    cache = str(tmp_path / "warm")
    with FaultServer(root) as srv:
        url = srv.url.rstrip("/") + "/"
        _run(url, cache, **kw)  # fills the cache
        srv.reset_counters()
        got = _run(url, cache, **kw)
        assert not any(n for p, n in srv.requests.items() if p.endswith(".tar"))  # every sample from the cache
    return got


@pytest.mark.parametrize("shuffle", [pytest.param(False, marks=pytest.mark.slow), "shards", True])
def test_first_sample_arrives_before_its_shard_is_downloaded(v3, tmp_path, shuffle):
    """Cold cache, a server at 1 MB/s per connection (a shard takes seconds): the first
    sample is delivered, verified, while its shard is still downloading; the epoch is
    exactly the warm run's."""
    warm = _warm(v3, tmp_path, shuffle=shuffle)
    cache = str(tmp_path / "cold")
    with FaultServer(v3, bytes_per_second=1_000_000) as srv:
        url = srv.url.rstrip("/") + "/"
        ds = rw.WebDataset(url + "manifest.json", cache_dir=cache, seed=11, shuffle=shuffle)
        it = iter(ds)
        first = next(it)
        shard = next(s for s in ds.manifest.shards if s.url == first["__url__"])
        entry = ds.store.entry_path(shard.url)
        # its shard is not a cache entry yet, and the server has not sent all of it
        assert not os.path.exists(entry + ".meta")
        assert srv.bytes_by_path["/" + shard.url.rsplit("/", 1)[1]] < shard.size
        got = [_plain(first)] + [_plain(s) for s in it]
        ds.close()
    assert got == warm


def _tiny_cache(monkeypatch):
    # nothing fits: prefetch downloads nothing, every sample is read by range (item 5)
    monkeypatch.setenv("RESUMEWDS_CACHE_SIZE", "1")


def test_a_flipped_byte_in_a_range_is_never_delivered(v3, tmp_path, monkeypatch):
    truth = _truth(v3)
    warm = _warm(v3, tmp_path, shuffle=True)
    _tiny_cache(monkeypatch)
    with FaultServer(v3) as srv:
        srv.script("/shard-000001.tar", ["flip_data", "flip_header"])  # its first two ranges
        got = _run(srv.url.rstrip("/") + "/", str(tmp_path / "cold"), shuffle=True)
        assert srv.faults["flip_data"] == 1 and srv.faults["flip_header"] == 1
    # each flipped response is caught: the sample it hit is asked for again, alone
    assert got == warm
    assert all(dict(s[2]) == truth[s[0]] for s in got)


@pytest.mark.parametrize("on_error", ["skip", "raise"])
def test_a_range_that_stays_corrupt_follows_on_error(v3, tmp_path, monkeypatch, on_error):
    truth = _truth(v3)
    _tiny_cache(monkeypatch)
    monkeypatch.setenv("RESUMEWDS_FETCH_ATTEMPTS", "3")
    with FaultServer(v3) as srv:
        for i in range(SHARDS):  # every response for a shard has a flipped byte
            srv.script(f"/shard-{i:06d}.tar", ["flip_data"] * 100)
        url = srv.url.rstrip("/") + "/"
        if on_error == "raise":
            with pytest.raises(ChecksumMismatch, match="mismatch"):
                _run(url, str(tmp_path / "cold"), on_error="raise")
            return
        ds = rw.WebDataset(url + "manifest.json", cache_dir=str(tmp_path / "cold"), seed=11, on_error="skip")
        got = list(ds)
        events = ds.take_events()
        ds.close()
    # every shard is corrupt on the wire: nothing is delivered, each shard skipped, with its reason
    assert got == [] or all(truth[s["__key__"]] == {k: bytes(v) for k, v in s.items()
                                                    if not k.startswith("__")} for s in got)
    assert got == []
    skipped = {e["url"].rsplit("/", 1)[1] for e in events if e["kind"] == "skip"}
    assert skipped == {f"shard-{i:06d}.tar" for i in range(SHARDS)}


def test_a_reset_during_a_ranged_read_is_retried(v3, tmp_path, monkeypatch):
    warm = _warm(v3, tmp_path, shuffle="shards")
    _tiny_cache(monkeypatch)
    with FaultServer(v3) as srv:
        srv.script("/shard-000000.tar", ["reset@0.5", "truncate@0.3"])
        srv.script("/shard-000002.tar", ["reset@0.1"])
        got = _run(srv.url.rstrip("/") + "/", str(tmp_path / "cold"), shuffle="shards")
        assert srv.faults["reset"] == 2 and srv.faults["truncate"] == 1
    assert got == warm


def test_a_range_that_fails_its_own_attempts_while_the_shard_progresses_is_read_whole(tmp_path, monkeypatch):
    """The first sample's range gets ``attempts`` 503s in a row while the step's other
    ranges of its shard keep bringing verified samples (the shard's budget holds): the
    shard is read the whole-shard way, and the epoch equals the local one."""
    root = str(tmp_path / "one")
    synth.write_shards(root, shards=1, samples=200, size_range=(2000, 4000), seed=3)
    local = os.path.join(root, "manifest.json")
    rw.build_manifest(os.path.join(root, "shard-000000.tar"), local, digests=True)
    ref = [s["__key__"] for s in rw.WebDataset(local, cache_dir=str(tmp_path / "ref"), seed=5, shuffle=True)]
    keys = [s["__key__"] for s in tario.iter_samples_file(os.path.join(root, "shard-000000.tar"))]
    first = rw.load_manifest(local).shards[0].offsets[keys.index(ref[0])]
    monkeypatch.setenv("RESUMEWDS_FETCH_ATTEMPTS", "3")
    # 503 with Retry-After 1 s: the first range's three attempts span 2 s, while the other
    # ranges of the step (the read-ahead, ~0.5 MB at 60 kB/s) verify a sample every ~50 ms
    with FaultServer(root, bytes_per_second=60_000, retry_after=1.0) as srv:
        srv.script("/shard-000000.tar", ["503"] * 3, range_from=int(first))
        ds = rw.WebDataset(srv.url + "manifest.json", cache_dir=str(tmp_path / "cold"), seed=5, shuffle=True)
        try:
            got = [s["__key__"] for s in ds]
        finally:
            ds.close()
        assert srv.faults["503"] == 3
    assert got == ref


def test_cold_resume_from_a_state_dict_equals_the_uninterrupted_warm_run(v3, tmp_path):
    warm = _warm(v3, tmp_path, shuffle=True)
    with FaultServer(v3, bytes_per_second=4_000_000) as srv:
        url = srv.url.rstrip("/") + "/"
        ds = rw.WebDataset(url + "manifest.json", cache_dir=str(tmp_path / "c1"), seed=11, shuffle=True)
        head = []
        for s in ds:
            head.append(_plain(s))
            if len(head) == 77:
                break
        state = ds.state_dict()
        ds.close()
        # a fresh node: another (empty) cache
        ds2 = rw.WebDataset(url + "manifest.json", cache_dir=str(tmp_path / "c2"), seed=11, shuffle=True)
        ds2.load_state_dict(state)
        tail = [_plain(s) for s in ds2]
        ds2.close()
    assert head + tail == warm


def test_cold_webloader_with_workers_equals_the_warm_run(v3, tmp_path):
    """Real DataLoader worker processes, each with its own ranged reads."""
    pytest.importorskip("torch")

    def keys(url, cache, **kw):
        ds = rw.WebDataset(url + "manifest.json", cache_dir=cache, seed=11, shuffle=True, **kw)
        with rw.WebLoader(ds, batch_size=16, num_workers=2, collate_fn=lambda b: b) as ld:
            return [(s["__key__"], bytes(s["bin"])) for b in ld for s in b]

    with FaultServer(v3, bytes_per_second=2_000_000) as srv:
        url = srv.url.rstrip("/") + "/"
        keys(url, str(tmp_path / "w"))
        srv.reset_counters()
        warm = keys(url, str(tmp_path / "w"))  # a warm cache: nothing fetched
        assert not any(n for p, n in srv.requests.items() if p.endswith(".tar"))
    with FaultServer(v3, bytes_per_second=2_000_000) as srv:
        cold = keys(srv.url.rstrip("/") + "/", str(tmp_path / "cold"))
        ranged = _ranged(srv)
    assert cold == warm and ranged > SHARDS  # the workers' own ranges, and the downloads' pieces


@pytest.mark.parametrize("threads", [pytest.param(None, marks=pytest.mark.slow), 2,
                                     pytest.param(8, marks=pytest.mark.slow)])
def test_the_cache_stays_within_its_budget_when_a_window_does_not_fit(v3, tmp_path, monkeypatch, threads):
    """cache_size of about one shard, a window of all three: the cache never holds more
    than cache_size (partial downloads included: prefetch reserves a shard's size
    before it downloads it, however many threads download at once, and the
    reader reads what is not cached by range); the rest is read by range."""
    warm = _warm(v3, tmp_path, shuffle=True)
    size = max(os.path.getsize(os.path.join(v3, n)) for n in os.listdir(v3) if n.endswith(".tar"))
    budget = int(size * 1.2)
    monkeypatch.setenv("RESUMEWDS_CACHE_SIZE", str(budget))
    cache = str(tmp_path / "cold")
    peak = 0
    with FaultServer(v3, bytes_per_second=3_000_000) as srv:
        ds = rw.WebDataset(srv.url.rstrip("/") + "/manifest.json", cache_dir=cache, seed=11, shuffle=True)
        if threads is not None:
            ds.store.prefetch_threads = threads
        got = []
        for s in ds:
            got.append(_plain(s))
            peak = max(peak, ds.store.cached_bytes())
        ds.close()
    assert got == warm
    assert peak <= budget, (peak, budget)


def test_local_and_v2_shards_are_read_as_before(v3, tmp_path):
    """No digests (v2) or local shards: no ranged reads, same samples."""
    m = rw.build_manifest(os.path.join(v3, f"shard-{{000000..{SHARDS - 1:06d}}}.tar"))
    ds = rw.WebDataset(m, cache_dir=str(tmp_path / "c"), seed=11, shuffle=True)
    local = [_plain(s) for s in ds]
    ds.close()
    os.makedirs(tmp_path / "v2")
    for n in os.listdir(v3):
        if n.endswith(".tar"):
            shutil.copy(os.path.join(v3, n), tmp_path / "v2" / n)
    rw.build_manifest(str(tmp_path / "v2" / f"shard-{{000000..{SHARDS - 1:06d}}}.tar"),
                      str(tmp_path / "v2" / "manifest.json"))
    with FaultServer(str(tmp_path / "v2")) as srv:
        got = _run(srv.url.rstrip("/") + "/", str(tmp_path / "c2"), shuffle=True)
        assert all(n == 1 for p, n in srv.requests.items() if p.endswith(".tar"))  # whole shards only
        assert _ranged(srv) == 0
    assert [g[:2] for g in got] == [g[:2] for g in local]


def test_webloader_resume_on_a_fresh_cold_node_equals_the_warm_run(v3, tmp_path):
    """Interrupt a cold WebLoader (2 workers) mid-epoch, resume its state in a new
    loader (0 workers) on another empty cache: head + tail is the warm run, whole."""
    pytest.importorskip("torch")

    def loader(url, cache, workers):
        ds = rw.WebDataset(url + "manifest.json", cache_dir=cache, seed=11, shuffle=True)
        return rw.WebLoader(ds, batch_size=16, num_workers=workers, collate_fn=lambda b: b)

    def plain(batch):
        return [(s["__key__"], s["__index__"], bytes(s["bin"])) for s in batch]

    with FaultServer(v3) as srv:
        url = srv.url.rstrip("/") + "/"
        [plain(b) for b in loader(url, str(tmp_path / "w"), 0)]
        warm = [plain(b) for b in loader(url, str(tmp_path / "w"), 0)]
    with FaultServer(v3, bytes_per_second=2_000_000) as srv:
        url = srv.url.rstrip("/") + "/"
        first = loader(url, str(tmp_path / "a"), 2)
        head = []
        for b in first:
            head.append(plain(b))
            if len(head) == 23:
                break
        state = first.state_dict()
        first.close()
        srv.reset_counters()
        fresh = loader(url, str(tmp_path / "b"), 0)
        fresh.load_state_dict(state)
        tail = [plain(b) for b in fresh]
        fresh.close()
        ranged = _ranged(srv)
    assert head + tail == warm
    assert ranged > 0


def test_a_mixture_reads_its_sources_by_range_too(tmp_path):
    """MixedDataset over two remote v3 sources, cold cache, a slow server: the
    first sample is delivered (verified, by range or from the partial) while
    its shard is still downloading, and the whole epoch equals a warm run."""
    roots = []
    for i in range(2):
        root = tmp_path / f"src{i}"
        # shards of ~2 MB: a sparse download fetches its pieces over several connections at once
        synth.write_shards(str(root), shards=2, samples=800, size_range=(1000, 4000), seed=20 + i)
        rw.build_manifest(str(root / "shard-{000000..000001}.tar"), str(root / "manifest.json"), digests=True)
        roots.append(str(root))

    def mix(urls, cache):
        srcs = [rw.WebDataset(u + "manifest.json", cache_dir=cache, seed=3 + i, shuffle=True)
                for i, u in enumerate(urls)]
        return rw.MixedDataset(srcs, weights=[0.6, 0.4], epoch_size=300, seed=9)

    def plain(s):
        return (s["__key__"], tuple(sorted((k, bytes(v)) for k, v in s.items() if not k.startswith("__"))))

    with FaultServer(roots[0]) as a, FaultServer(roots[1]) as b:
        urls = [a.url.rstrip("/") + "/", b.url.rstrip("/") + "/"]
        list(mix(urls, str(tmp_path / "warm")))  # fills the cache
        warm = [plain(s) for s in mix(urls, str(tmp_path / "warm"))]
    with FaultServer(roots[0], bytes_per_second=500_000) as a, \
            FaultServer(roots[1], bytes_per_second=500_000) as b:
        urls = [a.url.rstrip("/") + "/", b.url.rstrip("/") + "/"]
        ds = mix(urls, str(tmp_path / "cold"))
        it = iter(ds)
        first = next(it)
        src = next(d for d in ds.datasets if any(s.url == first["__url__"] for s in d.manifest.shards))
        shard = next(s for s in src.manifest.shards if s.url == first["__url__"])
        assert not os.path.exists(src.store.entry_path(shard.url) + ".meta")  # not downloaded whole yet
        got = [plain(first)] + [plain(s) for s in it]
        ranged = _ranged(a) + _ranged(b)
    assert got == warm
    assert ranged > 0


# ---- a server that ignores Range; the switches ----

@pytest.mark.parametrize("how", ["flag", "script"])
def test_a_server_that_ignores_range_falls_back_to_whole_shards(v3, tmp_path, monkeypatch, how):
    """``how="flag"``: every Range request is answered 200 with the whole file;
    ``"script"``: only shard 0's first request (with a cache too small for any
    prefetch, so that every request is a Range request).  Those shards are read
    the whole-shard way (downloaded, whole-shard checked: a flipped byte in that
    download is caught and repaired), the others by range, and the epoch is
    exactly the warm run's, every sample equal to the file's."""
    truth = _truth(v3)
    warm = _warm(v3, tmp_path, shuffle=True)
    if how == "script":
        _tiny_cache(monkeypatch)
    kw = {"ignore_range": True, "bytes_per_second": 4_000_000} if how == "flag" else {}
    with FaultServer(v3, **kw) as srv:
        if how == "script":
            # its first range is answered whole, then its whole-shard download has a flipped byte
            srv.script("/shard-000000.tar", ["ignore_range", "flip_data"])
        else:
            # the first two responses of shard 1 (a whole-shard GET, or a range answered whole)
            srv.script("/shard-000001.tar", ["flip_data", "flip_data"])
        url = srv.url.rstrip("/") + "/"
        ds = rw.WebDataset(url + "manifest.json", cache_dir=str(tmp_path / "cold"), seed=11, shuffle=True)
        got = [_plain(s) for s in ds]
        ds.close()
        ignored, flipped = srv.faults["ignore_range"], srv.faults["flip_data"]
        whole = {p: n - srv.ranged.get(p, 0) for p, n in srv.requests.items() if p.endswith(".tar")}
    assert got == warm
    assert all(dict(s[2]) == truth[s[0]] for s in got)
    assert flipped == (2 if how == "flag" else 1)
    if how == "flag":
        assert ignored >= 1
    else:
        assert ignored == 1 and whole.get("/shard-000000.tar", 0) >= 1  # shard 0 fetched whole after that


def test_the_ranged_reads_argument_is_accepted_and_ignored(v3, tmp_path):
    """``WebDataset(ranged_reads=False)`` (an earlier switch) is accepted with a
    DeprecationWarning, and reads as every data set does: the same epoch."""
    warm = _warm(v3, tmp_path, shuffle=True)
    with FaultServer(v3, bytes_per_second=2_000_000) as srv:
        with pytest.warns(DeprecationWarning, match="ranged_reads= is ignored"):
            got = _run(srv.url.rstrip("/") + "/", str(tmp_path / "off"), shuffle=True, ranged_reads=False)
        assert _ranged(srv) > 0
    assert got == warm
