"""webdataset's worker split: each DataLoader worker reads its own shards, the loader interleaves.

webdataset's ``split_by_worker`` gives worker ``w`` of ``W`` the shards ``w, w+W, ...``; each
worker batches its own stream and torch's DataLoader hands the workers' batches out round-robin.
Here that order is a pure function of (epoch plan, ``W``, batch size), so it resumes exactly with
any number of workers executing it.

Example:
    >>> from resumewds.plan import Plan
    >>> seq = SplitSequence(Plan([3, 1, 2], shuffle=False).epoch(0), workers=2, unit=2)
    >>> [seq.unit_range(k) for k in range(seq.num_units)], seq.samples_at(range(6))
    ([(0, 2), (2, 3), (3, 5), (5, 6)], [(0, 0), (0, 1), (1, 0), (0, 2), (2, 0), (2, 1)])
"""

from __future__ import annotations

import bisect
from typing import AbstractSet, Any, Dict, List, NamedTuple, Optional, Sequence, Tuple

from ..errors import StateError
from ..plan import EpochPlan, Layout, mix

__all__ = ["SHARD_SPLIT", "WORKER_SPLITS", "Bound", "ShardSplit", "ShardSplitPolicy", "SplitSequence",
           "WorkerStream", "empty_worker_error", "split_layout", "split_workers", "worker_streams"]

_TAG_WORKER = 0x574F524B4552  # "WORKER"

#: how DataLoader workers share an epoch (``worker_split=``)
WORKER_SPLITS = ("shards", "samples")


def worker_streams(ep: EpochPlan, workers: int, keep: Optional[AbstractSet[int]] = None) -> List[EpochPlan]:
    """Each worker's stream: the epoch's shards ``[w::workers]`` (only those in ``keep``), in the plan's way."""
    if ep.partitions != 1:
        raise ValueError("the shard split needs an epoch of one partition")
    W = int(workers)
    if W < 1:
        raise ValueError(f"the shard split needs at least one worker, got {workers}")
    segs = list(zip(ep.seg_shard, ep.seg_first, ep.seg_count))  # whole shards (or draws), in epoch order
    if keep is not None:
        segs = [sg for sg in segs if int(sg[0]) in keep]
    out = []
    for w in range(W):
        key = None if ep.window_key is None else mix(ep.window_key, _TAG_WORKER, w)
        out.append(EpochPlan(ep.counts, None, ep.window, key, parts=[[(int(s), int(f), int(n))
                                                                      for s, f, n in segs[w::W]]]))
    return out


def empty_worker_error(workers: int, shards: int) -> ValueError:
    """webdataset's error when a DataLoader worker gets no shard (``empty_check``)."""
    return ValueError("No samples found in dataset; perhaps you have fewer shards than workers.\n"
                      f"The shard split gives each of {workers} DataLoader workers its own shards, and the "
                      f"epoch has {shards}: use fewer workers, worker_split=\"samples\", or turn this check "
                      "off with empty_check=False")


class SplitSequence:
    """The epoch as webdataset's DataLoader delivers it: the workers' units (batches), round-robin."""

    def __init__(self, ep: EpochPlan, workers: int, unit: int = 1, drop: bool = False):
        if int(unit) < 1:
            raise ValueError(f"unit must be >= 1, got {unit}")
        self.base = ep
        self.workers = W = int(workers)
        self.unit = b = int(unit)
        self.drop = bool(drop)
        self.streams = worker_streams(ep, W)
        self.lengths = [len(s) for s in self.streams]
        self.units = [n // b if drop else -(-n // b) for n in self.lengths]
        self.shard_counts = [len(s.seg_shard) for s in self.streams]
        self.num_units = sum(self.units)
        self.total = len(ep)
        self.end = sum(min(n, u * b) for n, u in zip(self.lengths, self.units))
        self._known: Dict[int, Tuple[int, int]] = {}  # first positions of units looked up lately
        self._sorted = sorted(self.units)
        self._cum = [0]
        for c in self._sorted:
            self._cum.append(self._cum[-1] + c)

    def __len__(self) -> int:
        return self.total

    def _before_round(self, r: int) -> int:
        """Units delivered before round ``r``: ``sum(min(units_w, r))``."""
        i = bisect.bisect_left(self._sorted, r)  # workers with fewer than r units give all of theirs
        return self._cum[i] + r * (len(self._sorted) - i)

    def unit_at(self, k: int) -> Tuple[int, int]:
        """``(worker, round)`` of unit ``k``: the ``round``-th unit of that worker."""
        if not 0 <= k < self.num_units:
            raise IndexError(f"unit {k} outside an epoch of {self.num_units} units")
        lo, hi = 0, self._sorted[-1]  # the round: the last r with _before_round(r) <= k
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self._before_round(mid) <= k:
                lo = mid
            else:
                hi = mid - 1
        i = k - self._before_round(lo)
        for w, c in enumerate(self.units):
            if c > lo:
                if i == 0:
                    return w, lo
                i -= 1
        raise AssertionError("unreachable")  # pragma: no cover

    def _start_of(self, w: int, r: int) -> int:
        """The position of the first sample of worker ``w``'s unit ``r``."""
        b = self.unit
        d = 0
        for v, (n, c) in enumerate(zip(self.lengths, self.units)):
            m = min(c, r) + (1 if v < w and c > r else 0)
            d += min(n, m * b)
        return d

    def unit_range(self, k: int) -> Tuple[int, int]:
        """Positions ``[d0, d1)`` of unit ``k``."""
        w, r = self.unit_at(k)
        d0 = self._start_of(w, r)
        if len(self._known) > 64:
            self._known.clear()
        self._known[d0] = (w, r)  # a step's samples_at starts here: no search
        return d0, d0 + min(self.unit, self.lengths[w] - r * self.unit)

    def unit_of(self, d: int) -> int:
        """The unit holding position ``d`` (``num_units`` at ``end`` or beyond)."""
        if d >= self.end:
            return self.num_units
        lo, hi = 0, self.num_units - 1
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.unit_range(mid)[0] <= d:
                lo = mid
            else:
                hi = mid - 1
        return lo

    def _next(self, w: int, r: int) -> Optional[Tuple[int, int]]:
        """The unit after worker ``w``'s unit ``r`` in the rotation (None: the last)."""
        for v in range(w + 1, self.workers):
            if self.units[v] > r:
                return v, r
        r += 1
        for v in range(self.workers):
            if self.units[v] > r:
                return v, r
        return None

    def locate(self, d: int) -> Tuple[int, int]:
        """``(worker, index in its stream)`` of position ``d``."""
        k = self.unit_of(d)
        if k >= self.num_units:
            raise IndexError(f"position {d} outside an epoch of {self.end} delivered samples")
        w, r = self.unit_at(k)
        return w, r * self.unit + d - self._start_of(w, r)

    def samples_at(self, positions: Sequence[int]) -> List[Tuple[int, int]]:
        """``(shard, sample)`` of each position (consecutive positions walk the rotation)."""
        where: List[Tuple[int, int]] = []
        b = self.unit
        prev = cur = None  # the last position, and its (worker, round, first position of the unit)
        for d in positions:
            if cur is not None and prev is not None and d == prev + 1:
                w, r, d0 = cur
                n = min(b, self.lengths[w] - r * b)
                if d - d0 >= n:  # past the unit: the next one in the rotation
                    nxt = self._next(w, r)
                    if nxt is None:
                        raise IndexError(f"position {d} outside an epoch of {self.end} delivered samples")
                    cur = (nxt[0], nxt[1], d)
            elif d in self._known:
                w, r = self._known[d]
                cur = (w, r, d)
            else:
                k = self.unit_of(d)
                if k >= self.num_units:
                    raise IndexError(f"position {d} outside an epoch of {self.end} delivered samples")
                w, r = self.unit_at(k)
                cur = (w, r, self._start_of(w, r))
            prev = d
            w, r, d0 = cur
            where.append((w, r * b + d - d0))
        out: List[Any] = [None] * len(where)
        for w in {w for w, _ in where}:
            idx = [n for n, (v, _) in enumerate(where) if v == w]
            for n, pair in zip(idx, self.streams[w].samples_at([where[n][1] for n in idx])):
                out[n] = pair
        return out

    def window_of(self, d: int) -> int:
        """An id of the window holding position ``d`` (its worker's window)."""
        w, i = self.locate(d)
        return self.streams[w].window_of(i) * self.workers + w

    def window_shards(self, x: int) -> List[int]:
        """Shards of the window ``x`` (:meth:`window_of`)."""
        q, w = divmod(x, self.workers)
        return self.streams[w].window_shards(q)

    def shards_from(self, d: int, count: int) -> List[int]:
        """Up to ``count`` shards the workers read from position ``d`` on, taken round-robin."""
        if d >= self.end:
            return []
        k = self.unit_of(d)
        w0, r0 = self.unit_at(k)
        lists = []
        for v, s in enumerate(self.streams):
            taken = min(self.units[v], r0) + (1 if v < w0 and self.units[v] > r0 else 0)
            done = min(self.lengths[v], self.unit * taken)
            if v == w0:
                done = self.locate(d)[1]
            lists.append(s.shards_from(done, count) if done < self.lengths[v] else [])
        out: List[int] = []
        for i in range(count):
            for lst in lists[w0:] + lists[:w0]:
                if i < len(lst) and lst[i] not in out:
                    out.append(lst[i])
        return out[:count]


class Bound:
    """A layout bound to an epoch: its steps over ``sequence`` (which stands for the epoch's plan)."""

    def __init__(self, grid: Any, sequence: Any):
        self.grid = grid
        self.sequence = sequence
        self.batch_size = grid.batch_size
        self.step_size = grid.step_size
        self.world_size = 1
        self.rank = 0
        self.remainder = grid.remainder

    def num_steps(self, total: int, start: int) -> int:
        return self.grid.num_steps(total, start)

    def position_after(self, total: int, start: int, step: int) -> int:
        return self.grid.position_after(total, start, step)

    def slots(self, total: int, start: int, step: int, rank: Optional[int] = None) -> List[Tuple[int, bool]]:
        return self.grid.slots(total, start, step)

    def end(self, total: int) -> int:
        return getattr(self.sequence, "end", total)


class _Units:
    """The steps of a :class:`SplitSequence`: one unit (a worker's batch) per step."""

    def __init__(self, seq: SplitSequence):
        self.seq = seq
        self.batch_size = self.step_size = seq.unit
        self.remainder = "drop" if seq.drop else "keep"
        self._firsts: Dict[int, int] = {}

    def _first(self, start: int) -> int:
        k = self._firsts.get(start)
        if k is None:
            k = self.seq.unit_of(start)
            if k < self.seq.num_units and self.seq.unit_range(k)[0] < start:
                k += 1  # inside a unit (never at a batch boundary): the next one
            self._firsts = {start: k}
        return k

    def num_steps(self, total: int, start: int) -> int:
        return self.seq.num_units - self._first(start)

    def position_after(self, total: int, start: int, step: int) -> int:
        k = self._first(start) + step
        return total if k + 1 >= self.seq.num_units else self.seq.unit_range(k + 1)[0]

    def slots(self, total: int, start: int, step: int) -> List[Tuple[int, bool]]:
        k = self._first(start) + step
        if k >= self.seq.num_units:
            return []
        d0, d1 = self.seq.unit_range(k)
        return [(d, False) for d in range(d0, d1)]


class ShardSplit(NamedTuple):
    """webdataset's worker split as a loader's layout (``workers``: ``W``, what a state records)."""

    workers: int
    unit: int = 1
    drop: bool = False
    chunk: int = 64
    check: bool = False

    @property
    def batch_size(self) -> int:
        return self.unit if self.unit > 1 else self.chunk

    @property
    def step_size(self) -> int:
        return self.batch_size

    @property
    def world_size(self) -> int:
        return 1  # one rank: split_layout refuses more

    @property
    def rank(self) -> int:
        return 0

    @property
    def nodes(self) -> int:
        return 1

    @property
    def remainder(self) -> str:
        return "drop" if self.drop else "keep"

    def bind(self, ep: Any) -> Bound:
        """The steps of epoch ``ep`` (its :class:`SplitSequence`)."""
        if isinstance(ep, Bound):
            return ep
        seq = SplitSequence(ep, self.workers, self.unit if self.unit > 1 else 1, self.drop and self.unit > 1)
        if self.check and 0 in seq.shard_counts:
            raise empty_worker_error(self.workers, len(ep.seg_shard))
        return Bound(_Units(seq) if self.unit > 1 else Layout(self.chunk), seq)


class WorkerStream(NamedTuple):
    """One worker's own stream, cut into steps by ``grid`` (torch interleaves the workers)."""

    workers: int
    worker: int
    grid: Any
    keep: Optional[AbstractSet[int]] = None  # the shards split (None: all; see worker_streams)
    check: bool = False  # a worker without a shard raises (empty_worker_error)

    @property
    def step_size(self) -> int:
        return int(self.grid.step_size)

    def bind(self, ep: Any) -> Bound:
        """The worker's steps of epoch ``ep``."""
        if isinstance(ep, Bound):
            return ep
        seq = worker_streams(ep, self.workers, self.keep)[self.worker]
        if self.check and not len(seq.seg_shard):
            raise empty_worker_error(self.workers, len(ep.seg_shard))
        return Bound(self.grid, seq)


def split_workers(ds: Any, num_workers: int, world_size: int, remainder: str = "keep",
                  mode: Optional[str] = None) -> int:
    """``W`` of the shard split a loader of ``ds`` follows, or 0 (the sample split)."""
    if mode is not None and mode not in ("shards", "samples"):
        raise ValueError(f"worker_split must be 'shards', 'samples' or None, got {mode!r}")
    fn = getattr(ds, "split_workers", None)
    if fn is None or remainder == "pad":
        return 0
    return int(fn(num_workers, world_size, mode))


def split_layout(ds: Any, workers: int, world_size: int, batch_size: Optional[int], remainder: str,
                 chunk: int) -> ShardSplit:
    """The loader's layout of the shard split over ``workers`` (one rank only: else ``StateError``)."""
    if world_size != 1:
        raise StateError(f"this run follows webdataset's shard split over {workers} DataLoader workers on "
                         f"one rank; it cannot go on with {world_size} ranks")
    drop = remainder == "drop" or (getattr(ds, "batch_size", None) is not None
                                   and not getattr(ds, "batch_partial", True))
    check = bool(getattr(ds, "empty_check", False) and getattr(ds, "empty_worker_check", True))
    return ShardSplit(int(workers), unit=int(batch_size or 1), drop=drop, chunk=int(chunk), check=check)


class ShardSplitPolicy:
    """webdataset's shard split as the engine loader's split policy (:func:`split_workers`, :func:`split_layout`)."""

    def workers(self, dataset: Any, num_workers: int, world_size: int, remainder: str,
                mode: Optional[str] = None) -> int:
        """``W`` of the split a loader of ``dataset`` follows, or 0 (:func:`split_workers`)."""
        return split_workers(dataset, num_workers, world_size, remainder, mode)

    def layout(self, dataset: Any, workers: int, world_size: int, batch_size: Optional[int], remainder: str,
               chunk: int) -> ShardSplit:
        """The loader's layout of the split over ``workers`` (:func:`split_layout`)."""
        return split_layout(dataset, workers, world_size, batch_size, remainder, chunk)


#: the policy object :class:`resumewds.WebLoader` passes into the engine
SHARD_SPLIT = ShardSplitPolicy()
