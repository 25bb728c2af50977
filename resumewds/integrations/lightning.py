"""PyTorch Lightning: a WebLoader resumes exactly through ``Trainer.fit(ckpt_path=...)``.

Lightning checkpoints a training loader's ``state_dict`` and loads it back, which resumes a
:class:`resumewds.WebLoader` exactly, except when ``trainer.estimated_stepping_batches`` is read
before the restore (Lightning then never loads the state).  :class:`ResumeWDSCallback` closes that
gap, turns Lightning's one-batch prefetch off for a loader without ``len()``, and serves a torchdata
``StatefulDataLoader`` or torch ``DataLoader`` over a resumewds data set (its epochs, every rank's
state; a DataLoader becomes the equivalent WebLoader).  It changes only the Trainer it is added
to.  What is exact, and why: docs/FRAMEWORKS.md.

Example::

    from resumewds.integrations.lightning import ResumeWDSCallback

    trainer = L.Trainer(max_epochs=3, callbacks=[ResumeWDSCallback(),
                        ModelCheckpoint(dirpath="ckpt", every_n_train_steps=50, save_last=True)])
    trainer.fit(model, train_dataloaders=loader, ckpt_path="last")

Importing this module imports Lightning (``lightning.pytorch``, else ``pytorch_lightning``).
"""

from __future__ import annotations

import importlib
import logging
import warnings
from typing import Any, Dict, List, Optional

from ..errors import StateError
from ..run import has_len, mark_checkpointed, worker_count_error
from ._common import (
    _check_world,
    _is_resumewds_loader,
    _mark_checkpointed,
    _rebind,
    _unbind,
    _webloader_for,
    resumewds_loaders,
)
from .stateful import state_num_workers


def _lightning() -> Any:
    """``lightning.pytorch``, else the standalone ``pytorch_lightning`` (the same API)."""
    try:
        return importlib.import_module("lightning.pytorch")
    except ImportError:  # pragma: no cover - only pytorch_lightning installed
        return importlib.import_module("pytorch_lightning")


_Callback: Any = _lightning().Callback

__all__ = ["ResumeWDSCallback", "CHECKPOINT_KEY", "RANK_STATES_KEY"]

log = logging.getLogger("resumewds")

#: where :class:`ResumeWDSCallback` keeps the loaders' states in a Lightning checkpoint
CHECKPOINT_KEY = "resumewds_loaders"
#: where it keeps every rank's ``StatefulDataLoader`` states (Lightning keeps rank 0's only)
RANK_STATES_KEY = "resumewds_stateful_per_rank"


def _train_loaders(trainer: Any) -> List[Any]:
    """The resumewds loaders Lightning trains on (after it built its CombinedLoader)."""
    combined = getattr(trainer.fit_loop, "_combined_loader", None)
    if combined is not None:
        return resumewds_loaders(combined)
    return resumewds_loaders(getattr(trainer, "train_dataloader", None))


def _foreign_loaders(trainer: Any) -> List[Any]:
    """The training loaders that iterate a resumewds data set directly (a torch ``DataLoader``, a
    torchdata ``StatefulDataLoader``), which Lightning resumes its own way."""
    combined = getattr(trainer.fit_loop, "_combined_loader", None)
    flat = getattr(combined, "flattened", None) or []
    return [dl for dl in flat if not _is_resumewds_loader(dl)
            and hasattr(getattr(dl, "dataset", None), "iter_steps") and hasattr(dl.dataset, "set_epoch")]


def _set_epoch(loader: Any, epoch: int) -> None:
    """The data set of ``loader`` starts its next ``iter()`` at ``epoch`` (unless it is there already)."""
    ds = loader.dataset
    if int(getattr(ds, "epoch", -1)) != int(epoch):
        ds.set_epoch(epoch)


def _start_at_epoch(loader: Any, epoch: int) -> None:
    """A resumewds loader Lightning built afresh for a later epoch (``reload_dataloaders_every_n_epochs``)
    starts at that epoch, unless it has moved or had a state loaded."""
    if epoch > 0 and (int(loader.epoch), int(loader.position), int(loader.steps_done)) == (0, 0, 0):
        log.info("resumewds: a new training loader for epoch %d starts at that epoch", epoch)
        loader.epoch = epoch


def _before_first_iter(callback: ResumeWDSCallback, trainer: Any) -> bool:
    """Prepare the foreign training loaders before Lightning's first ``iter()`` of this fit (the
    restored epoch, the state's worker count, a DataLoader resumed mid-epoch).  True when Lightning
    must not prefetch: one of them has a state, or a resumewds loader has no length (the checkpointed
    state would be one batch ahead)."""
    loop = trainer.fit_loop
    epoch = int(loop.epoch_progress.current.processed)
    progress = loop.epoch_loop.batch_progress
    mid_epoch = bool(loop.restarting and progress.current.completed and not progress.is_last_batch)
    stateful = False
    for loader in _train_loaders(trainer):
        _start_at_epoch(loader, epoch)
        _mark_checkpointed(loader, "lightning")
        if not has_len(loader):
            stateful = True
            if mid_epoch and int(loader.epoch) == epoch + 1 and not int(loader.position):
                # the checkpoint was taken at the last batch of its epoch (the loader stands at the next
                # one), which Lightning could not know without a length: it resumes that epoch's end
                progress.is_last_batch = True
    foreign = _foreign_loaders(trainer)
    _load_own_rank_states(callback, trainer, [dl for dl in foreign if hasattr(dl, "state_dict")])
    for dl in foreign:
        state = getattr(dl, "next_iter_state", None)  # a StatefulDataLoader being restored
        if state is not None:
            taken, have = state_num_workers(state), int(getattr(dl, "num_workers", 0) or 0)
            if taken is not None and taken != have:
                raise worker_count_error(taken, have, state="the checkpoint's StatefulDataLoader state",
                                         loader="the training loader", fix="resumewds.WebLoader")
        elif mid_epoch and not hasattr(dl, "state_dict"):
            msg = (f"resumewds: Lightning resumes in the middle of epoch {epoch} (after {progress.current.completed} "
                   f"batches), but the training loader, a {type(dl).__name__} over a resumewds WebDataset, has no "
                   "state: the epoch starts over and its first batches are trained on again. Use resumewds.WebLoader "
                   "(or torchdata's StatefulDataLoader) for an exact resume, or resume from an end-of-epoch checkpoint")
            if callback.strict:
                raise StateError(msg)
            log.warning("%s", msg)
            warnings.warn(msg, UserWarning, stacklevel=2)
        stateful = stateful or hasattr(dl, "state_dict")
        _set_epoch(dl, epoch)
    return stateful


def _load_own_rank_states(callback: ResumeWDSCallback, trainer: Any, loaders: List[Any]) -> None:
    """Under several processes each rank loads its own ``StatefulDataLoader`` state (Lightning loaded
    rank 0's into every rank)."""
    per_rank, callback._rank_states = callback._rank_states, None
    if not per_rank or not loaders:
        return
    rank, world = int(trainer.global_rank), int(trainer.world_size)
    if len(per_rank) != world or any(len(states) != len(loaders) for states in per_rank):
        raise StateError(f"the checkpoint holds StatefulDataLoader states of {len(per_rank)} rank(s), this run has "
                         f"{world} process(es) with {len(loaders)} such training loader(s): a StatefulDataLoader's "
                         "state is one rank's share; resume with the same world size and loaders, or train with "
                         "resumewds.WebLoader (its state is global: any world size)")
    for dl, state in zip(loaders, per_rank[rank]):
        dl.load_state_dict(state)


def _gather(obj: Any, world: int) -> List[Any]:
    """``obj`` of every rank (``torch.distributed.all_gather_object``; ``[obj]`` in one process)."""
    import torch.distributed as dist  # lazy: torch is Lightning's, loaded already

    if world <= 1 or not (dist.is_available() and dist.is_initialized()):
        return [obj]
    out: List[Any] = [None] * dist.get_world_size()
    dist.all_gather_object(out, obj)
    return out


def _serve_fit_loop(callback: ResumeWDSCallback, trainer: Any) -> None:
    """Let ``callback`` see ``trainer``'s training loaders where no hook reaches: as Lightning processes
    them (a torch ``DataLoader`` becomes a WebLoader) and when it selects its data fetcher (between
    the restore of their states and the first ``iter()``).  Only this trainer's fit loop runs
    ``setup_data`` with the two in place of its module's functions (:func:`_rebind`)."""
    loop = trainer.fit_loop
    scope = type(loop).setup_data.__globals__
    lightning_process, lightning_select = scope["_process_dataloader"], scope["_select_data_fetcher"]

    def _process_dataloader(trainer: Any, trainer_fn: Any, stage: Any, dataloader: Any) -> Any:
        dataloader = lightning_process(trainer, trainer_fn, stage, dataloader)
        converted = _webloader_for(dataloader, stateful=False)
        if converted is not None:  # before Lightning loads the loaders' states: the WebLoader's is loaded
            log.warning("resumewds: ResumeWDSCallback trains on a resumewds.WebLoader instead of the torch "
                        "DataLoader over a resumewds WebDataset (the same batches per epoch, in the "
                        "WebLoader's order: a DataLoader has no position to resume from)")
            dataloader = converted
        if hasattr(getattr(dataloader, "dataset", None), "iter_steps"):  # before Lightning asks for its len()
            mark_checkpointed(dataloader.dataset, "lightning")
        return dataloader

    def _select_data_fetcher(trainer: Any, stage: Any) -> Any:
        fetcher = lightning_select(trainer, stage)
        if _before_first_iter(callback, trainer) and hasattr(fetcher, "prefetch_batches"):
            fetcher.prefetch_batches = 0  # the loader's state is then what was trained on
        return fetcher

    _rebind(loop, "setup_data", _process_dataloader=_process_dataloader, _select_data_fetcher=_select_data_fetcher)


def _where(state: Dict[str, Any]) -> Any:
    return (int(state.get("epoch", 0)), int(state.get("position", 0)))


class ResumeWDSCallback(_Callback):
    """Keep the training WebLoaders' positions in Lightning checkpoints and make sure they are loaded.

    Args:
        strict: a checkpoint that holds no state for a resumewds loader raises
            :class:`resumewds.StateError` (default False: a warning).
    """

    def __init__(self, strict: bool = False):
        super().__init__()
        self.strict = strict
        self._pending: Optional[List[Dict[str, Any]]] = None
        self._rank_states: Optional[List[List[Dict[str, Any]]]] = None

    def setup(self, trainer: Any, pl_module: Any, stage: str) -> None:
        """At the start of ``fit``: serve this trainer's fit loop (:func:`_serve_fit_loop`)."""
        if stage == "fit":
            _serve_fit_loop(self, trainer)

    def teardown(self, trainer: Any, pl_module: Any, stage: str) -> None:
        """At the end of ``fit``: this trainer's fit loop is Lightning's own again."""
        if stage == "fit":
            _unbind(trainer.fit_loop, "setup_data")

    def on_train_epoch_start(self, trainer: Any, pl_module: Any) -> None:
        for dl in _foreign_loaders(trainer):  # before Lightning's iter() of this epoch (not the fit's first)
            _set_epoch(dl, trainer.current_epoch)

    def on_save_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: Dict[str, Any]) -> None:
        loaders = _train_loaders(trainer)
        if loaders:
            checkpoint[CHECKPOINT_KEY] = [ld.state_dict() for ld in loaders]
        stateful = [dl for dl in _foreign_loaders(trainer) if hasattr(dl, "state_dict")]
        if stateful and trainer.world_size > 1:  # every rank saves (together): keep each rank's share
            checkpoint[RANK_STATES_KEY] = _gather([dl.state_dict() for dl in stateful], trainer.world_size)

    def on_load_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: Dict[str, Any]) -> None:
        states = checkpoint.get(CHECKPOINT_KEY)
        if states is None:  # written without this callback: Lightning's own copy, if any
            loop = (checkpoint.get("loops") or {}).get("fit_loop") or {}
            states = (loop.get("state_dict") or {}).get("combined_loader")
            states = [s for s in states or () if isinstance(s, dict) and s.get("format") == "resumewds.loader"]
        self._pending = list(states) if states else []
        self._rank_states = checkpoint.get(RANK_STATES_KEY)

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
