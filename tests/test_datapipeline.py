"""Tests for resumewds.wds.datapipeline: webdataset's composable API, compiled into the plan."""

from __future__ import annotations

import warnings

import pytest
import torch
import webdataset as real_wds

import resumewds as wds
from resumewds.wds.datapipeline import DataPipeline


def _keys(xs):
    return [x[0] if isinstance(x, tuple) else x["__key__"] for x in xs]


def test_unshuffled_pipeline_matches_webdataset(shards):
    ours = DataPipeline(wds.SimpleShardList(shards), wds.tarfile_to_samples(), wds.decode(),
                        wds.to_tuple("__key__ cls txt"))
    theirs = real_wds.DataPipeline(real_wds.SimpleShardList(shards), real_wds.tarfile_to_samples(),
                                   real_wds.decode(), real_wds.to_tuple("__key__ cls txt"))
    assert ours.exact
    a, b = list(ours), list(theirs)
    assert a == b and len(a) == 5 * 37


@pytest.mark.parametrize("stage", ["rename_keys", "rename"])
def test_a_stage_returning_a_new_dict_matches_webdataset(shards, stage):
    """A per-sample stage whose result is a new dict (rename_keys, rename(keep=False)) gives
    what webdataset's gives: the new dict as it is, no ``__key__`` added."""
    kw = {"rename_keys": {"label": "cls"}, "rename": {"label": "cls", "keep": False}}[stage]

    def run(lib):
        return list(lib.DataPipeline(lib.SimpleShardList(shards[:2]), lib.tarfile_to_samples(),
                                     getattr(lib, stage)(**kw)))
    ours, theirs = run(wds), run(real_wds)
    assert len(ours) == 74 and ours == theirs


def test_batched_default_collation_matches_webdataset(shards):
    ours = list(DataPipeline(wds.SimpleShardList(shards), wds.tarfile_to_samples(), wds.decode(),
                             wds.to_tuple("cls", "txt"), wds.batched(16)))
    theirs = list(real_wds.DataPipeline(real_wds.SimpleShardList(shards), real_wds.tarfile_to_samples(),
                                        real_wds.decode(), real_wds.to_tuple("cls", "txt"),
                                        real_wds.batched(16)))
    assert len(ours) == len(theirs) == 12
    for x, y in zip(ours, theirs):
        assert type(x[0]) is type(y[0]) and (x[0] == y[0]).all() and x[1] == y[1]
    short = list(DataPipeline(wds.SimpleShardList(shards), wds.tarfile_to_samples(), wds.batched(16, partial=False)))
    assert len(short) == 11


def _shuffled(shards, seed=5, batch=None):
    stages = [wds.SimpleShardList(shards), wds.split_by_node, wds.split_by_worker, wds.shuffle(10),
              wds.tarfile_to_samples(), wds.shuffle(100), wds.decode(), wds.to_tuple("__key__", "cls"),
              wds.map(lambda t: (t[0], t[1] * 10))]
    if batch:
        stages.append(wds.batched(batch, collation_fn=None))
    return DataPipeline(*stages, seed=seed)


@pytest.mark.parametrize("batch", [None, 7])
def test_shuffled_pipeline_resumes_exactly(shards, batch):
    ref_p = _shuffled(shards, batch=batch)
    ref = [list(ref_p), list(ref_p)]  # two epochs, uninterrupted
    flat = [x for ep in ref for x in ep]
    allkeys = sorted(k for k in _keys(flat if batch is None else [s for b in flat for s in b]))
    assert ref[0] != ref[1]  # a new order per epoch
    for cut in (1, 23, len(ref[0]) - 1, len(ref[0]) + 3):
        p = _shuffled(shards, batch=batch)
        got, it, n = [], iter(p), 0
        while n < cut:
            try:
                got.append(next(it))
            except StopIteration:
                it = iter(p)
                continue
            n += 1
        state = p.state_dict()
        assert state["exact"] is True
        q = _shuffled(shards, batch=batch)
        q.load_state_dict(state)
        rest = list(q)
        if cut < len(ref[0]):
            rest += list(q)  # and the second epoch
        assert got + rest == flat[:len(got) + len(rest)] and len(got) + len(rest) == len(flat)
    if batch is None:
        assert len(allkeys) == 2 * 5 * 37 and _keys(ref[0]) != sorted(_keys(ref[0]))


def test_webloader_over_pipeline_any_workers(shards):
    def loader(nw):
        p = DataPipeline(wds.SimpleShardList(shards), wds.shuffle(10), wds.tarfile_to_samples(),
                         wds.shuffle(50), wds.decode(), wds.to_tuple("__key__ cls"), wds.batched(8), seed=3)
        return wds.WebLoader(p, batch_size=None, num_workers=nw)

    direct = [tuple(b[0]) for b in loader(0)]
    two = loader(2)
    it = iter(two)
    first = [tuple(next(it)[0]) for _ in range(5)]
    state = two.state_dict()
    del it
    one = loader(1)
    one.load_state_dict(state)
    rest = [tuple(b[0]) for b in one]
    assert first + rest == direct and len(direct) == 24


def test_opaque_stage_runs_warns_once_and_says_not_exact(shards):
    def every_other(src):
        for i, x in enumerate(src):
            if i % 2 == 0:
                yield x

    with warnings.catch_warnings(record=True) as w:
        warnings.simplefilter("always")
        p = DataPipeline(wds.SimpleShardList(shards), wds.tarfile_to_samples(), every_other,
                         wds.to_tuple("__key__"), wds.map(lambda t: t))
    msgs = [str(x.message) for x in w if "cannot see through" in str(x.message)]
    assert len(msgs) == 1 and "every_other" in msgs[0]
    assert p.exact is False
    out = list(p)
    assert len(out) == (5 * 37 + 1) // 2
    assert p.state_dict()["exact"] is False
    with pytest.warns(UserWarning, match="every_other.*approximate"):  # runs as webdataset's WebLoader
        loader = wds.WebLoader(p, batch_size=None, num_workers=0)
    assert list(loader) == [list(t) for t in out]  # torch's default_convert, as under webdataset


def test_generic_source_runs_like_webdataset(shards):
    class Urls(torch.utils.data.IterableDataset):
        def __iter__(self):
            return iter([{"url": u} for u in shards[:2]])

    src = Urls()
    with pytest.warns(UserWarning, match="no plan"):
        p = DataPipeline(src, wds.tarfile_samples, wds.to_tuple("__key__"))
    assert len(list(p)) == 2 * 37 and p.state_dict()["exact"] is False


def test_split_by_node_is_a_partition(shards, monkeypatch):
    parts = []
    for rank in range(3):
        monkeypatch.setenv("RANK", str(rank))
        monkeypatch.setenv("WORLD_SIZE", "3")
        p = DataPipeline(wds.SimpleShardList(shards), wds.split_by_node, wds.tarfile_to_samples(),
                         wds.shuffle(20), wds.to_tuple("__key__"), seed=1)
        parts.append([k for (k,) in p])
    allk = [k for part in parts for k in part]
    assert len(allk) == len(set(allk)) == 5 * 37
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "0")
    p = DataPipeline(wds.SimpleShardList(shards), wds.single_node_only, wds.tarfile_to_samples())
    with pytest.raises(ValueError, match="multinode"):
        list(p)


def test_split_by_worker_in_a_torch_dataloader(shards):
    split = DataPipeline(wds.SimpleShardList(shards), wds.split_by_worker, wds.tarfile_to_samples(),
                         wds.to_tuple("__key__"))
    keys = [k for (k,) in torch.utils.data.DataLoader(split, batch_size=None, num_workers=2)]
    assert len(keys) == len(set(keys)) == 5 * 37
    nosplit = DataPipeline(wds.SimpleShardList(shards), wds.tarfile_to_samples(), wds.to_tuple("__key__"))
    keys = [k for (k,) in torch.utils.data.DataLoader(nosplit, batch_size=None, num_workers=2)]
    assert len(keys) == 2 * 5 * 37  # as in webdataset: every worker reads every shard


def test_resampled_with_epoch_resumes(shards):
    def make():
        return DataPipeline(wds.ResampledShards(shards, seed=4), wds.tarfile_to_samples(),
                            wds.shuffle(30), wds.to_tuple("__key__")).with_epoch(100)

    p = make()
    ref = [list(p), list(p), list(p)]
    assert all(len(e) == 100 for e in ref)
    flat = [k for e in ref for k in e]
    q = make()
    first = list(q)
    st = q.state_dict()
    r = make()
    r.load_state_dict(st)
    assert first + list(r) + list(r) == flat


def test_stage_handler_skips_samples_exactly(shards):
    def boom(t):
        if int(t[1]) == 3:
            raise ValueError("bad sample")
        return t

    def make(handler):
        return DataPipeline(wds.SimpleShardList(shards), wds.tarfile_to_samples(), wds.shuffle(40),
                            wds.to_tuple("__key__", "cls"), wds.map(boom, handler=handler), seed=2)

    with pytest.raises(ValueError, match="bad sample"):
        list(make(wds.reraise_exception))
    p = make(wds.ignore_and_continue)
    assert p.exact
    ref = list(p)
    assert ref and all(int(c) != 3 for _, c in ref)
    q = make(wds.ignore_and_continue)
    it = iter(q)
    head = [next(it) for _ in range(30)]
    r = make(wds.ignore_and_continue)
    r.load_state_dict(q.state_dict())
    assert head + list(r) == ref
    stopped = list(make(wds.ignore_and_stop))
    assert stopped == ref[:len(stopped)] and len(stopped) < len(ref)


def test_stage_factories_work_on_plain_iterators():
    xs = [{"__key__": str(i), "a": i} for i in range(5)]
    assert [x["a"] for x in wds.map_dict(a=lambda v: v + 1)(iter([dict(x) for x in xs]))] == [1, 2, 3, 4, 5]
    assert list(wds.select(lambda x: x["a"] % 2)(iter(xs))) == [xs[1], xs[3]]
    assert list(wds.rename(b="a", keep=False)(iter(xs[:1]))) == [{"b": 0}]
    assert list(wds.unbatched()(iter([([1, 2], [3, 4])]))) == [(1, 3), (2, 4)]
    out = list(wds.shuffle(3, seed=0)(iter(range(20))))
    assert sorted(out) == list(range(20))
    with pytest.raises(KeyError):
        list(wds.map_dict(b=str)(iter(xs)))
    assert list(wds.map_dict(b=str, handler=wds.ignore_and_continue)(iter(xs))) == []
    assert list(wds.map(lambda x: 1 / 0, handler=wds.ignore_and_stop)(iter(xs))) == []


def test_webdatasets_generator_forms():
    from resumewds import filters as f

    xs = [{"__key__": str(i), "a": i} for i in range(6)]
    assert [x["a"] for x in f._map(iter(xs), lambda x: {"a": x["a"] + 1})] == [1, 2, 3, 4, 5, 6]
    assert [len(b["a"]) for b in f._batched(iter(xs), 4)] == [4, 2]
    assert list(f._to_tuple(iter(xs[:2]), "__key__ a")) == [("0", 0), ("1", 1)]
    assert sorted(x["a"] for x in f._shuffle(iter(xs), 3, seed=1)) == list(range(6))
    assert list(f._extract_keys(iter(xs[:1]), "a")) == [(0,)]


def test_url_only_pipeline_yields_url_dicts_and_names_the_reason(shards):
    with pytest.warns(UserWarning, match="resampled"):
        p = DataPipeline(wds.SimpleShardList(shards), wds.split_by_worker, wds.resampled(7))
    assert len(list(p)) == 7 and all(set(d) == {"url"} for d in p)
