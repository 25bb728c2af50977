"""Keyed randomness of the order: every random choice is a hash of integers.

Each is xxh3_64 of packed integers (no :mod:`random`, no RNG state, no hash
randomisation): the same key gives the same answer on any machine and Python.
"""

from __future__ import annotations

import struct
from typing import List, Optional, Sequence, Tuple

import xxhash

__all__ = ["DRAW_SCHEMES", "FeistelPermutation", "draw_shards", "mix", "permutation"]

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

    A 4-round Feistel network on the bit width of ``m - 1`` (round function:
    keyed xxh3_64 of one half), cycle-walked onto ``range(m)`` (fewer than
    two passes on average).

    Example:
        >>> p = FeistelPermutation(10, key=5)
        >>> sorted(p[i] for i in range(10)) == list(range(10))
        True
    """

    __slots__ = ("m", "a", "b", "keys", "_pack", "_rounds", "_mask_b", "_tables")
    ROUNDS = 4
    #: halves of at most this many bits: each round function is tabulated once
    #: (about 4 * sqrt(2m) hashes) instead of 4 hashes per lookup
    TABLE_BITS = 12

    def __init__(self, m: int, key: int):
        self.m = int(m)
        bits = max(2, (self.m - 1).bit_length())
        self.a = bits // 2          # bits of the left half
        self.b = bits - self.a      # bits of the right half
        self.keys = [mix(key, r) for r in range(self.ROUNDS)]
        self._pack = struct.Struct("<Q").pack
        # round r's key and the mask of its new right half (the halves swap widths every round)
        self._mask_b = (1 << self.b) - 1
        self._rounds = [(k, (1 << (self.a if r % 2 == 0 else self.b)) - 1) for r, k in enumerate(self.keys)]
        # round r's function over every value of its input half (what __getitem__ would hash)
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



#: the draw hashes of :func:`draw_shards`: ``"seeded"`` is xxh3_64 of the draw
#: number keyed by ``key`` (single data sets' ``resampled=True``), ``"mixed"`` is
#: :func:`mix` of ``(key, draw)`` (a mixture's resampled source); each order keeps its own.
DRAW_SCHEMES = ("seeded", "mixed")


def draw_shards(n: int, key: int, *, sizes: Optional[Sequence[int]] = None,
                scheme: str = "seeded") -> Tuple[List[int], List[int]]:
    """Draw shards (or any ``n`` units) with replacement: the one resampling routine.

    Draw ``d`` picks unit ``hash(d) mod n`` (:data:`DRAW_SCHEMES`).  Without
    ``sizes``: ``n`` draws, ``taken`` empty.  With ``sizes``: draws until they
    hold exactly ``sum(sizes)`` samples (empty units skipped, the last draw
    cut short); ``taken`` is the samples of each draw.

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
