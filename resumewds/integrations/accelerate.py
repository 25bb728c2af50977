"""Hugging Face Accelerate: a WebLoader's position travels in ``save_state`` / ``load_state``.

:func:`prepare_loader` registers the loader for checkpointing, places its batches on the device,
turns a torch ``DataLoader`` over a resumewds data set into the equivalent WebLoader, and makes
this accelerator's ``skip_first_batches`` return a restored loader as it is (nothing is read
twice).  Why ``accelerator.prepare`` alone does not resume exactly: docs/FRAMEWORKS.md.  Importing
this module does not import Accelerate.

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
"""

from __future__ import annotations

from typing import Any, Dict, Iterator, Optional

from ..errors import StateError
from ._common import _check_world, _is_resumewds_loader, _mark_checkpointed, _skip_in_place, _webloader_for

__all__ = ["prepare_loader", "PreparedLoader"]

def _as_webloader(loader: Any) -> Any:
    """``loader`` as a resumewds loader (a torch DataLoader over a resumewds data set converted)."""
    if _is_resumewds_loader(loader):
        return loader
    converted = _webloader_for(loader)
    if converted is None:
        raise TypeError(f"prepare_loader needs a resumewds.WebLoader (or a torch DataLoader over a "
                        f"resumewds.WebDataset), got {type(loader).__name__}")
    return converted


class PreparedLoader:
    """A resumewds loader whose batches go to ``device`` (see :func:`prepare_loader`); everything else,
    state included, is the loader's."""

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
        loader: a :class:`resumewds.WebLoader` (or a loader chain over one), or a torch ``DataLoader``
            over a resumewds ``WebDataset``.  Create it after the Accelerator, so that it sees the rank
            and world size.
        device_placement: move batches to ``accelerator.device`` (default: ``accelerator.device_placement``).

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


class _SkipFirstBatches:
    """``skip_first_batches`` of an accelerator given to :func:`prepare_loader`: a
    :class:`PreparedLoader` is returned as it is (already in place after ``load_state``), any other
    loader goes to the accelerator's own."""

    def __init__(self, accelerate_skip: Any):
        self.accelerate_skip = accelerate_skip

    def __call__(self, dataloader: Any, num_batches: int = 0) -> Any:
        if not isinstance(dataloader, PreparedLoader):
            return self.accelerate_skip(dataloader, num_batches=num_batches)
        if num_batches and not dataloader.restored:
            raise StateError(f"accelerator.skip_first_batches({num_batches}) on a resumewds loader whose state was not "
                             "loaded: accelerator.load_state() restores its position (then skipping is not needed)")
        return _skip_in_place(dataloader, num_batches, "accelerator.skip_first_batches")


def _serve_skip(accelerator: Any) -> None:
    """Give this ``accelerator`` (an attribute of the object only) :class:`_SkipFirstBatches`, once."""
    if not isinstance(vars(accelerator).get("skip_first_batches"), _SkipFirstBatches):
        accelerator.skip_first_batches = _SkipFirstBatches(accelerator.skip_first_batches)
