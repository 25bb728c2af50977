"""A sparse partial's map as one process sees it: the ranges present, the ranges in flight.

:class:`SparseState` (one per shard and process, :mod:`resumewds.cache.sparse`)
reads ``<entry>.sparse.map`` as it grows.  Its records (40 bytes: start, end,
a value, a tag, the record's own xxh3_64) are of three kinds, told by the tag:

* the shard's xxh3_64: bytes ``[start, end)`` are in the file, their xxh3_64
  the value (appended only after the bytes were written);
* that tag xor :data:`CLAIM`: a process (its pid and the time, the value) is
  fetching ``[start, end)`` now -- a download's piece or a ranged read --,
  so that another process's download leaves it out and its readers wait for
  it rather than fetch it a second time (DataLoader workers share the cache,
  not their threads);
* that tag xor :data:`RELEASE`: that claim ended without its bytes (a failed
  request): they may be fetched by anyone.

A claim is a hint, never a reason to trust bytes: it counts while its
process lives, its range is not present and it is younger than
:data:`CLAIM_TTL`; a kill -9 leaves claims nobody honours for long.  Bytes
are trusted by the first kind only, each re-hashed by the download when it
opens the partial, and every sample is checked by its reader.

Example:
    >>> r = Ranges(); r.add(0, 10); r.add(20, 30); r.add(10, 12)
    >>> r.spans, r.covers(0, 12), r.missing(0, 40)
    ([(0, 12), (20, 30)], True, [(12, 20), (30, 40)])
"""

from __future__ import annotations

import bisect
import itertools
import os
import struct
import threading
import time
from typing import Any, Dict, List, Optional, Tuple

import xxhash

from .layout import NOFOLLOW
from .sparsepieces import record

__all__ = ["CLAIM", "CLAIM_TTL", "RELEASE", "Ranges", "SparseState"]

#: the tag of a claim record: the shard's xxh3_64 xor this
CLAIM = 0x636C61696D000001
#: ... of a release record
RELEASE = 0x72656C6561730002
#: a claim of another process counts for at most this many seconds
CLAIM_TTL = 30.0

SUFFIX = ".sparse"
MAP_SUFFIX = ".sparse.map"
_REC = struct.Struct("<QQQQQ")  # start, end, value, tag, xxh3 of the first 32 bytes
_TOKENS = itertools.count(1)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # another user's: it exists
    return True


class Ranges:
    """Sorted disjoint ``[start, end)`` byte ranges."""

    def __init__(self, spans: Optional[List[Tuple[int, int]]] = None) -> None:
        self.spans: List[Tuple[int, int]] = list(spans or [])
        self._total = sum(b - a for a, b in self.spans)

    def add(self, a: int, b: int) -> None:
        if b <= a:
            return
        s = self.spans
        i = bisect.bisect_left(s, (a, a))
        if i and s[i - 1][1] >= a:
            i -= 1
        j = i
        gone = 0
        while j < len(s) and s[j][0] <= b:
            a, b = min(a, s[j][0]), max(b, s[j][1])
            gone += s[j][1] - s[j][0]
            j += 1
        s[i:j] = [(a, b)]
        self._total += b - a - gone

    def covers(self, a: int, b: int) -> bool:
        i = bisect.bisect_right(self.spans, (a, float("inf"))) - 1
        return i >= 0 and self.spans[i][0] <= a and b <= self.spans[i][1]

    def missing(self, lo: int, hi: int) -> List[Tuple[int, int]]:
        out: List[Tuple[int, int]] = []
        at = lo
        s = self.spans
        for k in range(max(0, bisect.bisect_right(s, (lo, float("inf"))) - 1), len(s)):
            a, b = s[k]
            if b <= at:
                continue
            if a >= hi:
                break
            if a > at:
                out.append((at, min(a, hi)))
            at = max(at, b)
        if at < hi:
            out.append((at, hi))
        return out

    def total(self) -> int:
        return self._total


class SparseState:
    """One process's view of a shard's sparse partial: what is present, what is in flight.

    Attributes:
        path: the ``.sparse`` file.
        size, tag: the shard's size and xxh3_64 (records of another shard are ignored).
        have: the ranges present (written before being added).
        claims: ranges in flight, ``token -> [next byte, end, is download]``.
        foreign: ranges other processes claimed, ``(start, end, pid) -> when`` (see :meth:`foreign_claims`).
        verified: the records were re-hashed by a download of this process
            (else ``have`` is a hint: readers check each sample anyway).
        cond: guards all of the above.
    """

    def __init__(self, base: str, size: int, tag: int):
        self.base = base
        self.path = base + SUFFIX
        self.map = base + MAP_SUFFIX
        self.size = size
        self.tag = tag
        self.have = Ranges()
        self.claims: Dict[int, List[Any]] = {}
        self.verified = False
        self.ranged_at = -1e9  # when a ranged read of the shard last started (monotonic)
        self.dl_rate = 0.0  # bytes/s of this process's download's current request
        self.map_read = 0
        self.map_ino: Optional[int] = None
        self.foreign: Dict[Tuple[int, int, int], float] = {}
        self.cond = threading.Condition()

    # ---- the map -------------------------------------------------------------------------
    def refresh(self) -> None:
        """Add the records appended to the map since the last look (under ``cond``)."""
        try:
            fd = os.open(self.map, os.O_RDONLY | NOFOLLOW)
        except OSError:
            return
        try:
            st = os.fstat(fd)
            if st.st_ino != self.map_ino:  # a new map (rewritten, or discarded and started again)
                self.map_ino, self.map_read = st.st_ino, 0
            n = (st.st_size - self.map_read) // _REC.size * _REC.size
            if n > 0:
                raw = os.pread(fd, n, self.map_read)
                self.map_read += len(raw)
                self._add(raw)
        finally:
            os.close(fd)

    def parse(self, raw: bytes, tag: Optional[int] = None) -> List[Tuple[int, int, int]]:
        """The records of ``raw`` that are whole, of this shard (or of ``tag``) and
        within it: ``(start, end, value)``."""
        want = self.tag if tag is None else tag
        out = []
        for off in range(0, len(raw) - _REC.size + 1, _REC.size):
            a, b, dig, t, check = _REC.unpack_from(raw, off)
            if check != xxhash.xxh3_64_intdigest(raw[off:off + 32]) or t != want or not 0 <= a < b <= self.size:
                continue  # torn, of another shard or kind, or nonsense: not trusted
            out.append((a, b, dig))
        return out

    def _add(self, raw: bytes) -> None:
        me = os.getpid()
        claim, release = self.tag ^ CLAIM, self.tag ^ RELEASE
        for off in range(0, len(raw) - _REC.size + 1, _REC.size):
            a, b, v, t, check = _REC.unpack_from(raw, off)
            if (t not in (self.tag, claim, release) or not 0 <= a < b <= self.size
                    or check != xxhash.xxh3_64_intdigest(raw[off:off + 32])):
                continue  # of another shard, nonsense, or torn: not trusted
            if t == self.tag:
                self.have.add(a, b)
            elif v & 0xFFFFFFFF != me:
                if t == claim:
                    self.foreign[(a, b, v & 0xFFFFFFFF)] = float(v >> 32)
                else:
                    self.foreign.pop((a, b, v & 0xFFFFFFFF), None)

    def foreign_claims(self, a: int = 0, b: int = -1) -> List[Tuple[int, int]]:
        """The ranges (overlapping ``[a, b)``) another live process is fetching now:
        claimed less than :data:`CLAIM_TTL` ago, not released, not present yet (under ``cond``)."""
        if not self.foreign:
            return []
        b = self.size if b < 0 else b
        now = time.time()
        out = []
        for key, t in list(self.foreign.items()):
            ca, cb, pid = key
            if self.have.covers(ca, cb) or now - t > CLAIM_TTL or not _alive(pid):
                del self.foreign[key]
            elif ca < b and a < cb:
                out.append((ca, cb))
        return out

    def announce(self, a: int, b: int, done: bool) -> None:
        """Tell the other processes that this one fetches ``[a, b)`` now (or, ``done``,
        no longer): a record appended to an existing map (a hint: never created for it)."""
        value = os.getpid() | (0 if done else int(time.time()) << 32)
        try:
            fd = os.open(self.map, os.O_WRONLY | os.O_APPEND | NOFOLLOW)
        except OSError:
            return
        try:
            os.write(fd, record(a, b, value, self.tag ^ (RELEASE if done else CLAIM)))
        except OSError:
            pass  # a full disk: the claim is a hint
        finally:
            os.close(fd)

    def claim(self, a: int, b: int, download: bool) -> int:
        token = next(_TOKENS)
        self.claims[token] = [a, b, download]
        return token

    def release(self, token: int) -> None:
        self.claims.pop(token, None)
        self.cond.notify_all()

    def download_claim(self, a: int, b: int) -> Optional[int]:
        """How many bytes a download of this process still has to write before
        ``[a, b)`` is in (it is writing them now), or None."""
        for pos, end, dl in self.claims.values():
            if dl and pos <= b and a < end and b <= end:
                return max(0, b - pos)
        return None

    def claimed(self, a: int, b: int) -> bool:
        return any(pos < b and a < end for pos, end, _ in self.claims.values())


