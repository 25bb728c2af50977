"""Which training framework drives a data set, and what it costs a resume.

A resumewds data set iterated by a loader a framework drives (Lightning, Accelerate, the
transformers Trainer) loses or repeats data at a resume unless the framework's integration takes
over.  Nothing here runs on the data path: the data set's ``len()`` and ``set_epoch()`` (what each
framework asks just before it iterates) call :func:`note_framework`, which reads the module names
of a few frames above, once per data set, and warns once per process
(:func:`warn_foreign_loader`).  An integration marks what it handles (:func:`mark_checkpointed`).
:func:`check_restored_state` refuses a ``StatefulDataLoader`` state of another ``num_workers`` that
Accelerate restored (torchdata fails with a bare ``AssertionError``).  No framework is imported.

Example:
    >>> framework_caller() is None      # not called from a framework's code
    True
"""

from __future__ import annotations

import logging
import sys
import warnings
import weakref
from typing import Any, Dict, Optional, Set

from ..errors import StateError

__all__ = ["FOREIGN_LOADER", "LOOK_DEPTH", "UNSAVED_LOADER", "check_restored_state", "checkpointed_by",
           "framework_caller", "has_len", "mark_checkpointed", "note_framework", "state_num_workers",
           "warn_foreign_loader", "warn_unsaved_loader", "worker_count_error"]

log = logging.getLogger("resumewds")

#: module-name prefixes -> framework, the first found wins (transformers.Trainer runs Accelerate's loaders)
_PREFIXES = (("transformers.trainer", "transformers"), ("lightning.pytorch.", "lightning"),
             ("pytorch_lightning.", "lightning"), ("accelerate.", "accelerate"))

#: frames :func:`note_framework` looks at above the data set's ``len()`` / ``set_epoch()`` (the deepest
#: measured is 3: Lightning's ``len()`` of a torch ``DataLoader``, through ``sized_len`` and ``has_len_all_ranks``)
LOOK_DEPTH = 6

#: what each framework asks a data set just before it iterates it through its own loader
_ASKS_BEFORE_ITER = {"lightning": "len", "accelerate": "set_epoch", "transformers": "set_epoch"}

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
#: the framework each data set was found driven by (:func:`note_framework` looks once per data set)
_FOUND: weakref.WeakKeyDictionary[Any, Optional[str]] = weakref.WeakKeyDictionary()


def framework_caller(depth: int = LOOK_DEPTH, above: int = 0) -> Optional[str]:
    """The framework whose code is among ``depth`` frames from ``above`` frames above the caller on
    (None: none); only module names are read.

    Example:
        >>> framework_caller(depth=3) is None
        True
    """
    frame: Any = sys._getframe(1 + above)
    found: Optional[str] = None
    rank = len(_PREFIXES)
    while frame is not None and depth > 0:
        name = str(frame.f_globals.get("__name__", ""))
        for i, (prefix, framework) in enumerate(_PREFIXES):
            if i < rank and (name.startswith(prefix) or name == prefix.rstrip(".")):
                found, rank = framework, i
                break
        frame = frame.f_back
        depth -= 1
    return found


def mark_checkpointed(obj: Any, framework: str) -> None:
    """Say that ``framework``'s integration keeps ``obj``'s position: no warning for it (an object
    without attributes is left as it is).

    Example:
        >>> class Loader: pass
        >>> loader = Loader(); mark_checkpointed(loader, "lightning"); checkpointed_by(loader)
        'lightning'
    """
    try:
        obj._checkpointed_by = framework
    except AttributeError:
        pass


def checkpointed_by(obj: Any) -> Optional[str]:
    """The framework whose integration keeps ``obj``'s position (:func:`mark_checkpointed`), or None."""
    return getattr(obj, "_checkpointed_by", None)


def note_framework(dataset: Any, asked: str) -> Optional[str]:
    """Called by a data set's ``len()`` (``asked="len"``) and ``set_epoch()``: warns where the framework
    that drives it (looked for once) asks what it asks just before it iterates through its own loader.
    Returns the warning's text, or None."""
    try:
        if dataset not in _FOUND:
            _FOUND[dataset] = framework_caller(LOOK_DEPTH, above=2)
        framework = _FOUND[dataset]
    except TypeError:  # neither hashable nor weakly referable: not looked for
        return None
    if framework is None or _ASKS_BEFORE_ITER.get(framework) != asked:
        return None
    return warn_foreign_loader(checkpointed_by(dataset), framework)


def warn_foreign_loader(guarded: Optional[str] = None, framework: Optional[str] = None) -> Optional[str]:
    """Warn (once per process) that ``framework``'s own loader does not resume a resumewds data set
    exactly, unless ``guarded`` (the framework whose integration handles it) is that one.

    Example:
        >>> warn_foreign_loader("lightning", "lightning") is None
        True
    """
    if framework is None or framework == guarded or framework not in FOREIGN_LOADER:
        return None
    msg = FOREIGN_LOADER[framework]
    if framework not in _WARNED:
        _WARNED.add(framework)
        log.warning("%s", msg)
        warnings.warn(msg, UserWarning, stacklevel=4)
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
    """Warn (once per process) when ``loader`` is iterated where a framework would lose its position:
    an ``Accelerator`` exists, or Lightning is imported and the loader has no ``len()``.  A loader
    with a journal, or one an integration marked, is left alone.  Returns the warning's text, or None."""
    if getattr(loader, "journal", None) is not None:
        return None
    if checkpointed_by(loader) or checkpointed_by(getattr(loader, "dataset", None)):
        return None
    found = []
    if _accelerate_state() is not None:
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
    """The refusal of a ``StatefulDataLoader`` state restored into another worker count (``state``,
    ``loader``: the two sides in the caller's words; ``fix``: the loader to train with instead).

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


def _accelerate_state() -> Any:
    """``accelerate.state`` where an ``Accelerator`` exists in this process, else None (Accelerate is
    not imported for this)."""
    state = sys.modules.get("accelerate.state")
    initialized = getattr(state, "is_initialized", None)
    return state if initialized is not None and initialized() else None


def check_restored_state(dataset: Any = None) -> None:
    """Refuse (a :class:`~resumewds.errors.StateError`) a ``StatefulDataLoader`` state of another
    ``num_workers`` restored into the loader Accelerate is about to iterate over ``dataset`` (None:
    whatever the active loader iterates)."""
    accelerate = _accelerate_state()
    loader = None if accelerate is None else getattr(accelerate.GradientState(), "active_dataloader", None)
    if loader is None:
        return
    inner = getattr(loader, "dataset", None)
    if dataset is not None and inner is not dataset and getattr(inner, "dataset", None) is not dataset:
        return  # Accelerate iterates another data set (this one's epoch is set by someone else)
    state = getattr(loader, "next_iter_state", None)
    taken = state_num_workers(state) if isinstance(state, dict) else None
    have = int(getattr(loader, "num_workers", 0) or 0)
    if taken is not None and taken != have:
        raise worker_count_error(taken, have, state="the restored StatefulDataLoader state",
                                 loader="the loader", fix="resumewds.WebLoader (with Accelerate: "
                                 "resumewds.integrations.accelerate.prepare_loader)")
