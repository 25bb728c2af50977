"""Shard reading: from ``(shard index, sample index)`` to a sample dict.

What :class:`resumewds.dataset.WebDataset` calls to read the samples of a
step, apart from the order (:mod:`resumewds.plan`) and the stages
(:mod:`resumewds.pipeline`).  A map of this module:

* :class:`ShardReader` -- a process's open shards: the pinned cache leases
  (:meth:`resumewds.cache.ShardStore.acquire`) and their file descriptors,
  least recently used closed first; ``wait`` sums the seconds blocked in
  ``acquire`` (the ``t_fetch_wait`` stat).
* :func:`shard_reader` -- the dataset's reader, created on first use, sized
  to the shards a step can touch (a shuffle window per partition, or two in
  order).
* :func:`read` -- one sample (``tario.read_sample`` on the open copy);
  :func:`read_run` -- consecutive samples of one shard with one ``pread``
  (same results, errors and skips as one by one); :func:`run_length` -- how
  many of a step's next samples make such a run (at most :data:`RUN_BYTES`).
* :func:`shard_failed` -- ``on_error`` / webdataset's ``handler`` for a shard
  that cannot be fetched, verified or parsed: raise (recording a ``fail``
  event), skip it for the rest of the iteration (``skip`` event), or stop.

The reader state lives on the dataset (``ds._reader``, ``ds._failed``) so
that pickling a dataset for DataLoader workers drops it (``__getstate__``)
and the loader and mixtures can read ``_failed`` and ``_reader.wait``.

Example:
    >>> ds = WebDataset("data/shard-{000000..000003}.tar")            # doctest: +SKIP
    >>> read(ds, 0, 5)["__key__"]                                     # doctest: +SKIP
    'sample000005'
"""

from __future__ import annotations

import logging
import os
import time
from collections import OrderedDict
from typing import Any, Dict, List, Optional, Sequence, Tuple

from . import tario
from .errors import CacheError, FetchError, IntegrityError, ShardFormatError
from .events import EventKind
from .manifest import ShardInfo
from .pipeline import HandlerStop

__all__ = ["RUN_BYTES", "ShardReader", "read", "read_run", "run_length", "shard_failed", "shard_reader"]

log = logging.getLogger("resumewds")

#: most bytes read with one pread when samples are consecutive
RUN_BYTES = 4 << 20


class ShardReader:
    """Per-process open shards: pinned cache leases and file descriptors (LRU)."""

    def __init__(self, store: Any, limit: int):
        self.store = store
        self.limit = max(2, limit)
        self.open: OrderedDict[int, Tuple[Any, int]] = OrderedDict()
        self.wait = 0.0  # seconds blocked in store.acquire (stats: t_fetch_wait)

    def fd(self, idx: int, shard: ShardInfo) -> int:
        """The open, verified copy of ``shard`` (index ``idx``), acquired if needed."""
        hit = self.open.get(idx)
        if hit is not None:
            self.open.move_to_end(idx)
            return hit[1]
        t0 = time.perf_counter()
        try:
            for attempt in range(3):
                lease = self.store.acquire(shard)
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
        while len(self.open) > self.limit:
            _, (old_lease, old_fd) = self.open.popitem(last=False)
            os.close(old_fd)
            old_lease.close()
        return fd

    def close(self) -> None:
        """Close every open shard (and release its pin)."""
        while self.open:
            _, (lease, fd) = self.open.popitem()
            try:
                os.close(fd)
            finally:
                lease.close()


def shard_reader(ds: Any) -> ShardReader:
    """The dataset's open shards (created on first use)."""
    if ds._reader is None:
        # a shuffled window reads its shards at once (one window per
        # partition of this rank's node); in order, two are enough (fewer
        # pins: the cache_size budget holds better)
        parts = min(ds.plan_partitions, 8)
        windowed = str(ds.plan.algo).endswith("window")
        ds._reader = ShardReader(ds.store, ds.shuffle_window * parts + 2 if windowed else parts + 1)
    return ds._reader


def read(ds: Any, shard_idx: int, j: int) -> Optional[Dict[str, Any]]:
    """Read sample ``j`` of shard ``shard_idx``; None if the shard is skipped."""
    if shard_idx in ds._failed:
        return None
    shard = ds.manifest.shards[shard_idx]
    try:
        fd = shard_reader(ds).fd(shard_idx, shard)
        start, end = shard.sample_range(j)
        sample = tario.read_sample(fd, start, end, shard.url)
    except (FetchError, IntegrityError, ShardFormatError) as exc:
        shard_failed(ds, shard_idx, shard, exc)
        return None
    sample["__url__"] = shard.url
    return sample


def shard_failed(ds: Any, shard_idx: int, shard: ShardInfo, exc: BaseException) -> None:
    """``on_error``: record the shard as failed and re-raise ``exc``, or
    record it as skipped."""
    if ds.on_error != "skip":
        # the loader takes this event with the error, to the journal and stats
        ds._on_event(EventKind.FAIL, shard.url, error=str(exc))
        raise exc
    if ds.handler is not None and not ds.handler(exc):  # webdataset handler: stop
        ds._failed[shard_idx] = str(exc)
        ds._on_event("skip", shard.url, error=str(exc))
        raise HandlerStop(str(exc)) from exc
    ds._failed[shard_idx] = str(exc)
    ds._on_event(EventKind.SKIP, shard.url, error=str(exc))
    log.warning("skipping shard %s: %s", shard.url, exc)


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


def read_run(ds: Any, shard_idx: int, j: int, count: int) -> List[Optional[Dict[str, Any]]]:
    """Samples ``j .. j+count-1`` of one shard with one ``pread``.

    Same results, errors and skips as ``count`` calls of :func:`read`:
    a shard that cannot be fetched fails (or is skipped) once, and on a
    malformed sample it falls back to one-by-one reads of the open file,
    so the samples before the bad one are delivered exactly as they would
    be one by one.
    """
    if count == 1 or shard_idx in ds._failed:
        return [ds._read(shard_idx, j + i) for i in range(count)]
    shard = ds.manifest.shards[shard_idx]
    try:
        fd = shard_reader(ds).fd(shard_idx, shard)
    except (FetchError, IntegrityError, ShardFormatError) as exc:
        shard_failed(ds, shard_idx, shard, exc)  # never a second fetch
        return [None] * count
    try:
        assert shard.offsets is not None
        samples: List[Optional[Dict[str, Any]]] = list(
            tario.read_samples(fd, shard.offsets, j, j + count - 1, shard.url))
    except ShardFormatError:
        return [ds._read(shard_idx, j + i) for i in range(count)]
    url = shard.url
    for sample in samples:
        sample["__url__"] = url  # type: ignore[index]
    return samples
