"""torchdata's ``StatefulDataLoader``: a clear error where it fails with a bare ``AssertionError``.

A ``StatefulDataLoader`` state holds one snapshot per DataLoader worker, and
torchdata restores it only into a loader with the same ``num_workers``.
Given another count it fails at the next ``iter()``, far from the cause, with
an ``AssertionError`` without a message (or one naming a private key).  No
code of the dataset runs before that assertion, so the dataset cannot explain
it: :func:`load_state_dict` checks the worker count when the state is loaded
and raises a :class:`resumewds.StateError` that says what to do.

Example::

    from torchdata.stateful_dataloader import StatefulDataLoader
    from resumewds.integrations.stateful import load_state_dict

    loader = StatefulDataLoader(rw.WebDataset(shards, seed=7), batch_size=32, num_workers=4)
    load_state_dict(loader, checkpoint["data"])   # instead of loader.load_state_dict(...)

:class:`resumewds.WebLoader` resumes under any ``num_workers`` (and world
size); use it when the worker count may change between runs.  Importing this
module imports neither torch nor torchdata.
"""

from __future__ import annotations

from typing import Any, Dict

from ..errors import StateError
from ..run import state_num_workers, worker_count_error

__all__ = ["load_state_dict", "state_num_workers"]


def load_state_dict(dataloader: Any, state: Dict[str, Any]) -> None:
    """``dataloader.load_state_dict(state)``, refusing a state taken with another ``num_workers``.

    Args:
        dataloader: a torchdata ``StatefulDataLoader``.
        state: what its ``state_dict()`` returned in an earlier run.

    Raises:
        TypeError: ``dataloader`` has no ``load_state_dict`` (None, a torch
            ``DataLoader``: it has no state to restore).
        StateError: ``state`` is not a dict, or was taken with another worker
            count (torchdata would fail at the next ``iter()`` with a bare
            ``AssertionError``).
    """
    if not callable(getattr(dataloader, "load_state_dict", None)):
        kind = "None" if dataloader is None else f"a {type(dataloader).__module__}.{type(dataloader).__qualname__}"
        raise TypeError(f"load_state_dict: expected a torchdata StatefulDataLoader (a loader with load_state_dict), "
                        f"got {kind}, which has no state to restore. Build the loader as "
                        "torchdata.stateful_dataloader.StatefulDataLoader(...), or train with resumewds.WebLoader")
    if not isinstance(state, dict):
        raise StateError(f"load_state_dict: expected the dict a StatefulDataLoader's state_dict() returned, got "
                         f"{'None' if state is None else 'a ' + type(state).__name__}")
    taken = state_num_workers(state)
    have = int(getattr(dataloader, "num_workers", 0) or 0)
    if taken is not None and taken != have:
        raise worker_count_error(taken, have, state="this StatefulDataLoader state",
                                 loader="the StatefulDataLoader it is loaded into", fix="resumewds.WebLoader")
    dataloader.load_state_dict(state)
