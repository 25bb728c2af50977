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


# ---- a smoke test's next(iter(loader)), then a full pass (one epoch per iter()) -------------

def _keys(batches):
    return [list(b[0]) for b in batches]


@pytest.mark.parametrize("workers", [0, 2])
def test_a_smoke_batch_then_a_full_pass_as_in_webdataset(urls, workers):
    got = {}
    for lib in (real, ours):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ds = lib.WebDataset(urls, shardshuffle=False).to_tuple("__key__").batched(10)
            loader = lib.WebLoader(ds, batch_size=None, num_workers=workers)
            chain = lib.WebLoader(ds, batch_size=None, num_workers=workers).unbatched().batched(16).with_epoch(24)
        smoke = next(iter(loader))
        full = list(loader)
        chain_smoke = next(iter(chain))
        chunk = list(chain)
        got[lib.__name__] = (_keys([smoke]), _keys(full), _keys([chain_smoke]), _keys(chunk))
    mine, theirs = got["resumewds"], got["webdataset"]
    assert [len(x) for x in mine] == [len(x) for x in theirs] == [1, 40, 1, 24]
    assert mine[:2] == theirs[:2]  # the full pass starts at the first batch (no shuffle)
    if workers == 0:  # (with workers resumewds re-mixes its one sample sequence, see docs/COMPAT.md)
        assert mine[2:] == theirs[2:]


def test_a_loader_that_batches_itself_starts_a_new_pass_too(urls):
    def make(lib):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return lib.WebLoader(lib.WebDataset(urls, shardshuffle=False).to_tuple("__key__"), batch_size=16)

    got = {}
    for lib in (real, ours):
        loader = make(lib)
        next(iter(loader))
        got[lib.__name__] = _keys(list(loader))
    assert len(got["resumewds"]) == 25 and got["resumewds"] == got["webdataset"]


@pytest.mark.parametrize("form", ["loader", "chain"])
def test_a_state_after_the_smoke_batch_continues_the_epoch(urls, form):
    """A state given away after the first batch: this run and a run resumed from the state
    both continue where it was taken (what distinguishes a resume from a smoke test)."""
    def make(workers=0):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ds = ours.WebDataset(urls, shardshuffle=False).to_tuple("__key__").batched(10)
            loader = ours.WebLoader(ds, batch_size=None, num_workers=workers)
        return loader if form == "loader" else loader.unbatched().batched(16).with_epoch(24)

    loader = make()
    first = next(iter(loader))
    state = loader.state_dict()
    rest = _keys(list(loader))
    assert len(rest) == (39 if form == "loader" else 23)  # the epoch (the chunk) goes on
    resumed = make(2)
    resumed.load_state_dict(state)
    assert _keys(list(resumed)) == rest
    fresh = _keys(list(make()))
    assert _keys([first]) + rest == fresh


@pytest.mark.parametrize("how", ["state", "journal"])
def test_a_smoke_batch_after_a_resume_loses_nothing(urls, tmp_path, how):
    """A script that smoke-tests its loader right after building it, resumed: the training
    loop's iter() starts at the resume's place again (the smoke batch is not lost)."""
    journal = str(tmp_path / "run.db")

    def make(workers=0, **kw):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ds = ours.WebDataset(urls, shardshuffle=True, seed=3).to_tuple("__key__").batched(10)
            return ours.WebLoader(ds, batch_size=None, num_workers=workers, **kw)

    ref = make()
    next(iter(ref))  # the uninterrupted run's smoke test: its training starts at epoch 1
    epochs = [_keys(list(ref)) for _ in range(2)]
    run = make(**({"journal": journal} if how == "journal" else {}))
    next(iter(run))
    got = []
    for step, batch in enumerate(run):
        got.append(list(batch[0]))
        if how == "journal":
            run.commit(step)
        if step == 14:
            break
    state = run.state_dict()
    run.close()
    for workers in (2, 0):  # resumed twice, each time smoke-testing first
        again = make(workers, **({"journal": journal, "resume": True} if how == "journal" else {}))
        if how == "state":
            again.load_state_dict(state)
        next(iter(again))
        target = 27 if workers == 2 else 40 + 9
        while len(got) < target:  # the training loop's epochs
            for batch in again:
                got.append(list(batch[0]))
                if how == "journal":
                    again.commit(again.steps_done)
                if len(got) == target:
                    break
        state = again.state_dict()
        again.close()
    assert got == epochs[0] + epochs[1][:9]


# ---- .repeat(n) under WebLoader(batch_size=None): a state records how far into the pass ------

def _keep(s):
    """Drops about a third of the samples, unevenly between the shards."""
    return (int(s["__key__"][1:7]) * 7 + int(s["__key__"][-6:]) * 5) % 9 not in (1, 4, 6)


def _repeat_loader(lib, urls, select, workers=0, shuffled=False):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        # shuffled: a new shard order each epoch (resumewds's seeded one), so an extra epoch shows
        ds = ours.WebDataset(urls, shardshuffle=True, seed=5) if shuffled else \
            lib.WebDataset(urls, shardshuffle=False)
        if select:
            ds = ds.select(_keep)
        ds = ds.to_tuple("__key__").batched(10).repeat(2)
        return lib.WebLoader(ds, batch_size=None, num_workers=workers)


def _stream(loader, n):
    """The next ``n`` items of ``loader``, over as many ``iter()`` (passes) as it takes."""
    out = []
    while len(out) < n:
        before = len(out)
        for item in loader:
            out.append(list(item[0]))
            if len(out) == n:
                break
        if len(out) == before:
            break
    return out


@pytest.mark.parametrize("select", [False, True])
def test_a_repeat_pass_is_webdatasets(urls, select):
    got = {}
    for lib in (real, ours):
        loader = _repeat_loader(lib, urls, select)
        got[lib.__name__] = [_keys(list(loader)) for _ in range(2)]
    assert got["resumewds"] == got["webdataset"]
    passes = got["resumewds"]
    assert len(passes[0]) == (80 if not select else 2 * 27)  # a batch never spans the two epochs
    assert passes[0] == passes[1]


# (first cut, second cut): the first in the pass's second epoch; then within the pass, into the
# next pass, and at the pass's last item; one case in the default run, the rest under -m slow
_PASS_CUTS = [(50, 5), (45, 40), (79, 1), (27, 27)]


@pytest.mark.parametrize("select,cuts", [
    (select, cuts) if cuts == _PASS_CUTS[0] else pytest.param(select, cuts, marks=pytest.mark.slow)
    for select in (False, True) for cuts in _PASS_CUTS])
def test_a_state_in_a_repeat_pass_resumes_exactly_twice(urls, select, cuts):
    loader = _repeat_loader(ours, urls, select, shuffled=True)
    passes = [_keys(list(loader)) for _ in range(4)]
    assert passes[0] != passes[1]  # each epoch its own order
    flat = [k for p in passes for k in p]
    ends = list(itertools.accumulate(len(p) for p in passes))
    a = _repeat_loader(ours, urls, select, shuffled=True)
    head = _stream(a, cuts[0])
    s1 = a.state_dict()
    b = _repeat_loader(ours, urls, select, workers=2, shuffled=True)
    b.load_state_dict(s1)
    head += _stream(b, cuts[1])
    s2 = b.state_dict()
    c = _repeat_loader(ours, urls, select, workers=3, shuffled=True)
    c.load_state_dict(s2)
    m = len(head)
    assert head == flat[:m]
    end = next(e for e in ends if e > m)  # a state at a pass's last item: the next pass is whole
    assert _keys(list(c)) == flat[m:end], f"cuts {cuts}"  # the rest of the training loop's pass
    assert _keys(list(c)) == passes[ends.index(end) + 1]  # and the next iter() is the next pass


def test_a_repeat_pass_resumes_from_the_journal_twice(urls, tmp_path):
    """The journal's commit records the pass's epochs as state_dict() does: each run's first
    iter() is the rest of its pass, then whole passes."""
    journal = str(tmp_path / "run.db")
    loader = _repeat_loader(ours, urls, True, shuffled=True)
    passes = [_keys(list(loader)) for _ in range(2)]
    total = len(passes[0]) + len(passes[1])
    got, per_iter, step = [], [], 0
    for stop, workers in [(40, 0), (61, 2), (total, 3)]:  # into the pass's second epoch, into the next pass
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            ds = ours.WebDataset(urls, shardshuffle=True, seed=5).select(_keep).to_tuple("__key__").batched(10)
            run = ours.WebLoader(ds.repeat(2), batch_size=None, num_workers=workers, journal=journal, resume=True)
        assert run.steps_done == step
        while step < stop:
            per_iter.append(0)
            for batch in run:
                got.append(list(batch[0]))
                per_iter[-1] += 1
                run.commit(step)
                step += 1
                if step == stop:
                    break
        run.close()
    assert got == passes[0] + passes[1]
    assert per_iter == [40, len(passes[0]) - 40, 61 - len(passes[0]), total - 61]  # the passes' ends kept
