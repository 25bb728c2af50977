"""``transformers.Trainer``: a WebLoader resumes exactly through ``train(resume_from_checkpoint=...)``.

:func:`attach` makes the Trainer train on the loader, write its state into each checkpoint folder
(:data:`STATE_FILE`, before the Trainer's ``trainer_state.json``) and load it back at a resume;
the Trainer's skip of the resumed epoch's first batches becomes a check that the loader is already
there (nothing read twice; the Trainer's counters stay its own).  A checkpoint without the
loader's state raises :class:`resumewds.StateError`.  Only the trainer given changes; details:
docs/FRAMEWORKS.md.

Example::

    from resumewds.integrations.transformers import attach

    trainer = Trainer(model=model, args=TrainingArguments("out", save_steps=500, ...))
    attach(trainer, rw.WebLoader(ds, batch_size=16, num_workers=4))
    trainer.train(resume_from_checkpoint=resuming)

Importing this module imports transformers; importing ``resumewds`` does not.
"""

from __future__ import annotations

import functools
import importlib
import json
import logging
import os
import types
from typing import Any, Dict, Optional

from ..errors import StateError
from ._common import _check_world, _is_resumewds_loader, _mark_checkpointed, _rebind, _skip_in_place

__all__ = ["attach", "ResumeWDSTrainerCallback", "STATE_FILE"]

log = logging.getLogger("resumewds")

#: the loader's state in a checkpoint folder
STATE_FILE = "resumewds_loader.json"

_TrainerCallback: Any = importlib.import_module("transformers").TrainerCallback


def _write_json(path: str, state: Dict[str, Any]) -> None:
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(state, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class ResumeWDSTrainerCallback(_TrainerCallback):
    """Write the loader's state into each checkpoint folder; load it back when training resumes
    (``output_dir``: where the ``checkpoint-<step>`` folders go; default ``args.output_dir``)."""

    def __init__(self, loader: Any, output_dir: Optional[str] = None):
        self.loader = loader
        self.output_dir = output_dir
        #: the checkpoint folder ``train`` resumes from (set by :func:`attach`)
        self.resume_dir: Optional[str] = None
        #: the Trainer's global step the loader's state was restored at
        self.restored_step: Optional[int] = None

    def _save(self, args: Any, state: Any) -> None:
        if not getattr(args, "should_save", True):  # only the process that writes checkpoints
            return
        folder = os.path.join(self.output_dir or args.output_dir, f"checkpoint-{state.global_step}")
        os.makedirs(folder, exist_ok=True)
        _write_json(os.path.join(folder, STATE_FILE), self.loader.state_dict())

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if control.should_save:  # the Trainer saves this step's checkpoint next
            self._save(args, state)

    def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if control.should_save:
            self._save(args, state)

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        _check_world(self.loader, args.world_size, "transformers.Trainer", "build the WebLoader after the "
                     "processes are set up (after TrainingArguments), or pass rank= and world_size=")
        self.restored_step = None
        folder, self.resume_dir = self.resume_dir, None
        if folder is None:
            return
        path = os.path.join(folder, STATE_FILE)
        if not os.path.exists(path):
            raise StateError(f"{folder}: no {STATE_FILE} in this checkpoint (written without "
                             "resumewds.integrations.transformers.attach?): the loader's position is unknown; "
                             "resume from a checkpoint written with attach(), or start without "
                             "resume_from_checkpoint")
        with open(path) as f:
            self.loader.load_state_dict(json.load(f))
        self.restored_step = int(state.global_step)
        log.info("resumewds: loader restored from %s (epoch %s, position %s)", path,
                 getattr(self.loader, "epoch", "?"), getattr(self.loader, "position", "?"))


def _check_skip(loader: Any, num_batches: int) -> Any:
    """The Trainer asks to skip ``num_batches`` of the resumed epoch: the restored loader is there."""
    callback = getattr(loader, "_resumewds_hf_callback", None)
    if callback is None or callback.restored_step is None:
        raise StateError(f"transformers.Trainer wants to skip {num_batches} batches of a resumewds loader whose "
                         "state was not restored from the checkpoint: use "
                         "resumewds.integrations.transformers.attach(trainer, loader)")
    return _skip_in_place(loader, num_batches, "transformers.Trainer")


def _serve_skip(trainer: Any) -> None:
    """The Trainer's skip of a resumed epoch's first batches, for ``trainer`` only: a resumewds loader is
    checked and passed through (:func:`_check_skip`), any other goes to Accelerate's.  The Trainer
    computes its step and gradient-accumulation counters only where it skips (``ignore_data_skip``
    would lose them) and calls ``skip_first_batches`` as a module function no callback reaches: its
    methods that call it run, for this object only, with this skip in its place (:func:`_rebind`)."""
    cls = type(trainer)
    methods = [name for name in dir(cls) if isinstance(getattr(cls, name, None), types.FunctionType)
               and "skip_first_batches" in getattr(cls, name).__code__.co_names]
    if not methods:
        raise RuntimeError("resumewds: this version of transformers.Trainer skips a resumed epoch's batches "
                           "elsewhere: attach() cannot serve it (see docs/FRAMEWORKS.md for the tested versions)")
    for name in methods:
        accelerate_skip = getattr(cls, name).__globals__["skip_first_batches"]

        def skip_first_batches(dataloader: Any, num_batches: int = 0, _accelerate: Any = accelerate_skip) -> Any:
            if _is_resumewds_loader(dataloader):
                return _check_skip(dataloader, num_batches)
            return _accelerate(dataloader, num_batches)

        _rebind(trainer, name, skip_first_batches=skip_first_batches)


def attach(trainer: Any, loader: Any) -> ResumeWDSTrainerCallback:
    """Train ``trainer`` on ``loader`` and resume the loader exactly from the Trainer's checkpoints.

    Args:
        trainer: a ``transformers.Trainer`` (its ``train_dataset`` is not used).
        loader: a :class:`resumewds.WebLoader` (or a loader chain over one) yielding what the model
            takes (give it a ``collate_fn`` that builds the dict of tensors).

    Returns:
        The callback added to the trainer.
    """
    if not _is_resumewds_loader(loader):
        raise TypeError(f"attach needs a resumewds.WebLoader, got {type(loader).__name__}")
    callback = ResumeWDSTrainerCallback(loader)
    loader._resumewds_hf_callback = callback
    _mark_checkpointed(loader, "transformers")
    trainer.get_train_dataloader = lambda: loader
    trainer.add_callback(callback)
    _serve_skip(trainer)
    train = trainer.train

    @functools.wraps(train)
    def train_resuming(resume_from_checkpoint: Any = None, *args: Any, **kwargs: Any) -> Any:
        folder = resume_from_checkpoint
        if folder is True:  # what the Trainer does with True
            from transformers.trainer_utils import get_last_checkpoint

            folder = get_last_checkpoint(trainer.args.output_dir)
        callback.resume_dir = folder if isinstance(folder, str) else None
        return train(resume_from_checkpoint, *args, **kwargs)

    trainer.train = train_resuming
    return callback
