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

**Partitions (node-local plan).**  With ``partitions=P`` > 1 the shards, in
a seed-only permutation (manifest order without shuffle), are cut once for
the whole run into P runs of equal sample counts (``c`` or ``c + 1``; a shard
that straddles a cut is split into two pieces).  Each epoch orders every
partition on its own exactly as above (its pieces permuted by the epoch's
shard hash, windows, Feistel), and position ``p`` is sample ``p // P`` of
partition ``p % P``: the epoch sequence is the round-robin interleave of the
partitions (as MosaicML Streaming interleaves its canonical nodes).  With
``P = 1`` it is the sequence above, unchanged.

With ``shuffle=False`` the sequence is manifest order.  The ``"shards"``
algorithm permutes shards but keeps each shard's samples in order (fully
sequential reads).  Algorithms are plain callables registered in
:data:`ORDERS`.

**Positions and the world layout.**  A *position* ``p`` is how many samples of
the epoch sequence have been delivered over all ranks.  From a start position
``p0`` a *step* covers ``batch_size * world_size`` positions, and rank ``r``
takes the r-th ``batch_size`` slice.  With ``nodes`` (groups of ranks that
share a cache, ranks numbered node-major) node ``n`` takes the step's
positions ``p % nodes == n`` and its local ranks slices of those: the step
still covers the same contiguous positions, and a node whose count divides
``partitions`` reads only its own partitions' shards.  The final, short step
is handled by the ``remainder`` policy:

* ``"keep"`` (default): the leftover ``m`` samples are split into
  ``world_size`` parts whose sizes differ by at most one (contiguous with
  one node; with nodes, each node splits its own positions among its
  ranks); the ranks that would get nothing get one *padding* sample each
  (from the start of the epoch, from their node's positions), so that every
  rank yields the same number of batches.
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
import operator
import struct
from array import array
from dataclasses import dataclass
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import xxhash

_TAG_SHARDS = 0x5348415244  # "SHARD"
_TAG_WINDOW = 0x57494E444F57  # "WINDOW"
_TAG_PARTS = 0x5041525453  # "PARTS"
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

    __slots__ = ("m", "a", "b", "keys", "_pack", "_rounds", "_mask_b", "_tables")
    ROUNDS = 4
    #: with halves of at most this many bits, each round function is tabulated
    #: when the permutation is made: a half takes 2**bits values, so a window
    #: of m samples costs about 4 * sqrt(2m) hashes once (~0.1 ms for 10,000
    #: samples) instead of 4 per lookup (a quarter of a lookup's time is left)
    TABLE_BITS = 12

    def __init__(self, m: int, key: int):
        self.m = int(m)
        bits = max(2, (self.m - 1).bit_length())
        self.a = bits // 2          # bits of the left half
        self.b = bits - self.a      # bits of the right half
        self.keys = [mix(key, r) for r in range(self.ROUNDS)]
        self._pack = struct.Struct("<Q").pack
        # round r's key and the mask of its new right half: the halves swap
        # widths every round (a bits, then b), and after an even number of
        # rounds they are back to (a, b)
        self._mask_b = (1 << self.b) - 1
        self._rounds = [(k, (1 << (self.a if r % 2 == 0 else self.b)) - 1) for r, k in enumerate(self.keys)]
        # round r's function over every value of its input half (b bits in even
        # rounds, a in odd ones): the same values __getitem__ would hash
        self._tables: Optional[List[List[int]]] = None
        if self.ROUNDS == 4 and self.m > 1 and max(self.a, self.b) <= self.TABLE_BITS:
            h, pk = xxhash.xxh3_64_intdigest, self._pack
            self._tables = [[h(pk(v), k) & mask for v in range(1 << (self.b if r % 2 == 0 else self.a))]
                            for r, (k, mask) in enumerate(self._rounds)]

    def __len__(self) -> int:
        return self.m

    def __getitem__(self, i: int) -> int:
        if not 0 <= i < self.m:
            raise IndexError(i)
        if self.m <= 1:
            return i
        b, mask_b, m = self.b, self._mask_b, self.m
        x = i
        tables = self._tables
        if tables is not None:  # the four rounds below, unrolled, their functions looked up
            t0, t1, t2, t3 = tables
            while True:
                left, right = x >> b, x & mask_b
                left, right = right, left ^ t0[right]
                left, right = right, left ^ t1[right]
                left, right = right, left ^ t2[right]
                left, right = right, left ^ t3[right]
                x = (left << b) | right
                if x < m:
                    return x
        h = xxhash.xxh3_64_intdigest
        pk = self._pack
        rounds = self._rounds
        while True:
            left, right = x >> b, x & mask_b
            for k, mask in rounds:
                # (L: hi bits, R: lo bits) -> (R, L ^ F(R)): widths swap
                left, right = right, left ^ (h(pk(right), k) & mask)
            x = (left << b) | right
            if x < m:
                return x


Segment = Tuple[int, int, int]  # (shard index, first sample in the shard, samples)


class EpochPlan:
    """The sample sequence of one epoch, with random access.

    ``sample_at(p)`` returns ``(shard_index, sample_in_shard)`` of the p-th
    delivered sample.  Within a window the permutation is evaluated per
    position (:class:`FeistelPermutation`), so any position costs O(1).

    The epoch is ``partitions`` sequences (see :class:`Plan`) laid out one
    after the other in *local* order (partition 0's windows, then partition
    1's, ...; ``window_starts`` is in local indices); position ``p`` is local
    index ``part_start(p % P) + p // P``.  With one partition, local index and
    position are the same.

    Args:
        counts: samples per shard.
        shard_order: the shards, in epoch order (one partition); ignored when
            ``parts`` is given.
        window: segments (shards, or pieces of shards) per window.
        window_key: the Feistel key of the epoch; None keeps the samples of a
            window in order.
        parts: the partitions' segments ``(shard, first sample, count)`` in
            epoch order; partition q must hold ``c + 1`` samples for
            ``q < total % P`` and ``c = total // P`` otherwise.
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
        out: List[int] = []
        for k in range(self.win_seg[w], self.win_seg[w + 1]):
            s = self.seg_shard[k]
            if s not in out:
                out.append(s)
        return out

    @property
    def shard_order(self) -> List[int]:
        """The shards in local epoch order (each once)."""
        seen: Dict[int, None] = {}
        for s in self.seg_shard:
            seen.setdefault(s, None)
        return list(seen)

    def partition_shards(self, q: int) -> List[int]:
        """The shards (or pieces of them) partition ``q`` reads this epoch."""
        out: Dict[int, None] = {}
        for k in range(self.win_seg[self.part_win[q]], self.win_seg[self.part_win[q + 1]]):
            if self.seg_count[k]:
                out.setdefault(self.seg_shard[k], None)
        return list(out)

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

    Partition q gets ``c + 1`` samples for ``q < total % P``, else ``c``
    (``c = total // P``); a shard that straddles a cut is split into two
    segments, one per side (so each partition boundary splits at most one
    shard).  Empty shards stay with the partition they fall in.

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


def _epoch_sorted(parts: List[List[Segment]], key: int) -> List[List[Segment]]:
    """Each partition's segments sorted by a keyed hash of their shard index
    (the order :func:`permutation` gives whole shards)."""
    h = xxhash.xxh3_64_intdigest
    pk = struct.Struct("<Q").pack
    return [sorted(part, key=lambda seg: (h(pk(seg[0]), key), seg[0])) for part in parts]


OrderFn = Callable[..., EpochPlan]


def window_order(counts: Sequence[int], seed: int, epoch: int, window: int,
                 partitions: int = 1) -> EpochPlan:
    """Permute shards per epoch, shuffle samples within windows of shards.

    With partitions, the shards are cut into partitions once for the run
    (after a seed-only permutation) and permuted per epoch within each."""
    if partitions == 1:
        order = permutation(len(counts), mix(seed, epoch, _TAG_SHARDS))
        return EpochPlan(counts, order, window, mix(seed, epoch, _TAG_WINDOW))
    parts = cut_partitions(counts, permutation(len(counts), mix(seed, _TAG_PARTS)), partitions)
    return EpochPlan(counts, None, window, mix(seed, epoch, _TAG_WINDOW),
                     parts=_epoch_sorted(parts, mix(seed, epoch, _TAG_SHARDS)))


def shard_order(counts: Sequence[int], seed: int, epoch: int, window: int,
                partitions: int = 1) -> EpochPlan:
    """Permute shards per epoch; samples stay in order inside each shard."""
    if partitions == 1:
        order = permutation(len(counts), mix(seed, epoch, _TAG_SHARDS))
        return EpochPlan(counts, order, 1, None)
    parts = cut_partitions(counts, permutation(len(counts), mix(seed, _TAG_PARTS)), partitions)
    return EpochPlan(counts, None, 1, None, parts=_epoch_sorted(parts, mix(seed, epoch, _TAG_SHARDS)))


def manifest_order(counts: Sequence[int], seed: int, epoch: int, window: int,
                   partitions: int = 1) -> EpochPlan:
    """No shuffling: manifest order every epoch (with partitions: the
    round-robin interleave of ``partitions`` contiguous runs of it)."""
    if partitions == 1:
        return EpochPlan(counts, range(len(counts)), 1, None)
    return EpochPlan(counts, None, 1, None, parts=cut_partitions(counts, range(len(counts)), partitions))


# ---- orders for the WebDataset drop-in ---------------------------
# ``.shuffle(n)`` on a WebDataset is compiled into a windowed order (samples
# shuffled within windows of whole shards, see resumewds.dataset), and
# ``resampled=True`` draws each epoch's shards with replacement.  Both are pure
# functions of (seed, epoch, position), like every order here.
_TAG_RESAMPLE = 0x524553414D50  # "RESAMP"


def manifest_window_order(counts: Sequence[int], seed: int, epoch: int, window: int,
                          partitions: int = 1) -> EpochPlan:
    """Shards in manifest order; samples shuffled within windows of ``window`` shards
    (with partitions: contiguous runs of manifest order, each windowed on its own)."""
    if partitions == 1:
        return EpochPlan(counts, range(len(counts)), window, mix(seed, epoch, _TAG_WINDOW))
    return EpochPlan(counts, None, window, mix(seed, epoch, _TAG_WINDOW),
                     parts=cut_partitions(counts, range(len(counts)), partitions))


#: the draw hashes of :func:`draw_shards`: ``"seeded"`` is xxh3_64 of the draw
#: number keyed by ``key`` (single data sets' ``resampled=True``), ``"mixed"`` is
#: :func:`mix` of ``(key, draw)`` (a mixture's resampled source).  Two hashes
#: because both orders shipped before the code was shared; each keeps its own.
DRAW_SCHEMES = ("seeded", "mixed")


def draw_shards(n: int, key: int, *, sizes: Optional[Sequence[int]] = None,
                scheme: str = "seeded") -> Tuple[List[int], List[int]]:
    """Draw shards (or any ``n`` units) with replacement: the one resampling routine.

    Draw ``d`` picks unit ``hash(d) mod n`` (the hash by ``scheme``, see
    :data:`DRAW_SCHEMES`).  Without ``sizes``: ``n`` draws (webdataset's
    ``resampled=True``: as many draws as shards; the epoch's sample count
    varies).  With ``sizes`` (samples per unit): draws go on until they hold
    exactly ``sum(sizes)`` samples; a draw of an empty unit is skipped and
    the last draw is cut short, so the result has the units' total size.

    Returns:
        ``(draws, taken)``: the drawn unit indices and, with ``sizes``, the
        samples taken from each draw (its size, the last one possibly
        fewer); without ``sizes`` ``taken`` is empty.

    Example:
        >>> draws, taken = draw_shards(3, key=7, sizes=[2, 0, 5])
        >>> sum(taken), 1 in draws, draw_shards(3, key=7)[0] == draw_shards(3, key=7)[0]
        (7, False, True)
    """
    if scheme not in DRAW_SCHEMES:
        raise ValueError(f"unknown draw scheme {scheme!r}; choose one of {DRAW_SCHEMES}")
    pk = struct.Struct("<Q").pack
    h = xxhash.xxh3_64_intdigest

    def pick(d: int) -> int:
        return (h(pk(d), key) if scheme == "seeded" else mix(key, d)) % n

    if n <= 0:
        return [], []
    if sizes is None:
        return [pick(d) for d in range(n)], []
    total = sum(int(c) for c in sizes)
    draws: List[int] = []
    taken: List[int] = []
    t, d = 0, 0
    while t < total:
        s = pick(d)
        d += 1
        c = int(sizes[s])
        if c == 0:
            continue
        c = min(c, total - t)
        draws.append(s)
        taken.append(c)
        t += c
    return draws, taken


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

    The partitions are the run's (:func:`cut_partitions` after the seed-only
    permutation, as the windowed order cuts them); partition ``q`` draws its
    pieces with :func:`draw_shards` (key ``mix(seed, epoch, "RESAMP", q)``)
    until it holds its own sample count, so the epoch keeps the data set's
    size and a node reads only its partitions' shards.

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


def resampled_order(counts: Sequence[int], seed: int, epoch: int, window: int,
                    partitions: int = 1) -> EpochPlan:
    """Shards drawn with replacement per epoch; samples of each draw in shard order.

    With partitions: :func:`resampled_parts` (each partition draws from its own shards)."""
    if partitions == 1:
        return EpochPlan(counts, resampled_shards(len(counts), seed, epoch), 1, None)
    return EpochPlan(counts, None, 1, None, parts=resampled_parts(counts, seed, epoch, partitions))


def resampled_window_order(counts: Sequence[int], seed: int, epoch: int, window: int,
                           partitions: int = 1) -> EpochPlan:
    """Shards drawn with replacement per epoch; samples shuffled within windows of draws."""
    if partitions == 1:
        return EpochPlan(counts, resampled_shards(len(counts), seed, epoch), window,
                         mix(seed, epoch, _TAG_WINDOW))
    return EpochPlan(counts, None, window, mix(seed, epoch, _TAG_WINDOW),
                     parts=resampled_parts(counts, seed, epoch, partitions))


ORDERS: Dict[str, OrderFn] = {
    "window": window_order,
    "shards": shard_order,
    "none": manifest_order,
    "manifest_window": manifest_window_order,
    "resampled": resampled_order,
    "resampled_window": resampled_window_order,
}


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


class Plan:
    """All epochs of a data set's delivered order.

    Args:
        counts: samples per shard, in manifest order.
        seed: the run's seed.
        shuffle: False for manifest order; True (or ``"window"``) for the
            windowed shuffle; ``"shards"`` to shuffle shard order only.
        window: shards per shuffle window (``"window"`` order only).
        partitions: how many node-local partitions the epoch is cut into
            (1: one sequence over all shards, the order of earlier versions).
            The shards are cut once for the run into ``partitions`` runs of
            equal sample counts; each epoch orders each partition on its own
            (shards permuted, windows, Feistel) and position ``p`` is sample
            ``p // P`` of partition ``p % P``.  A node whose ranks take the
            positions ``p % nodes == node`` (:class:`Layout` with ``nodes``)
            then reads only its own partitions when ``nodes`` divides
            ``partitions``.

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


# ---------------------------------------------------------------------------
# World layout: steps, ranks, workers.
# ---------------------------------------------------------------------------

REMAINDERS = ("keep", "pad", "drop")


@dataclass(frozen=True)
class Layout:
    """How an epoch's sequence is cut into steps and split across ranks.

    A step is always a contiguous range of ``batch_size * world_size``
    positions, whatever the layout.  With ``nodes`` > 1 the ranks are grouped
    node-major (ranks ``n*L .. n*L+L-1`` are node ``n``, ``L = world_size //
    nodes``): node ``n`` takes the step's positions ``p % nodes == n`` (exactly
    ``batch_size * L`` of a full step) and its local rank ``l`` the l-th
    ``batch_size`` of them.  With one node that is the r-th contiguous slice.

    Attributes:
        batch_size: samples per rank per step.
        world_size: number of ranks.
        rank: this rank.
        remainder: ``"keep"``, ``"pad"`` or ``"drop"`` (see module docs).
        nodes: groups of ranks that share a cache (must divide world_size).

    Example:
        >>> [Layout(2, 4, r, nodes=2).slots(100, 0, 0) for r in (0, 2)]
        [[(0, False), (2, False)], [(1, False), (3, False)]]
    """

    batch_size: int
    world_size: int = 1
    rank: int = 0
    remainder: str = "keep"
    nodes: int = 1

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} is not in a world of size {self.world_size}")
        if self.remainder not in REMAINDERS:
            raise ValueError(f"remainder must be one of {REMAINDERS}, got {self.remainder!r}")
        if self.nodes < 1 or self.world_size % self.nodes:
            raise ValueError(f"{self.nodes} nodes cannot split a world of {self.world_size} ranks "
                             "evenly")

    @property
    def step_size(self) -> int:
        return self.batch_size * self.world_size

    @property
    def ranks_per_node(self) -> int:
        return self.world_size // self.nodes

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
        of the epoch, of the rank's node when there are nodes) and
        ``is_pad=True``.
        """
        r = self.rank if rank is None else rank
        b, N = self.batch_size, self.nodes
        L = self.world_size // N
        n, lr = divmod(r, L)
        s0 = start + step * self.step_size
        left = total - s0
        if left <= 0:
            return []
        f = s0 + (n - s0) % N  # the node's first position of the step
        if left >= self.step_size:
            return [(f + N * (lr * b + j), False) for j in range(b)]
        # the final, short step
        if self.remainder == "drop":
            return []
        if self.remainder == "pad":
            out = []
            for j in range(b):
                g = f + N * (lr * b + j)
                out.append((g, False) if g < total else ((g - total) % total, True))
            return out
        mine = max(0, (total - f + N - 1) // N)  # the node's positions in [s0, total)
        q, extra = divmod(mine, L)
        if q == 0:
            if lr < mine:
                return [(f + N * lr, False)]
            return [((n + N * (lr - mine)) % total, True)]
        lo = lr * q + min(lr, extra)
        size = q + (1 if lr < extra else 0)
        return [(f + N * (lo + j), False) for j in range(size)]


def worker_steps(num_steps: int, worker: int, num_workers: int) -> range:
    """Steps produced by DataLoader worker ``worker`` (round-robin order)."""
    return range(worker, num_steps, max(1, num_workers))
