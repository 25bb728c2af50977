"""Mixtures of data sets: the mixing plan, MixedDataset, and a mixture run's per-source counts from
its journal.

Where things are (private modules; import from this package)::

    _plan.py     MixPlan: which source feeds each position (weights, phases)
    _dataset.py  MixedDataset: several data sets mixed, exactly resumable
    _status.py   a mixture run's delivered vs requested counts per source
"""

from __future__ import annotations

import typing as _typing

from .. import _lazy

if _typing.TYPE_CHECKING:  # (the names as the type checker sees them)
    from ._dataset import MixedDataset, RandomMix, at_step
    from ._plan import MixPlan
    from ._status import format_mixture, mixture_status

# every name loads its module on first use (PEP 562): importing one module of this
# package (or the package) loads nothing else of it
_LAZY: _typing.Dict[str, str] = {
    "at_step": "_dataset",
    "format_mixture": "_status",
    "MixedDataset": "_dataset",
    "MixPlan": "_plan",
    "mixture_status": "_status",
    "RandomMix": "_dataset",
}

__all__ = ["at_step", "format_mixture", "MixedDataset", "MixPlan", "mixture_status", "RandomMix"]

__getattr__, __dir__ = _lazy.attach(__name__, _LAZY)
