"""Verified ranged reads: samples of remote shards before the shard is cached.

:func:`prepare` (once per step) takes the samples of remote shards with
per-sample digests that are not cached yet from the shard's sparse partial,
waits for those a download is fetching, and fetches the rest by range; each
is checked against its digest as it arrives and kept until the reader takes
it.  A range the server will not serve sends the shard to the whole-shard
path; :func:`finish` checks every shard read this way whole at the end of a
pass.  docs/DIGESTS.md has the rules and the figures.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .. import fetch as F
from ..cache import SampleSink, check_end_bytes
from ..cache import _sparse as sparse
from ..errors import (
    CacheError,
    CorruptSample,
    FetchError,
    IntegrityError,
    PermanentFetchError,
    RangeIgnored,
    ResumeWDSError,
    ShardFormatError,
    TransientFetchError,
)
from ..manifest import ShardInfo
from ..tar import _io as tario
from ._shards import WHOLE, ShardReader

__all__ = ["RangedReads", "finish", "prepare"]

log = logging.getLogger("resumewds")

#: neighbouring samples closer than this are fetched with one Range request
RANGE_GAP = 64 * 1024
#: one Range request fetches at most this many bytes (unless one sample is bigger)
RANGE_MAX = 8 << 20
#: Range requests of one step run on this many connections at once
RANGE_THREADS = 4
#: a sample a download is fetching now is waited for; the wait gives up (and fetches it by
#: range) when nothing has arrived for this long (seconds)
WAIT_STALL = 1.0


class RangedReads:
    """One process's verified reads of shards that are not in the cache yet
    (``reader.ranged``, made on first use).

    Counters: ``range_requests``, ``range_bytes``, ``range_samples`` /
    ``partial_samples`` (delivered from a range / from the sparse partial),
    ``waits`` (samples waited for while a download fetched them), ``range_kept``
    (bytes of ranges written into sparse partials).
    """

    def __init__(self, store: Any):
        self.store = store
        # (shard, sample) -> (sample dict, "range" | "partial"), oldest first
        self.ready: OrderedDict[Tuple[int, int], Tuple[Dict[str, Any], str]] = OrderedDict()
        self.pending: Dict[Tuple[int, int], Any] = {}  # (shard, sample) -> the future fetching it
        self.off: set = set()  # shards read whole (not ranged, or their ranges failed)
        self.eligible: Dict[int, bool] = {}
        self.touched: Dict[int, ShardInfo] = {}  # shards read by range in this pass: checked whole at its end
        self.budgets: Dict[str, Any] = {}  # per url: the fetch budget its ranged reads draw from
        self.counters = {"range_requests": 0, "range_bytes": 0, "range_samples": 0, "partial_samples": 0,
                         "waits": 0, "range_kept": 0}
        self._pool: Any = None
        self._tl = threading.local()
        self._sessions: List[Any] = []
        self._pid = os.getpid()
        self.lock = threading.Lock()

    def put(self, key: Tuple[int, int], sample: Dict[str, Any], source: str) -> None:
        if key in self.ready:
            return
        self.ready[key] = (sample, source)

    def take(self, key: Tuple[int, int]) -> Optional[Dict[str, Any]]:
        hit = self.ready.pop(key, None)
        if hit is None:
            return None
        self.counters[hit[1] + "_samples"] += 1
        return hit[0]

    def forget(self, si: int) -> None:
        """Drop what is ready or pending of shard ``si`` (it is read whole now, or failed)."""
        for key in [k for k in self.ready if k[0] == si]:
            del self.ready[key]
        for key in [k for k in self.pending if k[0] == si]:
            del self.pending[key]

    def sample(self, reader: ShardReader, si: int, j: int) -> Any:
        """Sample ``j`` of shard ``si`` read by range (None: skipped), or
        :data:`~resumewds.read._shards.WHOLE`: read the shard the whole-shard way."""
        hit = self.take((si, j))
        if hit is not None:
            return hit
        shard = reader.shards[si]
        if si in self.off or not self.can_range(si, shard) or self.cached(shard):
            return WHOLE
        t0 = time.perf_counter()
        try:
            fut = self.pending.get((si, j))
            if fut is None:  # not prepared (a read on its own), or a download fetches it now
                _start(self, si, shard, [j])
                hit = self.take((si, j))
                if hit is not None:
                    return hit
                fut = self.pending.get((si, j))
            if fut is None:
                left = _wait(self, si, shard, [j])
                if left:
                    _start(self, si, shard, left)  # the download went elsewhere, or stalled: by range
                    fut = self.pending.get((si, j))
            if fut is not None:
                try:
                    got = fut.result()
                except ResumeWDSError as err:
                    return _failed(reader, self, si, shard, err)
                for k in got:
                    self.pending.pop((si, k), None)
                _deliver(self, si, shard, got, "range")
            hit = self.take((si, j))
            return hit if hit is not None else WHOLE  # (bytes that are not a sample: the whole path says why)
        finally:
            reader.wait += time.perf_counter() - t0  # waiting for bytes, as in store.acquire (t_fetch_wait)

    def by_range(self, reader: ShardReader, si: int, j: int, count: int) -> bool:
        """Whether samples ``j .. j+count-1`` of shard ``si`` (not open) are read by
        range, one by one: some are ready, or the shard is not cached yet."""
        shard = reader.shards[si]
        return any((si, j + i) in self.ready for i in range(count)) or (
            si not in self.off and self.can_range(si, shard) and not self.cached(shard))

    def can_range(self, si: int, shard: ShardInfo) -> bool:
        ok = self.eligible.get(si)
        if ok is None:
            ok = self.eligible[si] = sparse.eligible(self.store, shard)
        return ok

    def cached(self, shard: ShardInfo) -> bool:
        """The shard is published in the cache (one stat): read it from there.  The entry
        itself, not its ``.meta``: between a download's rename and its meta, a reader that
        fetched the shard's samples by range would fetch bytes already in the cache."""
        return os.path.exists(self.store.entry_path(shard.url))

    def session(self) -> Any:
        s = getattr(self._tl, "session", None)
        if s is None:
            s = self._tl.session = F.new_session()
            with self.lock:
                self._sessions.append(s)
        return s

    def pool(self) -> Any:
        if self._pool is None or self._pid != os.getpid():
            self._pool = ThreadPoolExecutor(RANGE_THREADS, thread_name_prefix="resumewds-range")
            self._pid = os.getpid()
        return self._pool

    def budget(self, url: str) -> Any:
        """The shard's fetch budget for this read (the store's, shared with its download)."""
        with self.lock:
            b = self.budgets.get(url)
            if b is None:
                b = self.budgets[url] = self.store.budget_for(url)
            return b

    def end_budget(self, url: str) -> None:
        """This read of ``url`` is over: the next one starts with a budget of its own."""
        with self.lock:
            b = self.budgets.pop(url, None)
        if b is not None:
            self.store.budget_done(url, b, False, True)

    def new_pass(self) -> None:
        """A pass of steps starts: budgets and shards sent to the whole-shard path reset."""
        for url in list(self.budgets):
            self.end_budget(url)
        self.off.clear()
        self.touched.clear()

    def close(self) -> None:
        if self._pool is not None and self._pid == os.getpid():
            self._pool.shutdown(wait=True)
        self._pool = None
        for url in list(self.budgets):
            self.end_budget(url)
        for s in self._sessions:
            s.close()
        self._sessions = []
        self._tl = threading.local()
        self.pending.clear()
        self.ready.clear()


def _ranged(reader: ShardReader) -> Optional[RangedReads]:
    """The reader's ranged reads (made on first use), or None (it reads shards whole)."""
    if not reader.can_range:
        return None
    if reader.ranged is None:
        reader.ranged = RangedReads(reader.store)
    return reader.ranged


def _groups(shard: ShardInfo, js: List[int], e: sparse.Entry, alone: Optional[int] = None) -> List[Tuple[int, int]]:
    """The samples ``js`` coalesced into ``(first, last)`` runs fetched with one request
    each (gaps up to :data:`RANGE_GAP`, at most :data:`RANGE_MAX` bytes, never across bytes
    present or in flight); ``alone`` (a step's first sample) first, in a request of its own."""
    off = shard.offsets
    assert off is not None
    busy = e.busy()
    out: List[Tuple[int, int]] = []
    rest = sorted(set(js))
    if alone is not None and alone in rest:
        rest.remove(alone)
        first: List[Tuple[int, int]] = [(alone, alone)]
    else:
        first = []
    for j in rest:
        if out and alone is not None and out[-1][1] < alone < j:
            out.append((j, j))  # (never across the sample fetched alone)
            continue
        if out:
            f, last = out[-1]
            a, gap_a, b = int(off[f]), int(off[last + 1]), int(off[j + 1])
            gap_b = int(off[j])
            if gap_b - gap_a <= RANGE_GAP and b - a <= RANGE_MAX and \
                    (gap_a == gap_b or busy.missing(gap_a, gap_b) == [(gap_a, gap_b)]):
                out[-1] = (f, j)
                continue
        out.append((j, j))
    return first + out


def prepare(reader: ShardReader, where: Sequence[Tuple[int, int]]) -> None:
    """Start making the samples ``where`` (``(shard, sample)`` pairs) of shards not cached yet
    ready, verified: once per step before its samples are read (and for read-ahead), over
    :data:`RANGE_THREADS` connections, a step's first sample first."""
    rr = _ranged(reader)
    if rr is None:
        return
    shards = reader.shards
    todo: Dict[int, List[int]] = {}
    for si, j in where:
        if si in reader.open or si in reader.failed or si in rr.off or (si, j) in rr.ready \
                or (si, j) in rr.pending:
            continue
        lst = todo.get(si)
        if lst is None:
            if not rr.can_range(si, shards[si]):
                rr.off.add(si)
                continue
            if rr.cached(shards[si]):
                continue
            lst = todo[si] = []
        lst.append(j)
    head = where[0] if where else None
    for si, js in todo.items():
        _start(rr, si, shards[si], js, head[1] if head is not None and head[0] == si else None)


def _start(rr: RangedReads, si: int, shard: ShardInfo, js: List[int], alone: Optional[int] = None) -> None:
    """Deliver what the sparse partial holds of ``js``; fetch by range what no download fetches now."""
    off = shard.offsets
    assert off is not None
    rr.touched[si] = shard
    e = sparse.entry(rr.store, shard)
    with e.cond:
        with e.deciding(rr.store):  # (another process decides after this one's claims are in the map)
            e.refresh()
            present = sparse.read_present(e, shard, js)
            fetch = [j for j in js if j not in present and not e.in_flight(int(off[j]), int(off[j + 1]))]
            if fetch and rr.cached(shard):
                fetch = []  # published meanwhile: read() takes it from the cache
            groups = _groups(shard, fetch, e, alone)
            for f, last in groups:
                e.announce(int(off[f]), int(off[last + 1]), False)
        for f, last in groups:
            token = e.claim(int(off[f]), int(off[last + 1]), False)
            mine = set(js)
            fut = rr.pool().submit(_fetch_group, rr, shard, e, f, last, token, mine)
            for j in range(f, last + 1):
                if j in mine:
                    rr.pending[(si, j)] = fut
    _deliver(rr, si, shard, present, "partial")


def _failed(reader: ShardReader, rr: RangedReads, si: int, shard: ShardInfo, err: BaseException) -> Any:
    """A ranged read of shard ``si`` failed: a range not served, corrupt or cut short sends
    the shard to the whole-shard path, and so does a range that failed ``attempts`` times in
    a row while the shard's other requests progressed; any other failure follows ``on_error``."""
    rr.forget(si)
    cut = isinstance(err, TransientFetchError) and err.status == 206  # bodies cut short: it answers
    if isinstance(err, TransientFetchError) and not isinstance(err, CorruptSample) and not cut \
            and not rr.budget(shard.url).exhausted:
        # its own faults in a row, but the shard's budget holds (other requests progressed): bad
        # luck on one small request (at 30% faults, 8 in a row is one range in 15,000), or a range
        # the server will not serve; the whole-shard path asks for the bytes, with that budget
        rr.off.add(si)
        return WHOLE
    if isinstance(err, PermanentFetchError) or not (isinstance(err, (RangeIgnored, CorruptSample)) or cut):
        rr.off.add(si)  # (its later samples: the whole-shard path meets the spent budget at once)
        reader.fail(si, shard, err)
        return None
    rr.end_budget(shard.url)
    sparse.stream_instead(shard.url)
    rr.off.add(si)
    return WHOLE


def _deliver(rr: RangedReads, si: int, shard: ShardInfo, got: Dict[int, Any], source: str) -> None:
    off = shard.offsets
    assert off is not None
    for j, data in got.items():
        try:
            sample = tario.parse_sample(data, shard.url, base=int(off[j]), start=0, end=len(data),
                                        verified=True)  # its digest checked
        except ShardFormatError:
            continue  # a sample the manifest's digest vouches for, yet not a tar sample: read() reports it
        sample["__url__"] = shard.url
        rr.put((si, j), sample, source)


def _wait(rr: RangedReads, si: int, shard: ShardInfo, js: List[int]) -> List[int]:
    """Wait while a download fetches the samples ``js`` (at most :data:`WAIT_STALL` seconds
    without progress); deliver those that arrived, return the others."""
    off = shard.offsets
    assert off is not None
    e = sparse.entry(rr.store, shard)
    left = list(js)
    with e.cond:
        last, t_last = e.have.total(), time.monotonic()
        while left:
            e.refresh()  # (another process's download records its bytes in the map)
            left = [j for j in left if not e.have.covers(int(off[j]), int(off[j + 1]))
                    and e.in_flight(int(off[j]), int(off[j + 1]))]
            if not left:
                break
            now, total = time.monotonic(), e.have.total()
            if total > last:
                last, t_last = total, now
            elif now - t_last > WAIT_STALL:
                break  # a download that does not progress: fetch the bytes ourselves
            e.cond.wait(0.01)
        got = sparse.read_present(e, shard, js)
    rr.counters["waits"] += len(js)
    _deliver(rr, si, shard, got, "partial")
    return [j for j in js if j not in got]


def _fetch_group(rr: RangedReads, shard: ShardInfo, e: sparse.Entry, first: int, last: int, token: int,
                 needed: set) -> Dict[int, bytes]:
    """Fetch samples ``first..last`` of ``shard`` by range, each checked as it arrives and
    kept in the sparse partial; the bytes of those ``needed``."""
    off = shard.offsets
    assert off is not None
    lo, hi = int(off[first]), int(off[last + 1])
    got: Dict[int, bytes] = {}
    w = sparse.Writer(rr.store, e)
    budget = rr.budget(shard.url)

    def take(j: int, at: int, data: Any) -> None:
        if j in needed:
            got[j] = bytes(data)
        w.put(at, data)

    try:
        F.fetch_range(shard.url, lo, hi, config=rr.store.fetch, budget=budget, session=rr.session(),
                      on_event=rr.store.emit, sink=SampleSink(shard, lo, hi, budget, take))
    finally:
        w.close()
        with e.cond:
            e.release(token)
        e.announce(lo, hi, True)
        with rr.lock:
            rr.counters["range_requests"] += 1
            rr.counters["range_bytes"] += hi - lo
            rr.counters["range_kept"] += w.kept
    return got


def finish(reader: ShardReader) -> None:
    """The end of a pass: every shard this process read by range is checked whole
    through the cache (size, xxh3_64, end of archive); a failure follows ``on_error``."""
    rr = reader.ranged
    if rr is None or not rr.touched:
        return
    touched, rr.touched = rr.touched, {}
    t0 = time.perf_counter()
    try:
        for si, shard in touched.items():
            if si in reader.failed or rr.cached(shard):
                continue
            try:
                try:
                    rr.store.ensure(shard)
                except CacheError as exc:  # no room for it (a full disk): its end, by range
                    _check_end_by_range(rr, shard, exc)
            except (FetchError, IntegrityError, ShardFormatError) as exc:
                reader.fail(si, shard, exc)
    finally:
        reader.wait += time.perf_counter() - t0


def _check_end_by_range(rr: RangedReads, shard: ShardInfo, why: BaseException) -> None:
    """The check of a shard the cache cannot hold: the 512 bytes after its last sample
    must be the end of the archive (its whole-file checksum is not checked: a warning)."""
    assert shard.offsets is not None and shard.size is not None
    end = int(shard.offsets[-1])
    block = F.fetch_range(shard.url, end, min(int(shard.size), end + 512), config=rr.store.fetch,
                          budget=rr.budget(shard.url), session=rr.session(), on_event=rr.store.emit)
    check_end_bytes(block, shard, shard.url)
    log.warning("%s: the cache cannot hold it (%s): each of its samples was checked against its digest and "
                "its end against the manifest, but not its whole-file xxh3_64", shard.url, why)
