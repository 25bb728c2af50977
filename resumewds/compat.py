"""webdataset's ``compat`` module names: ``WebDataset``, ``WebLoader``, ``MockDataset``,
``FluidWrapper`` (:mod:`resumewds.fluid`) and the ``Cached`` stage.

``import resumewds as wds`` exposes the same names at the top level;
``from resumewds import compat`` (or ``webdataset.compat`` through an
alias) finds them here too.  See docs/COMPAT.md for the semantics.

Example:
    >>> from resumewds.compat import MockDataset
    >>> list(MockDataset((1, 2), 2))
    [(1, 2), (1, 2)]
    >>> stage = Cached()
    >>> list(stage(iter([1, 2]))), list(stage(iter([])))   # the second pass replays the first
    ([1, 2], [1, 2])
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable, Iterator, List, Optional

from ._torchreg import register_iterable_dataset
from .dataset import WebDataset

if TYPE_CHECKING:  # loaded on first use (both import torch): see __getattr__
    from .fluid import FluidWrapper
    from .loader import WebLoader

__all__ = ["Cached", "FluidWrapper", "MockDataset", "WebDataset", "WebLoader"]


class MockDataset:
    """webdataset's ``MockDataset(sample, length)``: ``sample``, ``length`` times.

    A torch ``IterableDataset`` once torch is imported.
    """

    def __init__(self, sample: Any, length: int):
        self.sample = sample
        self.length = int(length)

    def __iter__(self) -> Iterator[Any]:
        for _ in range(self.length):
            yield self.sample


register_iterable_dataset(MockDataset)


class Cached:
    """webdataset's ``Cached()`` stage: the first complete pass is kept in memory
    and every later pass replays it instead of reading its input.

    A pass that stops early is not kept.  In a ``DataPipeline`` it is a stage
    the plan cannot see through (the pipeline says it is not exactly
    resumable); ``WebDataset`` reads by position from the verified cache, so
    it rarely needs one (``.mcached()`` is not supported).
    """

    def __init__(self) -> None:
        self.cached: Optional[List[Any]] = None

    def __call__(self, source: Iterable[Any]) -> Iterator[Any]:
        if self.cached is not None:
            yield from self.cached
            return
        temp: List[Any] = []
        for sample in source:
            temp.append(sample)
            yield sample
        self.cached = temp

    run = __call__  # webdataset's PipelineStage.run

    def invoke(self, source: Iterable[Any]) -> Iterator[Any]:
        """webdataset's ``PipelineStage.invoke``."""
        return self(source)


def __getattr__(name: str) -> Any:
    if name == "WebLoader":  # imports torch
        from .loader import WebLoader

        return WebLoader
    if name == "FluidWrapper":  # a DataPipeline: imports torch
        from .fluid import FluidWrapper

        return FluidWrapper
    raise AttributeError(f"module 'resumewds.compat' has no attribute {name!r}")
