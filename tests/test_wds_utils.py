"""webdataset names from utils / mix / compat: ``repeatedly``, ``RoundRobin``,
``FluidWrapper``, ``Cached``; and the streaming stages over a shard dict seen
twice (``resampled``).  Real shards in tmp_path."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

import resumewds as rw
from resumewds import utils
from tests.conftest import N_SAMPLES


def test_repeatedly_stops_by_epochs_batches_or_samples():
    assert len(list(utils.repeatedly(range(3), nepochs=7))) == 21
    assert len(list(utils.repeatedly(range(3), nbatches=10))) == 10
    assert len(list(utils.repeatedly([[[1, 1], [2, 2]]] * 3, nsamples=10))) == 5
    assert len(list(utils.repeatedly([[1, 2, 3]] * 4, nsamples=7, batchsize=lambda b: 1))) == 7
    assert list(utils.repeatedly([], nbatches=5)) == []  # an empty source does not spin forever
    assert rw.repeatedly is utils.repeatedly


def _pipeline(shards):
    return rw.DataPipeline(rw.SimpleShardList(shards), rw.tarfile_samples)


def test_round_robin_of_one_pipeline_twice_is_two_independent_passes(shards):
    p = _pipeline(shards[:1])
    one = [s["__key__"] for s in p]
    mixed = [s["__key__"] for s in rw.RoundRobin([p, p])]
    assert mixed == [k for pair in zip(one, one) for k in pair]
    mixed3 = list(rw.RoundRobin([p, p, p]))  # again, after passes ended mid-way
    assert len(mixed3) == 3 * N_SAMPLES


def test_round_robin_shortest_and_longest():
    srcs = [np.full(2, 2), np.full(1, 1), np.full(3, 3)]
    assert list(rw.RoundRobin(srcs, longest=True)) == [2, 1, 3, 2, 3, 3]
    assert list(rw.RoundRobin(srcs)) == [2, 1, 3, 2]
    torch = pytest.importorskip("torch")
    assert isinstance(rw.RoundRobin(srcs), torch.utils.data.IterableDataset)


def test_fluid_wrapper_fluent_stages_run_on_an_arbitrary_source(shards):
    p = _pipeline(shards[:2])
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        f = rw.FluidWrapper(rw.RoundRobin([p, p]))
        out = list(f.shuffle(10).map(lambda s: s["__key__"]).batched(4, collation_fn=list))
    assert not f.exact
    flat = [k for b in out for k in b]
    keys = [s["__key__"] for s in p]
    assert sorted(flat) == sorted(keys + keys) and flat != [k for pair in zip(keys, keys) for k in pair]


def test_cached_stage_replays_its_first_complete_pass(shards):
    stage = rw.Cached()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        p = rw.DataPipeline(rw.SimpleShardList(shards[:1]), rw.tarfile_to_samples(), stage)
        first = [s["__key__"] for s in p]
        assert stage.cached is not None and len(stage.cached) == N_SAMPLES
        assert [s["__key__"] for s in p] == first


def test_resampled_dicts_seen_again_are_reopened(shards):
    p = rw.DataPipeline(rw.SimpleShardList([shards[0]] * 3), rw.resampled(5), rw.tarfile_samples)
    assert len(list(p)) == 5 * N_SAMPLES
    assert len(list(p)) == 5 * N_SAMPLES


def test_webdataset_utils_and_writer_helpers(tmp_path, monkeypatch):
    from resumewds import writer

    assert utils.make_seed(1, 2) == utils.make_seed(1, 2) and 0 <= utils.make_seed("a") < 2 ** 31
    for n in "ab":
        (tmp_path / f"{n}.tar").write_bytes(b"")
    assert sorted(utils.glob_with_braces(str(tmp_path / "{a,b,c}.tar"))) == \
        [str(tmp_path / "a.tar"), str(tmp_path / "b.tar")]
    assert utils.fnmatch_with_braces("x.png", "*.{jpg,png}")
    assert utils.safe_eval("3", "{} * 2") == 6
    with pytest.raises(ValueError, match="illegal characters"):
        utils.safe_eval("__import__('os')")
    assert utils.pytorch_worker_info()[2:] == (0, 1) and utils.pytorch_worker_seed() == 0

    @utils.obsolete(reason="gone")
    def old() -> int:
        return 1

    with pytest.raises(utils.ObsoleteException, match="ALLOW_OBSOLETE"):
        old()
    monkeypatch.setenv("ALLOW_OBSOLETE", "1")
    assert old() == 1
    with pytest.warns(DeprecationWarning):
        assert utils.deprecated(lambda: 2)() == 2
    with pytest.raises(NotImplementedError):
        utils.PipelineStage().invoke()
    assert utils.compute_sample_weights([(10, 1.0), (5, 2.0), (1, 1.0)]).tolist() == [1.0, 1.0, 0.1]

    h = writer.make_handlers()
    writer.add_handlers(h, "lbl", lambda x: b"L%d" % x)
    enc = writer.encode_based_on_extension({"__key__": "k", "lbl": 4, "cls": 7, "txt": "hi"}, h)
    assert enc == {"__key__": "k", "lbl": b"L4", "cls": b"7", "txt": b"hi"}
    assert "lbl" not in writer.make_handlers()  # a fresh copy each time
