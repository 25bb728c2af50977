"""Verified sample-granular remote reads.

A real FaultServer on 127.0.0.1 serves v3 shards (per-sample digests).
From a cold cache the first samples come by HTTP Range or from the partial
download, each checked against its digest, while the whole shard downloads
in the background; the delivered sequence is compared, whole, with an
uninterrupted warm-cache run.
"""

from __future__ import annotations

import os
import shutil

import pytest

import resumewds as rw
from chaos.faultserver import FaultServer
from resumewds import reading, synth, tario
from resumewds.cache import sparsepieces
from resumewds.errors import ChecksumMismatch

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
    """The whole epoch, direct iteration: (plain samples, ranged counters)."""
    ds = rw.WebDataset(url + "manifest.json", cache_dir=cache, seed=11, **kw)
    try:
        got = [_plain(s) for s in ds]
        rr = ds._reader.ranged if ds._reader is not None else None
        return got, dict(rr.counters) if rr is not None else {}
    finally:
        ds.close()


def _warm(root, tmp_path, **kw):
    """The reference: a warm cache (every shard downloaded whole first), ranged reads off."""
    cache = str(tmp_path / "warm")
    with FaultServer(root) as srv:
        url = srv.url.rstrip("/") + "/"
        _run(url, cache, ranged_reads=False, **kw)  # fills the cache
        got, counters = _run(url, cache, ranged_reads=False, **kw)
    assert not any(counters.values())  # ranged reads off: every sample from the cache
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
        counters = dict(ds._reader.ranged.counters)
        ds.close()
    assert got == warm
    assert counters["range_samples"] + counters["partial_samples"] > 0
    if shuffle is not True:  # front to back: the partial download serves most samples
        assert counters["partial_samples"] > 0


def _tiny_cache(monkeypatch):
    # nothing fits: prefetch downloads nothing, every sample is read by range (item 5)
    monkeypatch.setenv("RESUMEWDS_CACHE_SIZE", "1")


def test_a_flipped_byte_in_a_range_is_never_delivered(v3, tmp_path, monkeypatch):
    truth = _truth(v3)
    warm = _warm(v3, tmp_path, shuffle=True)
    _tiny_cache(monkeypatch)
    with FaultServer(v3) as srv:
        srv.script("/shard-000001.tar", ["flip_data", "flip_header"])  # its first two ranges
        got, counters = _run(srv.url.rstrip("/") + "/", str(tmp_path / "cold"), shuffle=True)
        assert srv.faults["flip_data"] == 1 and srv.faults["flip_header"] == 1
    # each flipped response is caught: a range needed now is fetched again, a sample
    # read ahead is dropped (and fetched when it is needed); a flip in the bytes
    # between two needed samples of one coalesced range is never read at all
    assert 1 <= counters["range_refetches"] + counters["range_dropped"] <= 2
    assert got == warm
    assert all(dict(s[2]) == truth[s[0]] for s in got)
    shards_dir = tmp_path / "cold" / "shards"
    assert not shards_dir.exists() or not [n for n in os.listdir(shards_dir) if n.endswith(".meta")]


@pytest.mark.parametrize("on_error", ["skip", "raise"])
def test_a_range_that_stays_corrupt_follows_on_error(v3, tmp_path, monkeypatch, on_error):
    truth = _truth(v3)
    _tiny_cache(monkeypatch)
    monkeypatch.setenv("RESUMEWDS_FETCH_ATTEMPTS", "3")
    # no read-ahead: every sample a response carries is needed (a flip read ahead is only dropped)
    monkeypatch.setattr(reading, "RANGE_BLOCK", 0)
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
        refetches = ds._reader.ranged.counters["range_refetches"]
        ds.close()
    # every shard is corrupt on the wire: nothing is delivered, each shard skipped, with its reason
    assert got == [] or all(truth[s["__key__"]] == {k: bytes(v) for k, v in s.items()
                                                    if not k.startswith("__")} for s in got)
    assert got == []
    skipped = {e["url"].rsplit("/", 1)[1] for e in events if e["kind"] == "skip"}
    assert skipped == {f"shard-{i:06d}.tar" for i in range(SHARDS)}
    # each shard's first bad range cost one attempt and sent it to the whole-shard path
    # (downloads and range repairs, as corrupt), which spent the rest of its budget
    assert refetches >= SHARDS


def test_a_reset_during_a_ranged_read_is_retried(v3, tmp_path, monkeypatch):
    warm = _warm(v3, tmp_path, shuffle="shards")
    _tiny_cache(monkeypatch)
    with FaultServer(v3) as srv:
        srv.script("/shard-000000.tar", ["reset@0.5", "truncate@0.3"])
        srv.script("/shard-000002.tar", ["reset@0.1"])
        got, counters = _run(srv.url.rstrip("/") + "/", str(tmp_path / "cold"), shuffle="shards")
        assert srv.faults["reset"] == 2 and srv.faults["truncate"] == 1
    assert got == warm
    assert counters["range_samples"] == SHARDS * SAMPLES and counters["range_refetches"] == 0


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
        # ranged_reads=False reaches the worker processes: whole shards only, once each
        keys(url, str(tmp_path / "w"), ranged_reads=False)
        warm = keys(url, str(tmp_path / "w"), ranged_reads=False)
        assert {p: n for p, n in srv.requests.items() if p.endswith(".tar")} == {
            f"/shard-{i:06d}.tar": 1 for i in range(SHARDS)}
    with FaultServer(v3, bytes_per_second=2_000_000) as srv:
        cold = keys(srv.url.rstrip("/") + "/", str(tmp_path / "cold"))
        ranged = sum(1 for _ in srv.request_log)
    assert cold == warm and ranged > SHARDS + 1  # more requests than one per shard: ranges


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
        counters = dict(ds._reader.ranged.counters)
        ds.close()
    assert got == warm
    assert peak <= budget, (peak, budget)
    assert counters["range_samples"] > 0


def test_local_and_v2_shards_are_read_as_before(v3, tmp_path):
    """No digests (v2) or local shards: no ranged reads, same samples."""
    m = rw.build_manifest(os.path.join(v3, f"shard-{{000000..{SHARDS - 1:06d}}}.tar"))
    ds = rw.WebDataset(m, cache_dir=str(tmp_path / "c"), seed=11, shuffle=True)
    local = [_plain(s) for s in ds]
    assert ds._reader.ranged is not None and not ds._reader.ranged.active
    ds.close()
    os.makedirs(tmp_path / "v2")
    for n in os.listdir(v3):
        if n.endswith(".tar"):
            shutil.copy(os.path.join(v3, n), tmp_path / "v2" / n)
    rw.build_manifest(str(tmp_path / "v2" / f"shard-{{000000..{SHARDS - 1:06d}}}.tar"),
                      str(tmp_path / "v2" / "manifest.json"))
    with FaultServer(str(tmp_path / "v2")) as srv:
        got, counters = _run(srv.url.rstrip("/") + "/", str(tmp_path / "c2"), shuffle=True)
        assert all(n == 1 for p, n in srv.requests.items() if p.endswith(".tar"))  # whole shards only
    assert [g[:2] for g in got] == [g[:2] for g in local] and counters["range_samples"] == 0


def test_read_ahead_blocks_deliver_the_same_sequence_with_fewer_requests(v3, tmp_path, monkeypatch):
    warm = _warm(v3, tmp_path, shuffle=True)
    _tiny_cache(monkeypatch)
    with FaultServer(v3) as srv:
        got, plain = _run(srv.url.rstrip("/") + "/", str(tmp_path / "c0"), shuffle=True)
        n_plain = sum(n for p, n in srv.requests.items() if p.endswith(".tar"))
        monkeypatch.setattr(reading, "RANGE_BLOCK", 256 * 1024)
        srv.script("/shard-000002.tar", ["flip_data"] * 3)
        got2, ahead = _run(srv.url.rstrip("/") + "/", str(tmp_path / "c1"), shuffle=True)
        n_ahead = sum(n for p, n in srv.requests.items() if p.endswith(".tar")) - n_plain
    assert got == warm and got2 == warm
    assert ahead["range_ahead"] > 0 and n_ahead < n_plain
    assert ahead["range_refetches"] + ahead["range_dropped"] >= 1


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
        reading.RANGED_READS = False
        try:
            warm = [plain(b) for b in loader(url, str(tmp_path / "w"), 0)]
        finally:
            reading.RANGED_READS = True
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
        fresh = loader(url, str(tmp_path / "b"), 0)
        fresh.load_state_dict(state)
        tail = [plain(b) for b in fresh]
        counters = dict(fresh.dataset._reader.ranged.counters)
        fresh.close()
    assert head + tail == warm
    assert counters["range_samples"] + counters["partial_samples"] > 0


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
        reading.RANGED_READS = False
        try:
            list(mix(urls, str(tmp_path / "warm")))  # fills the cache
            warm = [plain(s) for s in mix(urls, str(tmp_path / "warm"))]
        finally:
            reading.RANGED_READS = True
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
        ranged = sum(d._reader.ranged.counters["range_samples"] + d._reader.ranged.counters["partial_samples"]
                     for d in ds.datasets if d._reader is not None and d._reader.ranged is not None)
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
        rr = ds._reader.ranged
        counters, off = dict(rr.counters), set(rr.off)
        ds.close()
        ignored, flipped = srv.faults["ignore_range"], srv.faults["flip_data"]
    assert got == warm
    assert all(dict(s[2]) == truth[s[0]] for s in got)
    assert flipped == (2 if how == "flag" else 1)
    if how == "flag":
        # no sample came by range: each was read from a verified partial or the cache
        # (a shard whose samples the partial download served before its first range
        # was asked for never meets the server's answer: it is not in ``off``)
        assert ignored >= 1 and off and off <= set(range(SHARDS))
        assert counters["range_samples"] == 0 and counters["range_bytes"] == 0
    else:
        assert ignored == 1 and off == {0}
        # shards 1 and 2: every sample by range; shard 0: the few of its first step's other
        # ranges (answered 206, verified), then whole
        assert (SHARDS - 1) * SAMPLES <= counters["range_samples"] < (SHARDS - 1) * SAMPLES + SAMPLES // 2


def test_ranged_reads_switch_argument_and_environment(v3, tmp_path, monkeypatch):
    """``WebDataset(ranged_reads=False)`` and ``RESUMEWDS_RANGED_READS=0`` read every
    shard whole (one GET per shard, no ranges), the argument wins over the
    environment, and the epoch is the same either way."""
    warm = _warm(v3, tmp_path, shuffle=True)

    def run(name, **kw):
        with FaultServer(v3, bytes_per_second=2_000_000) as srv:
            got, counters = _run(srv.url.rstrip("/") + "/", str(tmp_path / name), shuffle=True, **kw)
            gets = sum(n for p, n in srv.requests.items() if p.endswith(".tar"))
        return got, counters, gets

    got, counters, gets = run("off-arg", ranged_reads=False)
    assert got == warm and counters["range_samples"] + counters["partial_samples"] == 0 and gets == SHARDS
    monkeypatch.setenv("RESUMEWDS_RANGED_READS", "0")
    got, counters, gets = run("off-env")
    assert got == warm and counters["range_samples"] + counters["partial_samples"] == 0 and gets == SHARDS
    got, counters, gets = run("on-arg", ranged_reads=True)  # the argument wins
    assert got == warm and counters["range_samples"] + counters["partial_samples"] > 0
    monkeypatch.setenv("RESUMEWDS_RANGED_READS", "1")
    got, counters, _ = run("on-env")
    assert got == warm and counters["range_samples"] + counters["partial_samples"] > 0
    monkeypatch.setenv("RESUMEWDS_RANGED_READS", "maybe")
    with pytest.raises(ValueError, match="RESUMEWDS_RANGED_READS"):
        run("bad")


def test_a_shuffled_window_waits_for_samples_just_past_a_growing_partial(v3, tmp_path, monkeypatch):
    """Shuffled window, cold cache, a slow server: a sample at most WINDOW_AHEAD past
    the end of a partial download this process is writing is waited for (while
    the step's other ranges are fetched) instead of being fetched by range and
    downloaded again; every one is verified, and the epoch is the warm run's."""
    truth = _truth(v3)
    warm = _warm(v3, tmp_path, shuffle=True)
    monkeypatch.setattr(reading, "WINDOW_STALL", 2.0)  # a loaded test machine: the download may pause
    # the downloads run from the start (by default they wait for the first step): partials to wait for early
    monkeypatch.setattr(sparsepieces, "FIRST_STEP_CONNECTIONS", 1)
    with FaultServer(v3, bytes_per_second=2_000_000) as srv:
        got, counters = _run(srv.url.rstrip("/") + "/", str(tmp_path / "cold"), shuffle=True)
    assert got == warm
    assert all(dict(s[2]) == truth[s[0]] for s in got)
    assert counters["window_waits"] > 0 and counters["window_partial"] > 0
    assert counters["partial_samples"] >= counters["window_partial"]
    # off: nothing is waited for, the same samples are delivered
    monkeypatch.setattr(reading, "WINDOW_AHEAD", 0)
    with FaultServer(v3, bytes_per_second=2_000_000) as srv:
        got, counters = _run(srv.url.rstrip("/") + "/", str(tmp_path / "cold2"), shuffle=True)
    assert got == warm and counters["window_waits"] == 0
