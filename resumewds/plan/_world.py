"""Who this process is in the job: rank, world size and node.

A *node* is a group of ranks that share one shard cache; the plan gives each
node its own partitions.  Where the answer comes from (explicit arguments,
``torch.distributed``, torchrun's variables, an all-gather of
``hostname:cache directory``, else one node) is docs/SCALE.md, *Node
identity*.  Nodes must be numbered node-major with equal ranks each, else the
loader falls back to one node and logs why.  No module-level torch import.

Example:
    >>> w = detect_world(5, 8, nodes=2)
    >>> (w.node, w.local_rank, w.ranks_per_node)
    (1, 1, 4)
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import sys
from dataclasses import dataclass
from typing import Any, Mapping, Optional, Sequence, Tuple, Union

from .. import config

log = logging.getLogger("resumewds")


@dataclass(frozen=True)
class World:
    """This process's place in the job.

    Attributes:
        node: this rank's node (``rank // ranks_per_node``) of ``nodes``.
        source: where the node grouping came from (``"args"``, ``"env"``,
            ``"torch.distributed"``, ``"single"``, or ``"fallback: ..."``).

    Example:
        >>> World(3, 4, 1, 2).local_rank
        1
    """

    rank: int
    world_size: int
    node: int = 0
    nodes: int = 1
    source: str = "single"

    def __post_init__(self) -> None:
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} is not in a world of size {self.world_size}")
        if self.nodes < 1 or self.world_size % self.nodes:
            raise ValueError(f"{self.nodes} nodes cannot split a world of {self.world_size} "
                             "ranks evenly")
        if self.node != self.rank // (self.world_size // self.nodes):
            raise ValueError(f"rank {self.rank} is not on node {self.node} in a node-major layout "
                             f"of {self.nodes} nodes")

    @property
    def ranks_per_node(self) -> int:
        return self.world_size // self.nodes

    @property
    def local_rank(self) -> int:
        return self.rank % self.ranks_per_node


def _env_int(*names: str, env: Optional[Mapping[str, str]] = None) -> Optional[int]:
    """The first of the environment variables ``names`` that is set, as an int."""
    env = os.environ if env is None else env
    for name in names:
        raw = env.get(name)
        if raw is not None and raw.strip() != "":
            try:
                return int(raw)
            except ValueError:
                raise ValueError(f"environment variable {name}={raw!r} is not an integer") from None
    return None


def _process_group() -> Any:
    """``torch.distributed`` if a default process group is initialized, else None (never imports torch)."""
    dist = sys.modules.get("torch.distributed")
    with contextlib.suppress(Exception):  # torch without distributed
        if dist is not None and dist.is_available() and dist.is_initialized():
            return dist
    return None


def world_from_env(rank: Optional[int] = None, world_size: Optional[int] = None) -> Tuple[int, int]:
    """Rank and world size: explicit arguments, else torch.distributed, else env.

    Each explicit argument overrides on its own.  The environment:
    ``RANK``/``WORLD_SIZE``, else ``LOCAL_RANK``/``LOCAL_WORLD_SIZE`` (one
    node), else (0, 1).  ValueError for a non-integer or an invalid rank.

    Example:
        >>> world_from_env(1, 4)
        (1, 4)
    """
    r, w = rank, world_size
    if r is None or w is None:
        dr = dw = None
        dist = _process_group()
        if dist is not None:
            dr, dw = dist.get_rank(), dist.get_world_size()
        if dr is None:
            # a rank without a world size would silently read rank 0's share
            dr = _env_int("RANK", "LOCAL_RANK")
            dw = _env_int("WORLD_SIZE", "LOCAL_WORLD_SIZE")
            dr = 0 if dr is None else dr
            dw = 1 if dw is None else dw
        r = dr if r is None else r
        w = dw if w is None else w
    assert r is not None and w is not None  # set above, whichever way
    r, w = int(r), int(w)
    if w < 1 or not 0 <= r < w:
        raise ValueError(f"rank {r} is not in a world of size {w} (explicit arguments, "
                         "torch.distributed, then RANK/WORLD_SIZE or LOCAL_RANK/LOCAL_WORLD_SIZE)")
    return r, w


def node_key(cache_dirs: Union[str, Sequence[str], None] = None) -> str:
    """What identifies a shared cache: ``hostname:directory`` of the cache(s) a rank uses.

    ``cache_dirs``: :meth:`resumewds.WebDataset.cache_dirs` (None: the
    default); symbolic links are resolved, so two names of one directory match.

    Example:
        >>> node_key("/a") == node_key(["/a"]) != node_key("/b")
        True
    """
    dirs = [cache_dirs] if cache_dirs is None or isinstance(cache_dirs, str) else list(cache_dirs)
    real = sorted({os.path.realpath(config.cache_dir(d)) for d in dirs})
    return f"{socket.gethostname()}:{'|'.join(real)}"


def nodes_from_keys(keys: list[str], rank: int) -> Tuple[int, int, str]:
    """``(node, nodes, why)`` from every rank's :func:`node_key` (rank order).

    Keys not in node-major groups of equal size give ``(0, 1, reason)``.

    Example:
        >>> nodes_from_keys(["a", "a", "b", "b"], 2)
        (1, 2, '')
        >>> nodes_from_keys(["a", "b", "a", "b"], 0)[1:]
        (1, 'ranks of one cache are not numbered consecutively')
    """
    groups: list[str] = []
    for k in keys:
        if not groups or groups[-1] != k:
            if k in groups:
                return 0, 1, "ranks of one cache are not numbered consecutively"
            groups.append(k)
    n = len(groups)
    if len(keys) % n or any(keys[i] != groups[i // (len(keys) // n)] for i in range(len(keys))):
        return 0, 1, "nodes have different numbers of ranks"
    return rank // (len(keys) // n), n, ""


def detect_world(rank: Optional[int] = None, world_size: Optional[int] = None, *,
                 nodes: Optional[int] = None, env: Optional[Mapping[str, str]] = None,
                 cache_dirs: Union[str, Sequence[str], None] = None) -> World:
    """Rank, world size and node of this process (see the module docs).

    ``rank``, ``world_size`` and ``nodes`` (node-major) override what is
    detected; ``cache_dirs``: this rank's shard caches (:func:`node_key`).

    Raises:
        ValueError: a variable is not an integer, the rank is not in the
            world, or ``nodes`` does not divide the world size.

    Example:
        >>> detect_world(3, 4, nodes=2, env={})
        World(rank=3, world_size=4, node=1, nodes=2, source='args')
        >>> detect_world(env={"RANK": "3", "WORLD_SIZE": "4", "LOCAL_WORLD_SIZE": "2"}).node
        1
    """
    e = os.environ if env is None else env
    if env is None:
        r, w = world_from_env(rank, world_size)
    else:  # world_from_env reads os.environ; the same rules on ``env``
        dr = _env_int("RANK", "LOCAL_RANK", env=e)
        dw = _env_int("WORLD_SIZE", "LOCAL_WORLD_SIZE", env=e)
        r = (0 if dr is None else dr) if rank is None else rank
        w = (1 if dw is None else dw) if world_size is None else world_size
    r, w = int(r), int(w)
    if w < 1 or not 0 <= r < w:
        raise ValueError(f"rank {r} is not in a world of size {w}")
    if nodes is not None:
        n = int(nodes)
        if n < 1 or w % n:
            raise ValueError(f"nodes={nodes} does not divide the world of {w} ranks evenly")
        return World(r, w, r // (w // n), n, "args")
    if w == 1:
        return World(r, w)
    # node info from the environment only describes the world the environment describes
    env_world = _env_int("WORLD_SIZE", env=e)
    env_rank = _env_int("RANK", env=e)
    lw = _env_int("LOCAL_WORLD_SIZE", env=e)
    if lw is not None and env_world == w and env_rank in (None, r):
        if lw < 1 or w % lw:
            return _fallback(r, w, f"LOCAL_WORLD_SIZE={lw} does not divide WORLD_SIZE={w}")
        # torchrun's node count: with nodes of different sizes every rank must
        # see the mismatch (a node that did not would lay out positions alone)
        gw = _env_int("GROUP_WORLD_SIZE", env=e)
        if gw is not None and gw * lw != w:
            return _fallback(r, w, f"GROUP_WORLD_SIZE={gw} nodes x LOCAL_WORLD_SIZE={lw} is not "
                                   f"WORLD_SIZE={w} (nodes of different sizes)")
        node, local = divmod(r, lw)
        group = _env_int("GROUP_RANK", "NODE_RANK", env=e)
        lr = _env_int("LOCAL_RANK", env=e)
        if (group is not None and group != node) or (lr is not None and lr != local):
            return _fallback(r, w, f"rank {r} is local rank {lr} of node {group}, not node-major "
                                   f"with {lw} ranks per node")
        return World(r, w, node, w // lw, "env")
    dist = _process_group() if env is None else None
    if dist is not None and dist.get_world_size() == w and dist.get_rank() == r:
        keys: list[Any] = [None] * w
        try:
            dist.all_gather_object(keys, node_key(cache_dirs))
        except Exception as exc:  # e.g. NCCL without a device set: locality only is lost
            return _fallback(r, w, f"all_gather_object failed: {exc}".splitlines()[0])
        node, n, why = nodes_from_keys([str(k) for k in keys], r)
        if why:
            return _fallback(r, w, why)
        return World(r, w, node, n, "torch.distributed")
    return World(r, w)


def _fallback(rank: int, world_size: int, why: str) -> World:
    log.warning("resumewds: treating all %d ranks as one node (no node-local plan): %s",
                world_size, why)
    return World(rank, world_size, 0, 1, f"fallback: {why}")


def resolve_partitions(requested: Optional[int], nodes: int, stored: Any = None) -> int:
    """The partition count of a run.

    ``requested`` if given; else the count in ``stored`` (the run's recorded
    config: a resume keeps the run's order; no key means 1); else ``nodes``.

    Example:
        >>> resolve_partitions(None, 4), resolve_partitions(None, 4, {"seed": 1})
        (4, 1)
    """
    if requested is not None:
        return int(requested)
    if stored:
        return int(stored.get("partitions") or 1)
    return max(1, int(nodes))


def node_info(group: Any = None) -> Tuple[int, int]:
    """``(rank, world_size)`` of this process: in ``group`` (a torch.distributed
    process group) if given, else :func:`world_from_env`.

    Example:
        >>> node_info() if "RANK" not in os.environ else (0, 1)
        (0, 1)
    """
    if group is not None:
        dist = _process_group()
        if dist is not None:
            return dist.get_rank(group=group), dist.get_world_size(group=group)
    return world_from_env()


def torch_worker() -> Tuple[int, int]:
    """``(worker, num_workers)`` of this DataLoader worker; ``(0, 1)`` outside one.

    ``WORKER`` / ``NUM_WORKERS`` override it, as in webdataset.  Never imports torch.

    Example:
        >>> torch_worker() if "WORKER" not in os.environ else (0, 1)
        (0, 1)
    """
    if os.environ.get("WORKER", "").strip() and os.environ.get("NUM_WORKERS", "").strip():
        return int(os.environ["WORKER"]), int(os.environ["NUM_WORKERS"])  # webdataset's override
    data = sys.modules.get("torch.utils.data")
    if data is not None:
        info = data.get_worker_info()
        if info is not None:
            return int(info.id), int(info.num_workers)
    return 0, 1


def worker_info(group: Any = None) -> Tuple[int, int, int, int]:
    """``(rank, world_size, worker, num_workers)`` of this process.

    Example:
        >>> worker_info()[2:]
        (0, 1)
    """
    return (*node_info(group), *torch_worker())


def late_world(built: World, journal_path: Optional[str] = None) -> Optional[World]:
    """The world of now for a loader built alone (``built``: world size 1, none given), or None.

    A framework may set up the processes later (Lightning's DDP, inside ``fit``).
    Same nodes as built (no collective call); ValueError if a journal was opened alone.

    Example:
        >>> late_world(World(0, 1)) if "WORLD_SIZE" not in os.environ else None
    """
    rank, size = world_from_env()
    if size == 1:
        return None
    if journal_path is not None:
        raise ValueError(f"this loader opened its journal {journal_path} as the only rank, and now runs as rank "
                         f"{rank} of {size}: build it once the processes are set up (Lightning: in "
                         "train_dataloader()), or pass rank= and world_size=")
    log.info("resumewds: rank %d of %d (set up after the loader was built)", rank, size)
    return detect_world(rank, size, nodes=built.nodes)
