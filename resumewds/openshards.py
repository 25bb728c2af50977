"""A process's open shards, and what reading them needs besides the order.

* :class:`ShardReader` -- a data set's reading state in one process: its open
  shards (the pinned cache leases of :meth:`resumewds.cache.ShardStore.acquire`
  and their file descriptors, least recently used closed first; ``wait`` sums
  the seconds blocked in ``acquire``, the ``t_fetch_wait`` stat), the shards
  that failed in this pass of steps (``failed``, reset by ``start``), a
  handler's stop (``stopping``), the ``on_error`` / webdataset ``handler``
  policy for a shard that cannot be fetched, verified or parsed (``fail``:
  raise, recording a ``fail`` event; skip it for the rest of the pass, a
  ``skip`` event; or stop), the event sink (``on_event``), the ranged reads
  (``ranged``, :mod:`resumewds.reading`) and the kernel's read-ahead of a
  step's local byte ranges (``hint_pages``).
* :func:`shard_reader` -- the dataset's reader, created on first use, sized
  to the shards a step can touch (a shuffle window per partition, or two in
  order); :func:`shard_failed`, :func:`hint_pages` ask it.
* :func:`run_length` -- how many of a step's next samples are consecutive
  samples of one shard (at most :data:`RUN_BYTES`: one ``pread``).

:mod:`resumewds.reading` reads the samples themselves (from these open
shards, or by verified ranges before a shard is cached).

Example:
    >>> run_length([], [(0, 1)], 0)
    1
"""

from __future__ import annotations

import logging
import os
import time
from collections import OrderedDict
from typing import Any, Callable, Dict, Optional, Sequence, Tuple

from .errors import CacheError, HandlerStop, IntegrityError, ShardFormatError, naming
from .events import EventKind
from .fetch import is_remote_url, local_path
from .manifest import ShardInfo

__all__ = ["DIGEST_STAGE", "RUN_BYTES", "ShardReader", "blame_manifest", "hint_pages", "run_length", "shard_failed",
           "shard_reader", "trusted"]

log = logging.getLogger("resumewds")

#: most bytes read with one pread when samples are consecutive
RUN_BYTES = 4 << 20
#: the ``stage`` of a ``sample_skip`` event for a sample that failed its digest
#: (the step counts it skipped when it reads it: :func:`resumewds.steps.finish_step`)
DIGEST_STAGE = "digest"


class ShardReader:
    """A data set's reading state in one process: its open shards (pinned cache leases
    and file descriptors, LRU), the shards that failed in this pass of steps, its
    ``on_error`` / ``handler`` policy, where its events go, its ranged reads.

    The data set keeps one (created on first use: :func:`shard_reader`) and asks it;
    pickling a data set for DataLoader workers drops it, so each process has its own.

    Args:
        store: the shard cache (:class:`resumewds.cache.ShardStore`).
        limit: most shards kept open.
        shards: the data set's shards (its manifest's), by index.
        on_error: ``"raise"`` or ``"skip"`` (:class:`resumewds.shardset.ShardDataset`).
        handler: webdataset's handler for a shard's error (None: ``on_error`` alone).
        on_event: the event sink, ``on_event(kind, url, **detail)``.
    """

    def __init__(self, store: Any, limit: int, shards: Sequence[ShardInfo] = (), *, on_error: str = "raise",
                 handler: Optional[Callable[[BaseException], bool]] = None,
                 on_event: Optional[Callable[..., None]] = None):
        self.store = store
        self.limit = max(2, limit)
        self.shards = shards
        self.on_error = on_error
        self.handler = handler
        self.on_event: Callable[..., None] = on_event if on_event is not None else _no_event
        self.open: OrderedDict[int, Tuple[Any, int]] = OrderedDict()
        self.wait = 0.0  # seconds blocked in store.acquire (stats: t_fetch_wait)
        self.ranged: Any = None  # samples of shards not cached yet: resumewds.reading.RangedReads (prepare)
        # shards whose samples the step engine (resumewds.stepengine) may read itself
        # (open): index -> (fd, offsets, url, verified); an entry lives
        # exactly as long as its fd is in ``open``
        self.fast: Dict[int, Tuple[int, Any, str, bool]] = {}
        #: shards that failed in this pass of steps (index -> error): skipped until :meth:`start`
        self.failed: Dict[int, str] = {}
        #: a handler said stop (``ignore_and_stop``): no more reads until :meth:`start`
        self.stopping = False
        #: open local shards whose samples are checked one by one against their digests
        #: (index -> the key of the file's "verified" mark; ``ShardStore.acquire_sampled``)
        self.sampled: Dict[int, str] = {}

    def start(self) -> None:
        """A pass of steps starts: no shard failed, no handler's stop yet.

        ``on_error="skip"``: a shard that failed is skipped for the rest of
        the pass by the process that saw it fail, and tried again by the next
        pass (the next epoch, or a resume), with 0 workers as with N.
        """
        self.failed = {}
        self.stopping = False
        if self.ranged is not None:
            self.ranged.new_pass()

    def fail(self, idx: int, shard: ShardInfo, exc: BaseException) -> None:
        """``on_error`` for shard ``idx`` that cannot be fetched, verified or parsed:
        record it as failed and re-raise ``exc`` (a ``fail`` event), or record it
        as skipped (a ``skip`` event), or (a webdataset handler returning False)
        stop: :class:`~resumewds.errors.HandlerStop`, and :attr:`stopping` is set."""
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
        digest; the shard's other samples are read as usual): re-raise ``exc``
        (a ``fail`` event), or skip the sample (a ``sample_skip`` event with its
        ``key``, counted as a skipped sample), or (a webdataset handler
        returning False) stop: :class:`~resumewds.errors.HandlerStop`."""
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
        """Ask the kernel to start reading the byte ranges of a step's samples
        of local shards (``posix_fadvise(WILLNEED)``), all at once: from a cold
        disk they then arrive in parallel instead of one ``pread`` after the
        other.  Advice only: the reads, their verification and errors are the
        usual ones; nothing here raises."""
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
                # a local shard with per-sample digests is opened without hashing it
                # whole: each of its samples is checked against its own digest (read);
                # any other shard's whole-file check ends before its first sample
                if opener is not None:
                    lease, key = opener(shard)
                else:
                    lease, key = self.store.acquire(shard), None
                try:
                    fd = os.open(lease.path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
                    break
                except FileNotFoundError as exc:
                    # removed after it was verified (damaged from outside and
                    # repaired by another process): acquire it again
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


def blame_manifest(exc: BaseException, shard: ShardInfo) -> BaseException:
    """``exc`` (a check of the shard's bytes against its index that failed) with the
    manifest the index came from named in its message, in place: a stale manifest
    (one found beside the shards, say) is then told from a damaged shard.

    Example:
        >>> e = blame_manifest(ShardFormatError("a.tar: bad"), ShardInfo("a.tar", index_source="m.json"))
        >>> str(e)
        'a.tar: bad (index from m.json)'
    """
    where = getattr(shard, "index_source", None)
    if where and isinstance(exc, (IntegrityError, ShardFormatError)) and exc.args and where not in str(exc):
        exc.args = (f"{exc.args[0]} (index from {where})",) + tuple(exc.args[1:])
    return exc


def shard_reader(ds: Any) -> ShardReader:
    """The dataset's open shards (created on first use)."""
    if ds._reader is None:
        # a shuffled window reads its shards at once (one window per
        # partition of this rank's node); in order, two are enough (fewer
        # pins: the cache_size budget holds better)
        parts = min(ds.plan_partitions, 8)
        windowed = str(ds.plan.algo).endswith("window")
        ds._reader = ShardReader(ds.store, ds.shuffle_window * parts + 2 if windowed else parts + 1,
                                 ds.manifest.shards, on_error=ds.on_error, handler=ds.handler,
                                 on_event=ds._on_event)
    return ds._reader


def trusted(store: Any, shard: ShardInfo) -> bool:
    """Whether the open copy of ``shard`` matched its xxh3_64 (the store
    verifies every copy that has one, unless ``verify="never"``): its
    samples are then parsed without recomputing header checksums."""
    return shard.xxh3_64 is not None and getattr(store, "verify", "never") != "never"


def shard_failed(ds: Any, shard_idx: int, shard: ShardInfo, exc: BaseException) -> None:
    """``on_error`` for a shard of ``ds``: its reader's :meth:`ShardReader.fail`."""
    shard_reader(ds).fail(shard_idx, shard, exc)


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


def hint_pages(ds: Any, where: Sequence[Tuple[int, int]]) -> None:
    """The kernel's read-ahead of a step's local byte ranges: :meth:`ShardReader.hint_pages`."""
    shard_reader(ds).hint_pages(where)


def _no_event(kind: str, url: str = "", **detail: Any) -> None:
    """The event sink of a reader without one."""
