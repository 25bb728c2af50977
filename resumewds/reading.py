"""Shard reading: from ``(shard index, sample index)`` to a sample dict.

What :class:`resumewds.shardset.ShardDataset` calls to read the samples of
a step, apart from the order (:mod:`resumewds.plan`), the stages
(:mod:`resumewds.stages`) and the open shards (:mod:`resumewds.openshards`).
A map of this module:

* :func:`read` -- one sample (``tario.read_sample`` on the open copy, which
  ``acquire`` verified first: a local shard's whole-file xxh3_64 is checked
  before any of its samples is read, so a shard that mismatches is skipped
  whole under ``on_error="skip"``, the same in every run and resume);
  :func:`read_run` -- consecutive samples of one shard with one ``pread``
  (same results, errors and skips as one by one).
* :func:`prepare` -- called once per step before its samples are read: the
  samples of remote shards that are not verified cache entries yet (manifest
  v3, per-sample digests) are read from the partial download or fetched by
  HTTP/S3 ``Range`` (:func:`resumewds.repair.fetch_range`), each verified
  against its digest, and kept in :class:`RangedReads` until :func:`read`
  takes them (:func:`take_ready`); the whole-shard prefetch goes on and
  later steps read the cache.  Its helpers: :mod:`resumewds.partialreads`
  (streaming while downloading), ``_groups`` (coalescing), :mod:`resumewds.rangefetch`
  (fetch and verify, drawing from the shard's one fetch budget; a corrupt
  range sends the shard to the whole-shard path), ``_widen`` (optional
  read-ahead).  A shuffled window waits for the samples just past the end
  of a partial this process is downloading (:data:`WINDOW_AHEAD`), so that
  fewer bytes are fetched twice.  A shard whose download fills a sparse
  partial (the default, :mod:`resumewds.cache.sparse`: :func:`declare` tells the store
  that this process reads by range) is read from there (:mod:`resumewds.partialreads`),
  and the verified samples of every range are written into it, so that the
  download never fetches them again.  Switched off by
  ``WebDataset(ranged_reads=False)``, ``RESUMEWDS_RANGED_READS=0`` or
  :data:`RANGED_READS`; the module attributes below are the tuning knobs.
  docs/DIGESTS.md has the rules and the figures.

The reading state is the data set's reader's (:class:`~resumewds.openshards.ShardReader`:
open shards, failed shards, the ``on_error`` policy, the event sink, the ranged
reads); the functions here take the data set and ask its reader
(:func:`~resumewds.openshards.shard_reader`).  Pickling a data set for
DataLoader workers drops the reader (``__getstate__``).

Example:
    >>> ds = WebDataset("data/shard-{000000..000003}.tar")            # doctest: +SKIP
    >>> read(ds, 0, 5)["__key__"]                                     # doctest: +SKIP
    'sample000005'
"""

from __future__ import annotations

import bisect
import contextlib
import logging
import os
import threading
import time
from collections import OrderedDict
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Dict, List, Optional, Sequence, Tuple

import xxhash

from . import config, tario
from . import fetch as F
from .cache import sparse
from .errors import ChecksumMismatch, FetchError, IntegrityError, ShardFormatError
from .manifest import ShardInfo
from .openshards import RUN_BYTES, ShardReader, run_length, shard_failed, shard_reader, trusted
from .partialreads import Waits, from_partial, wait_sparse
from .rangefetch import blame_ranged, end_budget, fetch_group, shard_budget, verified_in
from .repair import RangeIgnored
from .schemes import is_remote_object

__all__ = ["RANGED_READS", "RUN_BYTES", "RangedReads", "ShardReader", "declare", "prepare", "read", "read_run",
           "run_length", "shard_failed", "shard_reader", "take_ready"]

log = logging.getLogger("resumewds")


def read(ds: Any, shard_idx: int, j: int) -> Optional[Dict[str, Any]]:
    """Read sample ``j`` of shard ``shard_idx``; None if the shard is skipped."""
    reader = shard_reader(ds)
    if shard_idx in reader.failed:
        return None
    ready = _take(reader, shard_idx, j)
    if ready is not None:
        return ready
    shard = reader.shards[shard_idx]
    try:
        fd = reader.fd(shard_idx, shard)
        start, end = shard.sample_range(j)
        if _sampled(reader, shard_idx):
            buf = tario._pread_range(fd, start, end, shard.url)
            if not verified_in(buf, start, shard, j):
                _bad_sample(reader, shard_idx, j, shard, buf, start, end)
                return None
            sample = tario.parse_sample(buf, shard.url, base=start, start=0, end=end - start, verified=True)
        else:
            verified = trusted(reader.store, shard)
            sample = tario.read_sample(fd, start, end, shard.url, verified=verified)
            reader.fast[shard_idx] = (fd, shard.offsets, shard.url, verified)
    except (FetchError, IntegrityError, ShardFormatError) as exc:
        reader.fail(shard_idx, shard, exc)
        return None
    sample["__url__"] = shard.url
    return sample


def _sampled(reader: ShardReader, si: int) -> bool:
    """Whether the open shard ``si``'s samples are still checked one by one
    (a local shard with per-sample digests that this process has not
    verified whole: :meth:`ShardReader.fd`)."""
    key = reader.sampled.get(si)
    if key is not None and reader.store.verified_key(key):
        del reader.sampled[si]  # verified whole meanwhile (background): read as any verified shard
        return False
    return key is not None


def _bad_sample(reader: ShardReader, si: int, j: int, shard: ShardInfo, buf: bytes, start: int, end: int) -> None:
    """``on_error`` for sample ``j`` alone, whose bytes fail its digest (a local
    shard read sample by sample): :class:`ChecksumMismatch` naming the file, the
    sample, its key and its bytes, raised or the sample skipped."""
    assert shard.sample_digests is not None
    expected, actual = format(int(shard.sample_digests[j]), "016x"), xxhash.xxh3_64_hexdigest(buf)
    try:
        key = str(tario.parse_sample(buf, shard.url, base=start, start=0, end=end - start).get("__key__", "?"))
    except Exception:  # the bytes are bad: the key may be unreadable too
        key = "?"
    exc = ChecksumMismatch(f"{F.local_path(shard.url)}: sample {j} (key {key}, bytes {start}-{end}): xxh3_64 "
                           f"mismatch: expected {expected}, got {actual}", url=shard.url, expected=expected,
                           actual=actual)
    reader.fail_sample(si, j, shard, exc, key)


def read_run(ds: Any, shard_idx: int, j: int, count: int) -> List[Optional[Dict[str, Any]]]:
    """Samples ``j .. j+count-1`` of one shard with one ``pread``.

    Same results, errors and skips as ``count`` calls of :func:`read`:
    a shard that cannot be fetched fails (or is skipped) once, and on a
    malformed sample it falls back to one-by-one reads of the open file,
    so the samples before the bad one are delivered exactly as they would
    be one by one.  A local shard whose samples are checked one by one
    against their digests returns the samples before the first that fails
    (fewer than ``count``; at least one item).
    """
    r = shard_reader(ds)
    if count == 1 or shard_idx in r.failed or (r.ranged is not None and r.ranged.ready and any(
            (shard_idx, j + i) in r.ranged.ready for i in range(count))):
        return [ds._read(shard_idx, j + i) for i in range(count)]
    shard = r.shards[shard_idx]
    try:
        fd = r.fd(shard_idx, shard)
    except (FetchError, IntegrityError, ShardFormatError) as exc:
        r.fail(shard_idx, shard, exc)  # never a second fetch
        return [None] * count
    if _sampled(r, shard_idx):  # each sample checked against its digest, in one pread
        return _sampled_run(ds, r, shard_idx, shard, fd, j, count)
    try:
        assert shard.offsets is not None
        samples: List[Optional[Dict[str, Any]]] = list(
            tario.read_samples(fd, shard.offsets, j, j + count - 1, shard.url,
                               verified=trusted(r.store, shard)))
    except ShardFormatError:
        return [ds._read(shard_idx, j + i) for i in range(count)]
    url = shard.url
    for sample in samples:
        sample["__url__"] = url  # type: ignore[index]
    return samples


def _sampled_run(ds: Any, r: ShardReader, si: int, shard: ShardInfo, fd: int, j: int,
                 count: int) -> List[Optional[Dict[str, Any]]]:
    """:func:`read_run` of a shard whose samples are checked one by one: the
    samples up to the first that fails its digest (fewer than ``count``: the
    engine reads that one next, on its own, and it follows ``on_error``)."""
    assert shard.offsets is not None
    lo, hi = int(shard.offsets[j]), int(shard.offsets[j + count])
    try:
        buf = tario._pread_range(fd, lo, hi, shard.url)
    except ShardFormatError:
        return [ds._read(si, j)]
    out: List[Optional[Dict[str, Any]]] = []
    for i in range(count):
        a, b = int(shard.offsets[j + i]), int(shard.offsets[j + i + 1])
        if not verified_in(buf, lo, shard, j + i):
            return out if out else [ds._read(si, j)]
        try:
            sample = tario.parse_sample(buf, shard.url, base=a, start=a - lo, end=b - lo, verified=True)
        except ShardFormatError:
            return out if out else [ds._read(si, j)]
        sample["__url__"] = shard.url
        out.append(sample)
    return out


# ---- verified ranged reads and streaming while downloading ----

#: read samples of shards that are not cached yet by range / from the partial download;
#: False turns them off in this process whatever the dataset says (the switches:
#: ``WebDataset(ranged_reads=...)`` and ``RESUMEWDS_RANGED_READS``, read once per
#: dataset iteration and process)
RANGED_READS = True
#: neighbouring samples closer than this are fetched with one Range request
RANGE_GAP = 64 * 1024
#: one Range request fetches at most this many bytes (unless one sample is bigger)
RANGE_MAX = 8 << 20
#: Range requests of one step run on this many connections at once
RANGE_THREADS = 4
#: a Range request for a sample also fetches the rest of its aligned block of this
#: many bytes (read ahead: a shuffled window reads every sample of its shards soon);
#: 0 (default): off -- over loopback it cost bytes and no time; it pays where each
#: request has a long first-byte latency (object stores far away)
RANGE_BLOCK = 0
#: most bytes of verified samples read ahead and kept until asked for (per process)
READY_MAX = 64 << 20
#: a sample this close past the end of a growing partial download is waited for
#: (streaming) rather than fetched by range
STREAM_AHEAD = 4 << 20
#: how long the partial download may not grow before the wait gives up (seconds)
STREAM_STALL = 1.0
#: shuffled window: a sample at most this far past the end of a partial download
#: that a prefetch thread of this process is writing is waited for (while the
#: step's other ranges are fetched) rather than fetched by range and then
#: downloaded a second time; 0: off
WINDOW_AHEAD = 2 << 20
#: ... giving up when the partial has not grown for this long (seconds)
WINDOW_STALL = 0.2


class RangedReads:
    """One process's verified reads of shards that are not in the cache yet.

    For the samples of a step whose shard is remote (http/https), has
    sample digests and offsets (manifest v3) and is not yet a verified
    cache entry, :func:`prepare` reads each sample's bytes from the shard's
    partial download when they have arrived there (streaming while the
    prefetch thread downloads it), else fetches them with HTTP ``Range``
    requests (neighbours coalesced), checks each sample against its digest,
    and keeps the parsed samples in :attr:`ready` until :func:`read` hands
    them out.  With :data:`RANGE_BLOCK` set, a range is widened to the
    samples of its aligned block (read ahead: fewer, larger requests), kept
    while they take at most :data:`READY_MAX` bytes (oldest dropped first).
    Nothing unverified is ever kept.

    Counters (per process): ``range_requests``, ``range_bytes``,
    ``range_samples`` / ``partial_samples`` (delivered from a range / from a
    partial download), ``range_ahead`` (samples read ahead),
    ``range_refetches`` (a range fetched again: a sample it needed failed
    its digest), ``range_dropped`` (a sample read ahead failed its digest
    and was dropped), ``window_waits`` / ``window_partial`` (shuffled window:
    samples just past a growing partial that were waited for / that the
    download reached in time, so not fetched twice), ``range_kept`` (bytes of
    verified ranges written into sparse partials: not downloaded again).
    """

    def __init__(self, store: Any):
        self.store = store
        # (shard, sample) -> (sample dict, bytes, "range" | "partial"), oldest first
        self.ready: OrderedDict[Tuple[int, int], Tuple[Dict[str, Any], int, str]] = OrderedDict()
        self.ready_bytes = 0
        self.steps = 0  # steps prepared
        self.ahead: Dict[int, set] = {}  # per shard: samples ever read ahead (not read ahead twice)
        self.off: set = set()  # shards read whole (no digests, not http, server ignores Range)
        self.eligible: Dict[int, bool] = {}
        self.budgets: Dict[str, Any] = {}  # per url: the fetch budget its ranged reads draw from
        self.active = True
        self.counters = {"range_requests": 0, "range_bytes": 0, "range_samples": 0, "partial_samples": 0,
                         "range_ahead": 0, "range_refetches": 0, "range_dropped": 0, "window_waits": 0,
                         "window_partial": 0, "range_kept": 0}
        self._pool: Any = None
        self._tl: Any = None
        self._sessions: List[Any] = []
        self._pid = os.getpid()
        self.lock = threading.Lock()

    def put(self, key: Tuple[int, int], sample: Dict[str, Any], nbytes: int, source: str) -> None:
        if key in self.ready:
            return
        self.ready[key] = (sample, nbytes, source)
        self.ready_bytes += nbytes

    def take(self, key: Tuple[int, int]) -> Optional[Dict[str, Any]]:
        hit = self.ready.pop(key, None)
        if hit is None:
            return None
        self.ready_bytes -= hit[1]
        self.counters[hit[2] + "_samples"] += 1
        return hit[0]

    def drop(self, key: Tuple[int, int]) -> None:
        hit = self.ready.pop(key, None)
        if hit is not None:
            self.ready_bytes -= hit[1]

    def trim(self, keep: set) -> None:
        """Drop the oldest samples read ahead while over :data:`READY_MAX` (not ``keep``)."""
        if self.ready_bytes <= READY_MAX:
            return
        for key in [k for k in self.ready if k not in keep]:
            self.drop(key)
            if self.ready_bytes <= READY_MAX:
                return

    def can_range(self, si: int, shard: ShardInfo) -> bool:
        """Static part: an http(s) or s3 shard with its size, offsets and sample digests."""
        ok = self.eligible.get(si)
        if ok is None:
            url = shard.url.lower()
            ok = (is_remote_object(url) and shard.sample_digests is not None
                  and shard.offsets is not None and shard.size is not None
                  and hasattr(self.store, "entry_path") and hasattr(self.store, "fetch"))
            self.eligible[si] = ok
        return ok

    def cached(self, shard: ShardInfo) -> bool:
        """The shard is a published cache entry (one stat): read it from the cache."""
        return os.path.exists(self.store.entry_path(shard.url) + ".meta")

    def session(self) -> Any:
        if self._tl is None:
            self._tl = threading.local()
        s = getattr(self._tl, "session", None)
        if s is None:
            s = self._tl.session = F.new_lite_session()
            self._sessions.append(s)
        return s

    def pool(self) -> Any:
        if self._pool is None or self._pid != os.getpid():
            self._pool = ThreadPoolExecutor(RANGE_THREADS, thread_name_prefix="resumewds-range")
            self._pid = os.getpid()
        return self._pool

    def close(self) -> None:
        if self._pool is not None and self._pid == os.getpid():
            self._pool.shutdown(wait=True)
        self._pool = None
        for url in list(self.budgets):
            end_budget(self.store, url, self.budgets)  # the next iteration's reads have budgets of their own
        for s in self._sessions:
            try:
                s.close()
            except Exception:  # pragma: no cover - closing is best effort
                pass
        self._sessions = []
        self.ready.clear()
        self.ready_bytes = 0


def _widen(rr: RangedReads, si: int, shard: ShardInfo, js: List[int]) -> List[int]:
    """``js`` plus the samples of their aligned :data:`RANGE_BLOCK` not read ahead before."""
    assert shard.offsets is not None
    if rr.ready_bytes >= READY_MAX or RANGE_BLOCK <= 0:
        return js
    off = shard.offsets
    n = len(off) - 1
    done = rr.ahead.setdefault(si, set())
    out = set(js)
    for j in js:
        a0 = int(off[j]) // RANGE_BLOCK * RANGE_BLOCK
        lo = bisect.bisect_left(off, a0, 0, n)  # first sample starting in the block
        k = lo
        while k < n and int(off[k + 1]) <= a0 + RANGE_BLOCK:
            if k not in done and (si, k) not in rr.ready:
                out.add(k)
            k += 1
    extra = out.difference(js)
    done.update(extra)
    return sorted(out)


def _groups(shard: ShardInfo, js: List[int], have: Any = None) -> List[Tuple[int, int, List[int]]]:
    """Coalesce samples into ``(start, end, samples)`` ranges (not across bytes
    already in the shard's sparse partial, ``have``: they would be fetched twice)."""
    assert shard.offsets is not None
    off = shard.offsets
    out: List[Tuple[int, int, List[int]]] = []
    for j in sorted(set(js)):
        a, b = int(off[j]), int(off[j + 1])
        if out and a - out[-1][1] <= RANGE_GAP and b - out[-1][0] <= RANGE_MAX and (
                have is None or a == out[-1][1] or have.missing(out[-1][1], a) == [(out[-1][1], a)]):
            lo, _, members = out[-1]
            out[-1] = (lo, b, members + [j])
        else:
            out.append((a, b, [j]))
    return out


def _ranged(ds: Any) -> Optional[RangedReads]:
    """The data set's ranged reads in this process (made on first use), or None when off."""
    if not RANGED_READS or ds.prefetch_depth <= 0:
        return None
    reader = shard_reader(ds)
    rr = reader.ranged
    if rr is None:
        rr = reader.ranged = RangedReads(ds.store)
        # WebDataset(ranged_reads=...), else RESUMEWDS_RANGED_READS (default on)
        rr.active = (config.ranged_reads(getattr(ds, "ranged_reads", None))
                     and any(rr.can_range(i, s) for i, s in enumerate(reader.shards)))
    return rr


def declare(ds: Any) -> None:
    """Before an iteration's first prefetch: tell the data set's store whether
    this process reads shards by range, so that its downloads fill sparse
    partials around the ranges (:mod:`resumewds.cache.sparse`) instead of
    downloading them again.

    Example:
        >>> declare(ds); ds.store.ranged_fill       # doctest: +SKIP
        True
    """
    rr = _ranged(ds)
    if hasattr(ds.store, "ranged_fill"):
        ds.store.ranged_fill = rr is not None and rr.active
        ds.store.ranged_first = ds.store.ranged_fill and rr is not None and rr.steps == 0


def prepare(ds: Any, where: Sequence[Tuple[int, int]], stream: bool = False, *, part: bool = False,
            ahead: bool = False) -> None:
    """Make the samples ``where`` of shards not cached yet ready, verified.

    Called once per step, before its samples are read: for each shard of
    the step that is remote, has sample digests and is not a verified
    cache entry, its samples are read from its partial download or fetched
    by range (in parallel over :data:`RANGE_THREADS` connections) and
    checked against their digests; :func:`read` then hands them out.  The
    cached shards (and everything when :data:`RANGED_READS` is off) are
    left to the usual whole-shard path.  Every request draws from the
    shard's one fetch budget (shared with its whole-shard download); a
    range whose bytes fail a digest costs one attempt and, like a server
    that ignores ``Range`` (or answers 416), makes the shard a whole-shard
    read; a fetch that fails for good follows ``on_error`` for its shard.

    Args:
        ds: the dataset.
        where: the step's ``(shard index, sample index)`` pairs.
        stream: the order reads shards front to back (unshuffled or
            ``shuffle="shards"``): wait for the partial download to reach a
            sample just past its end instead of fetching it by range.  Not
            streaming (a shuffled window), after the first step: wait only
            for the samples within the bytes the step fetches by range per
            connection past the end of a partial this process is downloading
            (at most :data:`WINDOW_AHEAD`), while the other ranges are fetched.
        part: ``where`` is the first part of a step (its first sample, fetched
            before the others): the next call, with the rest, reads as the same step.
        ahead: ``where`` belongs to later steps (read ahead): a fetch that fails is
            forgotten (the step that reads the sample fetches it again and fails as
            it would have), and it counts as no step.

    Example:
        >>> prepare(ds, [(0, 5), (3, 17)])          # doctest: +SKIP
        >>> read(ds, 3, 17)["__key__"]               # verified, from a range   # doctest: +SKIP
        'sample000017'
    """
    rr = _ranged(ds)
    if rr is None or not rr.active:
        return  # off, or no shard can be read by range (local shards, manifest without digests)
    reader = shard_reader(ds)
    shards = reader.shards
    todo: Dict[int, List[int]] = {}
    seen: set = set()
    for si, j in where:
        if si in reader.open or si in reader.failed or si in rr.off or (si, j) in rr.ready:
            continue
        lst = todo.get(si)
        if lst is None:
            if si in seen:
                continue
            seen.add(si)
            if not rr.can_range(si, shards[si]):
                rr.off.add(si)
                continue
            if rr.cached(shards[si]):
                continue
            lst = todo[si] = []
        lst.append(j)
    if not todo:
        rr.store.ranged_first = False  # a first step read from the cache: downloads go ahead
        return
    t0 = time.perf_counter()
    try:
        _prepare(reader, rr, todo, stream, set(where), part or ahead, ahead)
    finally:
        reader.wait += time.perf_counter() - t0  # waiting for bytes, as in store.acquire (t_fetch_wait)
        if not part:
            rr.store.ranged_first = False  # the first batch is in (or failed): sparse downloads go ahead


def _prepare(reader: ShardReader, rr: RangedReads, todo: Dict[int, List[int]], stream: bool,
             step: set, part: bool = False, ahead: bool = False) -> None:
    shards = reader.shards
    config = reader.store.fetch
    jobs: List[Tuple[int, Any, Any]] = []

    def submit(si: int, rest: List[int]) -> None:
        shard = shards[si]
        if not rest or rr.cached(shard):
            return  # nothing left, or published meanwhile: the cache serves it
        budget = shard_budget(rr.store, shard.url, config, rr.budgets)  # the shard's one budget, shared
        needed = set(rest)
        # the first step reads no more than it needs (the first batch comes first)
        wide = _widen(rr, si, shard, rest) if rr.steps else rest
        st = sparse.lookup(rr.store, shard)
        with (st.cond if st is not None else contextlib.nullcontext()):
            groups = _groups(shard, wide, st.have if st is not None else None)
        for lo, hi, members in groups:
            jobs.append((si, budget, rr.pool().submit(fetch_group, rr, reader.on_event, shard, lo, hi, members, config,
                                                      budget, needed)))

    waits_now = Waits(STREAM_AHEAD, STREAM_STALL, WINDOW_AHEAD)  # the knobs as they are now
    pending: Dict[int, List[int]] = {}
    cands: Dict[int, List[Tuple[int, int]]] = {}
    for si, js in todo.items():
        # shuffled: samples just past a growing partial, or that a sparse download
        # writes now, are candidates to wait for
        near = None if stream else cands.setdefault(si, [])
        pending[si] = from_partial(rr, si, shards[si], js, stream, waits_now, near if rr.steps else None,
                                   sparse_near=near if rr.steps else None)
    waits: Dict[int, List[int]] = {}
    if any(cands.values()):
        # While this step's ranges are fetched (RANGE_THREADS connections at once),
        # a download on one connection at the same rate grows by about their bytes
        # over RANGE_THREADS: a sample that close past a partial's end is there by
        # the time the ranges are, so waiting for it costs the step nothing.
        nbytes = sum(shards[si].sample_range(j)[1] - shards[si].sample_range(j)[0]
                     for si, lst in pending.items() for j in lst)
        nbytes += sum(shards[si].sample_range(j)[1] - shards[si].sample_range(j)[0]
                      for si, c in cands.items() for j, _ in c)
        limit = min(WINDOW_AHEAD, nbytes // max(1, RANGE_THREADS))
        for si, c in cands.items():
            pending[si] += [j for j, d in c if d > limit]
            waits[si] = [j for j, d in c if d <= limit]
    for si, rest in pending.items():
        submit(si, rest)
    for si, near_js in waits.items():
        if near_js:  # what the download does not reach in time: by range
            st = sparse.lookup(rr.store, shards[si])
            rest = (wait_sparse(rr, si, shards[si], st, near_js, WINDOW_STALL, STREAM_AHEAD) if st is not None
                    else from_partial(rr, si, shards[si], near_js, True, waits_now, ahead=WINDOW_AHEAD,
                                      stall=WINDOW_STALL))
            rr.counters["window_waits"] += len(near_js)
            rr.counters["window_partial"] += len(near_js) - len(rest)
            submit(si, rest)
    errors: Dict[int, BaseException] = {}
    for si, _, fut in jobs:
        try:
            got = fut.result()
        except RangeIgnored:
            rr.off.add(si)  # the cache's whole-shard read serves it (also after a corrupt range)
            continue
        except (FetchError, IntegrityError, ShardFormatError) as err:
            errors.setdefault(si, blame_ranged(err))
            continue
        off = shards[si].offsets
        assert off is not None
        need = todo[si]
        for j, sample in got.items():
            rr.put((si, j), sample, int(off[j + 1]) - int(off[j]), "range")
        rr.counters["range_ahead"] += sum(1 for j in got if j not in need)
    for si, failure in errors.items():
        end_budget(rr.store, shards[si].url, rr.budgets)  # this read of the shard failed
        for key in [k for k in rr.ready if k[0] == si]:
            rr.drop(key)  # this shard's samples follow on_error together
        if not ahead:
            reader.fail(si, shards[si], failure)
    rr.trim(step)  # never what this step reads
    if not part:
        rr.steps += 1


def take_ready(ds: Any, si: int, j: int) -> Optional[Dict[str, Any]]:
    """A sample :func:`prepare` made ready, or None."""
    return _take(shard_reader(ds), si, j)


def _take(r: ShardReader, si: int, j: int) -> Optional[Dict[str, Any]]:
    if r.ranged is None or not r.ranged.ready:
        return None
    return r.ranged.take((si, j))
