"""Shard splitters with webdataset's names: ``split_by_node``, ``split_by_worker``, ``single_node_only``.

(Written by H4b only because the composable API needs these names; H4a owns
this module and may replace it: the composable pipeline recognises the
functions by name, so any implementation with these names works.)

Used as stages of a generic pipeline they behave as webdataset 1.0.2's: they
take an iterator of ``{"url": ...}`` dicts and keep this node's / this
DataLoader worker's share (every ``world_size``-th item from ``rank``).
Inside :class:`resumewds.DataPipeline` or ``WebDataset(nodesplitter=...)``
they are not run: the plan splits the global sample sequence by rank and
worker instead, which keeps resume exact.

Example:
    >>> list(split_by_node(iter([{"url": "a"}, {"url": "b"}])))  # one node: everything
    [{'url': 'a'}, {'url': 'b'}]
"""

from __future__ import annotations

import os
import sys
from itertools import islice
from typing import Any, Iterable, Iterator, Tuple

__all__ = ["single_node_only", "split_by_node", "split_by_worker", "worker_info"]


def worker_info(group: Any = None) -> Tuple[int, int, int, int]:
    """``(rank, world_size, worker, num_workers)`` of this process (webdataset's rules).

    Environment ``RANK``/``WORLD_SIZE`` and ``WORKER``/``NUM_WORKERS`` win;
    otherwise torch.distributed (if initialised) and torch's worker info (if
    torch is already imported).
    """
    rank, world = 0, 1
    if "RANK" in os.environ and "WORLD_SIZE" in os.environ:
        rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    elif "torch" in sys.modules:
        import torch.distributed as dist

        if dist.is_available() and dist.is_initialized():
            rank, world = dist.get_rank(group=group), dist.get_world_size(group=group)
    worker, nw = 0, 1
    if "WORKER" in os.environ and "NUM_WORKERS" in os.environ:
        worker, nw = int(os.environ["WORKER"]), int(os.environ["NUM_WORKERS"])
    elif "torch" in sys.modules:
        from torch.utils.data import get_worker_info

        info = get_worker_info()
        if info is not None:
            worker, nw = info.id, info.num_workers
    return rank, world, worker, nw


def split_by_node(src: Iterable[Any], group: Any = None) -> Iterator[Any]:
    """This node's share of ``src``: every ``world_size``-th item from ``rank``."""
    rank, world, _, _ = worker_info(group)
    if world > 1:
        yield from islice(src, rank, None, world)
    else:
        yield from src


def single_node_only(src: Iterable[Any], group: Any = None) -> Iterator[Any]:
    """Pass ``src`` through; refuse to run on more than one node.

    Raises:
        ValueError: ``world_size > 1``.
    """
    _, world, _, _ = worker_info(group)
    if world > 1:
        raise ValueError("input pipeline needs to be reconfigured for multinode training")
    yield from src


def split_by_worker(src: Iterable[Any]) -> Iterator[Any]:
    """This DataLoader worker's share of ``src``."""
    _, _, worker, nw = worker_info()
    if nw > 1:
        yield from islice(src, worker, None, nw)
    else:
        yield from src
