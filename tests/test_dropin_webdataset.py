"""The webdataset drop-in, side by side with the real webdataset 1.0.2.

Each test runs the same pipeline code on ``webdataset`` and on ``resumewds``
(``import resumewds as wds``) and compares what an epoch delivers: the
samples, their keys and content, batch shapes, and the order where
webdataset's is deterministic.
"""

from __future__ import annotations

import collections
import io
import random
import subprocess
import sys
import types
import warnings

import numpy as np
import pytest
import torch
import webdataset as real

import resumewds as ours
from tests.conftest import subprocess_env

LIBS = (real, ours)


@pytest.fixture
def urls(make_shards):
    """8 shards x 50 samples."""
    return make_shards(shards=8, samples=50)


def _quiet(f, *a, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return f(*a, **kw)


def _keys(batches):
    return [k for b in batches for k in b[0]]


# ---- names a client uses -------------------------------------------------------------

def test_every_webdataset_submodule_is_an_attribute_without_importing_it():
    mods = sorted(k for k, v in vars(real).items() if isinstance(v, types.ModuleType))
    mods = [m for m in mods if m not in ("extradatasets", "pytorch")]  # documented: not provided
    assert "handlers" in mods and "writer" in mods
    code = ("import types, resumewds as wds\n"
            f"for m in {mods!r}:\n"
            "    assert isinstance(getattr(wds, m), types.ModuleType), m\n"
            "assert callable(wds.handlers.warn_and_continue) and wds.writer.TarWriter\n"
            "assert callable(wds.gopen) and isinstance(wds.gopen_schemes, dict)\n"
            "print('ok')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=subprocess_env())
    assert out.stdout.strip() == "ok", out.stderr
    with pytest.raises(AttributeError, match="no attribute 'no_such_thing'"):
        ours.no_such_thing  # noqa: B018


def test_gopen_schemes_dispatch_like_webdataset():
    for lib in LIBS:
        assert {"pipe", "http", "https", "__default__"} <= set(lib.gopen_schemes)
        lib.gopen_schemes["memtest"] = lambda url, mode="rb", bufsize=8192, **kw: io.BytesIO(url.encode())
        try:
            assert lib.gopen("memtest://a/b").read() == b"memtest://a/b"
        finally:
            del lib.gopen_schemes["memtest"]
    with pytest.raises(ValueError, match="unsupported URL scheme 'memtest'"):
        ours.gopen("memtest://a/b")


def _batched_pipeline(w, urls, n=10):
    return w.DataPipeline(w.SimpleShardList(urls), w.tarfile_to_samples(), w.to_tuple("__key__", "cls"),
                          w.batched(n))


def test_webloader_slice_matches_webdataset(urls):
    got = {lib: _quiet(lambda w: list(w.WebLoader(_batched_pipeline(w, urls), batch_size=None,
                                                   num_workers=0).slice(3)), lib) for lib in LIBS}
    assert len(got[ours]) == len(got[real]) == 3
    assert _keys(got[ours]) == _keys(got[real])
    assert [(type(b[1]), list(b[1])) for b in got[ours]] == [(type(b[1]), list(b[1])) for b in got[real]]


def test_a_stream_stage_a_state_cannot_hold_refuses_to_give_one(urls):
    """After a stage run as given (.slice, a user's generator), a re-mixing stage holds items a
    state cannot hold: iterating is webdataset's, state_dict() / commit are refused, naming the fix."""
    def mine(src):
        yield from src

    chains = [ours.WebLoader(_batched_pipeline(ours, urls), batch_size=None).slice(30).unbatched().batched(16),
              ours.WebLoader(_batched_pipeline(ours, urls), batch_size=None).compose(mine).shuffle(20)]
    for chain in chains:
        assert len(_quiet(list, chain)) > 0
        with pytest.raises(ours.StateError, match=r"runs on the loader's output stream.*before \.compose"):
            chain.state_dict()
    # stages that hold nothing between items keep their state
    plain = ours.WebLoader(_batched_pipeline(ours, urls), batch_size=None).compose(mine).map(lambda b: b)
    assert plain.state_dict()["position"] == 0


# ---- pipe: URLs and handlers ---------------------------------------------------------

def test_braces_in_a_pipe_url_expand_like_webdataset(urls):
    d = urls[0].rsplit("/", 1)[0]
    pattern = f"pipe:cat {d}/shard-{{000000..000007}}.tar"
    got = {}
    for lib in LIBS:
        ds = lib.WebDataset(pattern, shardshuffle=False).to_tuple("__key__", "cls", "txt")
        got[lib] = list(ds)
    assert len(got[ours]) == 8 * 50
    assert got[ours] == got[real]  # same keys, content and order
    p = ours.DataPipeline(ours.SimpleShardList(pattern), ours.tarfile_to_samples(), ours.to_tuple("__key__"))
    assert len(p.urls) == 8 and [k for (k,) in p] == [k for k, _, _ in got[real]]


def test_an_epoch_whose_every_shard_was_skipped_is_an_error(tmp_path):
    pattern = f"pipe:cat {tmp_path}/missing-{{0..3}}.tar 2>/dev/null || true"
    with pytest.raises(ValueError, match="No samples found"):
        _quiet(list, real.WebDataset(pattern, handler=real.warn_and_continue, shardshuffle=False))
    with pytest.raises(ValueError, match="every shard was skipped") as e:
        _quiet(list, ours.WebDataset(pattern, handler=ours.warn_and_continue, shardshuffle=False))
    msg = str(e.value)
    assert all(f"missing-{i}.tar" in msg for i in range(4)) and "empty file" in msg
    ds = _quiet(ours.WebDataset, pattern, handler=ours.warn_and_continue, shardshuffle=False)
    with pytest.raises(ValueError, match="every shard was skipped"):
        _quiet(list, ours.WebLoader(ds, batch_size=None))


# ---- user-written stages under WebLoader ---------------------------------------------

class _SeededShardShuffle:
    """A ``PipelineStage`` of a real training script: a seeded shard shuffle."""

    def __init__(self, lib, seed):
        class Stage(lib.PipelineStage):
            def run(self, src):
                items = list(src)
                random.Random(seed).shuffle(items)
                return iter(items)

        self.stage = Stage()


def _user_stages(lib, urls):
    def my_generator_stage(src):
        yield from src

    def tarfile_to_samples_nothrow(src, handler=lib.warn_and_continue):
        streams = lib.tariterators.url_opener(src, handler=handler)
        files = lib.tariterators.tar_file_expander(streams, handler=handler)
        return my_group_by_keys(files)

    def my_group_by_keys(data):
        current = None
        for f in data:
            if "fname" not in f:  # webdataset's end-of-shard marker
                continue
            key, ext = f["fname"].split(".", 1)
            if current is None or current["__key__"] != key:
                if current is not None:
                    yield current
                current = {"__key__": key, "__url__": f["__url__"]}
            current[ext] = f["data"]
        if current is not None:
            yield current

    tail = [lib.to_tuple("__key__", "cls"), lib.batched(10)]
    return {
        "generator": [lib.SimpleShardList(urls), my_generator_stage, lib.tarfile_to_samples()] + tail,
        "pipeline_stage": [lib.SimpleShardList(urls), _SeededShardShuffle(lib, 3).stage,
                           lib.tarfile_to_samples()] + tail,
        "resampled": [lib.ResampledShards(urls, nshards=4, deterministic=True), my_generator_stage,
                      lib.tarfile_to_samples()] + tail,
        "nothrow": [lib.SimpleShardList(urls), tarfile_to_samples_nothrow] + tail,
    }


@pytest.mark.parametrize("kind", ["generator", "pipeline_stage", "resampled", "nothrow"])
def test_a_user_stage_under_webloader_runs_as_webdataset(urls, kind, monkeypatch):
    monkeypatch.setattr(ours.wds.loaderchain, "_warned_stream", set())  # each case warns (once)
    got = {}
    for lib in LIBS:
        p = _quiet(lib.DataPipeline, *_user_stages(lib, urls)[kind])
        if lib is ours:
            with pytest.warns(UserWarning, match="approximate"):
                loader = ours.WebLoader(p, batch_size=None, num_workers=2)
        else:
            loader = lib.WebLoader(p, batch_size=None, num_workers=2)
        got[lib] = [_quiet(list, loader) for _ in range(2)]  # two epochs
    for e in range(2):
        a, b = got[ours][e], got[real][e]
        assert len(a) == len(b) and len(a) > 0
        assert [(type(x[1]), len(x[1])) for x in a] == [(type(x[1]), len(x[1])) for x in b]
        assert sorted(_keys(a)) == sorted(_keys(b))  # the workers interleave either way
    if kind != "resampled":
        assert len(got[ours][0]) == 2 * 8 * 5  # every worker reads every shard, as in webdataset


# ---- ResampledShards in a torch DataLoader -------------------------------------------

def test_resampled_pipeline_workers_do_not_replay_one_sequence(urls):
    got = {}
    for lib in LIBS:
        p = lib.DataPipeline(lib.ResampledShards(urls), lib.tarfile_to_samples(), lib.to_tuple("__key__"),
                             lib.batched(10)).with_epoch(20)
        got[lib] = _quiet(list, torch.utils.data.DataLoader(p, batch_size=None, num_workers=2))
    assert len(got[ours]) == len(got[real]) == 40
    batches = [tuple(b[0]) for b in got[ours]]
    assert len(set(batches)) == len(batches)  # no batch delivered twice
    keys = _keys(got[ours])
    assert len(keys) == 400 and len(set(keys)) == 400  # each worker its own share of the plan


# ---- WebLoader's epoch and batch size, as webdataset's -------------------------------

def test_pipeline_with_epoch_under_webloader(urls):
    for nw in (0, 2):
        n = {lib: len(_quiet(list, lib.WebLoader(_batched_pipeline(lib, urls).with_epoch(20), batch_size=None,
                                                 num_workers=nw))) for lib in LIBS}
        assert n[ours] == n[real] == 20 * max(1, nw)  # with_epoch(n) is per DataLoader worker


def test_webloader_default_batch_size_is_torchs_one(urls):
    got = {}
    for lib in LIBS:
        p = lib.DataPipeline(lib.SimpleShardList(urls), lib.tarfile_to_samples(),
                             lib.map(lambda s: {"x": np.full((4, 16), int(s["cls"]), dtype=np.float32)}),
                             lib.batched(8))
        got[lib] = _quiet(list, lib.WebLoader(p, num_workers=0))
    assert len(got[ours]) == len(got[real]) == 50
    for a, b in zip(got[ours], got[real]):
        assert type(a) is type(b) is dict and tuple(a["x"].shape) == tuple(b["x"].shape) == (1, 8, 4, 16)
        assert torch.equal(a["x"], b["x"])


def test_a_resampled_remix_chain_yields_full_batches(urls):
    got = {}
    for lib in LIBS:
        p = lib.DataPipeline(lib.ResampledShards(urls), lib.tarfile_to_samples(), lib.to_tuple("__key__", "cls"),
                             lib.batched(10))
        ld = lib.WebLoader(p, batch_size=None, num_workers=2).unbatched().shuffle(10).batched(64).with_epoch(24)
        got[lib] = [_quiet(list, ld) for _ in range(2)]
    for e in range(2):
        assert collections.Counter(len(b[0]) for b in got[ours][e]) == \
            collections.Counter(len(b[0]) for b in got[real][e]) == {64: 24}


def test_no_worker_splitter_warns_and_hands_each_sample_once(urls, monkeypatch):
    monkeypatch.setattr(ours.wds.loaderchain, "_warned_stream", set())
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = _keys(real.WebLoader(_batched_pipeline(real, urls), batch_size=None, num_workers=2))
    assert len(theirs) == 800 and len(set(theirs)) == 400  # webdataset: every worker every shard
    with pytest.warns(UserWarning, match="no split_by_worker.*once"):
        loader = ours.WebLoader(_batched_pipeline(ours, urls), batch_size=None, num_workers=2)
    mine = _keys(loader)
    assert len(mine) == 400 and sorted(mine) == sorted(set(theirs))


# ---- iter() is a new pass --------------------------------------------------------------

def test_a_smoke_test_next_then_a_full_pass(urls):
    got = {}
    for lib in LIBS:
        p = _batched_pipeline(lib, urls)
        first = next(iter(p))
        got[lib] = (first, list(p))
    assert _keys([got[ours][0]]) == _keys([got[real][0]])
    assert len(got[ours][1]) == len(got[real][1]) == 40
    assert _keys(got[ours][1]) == _keys(got[real][1])  # the pass starts at the first batch
    p = _batched_pipeline(ours, urls)
    it = iter(p)
    next(it)
    state = p.state_dict()
    q = _batched_pipeline(ours, urls)
    q.load_state_dict(state)
    assert _keys(list(q)) == _keys(got[real][1])[10:]  # a loaded state continues its pass


# ---- a loader never changes the pipeline it is built over ------------------------------

@pytest.mark.parametrize("handler", [True, False])
def test_building_a_loader_leaves_the_pipeline_as_it_was(urls, handler):
    """WebLoader(p) restructures a copy of ``p``: ``p`` itself, a second loader over it and a
    loader built each epoch keep ``p``'s batches (with a handler the loader refills them from
    the filtered stream; without, a re-mixing chain undoes them in its own copy)."""
    def make(lib):
        return lib.DataPipeline(lib.SimpleShardList(urls), lib.split_by_worker,
                                lib.tarfile_to_samples(**({"handler": lib.warn_and_continue} if handler else {})),
                                lib.to_tuple("__key__", "cls"), lib.batched(8))

    got = {}
    for lib in LIBS:
        p = make(lib)
        direct = _keys(p)
        loaders = []
        for _ in range(2):  # a loader built each epoch, as a training script may
            chain = _quiet(lib.WebLoader, p, batch_size=None, num_workers=0)
            loaders.append([len(b[0]) for b in chain])
            remix = _quiet(lib.WebLoader, p, batch_size=None, num_workers=0).unbatched().batched(16)
            loaders.append([len(b[0]) for b in remix])
        got[lib] = (direct, _keys(p), loaders)
    assert got[ours] == got[real]
    assert got[ours][0] == got[ours][1] and got[ours][2][0][:3] == [8, 8, 8]


# ---- resume of direct iteration and of the re-mixing chain -----------------------------

def test_with_epoch_resumes_after_the_last_batch_of_a_data_epoch(urls):
    def make(w):
        return _batched_pipeline(w, urls).with_epoch(15)  # 40 batches per data epoch

    theirs = real.DataPipeline(*_batched_pipeline(real, urls).pipeline).with_epoch(15)
    assert [len(list(theirs)) for _ in range(3)] == [15, 15, 15]
    p = make(ours)
    ref = [list(p) for _ in range(4)]
    assert [len(r) for r in ref] == [15, 15, 15, 15]
    p = make(ours)
    list(p), list(p)
    it = iter(p)
    head = [next(it) for _ in range(10)]  # the 40th batch: the last of data epoch 0
    q = make(ours)
    q.load_state_dict(p.state_dict())
    assert head + list(q) == ref[2]  # the rest of this iter(): 5 batches of epoch 1
    assert list(q) == ref[3]


def test_webdataset_with_epoch_resumes_after_the_last_batch_of_a_data_epoch(urls):
    def make(w):
        return _quiet(w.WebDataset, urls, shardshuffle=False).to_tuple("__key__").batched(10).with_epoch(15)

    theirs = make(real)
    assert [len(list(theirs)) for _ in range(3)] == [15, 15, 15]
    p = make(ours)
    ref = [list(p) for _ in range(4)]
    p = make(ours)
    list(p), list(p)
    it = iter(p)
    head = [next(it) for _ in range(10)]  # the 40th batch: the last of data epoch 0
    q = make(ours)
    q.load_state_dict(p.state_dict())
    assert head + list(q) == ref[2]  # the rest of this iter(): 5 batches of epoch 1
    assert list(q) == ref[3]
    p = make(ours)
    list(p), list(p), list(p)  # a state after a whole iter(): the next one is a full chunk
    q = make(ours)
    q.load_state_dict(p.state_dict())
    assert list(q) == ref[3]


def test_a_state_at_the_last_batch_of_an_epoch_resumes_to_the_next_epoch(urls):
    p = _batched_pipeline(ours, urls)
    ref = [list(p), list(p)]
    assert len(ref[0]) == len(list(_batched_pipeline(real, urls))) == 40
    p = _batched_pipeline(ours, urls)
    it = iter(p)
    for _ in range(40):
        next(it)  # the training loop's last step of epoch 0, its pass not yet exhausted
    q = _batched_pipeline(ours, urls)
    q.load_state_dict(p.state_dict())
    assert list(q) == []  # what was left of epoch 0's pass
    assert list(q) == ref[1]  # and the next pass is epoch 1, not an extra one


def test_a_remix_chain_keeps_preempt(urls):
    import os
    import signal

    ds = ours.WebDataset(urls, shuffle=True, seed=1).to_tuple("__key__").batched(10)
    chain = ours.WebLoader(ds, batch_size=None, num_workers=0, preempt=[signal.SIGUSR1])
    chain = chain.unbatched().shuffle(1000).batched(64)
    got = []
    try:
        for b in chain:
            got.append(b)
            if len(got) == 2:
                os.kill(os.getpid(), signal.SIGUSR1)  # a scheduler's preemption signal
    finally:
        chain.close()
    assert chain.preempted and len(got) == 2  # stopped at the next step boundary


# ---- what WebLoader hands out: webdataset's keys ---------------------------------------

def _dict_collate(samples):
    return {k: [s[k] for s in samples] for k in samples[0]}


@pytest.mark.parametrize("batched", [False, True])
def test_webloader_items_have_webdatasets_keys_only(urls, batched):
    got = {}
    for lib in LIBS:
        ds = _quiet(lib.WebDataset, urls[:2], shardshuffle=False)
        if batched:
            ds = ds.batched(8, collation_fn=_dict_collate)
        got[lib] = _quiet(list, lib.WebLoader(ds, batch_size=None, num_workers=0))
    assert len(got[ours]) == len(got[real]) > 0
    def keys(x):  # __local_path__: not set under WebLoader (see docs/COMPAT.md)
        return sorted(k for k in x if k != "__local_path__")

    assert [keys(x) for x in got[ours]] == [keys(x) for x in got[real]]
    assert [x["__key__"] for x in got[ours]] == [x["__key__"] for x in got[real]]
    # resumewds's own readers still find the positions (hidden, not listed)
    first = got[ours][0]
    assert (first["__index__"], first["__epoch__"]) == ((list(range(8)), [0] * 8) if batched else (0, 0))
    loader = ours.WebLoader(ours.WebDataset(urls[:2]), batch_size=4)
    batch = next(iter(loader))
    assert "__index__" not in list(batch) and list(batch["__index__"]) == [0, 1, 2, 3]


# ---- WebLoader(batch_size=None) over select(...) + batched(n) ---------------------------

def _filtered_batches(lib, urls, **kw):
    ds = (_quiet(lib.WebDataset, urls, shardshuffle=False, handler=lib.warn_and_continue)
          .select(lambda s: int(s["cls"]) % 4 != 1).to_tuple("__key__", "cls").batched(8, partial=True))
    return lib.WebLoader(ds, batch_size=None, num_workers=0, **kw)


def test_webloader_fills_batches_from_the_filtered_stream_as_webdataset(urls):
    got = {lib: _quiet(list, _filtered_batches(lib, urls)) for lib in LIBS}
    assert [len(b[0]) for b in got[ours]] == [len(b[0]) for b in got[real]]
    assert [len(b[0]) for b in got[real]][:3] == [8, 8, 8]
    assert _keys(got[ours]) == _keys(got[real])
    assert [(type(b), type(b[1]), list(b[1])) for b in got[ours]] == \
        [(type(b), type(b[1]), list(b[1])) for b in got[real]]


def test_refilled_batches_resume_exactly(urls, tmp_path):
    ref = _quiet(list, _filtered_batches(ours, urls)) + _quiet(list, _filtered_batches(ours, urls))
    loader = _filtered_batches(ours, urls)
    head = []
    for b in loader:
        head.append(b)
        if len(head) == 7:
            break
    state = loader.state_dict()
    fresh = _filtered_batches(ours, urls)
    fresh.load_state_dict(state)
    rest = _quiet(list, fresh)
    assert _keys(head + rest) == _keys(ref[:len(ref) // 2])
    # the journal: commit after each batch, kill, resume
    j = str(tmp_path / "run.db")
    loader = _filtered_batches(ours, urls, journal=j, resume=True)
    for step, _ in enumerate(loader):
        loader.commit(step)
        if step == 9:
            break
    loader.close()
    again = _filtered_batches(ours, urls, journal=j, resume=True)
    assert again.steps_done == 10
    assert _keys(_quiet(list, again)) == _keys(ref[10:len(ref) // 2])


# ---- an endless dataset under WebLoader is an endless stream -----------------------------

@pytest.mark.parametrize("how", ["resampled", "repeat"])
def test_an_endless_dataset_under_webloader_is_an_endless_stream(urls, how):
    import itertools

    got = {}
    for lib in LIBS:
        if how == "resampled":
            ds = _quiet(lib.WebDataset, urls[:2], resampled=True)
        else:
            ds = _quiet(lib.WebDataset, urls[:2], shardshuffle=False).repeat()
        ds = ds.to_tuple("__key__", "cls").batched(8, partial=False)
        loader = lib.WebLoader(ds, batch_size=None, num_workers=0)
        got[lib] = [len(list(itertools.islice(iter(loader), 30))) for _ in range(3)]
    assert got[ours] == got[real] == [30, 30, 30]  # 2 shards x 50 samples: 12 batches a data epoch


# ---- torch's default_convert under WebLoader(batch_size=None) -----------------------------

def test_a_remix_chain_converts_as_webdatasets_loader(urls):
    got = {}
    for lib in LIBS:
        ds = (_quiet(lib.WebDataset, urls[:2], shardshuffle=False).decode()
              .map(lambda s: dict(s, arr=np.full(3, int(s["cls"]), dtype=np.int32)))
              .to_tuple("__key__", "cls", "arr").batched(16))
        got[lib] = _quiet(list, lib.WebLoader(ds, batch_size=None, num_workers=0).unbatched().batched(24))
    assert [len(b[0]) for b in got[ours]] == [len(b[0]) for b in got[real]]
    for a, b in zip(got[ours], got[real]):
        assert [type(f) for f in a] == [type(f) for f in b]
        assert list(a[0]) == list(b[0])
        for f, g in zip(a[1:], b[1:]):
            assert (f.dtype, tuple(f.shape)) == (g.dtype, tuple(g.shape)) and torch.equal(f, g)


# ---- a DataPipeline's with_epoch(n) under a re-batching chain ----------------------------

def _epoch_chain(lib, urls, nw):
    p = lib.DataPipeline(lib.SimpleShardList(urls), lib.split_by_worker, lib.tarfile_to_samples(),
                         lib.to_tuple("__key__", "cls"), lib.batched(10)).with_epoch(7)
    return lib.WebLoader(p, batch_size=None, num_workers=nw).unbatched().batched(16)


@pytest.mark.parametrize("nw", [0, 2])
def test_pipeline_with_epoch_then_a_rebatching_chain_counts_as_webdataset(urls, nw):
    got = {lib: [[len(b[0]) for b in ld] for ld in [_quiet(_epoch_chain, lib, urls, nw)] for _ in range(2)]
           for lib in LIBS}
    assert got[ours] == got[real] == [[16] * (4 * max(1, nw)) + [6 if nw == 0 else 12]] * 2


def test_a_rebatching_chain_under_with_epoch_resumes_exactly(urls):
    chain = _quiet(_epoch_chain, ours, urls, 0)
    ref = [_keys(list(chain)) for _ in range(3)]
    chain = _quiet(_epoch_chain, ours, urls, 0)
    list(chain)
    it = iter(chain)
    head = [next(it) for _ in range(3)]
    again = _quiet(_epoch_chain, ours, urls, 0)
    again.load_state_dict(chain.state_dict())
    assert _keys(head) + _keys(list(again)) == ref[1]
    assert _keys(list(again)) == ref[2]


def _scaled(batch):
    """A batch-level transform (a map on the loader's batches before re-mixing)."""
    keys, cls = batch
    return keys, [int(c) * 10 for c in cls]


def _remix_after_a_map(urls, workers, **kw):
    ds = ours.WebDataset(urls, shardshuffle=False).to_tuple("__key__", "cls").batched(10)
    return ours.WebLoader(ds, batch_size=None, num_workers=workers, **kw).map(_scaled).unbatched().batched(16)


def test_a_journal_counts_each_sample_once_across_resumes_of_a_remix_chain(urls, tmp_path):
    """A re-batcher holding samples of a batch partly handed out: a commit there records the
    place before that batch, and the consumption up to it (the rest is counted when the
    resumed run hands it out again)."""
    from resumewds.journal._read import read_consumption

    def run(path, stops):
        out, step = [], 0
        for stop, workers in stops:  # each run ends after ``stop`` steps, its commits kept
            chain = _remix_after_a_map(urls, workers, journal=path, resume=True)
            assert chain.steps_done == step
            while step < stop:
                for batch in chain:
                    out.append(list(batch[0]))
                    chain.commit(step)
                    step += 1
                    if step >= stop:
                        break
            if step == 7:
                assert chain.state_dict()["chain_skip"] == 2  # 112 = 11 batches of 10 and 2
            chain.close()
        return out

    full = run(str(tmp_path / "full.db"), [(60, 0)])  # 25 batches an epoch: into the third
    got = run(str(tmp_path / "cut.db"), [(7, 0), (33, 2), (60, 3)])
    assert got == full
    assert read_consumption(str(tmp_path / "cut.db")) == read_consumption(str(tmp_path / "full.db"))


def test_a_loader_that_batches_itself_keeps_one_epoch_per_iter(urls):
    """webdataset's endless passes are for its loader form (batch_size=None); resumewds'
    own form, WebLoader(ds, batch_size=n), hands out one epoch per iter() of a resampled
    data set, as it always has (its epochs are what the journal and the plan count)."""
    import itertools

    loader = ours.WebLoader(ours.WebDataset(urls, resampled=True, seed=1), batch_size=16)
    for _ in range(2):  # a bounded read: an endless stream would give the 100 batches
        got = list(itertools.islice(loader, 100))
        assert sum(len(b["__key__"]) for b in got) == 400
    loader.close()
