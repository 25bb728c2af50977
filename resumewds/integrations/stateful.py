"""torchdata's ``StatefulDataLoader``: a clear error where it fails with a bare ``AssertionError``.

torchdata restores a state (one snapshot per worker) only into the same ``num_workers``, and
otherwise fails at the next ``iter()`` before any code of the data set runs.
:func:`load_state_dict` checks the count when the state is loaded.  :class:`resumewds.WebLoader`
resumes under any ``num_workers``.  Importing this module imports neither torch nor torchdata.

Example::

    from torchdata.stateful_dataloader import StatefulDataLoader
    from resumewds.integrations.stateful import load_state_dict

    loader = StatefulDataLoader(rw.WebDataset(shards, seed=7), batch_size=32, num_workers=4)
    load_state_dict(loader, checkpoint["data"])   # instead of loader.load_state_dict(...)
"""

from __future__ import annotations

from typing import Any, Dict

from ..errors import StateError
from ..run import state_num_workers, worker_count_error

__all__ = ["load_state_dict", "state_num_workers"]


def load_state_dict(dataloader: Any, state: Dict[str, Any]) -> None:
    """``dataloader.load_state_dict(state)``, refusing a state taken with another ``num_workers``.

    Raises:
        TypeError: ``dataloader`` has no ``load_state_dict`` (a torch ``DataLoader``: no state).
        StateError: ``state`` is not a dict, or was taken with another worker count.
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
