"""Which training framework started an iteration of a data set, and what it costs a resume.

A resumewds data set iterated directly by a loader a training framework drives
(a torch ``DataLoader`` or torchdata ``StatefulDataLoader`` under Lightning's
``Trainer``, ``accelerator.prepare(DataLoader(...))`` under Accelerate) loses
or repeats data at a resume unless the framework's integration takes over.
:func:`framework_caller` finds the framework on the call stack (a forked
DataLoader worker keeps its parent's stack, so the answer is the same in the
worker), and :func:`warn_foreign_loader` says, once per process, what goes
wrong and which resumewds loader or callback fixes it.  No framework is
imported: only the names of the modules on the stack are read.

Example:
    >>> framework_caller() is None      # not called from a framework's code
    True
"""

from __future__ import annotations

import logging
import sys
import warnings
from typing import Optional, Set

__all__ = ["FOREIGN_LOADER", "framework_caller", "warn_foreign_loader"]

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
