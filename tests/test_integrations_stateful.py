"""torchdata's StatefulDataLoader: a state loaded with another num_workers gets a clear
StateError from resumewds.integrations.stateful.load_state_dict (torchdata's own: a bare
AssertionError at the next iter())."""

from __future__ import annotations

import pytest

pytest.importorskip("torchdata.stateful_dataloader")

from torchdata.stateful_dataloader import StatefulDataLoader

import resumewds as rw
from resumewds.integrations.stateful import load_state_dict, state_num_workers

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")


def keys(loader) -> list:
    return [k for batch in loader for k in batch[0]]


@pytest.mark.parametrize("taken,loaded", [(2, 1), (0, 2), (2, 0)])
def test_another_worker_count_is_a_clear_error(make_shards, taken, loaded):
    shards = make_shards()

    def make(workers):
        return StatefulDataLoader(rw.WebDataset(shards, seed=9, shuffle=True).to_tuple("__key__"), batch_size=4,
                                  num_workers=workers)

    first = make(taken)
    it = iter(first)
    for _ in range(5):
        next(it)
    state = first.state_dict()
    del it
    assert state_num_workers(state) == taken
    bare = make(loaded)
    bare.load_state_dict(state)
    with pytest.raises(AssertionError):  # torchdata's, at iter()
        next(iter(bare))
    with pytest.raises(rw.StateError, match=f"taken with num_workers={taken}, the StatefulDataLoader it is loaded "
                                            f"into has num_workers={loaded}.*num_workers={taken} "
                                            "for this resume.*resumewds.WebLoader"):
        load_state_dict(make(loaded), state)
    same = make(taken)
    load_state_dict(same, state)  # the same count: loaded, and the data continues exactly
    assert keys(same) == keys(make(taken))[20:]


@pytest.mark.parametrize("what", ["none", "dataloader"])
def test_a_loader_without_state_is_a_clear_type_error(make_shards, what):
    from torch.utils.data import DataLoader

    loader = None if what == "none" else DataLoader(rw.WebDataset(make_shards()).to_tuple("__key__"), batch_size=4)
    got = "None" if what == "none" else r"a torch\.utils\.data\.dataloader\.DataLoader"
    with pytest.raises(TypeError, match=r"expected a torchdata StatefulDataLoader .*got " + got):
        load_state_dict(loader, {"_num_yielded": 5})


@pytest.mark.parametrize("state", [None, [1, 2], "state"])
def test_a_state_that_is_not_a_dict_is_a_state_error(make_shards, state):
    loader = StatefulDataLoader(rw.WebDataset(make_shards()).to_tuple("__key__"), batch_size=4)
    with pytest.raises(rw.StateError, match="expected the dict a StatefulDataLoader's state_dict"):
        load_state_dict(loader, state)


class _Combined:
    """A combined loader (as Lightning's CombinedLoader) whose ``flattened`` holds itself."""

    def __init__(self, *loaders):
        self.loaders = list(loaders)

    @property
    def flattened(self):
        return [self, *self.loaders, [self]]


class _Endless:
    """A ``flattened`` that makes a new container each time it is read."""

    @property
    def flattened(self):
        return [_Endless()]


def test_resumewds_loaders_follows_a_container_that_holds_itself_once(make_shards):
    from resumewds.integrations import resumewds_loaders

    a = rw.WebLoader(rw.WebDataset(make_shards(subdir="a")), batch_size=4)
    b = rw.WebLoader(rw.WebDataset(make_shards(subdir="b")), batch_size=4)
    both = _Combined(a, {"x": b, "y": None})
    assert resumewds_loaders(both) == [a, b]
    looped = [a]
    looped.append(looped)
    assert resumewds_loaders({"train": looped, "again": [a]}) == [a, a]  # the same loader twice, as before
    with pytest.raises(ValueError, match="nest more than 100 levels deep at _Endless"):
        resumewds_loaders(_Endless())

def resumed_run(make, cuts, epochs=2):
    """Batches of ``make()`` over ``epochs`` epochs, the loader rebuilt from its state after each cut
    (a state taken after a resume, and after that one...): what a run with len(cuts) resumes trains on."""
    total = sum(1 for _ in range(epochs) for _ in make())
    got, state = [], None
    for cut in list(cuts) + [total]:
        loader = make()
        if state is not None:
            load_state_dict(loader, state)
        it, n = iter(loader), 0
        while n < cut and len(got) < total:
            try:
                got.append(list(next(it)[0]))
                n += 1
            except StopIteration:  # the next epoch: a new iter(), as a training loop's
                it = iter(loader)
        state = loader.state_dict()
        del it
    return got


@pytest.mark.parametrize("workers,sizes,shardshuffle,cuts", [
    (3, (5, 37), 100, [3, 2]),          # a worker that yields nothing between two states
    (4, (8, 20), False, [5, 5, 7]),     # equal shards, three resumes
    (3, (8, 20), 100, [11, 1, 1]),
    (0, (5, 37), 100, [2, 7]),
    (2, (5, 37), True, [40, 10, 1]),   # the second resume crosses into epoch 1
])
def test_a_state_taken_after_a_resume_resumes_exactly(make_shards, workers, sizes, shardshuffle, cuts):
    """Resumed several times with the same num_workers: the whole sequence (2 epochs) is the
    uninterrupted one (each state taken after the previous resume)."""
    shards = make_shards(shards=sizes[0], samples=sizes[1])

    def make():
        return StatefulDataLoader(rw.WebDataset(shards, shardshuffle=shardshuffle, seed=9).to_tuple("__key__"),
                                  batch_size=4, num_workers=workers)

    loader = make()
    ref = [list(b[0]) for _ in range(2) for b in loader]
    assert resumed_run(make, cuts) == ref


def test_a_state_taken_after_a_resume_is_refused_under_another_worker_count(make_shards):
    shards = make_shards()

    def make(workers):
        return StatefulDataLoader(rw.WebDataset(shards, seed=9, shuffle=True).to_tuple("__key__"), batch_size=4,
                                  num_workers=workers)

    first = make(3)
    it = iter(first)
    before = [list(next(it)[0]) for _ in range(4)]
    state = first.state_dict()
    del it
    resumed = make(3)
    load_state_dict(resumed, state)
    it = iter(resumed)
    before += [list(next(it)[0]) for _ in range(2)]
    state = resumed.state_dict()
    del it
    with pytest.raises(rw.StateError, match="taken with num_workers=3.*has num_workers=2"):
        load_state_dict(make(2), state)
    again = make(3)
    load_state_dict(again, state)
    assert before + [list(b[0]) for b in again] == [list(b[0]) for b in make(3)]
