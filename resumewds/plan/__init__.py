"""The delivered order: a pure function of (sample counts, seed, epoch), cut into partitions, laid
out over ranks, steps and workers; who this process is.

Where things are (private modules; import from this package)::

    _keyed.py   keyed randomness: every random choice a hash of integers
    _epoch.py   EpochPlan: one epoch's sequence with random access, partitions
    _layout.py  Layout: which positions each rank delivers at each step
    _plan.py    Plan: the shuffle algorithms (no I/O, no torch)
    _world.py   World: rank, world size, node (torchrun, SLURM, the cache in use)
"""

from __future__ import annotations

import typing as _typing

from .. import _lazy

if _typing.TYPE_CHECKING:  # (the names as the type checker sees them)
    from ._epoch import EpochPlan, check_partitions
    from ._keyed import FeistelPermutation, draw_shards, mix
    from ._layout import EpochLayout, Layout, worker_steps
    from ._plan import Plan
    from ._world import World, detect_world, late_world, node_info, resolve_partitions, worker_info

# every name loads its module on first use (PEP 562): importing one module of this
# package (or the package) loads nothing else of it
_LAZY: _typing.Dict[str, str] = {
    "check_partitions": "_epoch",
    "detect_world": "_world",
    "draw_shards": "_keyed",
    "EpochLayout": "_layout",
    "EpochPlan": "_epoch",
    "FeistelPermutation": "_keyed",
    "late_world": "_world",
    "Layout": "_layout",
    "mix": "_keyed",
    "node_info": "_world",
    "Plan": "_plan",
    "resolve_partitions": "_world",
    "worker_info": "_world",
    "worker_steps": "_layout",
    "World": "_world",
}

__all__ = ["check_partitions", "detect_world", "draw_shards", "EpochLayout", "EpochPlan",
           "FeistelPermutation", "late_world", "Layout", "mix", "node_info", "Plan", "resolve_partitions",
           "worker_info", "worker_steps", "World"]

__getattr__, __dir__ = _lazy.attach(__name__, _LAZY)
