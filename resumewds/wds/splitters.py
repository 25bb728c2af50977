"""Node and worker splitters with webdataset's names and protocol (importing it never imports torch).

Plain generator functions over any iterable, as in webdataset 1.0.2; passed to a WebDataset or
a DataPipeline they are mapped onto the plan's layouts.
"""

from __future__ import annotations

from itertools import islice
from typing import Any, Iterable, Iterator

from ..plan import node_info, worker_info

__all__ = ["pytorch_worker_info", "single_node_only", "split_by_node", "split_by_worker", "worker_info"]


pytorch_worker_info = worker_info  # webdataset.utils' name


def split_by_node(src: Iterable[Any], group: Any = None) -> Iterator[Any]:
    """Every ``world_size``-th item, starting at this process's rank.

    Example:
        >>> list(split_by_node(["a", "b", "c"]))     # a single process: all
        ['a', 'b', 'c']
    """
    rank, world = node_info(group)
    if world > 1:
        yield from islice(src, rank, None, world)
    else:
        yield from src


def single_node_only(src: Iterable[Any], group: Any = None) -> Iterator[Any]:
    """Pass everything through; refuse to run with more than one rank.

    Raises:
        ValueError: ``world_size > 1`` (add a node splitter instead).

    Example:
        >>> list(single_node_only([1, 2]))
        [1, 2]
    """
    rank, world = node_info(group)
    if world > 1:
        raise ValueError("input pipeline needs to be reconfigured for multinode training "
                         "(single_node_only with world_size > 1; use split_by_node)")
    yield from src


def split_by_worker(src: Iterable[Any]) -> Iterator[Any]:
    """Every ``num_workers``-th item, starting at this DataLoader worker's id.

    Example:
        >>> list(split_by_worker([1, 2, 3]))
        [1, 2, 3]
    """
    _, _, worker, nworkers = worker_info()
    if nworkers > 1:
        yield from islice(src, worker, None, nworkers)
    else:
        yield from src
