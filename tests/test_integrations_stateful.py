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
