"""Sparse partial downloads: a shard filled by verified samples, in any order, by any process.

A remote shard with per-sample digests (manifest v3) on a ranged transport
is downloaded into a pre-sized file; each sample is checked against its
digest as its last byte arrives (:class:`~resumewds.cache.SampleSink`), the
bytes no sample covers by the whole-file xxh3_64.  The download
(:func:`fill`, under the download lock) asks for the gaps in order, in
sample-aligned pieces of at most :data:`PIECE` bytes; a reader that needs
samples sooner fetches them by range (:mod:`resumewds.read`) and keeps them here.

On disk, beside the entry::

    <entry>.sparse      the shard's bytes at their offsets (holes where none arrived yet)
    <entry>.sparse.map  append-only records of 40 bytes (little-endian): start, end,
                        a value, a tag, the xxh3_64 of the first 32 bytes

A record tagged with the shard's xxh3_64 says ``[start, end)`` is written and
verified; tagged xor :data:`CLAIM`, that a process (the value: its pid)
fetches it now; xor :data:`RELEASE`, that it no longer does (a claim counts
while its process lives, for at most :data:`CLAIM_TTL` seconds).  So
DataLoader workers fetch no byte twice.  Records are hints, never a reason
to trust bytes: a reader checks every sample it reads back, and the whole
file is hashed before it is published.  Writers hold the map's ``flock``
shared; :func:`publish` renames the file under it exclusive.

Example:
    >>> r = Ranges(); r.add(0, 10); r.add(20, 30); r.add(10, 12)
    >>> r.spans, r.covers(0, 12), r.missing(0, 40)
    ([(0, 12), (20, 30)], True, [(12, 20), (30, 40)])
"""

from __future__ import annotations

import bisect
import contextlib
import fcntl
import os
import struct
import threading
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Set, Tuple

import xxhash

from ..errors import CacheError, CorruptSample, RangeIgnored, TransientFetchError
from ..events import EventKind as K
from ..fetch import FetchBudget, FetchResult, RangeSink, fetch_range, is_remote_url, transport_for
from ..manifest import ShardInfo
from . import _layout as layout
from ._layout import NOFOLLOW, cache_error

#: the download asks for at most this many bytes per request (sample-aligned): between two
#: pieces it skips what readers fetched meanwhile
PIECE = 4 << 20
#: a writer records what it wrote at least every this many bytes (what a kill may lose)
RECORD_EVERY = 64 << 10
#: the tag of a claim record (bytes a process fetches now): the shard's xxh3_64 xor this
CLAIM = 0x636C61696D000001
#: ... of a release record (that fetch ended)
RELEASE = 0x72656C6561730002
#: another process's claim counts for at most this many seconds
CLAIM_TTL = 30.0

SUFFIX = ".sparse"
MAP_SUFFIX = ".sparse.map"
_REC = struct.Struct("<QQQQQ")  # start, end, value, tag, xxh3 of the first 32 bytes

_NO_RANGE: Set[str] = set()  # urls read whole instead (the server mishandles Range), this process


class SampleSink(RangeSink):
    """Bytes ``[start, end)`` of a shard, each sample checked against its digest as it arrives.

    A sample that matches goes to ``on_sample(j, offset, data)`` (progress of
    the fetch budget); bytes outside every sample go to ``on_raw(offset, data)``
    (the whole-file checksum covers them).  A sample that fails is left out and
    named by a :class:`~resumewds.errors.CorruptSample` at the body's end; the
    retry asks only for what is missing.  Callbacks copy what they keep.

    Example:
        >>> sink = SampleSink(shard, 0, 4096, budget, keep)       # doctest: +SKIP
        >>> fetch_range(shard.url, 0, 4096, budget=budget, sink=sink)   # doctest: +SKIP
        b''
    """

    def __init__(self, shard: Any, start: int, end: int, budget: Any,
                 on_sample: Callable[[int, int, memoryview], None],
                 on_raw: Optional[Callable[[int, memoryview], None]] = None):
        super().__init__(start, budget)
        assert shard.offsets is not None and shard.sample_digests is not None
        self.shard = shard
        self.on_sample = on_sample
        self.on_raw = on_raw
        self.todo: List[List[int]] = [[start, end]]  # what is still wanted, in order
        self.stop = start  # where the request under way ends
        self.buf = bytearray()
        self.bad: Optional[CorruptSample] = None  # the first sample of this request that arrived corrupt
        off = shard.offsets
        self.n = len(off) - 1
        self.first, self.last = int(off[0]), int(off[self.n])
        self.j = -1

    def wanted(self, end: int) -> Optional[Tuple[int, int]]:
        if not self.todo:
            return None
        self.at, self.stop = self.todo[0]
        return self.at, self.stop

    def restart(self) -> None:
        self.buf.clear()  # a retry asks again from the first byte not taken
        self.bad = None

    def write(self, offset: int, chunk: Any) -> None:
        self.buf += chunk
        self._take()

    def _unit(self) -> int:
        """Where the unit at :attr:`at` ends (a sample, or a run of uncovered bytes)."""
        at = self.at
        if at < self.first:
            return min(self.first, self.stop)
        if at >= self.last:
            return self.stop
        off = self.shard.offsets
        if self.j < 0 or self.j >= self.n or int(off[self.j]) != at:
            self.j = bisect.bisect_left(off, at, 0, self.n)
            if self.j >= self.n or int(off[self.j]) != at:
                raise ValueError(f"{self.shard.url}: byte {at} is not where a sample starts")
        return int(off[self.j + 1])

    def _take(self) -> None:
        used = 0
        with memoryview(self.buf) as mv:
            while self.at < self.stop:
                stop = self._unit()
                if self.at + (len(mv) - used) < stop:
                    break
                with mv[used:used + stop - self.at] as data:  # (the callbacks copy what they keep)
                    self._one(stop, data)
                used += stop - self.at
                self.at = stop
        if used:
            del self.buf[:used]

    def _one(self, stop: int, data: memoryview) -> None:
        """The unit ``[at, stop)``: a sample, checked and handed on, or uncovered bytes."""
        if not self.first <= self.at < self.last:
            if self.on_raw is not None:
                self.on_raw(self.at, data)
            self._done(self.at, stop)
            return
        j = self.j
        want = int(self.shard.sample_digests[j])
        got = xxhash.xxh3_64_intdigest(data)
        if got != want:
            if self.bad is None:
                self.bad = CorruptSample(
                    f"{self.shard.url}: sample {j} (bytes {self.at}-{stop}) arrived corrupt: xxh3_64 "
                    f"{got:016x}, the manifest says {want:016x}", self.shard.url, sample=j,
                    expected=format(want, "016x"), actual=format(got, "016x"))
            return  # still wanted: asked for again
        self.on_sample(j, self.at, data)
        self._done(self.at, stop)
        if self.budget is not None:
            self.budget.progress()

    def _done(self, a: int, b: int) -> None:
        """Bytes ``[a, b)`` are taken: out of :attr:`todo`."""
        k = next(i for i in range(len(self.todo) - 1, -1, -1) if self.todo[i][0] <= a)
        r = self.todo[k]
        if a == r[0]:
            r[0] = b
            if r[0] >= r[1]:
                self.todo.pop(k)
        else:  # a corrupt sample before it stays wanted: split the range
            self.todo[k:k + 1] = [[r[0], a]] + ([[b, r[1]]] if b < r[1] else [])

    def end(self) -> None:
        if self.buf:  # (a body of the length asked for always ends on a unit's end)
            raise TransientFetchError(f"{self.shard.url}: a range ended inside a sample "
                                      f"(byte {self.at + len(self.buf)})", self.shard.url)
        if self.bad is not None:
            raise self.bad


def record(a: int, b: int, value: int, tag: int) -> bytes:
    """The map's record of bytes ``[a, b)`` with ``value``, of the shard (or claim) ``tag``.

    Example:
        >>> len(record(0, 512, 7, 9))
        40
    """
    head = struct.pack("<QQQQ", a, b, value & 0xFFFFFFFFFFFFFFFF, tag & 0xFFFFFFFFFFFFFFFF)
    return head + struct.pack("<Q", xxhash.xxh3_64_intdigest(head))


class Ranges:
    """Sorted disjoint ``[start, end)`` byte ranges."""

    def __init__(self, spans: Optional[List[Tuple[int, int]]] = None) -> None:
        self.spans: List[Tuple[int, int]] = []
        self._total = 0
        for a, b in spans or []:
            self.add(a, b)

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


def _tag(shard: ShardInfo) -> int:
    return int(shard.xxh3_64 or "0", 16)


class Entry:
    """One shard's sparse partial as this process sees it; ``cond`` guards its state.

    Attributes:
        have: the ranges present (written, then added).
        claims: the ranges this process fetches now, ``token -> [next byte, end, by the download]``.
        downloading: this process's download of the shard is running.
    """

    def __init__(self, base: str, size: int, tag: int, offsets: Any = None):
        self.base = base
        self.offsets = offsets
        self.path = base + SUFFIX
        self.map = base + MAP_SUFFIX
        self.size = size
        self.tag = tag
        self.have = Ranges()
        self.claims: Dict[int, List[Any]] = {}
        self.downloading = False
        self.cond = threading.Condition()
        # other processes' claims: (start, end, pid) -> when it was seen
        self.foreign: Dict[Tuple[int, int, int], float] = {}
        self._read = 0
        self._ino: Optional[int] = None
        self._tokens = 0

    # ---- the map (call under ``cond``) -----------------------------------------------------
    def refresh(self) -> None:
        """Add the records appended to the map since the last look."""
        try:
            fd = os.open(self.map, os.O_RDONLY | NOFOLLOW)
        except OSError:
            return
        try:
            st = os.fstat(fd)
            if st.st_ino != self._ino:  # a new map (the partial discarded and started again)
                self._ino, self._read = st.st_ino, 0
                self.foreign = {}
            n = (st.st_size - self._read) // _REC.size * _REC.size
            if n > 0:
                raw = os.pread(fd, n, self._read)
                self._read += len(raw)
                claim, release, me, now = self.tag ^ CLAIM, self.tag ^ RELEASE, os.getpid(), time.time()
                for off in range(0, len(raw) - _REC.size + 1, _REC.size):
                    a, b, v, t, check = _REC.unpack_from(raw, off)
                    if check != xxhash.xxh3_64_intdigest(raw[off:off + 32]) or not 0 <= a < b <= self.size:
                        continue  # torn or nonsense: not trusted
                    if t == self.tag:
                        if self._aligned(a) and self._aligned(b):  # (an older writer's records may not be)
                            self.have.add(a, b)
                    elif t == claim and v & 0xFFFFFFFF != me:
                        self.foreign[(a, b, v & 0xFFFFFFFF)] = now
                    elif t == release:
                        self.foreign.pop((a, b, v & 0xFFFFFFFF), None)
        finally:
            os.close(fd)

    def _aligned(self, x: int) -> bool:
        """``x`` is a sample's boundary, or lies where no sample is (before the first, after the last)."""
        off = self.offsets
        if off is None:
            return True
        n = len(off) - 1
        if x <= int(off[0]) or x >= int(off[n]):
            return True
        k = bisect.bisect_left(off, x, 0, n)
        return int(off[k]) == x

    def foreign_claims(self) -> List[Tuple[int, int]]:
        """The ranges other processes fetch now (claimed within :data:`CLAIM_TTL`, alive, not released or present)."""
        if not self.foreign:
            return []
        now = time.time()
        out = []
        for key, seen in list(self.foreign.items()):
            a, b, pid = key
            if self.have.covers(a, b) or now - seen > CLAIM_TTL or not _alive(pid):
                del self.foreign[key]
            else:
                out.append((a, b))
        return out

    # ---- in flight in this process (call under ``cond``) -----------------------------------
    def claim(self, a: int, b: int, download: bool) -> int:
        self._tokens += 1
        self.claims[self._tokens] = [a, b, download]
        return self._tokens

    def release(self, token: int) -> None:
        self.claims.pop(token, None)
        self.cond.notify_all()

    def in_flight(self, a: int, b: int) -> bool:
        """Bytes ``[a, b)`` are being fetched now (by this process, or by another one)."""
        if any(pos <= a and b <= end for pos, end, _ in self.claims.values()):
            return True
        return any(x <= a and b <= y for x, y in self.foreign_claims())

    def busy(self) -> Ranges:
        """What is present or being fetched (by this process or another)."""
        r = Ranges(self.have.spans)
        for pos, end, _ in self.claims.values():
            r.add(pos, end)
        for a, b in self.foreign_claims():
            r.add(a, b)
        return r

    @contextlib.contextmanager
    def deciding(self, store: Any) -> Iterator[None]:
        """The map's lock, exclusive, while the caller decides what to fetch and announces its claim
        (never while it waits): one process at a time.  A no-op without a cache directory."""
        fd = -1
        try:
            if layout.lstat(self.base) is None:  # (published: nothing is fetched)
                store.ensure_dirs()
                fd = os.open(self.map, os.O_RDWR | os.O_CREAT | NOFOLLOW, 0o600)
                fcntl.flock(fd, fcntl.LOCK_EX)
                if layout.lstat(self.base) is not None:  # published between the look and the open
                    os.close(fd)
                    fd = -1
                    drop_stale(self.base)  # (the map this open may have created)
        except (OSError, CacheError):
            if fd >= 0:
                os.close(fd)
            fd = -1
        try:
            yield
        finally:
            if fd >= 0:
                os.close(fd)

    def announce(self, a: int, b: int, done: bool) -> None:
        """Tell other processes this one fetches ``[a, b)`` now (or, ``done``, no longer): a hint
        appended to an existing map, never created for it."""
        try:
            fd = os.open(self.map, os.O_WRONLY | os.O_APPEND | NOFOLLOW)
        except OSError:
            return
        try:
            os.write(fd, record(a, b, os.getpid(), self.tag ^ (RELEASE if done else CLAIM)))
        except OSError:
            pass  # a full disk: the claim is a hint
        finally:
            os.close(fd)


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # another user's: it exists
    return True


_STATES: Dict[str, Entry] = {}
_STATES_PID = os.getpid()
_REG = threading.Lock()


def entry(store: Any, shard: ShardInfo) -> Entry:
    """The shard's :class:`Entry` in this process (made on first use; its files may not exist yet)."""
    global _STATES_PID, _REG
    assert shard.size is not None
    if _STATES_PID != os.getpid():  # a forked child: the parent's conditions and claims are not its own
        _STATES.clear()
        _REG = threading.Lock()
        _STATES_PID = os.getpid()
    base = store.entry_path(shard.url)
    with _REG:
        e = _STATES.get(base)
        if e is None or e.size != shard.size or e.tag != _tag(shard):
            e = _STATES[base] = Entry(base, int(shard.size), _tag(shard), shard.offsets)
        return e


def eligible(store: Any, shard: ShardInfo) -> bool:
    """A shard filled by verified samples: remote, on a ranged transport, with size,
    xxh3_64, offsets and sample digests, on a server not seen to mishandle ``Range``."""
    if (shard.size is None or shard.xxh3_64 is None or shard.offsets is None or shard.sample_digests is None
            or shard.url in _NO_RANGE or not is_remote_url(shard.url) or not hasattr(store, "entry_path")):
        return False
    try:
        return bool(transport_for(shard.url).ranged)
    except Exception:  # an unknown scheme: not this path (the fetch reports it)
        return False


def lookup(store: Any, shard: ShardInfo) -> Optional[Entry]:
    """The shard's entry with what its map says now, or None when it is not filled by samples."""
    if not eligible(store, shard):
        return None
    e = entry(store, shard)
    with e.cond:
        e.refresh()
    return e


def stream_instead(url: str) -> None:
    """``url``'s server mishandles ``Range``: this process downloads it whole, streamed."""
    _NO_RANGE.add(url)


def read_present(e: Entry, shard: ShardInfo, js: List[int]) -> Dict[int, bytes]:
    """The samples ``js`` that the sparse partial holds, each checked against its digest
    (one that fails is left out: fetch it again)."""
    off, dig = shard.offsets, shard.sample_digests
    assert off is not None and dig is not None
    want = [j for j in js if e.have.covers(int(off[j]), int(off[j + 1]))]
    out: Dict[int, bytes] = {}
    if not want:
        return out
    try:
        fd = os.open(e.path, os.O_RDONLY | NOFOLLOW)
    except OSError:
        try:
            fd = os.open(e.base, os.O_RDONLY | NOFOLLOW)  # published meanwhile
        except OSError:
            return out
    try:
        for j in want:
            a, b = int(off[j]), int(off[j + 1])
            data = os.pread(fd, b - a, a)
            if len(data) == b - a and xxhash.xxh3_64_intdigest(data) == int(dig[j]):
                out[j] = data
    finally:
        os.close(fd)
    return out


def _may_create(store: Any, base: str) -> bool:
    """A reader may start a sparse partial: no cache budget, or the download has its room reserved."""
    if store.cache_size is None:
        return True
    pf = getattr(store, "_prefetch", None)
    return pf is not None and pf.reserved_for(base)


class Writer:
    """Verified bytes written into a shard's sparse partial, then recorded (one per request).

    Each write holds the map's lock shared and checks the map is still there (no
    byte lands in a published entry); runs are recorded every :data:`RECORD_EVERY`
    bytes and at close.  Once it cannot write it drops what it is given (a
    reader still delivers its samples); the download (``strict``) raises.
    """

    def __init__(self, store: Any, e: Entry, strict: bool = False):
        self.store = store
        self.e = e
        self.strict = strict
        self.ok = True
        self.kept = 0
        self.fd = -1
        self.mfd = -1
        self.run: Optional[List[int]] = None  # [start, end] of the run written since the last record
        self.hasher = xxhash.xxh3_64()

    def _open(self) -> bool:
        e = self.e
        try:
            if layout.lstat(e.path) is None:
                if layout.lstat(e.base) is not None:
                    return False  # published already
                if not self.strict and not _may_create(self.store, e.base):
                    return False
                self.store.ensure_dirs()
            mfd = os.open(e.map, os.O_WRONLY | os.O_APPEND | os.O_CREAT | NOFOLLOW, 0o600)
            self.mfd = mfd
            if os.fstat(mfd).st_nlink == 0:
                return False  # discarded meanwhile
            if layout.lstat(e.base) is not None:  # published meanwhile
                self._drop()
                drop_stale(e.base)  # (the map this open may have created)
                return False
            fd = os.open(e.path, os.O_RDWR | os.O_CREAT | NOFOLLOW, 0o600)
            self.fd = fd
            size = os.fstat(fd).st_size
            if size == 0:
                os.ftruncate(fd, e.size)
            elif size != e.size:
                return False  # another version's leftover: the download starts it again
        except OSError as exc:
            self._drop()
            if self.strict:
                raise cache_error(exc, e.path, "write the sparse partial") from exc
            return False
        return True

    def put(self, a: int, data: Any) -> None:
        """Write the verified bytes ``data`` at offset ``a`` (and make them visible in this process)."""
        if not self.ok:
            return
        if self.fd < 0 and not self._open():
            self.ok = False
            self._drop()
            if self.strict:
                raise CacheError(f"{self.e.path}: cannot write the sparse partial (published or removed meanwhile)")
            return
        try:
            if self.run is not None and self.run[1] != a:
                self.flush()
            fcntl.flock(self.mfd, fcntl.LOCK_SH)
            try:
                if os.fstat(self.mfd).st_nlink == 0:  # published or discarded meanwhile
                    raise FileNotFoundError(2, "the sparse partial is gone")
                os.pwrite(self.fd, data, a)
            finally:
                fcntl.flock(self.mfd, fcntl.LOCK_UN)
        except OSError as exc:
            self.ok = False
            self._drop()
            if self.strict:
                raise cache_error(exc, self.e.path, "write the download") from exc
            return
        n = len(data)
        if self.run is None:
            self.run = [a, a]
        self.run[1] = a + n
        self.hasher.update(data)
        self.kept += n
        with self.e.cond:
            self.e.have.add(a, a + n)
            self.e.cond.notify_all()
        if self.run[1] - self.run[0] >= RECORD_EVERY:
            self.flush()

    def flush(self) -> None:
        """Record the run written since the last record (the bytes are in the file)."""
        run, self.run = self.run, None
        if run is None or self.mfd < 0:
            self.hasher.reset()
            return
        rec = record(run[0], run[1], self.hasher.intdigest(), self.e.tag)
        self.hasher.reset()
        try:
            os.write(self.mfd, rec)  # one write of 40 bytes, appended whole
        except OSError as exc:
            if self.strict:
                raise cache_error(exc, self.e.map, "record the download") from exc

    def _drop(self) -> None:
        for name in ("fd", "mfd"):
            fd = getattr(self, name)
            if fd >= 0:
                try:
                    os.close(fd)
                except OSError:
                    pass
                setattr(self, name, -1)

    def close(self) -> None:
        """Record what is left and let go of the files."""
        try:
            if self.ok:
                self.flush()
        finally:
            self._drop()

    def __enter__(self) -> Writer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _piece(shard: ShardInfo, a: int, b: int) -> int:
    """Where a piece of the gap ``[a, b)`` ends: at most :data:`PIECE` bytes on, on a sample boundary."""
    if b - a <= PIECE:
        return b
    off = shard.offsets
    assert off is not None
    n = len(off) - 1
    want = a + PIECE
    if want <= int(off[0]) or want >= int(off[n]):
        return min(b, max(want, int(off[0]) if want <= int(off[0]) else int(off[n])))
    k = bisect.bisect_right(off, want, 0, n + 1) - 1  # the last sample start at or before want
    end = int(off[k])
    if end <= a:
        end = int(off[k + 1])
    return min(b, end)


class _Skip(Exception):
    """The rest of a piece is present, or another process fetches it now: stop it here."""


#: a download looks at the map for what other processes brought at least every this many bytes
LOOK_EVERY = 256 << 10


def _skipping(e: Entry, w: Writer) -> Any:
    """The download's sample callback: write it, and every :data:`LOOK_EVERY` bytes stop the
    piece (:class:`_Skip`) when what follows is present or another process fetches it."""
    seen = [0]

    def put(j: int, a: int, data: Any) -> None:
        w.put(a, data)
        seen[0] += len(data)
        if seen[0] < LOOK_EVERY:
            return
        seen[0] = 0
        off = e.offsets
        nxt = j + 1
        if off is None or nxt >= len(off) - 1:
            return
        x, y = int(off[nxt]), int(off[nxt + 1])
        with e.cond:
            e.refresh()
            if e.have.covers(x, y) or any(ca <= x and y <= cb for ca, cb in e.foreign_claims()):
                raise _Skip()

    return put


def fill(store: Any, shard: ShardInfo, base: str, budget: FetchBudget) -> Optional[FetchResult]:
    """Fetch every byte of the sparse partial that no record covers and no reader of this
    process fetches (under the download lock), each sample checked as it arrives.

    Returns the :class:`~resumewds.fetch.FetchResult`, or None when the server
    does not serve ``Range`` (the partial is discarded: download it streamed).
    A piece that fails its own attempts while the shard's budget holds (its
    readers progressed) is asked for again.  Raises what the fetch budget's end
    raises, or CacheError.
    """
    e = entry(store, shard)
    url = shard.url
    t0 = time.monotonic()
    with e.cond:
        e.refresh()
        kept = e.have.total()
        e.downloading = True
    store.emit(K.FETCH_START, url, resumed_from=kept, sparse=True)
    received = requests = 0
    cursor = 0
    session = store.session()
    try:
        while True:
            with e.cond:
                with e.deciding(store):
                    e.refresh()
                    gaps = e.busy().missing(0, e.size)
                    if gaps:
                        a, b = next(((x, y) for x, y in gaps if y > cursor), gaps[0])
                        b = _piece(shard, a, b)
                        token = e.claim(a, b, True)
                        e.announce(a, b, False)
                if not gaps:
                    if not e.have.missing(0, e.size):
                        break
                    # only readers' ranges left (this process's, or another's): their bytes, or their gaps
                    e.cond.wait(0.05)
                    continue
            w = Writer(store, e, strict=True)
            try:
                sink = SampleSink(shard, a, b, budget, on_sample=_skipping(e, w), on_raw=w.put)
                fetch_range(url, a, b, config=store.fetch, budget=budget, session=session, sink=sink,
                            on_event=store.emit)
                requests += 1
            except _Skip:
                requests += 1  # the rest of the piece is there already (another process's reader): the next gap
            except TransientFetchError as exc:
                requests += 1
                if isinstance(budget.last_error, CorruptSample) or exc.status == 206 or budget.exhausted:
                    raise
                # the piece's own faults in a row, while the shard's readers progressed (its budget
                # holds): bad luck on one request; the piece again, as a new request
                store.emit(K.RETRY, url, attempt=0, error=str(exc), wait=0.0)
                continue
            finally:
                received += w.kept
                try:
                    w.close()
                finally:
                    with e.cond:
                        e.release(token)
                    e.announce(a, b, True)
            cursor = b
    except RangeIgnored:
        stream_instead(url)
        discard(base)
        return None
    finally:
        with e.cond:
            e.downloading = False
            e.cond.notify_all()
    digest = layout.hash_file(e.path)[1]  # the assembled file, in order, once
    seconds = time.monotonic() - t0
    store.emit(K.FETCH_DONE, url, bytes=received, seconds=seconds, resumed_from=kept, sparse=True,
               requests=requests)
    return FetchResult(url=url, path=e.path, size=e.size, bytes=received, resumed_from=kept, seconds=seconds,
                       attempts=requests, xxh3_64=digest)


def publish(base: str) -> None:
    """Rename the finished sparse partial to ``base`` and drop its map, the map locked exclusive."""
    mfd = layout.open_file(base + MAP_SUFFIX, os.O_RDWR | os.O_CREAT, "open the sparse map")
    try:
        fcntl.flock(mfd, fcntl.LOCK_EX)
        try:
            os.replace(base + SUFFIX, base)
        except OSError as exc:
            raise cache_error(exc, os.path.dirname(base), "publish the download") from exc
        layout.remove(base + MAP_SUFFIX)
    finally:
        os.close(mfd)
    _forget(base)


def drop_stale(base: str) -> bool:
    """Remove a map left beside a published entry (a kill inside :func:`publish`); whether one was."""
    if (layout.lstat(base + MAP_SUFFIX) is None or layout.lstat(base + SUFFIX) is not None
            or layout.lstat(base) is None):
        return False  # (a map alone, no file yet: readers' claims of a partial about to start)
    try:
        mfd = os.open(base + MAP_SUFFIX, os.O_RDWR | NOFOLLOW)
    except OSError:
        return False
    try:
        fcntl.flock(mfd, fcntl.LOCK_EX)
        if layout.lstat(base + SUFFIX) is not None or os.fstat(mfd).st_nlink == 0:
            return False  # a reader started a sparse partial meanwhile, or gone already
        layout.remove(base + MAP_SUFFIX)
    finally:
        os.close(mfd)
    _forget(base)
    return True


def discard(base: str) -> None:
    """Remove the sparse partial and its map (start again, or read the shard whole)."""
    try:
        mfd = os.open(base + MAP_SUFFIX, os.O_RDWR | NOFOLLOW)
    except OSError:
        mfd = -1
    try:
        if mfd >= 0:
            fcntl.flock(mfd, fcntl.LOCK_EX)
        layout.remove(base + SUFFIX)
        layout.remove(base + MAP_SUFFIX)
    finally:
        if mfd >= 0:
            os.close(mfd)
    _forget(base)


def _forget(base: str) -> None:
    with _REG:
        e = _STATES.pop(base, None)
    if e is not None:
        with e.cond:
            e.cond.notify_all()  # (its bytes are in the published entry now, or gone)
