"""``FluidWrapper``: webdataset's fluent interface around any iterable.

``FluidWrapper(initial)`` is ``DataPipeline(initial)`` with the fluent stage
methods, as in webdataset 1.0.2: ``.shuffle(n)``, ``.map(f)``,
``.batched(n)``, ``.decode(...)``, ``.to_tuple(...)``... each append the
composable stage of the same name (:mod:`resumewds.filters`, through
:class:`resumewds.wds._fluent.FluidInterface`).  ``initial``
is usually an arbitrary iterable (a :class:`resumewds.mix.RoundRobin`, a
generator dataset...): then the pipeline runs as webdataset's does and is
not exactly resumable (it says so: a warning once, ``.exact`` is False).
Wrapping stages the plan can compile keeps the plan (and exact resume).

This module imports torch (a ``DataPipeline`` is a torch
``IterableDataset``); ``resumewds.FluidWrapper`` loads it on first use.

Example:
    >>> from resumewds.fluid import FluidWrapper                 # doctest: +SKIP
    >>> sorted(FluidWrapper([3, 1, 2]).shuffle(10))             # doctest: +SKIP
    [1, 2, 3]
"""

from __future__ import annotations

from typing import Any

from .datapipeline import DataPipeline

__all__ = ["FluidWrapper"]


class FluidWrapper(DataPipeline):
    """``DataPipeline(initial)`` with webdataset's fluent methods (see the module docs).

    Args:
        initial: the source iterable (further stages may follow, as in
            ``DataPipeline``).
        **kw: passed to :class:`resumewds.DataPipeline`.
    """

    def __init__(self, initial: Any, *more: Any, **kw: Any):
        super().__init__(initial, *more, **kw)

