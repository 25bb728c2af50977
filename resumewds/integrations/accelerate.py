"""Hugging Face Accelerate: a WebLoader's position travels in ``save_state`` / ``load_state``.

``accelerator.prepare`` leaves an object that is not a torch DataLoader as it
is, and Accelerate's own way of resuming a loader, ``skip_first_batches``,
rebuilds a DataLoader from the loader's ``dataset``: both miss what a
:class:`resumewds.WebLoader` does.  :func:`prepare_loader` instead

* registers the loader with ``accelerator.register_for_checkpointing``, so
  that ``save_state`` writes its ``state_dict()`` and ``load_state`` loads it
  back (exact, with any ``num_workers`` and world size);
* returns it wrapped in :class:`PreparedLoader`, which moves each batch to
  ``accelerator.device`` as a prepared DataLoader would, and is otherwise the
  loader (``len``, ``epoch``, ``state_dict``, ``commit``, ...);
* turns a torch ``DataLoader`` over a resumewds ``WebDataset`` into a
  WebLoader with the same batch size, workers and collate function: each rank
  then reads its share once (``accelerator.prepare`` on such a DataLoader
  splits batches across processes on top of the dataset's own split by
  rank, and every rank sees half the data with 2 processes).

Example::

    from resumewds.integrations.accelerate import prepare_loader

    accelerator = Accelerator(project_config=ProjectConfiguration("run", automatic_checkpoint_naming=True))
    model, opt = accelerator.prepare(model, opt)
    loader = prepare_loader(accelerator, rw.WebLoader(ds, batch_size=32, num_workers=4))
    if resuming:
        accelerator.load_state()          # the loader continues where save_state() was called
    while loader.epoch < epochs:
        for batch in loader:
            ...; accelerator.save_state()  # now and then

``accelerator.skip_first_batches(loader, n)`` (Accelerate's recipe after
``load_state``) returns the loader itself: it is already where the checkpoint
was taken, and nothing is read twice.  :func:`prepare_loader` changes the
accelerator it is given and nothing else (its ``skip_first_batches`` becomes
an attribute of that object; Accelerate's module and class, and every other
accelerator, stay as they are).  Importing this module does not import
Accelerate.
"""

from __future__ import annotations

from typing import Any, Dict, Iterator, Optional

from ..errors import StateError
from ._common import _check_world, _is_resumewds_loader, _mark_checkpointed, _skip_in_place, _webloader_for

__all__ = ["prepare_loader", "PreparedLoader"]

def _as_webloader(loader: Any) -> Any:
    """``loader`` if it is a resumewds loader; a WebLoader for a torch DataLoader over a
    resumewds dataset; a TypeError for anything else."""
    if _is_resumewds_loader(loader):
        return loader
    converted = _webloader_for(loader)
    if converted is None:
        raise TypeError(f"prepare_loader needs a resumewds.WebLoader (or a torch DataLoader over a "
                        f"resumewds.WebDataset), got {type(loader).__name__}")
    return converted


class PreparedLoader:
    """A resumewds loader whose batches go to ``device`` (see :func:`prepare_loader`).

    Everything else is the loader's: attributes are looked up on it, and
    ``state_dict`` / ``load_state_dict`` are its own.
    """

    def __init__(self, loader: Any, device: Any = None, non_blocking: bool = False):
        self.loader = loader
        self.device = device
        self.non_blocking = non_blocking
        #: whether a state was loaded (``accelerator.load_state``)
        self.restored = False

    def __iter__(self) -> Iterator[Any]:
        if self.device is None:
            yield from self.loader
            return
        from accelerate.utils import send_to_device

        for batch in self.loader:
            yield send_to_device(batch, self.device, non_blocking=self.non_blocking)

    def __len__(self) -> int:
        return len(self.loader)

    def state_dict(self) -> Dict[str, Any]:
        """The loader's state (what ``accelerator.save_state`` writes)."""
        return self.loader.state_dict()

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Continue from ``state`` (what ``accelerator.load_state`` calls)."""
        self.loader.load_state_dict(state)
        self.restored = True

    def __getattr__(self, name: str) -> Any:
        if name == "loader":  # not set yet (unpickling): no recursion
            raise AttributeError(name)
        return getattr(self.loader, name)


def prepare_loader(accelerator: Any, loader: Any, device_placement: Optional[bool] = None) -> PreparedLoader:
    """Make ``loader`` part of ``accelerator``'s checkpoints and place its batches on its device.

    Args:
        accelerator: an ``accelerate.Accelerator``.
        loader: a :class:`resumewds.WebLoader` (or a loader chain over one), or
            a torch ``DataLoader`` over a resumewds ``WebDataset`` (it becomes a
            WebLoader).  Create it after the Accelerator, so that it sees the
            rank and world size (from torch.distributed or the environment).
        device_placement: move batches to ``accelerator.device`` (default:
            ``accelerator.device_placement``).

    Returns:
        The loader, registered with ``accelerator.register_for_checkpointing``.
    """
    loader = _as_webloader(loader)
    state = getattr(accelerator, "state", None)
    _check_world(loader, int(getattr(state, "num_processes", 1) or 1), "the accelerator",
                 "create the loader after the Accelerator (or pass rank= and world_size=)")
    place = accelerator.device_placement if device_placement is None else device_placement
    prepared = PreparedLoader(loader, accelerator.device if place else None,
                              non_blocking=bool(getattr(accelerator, "non_blocking", False)))
    accelerator.register_for_checkpointing(prepared)
    _mark_checkpointed(prepared, "accelerate")
    _serve_skip(accelerator)
    return prepared


def _skip(loader: PreparedLoader, num_batches: int) -> PreparedLoader:
    if num_batches and not loader.restored:
        raise StateError(f"accelerator.skip_first_batches({num_batches}) on a resumewds loader whose state was not "
                         "loaded: accelerator.load_state() restores its position (then skipping is not needed)")
    return _skip_in_place(loader, num_batches, "accelerator.skip_first_batches")


class _SkipFirstBatches:
    """``accelerator.skip_first_batches`` of an accelerator given to :func:`prepare_loader`: a
    :class:`PreparedLoader` is returned as it is, already in place after ``load_state`` (Accelerate's
    recipe would rebuild a DataLoader from its dataset); any other loader goes to the accelerator's own."""

    def __init__(self, accelerate_skip: Any):
        self.accelerate_skip = accelerate_skip

    def __call__(self, dataloader: Any, num_batches: int = 0) -> Any:
        if isinstance(dataloader, PreparedLoader):
            return _skip(dataloader, num_batches)
        return self.accelerate_skip(dataloader, num_batches=num_batches)


def _serve_skip(accelerator: Any) -> None:
    """Give ``accelerator`` (this one only: an attribute of the object) the skip of
    :class:`_SkipFirstBatches`; once."""
    if not isinstance(vars(accelerator).get("skip_first_batches"), _SkipFirstBatches):
        accelerator.skip_first_batches = _SkipFirstBatches(accelerator.skip_first_batches)
