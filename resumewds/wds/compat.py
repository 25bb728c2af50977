"""webdataset's ``compat`` module names: ``WebDataset``, ``WebLoader``, ``MockDataset``,
``FluidInterface``, ``FluidWrapper``, ``check_empty`` and the ``Cached`` stage (docs/COMPAT.md).

Example:
    >>> from resumewds.compat import MockDataset
    >>> list(MockDataset((1, 2), 2))
    [(1, 2), (1, 2)]
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Iterable, Iterator

from .. import autodecode, cache  # noqa: F401  (webdataset's compat.autodecode, compat.cache)
from ..read import register_iterable_dataset
from . import filters, shardlists, utils  # noqa: F401  (webdataset's compat.filters, ...)
from ._fluent import FluidInterface
from .filters import Cached, pipelinefilter
from .handlers import reraise_exception
from .tariterators import group_by_keys, tar_file_expander
from .webdataset import WebDataset

if TYPE_CHECKING:  # loaded on first use (they import torch): see __getattr__
    from .datapipeline import DataPipeline
    from .fluid import FluidWrapper
    from .loaderchain import WebLoader

__all__ = ["Cached", "DataPipeline", "FluidInterface", "FluidWrapper", "MockDataset", "WebDataset", "WebLoader",
           "check_empty", "group_by_keys", "pipelinefilter", "reraise_exception", "tar_file_expander"]


class MockDataset:
    """webdataset's ``MockDataset(sample, length)``: ``sample``, ``length`` times."""

    def __init__(self, sample: Any, length: int):
        self.sample = sample
        self.length = int(length)

    def __iter__(self) -> Iterator[Any]:
        for _ in range(self.length):
            yield self.sample


register_iterable_dataset(MockDataset)


def check_empty(source: Iterable[Any]) -> Iterator[Any]:
    """Pass ``source`` through; raise ValueError at its end if it yielded nothing."""
    count = 0
    for sample in source:
        yield sample
        count += 1
    if count == 0:
        raise ValueError("No samples found in dataset; perhaps you have fewer shards than workers.\n"
                         "Turn off using empty_check=False in the WebDataset constructor.")


def __getattr__(name: str) -> Any:
    if name == "WebLoader":
        from .loaderchain import WebLoader  # lazy: imports torch

        return WebLoader
    if name == "FluidWrapper":
        from .fluid import FluidWrapper  # lazy: a DataPipeline, imports torch

        return FluidWrapper
    if name == "DataPipeline":
        from .datapipeline import DataPipeline  # lazy: a torch IterableDataset

        return DataPipeline
    from .pytorch import torch_name  # lazy: DataLoader (imports torch)

    return torch_name("resumewds.compat", name)
