"""webdataset's worker rotation when the data set's stages drop samples (resumewds.wds._rotation).

With ``num_workers=2`` webdataset's DataLoader takes each worker's items from
that worker's own pipeline: worker ``w`` reads shards ``[w::2]``, its
``select`` / a handler drop samples of its own stream, its ``.batched(n)``
fills each batch from its own filtered stream (the last one short), and
torch hands the workers' items out round-robin, a worker that is done
dropping out.  These tests compare whole sequences with webdataset 1.0.2
(real DataLoader workers), then resume from ``state_dict()`` / the journal
at several points (mid-epoch, at an epoch end) with other worker counts and
compare with an uninterrupted run.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import warnings

import pytest
import webdataset as real

import resumewds as ours
from resumewds.errors import StateError
from tests.conftest import subprocess_env

LIBS = (real, ours)


@pytest.fixture
def urls(make_shards):
    """5 shards x 23 samples (worker 0 reads 3 shards, worker 1 reads 2)."""
    return make_shards(shards=5, samples=23)


def _quiet(f, *a, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return f(*a, **kw)


def _keep(s):
    """Drops about a third of the samples, unevenly between the shards."""
    return (int(s["__key__"][1:7]) * 7 + int(s["__key__"][-6:]) * 5) % 9 not in (1, 4, 6)


def _fail_some(s):
    """Raises on a few samples: a handler drops them."""
    if (int(s["__key__"][-6:]) * 3 + int(s["__key__"][1:7])) % 7 == 2:
        raise ValueError(f"bad sample {s['__key__']}")
    return s


def _dataset(lib, urls, how, batch):
    ds = _quiet(lib.WebDataset, urls, shardshuffle=False, handler=lib.warn_and_continue)
    if how == "select":
        ds = ds.select(_keep)
    else:  # a stage whose handler drops the samples it fails on
        ds = ds.map(_fail_some, handler=lib.ignore_and_continue)
    ds = ds.to_tuple("__key__", "cls")
    if batch:
        ds = ds.batched(batch, partial=True)
    return ds


def _loader(lib, urls, how="select", batch=0, workers=2, **kw):
    return _quiet(lib.WebLoader, _dataset(lib, urls, how, batch), batch_size=None, num_workers=workers, **kw)


def _keys(items, batch):
    """Each item as plain data: a key, or a batch's keys."""
    if batch:
        return [tuple(b[0]) for b in items]
    return [k for k, _ in items]


def _run(loader, batch):
    return _keys(_quiet(list, loader), batch)


FORMS = [("select", 0), ("select", 4), ("handler", 0), ("handler", 5)]


@pytest.mark.parametrize("how,batch", FORMS)
def test_same_data_as_webdataset_with_two_workers(urls, how, batch):
    ref = _run(_loader(real, urls, how, batch), batch)
    got = _run(_loader(ours, urls, how, batch), batch)
    assert got == ref
    # the case tests something: the rotation differs from the one of the unfiltered positions
    flat = [k for item in ref for k in (item if batch else [item])]
    assert len(flat) < 5 * 23 and len(set(flat)) == len(flat)
    if batch:
        assert sorted({len(b) for b in ref})[0] < batch  # each worker's last batch is short


@pytest.mark.parametrize("how,batch", FORMS)
def test_same_data_as_webdataset_over_two_epochs(urls, how, batch):
    ref, got = [], []
    loaders = {lib: _loader(lib, urls, how, batch) for lib in LIBS}
    for _ in range(2):
        ref += _run(loaders[real], batch)
        got += _run(loaders[ours], batch)
    assert got == ref


def _head(loader, n):
    out = []
    if n:
        for item in loader:
            out.append(item)
            if len(out) == n:
                break
    return out


# each form and each worker count once in the default run, every pair under -m slow
_KEPT = {("select", 0, 3), ("select", 4, 0), ("handler", 0, 2), ("handler", 5, 3)}


@pytest.mark.parametrize("how,batch,after", [
    (how, batch, after) if (how, batch, after) in _KEPT else pytest.param(how, batch, after, marks=pytest.mark.slow)
    for after in (0, 2, 3) for how, batch in FORMS])
def test_resume_from_state_dict_with_another_worker_count(urls, how, batch, after):
    # after: DataLoader workers of the resumed loader
    full = _run(_loader(ours, urls, how, batch), batch)
    assert full == _run(_loader(real, urls, how, batch), batch)  # webdataset's sequence
    n = len(full)
    for cut in sorted({1, 2, n // 2 - 1, n // 2, n - 2, n - 1}):
        loader = _loader(ours, urls, how, batch)
        head = _keys(_quiet(_head, loader, cut), batch)
        state = loader.state_dict()
        fresh = _loader(ours, urls, how, batch, workers=after)
        fresh.load_state_dict(state)
        rest = _run(fresh, batch)
        assert head + rest == full, f"cut at {cut} of {n}"


@pytest.mark.parametrize("how,batch", [("select", 0), ("select", 4)])
def test_state_at_an_epoch_end_resumes_with_the_next_epoch(urls, how, batch):
    loader = _loader(ours, urls, how, batch)
    first = _run(loader, batch)
    state = loader.state_dict()
    assert state["epoch"] == 1 and state["position"] == 0
    second = _run(loader, batch)
    fresh = _loader(ours, urls, how, batch, workers=3)
    fresh.load_state_dict(state)
    assert _run(fresh, batch) == second == first  # no shuffle: every epoch the same
    assert first == _run(_loader(real, urls, how, batch), batch)
    # mid-epoch of the second epoch, 2 -> 0 workers
    loader = _loader(ours, urls, how, batch)
    _run(loader, batch)
    head = _keys(_quiet(_head, loader, 5), batch)
    state = loader.state_dict()
    fresh = _loader(ours, urls, how, batch, workers=0)
    fresh.load_state_dict(state)
    assert head + _run(fresh, batch) == second


def test_states_of_other_orders(urls):
    # a state of one worker (one filtered stream) goes on with that order under 2 workers
    full1 = _run(_loader(ours, urls, "select", 4, workers=1), 4)
    one = _loader(ours, urls, "select", 4, workers=1)
    head = _keys(_quiet(_head, one, 3), 4)
    two = _loader(ours, urls, "select", 4, workers=2)
    two.load_state_dict(one.state_dict())
    assert head + _run(two, 4) == full1
    # a rotation's state loads into a loader built with fewer workers: it follows the rotation
    full = _run(_loader(ours, urls, "select", 4), 4)
    two = _loader(ours, urls, "select", 4)
    _quiet(_head, two, 3)
    state = two.state_dict()
    assert state["rotation"]["workers"] == 2 and sum(state["rotation"]["streams"]) == state["position"]
    zero = _loader(ours, urls, "select", 4, workers=0)
    zero.load_state_dict(state)
    assert full[:3] + _run(zero, 4) == full
    # states of other orders, made from this one without its checksum (as an earlier
    # resumewds wrote them: an edited state that keeps its checksum is refused as edited)
    unsealed = {k: v for k, v in state.items() if k != "checksum"}
    # mid-epoch without its rotation (another order): refused, never a silent restart
    bare = {k: v for k, v in unsealed.items() if k != "rotation"}
    with pytest.raises(StateError, match="without the rotation of webdataset's 2 workers"):
        _loader(ours, urls, "select", 4, workers=3).load_state_dict(bare)
    # a rotation over another count of streams than the state's split: refused, naming both
    odd = dict(unsealed, rotation=dict(state["rotation"], workers=3))
    with pytest.raises(StateError, match="rotation of 3 workers' streams; this loader follows 2"):
        _loader(ours, urls, "select", 4).load_state_dict(odd)
    # a loader that batches itself cannot follow the rotation: refused
    plain = _quiet(ours.WebLoader, _dataset(ours, urls, "select", 0), batch_size=4, num_workers=2)
    with pytest.raises(StateError, match="rotation of 2 workers' filtered streams"):
        plain.load_state_dict(state)


def test_a_preemption_stops_between_items_and_resumes_exactly(urls):
    full = _run(_loader(ours, urls, "select", 4), 4)
    loader = _loader(ours, urls, "select", 4, preempt=True)
    got = []
    try:
        for b in loader:
            got.append(tuple(b[0]))
            if len(got) == 5:
                loader.request_stop()
        assert len(got) == 5 and loader.preempted
        state = loader.state_dict()
    finally:
        loader.close()
    fresh = _loader(ours, urls, "select", 4, workers=3)
    fresh.load_state_dict(state)
    assert got + _run(fresh, 4) == full


def test_skip_steps_is_refused_under_the_rotation(urls):
    loader = _loader(ours, urls, "select", 4)
    with pytest.raises(StateError, match="skip_steps"):
        loader.skip_steps(3)


def test_unfiltered_forms_keep_their_order(urls):
    # no stage drops samples: the shard split's own order, as before (and as webdataset's)
    for lib_ds in ({lib: _quiet(lib.WebDataset, urls, shardshuffle=False).to_tuple("__key__", "cls").batched(4)
                    for lib in LIBS},):
        got = {lib: _keys(_quiet(list, _quiet(lib.WebLoader, ds, batch_size=None, num_workers=2)), 4)
               for lib, ds in lib_ds.items()}
        assert got[ours] == got[real]


DRIVER = """
import os, signal, sys, warnings
warnings.simplefilter("ignore")
sys.path.insert(0, {root!r})
import resumewds as wds
from tests.test_filtered_rotation import _dataset
urls, out, kill_at = {urls!r}, {out!r}, int(sys.argv[1])
ds = _dataset(wds, urls, "select", 4)
loader = wds.WebLoader(ds, batch_size=None, num_workers=2, journal={journal!r}, resume=True)
step = loader.steps_done
with open(out, "a") as f:
    for epoch in range(2):
        for batch in loader:
            if step == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
            f.write(" ".join(batch[0]) + "\\n")
            f.flush()
            loader.commit(step)
            step += 1
            if step >= 20:
                break
        if step >= 20:
            break
loader.close()
"""


@pytest.mark.slow  # resume at any step: test_resume_from_state_dict_with_another_worker_count
def test_kill_9_and_resume_from_the_journal(urls, tmp_path):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

    def drive(name, kill_at):
        out = str(tmp_path / f"{name}.txt")
        code = DRIVER.format(root=root, urls=urls, out=out, journal=str(tmp_path / f"{name}.db"))
        p = subprocess.run([sys.executable, "-c", code, str(kill_at)], env=subprocess_env(), cwd=root,
                           capture_output=True, text=True, timeout=300)
        return p, out

    p, full = drive("full", -1)
    assert p.returncode == 0, p.stderr
    p, cut = drive("cut", 7)
    assert p.returncode == -signal.SIGKILL, p.stderr
    with open(cut) as f:
        assert len(f.read().splitlines()) == 7
    p, _ = drive("cut", -1)
    assert p.returncode == 0, p.stderr
    with open(full) as f, open(cut) as g:
        ref, got = f.read().splitlines(), g.read().splitlines()
    assert len(ref) == 20 and got == ref
    wds = _loader(real, urls, "select", 4)
    assert ref == [" ".join(k) for k in (_run(wds, 4) + _run(wds, 4))[:20]]  # webdataset's batches
    # the journal's consumption too: the samples the select dropped before the kill's place included
    from resumewds.journal._read import read_consumption

    assert read_consumption(str(tmp_path / "cut.db")) == read_consumption(str(tmp_path / "full.db"))


def _epoch_with_commits(urls, path, batch, stops):
    """Epoch 0 of the rotation over a select, a commit after each item: each run of ``stops``
    (``(items, workers)``; None: to the epoch's end) resumes from the journal, then stops there."""
    step = 0
    for stop, workers in stops:
        loader = _loader(ours, urls, "select", batch, workers=workers, journal=path, resume=True)
        assert loader.steps_done == step
        for _ in _quiet(iter, loader):
            loader.commit(step)
            step += 1
            if step == stop:
                break
        assert stop is not None or loader.epoch == 1
        loader.close()


@pytest.mark.parametrize("batch", [0, 4])
def test_the_journal_counts_the_dropped_samples_across_a_resume(urls, tmp_path, batch):
    """The samples a select dropped are consumed as the position passes them: a run that stopped
    between two items of one read step, and resumed from its journal, records the same
    consumption as one that did not stop."""
    from resumewds.journal._read import read_consumption

    full, cut = str(tmp_path / "full.db"), str(tmp_path / "cut.db")
    _epoch_with_commits(urls, full, batch, [(None, 2)])
    _epoch_with_commits(urls, cut, batch, [(5, 2), (None, 0)])  # 5 items: inside both streams' first step
    assert read_consumption(cut) == read_consumption(full)
    assert {u: r["samples"] for u, r in read_consumption(full)[0].items()} == dict.fromkeys(urls, 23)


def test_the_commit_place_is_journaled(tmp_path):
    from resumewds.journal import Journal, resolve_resume

    path = str(tmp_path / "run.db")
    place = {"rotation": {"workers": 2, "streams": [9, 4], "next": 1}}
    with Journal(path) as j:
        j.check_config({"seed": 1, "batch_size": None})
        j.commit(0, epoch=0, position=5)
        j.commit(1, epoch=0, position=13, place=place)
        assert j.latest_commit()["place"] == place and j.commit_at(0)["place"] is None
    assert resolve_resume(path)["place"] == place
    assert resolve_resume(path, step=0)["place"] is None


# ---- webdataset's training chain over the filtered stream ------------------------------------
# WebLoader(ds.select(f).batched(8), batch_size=None).unbatched().shuffle(n).batched(m): the loader
# hands out the refilled batches (the rotation above), the chain unbatches and re-batches them on
# its stream, and .shuffle(n) is the data set's (in the plan). The re-batcher holds samples of
# an item partly handed out; a state records the place before that item and how many of its
# samples were handed out, so it resumes exactly.

def _chain(lib, urls, workers=2, shuffle=True, **kw):
    loader = _loader(lib, urls, "select", 8, workers=workers, **kw).unbatched()
    if shuffle:
        loader = loader.shuffle(100)
    return loader.batched(12)


def _stream(loader, n):
    """The next ``n`` items of ``loader``, over as many ``iter()`` as it takes."""
    out = []
    while len(out) < n:
        before = len(out)
        for item in loader:
            out.append(tuple(item[0]))
            if len(out) == n:
                break
        if len(out) == before:
            break
    return out


def _epochs(loader, n):
    return [[tuple(b[0]) for b in _quiet(list, loader)] for _ in range(n)]


@pytest.mark.parametrize("workers", [0, 2])
def test_the_training_chain_over_a_select_is_webdatasets(urls, workers):
    ref = _epochs(_chain(real, urls, workers, shuffle=False), 2)
    assert _epochs(_chain(ours, urls, workers, shuffle=False), 2) == ref
    assert sorted({len(b) for b in ref[0]}) == [5, 12]  # full batches, the last one short
    # with .shuffle(100): the same every run (seeded by the data set's seed and epoch), a new
    # order each epoch, and the same samples as webdataset's (whose buffer is not seeded)
    got = _epochs(_chain(ours, urls, workers), 2)
    assert _epochs(_chain(ours, urls, workers), 2) == got
    assert got[0] != got[1] and got[0] != ref[0]
    for mine, theirs in zip(got, ref):
        assert sorted(k for b in mine for k in b) == sorted(k for b in theirs for k in b)
        assert [len(b) for b in mine] == [len(b) for b in theirs]


# (first cut, second cut) in items: states with samples held back (chain_skip) and without, one
# across an epoch's end; each form's first pair in the default run, the rest under -m slow
_CUTS = [(2, 3), (4, 6), (1, 5), (6, 1), (3, 9)]


@pytest.mark.parametrize("shuffle,cuts", [
    (shuffle, cuts) if cuts == _CUTS[0] else pytest.param(shuffle, cuts, marks=pytest.mark.slow)
    for shuffle in (True, False) for cuts in _CUTS])
def test_the_training_chain_resumes_exactly_twice_with_other_worker_counts(urls, shuffle, cuts):
    n = 2 * len(_epochs(_chain(ours, urls, 2, shuffle), 1)[0])
    full = _stream(_chain(ours, urls, 2, shuffle), n)  # two epochs
    a = _chain(ours, urls, 2, shuffle)
    head = _stream(a, cuts[0])
    s1 = a.state_dict()
    b = _chain(ours, urls, 0, shuffle)  # resumed without workers ...
    b.load_state_dict(s1)
    head += _stream(b, cuts[1])
    s2 = b.state_dict()
    c = _chain(ours, urls, 3, shuffle)  # ... then with 3
    c.load_state_dict(s2)
    rest = _stream(c, n - len(head))
    assert head + rest == full, f"cuts {cuts}"


def test_batches_of_the_filtered_samples_are_webdatasets_and_resume_twice(urls):
    """WebLoader(ds.select(f), batch_size=None).batched(m): full batches from the filtered
    stream (webdataset's), not batches of positions."""
    def make(lib, workers):
        return _loader(lib, urls, "select", 0, workers=workers).batched(12)

    full = _epochs(make(ours, 2), 2)
    assert full == _epochs(make(real, 2), 2)
    assert sorted({len(b) for b in full[0]}) == [5, 12]
    flat = full[0] + full[1]
    a = make(ours, 2)
    head = _stream(a, 4)
    b = make(ours, 0)
    b.load_state_dict(a.state_dict())
    head += _stream(b, 5)  # into the second epoch
    c = make(ours, 3)
    c.load_state_dict(b.state_dict())
    assert head + _stream(c, len(flat) - len(head)) == flat


def test_a_state_holds_the_samples_the_rebatcher_holds(urls):
    """Where a batch of 12 ends inside a refilled batch of 8, the state is the place before
    that item and the count of its samples handed out; taken twice, it is the same."""
    full = _stream(_chain(ours, urls, 2, False), 14)  # two epochs of 7 batches
    skips = []
    for cut in range(1, 5):
        a = _chain(ours, urls, 2, False)
        head = _stream(a, cut)
        state = a.state_dict()
        assert a.state_dict() == state
        skips.append(state["chain_skip"])
        b = _chain(ours, urls, 2, False)
        b.load_state_dict(state)
        assert head + _stream(b, len(full) - cut) == full, f"cut {cut}"
    assert any(skips) and not all(skips)  # both kinds of state were taken


def test_a_smoke_batch_after_a_resume_of_the_training_chain_loses_nothing(urls):
    full = _stream(_chain(ours, urls, 2), 14)
    a = _chain(ours, urls, 2)
    head = _stream(a, 3)
    state = a.state_dict()
    assert state["chain_skip"] == 4
    b = _chain(ours, urls, 0)
    b.load_state_dict(state)
    next(iter(b))  # a smoke test right after the resume
    assert head + _stream(b, 11) == full


def test_a_state_of_another_chain_is_refused(urls):
    a = _chain(ours, urls, 2, False)
    _stream(a, 1)
    state = a.state_dict()
    assert state["chain_skip"] == 4  # 12 = 8 + 4 of the second item
    with pytest.raises(StateError, match="unbatches its loader's items"):
        _loader(ours, urls, "select", 8).load_state_dict(state)


def test_the_training_chain_with_epoch_goes_on_over_the_stream(urls):
    """.with_epoch(5): each iter() the next 5 batches; a chunk that ends inside a refilled batch
    goes on with its held samples; each data epoch still ends with its short batch (webdataset
    runs its loader's stages once per DataLoader pass)."""
    full = _stream(_chain(ours, urls, 2), 20)
    chain = _chain(ours, urls, 2).with_epoch(5)
    chunks = [[tuple(b[0]) for b in chain] for _ in range(2)]
    assert [len(c) for c in chunks] == [5, 5] and chunks[0] + chunks[1] == full[:10]
    state = chain.state_dict()
    assert state["chain_skip"] > 0  # 10 batches of 12 end inside a batch of 8
    again = _chain(ours, urls, 0).with_epoch(5)
    again.load_state_dict(state)
    more = [tuple(b[0]) for b in again]
    s2 = again.state_dict()
    last = _chain(ours, urls, 3).with_epoch(5)
    last.load_state_dict(s2)
    assert more + [tuple(b[0]) for b in last] == full[10:20]


def test_the_training_chain_stops_on_a_preemption_and_resumes_exactly(urls):
    full = _stream(_chain(ours, urls, 2, False), 14)
    chain = _chain(ours, urls, 2, False, preempt=True)
    got = []
    try:
        for b in chain:
            got.append(tuple(b[0]))
            if len(got) == 3:
                chain.request_stop()  # the next batch needs a refilled batch not handed out
        state = chain.state_dict()
    finally:
        chain.close()
    assert len(got) == 3 and state["chain_skip"] == 4  # the samples held are not lost
    fresh = _chain(ours, urls, 0, False)
    fresh.load_state_dict(state)
    assert got + _stream(fresh, 11) == full


CHAIN_DRIVER = """
import os, signal, sys, warnings
warnings.simplefilter("ignore")
sys.path.insert(0, {root!r})
import resumewds as wds
from tests.test_filtered_rotation import _chain
urls, out, kill_at, workers = {urls!r}, {out!r}, int(sys.argv[1]), int(sys.argv[2])
chain = _chain(wds, urls, workers, journal={journal!r}, resume=True)
step = chain.steps_done
with open(out, "a") as f:
    while step < 20:
        for batch in chain:
            if step == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)
            f.write(" ".join(batch[0]) + "\\n")
            f.flush()
            chain.commit(step)
            step += 1
            if step >= 20:
                break
chain.close()
"""


@pytest.mark.slow  # in-process resumes: test_the_training_chain_resumes_exactly_twice_with_other_worker_counts
def test_the_training_chain_survives_kill_9_twice(urls, tmp_path):
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

    def drive(name, kill_at, workers):
        out = str(tmp_path / f"{name}.txt")
        code = CHAIN_DRIVER.format(root=root, urls=urls, out=out, journal=str(tmp_path / f"{name}.db"))
        p = subprocess.run([sys.executable, "-c", code, str(kill_at), str(workers)], env=subprocess_env(),
                           cwd=root, capture_output=True, text=True, timeout=300)
        return p, out

    p, full = drive("full", -1, 2)
    assert p.returncode == 0, p.stderr
    p, cut = drive("cut", 5, 2)  # a state with samples held back (see test_a_state_holds...)
    assert p.returncode == -signal.SIGKILL, p.stderr
    p, _ = drive("cut", 11, 0)  # after the first resume, with no workers; the second epoch
    assert p.returncode == -signal.SIGKILL, p.stderr
    p, _ = drive("cut", -1, 3)
    assert p.returncode == 0, p.stderr
    with open(full) as f, open(cut) as g:
        ref, got = f.read().splitlines(), g.read().splitlines()
    assert len(ref) == 20 and got == ref
