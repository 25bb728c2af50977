"""Tests for resumewds.multi.MultiLoader: the plan's order, exact state, and a real SIGKILL of a worker."""

from __future__ import annotations

import os
import signal
import time

import pytest

import resumewds as rw
from resumewds.errors import ResumeWDSError
from resumewds.multi import MultiLoader


def _slow(s):
    time.sleep(0.004)
    return s


def _ds(shards, batch=None, slow=False):
    ds = rw.WebDataset(shards, seed=11, shuffle=True, shuffle_window=3).decode().to_tuple("__key__", "cls")
    if slow:
        ds = ds.map(_slow)
    if batch:
        ds = ds.batched(batch, collation_fn=None)
    return ds


@pytest.mark.parametrize("batch", [None, 10])
def test_same_sequence_as_one_process_for_any_worker_count(shards, batch):
    ref = list(_ds(shards, batch)) if batch is None else None
    one = list(MultiLoader(_ds(shards, batch), workers=1))
    if ref is not None:
        assert one == ref and len(ref) == 5 * 37
    for nw in (2, 3):
        assert list(MultiLoader(_ds(shards, batch), workers=nw)) == one


def test_state_resumes_exactly_with_another_worker_count(shards):
    ref_loader = MultiLoader(_ds(shards), workers=2)
    ref = list(ref_loader) + list(ref_loader)  # two epochs
    ml = MultiLoader(_ds(shards), workers=3)
    it = iter(ml)
    head = [next(it) for _ in range(50)]
    state = ml.state_dict()
    assert state["exact"] and state["epoch"] == 0
    del it
    ml.kill()
    other = MultiLoader(_ds(shards), workers=2)
    other.load_state_dict(state)
    rest = list(other) + list(other)
    assert head + rest == ref


def _slow_tail(s):
    # the last step (positions 128.., worker 2 of 3) is slow, so that worker is
    # certainly still working when it is killed
    time.sleep(0.03 if s["__index__"] >= 128 else 0.0)
    return s


def _ds_slow_tail(shards):
    return rw.WebDataset(shards, seed=11, shuffle=True, shuffle_window=3).map(_slow_tail).decode() \
        .to_tuple("__key__", "cls")


def test_sigkill_of_a_worker_raises_instead_of_hanging_and_resume_is_exact(shards):
    ref = list(MultiLoader(_ds_slow_tail(shards), workers=2))
    ml = MultiLoader(_ds_slow_tail(shards), workers=3, poll_interval=0.1)
    got = []
    t0 = time.monotonic()
    with pytest.raises(ResumeWDSError, match=r"worker \d .*died \(killed by signal 9\)"):
        for x in ml:
            got.append(x)
            if len(got) == 40:
                victim = ml.pids[2]
                assert victim.is_alive()
                os.kill(victim.pid, signal.SIGKILL)
    assert time.monotonic() - t0 < 60
    assert got == ref[:len(got)] and 40 <= len(got) < len(ref)
    assert all(not p.is_alive() for p in ml.pids) if ml.pids else True
    again = MultiLoader(_ds_slow_tail(shards), workers=2)
    again.load_state_dict(ml.state_dict())
    assert got + list(again) == ref


class _Numbers:
    """A generic iterable that splits itself by the WORKER / NUM_WORKERS environment."""

    def __init__(self, n, split):
        self.n, self.split = n, split

    def __iter__(self):
        w, nw = int(os.environ.get("WORKER", 0)), int(os.environ.get("NUM_WORKERS", 1))
        for i in range(self.n):
            if not self.split or i % nw == w:
                if i == 7 and self.split == "die":
                    os.kill(os.getpid(), signal.SIGKILL)
                yield i


def test_generic_iterable_runs_as_in_webdataset():
    assert sorted(MultiLoader(_Numbers(20, False), workers=3)) == sorted(list(range(20)) * 3)
    ml = MultiLoader(_Numbers(20, True), workers=3)
    assert sorted(ml) == list(range(20))
    assert ml.state_dict()["exact"] is False


def test_generic_worker_death_is_noticed():
    with pytest.raises(ResumeWDSError, match="died"):
        list(MultiLoader(_Numbers(50, "die"), workers=2, poll_interval=0.1))


def test_worker_error_is_raised_in_the_main_process(shards):
    def bad(s):
        raise KeyError("no such field")

    with pytest.raises(KeyError):
        list(MultiLoader(rw.WebDataset(shards).map(bad), workers=2))


def test_over_an_exact_datapipeline(shards):
    def make():
        return rw.DataPipeline(rw.SimpleShardList(shards), rw.tarfile_to_samples(), rw.shuffle(40),
                               rw.to_tuple("__key__"), rw.batched(6, collation_fn=None), seed=9)

    assert list(MultiLoader(make(), workers=3)) == list(make())
