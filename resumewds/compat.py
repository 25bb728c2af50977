"""webdataset's ``compat`` module names: ``WebDataset``, ``WebLoader``, ``MockDataset``.

``import resumewds as wds`` exposes the same names at the top level;
``from resumewds import compat`` (or ``webdataset.compat`` through an
alias) finds them here too.  See docs/COMPAT.md for the semantics.

Example:
    >>> from resumewds.compat import MockDataset
    >>> list(MockDataset((1, 2), 2))
    [(1, 2), (1, 2)]
"""

from __future__ import annotations

from typing import Any, Iterator

from ._torchreg import register_iterable_dataset
from .dataset import WebDataset

__all__ = ["MockDataset", "WebDataset", "WebLoader"]


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


def __getattr__(name: str) -> Any:
    if name == "WebLoader":  # imports torch
        from .loader import WebLoader

        return WebLoader
    raise AttributeError(f"module 'resumewds.compat' has no attribute {name!r}")
