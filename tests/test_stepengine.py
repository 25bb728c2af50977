"""The one step engine: a data set and a mixture of one source are the same steps.

:func:`resumewds.read.run_steps` reads the steps of a data set and of a
mixture; a single data set is the mixture of one source.  A mixture of one
source delivers the same samples, batches and ``meta`` as the data set alone
(less the mixture's own ``__source__`` tag and ``meta["sources"]``), through
the same reads: open shards read by the engine itself and runs of
consecutive samples in one ``pread``.
"""

from __future__ import annotations

import os

import pytest

import resumewds as rw
from resumewds.plan._plan import Layout
from resumewds.synth import write_shards

pytestmark = pytest.mark.usefixtures("cache_dir")

MIXTURE_ONLY = ("sources",)
TIMINGS = ("t_read", "t_stages", "t_fetch_wait")


def _plain(x):
    """Values comparable across two runs: bytes, lists of arrays, nested dicts."""
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items() if k != "__source__"}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    if isinstance(x, memoryview):
        return bytes(x)
    if hasattr(x, "tolist"):
        return x.tolist()
    return x


def _meta(m):
    """A step's meta less its timings and the mixture's own keys; events by kind and url."""
    out = {k: v for k, v in m.items() if k not in TIMINGS + MIXTURE_ONLY}
    out["events"] = sorted((e.get("kind"), e.get("url")) for e in m.get("events", ()))
    return out


def _steps(ds, epoch, layout, worker=0, nw=1, collate=True):
    return [(k, _plain(b), _meta(m)) for k, b, m in ds.iter_steps(epoch, 0, layout, worker, nw, collate=collate)]


@pytest.fixture
def two_dirs(tmp_path):
    a = write_shards(str(tmp_path / "a"), shards=4, samples=23, size_range=(10, 900))
    rw.build_manifest(a, str(tmp_path / "a" / "manifest.json"))
    return str(tmp_path / "a" / "manifest.json"), a


def _damaged(tmp_path):
    """A manifest of 3 shards whose shard 1 was cut after indexing (found when read)."""
    paths = write_shards(str(tmp_path / "bad"), shards=3, samples=9)
    rw.build_manifest(paths, str(tmp_path / "bad" / "manifest.json"))
    with open(paths[1], "r+b") as f:
        f.truncate(os.path.getsize(paths[1]) // 2)
    return str(tmp_path / "bad" / "manifest.json")


@pytest.mark.parametrize("shuffle", [False, True, "shards"])
@pytest.mark.parametrize("collate", [True, False])
def test_a_mixture_of_one_source_is_the_data_set_alone(tmp_path, two_dirs, shuffle, collate):
    man, _ = two_dirs
    caches = iter(range(100))

    def alone():
        # no background prefetch (every event comes from the step's own reads) and a cache
        # of its own (the first verification of a shard is an event)
        ds = rw.WebDataset(man, shuffle=shuffle, seed=5, prefetch=0, cache_dir=str(tmp_path / f"c{next(caches)}"))
        return ds.map(lambda s: s if s["__index__"] % 5 else None)

    for epoch, (bs, world, rank), (w, nw) in ((0, (5, 1, 0), (0, 1)), (1, (4, 2, 1), (1, 2)),
                                                (2, (7, 3, 2), (0, 2))):
        layout = Layout(batch_size=bs, world_size=world, rank=rank, remainder="pad")
        mix = rw.MixedDataset([alone()], weights=[1], seed=1, names=["only"])
        one = _steps(alone(), epoch, layout, w, nw, collate)
        mixed = list(mix.iter_steps(epoch, 0, layout, w, nw, collate=collate))
        assert one and [(k, _plain(b), _meta(m)) for k, b, m in mixed] == one
        for _, _, m in mixed:  # the mixture's own keys
            assert m["sources"] == ({0: sum(m["shards"].values())} if m["shards"] else {})
        if not collate:
            assert {s["__source__"] for _, b, _ in mixed for s in b} == {"only"}
            assert all("sample_shards" in m for _, b, m in mixed if b)


@pytest.mark.parametrize("how", [{"on_error": "skip"}, {"handler": rw.ignore_and_stop},
                                 {"handler": rw.ignore_and_continue}])
def test_a_mixture_of_one_damaged_source_skips_and_stops_as_the_data_set(tmp_path, how):
    man = _damaged(tmp_path)
    layout = Layout(batch_size=4)
    one = _steps(rw.WebDataset(man, prefetch=0, cache_dir=str(tmp_path / "c1"), **how), 0, layout, collate=False)
    mixed = _steps(rw.MixedDataset([rw.WebDataset(man, prefetch=0, cache_dir=str(tmp_path / "c2"), **how)],
                                   weights=[1]), 0, layout, collate=False)
    assert mixed == one
    assert any(m.get("failed") for _, _, m in one)
    assert ("handler" in how and how["handler"] is rw.ignore_and_stop) == bool(one[-1][2].get("stopped"))


def test_the_loader_hands_out_the_same_batches_for_a_mixture_of_one(two_dirs):
    man, _ = two_dirs
    keys = lambda b: [s["__key__"] for s in b]

    def run(ds):
        ld = rw.WebLoader(ds, batch_size=6, num_workers=2, collate_fn=keys)
        got = list(ld)
        ld.close()
        return got

    ds = lambda: rw.WebDataset(man, shuffle=True, seed=2)
    assert run(rw.MixedDataset([ds()], weights=[1])) == run(ds())


def test_the_engine_reads_runs_in_a_mixture_as_in_the_data_set(tmp_path, monkeypatch):
    """The same source alone and as a mixture's only source: the same preads."""
    a = write_shards(str(tmp_path / "a"), shards=3, samples=25)
    preads = []
    real = os.pread
    monkeypatch.setattr(os, "pread", lambda fd, n, off: (preads.append((n, off)), real(fd, n, off))[1])
    # each with a cache of its own and no background prefetch: the same verification reads
    alone = [s["__key__"] for s in rw.WebDataset(a, prefetch=0, cache_dir=str(tmp_path / "c1"))]
    first, preads[:] = list(preads), []
    mixed = [s["__key__"] for s in rw.MixedDataset([rw.WebDataset(a, prefetch=0, cache_dir=str(tmp_path / "c2"))],
                                                   weights=[1])]
    assert mixed == alone and preads == first and len(first) < len(alone) / 3


# ---- the reading state is the reader's -------------------------------------------------------
def test_the_reader_owns_failed_shards_its_policy_and_its_events(tmp_path):
    from resumewds.errors import HandlerStop, ShardFormatError
    from resumewds.read._shards import ShardReader

    man = _damaged(tmp_path)
    shards = rw.load_manifest(man).shards
    exc = ShardFormatError("cut", shard=shards[1].url)
    seen = []

    def reader(**kw):
        return ShardReader(None, 4, shards, on_event=lambda kind, url, **d: seen.append((kind, url)), **kw)

    r = reader(on_error="skip")
    r.fail(1, shards[1], exc)
    assert r.failed == {1: str(exc)} and not r.stopping and seen == [("skip", shards[1].url)]
    r.start()
    assert r.failed == {} and not r.stopping
    seen.clear()
    with pytest.raises(ShardFormatError):
        reader().fail(1, shards[1], exc)
    assert seen == [("fail", shards[1].url)]
    r = reader(on_error="skip", handler=rw.ignore_and_stop)
    with pytest.raises(HandlerStop):
        r.fail(1, shards[1], exc)
    assert r.stopping and 1 in r.failed


def test_a_data_set_asks_its_reader_and_a_copy_or_a_worker_has_its_own(tmp_path):
    import pickle

    man = _damaged(tmp_path)
    ds = rw.WebDataset(man, on_error="skip", prefetch=0)
    shard1 = ds.manifest.shards[1].url

    def skipped(d, epoch=0):
        """The shards a pass of ``d``'s steps skipped (its steps' events), and its samples."""
        steps = list(d.iter_steps(epoch, 0, Layout(batch_size=4), collate=False))
        urls = [e["url"] for _, _, m in steps for e in m["events"] if e["kind"] == "skip"]
        return urls, sum(m["samples"] for _, _, m in steps)

    first = skipped(ds)
    assert first[0] == [shard1] and first[1] > 0
    # a DataLoader worker's copy: nothing failed there yet, it tries the shard itself
    clone = pickle.loads(pickle.dumps(ds))
    assert skipped(clone) == first
    # a fluent copy (copy.copy: __getstate__) reads with a reader of its own: its skips are
    # its events, not ds's
    copy = ds.map(lambda s: s)
    assert skipped(copy) == first and ds.take_events() == []
    # the next pass tries the shard again (and skips it again)
    assert skipped(ds, 1)[0] == [shard1]
