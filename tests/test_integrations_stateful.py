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
