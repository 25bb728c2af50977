"""PyTorch Lightning: a WebLoader resumes exactly through ``Trainer.fit(ckpt_path=...)``.

Lightning saves the state of a training loader that has ``state_dict`` /
``load_state_dict`` in its checkpoints and loads it back when it builds the
loader at resume; a :class:`resumewds.WebLoader` returned by
``train_dataloader()`` (or passed to ``fit``) continues exactly where the
checkpoint was taken, and ``len(loader)`` is a whole epoch, so every later
epoch has the right length.

One case Lightning misses: when something reads ``trainer.estimated_stepping_batches``
before the checkpoint is restored (``configure_optimizers`` sizing a
OneCycleLR, typically), Lightning builds the loader early and never loads the
saved state into it: the run silently starts again at epoch 0.
:class:`ResumeWDSCallback` closes that gap: it stores the loaders' states in
the checkpoint itself and, when training starts, loads them into any
resumewds loader Lightning left at a different position (with a warning
naming the cause).  It also accepts checkpoints written without it (it then
uses Lightning's own copy of the state).

Example::

    from resumewds.integrations.lightning import ResumeWDSCallback

    trainer = L.Trainer(max_epochs=3, callbacks=[ResumeWDSCallback(),
                        ModelCheckpoint(dirpath="ckpt", every_n_train_steps=50, save_last=True)])
    trainer.fit(model, train_dataloaders=loader, ckpt_path="last")

Importing this module imports Lightning (``lightning.pytorch``, else
``pytorch_lightning``); importing ``resumewds`` does not.
"""

from __future__ import annotations

import importlib
import logging
from typing import Any, Dict, List, Optional

from ..errors import StateError
from . import _check_world, resumewds_loaders


def _lightning() -> Any:
    """``lightning.pytorch``, else the standalone ``pytorch_lightning`` (the same API)."""
    try:
        return importlib.import_module("lightning.pytorch")
    except ImportError:  # pragma: no cover - only pytorch_lightning installed
        return importlib.import_module("pytorch_lightning")


_Callback: Any = _lightning().Callback

__all__ = ["ResumeWDSCallback", "CHECKPOINT_KEY"]

log = logging.getLogger("resumewds")

#: where :class:`ResumeWDSCallback` keeps the loaders' states in a Lightning checkpoint
CHECKPOINT_KEY = "resumewds_loaders"


def _train_loaders(trainer: Any) -> List[Any]:
    """The resumewds loaders Lightning trains on (after it built its CombinedLoader)."""
    combined = getattr(trainer.fit_loop, "_combined_loader", None)
    if combined is not None:
        return resumewds_loaders(combined)
    return resumewds_loaders(getattr(trainer, "train_dataloader", None))


def _where(state: Dict[str, Any]) -> Any:
    return (int(state.get("epoch", 0)), int(state.get("position", 0)))


class ResumeWDSCallback(_Callback):
    """Keep the training WebLoaders' positions in Lightning checkpoints and make sure they are loaded.

    Args:
        strict: a checkpoint being resumed that holds no state for a
            resumewds loader raises :class:`resumewds.StateError` (default
            False: a warning, and the loader starts where it is).
    """

    def __init__(self, strict: bool = False):
        super().__init__()
        self.strict = strict
        self._pending: Optional[List[Dict[str, Any]]] = None

    def on_save_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: Dict[str, Any]) -> None:
        loaders = _train_loaders(trainer)
        if loaders:
            checkpoint[CHECKPOINT_KEY] = [ld.state_dict() for ld in loaders]

    def on_load_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: Dict[str, Any]) -> None:
        states = checkpoint.get(CHECKPOINT_KEY)
        if states is None:  # written without this callback: Lightning's own copy, if any
            loop = (checkpoint.get("loops") or {}).get("fit_loop") or {}
            states = (loop.get("state_dict") or {}).get("combined_loader")
            states = [s for s in states or () if isinstance(s, dict) and s.get("format") == "resumewds.loader"]
        self._pending = list(states) if states else []

    def on_train_start(self, trainer: Any, pl_module: Any) -> None:
        pending, self._pending = self._pending, None
        loaders = _train_loaders(trainer)
        for loader in loaders:
            _check_world(loader, trainer.world_size, "Lightning", "pass no rank= / world_size= (a loader built "
                         "before fit takes the world Lightning sets up), or the Trainer's")
        if pending is None or not loaders:  # not resuming from a checkpoint
            return
        if len(pending) != len(loaders):
            msg = (f"the checkpoint holds {len(pending)} resumewds loader state(s) for {len(loaders)} "
                   "resumewds training loader(s): their positions cannot be restored; resume from a "
                   "checkpoint of this configuration")
            if self.strict or pending:
                raise StateError(msg)
            log.warning("resumewds: %s (the loaders start where they are)", msg)
            return
        for loader, state in zip(loaders, pending):
            if _where(loader.state_dict()) == _where(state):
                continue  # Lightning loaded it already
            log.warning("resumewds: Lightning did not restore the training loader's position (this happens "
                        "when trainer.estimated_stepping_batches is read before the checkpoint is loaded, "
                        "e.g. in configure_optimizers); ResumeWDSCallback restores it: epoch %d, position %d",
                        *_where(state))
            loader.load_state_dict(state)
