"""One epoch's sample sequence with random access, and the cut into partitions.

An epoch is *segments* (whole shards, or pieces where a partition boundary
cuts one) grouped into windows.  Which segments, in which order, is the
order's choice (:mod:`resumewds.plan`).
"""

from __future__ import annotations

import bisect
import operator
from array import array
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ._keyed import FeistelPermutation, mix

__all__ = ["EpochPlan", "Segment", "check_partitions", "cut_partitions"]

Segment = Tuple[int, int, int]  # (shard index, first sample in the shard, samples)


class EpochPlan:
    """The sample sequence of one epoch, with random access.

    ``sample_at(p)`` is ``(shard_index, sample_in_shard)`` of the p-th
    delivered sample, in O(1) (:class:`FeistelPermutation` per position).
    The partitions are laid out one after the other in *local* order
    (``window_starts`` is in local indices); position ``p`` is local index
    ``part_start(p % P) + p // P``.

    Args:
        shard_order: the shards, in epoch order (one partition; or ``parts``:
            the partitions' segments ``(shard, first sample, count)``).
        window: segments (shards, or pieces of shards) per window.
        window_key: the Feistel key of the epoch; None keeps a window's samples in order.
    """

    def __init__(self, counts: Sequence[int], shard_order: Optional[Sequence[int]], window: int,
                 window_key: Optional[int], *, parts: Optional[Sequence[Sequence[Segment]]] = None):
        self.counts = counts
        self.window = max(1, int(window))
        self.window_key = window_key  # None: samples keep shard order
        if parts is None:
            parts = [[(int(s), 0, int(counts[s])) for s in (shard_order or [])]]
        self.partitions = len(parts)
        seg_shard, seg_first, seg_count = array("q"), array("q"), array("q")
        win_seg, starts, part_win = array("q", [0]), array("q", [0]), array("q", [0])
        t = 0
        for segs in parts:
            for k in range(0, len(segs), self.window):
                for s, f, n in segs[k:k + self.window]:
                    seg_shard.append(s)
                    seg_first.append(f)
                    seg_count.append(n)
                    t += n
                win_seg.append(len(seg_shard))
                starts.append(t)
            part_win.append(len(starts) - 1)
        self.seg_shard, self.seg_first, self.seg_count = seg_shard, seg_first, seg_count
        self.win_seg, self.window_starts, self.part_win = win_seg, starts, part_win
        self.total = t
        self._c, self._rem = divmod(t, self.partitions)
        for q in range(self.partitions):
            got = starts[part_win[q + 1]] - starts[part_win[q]]
            if got != self._c + (1 if q < self._rem else 0):
                raise ValueError(f"partition {q} holds {got} samples; an epoch of {t} samples in "
                                 f"{self.partitions} partitions needs {self._c} or {self._c + 1}")
        self._cache: Dict[int, Tuple[int, array, Any]] = {}

    def __len__(self) -> int:
        return self.total

    # ---- positions <-> local indices -------------------------------------
    def local(self, p: int) -> int:
        """The local index of position ``p``: partition ``p % P``, its sample ``p // P``."""
        P = self.partitions
        if P == 1:
            return p
        q = p % P
        return q * self._c + min(q, self._rem) + p // P

    def position(self, t: int) -> int:
        """The position of local index ``t`` (inverse of :meth:`local`)."""
        P, c, rem = self.partitions, self._c, self._rem
        if P == 1:
            return t
        big = rem * (c + 1)
        if t < big:
            q, i = divmod(t, c + 1)
        else:
            q, i = divmod(t - big, c)
            q += rem
        return i * P + q

    def partition_of_window(self, w: int) -> int:
        return bisect.bisect_right(self.part_win, w) - 1

    # ---- windows ----------------------------------------------------------
    def _window(self, w: int) -> Tuple[int, array, Any]:
        hit = self._cache.get(w)
        if hit is not None:
            return hit
        s0, s1 = self.win_seg[w], self.win_seg[w + 1]
        starts = array("q", [0])
        for k in range(s0, s1):
            starts.append(starts[-1] + self.seg_count[k])
        m = starts[-1]
        perm: Any = range(m) if self.window_key is None else FeistelPermutation(m, mix(self.window_key, w))
        if len(self._cache) >= 4 * self.partitions:
            self._cache.pop(next(iter(self._cache)))
        self._cache[w] = (s0, starts, perm)
        return self._cache[w]

    def window_of(self, p: int) -> int:
        """The window holding position ``p``."""
        return bisect.bisect_right(self.window_starts, self.local(p)) - 1

    def window_shards(self, w: int) -> List[int]:
        """Shard indices of window ``w`` (in epoch order)."""
        return list(dict.fromkeys(self.seg_shard[self.win_seg[w]:self.win_seg[w + 1]]))

    @property
    def shard_order(self) -> List[int]:
        """The shards in local epoch order (each once)."""
        return list(dict.fromkeys(self.seg_shard))

    def partition_shards(self, q: int) -> List[int]:
        """The shards (or pieces of them) partition ``q`` reads this epoch."""
        segs = range(self.win_seg[self.part_win[q]], self.win_seg[self.part_win[q + 1]])
        return list(dict.fromkeys(self.seg_shard[k] for k in segs if self.seg_count[k]))

    def sample_at(self, p: int) -> Tuple[int, int]:
        """``(shard_index, sample_in_shard)`` of position ``p`` of this epoch."""
        return self.samples_at((p,))[0]

    def samples_at(self, positions: Sequence[int]) -> List[Tuple[int, int]]:
        """:meth:`sample_at` of each position (a step's): the same pairs, with
        the window looked up once per run of positions inside it.

        Example:
            >>> ep = EpochPlan([3, 2], [0, 1], window=2, window_key=7)
            >>> ep.samples_at(range(5)) == [ep.sample_at(p) for p in range(5)]
            True
        """
        out: List[Tuple[int, int]] = []
        ws, total, P = self.window_starts, self.total, self.partitions
        seg_shard, seg_first = self.seg_shard, self.seg_first
        lo = hi = 0
        s0 = 0
        starts: Any = None
        perm: Any = None
        single = False
        for p in positions:
            if not 0 <= p < total:
                raise IndexError(f"position {p} outside epoch of {total} samples")
            t = p if P == 1 else self.local(p)
            if not lo <= t < hi:
                w = bisect.bisect_right(ws, t) - 1
                s0, starts, perm = self._window(w)
                lo, hi = ws[w], ws[w + 1]
                single = len(starts) == 2  # one segment: no bisect
            j = perm[t - lo]
            if single:
                out.append((seg_shard[s0], seg_first[s0] + j))
            else:
                k = bisect.bisect_right(starts, j) - 1
                out.append((seg_shard[s0 + k], seg_first[s0 + k] + j - starts[k]))
        return out

    def shards_from(self, p: int, count: int) -> List[int]:
        """Up to ``count`` distinct shards the partition of position ``p`` needs
        from the window holding ``p`` on (what to prefetch)."""
        out: List[int] = []
        if p >= self.total:
            return out
        w = self.window_of(p)
        end = self.part_win[self.partition_of_window(w) + 1]
        while len(out) < count and w < end:
            for s in self.window_shards(w):
                if s not in out:
                    out.append(s)
            w += 1
        return out[:count]


def cut_partitions(counts: Sequence[int], order: Sequence[int], partitions: int) -> List[List[Segment]]:
    """Cut the shards, in ``order``, into ``partitions`` runs of equal sample counts.

    Partition q gets ``c + 1`` samples for ``q < total % P``, else ``c =
    total // P``; a shard straddling a cut is split in two segments.

    Example:
        >>> cut_partitions([3, 3, 3], [0, 1, 2], 2)
        [[(0, 0, 3), (1, 0, 2)], [(1, 2, 1), (2, 0, 3)]]
    """
    P = int(partitions)
    total = sum(int(counts[s]) for s in order)
    c, rem = divmod(total, P)
    parts: List[List[Segment]] = [[] for _ in range(P)]
    q, cap = 0, c + (1 if rem else 0)
    for s in order:
        n, f = int(counts[s]), 0
        while cap == 0 and q < P - 1:
            q += 1
            cap = c + (1 if q < rem else 0)
        if n == 0:
            parts[q].append((int(s), 0, 0))
            continue
        while n > 0:
            while cap == 0 and q < P - 1:
                q += 1
                cap = c + (1 if q < rem else 0)
            take = min(n, cap)
            parts[q].append((int(s), f, take))
            f += take
            n -= take
            cap -= take
    return parts


def check_partitions(value: Any) -> int:
    """``value`` as a partition count, or a ValueError naming it.

    Example:
        >>> check_partitions(4)
        4
    """
    try:
        n = operator.index(value)  # ints, numpy ints; not floats or strings
    except TypeError:
        n = 0
    if isinstance(value, bool) or n < 1:
        raise ValueError(f"partitions must be an integer >= 1 (or None: one per node), got {value!r}")
    return n
