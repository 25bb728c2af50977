"""Sparse partial downloads: a shard filled by verified ranges, in any order.

With :data:`SPARSE_PARTIALS` on (the default), a remote shard whose manifest has
sample digests (v3), read by range in this process (``store.ranged_fill``,
set by :func:`resumewds.reading.declare`), on a server that honours
``Range``, is downloaded into a pre-sized (sparse) file instead of
a streamed ``.partial``, so that the samples the reader fetched by range
(:mod:`resumewds.reading`, verified against their digests) are written
there and never downloaded again::

    <entry>.sparse      the shard's bytes at their offsets (holes where none arrived yet)
    <entry>.sparse.map  append-only records, one per range present:
                        start, end, xxh3_64 of the range, the shard's xxh3_64, and the
                        record's own xxh3_64 (40 bytes, little-endian); and the
                        claims of ranges being fetched (:mod:`resumewds.cache.sparsemap`)

A ranged read (:func:`fetch_around`, :func:`keep_verified`) claims its range,
writes the samples of its range that match their digests, *then* appends
their record, under the map's ``flock`` shared, and only then gives the
claim back.  The download (:func:`download`, under the entry's download
lock) asks only for the gaps no record covers and no ranged read has in
flight (claims in a :class:`SparseState`, shared with this process's
readers, who wait for bytes it is writing now, and claim records in the map
for the other processes'), in pieces over several connections at once
(:mod:`resumewds.cache.sparsepieces`), each recorded every
:data:`RECORD_EVERY` bytes; it hashes the whole file in order once
complete, and the caller checks and repairs it before :func:`publish` renames
it under the map's ``flock`` exclusive (a map a kill leaves after that
rename is dropped by the next download of the entry: :func:`drop_stale`).
A record follows its bytes, every record's range is re-hashed when the
download reopens the file (a machine crash may lose unsynced bytes), readers
check every sample and the whole file is checked before it is published: a
corrupt block is never trusted.  docs/DIGESTS.md has the rules and the figures.

Example:
    >>> r = Ranges(); r.add(0, 10); r.add(20, 30); r.add(10, 12)
    >>> r.spans, r.covers(0, 12), r.missing(0, 40)
    ([(0, 12), (20, 30)], True, [(12, 20), (30, 40)])
"""

from __future__ import annotations

import bisect
import fcntl
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

import xxhash

from .. import config as _config
from ..errors import CacheError
from ..events import EventKind as K
from ..fetch import FetchBudget, FetchResult, is_remote_url
from ..manifest import ShardInfo
from ..schemes import is_remote_object
from ..storeapi import StoreAPI
from . import layout, sparsepieces
from .layout import NOFOLLOW, cache_error
from .sparsemap import _REC, MAP_SUFFIX, SUFFIX, Ranges, SparseState
from .sparsepieces import RECORD_EVERY, fetch_pieces, record

__all__ = ["BUSY_CHUNK", "BUSY_SECONDS", "CHUNK", "FIRST_WAIT", "ISLAND", "RECORD_EVERY", "Ranges", "SPARSE_PARTIALS",
           "SparseState", "WAIT_STALL", "discard", "download", "drop_stale", "eligible", "fetch_around",
           "keep_verified", "lookup", "publish", "stream_instead", "verified_spans"]

#: fill shards by ranges into a sparse partial: True / False, or None (the default):
#: ``RESUMEWDS_SPARSE_PARTIALS`` (default on; ``0``: off, the download fetches the
#: ranged reads' bytes a second time, up to 1.4x the data set; docs/DIGESTS.md)
SPARSE_PARTIALS: Optional[bool] = None
#: one request of the background download asks for at most this many bytes (no ranged reads going on)
CHUNK = 1 << 30
#: ... and at most this many while ranged reads of the shard go on (within :data:`BUSY_SECONDS`):
#: a reader waits for a sample in the range being written rather than fetching it a second time
#: (2 MB: with 1 MB the extra requests cost a shuffled cold epoch more than the shorter waits save)
BUSY_CHUNK = 2 << 20
#: ranged reads of a shard this recent make its download ask for :data:`BUSY_CHUNK` at a time
BUSY_SECONDS = 1.0
#: a ranged read waiting for the download to write its bytes gives up after this long without progress
WAIT_STALL = 1.0
#: ... and, for the first samples of an iteration, only when the download is about as close to
#: their end as a request of their own: at most this many seconds (at the download's rate, at
#: least 64 kB) more to write than that request would fetch (about a request's first-byte latency)
FIRST_WAIT = 0.01
#: missing ranges separated by a present island shorter than this are fetched in one request
ISLAND = 4096

_NO_RANGE: Set[str] = set()  # urls whose server answered a Range request wrongly (this process)


def _tag(shard: ShardInfo) -> int:
    return int(shard.xxh3_64 or "0", 16)


_STATES: Dict[str, SparseState] = {}
_REG = threading.Lock()
_KEEPER: Any = None  # writes the first step's ranges into sparse partials after they were delivered


def _after_fork() -> None:
    global _REG, _KEEPER
    _REG = threading.Lock()
    _KEEPER = None
    _STATES.clear()  # claims and conditions of the parent's threads do not cross a fork


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


def _state(base: str, shard: ShardInfo) -> SparseState:
    assert shard.size is not None
    with _REG:
        st = _STATES.get(base)
        if st is None or st.size != shard.size or st.tag != _tag(shard):
            st = _STATES[base] = SparseState(base, int(shard.size), _tag(shard))
        return st


def eligible(store: StoreAPI, shard: ShardInfo) -> bool:
    """A shard filled by ranges: the store's reader reads by range
    (``store.ranged_fill``), and the shard is remote (http/s3), with its size,
    xxh3_64, offsets and sample digests, on a server not seen to mishandle ``Range``."""
    return (_config.sparse_partials(SPARSE_PARTIALS) and getattr(store, "ranged_fill", False)
            and is_remote_object(shard.url) and is_remote_url(shard.url)
            and shard.size is not None and shard.xxh3_64 is not None and shard.offsets is not None
            and shard.sample_digests is not None and shard.url not in _NO_RANGE)


def lookup(store: StoreAPI, shard: ShardInfo) -> Optional[SparseState]:
    """The shard's sparse partial as this process sees it (its map read up to
    now), or None when there is none (read the ``.partial`` or by range)."""
    if not eligible(store, shard):
        return None
    base = store.entry_path(shard.url)
    with _REG:
        st = _STATES.get(base)
    if st is None:
        if layout.lstat(base + MAP_SUFFIX) is None or layout.lstat(base + SUFFIX) is None:
            return None  # none, or a map left by a kill after its file was published (drop_stale)
        st = _state(base, shard)
    with st.cond:
        st.refresh()
    return st


def _may_create(store: Any, base: str) -> bool:
    """A ranged read may start a sparse partial: no cache budget, or the shard's
    download has its room reserved (else its bytes would not be counted)."""
    if store.cache_size is None:
        return True
    pf = getattr(store, "_prefetch", None)
    return pf is not None and pf.reserved_for(base)


# ---- the ranged reads' side ----------------------------------------------------------------

def fetch_around(store: Any, shard: ShardInfo, lo: int, hi: int, fetch: Callable[[int, int], bytes],
                 patient: bool = True, keep: Optional[Callable[[bytes], Any]] = None) -> bytes:
    """Bytes ``[lo, hi)`` of ``shard`` for a ranged read: ``fetch(a, b)`` asks the
    server for the parts that are not in the shard's sparse partial; the
    others are read from it.  While they are fetched this process's download
    leaves them out; a part the download is writing now is waited for (at most
    :data:`BUSY_CHUNK` at its rate), never fetched twice; not ``patient``
    (the first samples of an iteration), only when the download is about as
    close to their end as a request of their own would be.  The caller checks
    every sample's digest, whatever its bytes came from; ``keep(data)`` (the
    caller's :func:`keep_verified`) runs before the download may ask for these
    bytes again: a gap is never handed back before its bytes are recorded.

    Example:
        >>> fetch_around(store, shard, 512, 4096, lambda a, b: b"\0" * (b - a))[:4]   # doctest: +SKIP
        b'\x00\x00\x00\x00'
    """
    if not eligible(store, shard) or not hasattr(store, "entry_path"):
        return fetch(lo, hi)
    st = _state(store.entry_path(shard.url), shard)
    with st.cond:
        st.ranged_at = time.monotonic()
        token = st.claim(lo, hi, False)  # from now on the download leaves these bytes out
        st.announce(lo, hi, False)  # ... and another process's download too
        if patient:
            st.refresh()  # what other processes fetched, and fetch now
        t_last, last = time.monotonic(), st.have.total()
        slack = max(64 << 10, int(st.dl_rate * FIRST_WAIT))
        while any(dl and pos < hi and lo < end and (patient or hi - pos <= hi - lo + slack)
                  for pos, end, dl in st.claims.values()) or (patient and st.foreign_claims(lo, hi)):
            now, total = time.monotonic(), st.have.total()
            if total > last:
                t_last, last = now, total
            elif now - t_last > WAIT_STALL:
                break  # a download that does not progress: fetch the bytes ourselves
            st.cond.wait(0.01)
            st.refresh()  # another process's bytes arrive through the map
        parts = st.have.missing(lo, hi)
        verified = st.verified
    later = False
    try:
        data = _around(st, lo, hi, parts, fetch)
        if not verified:  # another process's records: each sample checked, those that fail fetched
            data = _checked(shard, lo, hi, data, parts, fetch)
        if keep is not None and not patient:  # the first batch does not wait for the writing
            _keeper().submit(_keep_then_release, st, token, keep, data, lo, hi)
            later = True
        elif keep is not None:
            keep(data)  # recorded while still claimed
        return data
    finally:
        if not later:
            _release(st, token, lo, hi)


def _release(st: SparseState, token: int, lo: int, hi: int) -> None:
    with st.cond:
        st.release(token)  # only now may the download ask for these bytes
    st.announce(lo, hi, True)


def _checked(shard: ShardInfo, lo: int, hi: int, data: bytes, parts: List[Tuple[int, int]],
             fetch: Callable[[int, int], bytes]) -> bytes:
    """``data`` with every sample not wholly fetched (``parts``) checked against its
    digest, and fetched when it fails (bytes of a sparse partial no download of
    this process re-hashed)."""
    if parts == [(lo, hi)]:
        return data
    off, dig = shard.offsets, shard.sample_digests
    assert off is not None and dig is not None
    fetched = Ranges(list(parts))
    buf: Optional[bytearray] = None
    n = len(off) - 1
    j = bisect.bisect_left(off, lo, 0, n)
    while j < n and int(off[j + 1]) <= hi:
        a, b = int(off[j]), int(off[j + 1])
        if not fetched.covers(a, b) and xxhash.xxh3_64_intdigest(memoryview(data)[a - lo:b - lo]) != int(dig[j]):
            if buf is None:
                buf = bytearray(data)
            buf[a - lo:b - lo] = fetch(a, b)
        j += 1
    return data if buf is None else bytes(buf)


def _keeper() -> Any:
    global _KEEPER
    with _REG:
        if _KEEPER is None:
            _KEEPER = ThreadPoolExecutor(1, thread_name_prefix="resumewds-keep")
        return _KEEPER


def _keep_then_release(st: SparseState, token: int, keep: Callable[[bytes], Any], data: bytes,
                       lo: int, hi: int) -> None:
    try:
        keep(data)
    finally:
        _release(st, token, lo, hi)


def _around(st: SparseState, lo: int, hi: int, parts: List[Tuple[int, int]],
            fetch: Callable[[int, int], bytes]) -> bytes:
    """Bytes ``[lo, hi)``: ``parts`` fetched, the rest read from the sparse partial (or the entry)."""
    done = _from_entry(st.base, lo, hi)  # published meanwhile: its bytes are there
    if done is not None:
        return done
    if parts == [(lo, hi)]:
        return fetch(lo, hi)
    buf = bytearray(hi - lo)
    at = lo
    try:
        fd = os.open(st.path, os.O_RDONLY | NOFOLLOW)
    except OSError:
        try:
            fd = os.open(st.base, os.O_RDONLY | NOFOLLOW)  # published meanwhile
        except OSError:
            return fetch(lo, hi)
    try:
        for a, b in parts + [(hi, hi)]:
            if at < a:  # present: from the file (checked by the caller with the rest)
                buf[at - lo:a - lo] = os.pread(fd, a - at, at)
            if b > a:
                buf[a - lo:b - lo] = fetch(a, b)
            at = b
    finally:
        os.close(fd)
    return bytes(buf)


def _from_entry(base: str, lo: int, hi: int) -> Optional[bytes]:
    """Bytes ``[lo, hi)`` of the published entry ``base``, or None (not published)."""
    try:
        fd = os.open(base, os.O_RDONLY | NOFOLLOW)
        try:
            data = os.pread(fd, hi - lo, lo)
        finally:
            os.close(fd)
    except OSError:
        return None
    return data if len(data) == hi - lo else None


def keep_verified(store: Any, shard: ShardInfo, lo: int, data: Any, spans: List[Tuple[int, int]]) -> int:
    """Write the verified ``spans`` of ``data`` (bytes ``lo..``) into the shard's
    sparse partial, then record them; bytes written (0 when it has none and may
    not start one, or when it is being published).  Never raises for the cache's
    sake: the sample is delivered anyway.

    Example:
        >>> keep_verified(store, shard, 0, data, [(512, 4096)])   # doctest: +SKIP
        3584
    """
    if not spans or not eligible(store, shard):
        return 0
    base = store.entry_path(shard.url)
    st = _state(base, shard)
    with st.cond:
        spans = [span for span in spans if not st.have.covers(*span)]
    if not spans:
        return 0
    try:
        return _write_spans(store, st, base, lo, data, spans)
    except OSError:
        return 0  # a full or read-only cache: the ranged read still delivers


def verified_spans(shard: ShardInfo, lo: int, hi: int, data: Any, ok: Set[int]) -> List[Tuple[int, int]]:
    """The byte ranges of the samples lying wholly in ``data`` (bytes ``[lo, hi)`` of
    ``shard``) that match their digests (those in ``ok`` are known to), neighbours joined.

    Example:
        >>> verified_spans(shard, 0, 4096, data, {0})   # doctest: +SKIP
        [(512, 4096)]
    """
    off, dig = shard.offsets, shard.sample_digests
    assert off is not None and dig is not None
    mv = memoryview(data)
    n = len(off) - 1
    j = bisect.bisect_left(off, lo, 0, n)
    out: List[Tuple[int, int]] = []
    while j < n and int(off[j + 1]) <= hi:
        a, b = int(off[j]), int(off[j + 1])
        if j in ok or xxhash.xxh3_64_intdigest(mv[a - lo:b - lo]) == int(dig[j]):
            if out and out[-1][1] == a:
                out[-1] = (out[-1][0], b)
            else:
                out.append((a, b))
        j += 1
    return out


def _open_map(path: str, base: str) -> int:
    """The map, open for appending with its lock shared (another one if the
    download rewrote it meanwhile), or -1 once the entry is published."""
    while True:
        mfd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | NOFOLLOW, 0o600)
        fcntl.flock(mfd, fcntl.LOCK_SH)
        if os.fstat(mfd).st_nlink > 0:
            return mfd
        os.close(mfd)  # rewritten by a download opening the partial, or published, or discarded
        if layout.lstat(base) is not None:
            return -1


def _write_spans(store: Any, st: SparseState, base: str, lo: int, data: Any,
                 spans: List[Tuple[int, int]]) -> int:
    if layout.lstat(st.path) is None:
        if not _may_create(store, base) or layout.lstat(base) is not None:
            return 0  # no room reserved for it, or published already
        # a DataLoader worker's first step may come before any download made the cache's directories
        try:
            store.ensure_dirs()
        except CacheError:
            return 0
    mfd = _open_map(st.map, base)
    if mfd < 0:
        return 0  # published meanwhile
    try:
        try:
            fd = os.open(st.path, os.O_RDWR | NOFOLLOW)
            created = False
        except FileNotFoundError:
            if layout.lstat(base) is not None:  # published meanwhile: this map is a stray
                if os.fstat(mfd).st_size == 0:
                    layout.remove(st.map)
                return 0
            fd = os.open(st.path, os.O_RDWR | os.O_CREAT | NOFOLLOW, 0o600)
            created = True
        try:
            size = os.fstat(fd).st_size
            if size == 0:
                os.ftruncate(fd, st.size)
            elif size != st.size:
                return 0  # another shard's leftover: the download discards it
            mv = memoryview(data)
            n = 0
            recs = []
            for a, b in spans:
                os.pwrite(fd, mv[a - lo:b - lo], a)
                recs.append(record(a, b, xxhash.xxh3_64_intdigest(mv[a - lo:b - lo]), st.tag))
                n += b - a
        finally:
            os.close(fd)
        os.write(mfd, b"".join(recs))  # after the bytes: a record never describes bytes not written
        if created and layout.lstat(base) is not None:
            layout.remove(st.path)  # published while this one was started: a stray
            layout.remove(st.map)
            return 0
    finally:
        os.close(mfd)
    with st.cond:
        for a, b in spans:
            st.have.add(a, b)
        st.cond.notify_all()
    return n


# ---- the download's side (under the entry's download lock) ---------------------------------

def _open(st: SparseState) -> None:
    """Start or resume the sparse partial: a file of the shard's size whose map
    holds only records whose bytes re-hash right (the map rewritten with them)."""
    with st.cond:
        mfd = os.open(st.map, os.O_RDWR | os.O_CREAT | NOFOLLOW, 0o600)
        try:
            fcntl.flock(mfd, fcntl.LOCK_EX)  # no ranged write while the map is rewritten
            fd = os.open(st.path, os.O_RDWR | os.O_CREAT | NOFOLLOW, 0o600)
            try:
                size = os.fstat(fd).st_size
                raw = b""
                if size == st.size:
                    raw = os.pread(mfd, os.fstat(mfd).st_size, 0)
                else:
                    os.ftruncate(fd, 0)  # another shard's, or new: nothing in it is kept
                    os.ftruncate(fd, st.size)
                keep = []
                have = Ranges()
                for a, b, dig in st.parse(raw):
                    if not have.covers(a, b) and xxhash.xxh3_64_intdigest(os.pread(fd, b - a, a)) == dig:
                        keep.append(record(a, b, dig, st.tag))
                        have.add(a, b)
            finally:
                os.close(fd)
            tmp = st.map + ".tmp"
            with open(tmp, "wb") as f:
                f.write(b"".join(keep))
            os.replace(tmp, st.map)
        finally:
            os.close(mfd)  # the lock goes with the old map's inode
        st.have = have
        mst = layout.lstat(st.map)
        st.map_ino = mst.st_ino if mst is not None else None
        st.map_read = len(keep) * _REC.size
        st.verified = True


def _next_chunk(st: SparseState, cursor: int, since: float) -> Optional[Tuple[int, int]]:
    """The next range to download (under ``cond``): the first gap at or after
    ``cursor`` (else from the start) that nothing covers or claims, joined with
    the gaps that follow across islands shorter than :data:`ISLAND`; at most
    :data:`BUSY_CHUNK` bytes in the first :data:`BUSY_SECONDS` of the download
    (``since``) and while ranged reads of the shard go on, else :data:`CHUNK`
    and a piece (:data:`~resumewds.cache.sparsepieces.PIECE`)."""
    busy = Ranges(st.have.spans)
    for pos, end, _ in st.claims.values():
        busy.add(pos, end)
    for a, b in st.foreign_claims():  # another process fetches them now
        busy.add(a, b)
    gaps = busy.missing(0, st.size)
    if not gaps:
        return None
    i = next((k for k, g in enumerate(gaps) if g[1] > cursor), 0)
    a, b = gaps[i]
    a = max(a, cursor) if gaps[i][0] < cursor < b else a
    for na, nb in gaps[i + 1:]:
        if na - b >= ISLAND or st.claimed(b, na) or nb - a > BUSY_CHUNK:
            break
        b = nb
    hurry = time.monotonic() - max(st.ranged_at, since) < BUSY_SECONDS
    return a, min(b, a + (BUSY_CHUNK if hurry else min(CHUNK, sparsepieces.PIECE)))


def download(store: StoreAPI, shard: ShardInfo, base: str, budget: FetchBudget) -> Optional[FetchResult]:
    """Fill ``base + ".sparse"`` with every byte no record covers, by ranges (under
    the entry's download lock); its :class:`~resumewds.fetch.FetchResult` (the
    xxh3_64 of the whole file, hashed in order), or None when the server does
    not honour ``Range`` (the sparse partial is discarded: download it the
    streamed way).

    Raises:
        TransientFetchError / PermanentFetchError: as a whole-shard download.
        CacheError: the partial cannot be written.
    """
    st = _state(base, shard)
    url = shard.url
    t0 = time.monotonic()
    try:
        _open(st)
    except OSError as exc:
        raise cache_error(exc, st.path, "open the sparse partial") from exc
    kept = st.have.total()
    store.emit(K.FETCH_START, url, resumed_from=kept, sparse=True)
    cursor = [0]

    def next_piece() -> Optional[Tuple[int, int, int]]:
        nxt = _next_chunk(st, cursor[0], t0)
        if nxt is None:
            return None
        cursor[0] = nxt[1]
        return nxt[0], nxt[1], st.claim(nxt[0], nxt[1], True)

    def complete() -> bool:
        with st.cond:
            return not st.have.missing(0, st.size)

    try:
        fd = os.open(st.path, os.O_RDWR | NOFOLLOW)
    except OSError as exc:
        raise cache_error(exc, st.path, "open the sparse partial") from exc
    try:
        res = fetch_pieces(st, fd, url, store, budget, next_piece, complete)
        if res.no_range:
            _NO_RANGE.add(url)  # a 200, a 416, another range: this shard streams, as before
            discard(base)
            return None
        if res.error is not None:
            raise res.error
        digest = layout.hash_file(st.path)[1]  # the assembled file, in order, once
    finally:
        os.close(fd)
    received, requests = res.received, res.requests
    budget.fetched = True
    budget.take()  # one attempt per whole download, as streamed: a corrupt one is retried while the budget lasts
    seconds = time.monotonic() - t0
    store.emit(K.FETCH_DONE, url, bytes=received, seconds=seconds, resumed_from=kept, sparse=True,
               requests=requests)
    return FetchResult(url=url, path=st.path, size=st.size, bytes=received, resumed_from=kept, seconds=seconds,
                       attempts=requests, xxh3_64=digest)


def stream_instead(url: str) -> None:
    """A sparse download of ``url`` failed its whole-file check past a ranged
    repair: its later downloads (in this process) stream a ``.partial``."""
    _NO_RANGE.add(url)


def publish(base: str) -> None:
    """Rename the finished sparse partial to the entry ``base`` and drop its
    map, with the map locked exclusive (no ranged write lands in the entry)."""
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
    """Remove a map whose sparse file is gone (a kill -9 between :func:`publish`'s
    rename and the map's removal), under its lock exclusive (a ranged read that
    starts a sparse partial holds it shared until its file exists); whether one was.

    Example:
        >>> drop_stale("/cache/shards/ab12-shard-000000.tar")   # doctest: +SKIP
        False
    """
    if layout.lstat(base + MAP_SUFFIX) is None or layout.lstat(base + SUFFIX) is not None:
        return False
    try:
        mfd = os.open(base + MAP_SUFFIX, os.O_RDWR | NOFOLLOW)
    except OSError:
        return False
    try:
        fcntl.flock(mfd, fcntl.LOCK_EX)
        if layout.lstat(base + SUFFIX) is not None or os.fstat(mfd).st_nlink == 0:
            return False  # a ranged read started a sparse partial meanwhile, or gone already
        layout.remove(base + MAP_SUFFIX)
    finally:
        os.close(mfd)
    _forget(base)
    return True


def discard(base: str) -> None:
    """Remove the sparse partial and its map (a failed check: start again)."""
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
        st = _STATES.pop(base, None)
    if st is not None:
        with st.cond:
            st.cond.notify_all()
