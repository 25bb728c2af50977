"""One behaviour per stage, whichever form runs it.

A stage written fluently (``WebDataset(...).map_tuple(f)``), as a composable
stage (``filters.map_tuple(f)`` in a ``DataPipeline`` or by hand) or inside a
mixture (``RandomMix`` / ``MixedDataset``) behaves the same: the same result,
the same error, the same handling of a handler's stop.  Where webdataset 1.0.2
(installed beside resumewds) defines the behaviour, it is the reference.
"""

from __future__ import annotations

import itertools
import random

import pytest
import webdataset as real_wds

import resumewds as rw
from resumewds import config, errors, events, filters
from resumewds.errors import DecodeError, MissingKeyError
from resumewds.plan._plan import Layout
from resumewds.stages import _positions as positions
from resumewds.stages import _stages as stages
from resumewds.synth import write_shards

pytestmark = pytest.mark.usefixtures("cache_dir")


def _fluent(shards, *calls):
    ds = rw.WebDataset(shards[:1])
    for name, args, kw in calls:
        ds = getattr(ds, name)(*args, **kw)
    return ds


def _composed(shards, *calls):
    stages = [getattr(filters, name)(*args, **kw) for name, args, kw in calls]
    return rw.DataPipeline(rw.SimpleShardList(shards[:1]), rw.tarfile_to_samples(), *stages)


def _by_hand(items, *calls):
    it = iter(items)
    for name, args, kw in calls:
        it = getattr(filters, name)(*args, **kw)(it)
    return it


def _each_form(shards, *calls):
    return {"fluent": lambda: list(_fluent(shards, *calls)),
            "composed": lambda: list(_composed(shards, *calls))}


# ---- one callable per per-sample stage ------------------------------------------------
def _same(items):
    """Items as both forms compare them (a data set's samples also carry ``__local_path__``)."""
    return [{k: v for k, v in x.items() if k != "__local_path__"} if isinstance(x, dict) else x for x in items]


def test_each_per_sample_stage_is_one_callable_in_both_forms(shards):
    cases = {
        "map": ((lambda s: s,), {}, stages.Map),
        "map_dict": ((), {"cls": int}, stages.MapDict),
        "map_tuple": ((int,), {}, stages.MapTuple),
        "to_tuple": (("cls",), {}, stages.ToTuple),
        "rename": ((), {"label": "cls"}, stages.Rename),
        "select": ((bool,), {}, stages.Select),
        "rename_keys": ((), {"label": "cls"}, stages.RenameKeys),
        "extract_keys": (("*.cls",), {}, stages.ExtractKeys),
    }
    for name, (args, kw, cls) in cases.items():
        composed = getattr(filters, name)(*args, **kw)
        assert type(composed.fn) is cls, name
        before = [("to_tuple", ("cls txt",), {})] if name == "map_tuple" else []
        forms = _each_form(shards, *before, (name, args, kw))
        fluent = _same(forms["fluent"]())
        assert fluent and fluent == _same(forms["composed"]()), name  # the same items, whole, in both forms
    assert filters.getfirst is stages.getfirst
    # decode and xdecode: the same decoded samples in both forms
    xdecode_kw = {"txt": lambda stream: stream.read().decode(), "must_decode": False}
    for call in (("decode", ("rgb8",), {}), ("xdecode", (), xdecode_kw)):
        forms = _each_form(shards, call)
        fluent = _same(forms["fluent"]())
        assert fluent and fluent == _same(forms["composed"]()), call[0]


def test_map_tuple_on_a_dict_is_one_error_in_every_form(shards):
    calls = [("map_tuple", (len,), {})]
    for _form, run in _each_form(shards, *calls).items():
        with pytest.raises(DecodeError, match="map_tuple"):
            run()
    with pytest.raises(TypeError, match="map_tuple"):  # also a TypeError: a dict is not a tuple
        list(_by_hand([{"__key__": "k", "a": 1}], *calls))
    # webdataset refuses it too (an assertion there)
    with pytest.raises(AssertionError):
        list(real_wds.filters.map_tuple(len)(iter([{"a": 1}])))


def test_getfirst_raises_one_error_a_value_error_as_webdataset(shards):
    with pytest.raises(ValueError):
        real_wds.filters.getfirst({"a": 1}, "b")
    with pytest.raises(stages.FieldError):
        filters.getfirst({"a": 1}, "b")
    for _form, run in _each_form(shards, ("to_tuple", ("nope",), {})).items():
        with pytest.raises(stages.FieldError):
            run()
    for _form, run in _each_form(shards, ("rename", (), {"x": "nope"})).items():
        with pytest.raises(stages.FieldError):
            run()
    assert filters.getfirst({"a": 1}, "b", default=3, missing_is_error=False) == 3


def test_map_dict_changes_the_sample_in_place_as_webdataset_in_every_form(shards):
    def both(stage_fn):
        s = {"__key__": "k", "a": 1}
        out = stage_fn(s)
        return s, out

    theirs_in, theirs_out = both(lambda s: next(real_wds.filters.map_dict(a=str)(iter([s]))))
    ours_in, ours_out = both(lambda s: next(filters.map_dict(a=str)(iter([s]))))
    assert theirs_out is theirs_in and ours_out is ours_in
    assert theirs_in == ours_in == {"__key__": "k", "a": "1"}
    seen = []  # the fluent form: the sample a stage before it handed on is changed in place
    out = next(iter(rw.WebDataset(shards[:1]).map(lambda s: seen.append(s) or s).map_dict(cls=int)))
    assert isinstance(seen[0]["cls"], int) and seen[0]["cls"] == out["cls"]
    # a missing field: a KeyError naming it, in every form
    for _form, run in _each_form(shards, ("map_dict", (), {"nope": str})).items():
        with pytest.raises(MissingKeyError, match="nope"):
            run()
    # the hidden position keys survive (a copy of a Sample would drop them)
    s = positions.hide_positions({"__key__": "k", "a": 1, "__epoch__": 0, "__index__": 5, "__shard__": "x"})
    assert stages.MapDict(a=str)(s)["__index__"] == 5


def test_map_tuple_map_dict_to_tuple_rename_results_agree_across_forms(shards):
    calls = [("map_dict", (), {"cls": lambda b: int(b) * 2}), ("rename", (), {"label": "cls"}),
             ("to_tuple", ("label __key__",), {}), ("map_tuple", (None, str.upper), {})]
    forms = {k: run() for k, run in _each_form(shards, *calls).items()}
    assert forms["fluent"] == forms["composed"] and len(forms["fluent"]) == 37
    theirs = list(real_wds.DataPipeline(real_wds.SimpleShardList(shards[:1]), real_wds.tarfile_to_samples(),
                                        *[getattr(real_wds.filters, n)(*a, **k) for n, a, k in calls]))
    assert forms["fluent"] == theirs


# ---- stream stages: one runner each ------------------------------------------------------
def test_stream_stages_run_the_fluent_runner(shards):
    xs = list(range(23))
    assert list(filters.slice(2, 17, 3)(iter(xs))) == list(itertools.islice(xs, 2, 17, 3))
    assert list(filters.batched(5, collation_fn=None)(iter(xs))) == [xs[i:i + 5] for i in range(0, 23, 5)]
    assert list(filters.batched(5, collation_fn=None, partial=False)(iter(xs))) == \
        [xs[i:i + 5] for i in range(0, 20, 5)]
    assert list(filters.unlisted()(iter([[1, 2], [3]]))) == [1, 2, 3]
    assert list(filters.unbatched()(iter([([1, 2], ["a", "b"])]))) == [(1, "a"), (2, "b")]
    with pytest.raises(ValueError):
        list(filters.unlisted()(iter([(1, 2)])))  # webdataset asserts a list
    random.seed(4)
    a = list(filters.rsample(0.5)(iter(xs)))
    random.seed(4)
    assert a == list(filters.rsample(0.5)(iter(xs))) and 0 < len(a) < 23
    sh = list(filters.shuffle(5, 2, seed=1)(iter(xs)))
    assert sorted(sh) == xs and sh == list(filters.shuffle(5, 2, seed=1)(iter(xs))) and sh != xs
    # the fluent stages: the same runners
    ds = rw.WebDataset(shards[:1]).to_tuple("__key__").slice(2, 17, 3)
    assert [k for k, in ds] == [f"s000000_{i:06d}" for i in range(2, 17, 3)]
    # islice's refusal of negative bounds
    with pytest.raises(ValueError):
        list(filters.slice(-1)(iter(xs)))


def test_a_slice_takes_no_item_after_its_stop():
    taken = []

    def src():
        for i in range(10):
            taken.append(i)
            yield i

    assert list(filters.slice(3)(src())) == [0, 1, 2] and taken == [0, 1, 2]


# ---- mixtures: the single data set's step policy -------------------------------------------
def _truncated_after_manifest(tmp_path, name, shards=3, samples=10):
    d = tmp_path / name
    paths = write_shards(str(d), shards=shards, samples=samples)
    rw.build_manifest(paths, str(d / "manifest.json"))
    with open(paths[1], "rb") as f:
        data = f.read()
    with open(paths[1], "wb") as f:
        f.write(data[:len(data) // 2])  # found when read: a size mismatch
    return str(d / "manifest.json")


def test_ignore_and_stop_in_a_mixture_ends_the_step_like_the_data_set(tmp_path):
    bad = _truncated_after_manifest(tmp_path, "bad")
    good = write_shards(str(tmp_path / "good"), shards=1, samples=40, prefix="g")
    alone = rw.WebDataset(bad, handler=rw.ignore_and_stop)
    steps = list(alone.iter_steps(0, 0, Layout(batch_size=4), collate=False))
    assert steps[-1][2].get("stopped") and [m["samples"] for _, _, m in steps][-1] < 4

    def mixed():
        return rw.MixedDataset([rw.WebDataset(bad, handler=rw.ignore_and_stop), rw.WebDataset(good)],
                               weights=[1, 1], seed=3)

    msteps = list(mixed().iter_steps(0, 0, Layout(batch_size=4), collate=False))  # no HandlerStop escapes
    assert msteps[-1][2].get("stopped")
    last = msteps[-1][1]
    assert len(last) == msteps[-1][2]["samples"] < 4
    keys = [s["__key__"] for _, b, _ in msteps for s in b]
    assert not any(k.startswith(("s000001", "s000002")) for k in keys)
    # direct iteration and WebLoader deliver the same samples, then the epoch ends
    direct = [s["__key__"] for s in mixed()]
    assert direct == keys
    ld = rw.WebLoader(mixed(), batch_size=4, num_workers=0, collate_fn=lambda b: [s["__key__"] for s in b])
    assert [k for b in ld for k in b] == keys and (ld.epoch, ld.position) == (1, 0)
    ld.close()
    # RandomMix too
    rm = rw.RandomMix([rw.WebDataset(bad, handler=rw.ignore_and_stop), rw.WebDataset(good)])
    assert len(list(rm)) < rm.mixplan.epoch_size


def test_a_stage_stop_in_a_mixture_ends_direct_iteration_quietly(shards):
    def boom(s):
        if s["__key__"] == "s000000_000005":
            raise ValueError("bad")
        return s

    alone = rw.WebDataset(shards[:1]).map(boom, handler=rw.ignore_and_stop).to_tuple("__key__")
    mix = rw.MixedDataset([rw.WebDataset(shards[:1]).map(boom, handler=rw.ignore_and_stop),
                           rw.WebDataset(shards[1:2])], weights=[1, 1]).map(lambda s: (s["__key__"],))
    for ds, size in ((alone, 37), (mix, mix.mixplan.epoch_size)):
        got = [k for k, in ds]  # no HandlerStop escapes: the epoch ends at the step of the stop
        assert len(got) < size and "s000000_000005" not in got
        steps = ds.iter_steps(0, 0, Layout(batch_size=2), collate=False)
        with pytest.raises(rw.errors.HandlerStop):  # the step engines: the same exception
            list(steps)


def test_a_batch_map_returning_none_is_dropped_and_counted_in_a_mixture_like_the_data_set(shards):
    from resumewds.stages._stages import default_collate

    drop_odd = lambda b: None if any(k.endswith("5") for k in b["__key__"]) else b
    alone = rw.WebDataset(shards[:2]).batched(4, collation_fn=default_collate).map(drop_odd)
    mix = rw.MixedDataset([rw.WebDataset(shards[:1]), rw.WebDataset(shards[1:2])], weights=[1, 1])
    mix.batched(4).map(drop_odd)
    for ds in (alone, mix):
        steps = list(ds.iter_steps(0, 0, Layout(batch_size=4)))
        dropped = [m for _, b, m in steps if m.get("batch_dropped")]
        assert dropped and all(m["samples"] == 0 and m["filtered"] > 0 for m in dropped)
        assert all(b == [] for _, b, m in steps if m.get("batch_dropped"))
        assert all(b is not None for _, b, _ in steps)


def test_a_handler_skip_in_a_mixture_counts_as_skipped_like_the_data_set(shards):
    def boom(s):
        if s["__key__"].endswith("3"):
            raise ValueError("bad")
        return s

    for ds in (rw.WebDataset(shards[:1]).map(boom, handler=rw.ignore_and_continue),
               rw.MixedDataset([rw.WebDataset(shards[:1]).map(boom, handler=rw.ignore_and_continue)],
                               weights=[1]),
               rw.MixedDataset([rw.WebDataset(shards[:1])], weights=[1]).map(boom, handler=rw.ignore_and_continue)):
        metas = [m for _, _, m in ds.iter_steps(0, 0, Layout(batch_size=8))]
        assert sum(m["skipped"] for m in metas) == 4 and sum(m["filtered"] for m in metas) == 0


# ---- one decision in one place ---------------------------------------------------------------
def test_the_seed_default_is_one_setting_everywhere(shards, monkeypatch):
    monkeypatch.setenv("RESUMEWDS_SEED", "11")
    assert config.seed() == 11
    assert rw.WebDataset(shards).seed == 11
    p = rw.DataPipeline(rw.SimpleShardList(shards), rw.tarfile_to_samples())
    assert p.seed == 11
    assert rw.MixedDataset([rw.WebDataset(shards)], weights=[1]).seed == 11
    monkeypatch.delenv("RESUMEWDS_SEED")
    monkeypatch.setenv("WDS_SEED", "5")
    assert rw.DataPipeline(rw.SimpleShardList(shards), rw.tarfile_to_samples()).seed == 5


def test_sample_skip_is_an_event_kind_with_its_consumers(shards):
    assert events.EventKind.SAMPLE_SKIP == "sample_skip"
    spec = events.EVENTS[events.EventKind.SAMPLE_SKIP]
    assert spec.shard_state is None and spec.journaled

    def boom(s):
        if s["__key__"].endswith("_000002"):
            raise ValueError("x")
        return s
    ds = rw.WebDataset(shards[:1]).map(boom, handler=rw.ignore_and_continue)
    assert len(list(ds)) == 36
    rec = [e for e in ds.take_events() if e["kind"] == events.EventKind.SAMPLE_SKIP]
    assert [(e["key"], e["stage"], e["error"]) for e in rec] == [("s000000_000002", "map", "ValueError: x")]


def test_a_handler_stop_ends_a_stream_quietly_through_one_helper():
    from resumewds.stages import until_stop

    def gen():
        yield 1
        raise errors.HandlerStop("stop")

    assert list(until_stop(gen())) == [1]
    assert filters.StopPipeline is errors.HandlerStop


def test_no_pickle_aliases_are_left_in_filters():
    for old in ("_Map", "_Select", "_Guard", "_MapDict", "_MapTuple", "_ToTuple", "_Rename"):
        assert not hasattr(filters, old), old


def test_a_skipped_shard_is_tried_again_in_the_next_pass_in_a_mixture_like_the_data_set(tmp_path):
    d = tmp_path / "f"
    paths = write_shards(str(d), shards=2, samples=6)
    rw.build_manifest(paths, str(d / "manifest.json"))
    with open(paths[1], "rb") as f:
        good = f.read()

    def damage():
        with open(paths[1], "wb") as f:
            f.write(good[:len(good) // 2])

    def repair():
        with open(paths[1], "wb") as f:
            f.write(good)

    def delivered(ds):
        return sum(m["samples"] for _, _, m in ds.iter_steps(0, 0, Layout(batch_size=4), collate=False))

    alone = rw.WebDataset(str(d / "manifest.json"), on_error="skip", verify="always")
    mix = rw.MixedDataset([rw.WebDataset(str(d / "manifest.json"), on_error="skip", verify="always")],
                          weights=[1])
    for ds in (alone, mix):
        damage()
        first = delivered(ds)
        repair()
        assert first == 6 and delivered(ds) == 12  # the next pass reads the shard again


# ---- one fluent face: webdataset's FluidInterface methods on WebDataset and on pipelines ------------
#: each fluent method of webdataset 1.0.2's FluidInterface, with arguments (and the calls before it)
FLUENT_CASES = {
    "batched": [("batched", (3,), {})],
    "unbatched": [("batched", (3,), {}), ("unbatched", (), {})],
    "listed": [("listed", (3,), {})],
    "unlisted": [("listed", (3,), {}), ("unlisted", (), {})],
    "log_keys": [("log_keys", (), {})],
    "shuffle": [("shuffle", (5,), {})],
    "map": [("map", (lambda s: {"__key__": s["__key__"], "n": int(s["cls"]) + 1},), {})],
    "decode": [("decode", (), {})],
    "map_dict": [("map_dict", (), {"cls": int})],
    "select": [("select", (lambda s: int(s["cls"]) % 2 == 0,), {})],
    "to_tuple": [("to_tuple", ("__key__ cls",), {})],
    "map_tuple": [("to_tuple", ("__key__ cls",), {}), ("map_tuple", (str.upper, int), {})],
    "slice": [("slice", (2, 9, 2), {})],
    "rename": [("rename", (), {"label": "cls"})],
    "rsample": [("rsample", (1.0,), {})],
    "rename_keys": [("rename_keys", (), {"label": "cls"})],
    "extract_keys": [("extract_keys", ("*.cls", "*.txt"), {})],
    "xdecode": [("xdecode", (), {"txt": lambda stream: stream.read().decode(), "must_decode": False})],
    "mcached": [("mcached", (), {})],
    "lmdb_cached": [("lmdb_cached", ("cache.lmdb",), {})],
}
_RANDOM_ORDER = ("shuffle",)  # our WebDataset's is the plan's seeded shuffle: the same items in another order


class _Host:
    """A pipeline of one's own (webdataset's ``compose(stage)`` contract) over a list of samples."""

    def __init__(self, make, stages=()):
        self.make, self.stages = make, list(stages)

    def compose(self, stage):
        return type(self)(self.make, self.stages + [stage])

    def __iter__(self):
        it = iter(self.make())
        for st in self.stages:  # webdataset's PipelineStage (Cached) runs by .run
            it = st.run(it) if hasattr(st, "run") else st(it)
        return it


class _OurHost(_Host, rw.FluidInterface):
    pass


class _TheirHost(_Host, real_wds.compat.FluidInterface):
    pass


def _plain(x):
    """An item as plain data (batches collate to numpy arrays; samples lose ``__local_path__``)."""
    if isinstance(x, dict):
        return {k: _plain(v) for k, v in x.items() if k != "__local_path__"}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    return x.tolist() if hasattr(x, "tolist") else x


def _items(pipeline, name, passes=1):
    out = [[_plain(x) for x in pipeline] for _ in range(passes)]
    if name in _RANDOM_ORDER:
        out = [sorted(p, key=lambda x: x["__key__"]) for p in out]
    return out


@pytest.mark.parametrize("name", sorted(FLUENT_CASES))
def test_each_fluent_method_is_one_method_that_behaves_the_same_on_both_faces(make_shards, tmp_path, name):
    """Every fluent method of webdataset's FluidInterface exists once, on our FluidInterface, and is
    our WebDataset's (and DataPipeline's) too; on a WebDataset and on a pipeline of one's own it
    gives what webdataset's gives there (``mcached``: twice, the second pass replayed)."""
    assert name in vars(real_wds.compat.FluidInterface)
    for face in (rw.WebDataset, rw.DataPipeline, rw.FluidWrapper):
        assert getattr(face, name) is getattr(rw.FluidInterface, name), face
    urls = make_shards(shards=2, samples=6)
    calls, passes = FLUENT_CASES[name], (2 if name == "mcached" else 1)

    def chain(p):
        for n, a, k in calls:
            p = getattr(p, n)(*a, **k)
        return p

    def each_face(lib, host):
        base = list(_quiet(lib.WebDataset, urls, shardshuffle=False))
        return {"WebDataset": lambda: chain(_quiet(lib.WebDataset, urls, shardshuffle=False)),
                "a pipeline": lambda: chain(host(lambda: [dict(s) for s in base]))}

    got = {}
    for lib, host in ((rw, _OurHost), (real_wds, _TheirHost)):
        for face, make in each_face(lib, host).items():
            try:
                got[lib.__name__, face] = _items(make(), name, passes)
            except Exception as exc:  # (lmdb_cached without the lmdb package)
                got[lib.__name__, face] = type(exc)
    ref = got["webdataset", "WebDataset"]
    assert ref and all(v == ref for v in got.values()), got


def _quiet(f, *a, **kw):
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return f(*a, **kw)
