"""A data set's open shards, and the one path that reads their samples.

A local shard's whole-file xxh3_64 is checked before any of its samples is
read, so a shard that mismatches is skipped whole under ``on_error="skip"``,
the same in every run and resume; a local shard with per-sample digests is
read sample by sample, each checked.  :func:`run_length`: how many of a
step's next samples one ``pread`` reads.

Example:
    >>> run_length([], [(0, 1)], 0)
    1
"""

from __future__ import annotations

import logging
import os
import time
from collections import OrderedDict
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

import xxhash

from ..errors import (
    CacheError,
    ChecksumMismatch,
    FetchError,
    HandlerStop,
    IntegrityError,
    ResumeWDSError,
    ShardFormatError,
    naming,
)
from ..events import EventKind
from ..fetch import is_remote_url, local_path
from ..manifest import ShardInfo
from ..tar import _io as tario

__all__ = ["DIGEST_STAGE", "RUN_BYTES", "WHOLE", "ShardReader", "blame_manifest", "run_length", "trusted",
           "verified_in"]

log = logging.getLogger("resumewds")

#: most bytes read with one pread when samples are consecutive
RUN_BYTES = 4 << 20
#: a ranged read's answer: read this shard the whole-shard way (:meth:`ShardReader.read`)
WHOLE = object()
#: the ``stage`` of a ``sample_skip`` event for a sample that failed its digest
#: (the step counts it skipped when it reads it: :meth:`resumewds.read._engine.StepBuilder.finish`)
DIGEST_STAGE = "digest"


class ShardReader:
    """A data set's reading state in one process, and its one read path.

    Its open shards (pinned cache leases and fds, LRU), the shards that failed
    in this pass of steps, a handler's stop, its ``on_error`` / ``handler``
    policy, its event sink and its ranged reads.  The data set makes one per
    process (:attr:`resumewds.read.ShardDataset.reader`; pickling drops it).

    Args:
        limit: most shards kept open.
        handler: webdataset's handler for a shard's error (None: ``on_error`` alone).
        on_event: the event sink, ``on_event(kind, url, **detail)``.
        ranged: samples of remote shards not cached yet may be read by verified ranges.
        run_bytes: most bytes one ``pread`` of consecutive samples reads (:meth:`read_run`).

    Example:
        >>> r = ShardReader(store, 4, manifest.shards)      # doctest: +SKIP
        >>> r.start(); r.read(0, 5)["__key__"]              # doctest: +SKIP
        'sample000005'
    """

    def __init__(self, store: Any, limit: int, shards: Sequence[ShardInfo] = (), *, on_error: str = "raise",
                 handler: Optional[Callable[[BaseException], bool]] = None,
                 on_event: Optional[Callable[..., None]] = None, ranged: bool = False,
                 run_bytes: int = RUN_BYTES):
        self.store = store
        self.limit = max(2, limit)
        self.shards = shards
        self.on_error = on_error
        self.handler = handler
        self.on_event: Callable[..., None] = on_event if on_event is not None else _no_event
        self.can_range = ranged
        self.run_bytes = run_bytes
        self.open: OrderedDict[int, Tuple[Any, int]] = OrderedDict()
        self.wait = 0.0  # seconds blocked in store.acquire (stats: t_fetch_wait)
        self.ranged: Any = None  # samples of shards not cached yet: resumewds.read._ranged.RangedReads (prepare)
        # open shards whose samples :meth:`read` takes with one pread and a parse:
        # index -> (fd, offsets, url, verified); an entry lives exactly as long as its fd is in ``open``
        self.fast: Dict[int, Tuple[int, Any, str, bool]] = {}
        #: shards that failed in this pass of steps (index -> error): skipped until :meth:`start`
        self.failed: Dict[int, str] = {}
        #: a handler said stop (``ignore_and_stop``): no more reads until :meth:`start`
        self.stopping = False
        #: open local shards whose samples are checked one by one against their digests
        #: (index -> the key of the file's "verified" mark; ``ShardStore.acquire_sampled``)
        self.sampled: Dict[int, str] = {}
        # shard -> its samples' member pattern (tario.learn_pattern), or () once it stopped paying
        self._patterns: Dict[int, Any] = {}
        self._misses: Dict[int, int] = {}

    def start(self) -> None:
        """A pass of steps starts: no shard failed (a skipped shard is tried again), no stop."""
        self.failed = {}
        self.stopping = False
        if self.ranged is not None:
            self.ranged.new_pass()

    def hit(self, si: int, j: int) -> Optional[Dict[str, Any]]:
        """Sample ``j`` of shard ``si`` if the shard is open: one ``pread`` and a parse.

        None when it is not open or has failed, or the read is short or malformed:
        :meth:`read`'s whole path then says what is wrong.
        """
        hit = self.fast.get(si)
        if hit is None or si in self.failed:
            return None
        fd, offs, url, verified = hit
        a = int(offs[j])
        size = int(offs[j + 1]) - a
        try:
            buf = os.pread(fd, size, a) if 0 <= size <= tario.CHECKED_PREAD else b""
            if len(buf) != size:
                return None
            pat = self._patterns.get(si) if verified else ()
            sample = tario.parse_sample_as(buf, pat) if pat else None
            if sample is None:
                sample = tario.parse_sample(buf, url, a, 0, size, verified)
                if pat != ():  # (): not verified, or no more tries
                    tario.learn_pattern(self._patterns, self._misses, si, sample, pat)
        except (OSError, ResumeWDSError):
            return None
        sample["__url__"] = url
        self.open.move_to_end(si)
        return sample

    def read(self, si: int, j: int) -> Optional[Dict[str, Any]]:
        """Sample ``j`` of shard ``si``, with its ``__url__``; None when it is skipped.

        An open shard's sample: :meth:`hit`.  Anything else takes the whole path,
        which acquires the shard and raises or skips as ``on_error`` / ``handler``
        say.  After a handler's stop, None until :meth:`start`.
        """
        if self.stopping or si in self.failed:
            return None
        sample = self.hit(si, j)
        if sample is not None:
            return sample
        try:
            return self._read(si, j)
        except HandlerStop:
            self.stopping = True
            return None

    def read_run(self, si: int, j: int, count: int) -> List[Optional[Dict[str, Any]]]:
        """Samples ``j .. j+count-1`` of shard ``si`` with one ``pread``.

        Same results, errors and skips as ``count`` calls of :meth:`read` (a
        malformed sample falls back to one-by-one reads), except that a shard
        read sample by sample against its digests returns the samples before
        the first that fails (fewer than ``count``; at least one item).
        """
        if self.stopping:
            return [None] * count
        try:
            return self._read_run(si, j, count)
        except HandlerStop:
            self.stopping = True
            return [None] * count

    def _read(self, si: int, j: int) -> Optional[Dict[str, Any]]:
        """:meth:`read` the whole way: by range, or from the acquired copy."""
        if self.ranged is not None and si not in self.open:
            got = self.ranged.sample(self, si, j)
            if got is not WHOLE:
                return got
        shard = self.shards[si]
        try:
            fd = self.fd(si, shard)
            start, end = shard.sample_range(j)
            if self._sampled(si):
                buf = tario._pread_range(fd, start, end, shard.url)
                if not verified_in(buf, start, shard, j):
                    self._bad_sample(si, j, shard, buf, start, end)
                    return None
                sample = tario.parse_sample(buf, shard.url, base=start, start=0, end=end - start, verified=True)
            else:
                verified = trusted(self.store, shard)
                sample = tario.read_sample(fd, start, end, shard.url, verified=verified)
                self.fast[si] = (fd, shard.offsets, shard.url, verified)
        except (FetchError, IntegrityError, ShardFormatError) as exc:
            self.fail(si, shard, exc)
            return None
        sample["__url__"] = shard.url
        return sample

    def _read_run(self, si: int, j: int, count: int) -> List[Optional[Dict[str, Any]]]:
        if count == 1 or si in self.failed or (
                self.ranged is not None and si not in self.open and self.ranged.by_range(self, si, j, count)):
            return [self.read(si, j + i) for i in range(count)]  # (not cached yet: by range, sample by sample)
        shard = self.shards[si]
        try:
            fd = self.fd(si, shard)
        except (FetchError, IntegrityError, ShardFormatError) as exc:
            self.fail(si, shard, exc)  # never a second fetch
            return [None] * count
        if self._sampled(si):  # each sample checked against its digest, in one pread
            return self._sampled_run(si, shard, fd, j, count)
        try:
            assert shard.offsets is not None
            samples: List[Optional[Dict[str, Any]]] = list(
                tario.read_samples(fd, shard.offsets, j, j + count - 1, shard.url,
                                   verified=trusted(self.store, shard)))
        except ShardFormatError:
            return [self.read(si, j + i) for i in range(count)]
        url = shard.url
        for sample in samples:
            sample["__url__"] = url  # type: ignore[index]
        return samples

    def _sampled(self, si: int) -> bool:
        """Whether the open shard ``si``'s samples are still checked one by one."""
        key = self.sampled.get(si)
        if key is not None and self.store.verified_key(key):
            del self.sampled[si]  # verified whole meanwhile (background): read as any verified shard
            return False
        return key is not None

    def _sampled_run(self, si: int, shard: ShardInfo, fd: int, j: int, count: int) -> List[Optional[Dict[str, Any]]]:
        """:meth:`read_run` of a shard whose samples are checked one by one: the
        samples up to the first that fails its digest (read next, on its own)."""
        assert shard.offsets is not None
        lo, hi = int(shard.offsets[j]), int(shard.offsets[j + count])
        try:
            buf = tario._pread_range(fd, lo, hi, shard.url)
        except ShardFormatError:
            return [self.read(si, j)]
        out: List[Optional[Dict[str, Any]]] = []
        for i in range(count):
            a, b = int(shard.offsets[j + i]), int(shard.offsets[j + i + 1])
            if not verified_in(buf, lo, shard, j + i):
                return out if out else [self.read(si, j)]
            try:
                sample = tario.parse_sample(buf, shard.url, base=a, start=a - lo, end=b - lo, verified=True)
            except ShardFormatError:
                return out if out else [self.read(si, j)]
            sample["__url__"] = shard.url
            out.append(sample)
        return out

    def _bad_sample(self, si: int, j: int, shard: ShardInfo, buf: bytes, start: int, end: int) -> None:
        """``on_error`` for sample ``j`` alone, whose bytes fail its digest."""
        assert shard.sample_digests is not None
        expected, actual = format(int(shard.sample_digests[j]), "016x"), xxhash.xxh3_64_hexdigest(buf)
        try:
            key = str(tario.parse_sample(buf, shard.url, base=start, start=0, end=end - start).get("__key__", "?"))
        except Exception:  # the bytes are bad: the key may be unreadable too
            key = "?"
        exc = ChecksumMismatch(f"{local_path(shard.url)}: sample {j} (key {key}, bytes {start}-{end}): xxh3_64 "
                               f"mismatch: expected {expected}, got {actual}", url=shard.url, expected=expected,
                               actual=actual)
        self.fail_sample(si, j, shard, exc, key)


    def fail(self, idx: int, shard: ShardInfo, exc: BaseException) -> None:
        """``on_error`` for shard ``idx`` that cannot be fetched, verified or parsed:
        re-raise ``exc`` (a ``fail`` event), skip the shard for this pass (a
        ``skip`` event), or (a handler returning False) raise HandlerStop."""
        reason = getattr(shard, "stop_reason", None)
        if reason:  # the stop marker of tariterators.salvage_shard
            exc = ShardFormatError(f"{reason} (the handler stops here)", shard=shard.url)
        blame_manifest(exc, shard)
        if self.on_error != "skip":
            # the loader takes this event with the error, to the journal and stats
            self.on_event(EventKind.FAIL, shard.url, error=str(exc))
            raise exc
        self.failed[idx] = str(exc)
        self.on_event(EventKind.SKIP, shard.url, error=str(exc))
        if self.handler is not None and not self.handler(exc):  # webdataset handler: stop
            self.stopping = True
            raise HandlerStop(str(exc)) from exc
        log.warning("skipping shard %s", naming(shard.url, exc))

    def fail_sample(self, idx: int, j: int, shard: ShardInfo, exc: BaseException, key: str = "?") -> None:
        """``on_error`` for sample ``j`` of shard ``idx`` alone (its bytes fail its
        digest), as :meth:`fail` with a ``sample_skip`` event for a skip."""
        blame_manifest(exc, shard)
        if self.on_error != "skip":
            self.on_event(EventKind.FAIL, shard.url, error=str(exc), sample=j)
            raise exc
        self.on_event(EventKind.SAMPLE_SKIP, shard.url, key=key, sample=j, stage=DIGEST_STAGE, error=str(exc))
        if self.handler is not None and not self.handler(exc):  # webdataset handler: stop
            self.stopping = True
            raise HandlerStop(str(exc)) from exc
        log.warning("skipping sample %s", exc)

    def hint_pages(self, where: Sequence[Tuple[int, int]]) -> None:
        """``posix_fadvise(WILLNEED)`` the byte ranges of a step's samples of local
        shards, all at once, so a cold disk reads them in parallel.  Never raises."""
        advise = getattr(os, "posix_fadvise", None)
        if advise is None:
            return
        shards, failed = self.shards, self.failed
        fds: Dict[int, int] = {}
        try:
            for si, j in where:
                shard = shards[si]
                fd = fds.get(si)
                if fd is None:
                    url = shard.url
                    if (si in failed or is_remote_url(url) or shard.offsets is None
                            or ("://" in url and not url.startswith("file://"))):
                        continue
                    try:
                        fd = fds[si] = os.open(local_path(shard.url), os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
                    except (OSError, ValueError):
                        continue
                try:
                    start, end = shard.sample_range(j)
                    advise(fd, start, end - start, os.POSIX_FADV_WILLNEED)
                except Exception:  # advice: the read reports what is wrong
                    pass
        finally:
            for fd in fds.values():
                os.close(fd)

    def fd(self, idx: int, shard: ShardInfo) -> int:
        """The open, verified copy of ``shard`` (index ``idx``), acquired if needed."""
        hit = self.open.get(idx)
        if hit is not None:
            self.open.move_to_end(idx)
            return hit[1]
        t0 = time.perf_counter()
        try:
            opener = getattr(self.store, "acquire_sampled", None)
            for attempt in range(3):
                # a local shard with sample digests is opened without hashing it whole
                if opener is not None:
                    lease, key = opener(shard)
                else:
                    lease, key = self.store.acquire(shard), None
                try:
                    fd = os.open(lease.path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
                    break
                except FileNotFoundError as exc:
                    # removed after it was verified (repaired by another process): again
                    lease.close()
                    if attempt == 2:
                        raise CacheError(f"{lease.path}: removed again and again between being "
                                         f"verified and opened ({shard.url})") from exc
                except OSError as exc:
                    lease.close()
                    raise CacheError(f"{lease.path}: cannot open the verified copy of {shard.url}: "
                                     f"{exc.strerror or exc}") from exc
        finally:
            self.wait += time.perf_counter() - t0
        self.open[idx] = (lease, fd)
        if key is not None:
            self.sampled[idx] = key
        while len(self.open) > self.limit:
            old, (old_lease, old_fd) = self.open.popitem(last=False)
            self.fast.pop(old, None)
            self.sampled.pop(old, None)
            os.close(old_fd)
            old_lease.close()
        return fd

    def close(self) -> None:
        """Close every open shard (and release its pin)."""
        if self.ranged is not None:
            self.ranged.close()
        self.fast.clear()
        self.sampled.clear()
        while self.open:
            _, (lease, fd) = self.open.popitem()
            try:
                os.close(fd)
            finally:
                lease.close()


def verified_in(buf: Any, lo: int, shard: ShardInfo, j: int) -> bool:
    """Whether sample ``j`` of ``shard``, within ``buf`` (which starts at byte ``lo``), matches its digest."""
    assert shard.offsets is not None and shard.sample_digests is not None
    a, b = int(shard.offsets[j]) - lo, int(shard.offsets[j + 1]) - lo
    return xxhash.xxh3_64_intdigest(memoryview(buf)[a:b]) == int(shard.sample_digests[j])


def blame_manifest(exc: BaseException, shard: ShardInfo) -> BaseException:
    """``exc`` (a failed check of the shard's bytes) naming, in place, the manifest its index came from.

    Example:
        >>> e = blame_manifest(ShardFormatError("a.tar: bad"), ShardInfo("a.tar", index_source="m.json"))
        >>> str(e)
        'a.tar: bad (index from m.json)'
    """
    where = getattr(shard, "index_source", None)
    if where and isinstance(exc, (IntegrityError, ShardFormatError)) and exc.args and where not in str(exc):
        exc.args = (f"{exc.args[0]} (index from {where})",) + tuple(exc.args[1:])
    return exc


def trusted(store: Any, shard: ShardInfo) -> bool:
    """Whether the open copy of ``shard`` matched its xxh3_64 (its samples are then
    parsed without recomputing header checksums)."""
    return shard.xxh3_64 is not None and getattr(store, "verify", "never") != "never"


def run_length(shards: Sequence[ShardInfo], where: Sequence[Tuple[int, int]], i: int,
               limit_bytes: int = RUN_BYTES) -> int:
    """How many of ``where[i:]`` are consecutive samples of one shard,
    within ``limit_bytes`` (one sample at least)."""
    si, j = where[i]
    n = len(where)
    if i + 1 >= n or where[i + 1] != (si, j + 1):
        return 1  # the rule when shuffled: no offsets touched
    offsets = shards[si].offsets
    if offsets is None:
        return 1
    run = 1
    limit = int(offsets[j]) + limit_bytes
    while i + run < n and where[i + run] == (si, j + run) and int(offsets[j + run + 1]) <= limit:
        run += 1
    return run


def _no_event(kind: str, url: str = "", **detail: Any) -> None:
    """The event sink of a reader without one."""
