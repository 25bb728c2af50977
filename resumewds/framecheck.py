"""Which training framework started an iteration of a data set, and what it costs a resume.

A resumewds data set iterated directly by a loader a training framework drives
(a torch ``DataLoader`` or torchdata ``StatefulDataLoader`` under Lightning's
``Trainer``, ``accelerator.prepare(DataLoader(...))`` under Accelerate,
``transformers.Trainer(train_dataset=...)``) loses
or repeats data at a resume unless the framework's integration takes over.
:func:`framework_caller` finds the framework on the call stack (a forked
DataLoader worker keeps its parent's stack, so the answer is the same in the
worker), and :func:`warn_foreign_loader` says, once per process, what goes
wrong and which resumewds loader or callback fixes it.  :func:`check_restored_state`
refuses, with a clear error, a torchdata ``StatefulDataLoader`` state of
another ``num_workers`` that a framework restored into the loader about to
iterate the data set (torchdata alone fails with a bare ``AssertionError``).  No framework is
imported: only the names of the modules on the stack are read.

Example:
    >>> framework_caller() is None      # not called from a framework's code
    True
"""

from __future__ import annotations

import logging
import sys
import warnings
from typing import Any, Dict, Optional, Set

from .errors import StateError

__all__ = ["FOREIGN_LOADER", "UNSAVED_LOADER", "check_restored_state", "framework_caller", "has_len",
           "state_num_workers", "warn_foreign_loader", "warn_unsaved_loader", "worker_count_error"]

log = logging.getLogger("resumewds")

#: module-name prefixes -> framework, the first found wins (transformers.Trainer runs Accelerate's loaders)
_PREFIXES = (("transformers.trainer", "transformers"), ("lightning.pytorch.", "lightning"),
             ("pytorch_lightning.", "lightning"), ("accelerate.", "accelerate"))

#: what a framework's own loader does to a resumewds data set at a resume, and the fix
FOREIGN_LOADER = {
    "lightning": (
        "resumewds: a torch DataLoader or torchdata StatefulDataLoader over a resumewds WebDataset under a "
        "Lightning Trainer does not resume exactly: Lightning never calls the data set's set_epoch (with "
        "DataLoader workers every epoch repeats epoch 0's order), a DataLoader has no state to resume "
        "mid-epoch from (the epoch starts over), and Lightning saves a StatefulDataLoader's state one batch "
        "ahead (a batch lost at each resume). Fix: use resumewds.WebLoader as the training loader, or add "
        "resumewds.integrations.lightning.ResumeWDSCallback() to the Trainer's callbacks (a StatefulDataLoader "
        "then resumes exactly, a DataLoader gets its epochs)"),
    "accelerate": (
        "resumewds: accelerator.prepare(DataLoader(resumewds.WebDataset(...))) does not resume exactly "
        "through save_state / load_state: Accelerate's epoch counter (set_epoch) starts again at 0 after "
        "load_state, skip_first_batches reads the skipped batches again, and with several processes its "
        "split of the batches comes on top of the data set's own split by rank. Fix: "
        "loader = resumewds.integrations.accelerate.prepare_loader(accelerator, DataLoader(...)) (or a "
        "resumewds.WebLoader) instead of accelerator.prepare(loader)"),
    "transformers": (
        "resumewds: transformers.Trainer over a resumewds WebDataset (train_dataset=...) does not resume exactly "
        "through resume_from_checkpoint: the Trainer's loader is Accelerate's, whose epoch counter (set_epoch) "
        "starts again at 0 after a resume, and the Trainer skips the checkpoint's batches by reading them again "
        "(with several processes Accelerate also splits the batches on top of the data set's own split by rank). "
        "Fix: resumewds.integrations.transformers.attach(trainer, resumewds.WebLoader(dataset, batch_size=..., "
        "collate_fn=...)) before trainer.train(...)"),
}

#: what a framework does to a resumewds loader its integration does not handle, and the fix
UNSAVED_LOADER = {
    "accelerate": (
        "resumewds: a WebLoader is iterated in a process with an Accelerator, and nothing saves its position: "
        "accelerator.prepare(loader) returns a WebLoader unchanged (it is not a torch DataLoader), so "
        "accelerator.save_state() does not write its state and load_state() does not restore it: a resume "
        "starts the data over (samples lost and repeated). Fix: "
        "loader = resumewds.integrations.accelerate.prepare_loader(accelerator, loader) instead of "
        "accelerator.prepare(loader) (under transformers.Trainer: "
        "resumewds.integrations.transformers.attach(trainer, loader)), or WebLoader(journal=...). A loader "
        "only evaluated on needs no position: prepare_loader silences this too"),
    "lightning": (
        "resumewds: a WebLoader without len() (batch_size=None over a select or a handler: the number of items "
        "of an epoch is unknown) is iterated in a process with Lightning: a Lightning Trainer prefetches one "
        "batch from a loader of unknown length and checkpoints the loader's state one batch ahead of what was "
        "trained on (a batch lost at each resume). Fix: add "
        "resumewds.integrations.lightning.ResumeWDSCallback() to the Trainer's callbacks (it turns that "
        "prefetch off), or give the WebLoader a batch_size (then len() is known)"),
}

_WARNED: Set[str] = set()


def framework_caller(depth: int = 400) -> Optional[str]:
    """The framework (``"lightning"``, ``"accelerate"``, ``"transformers"``) whose code is on the
    call stack, None if none is (at most ``depth`` frames are looked at)."""
    frame = sys._getframe(1)
    found: Optional[str] = None
    rank = len(_PREFIXES)
    while frame is not None and depth > 0:
        name = str(frame.f_globals.get("__name__", ""))
        for i, (prefix, framework) in enumerate(_PREFIXES):
            if i < rank and (name.startswith(prefix) or name == prefix.rstrip(".")):
                found, rank = framework, i
                break
        frame = frame.f_back  # type: ignore[assignment]
        depth -= 1
    return found


def warn_foreign_loader(guarded: Optional[str] = None) -> Optional[str]:
    """Warn (once per process) when a framework with a known resume problem drives this iteration.

    Args:
        guarded: the framework whose resumewds integration handles this data
            set's loader (no warning for it).

    Returns:
        The warning's text, or None.
    """
    framework = framework_caller()
    if framework is None or framework == guarded or framework not in FOREIGN_LOADER:
        return None
    msg = FOREIGN_LOADER[framework]
    if framework not in _WARNED:
        _WARNED.add(framework)
        log.warning("%s", msg)
        warnings.warn(msg, UserWarning, stacklevel=3)
    return msg


def has_len(loader: Any) -> bool:
    """Whether ``len(loader)`` is known (a WebLoader of one item per sample over a ``select``: not).

    Example:
        >>> has_len([1, 2]), has_len(iter([1, 2]))
        (True, False)
    """
    try:
        len(loader)
    except TypeError:
        return False
    return True


def warn_unsaved_loader(loader: Any) -> Optional[str]:
    """Warn (once per process) when ``loader`` is iterated where a framework would lose its position.

    No call stack is read: an ``Accelerator`` exists in this process (``accelerate.state``
    initialized), or Lightning is imported and the loader has no ``len()``.  A loader (or data set)
    an integration handles carries ``_checkpointed_by`` (``prepare_loader``, ``attach``,
    ``ResumeWDSCallback``); a loader with a journal keeps its own position.

    Returns:
        The warning's text, or None.
    """
    if getattr(loader, "journal", None) is not None:
        return None
    if getattr(loader, "_checkpointed_by", None) or getattr(getattr(loader, "dataset", None), "_checkpointed_by", None):
        return None
    found = []
    state = sys.modules.get("accelerate.state")
    initialized = getattr(state, "is_initialized", None)
    if initialized is not None and initialized():
        found.append("accelerate")
    if ("lightning.pytorch" in sys.modules or "pytorch_lightning" in sys.modules) and not has_len(loader):
        found.append("lightning")
    for framework in found:
        if "unsaved:" + framework not in _WARNED:
            _WARNED.add("unsaved:" + framework)
            log.warning("%s", UNSAVED_LOADER[framework])
            warnings.warn(UNSAVED_LOADER[framework], UserWarning, stacklevel=3)
    return "\n".join(UNSAVED_LOADER[f] for f in found) or None


def worker_count_error(taken: int, have: int, *, state: str, loader: str, fix: str) -> StateError:
    """The refusal of a ``StatefulDataLoader`` state restored into another worker count.

    ``state`` and ``loader`` name the two sides in the caller's words, ``fix``
    the resumewds loader to train with instead.

    Example:
        >>> str(worker_count_error(2, 1, state="this state", loader="the loader", fix="resumewds.WebLoader"))[:73]
        'this state was taken with num_workers=2, the loader has num_workers=1: to'
    """
    return StateError(f"{state} was taken with num_workers={taken}, {loader} has num_workers={have}: torchdata "
                      "restores a state only into the same worker count (it holds one snapshot per worker). Build "
                      f"the loader with num_workers={taken} for this resume, or train with {fix}, whose state loads "
                      "under any num_workers")


def state_num_workers(state: Dict[str, Any]) -> Optional[int]:
    """The ``num_workers`` of the ``StatefulDataLoader`` that took ``state`` (None: not such a state).

    Example:
        >>> state_num_workers({"_snapshot": {"_main_snapshot": {"_num_workers": 2}}})
        2
        >>> state_num_workers({"_num_yielded": 5, "fetcher_state": {}})
        0
    """
    if not isinstance(state, dict):
        return None
    snapshot = state.get("_snapshot")
    if isinstance(snapshot, dict):
        main = snapshot.get("_main_snapshot")
        if isinstance(main, dict) and "_num_workers" in main:
            return int(main["_num_workers"])
        return None
    if "_num_yielded" in state:  # the single-process form
        return 0
    return None


def check_restored_state(depth: int = 12) -> None:
    """Refuse a ``StatefulDataLoader`` state of another ``num_workers`` restored into the loader that
    calls this (Accelerate's prepared loader calls the data set's ``set_epoch`` just before it iterates
    its ``StatefulDataLoader``, ``base_dataloader``): the callers' ``self`` within ``depth`` frames.

    Raises:
        StateError: the restored state was taken with another worker count.
    """
    frame = sys._getframe(1)
    while frame is not None and depth > 0:
        obj = frame.f_locals.get("self")
        for loader in (obj, getattr(obj, "base_dataloader", None)):
            state = getattr(loader, "next_iter_state", None)
            taken = state_num_workers(state) if isinstance(state, dict) else None
            have = int(getattr(loader, "num_workers", 0) or 0)
            if taken is not None and taken != have:
                raise worker_count_error(taken, have, state="the restored StatefulDataLoader state",
                                         loader="the loader", fix="resumewds.WebLoader (with Accelerate: "
                                         "resumewds.integrations.accelerate.prepare_loader)")
        frame = frame.f_back  # type: ignore[assignment]
        depth -= 1
