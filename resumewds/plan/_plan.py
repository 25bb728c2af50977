"""The delivered order: a pure function of (sample counts, seed, epoch, shuffle).

Every random choice is an xxh3_64 hash of integers (no I/O, no RNG state, no
:mod:`random`): the same seed gives the same order on any machine and Python.

**The epoch sequence** of epoch ``e``: the shards sorted by
``xxh3_64(shard_index, seed=mix(seed, e, "shards"))``, cut into *windows* of
``window`` shards; window ``w``'s samples permuted by
:class:`~resumewds.plan.FeistelPermutation` keyed by ``mix(seed, e, "window",
w)`` (any position in O(1)); the windows one after another.

With ``partitions=P`` > 1 each partition is ordered so, and position ``p`` is
sample ``p // P`` of partition ``p % P`` (docs/SCALE.md, *The node-local plan*).
``shuffle=False`` is manifest order; ``"shards"`` permutes shards but keeps
each shard's samples in order.  The algorithms are registered in :data:`ORDERS`.

Example:
    >>> plan = Plan([3, 2, 4], seed=7, shuffle=True, window=2)
    >>> ep = plan.epoch(0)
    >>> len(ep), sorted(ep.sample_at(i) for i in range(len(ep)))[:3]
    (9, [(0, 0), (0, 1), (0, 2)])
    >>> Plan([3, 2], shuffle=False).epoch(5).sample_at(3)
    (1, 0)
"""

from __future__ import annotations

import struct
from typing import Callable, Dict, List, Sequence

import xxhash

from ._epoch import EpochPlan, Segment, check_partitions, cut_partitions
from ._keyed import DRAW_SCHEMES, FeistelPermutation, draw_shards, mix, permutation
from ._layout import REMAINDERS, Layout, worker_steps

__all__ = [
    # the orders and the plan of a run (defined here)
    "ORDERS", "OrderFn", "Plan", "resampled_parts", "resampled_shards",
    # from the other modules of resumewds.plan
    "DRAW_SCHEMES", "EpochPlan", "FeistelPermutation", "Layout", "REMAINDERS", "Segment",
    "check_partitions", "cut_partitions", "draw_shards", "mix", "permutation", "worker_steps",
]

_TAG_SHARDS = 0x5348415244  # "SHARD"
_TAG_WINDOW = 0x57494E444F57  # "WINDOW"
_TAG_PARTS = 0x5041525453  # "PARTS"
_TAG_RESAMPLE = 0x524553414D50  # "RESAMP"


def _epoch_sorted(parts: List[List[Segment]], key: int) -> List[List[Segment]]:
    """Each partition's segments sorted by a keyed hash of their shard index
    (the order :func:`permutation` gives whole shards)."""
    h = xxhash.xxh3_64_intdigest
    pk = struct.Struct("<Q").pack
    return [sorted(part, key=lambda seg: (h(pk(seg[0]), key), seg[0])) for part in parts]


OrderFn = Callable[..., EpochPlan]


def resampled_shards(n: int, seed: int, epoch: int) -> List[int]:
    """Epoch ``epoch``'s ``n`` shard draws, with replacement (webdataset's ``resampled=True``).

    Example:
        >>> d = resampled_shards(4, seed=1, epoch=0)
        >>> len(d) == 4 and all(0 <= s < 4 for s in d) and d == resampled_shards(4, 1, 0)
        True
    """
    return draw_shards(n, mix(seed, epoch, _TAG_RESAMPLE))[0]


def resampled_parts(counts: Sequence[int], seed: int, epoch: int, partitions: int) -> List[List[Segment]]:
    """Each partition's draws, with replacement, from its own pieces of shards.

    Partition ``q`` (the run's cut) draws its pieces until it holds its own
    sample count: the epoch keeps its size and a node reads only its shards.

    Example:
        >>> parts = resampled_parts([4, 4, 4, 4], seed=1, epoch=0, partitions=2)
        >>> [sum(n for _, _, n in p) for p in parts]
        [8, 8]
    """
    parts = cut_partitions(counts, permutation(len(counts), mix(seed, _TAG_PARTS)), partitions)
    out: List[List[Segment]] = []
    for q, segs in enumerate(parts):
        draws, taken = draw_shards(len(segs), mix(seed, epoch, _TAG_RESAMPLE, q),
                                   sizes=[n for _, _, n in segs])
        out.append([(segs[d][0], segs[d][1], t) for d, t in zip(draws, taken)])
    return out


def _order(shards: str, windowed: bool) -> OrderFn:
    """An order of :data:`ORDERS`: the shards ``"permuted"`` per epoch, in ``"manifest"`` order or
    ``"resampled"`` (drawn with replacement); samples shuffled within windows of ``window`` shards
    when ``windowed``, else in shard order.  With partitions the shards are cut once for the run
    (after a seed-only permutation) and each partition is ordered on its own."""

    def order(counts: Sequence[int], seed: int, epoch: int, window: int, partitions: int = 1) -> EpochPlan:
        n = len(counts)
        w, key = (window, mix(seed, epoch, _TAG_WINDOW)) if windowed else (1, None)
        if shards == "manifest":
            if partitions == 1:
                return EpochPlan(counts, range(n), w, key)
            return EpochPlan(counts, None, w, key, parts=cut_partitions(counts, range(n), partitions))
        if shards == "resampled":
            if partitions == 1:
                return EpochPlan(counts, resampled_shards(n, seed, epoch), w, key)
            return EpochPlan(counts, None, w, key, parts=resampled_parts(counts, seed, epoch, partitions))
        if partitions == 1:
            return EpochPlan(counts, permutation(n, mix(seed, epoch, _TAG_SHARDS)), w, key)
        parts = cut_partitions(counts, permutation(n, mix(seed, _TAG_PARTS)), partitions)
        return EpochPlan(counts, None, w, key, parts=_epoch_sorted(parts, mix(seed, epoch, _TAG_SHARDS)))

    return order


ORDERS: Dict[str, OrderFn] = {
    "window": _order("permuted", windowed=True),
    "shards": _order("permuted", windowed=False),
    "none": _order("manifest", windowed=False),
    # the WebDataset drop-in's: ``.shuffle(n)`` and ``resampled=True``
    "manifest_window": _order("manifest", windowed=True),
    "resampled": _order("resampled", windowed=False),
    "resampled_window": _order("resampled", windowed=True),
}


class Plan:
    """All epochs of a data set's delivered order.

    Args:
        counts: samples per shard, in manifest order.
        shuffle: False for manifest order; True (or ``"window"``) for the
            windowed shuffle; ``"shards"`` to shuffle shard order only.
        window: shards per shuffle window (``"window"`` order only).
        partitions: node-local partitions the epoch is cut into (1: one
            sequence over all shards); see the module docstring.

    Example:
        >>> p = Plan([2, 2], seed=1)
        >>> sorted(p.epoch(0).sample_at(i) for i in range(4))
        [(0, 0), (0, 1), (1, 0), (1, 1)]
        >>> q = Plan([4, 4, 4, 4], seed=1, partitions=2).epoch(0)
        >>> sorted({q.sample_at(p)[0] for p in range(0, 16, 2)}) == sorted(q.partition_shards(0))
        True
    """

    def __init__(self, counts: Sequence[int], seed: int = 0, shuffle: bool | str = True,
                 window: int = 8, partitions: int = 1):
        if shuffle is True:
            shuffle = "window"
        elif shuffle is False or shuffle is None:
            shuffle = "none"
        if shuffle not in ORDERS:
            raise ValueError(f"unknown shuffle {shuffle!r}; choose one of {sorted(ORDERS)}")
        if int(window) < 1:
            raise ValueError(f"shuffle window must be at least 1 shard, got {window}")
        partitions = check_partitions(partitions)
        self.counts = [int(c) for c in counts]
        self.seed = int(seed)
        self.algo = str(shuffle)
        self.window = int(window)
        self.partitions = int(partitions)
        self._epochs: Dict[int, EpochPlan] = {}

    @property
    def total(self) -> int:
        return sum(self.counts)

    @property
    def same_epochs(self) -> bool:
        """Every epoch holds every sample once (``total`` positions), in its own
        order; False when shards are drawn with replacement (each epoch's length
        differs)."""
        return not self.algo.startswith("resampled")

    def epoch(self, e: int) -> EpochPlan:
        ep = self._epochs.get(e)
        if ep is None:
            fn = ORDERS[self.algo]
            if self.partitions == 1:
                ep = fn(self.counts, self.seed, e, self.window)
            else:
                ep = fn(self.counts, self.seed, e, self.window, partitions=self.partitions)
            if len(self._epochs) >= 2:
                self._epochs.pop(next(iter(self._epochs)))
            self._epochs[e] = ep
        return ep

    def describe(self) -> Dict[str, object]:
        """The settings the order depends on (for the journal's config check).

        ``partitions`` appears only when it is not 1, so that journals and
        states of earlier versions (one partition) still match."""
        d: Dict[str, object] = {"seed": self.seed, "shuffle": self.algo,
                                "shuffle_window": self.window if self.algo.endswith("window") else None}
        if self.partitions != 1:
            d["partitions"] = self.partitions
        return d
