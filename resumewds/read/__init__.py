"""Reading a data set: ShardDataset, its reader (the one read path), verified ranged reads of
shards not cached yet, and the step engine.

Where things are (private modules; import from this package)::

    _dataset.py   ShardDataset: source, cache, plan, reader and stages composed
    _shards.py    ShardReader: open shards, the on_error policy, read / read_run
    _ranged.py    RangedReads: samples by verified ranges; each shard checked whole
    _engine.py    run_steps: the Scheduler, the reads, the StepBuilder
    _torchreg.py  data sets as torch IterableDatasets without importing torch
"""

from __future__ import annotations

import typing as _typing

from .. import _lazy

if _typing.TYPE_CHECKING:  # (the names as the type checker sees them)
    from ._dataset import ShardDataset
    from ._engine import Slots, Source, StepPlan, run_steps
    from ._ranged import RangedReads
    from ._shards import ShardReader
    from ._torchreg import register_iterable_dataset

# each name loads its module on first use (PEP 562)
_LAZY: _typing.Dict[str, str] = {
    "RangedReads": "_ranged",
    "register_iterable_dataset": "_torchreg",
    "run_steps": "_engine",
    "ShardDataset": "_dataset",
    "ShardReader": "_shards",
    "Slots": "_engine",
    "Source": "_engine",
    "StepPlan": "_engine",
}

__all__ = ["RangedReads", "register_iterable_dataset", "run_steps", "ShardDataset", "ShardReader", "Slots",
           "Source", "StepPlan"]

__getattr__, __dir__ = _lazy.attach(__name__, _LAZY)
