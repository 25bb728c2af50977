"""Node and worker splitters with webdataset's names and protocol.

``split_by_node``, ``split_by_worker`` and ``single_node_only`` are plain
generator functions over any iterable (shard dicts ``{"url": ...}`` in a
composable pipeline), exactly as in webdataset 1.0.2.  Passed to
:class:`resumewds.WebDataset` as ``nodesplitter=`` / ``workersplitter=``,
the dataset recognises them and maps them onto its own rank / worker layout
(a split of the global sample sequence, see :mod:`resumewds.plan`), so exact
resume is kept; a user callable there is applied to the shard list instead
(it must be deterministic for a resume to be exact).

Rank and world size come from an initialised ``torch.distributed`` group if
torch is already imported, else ``RANK`` / ``WORLD_SIZE`` (then
``LOCAL_RANK`` / ``LOCAL_WORLD_SIZE``); the worker from torch's
``get_worker_info()``.  Importing this module never imports torch.

Example:
    >>> list(split_by_worker(range(5)))      # not in a DataLoader worker: everything
    [0, 1, 2, 3, 4]
    >>> list(single_node_only(["a.tar"]))
    ['a.tar']
"""

from __future__ import annotations

import os
import sys
from itertools import islice
from typing import Any, Iterable, Iterator, Tuple

__all__ = ["pytorch_worker_info", "single_node_only", "split_by_node", "split_by_worker", "worker_info"]


def _env_int(*names: str) -> Any:
    for name in names:
        raw = os.environ.get(name, "").strip()
        if raw:
            try:
                return int(raw)
            except ValueError:
                raise ValueError(f"environment variable {name}={raw!r} is not an integer") from None
    return None


def node_info(group: Any = None) -> Tuple[int, int]:
    """``(rank, world_size)`` of this process (see the module docs).

    Example:
        >>> node_info() if "RANK" not in os.environ else (0, 1)
        (0, 1)
    """
    dist = sys.modules.get("torch.distributed")
    if dist is not None:
        try:
            if dist.is_available() and dist.is_initialized():
                return dist.get_rank(group=group), dist.get_world_size(group=group)
        except Exception:  # pragma: no cover - torch without distributed
            pass
    rank = _env_int("RANK", "LOCAL_RANK")
    world = _env_int("WORLD_SIZE", "LOCAL_WORLD_SIZE")
    rank, world = (0 if rank is None else rank), (1 if world is None else world)
    if world < 1 or not 0 <= rank < world:
        raise ValueError(f"rank {rank} is not in a world of size {world} (RANK / WORLD_SIZE)")
    return rank, world


def _torch_worker() -> Tuple[int, int]:
    if os.environ.get("WORKER", "").strip() and os.environ.get("NUM_WORKERS", "").strip():
        return int(os.environ["WORKER"]), int(os.environ["NUM_WORKERS"])  # webdataset's override
    data = sys.modules.get("torch.utils.data")
    if data is not None:
        info = data.get_worker_info()
        if info is not None:
            return int(info.id), int(info.num_workers)
    return 0, 1


def worker_info(group: Any = None) -> Tuple[int, int, int, int]:
    """``(rank, world_size, worker, num_workers)`` of this process; the worker is
    ``(0, 1)`` outside a DataLoader worker (``WORKER`` / ``NUM_WORKERS`` override it,
    as in webdataset).

    Example:
        >>> worker_info()[2:]
        (0, 1)
    """
    rank, world = node_info(group)
    worker, nworkers = _torch_worker()
    return rank, world, worker, nworkers


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
