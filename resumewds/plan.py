"""The delivered order: a pure function of (sample counts, seed, epoch, shuffle).

Nothing here does I/O or keeps hidden RNG state, and nothing depends on
Python's :mod:`random` or on hash randomisation: every random choice is an
xxh3_64 hash of integers, so the same seed gives the same order on any machine
and any Python version.

**The epoch sequence.**  For epoch ``e`` the plan orders all ``N`` samples of
the manifest:

1. The shard order is a permutation of the shards: shards are sorted by
   ``xxh3_64(shard_index, seed=mix(seed, e, "shards"))``.
2. The permuted shards are cut into *windows* of ``window`` consecutive shards.
3. Within window ``w``, its ``M`` samples (numbered in permuted shard order,
   then in shard order) are permuted by a keyed *random-access* permutation
   of ``range(M)`` (:class:`FeistelPermutation`: a 4-round Feistel network
   whose round function is xxh3_64 keyed by ``mix(seed, e, "window", w)``,
   cycle-walked onto ``range(M)``).  Any position is computed in O(1)
   without building the window's permutation, so a rank that needs 32
   samples of an 80,000-sample window pays for 32, not 80,000.
4. The epoch sequence is the windows one after another.

With ``shuffle=False`` the sequence is manifest order.  The ``"shards"``
algorithm permutes shards but keeps each shard's samples in order (fully
sequential reads).  Algorithms are plain callables registered in
:data:`ORDERS`.

**Positions and the world layout.**  A *position* ``p`` is how many samples of
the epoch sequence have been delivered over all ranks.  From a start position
``p0`` a *step* covers ``batch_size * world_size`` positions, and rank ``r``
takes the r-th ``batch_size`` slice.  The final, short step is handled by the
``remainder`` policy:

* ``"keep"`` (default): the leftover ``m`` samples are split into
  ``world_size`` contiguous parts whose sizes differ by at most one; if
  ``m < world_size`` the ranks that would get nothing get one *padding*
  sample each, so that every rank yields the same number of batches.
* ``"pad"``: the last step is filled to full size with samples from the
  start of the epoch's sequence, marked as padding.
* ``"drop"``: the leftover samples are not delivered this epoch.

Padding samples carry ``__pad__ = True`` and are counted in stats; they never
advance the position.

Example:
    >>> plan = Plan([3, 2, 4], seed=7, shuffle=True, window=2)
    >>> ep = plan.epoch(0)
    >>> len(ep), sorted(ep.sample_at(i) for i in range(len(ep)))[:3]
    (9, [(0, 0), (0, 1), (0, 2)])
    >>> Plan([3, 2], shuffle=False).epoch(5).sample_at(3)
    (1, 0)
"""

from __future__ import annotations

import bisect
import struct
from array import array
from dataclasses import dataclass
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

import xxhash

_TAG_SHARDS = 0x5348415244  # "SHARD"
_TAG_WINDOW = 0x57494E444F57  # "WINDOW"
_MASK = (1 << 64) - 1


def mix(*values: int) -> int:
    """Hash a tuple of non-negative integers into one 64-bit seed.

    Example:
        >>> mix(1, 2) == mix(1, 2) != mix(2, 1)
        True
    """
    return xxhash.xxh3_64_intdigest(struct.pack(f"<{len(values)}Q", *[v & _MASK for v in values]))


def permutation(n: int, key: int) -> List[int]:
    """A seeded permutation of ``range(n)``: sort by a keyed hash of the index.

    Example:
        >>> sorted(permutation(5, 1)) == list(range(5))
        True
    """
    h = xxhash.xxh3_64_intdigest
    pk = struct.Struct("<Q").pack
    return sorted(range(n), key=lambda i: (h(pk(i), key), i))


class FeistelPermutation:
    """A keyed bijection of ``range(m)`` with O(1) random access.

    A 4-round (possibly unbalanced) Feistel network on the bit width of
    ``m - 1`` (round function: xxh3_64 of one half, keyed per round),
    cycle-walked: values ``>= m`` are fed through again until they land in
    ``range(m)``.  The domain is less than ``2m``, so a lookup takes fewer
    than two passes on average.  Pure integer arithmetic and xxh3: the same
    on every machine and Python version.

    Example:
        >>> p = FeistelPermutation(10, key=5)
        >>> sorted(p[i] for i in range(10)) == list(range(10))
        True
    """

    __slots__ = ("m", "a", "b", "keys", "_pack")
    ROUNDS = 4

    def __init__(self, m: int, key: int):
        self.m = int(m)
        bits = max(2, (self.m - 1).bit_length())
        self.a = bits // 2          # bits of the left half
        self.b = bits - self.a      # bits of the right half
        self.keys = [mix(key, r) for r in range(self.ROUNDS)]
        self._pack = struct.Struct("<Q").pack

    def __len__(self) -> int:
        return self.m

    def __getitem__(self, i: int) -> int:
        if not 0 <= i < self.m:
            raise IndexError(i)
        if self.m <= 1:
            return i
        h = xxhash.xxh3_64_intdigest
        pk = self._pack
        a, b, keys, m = self.a, self.b, self.keys, self.m
        x = i
        while True:
            hi, lo = a, b
            left, right = x >> lo, x & ((1 << lo) - 1)
            for k in keys:
                # (L: hi bits, R: lo bits) -> (R, L ^ F(R)): widths swap
                left, right = right, left ^ (h(pk(right), k) & ((1 << hi) - 1))
                hi, lo = lo, hi
            x = (left << lo) | right
            if x < m:
                return x


class EpochPlan:
    """The sample sequence of one epoch, with random access.

    ``sample_at(i)`` returns ``(shard_index, sample_in_shard)`` of the i-th
    delivered sample.  Within a window the permutation is evaluated per
    position (:class:`FeistelPermutation`), so any position costs O(1).
    """

    def __init__(self, counts: Sequence[int], shard_order: Sequence[int], window: int,
                 window_key: Optional[int]):
        self.counts = counts
        self.shard_order = list(shard_order)
        self.window = max(1, int(window))
        self.window_key = window_key  # None: samples keep shard order
        nw = (len(self.shard_order) + self.window - 1) // self.window
        starts = array("q", [0])
        t = 0
        for w in range(nw):
            for s in self.shard_order[w * self.window:(w + 1) * self.window]:
                t += int(counts[s])
            starts.append(t)
        self.window_starts = starts
        self.total = t
        self._cache: Dict[int, Tuple[List[int], array, Any]] = {}

    def __len__(self) -> int:
        return self.total

    def _window(self, w: int) -> Tuple[List[int], array, Any]:
        hit = self._cache.get(w)
        if hit is not None:
            return hit
        shards = self.shard_order[w * self.window:(w + 1) * self.window]
        starts = array("q", [0])
        for s in shards:
            starts.append(starts[-1] + int(self.counts[s]))
        m = starts[-1]
        perm: Any = range(m) if self.window_key is None else FeistelPermutation(m, mix(self.window_key, w))
        if len(self._cache) >= 4:
            self._cache.pop(next(iter(self._cache)))
        self._cache[w] = (shards, starts, perm)
        return self._cache[w]

    def window_of(self, i: int) -> int:
        """The window index holding position ``i``."""
        return bisect.bisect_right(self.window_starts, i) - 1

    def window_shards(self, w: int) -> List[int]:
        """Shard indices of window ``w`` (in permuted order)."""
        return self.shard_order[w * self.window:(w + 1) * self.window]

    def sample_at(self, i: int) -> Tuple[int, int]:
        """``(shard_index, sample_in_shard)`` of position ``i`` of this epoch."""
        if not 0 <= i < self.total:
            raise IndexError(f"position {i} outside epoch of {self.total} samples")
        w = bisect.bisect_right(self.window_starts, i) - 1
        shards, starts, perm = self._window(w)
        j = perm[i - self.window_starts[w]]
        k = bisect.bisect_right(starts, j) - 1
        return shards[k], j - starts[k]

    def shards_from(self, i: int, count: int) -> List[int]:
        """Up to ``count`` distinct shards needed from position ``i`` on."""
        out: List[int] = []
        if i >= self.total:
            return out
        w = self.window_of(i)
        while len(out) < count and w * self.window < len(self.shard_order):
            for s in self.window_shards(w):
                if s not in out:
                    out.append(s)
            w += 1
        return out[:count]


OrderFn = Callable[[Sequence[int], int, int, int], EpochPlan]


def window_order(counts: Sequence[int], seed: int, epoch: int, window: int) -> EpochPlan:
    """Permute shards per epoch, shuffle samples within windows of shards."""
    order = permutation(len(counts), mix(seed, epoch, _TAG_SHARDS))
    return EpochPlan(counts, order, window, mix(seed, epoch, _TAG_WINDOW))


def shard_order(counts: Sequence[int], seed: int, epoch: int, window: int) -> EpochPlan:
    """Permute shards per epoch; samples stay in order inside each shard."""
    order = permutation(len(counts), mix(seed, epoch, _TAG_SHARDS))
    return EpochPlan(counts, order, 1, None)


def manifest_order(counts: Sequence[int], seed: int, epoch: int, window: int) -> EpochPlan:
    """No shuffling: manifest order every epoch."""
    return EpochPlan(counts, range(len(counts)), 1, None)


# ---- orders for the WebDataset drop-in (issue 13) ---------------------------
# ``.shuffle(n)`` on a WebDataset is compiled into a windowed order (samples
# shuffled within windows of whole shards, see resumewds.dataset), and
# ``resampled=True`` draws each epoch's shards with replacement.  Both are pure
# functions of (seed, epoch, position), like every order here.
_TAG_RESAMPLE = 0x524553414D50  # "RESAMP"


def manifest_window_order(counts: Sequence[int], seed: int, epoch: int, window: int) -> EpochPlan:
    """Shards in manifest order; samples shuffled within windows of ``window`` shards."""
    return EpochPlan(counts, range(len(counts)), window, mix(seed, epoch, _TAG_WINDOW))


def resampled_shards(n: int, seed: int, epoch: int) -> List[int]:
    """Epoch ``epoch``'s ``n`` shard draws, with replacement (webdataset's ``resampled=True``).

    Example:
        >>> d = resampled_shards(4, seed=1, epoch=0)
        >>> len(d) == 4 and all(0 <= s < 4 for s in d) and d == resampled_shards(4, 1, 0)
        True
    """
    key = mix(seed, epoch, _TAG_RESAMPLE)
    pk = struct.Struct("<Q").pack
    h = xxhash.xxh3_64_intdigest
    return [h(pk(i), key) % n for i in range(n)] if n else []


def resampled_order(counts: Sequence[int], seed: int, epoch: int, window: int) -> EpochPlan:
    """Shards drawn with replacement per epoch; samples of each draw in shard order."""
    return EpochPlan(counts, resampled_shards(len(counts), seed, epoch), 1, None)


def resampled_window_order(counts: Sequence[int], seed: int, epoch: int, window: int) -> EpochPlan:
    """Shards drawn with replacement per epoch; samples shuffled within windows of draws."""
    return EpochPlan(counts, resampled_shards(len(counts), seed, epoch), window,
                     mix(seed, epoch, _TAG_WINDOW))


ORDERS: Dict[str, OrderFn] = {
    "window": window_order,
    "shards": shard_order,
    "none": manifest_order,
    "manifest_window": manifest_window_order,
    "resampled": resampled_order,
    "resampled_window": resampled_window_order,
}


class Plan:
    """All epochs of a data set's delivered order.

    Args:
        counts: samples per shard, in manifest order.
        seed: the run's seed.
        shuffle: False for manifest order; True (or ``"window"``) for the
            windowed shuffle; ``"shards"`` to shuffle shard order only.
        window: shards per shuffle window (``"window"`` order only).

    Example:
        >>> p = Plan([2, 2], seed=1)
        >>> sorted(p.epoch(0).sample_at(i) for i in range(4))
        [(0, 0), (0, 1), (1, 0), (1, 1)]
    """

    def __init__(self, counts: Sequence[int], seed: int = 0, shuffle: "bool | str" = True,
                 window: int = 8):
        if shuffle is True:
            shuffle = "window"
        elif shuffle is False or shuffle is None:
            shuffle = "none"
        if shuffle not in ORDERS:
            raise ValueError(f"unknown shuffle {shuffle!r}; choose one of {sorted(ORDERS)}")
        if int(window) < 1:
            raise ValueError(f"shuffle window must be at least 1 shard, got {window}")
        self.counts = list(int(c) for c in counts)
        self.seed = int(seed)
        self.algo = str(shuffle)
        self.window = int(window)
        self._epochs: Dict[int, EpochPlan] = {}

    @property
    def total(self) -> int:
        return sum(self.counts)

    def epoch(self, e: int) -> EpochPlan:
        ep = self._epochs.get(e)
        if ep is None:
            ep = ORDERS[self.algo](self.counts, self.seed, e, self.window)
            if len(self._epochs) >= 2:
                self._epochs.pop(next(iter(self._epochs)))
            self._epochs[e] = ep
        return ep

    def describe(self) -> Dict[str, object]:
        """The settings the order depends on (for the journal's config check)."""
        return {"seed": self.seed, "shuffle": self.algo,
                "shuffle_window": self.window if self.algo.endswith("window") else None}


# ---------------------------------------------------------------------------
# World layout: steps, ranks, workers.
# ---------------------------------------------------------------------------

REMAINDERS = ("keep", "pad", "drop")


@dataclass(frozen=True)
class Layout:
    """How an epoch's sequence is cut into steps and split across ranks.

    Attributes:
        batch_size: samples per rank per step.
        world_size: number of ranks.
        rank: this rank.
        remainder: ``"keep"``, ``"pad"`` or ``"drop"`` (see module docs).
    """

    batch_size: int
    world_size: int = 1
    rank: int = 0
    remainder: str = "keep"

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} is not in a world of size {self.world_size}")
        if self.remainder not in REMAINDERS:
            raise ValueError(f"remainder must be one of {REMAINDERS}, got {self.remainder!r}")

    @property
    def step_size(self) -> int:
        return self.batch_size * self.world_size

    def num_steps(self, total: int, start: int) -> int:
        """Steps from position ``start`` to the end of an epoch of ``total``."""
        left = max(0, total - start)
        full, rem = divmod(left, self.step_size)
        if rem and self.remainder != "drop":
            return full + 1
        return full

    def position_after(self, total: int, start: int, step: int) -> int:
        """Global position once steps ``0..step`` from ``start`` are delivered."""
        p = start + (step + 1) * self.step_size
        n = self.num_steps(total, start)
        if step + 1 >= n:
            return total
        return p

    def slots(self, total: int, start: int, step: int, rank: Optional[int] = None
              ) -> List[Tuple[int, bool]]:
        """Positions rank ``rank`` delivers at ``step``: ``[(position, is_pad)]``.

        Padding slots carry a real position to read (a sample from the start
        of the epoch) and ``is_pad=True``.
        """
        r = self.rank if rank is None else rank
        b, R = self.batch_size, self.world_size
        s0 = start + step * self.step_size
        left = total - s0
        if left <= 0:
            return []
        if left >= self.step_size:
            return [(s0 + r * b + j, False) for j in range(b)]
        # the final, short step
        if self.remainder == "drop":
            return []
        if self.remainder == "pad":
            out = []
            for j in range(b):
                g = s0 + r * b + j
                out.append((g, False) if g < total else ((g - total) % total, True))
            return out
        q, extra = divmod(left, R)
        if q == 0:
            if r < left:
                return [(s0 + r, False)]
            return [((r - left) % total, True)]
        lo = s0 + r * q + min(r, extra)
        size = q + (1 if r < extra else 0)
        return [(lo + j, False) for j in range(size)]


def worker_steps(num_steps: int, worker: int, num_workers: int) -> range:
    """Steps produced by DataLoader worker ``worker`` (round-robin order)."""
    return range(worker, num_steps, max(1, num_workers))
