"""A new ``iter()`` of an endless stream is webdataset's new pass, and a resume agrees.

webdataset starts its pipeline again at each ``iter()``: over ``.repeat()``
(or resampled shards) an ``iter()`` left mid-epoch is followed by a pass from
the start, not by the rest of the stream.  resumewds does the same, in both
forms (``WebLoader(ds, batch_size=None)`` and direct iteration), unless a
state was given away since the last item (``state_dict()``, ``commit``,
``load_state_dict``): a run resumed from that state continues where it was
taken, so the run that took it continues too, and both deliver the same data.
"""

from __future__ import annotations

import itertools
import warnings

import pytest
import webdataset as real

import resumewds as ours


@pytest.fixture
def urls(make_shards):
    """8 shards x 50 samples (400 per epoch)."""
    return make_shards(shards=8, samples=50)


def _loader(lib, urls, workers=0):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ds = lib.WebDataset(urls, shardshuffle=False).repeat().to_tuple("__key__").batched(10)
        return lib.WebLoader(ds, batch_size=None, num_workers=workers)


def _take(it, n):
    return [k for batch in itertools.islice(it, n) for k in batch[0]]


def test_a_new_iter_of_an_endless_webloader_is_a_new_pass_as_in_webdataset(urls):
    got = {}
    for lib in (real, ours):
        loader = _loader(lib, urls)
        got[lib.__name__] = [_take(iter(loader), 7) for _ in range(3)]
    assert got["resumewds"] == got["webdataset"]
    first = got["resumewds"][0]
    assert len(first) == 70 and got["resumewds"][1] == first  # the pass started again


def test_a_new_iter_of_an_endless_dataset_is_a_new_pass_as_in_webdataset(urls):
    got = {}
    for lib in (real, ours):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ds = lib.WebDataset(urls, shardshuffle=False).repeat()
        got[lib.__name__] = [[s["__key__"] for s in itertools.islice(iter(ds), 70)] for _ in range(3)]
    assert got["resumewds"] == got["webdataset"]
    assert got["resumewds"][1] == got["resumewds"][0]


def test_a_whole_epoch_and_more_then_a_new_pass(urls):
    loader = _loader(ours, urls)
    a = _take(iter(loader), 45)  # 450 samples: the second epoch's first 50
    b = _take(iter(loader), 5)  # a new pass: the third epoch from its start
    assert a[:50] == a[400:] and b == a[:50]
    assert loader.epoch == 2


@pytest.mark.parametrize("workers", [0, 2])
def test_a_state_taken_between_passes_resumes_exactly(urls, workers):
    """The run that took a state and the run resumed from it deliver the same data."""
    run = _loader(ours, urls, workers)
    first = _take(iter(run), 7)
    state = run.state_dict()  # given away: the next iter() continues where it was taken
    rest = [_take(iter(run), 7) for _ in range(2)]  # the second one was not pinned: a new pass
    assert rest[0] == _take(iter(_loader(ours, urls, workers)), 14)[70:]  # the stream went on after 70
    assert rest[1] == first  # a new pass from the start of the next epoch (no shuffle)

    resumed = _loader(ours, urls, workers)
    resumed.load_state_dict(state)
    assert [_take(iter(resumed), 7) for _ in range(2)] == rest


def test_direct_iteration_state_between_passes_resumes_exactly(urls):
    def make():
        return ours.WebDataset(urls, shardshuffle=False).repeat()

    def take(it):
        return [s["__key__"] for s in itertools.islice(it, 70)]

    ds = make()
    first = take(iter(ds))
    state = ds.state_dict()
    rest = [take(iter(ds)) for _ in range(2)]
    assert rest[0][0] != first[0] and rest[1] == first
    resumed = make()
    resumed.load_state_dict(state)
    assert [take(iter(resumed)) for _ in range(2)] == rest


def test_commit_pins_the_pass_as_state_dict_does(urls, tmp_path):
    journal = str(tmp_path / "j.db")

    def make(resume=None):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ds = ours.WebDataset(urls, shardshuffle=False).repeat().to_tuple("__key__").batched(10)
            return ours.WebLoader(ds, batch_size=None, journal=journal, resume=resume if resume is not None else False)

    run = make()
    _take(iter(run), 7)
    run.commit(6)
    rest = [_take(iter(run), 7) for _ in range(2)]
    run.close()
    resumed = make(resume=6)
    assert [_take(iter(resumed), 7) for _ in range(2)] == rest
    resumed.close()
