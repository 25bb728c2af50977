"""The mixing plan: which source feeds each position of a mixed stream.

A pure function (no I/O, no RNG state): :meth:`MixPlan.locate` maps a
position to ``(source, q)``, ``q`` the index in that source's own endless
stream (:class:`SourceStream`), in O(phases + log K) at any worker count or
world size.  The interleave is a tree of two-way Bresenham splits
(:class:`Splitter`; docs/MIXTURES.md), and a source at depth ``d`` is within
``d`` samples of its weight's share over any prefix.  **Phases**
(``phases=[(0, w0), (g1, w1), ...]``, ``g`` a global position): a source
stream continues where the previous phase left it, so a change repeats or
skips nothing, and positions before ``g1`` map as they did without it.

Example:
    >>> mp = MixPlan([100, 10], weights=[3, 1], seed=1)
    >>> [mp.locate(0, p)[0] for p in range(8)].count(0)
    6
    >>> mp.epoch_size
    110
    >>> mp.delivered(0, 8)
    [6, 2]
"""

from __future__ import annotations

import bisect
from array import array
from fractions import Fraction
from math import gcd, lcm
from typing import Any, Dict, List, Optional, Sequence, Tuple, Union

from ..plan import EpochPlan, FeistelPermutation, Plan, check_partitions, draw_shards, mix

_TAG_MIX = 0x4D4958  # "MIX"
_TAG_RESAMPLE = 0x5245534D  # "RESM"
_TAG_RWINDOW = 0x5257494E  # "RWIN"
_TAG_BLOCK = 0x424C4F43  # "BLOC"
_TAG_PART = 0x50415254  # "PART"

Weights = Union[Sequence[float], Dict[int, float]]


def integer_weights(weights: Sequence[Union[int, float, Fraction]]) -> List[int]:
    """Exact integer weights with the same ratios (floats read as short decimals).

    ``[0.3, 0.7] -> [3, 7]``, ``[0.5, 0.5, 0] -> [1, 1, 0]``; ValueError if a weight is
    negative or not finite, or all are zero.

    Example:
        >>> integer_weights([0.25, 0.75])
        [1, 3]
    """
    fr: List[Fraction] = []
    for w in weights:
        try:
            f = w if isinstance(w, Fraction) else Fraction(w).limit_denominator(10**9)
        except (ValueError, OverflowError, TypeError):
            raise ValueError(f"mixture weight {w!r} is not a finite number") from None
        if f < 0:
            raise ValueError(f"mixture weight {w!r} is negative")
        fr.append(f)
    if not any(fr):
        raise ValueError(f"mixture weights {list(weights)!r}: at least one must be positive")
    den = lcm(*(f.denominator for f in fr))
    ints = [int(f * den) for f in fr]
    g = gcd(*ints)
    return [v // g for v in ints]


class Splitter:
    """The interleave of one phase: position ``j`` -> ``(source, index)``.

    The active sources are the leaves of a balanced binary tree; a node of
    weight ``B`` whose left child weighs ``A`` sends its ``j``-th position left
    iff ``floor(((j+1)A + f)/B) > floor((jA + f)/B)``, ``f`` a seeded offset.

    Args:
        weights: integer weight per source (0: not a leaf; changes nothing).
        key: seed of the split offsets.

    Example:
        >>> s = Splitter([1, 1], key=3)
        >>> sorted(s.locate(j) for j in range(4))
        [(0, 0), (0, 1), (1, 0), (1, 1)]
    """

    def __init__(self, weights: Sequence[int], key: int):
        self.weights = [int(w) for w in weights]
        self.active = [i for i, w in enumerate(self.weights) if w > 0]
        if not self.active:
            raise ValueError("a mixture phase needs at least one source with a positive weight")
        # nodes: (left_weight, total, offset, left_child, right_child); a child
        # >= 0 is a node index, < 0 is ~source
        self.nodes: List[Tuple[int, int, int, int, int]] = []
        self.depth: Dict[int, int] = {}
        self.root = self._build(self.active, key, 0)

    def _build(self, leaves: List[int], key: int, depth: int) -> int:
        if len(leaves) == 1:
            self.depth[leaves[0]] = depth
            return ~leaves[0]
        half = len(leaves) // 2
        me = len(self.nodes)
        self.nodes.append((0, 0, 0, 0, 0))
        left = self._build(leaves[:half], key, depth + 1)
        right = self._build(leaves[half:], key, depth + 1)
        a = sum(self.weights[i] for i in leaves[:half])
        b = a + sum(self.weights[i] for i in leaves[half:])
        self.nodes[me] = (a, b, mix(key, me) % b, left, right)
        return me

    def locate(self, j: int) -> Tuple[int, int]:
        """Source and index within that source's share of position ``j``."""
        n = self.root
        nodes = self.nodes
        while n >= 0:
            a, b, f, left, right = nodes[n]
            c = (j * a + f) // b
            if ((j + 1) * a + f) // b > c:
                n, j = left, c
            else:
                n, j = right, j - c
        return ~n, j

    def counts(self, j: int) -> List[int]:
        """How many of positions ``0 .. j-1`` go to each source."""
        out = [0] * len(self.weights)
        stack = [(self.root, j)]
        while stack:
            n, k = stack.pop()
            if n < 0:
                out[~n] += k
                continue
            a, b, f, left, right = self.nodes[n]
            c = (k * a + f) // b
            stack.append((left, c))
            stack.append((right, k - c))
        return out

    def bound(self, source: int) -> int:
        """``d``: ``|counts(n)[source] - n * w| < d`` for every ``n`` (0: exact)."""
        return self.depth.get(source, 0)


class MixPlan:
    """The mixed stream of several sources, over epochs and phases.

    Args:
        sizes: samples per (source) epoch of each source.
        weights: relative weights (``probs``); None: see ``repeat``/``choose``.
        repeat: per source, a multiplier of its size per epoch, or None.
        choose: per source, samples per epoch, or None.
        epoch_size: positions per mixed epoch; default: the sum of the
            per-source epoch counts.
        seed: seed of the interleave.
        phases: later phases as ``[(global_position, weights), ...]``;
            ``weights`` is a list (one per source) or a dict ``{index: w}``
            (missing sources: 0).  Positions must increase and be > 0.
        block: ``B > 1`` also shuffles positions within blocks of ``B``
            (bound: :meth:`prefix_bounds`; a phase starts at a block boundary).
        partitions: node-local partitions (``P``): position ``p`` is fed by
            partition ``p % P``'s own mixture (:meth:`part`).

    Sources with ``repeat``/``choose`` have that count per epoch; the others
    share the rest by weight (none given: ``choose = size``).  docs/MIXTURES.md.

    Example:
        >>> MixPlan([10, 20], choose=[5, None], repeat=[None, 2]).epoch_size
        45
    """

    def __init__(self, sizes: Sequence[int], weights: Optional[Sequence[Optional[float]]] = None, *,
                 repeat: Optional[Sequence[Optional[float]]] = None,
                 choose: Optional[Sequence[Optional[int]]] = None,
                 epoch_size: Optional[int] = None, seed: int = 0,
                 phases: Optional[Sequence[Tuple[int, Weights]]] = None, block: int = 1,
                 partitions: int = 1):
        self.sizes = [int(s) for s in sizes]
        self.partitions = check_partitions(partitions)
        if int(block) < 1:
            raise ValueError(f"mixture block must be >= 1, got {block}")
        self.block = int(block)
        k = len(self.sizes)
        if k == 0:
            raise ValueError("a mixture needs at least one source")
        for i, s in enumerate(self.sizes):
            if s < 1:
                raise ValueError(f"mixture source {i} has no samples")
        weights = list(weights) if weights is not None else [None] * k
        repeat = list(repeat) if repeat is not None else [None] * k
        choose = list(choose) if choose is not None else [None] * k
        for name, lst in (("weights", weights), ("repeat", repeat), ("choose", choose)):
            if len(lst) != k:
                raise ValueError(f"mixture: {name} has {len(lst)} entries for {k} sources")
        absolute: List[Optional[Fraction]] = []
        for i in range(k):
            wi, ri, ci = weights[i], repeat[i], choose[i]
            given = [n for n, v in (("weight", wi), ("repeat", ri), ("choose", ci)) if v is not None]
            if len(given) > 1:
                raise ValueError(f"mixture source {i}: give one of weight, repeat, choose (got {given})")
            if ri is not None:
                if float(ri) < 0:
                    raise ValueError(f"mixture source {i}: repeat={ri!r} is negative")
                absolute.append(Fraction(ri).limit_denominator(10**6) * self.sizes[i])
            elif ci is not None:
                if int(ci) < 0:
                    raise ValueError(f"mixture source {i}: choose={ci!r} is negative")
                absolute.append(Fraction(int(ci)))
            elif wi is None:
                absolute.append(Fraction(self.sizes[i]))
            else:
                absolute.append(None)
        fixed = sum((a for a in absolute if a is not None), Fraction(0))
        rel = [Fraction(w).limit_denominator(10**9) if a is None and w is not None else Fraction(0)
               for w, a in zip(weights, absolute)]
        if any(r < 0 for r in rel):
            raise ValueError(f"mixture weights {weights!r}: a weight is negative")
        if epoch_size is None:
            if any(a is None for a in absolute):
                # weights only: an epoch is as long as one pass over every source
                L = fixed + sum(self.sizes[i] for i in range(k) if absolute[i] is None)
            else:
                L = fixed
            epoch_size = int(L)
        epoch_size = int(epoch_size)
        if epoch_size < 1:
            raise ValueError(f"mixture epoch size must be >= 1, got {epoch_size}")
        if any(a is None for a in absolute):
            if fixed > epoch_size:
                raise ValueError(f"mixture: repeat/choose sources need {fixed} samples per epoch, "
                                 f"more than the epoch size {epoch_size}")
            rest = epoch_size - fixed
            tot = sum(rel)
            if tot == 0 and rest > 0:
                raise ValueError("mixture: the weighted sources all have weight 0")
            share = [a if a is not None else (rest * r / tot if tot else Fraction(0))
                     for a, r in zip(absolute, rel)]
        else:
            # only absolute counts: with an explicit epoch size they are ratios
            share = list(absolute)  # type: ignore[arg-type]
        self.epoch_size = epoch_size
        self.seed = int(seed)
        w0 = integer_weights(share)
        self.phase_starts: List[int] = [0]
        self.phase_weights: List[List[int]] = [w0]
        self._splitters: Dict[int, Splitter] = {}
        self._perms: Dict[Tuple[int, int], FeistelPermutation] = {}
        self._bases: List[List[int]] = []
        for at, w in phases or []:
            self._add_phase(int(at), w)
        if self.partitions > epoch_size:
            raise ValueError(f"mixture epoch of {epoch_size} positions cannot feed "
                             f"partitions={self.partitions} (each partition needs a position per epoch)")
        self._parts: Dict[int, MixPlan] = {}

    def _norm(self, w: Weights) -> List[int]:
        k = len(self.sizes)
        if isinstance(w, dict):
            bad = [i for i in w if not (isinstance(i, int) and 0 <= i < k)]
            if bad:
                raise ValueError(f"mixture phase weights name unknown sources {bad} (0..{k - 1})")
            lst = [w.get(i, 0) for i in range(k)]
        else:
            lst = list(w)
            if len(lst) != k:
                raise ValueError(f"mixture phase has {len(lst)} weights for {k} sources")
        return integer_weights(lst)

    def _add_phase(self, at: int, w: Weights) -> None:
        if at <= self.phase_starts[-1]:
            snapped = f", which starts at the block boundary {self.phase_starts[-1]} (block={self.block})" \
                if self.block > 1 else ""
            raise ValueError(f"mixture phase at position {at} must come after the one before it"
                             f"{snapped or ' at ' + str(self.phase_starts[-1])} (phases are in increasing "
                             "global positions)")
        prev, b = self.phase_starts[-1], self.block
        at = prev + -(-(at - prev) // b) * b  # with blocks: from the next block boundary on
        self.phase_starts.append(at)
        self.phase_weights.append(self._norm(w))
        self._bases = []
        self._parts = {}

    # ---- structure ---------------------------------------------------------
    def splitter(self, phase: int) -> Splitter:
        sp = self._splitters.get(phase)
        if sp is None:
            sp = self._splitters[phase] = Splitter(self.phase_weights[phase],
                                                    mix(self.seed, _TAG_MIX, phase))
        return sp

    def _perm(self, phase: int, b: int) -> FeistelPermutation:
        key = (phase, b)
        p = self._perms.get(key)
        if p is None:
            if len(self._perms) >= 8:
                self._perms.pop(next(iter(self._perms)))
            p = self._perms[key] = FeistelPermutation(self.block, mix(self.seed, _TAG_BLOCK, phase, b))
        return p

    def _phase_locate(self, phase: int, j: int) -> Tuple[int, int]:
        sp = self.splitter(phase)
        if self.block == 1:
            return sp.locate(j)
        b, t = divmod(j, self.block)
        return sp.locate(b * self.block + self._perm(phase, b)[t])

    def _phase_counts(self, phase: int, j: int) -> List[int]:
        sp = self.splitter(phase)
        if self.block == 1:
            return sp.counts(j)
        b, t = divmod(j, self.block)
        c = sp.counts(b * self.block)
        perm = self._perm(phase, b)
        for u in range(t):
            c[sp.locate(b * self.block + perm[u])[0]] += 1
        return c

    def _base(self, phase: int) -> List[int]:
        """Per-source stream index at the start of ``phase``."""
        if not self._bases:
            bases = [[0] * len(self.sizes)]
            for p in range(1, len(self.phase_starts)):
                c = self._phase_counts(p - 1, self.phase_starts[p] - self.phase_starts[p - 1])
                bases.append([a + b for a, b in zip(bases[-1], c)])
            self._bases = bases
        return self._bases[phase]

    def phase_of(self, g: int) -> int:
        return bisect.bisect_right(self.phase_starts, g) - 1

    # ---- node-local partitions -----------------------------------------------
    def part_positions(self, r: int) -> int:
        """Positions of partition ``r`` per mixed epoch: ``p % P == r``."""
        return (self.epoch_size - r + self.partitions - 1) // self.partitions

    def part_count(self, r: int, g: int) -> int:
        """How many global positions ``< g`` belong to partition ``r``
        (position-in-epoch ``% P == r``): the partition's own global position."""
        e, p = divmod(max(0, int(g)), self.epoch_size)
        return e * self.part_positions(r) + max(0, (p - r + self.partitions - 1) // self.partitions)

    def part(self, r: int) -> MixPlan:
        """Partition ``r``'s own mixture (``partitions > 1``): the phases' weights,
        its own seed, its phases from its first position at or after each
        global phase start (snapped to its block boundaries)."""
        sub = self._parts.get(r)
        if sub is None:  # built on first use: a node builds only its own partitions' mixtures
            sub = self._parts[r] = self._make_part(r)
        return sub

    def _make_part(self, r: int) -> MixPlan:
        b = self.block
        first = self.phase_weights[0]
        later: List[Tuple[int, Weights]] = []
        for at, w in zip(self.phase_starts[1:], self.phase_weights[1:]):
            loc = -(-self.part_count(r, at) // b) * b  # the partition's block boundary
            if loc == 0:
                first, later = w, []
            elif later and later[-1][0] == loc:
                later[-1] = (loc, w)  # two phases on one local start: the later wins
            else:
                later.append((loc, w))
        return MixPlan(self.sizes, list(first), epoch_size=self.part_positions(r),
                       seed=mix(self.seed, _TAG_PART, r), phases=later, block=b)

    def where(self, epoch: int, position: int) -> Tuple[int, int, int]:
        """``(source, partition, q)`` of ``position`` in mixed epoch ``epoch``.

        ``q``: the index in that partition of the source's stream
        (:meth:`SourceStream.at`); partition ``p % P``'s mixture places it.

        Example:
            >>> mp = MixPlan([100, 10], weights=[3, 1], seed=1, partitions=2)
            >>> [mp.where(0, p)[1] for p in range(4)], sum(mp.delivered(0, 8))
            ([0, 1, 0, 1], 8)
        """
        if self.partitions == 1:
            src, q = self.locate_global(epoch * self.epoch_size + position)
            return src, 0, q
        r = position % self.partitions
        src, q = self.part(r).locate_global(epoch * self.part_positions(r) + position // self.partitions)
        return src, r, q

    def locate_global(self, g: int) -> Tuple[int, int]:
        """``(source, q)`` of global position ``g`` (``q``: index in the source's stream;
        with partitions, in its partition ``(g % epoch_size) % partitions``, see :meth:`where`)."""
        if g < 0:
            raise IndexError(f"negative mixture position {g}")
        if self.partitions > 1:
            src, _, q = self.where(*divmod(g, self.epoch_size))
            return src, q
        ph = self.phase_of(g)
        src, idx = self._phase_locate(ph, g - self.phase_starts[ph])
        return src, self._base(ph)[src] + idx

    def locate(self, epoch: int, position: int) -> Tuple[int, int]:
        """``(source, q)`` of ``position`` in mixed epoch ``epoch``."""
        return self.locate_global(epoch * self.epoch_size + position)

    def delivered_global(self, g: int) -> List[int]:
        """Per-source counts of positions ``0 .. g-1`` (all phases)."""
        if self.partitions > 1:
            return self._parts_sum("delivered_global", g)
        ph = self.phase_of(max(0, g))
        c = self._phase_counts(ph, max(0, g) - self.phase_starts[ph])
        return [a + b for a, b in zip(self._base(ph), c)]

    def _parts_sum(self, what: str, g: int) -> Any:
        """The per-source sum over the partitions of their own ``what`` up to global position ``g``."""
        return [sum(t) for t in zip(*(getattr(self.part(r), what)(self.part_count(r, g))
                                      for r in range(self.partitions)))]

    def delivered(self, epoch: int, position: int) -> List[int]:
        """Per-source counts delivered before ``position`` of ``epoch``."""
        return self.delivered_global(epoch * self.epoch_size + position)

    def expected_global(self, g: int) -> List[float]:
        """Per source, what the weights ask of positions ``0 .. g-1``: each phase's
        normalised weights over its span (with partitions: each partition's spans)."""
        if self.partitions > 1:
            return self._parts_sum("expected_global", g)
        ph = self.phase_of(max(0, g))
        want = [0.0] * len(self.sizes)
        for p, start in enumerate(self.phase_starts[:ph + 1]):
            end = self.phase_starts[p + 1] if p + 1 <= ph else g
            w = self.phase_weights[p]
            for i in range(len(want)):
                want[i] += (end - start) * w[i] / sum(w)
        return want

    def requested(self, g: int) -> List[float]:
        """The normalised weights in force at global position ``g``."""
        w = self.phase_weights[self.phase_of(g)]
        t = sum(w)
        return [x / t for x in w]

    def bounds(self, phase: int = 0) -> List[int]:
        """Per source ``d_i``: within a phase, ``|c_i(n) - n w_i| < d_i`` (0: exact).

        With ``P`` partitions the whole stream's is ``P d_i``."""
        sp = self.splitter(phase)
        return [self.partitions * sp.bound(i) for i in range(len(self.sizes))]

    def prefix_bounds(self, phase: int = 0) -> List[float]:
        """Per source, the bound on ``|c_i(n) - n w_i|`` over any prefix of a phase.

        ``d_i`` without blocks; with ``block=B``, ``3 d_i + B w_i (1 - w_i)``.
        """
        d = self.bounds(phase)
        if self.block == 1:
            return [float(x) for x in d]
        w = self.phase_weights[phase]
        t = sum(w)
        P = self.partitions  # d is already P d_i; the block term adds up per partition too
        return [3 * d[i] + P * self.block * (w[i] / t) * (1 - w[i] / t) for i in range(len(d))]

    def describe(self) -> Dict[str, Any]:
        """What the mixing depends on (journal config; ``partitions`` only when not 1)."""
        d: Dict[str, Any] = {"epoch_size": self.epoch_size, "seed": self.seed, "block": self.block,
                             "phases": [[s, w] for s, w in zip(self.phase_starts, self.phase_weights)]}
        if self.partitions != 1:
            d["partitions"] = self.partitions
        return d


# ---- one source's endless stream ------------------------------------------

def resampled_epoch(counts: Sequence[int], seed: int, epoch: int, shuffle: bool | str = True,
                    window: int = 8) -> Tuple[EpochPlan, List[int]]:
    """One epoch of shards drawn *with replacement* (webdataset's ``resampled=True``).

    Draws continue until the epoch holds exactly ``sum(counts)`` samples
    (the last cut short), so stream position ``q`` is in epoch ``q // N``.

    Returns the epoch's :class:`~resumewds.plan.EpochPlan` over *draws*, and ``draws``
    (``draws[d]``: the shard of draw ``d``).

    Example:
        >>> ep, draws = resampled_epoch([3, 3], seed=1, epoch=0, shuffle=False)
        >>> len(ep), all(0 <= d < 2 for d in draws)
        (6, True)
    """
    n = len(counts)
    total = sum(int(c) for c in counts)
    if n == 0 or total == 0:
        raise ValueError("resampling needs at least one shard with samples")
    # the one with-replacement routine (keyed.draw_shards), with the hash mixtures have used
    draws, taken = draw_shards(n, mix(seed, epoch, _TAG_RESAMPLE), sizes=counts, scheme="mixed")
    sizes = array("q", taken)
    algo = "window" if shuffle is True else ("none" if shuffle in (False, None) else str(shuffle))
    if algo == "window":
        ep = EpochPlan(sizes, range(len(draws)), window, mix(seed, epoch, _TAG_RWINDOW))
    else:  # "shards"/"none": draws are already in random order; samples in shard order
        ep = EpochPlan(sizes, range(len(draws)), 1, None)
    return ep, draws


class SourceStream:
    """A source's endless stream: index ``q`` -> ``(shard, sample_in_shard)``.

    Position ``q % N`` of the source's epoch ``q // N``: its own
    :class:`~resumewds.plan.Plan`, or :func:`resampled_epoch`.

    Example:
        >>> st = SourceStream([2, 2], seed=0, shuffle=False)
        >>> [st.at(q) for q in range(5)]
        [(0, 0), (0, 1), (1, 0), (1, 1), (0, 0)]
    """

    def __init__(self, counts: Sequence[int], seed: int = 0, shuffle: bool | str = True,
                 window: int = 8, resampled: bool = False, partitions: int = 1):
        self.counts = [int(c) for c in counts]
        self.total = sum(self.counts)
        if self.total < 1:
            raise ValueError("a mixture source needs at least one sample")
        self.partitions = P = check_partitions(partitions)
        if self.total < P:
            raise ValueError(f"a mixture source of {self.total} samples cannot be cut into "
                             f"partitions={P} (each partition needs a sample)")
        if not resampled and str(shuffle).startswith("resampled"):
            # the source's own resampled order, turned off by the mixture: its shuffle without draws
            shuffle = "window" if shuffle == "resampled_window" else "shards"
        self.seed, self.shuffle, self.window = int(seed), shuffle, int(window)
        self.resampled = bool(resampled)
        algo: bool | str = shuffle
        if resampled and P > 1:
            # the single data set's partitioned resampled order (plan.resampled_parts)
            algo = ("resampled_window" if shuffle in (True, "window", "manifest_window", "resampled_window")
                    else "resampled")
        self.plan = None if resampled and P == 1 else Plan(self.counts, seed, algo, window, partitions=P)
        c, rem = divmod(self.total, P)
        self.part_sizes = [c + (1 if r < rem else 0) for r in range(P)]
        self._res: Dict[int, Tuple[EpochPlan, List[int]]] = {}

    def epoch(self, r: int) -> Tuple[EpochPlan, Optional[List[int]]]:
        if self.plan is not None:
            return self.plan.epoch(r), None
        hit = self._res.get(r)
        if hit is None:
            hit = resampled_epoch(self.counts, self.seed, r, self.shuffle, self.window)
            if len(self._res) >= 2:
                self._res.pop(next(iter(self._res)))
            self._res[r] = hit
        return hit

    def at(self, q: int, part: int = 0) -> Tuple[int, int]:
        """``(shard, sample_in_shard)`` of index ``q`` of the stream of partition ``part``.

        Partition ``part``'s index ``q`` is position ``(q % size) * P + part``
        of source epoch ``q // size`` of the partitioned plan.

        Example:
            >>> st = SourceStream([2, 2], seed=0, shuffle=False, partitions=2)
            >>> [st.at(q, 1) for q in range(3)]
            [(1, 0), (1, 1), (1, 0)]
        """
        if self.partitions > 1:
            r, o = divmod(int(q), self.part_sizes[part])
            assert self.plan is not None
            return self.plan.epoch(r).sample_at(o * self.partitions + part)
        r, o = divmod(int(q), self.total)
        ep, draws = self.epoch(r)
        s, j = ep.sample_at(o)
        return (draws[s] if draws is not None else s), j

    def describe(self) -> Dict[str, Any]:
        algo = self.plan.algo if self.plan is not None and not self.resampled else str(self.shuffle)
        return {"seed": self.seed, "shuffle": algo, "window": self.window,
                "resampled": self.resampled}
