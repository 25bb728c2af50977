"""WebDataset: the composition of source, cache, plan, tar reading and stages.

A :class:`WebDataset` is a *definition*: sources, seed, shuffle settings and a
list of stages.  It produces batches for any ``(epoch, start position,
layout, worker)`` by computing which global positions those are
(:mod:`resumewds.plan`), reading exactly those samples' byte ranges from
local or cached shards (:mod:`resumewds.tario`, :mod:`resumewds.cache`), and
running the stages.  It never reads a sample it does not deliver, so resuming
at position ``n`` costs the same for any ``n``.

It does not import torch; :class:`resumewds.loader.WebLoader` wraps it in a
DataLoader.  Iterating a WebDataset directly yields samples of epoch 0 (or
of ``ds.epoch``) in order, in this process.

Example:
    >>> ds = (WebDataset("data/shard-{000000..000003}.tar", seed=7, shuffle=True)  # doctest: +SKIP
    ...       .decode("pil").to_tuple("jpg;png", "cls"))
    >>> img, cls = next(iter(ds))                                                 # doctest: +SKIP
"""

from __future__ import annotations

import logging
import os
import time
from collections import OrderedDict
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union

from . import tario
from .errors import (CacheError, ChecksumMismatch, FetchError, IntegrityError, ResumeWDSError,
                     ShardFormatError, SourceError)
from .events import EventKind
from .manifest import Manifest, ShardInfo
from .pipeline import (Decoder, MapDict, MapTuple, Rename, Select, ToTuple, default_collate,
                       list_collate)
from .plan import Layout, Plan, check_partitions, worker_steps
from .sources import Source, resolve_sources
from .stats import event_record

log = logging.getLogger("resumewds")

_RUN_BYTES = 4 << 20  # most bytes read with one pread when samples are consecutive

ON_ERROR = ("raise", "skip")


def index_manifest(manifest: Manifest, store: Any = None,
                   progress: Optional[Callable[[int], None]] = None,
                   on_event: Optional[Callable[..., None]] = None) -> Manifest:
    """Index every shard of ``manifest`` that is not indexed yet (in place).

    Remote shards are fetched into the cache first.  A shard whose manifest
    checksum or size disagrees with its bytes raises ChecksumMismatch.

    Args:
        manifest: the manifest to complete.
        store: a :class:`resumewds.cache.ShardStore` (default: a new one).
        progress: called with 1 after each shard.

    Returns:
        The same manifest, now indexed.
    """
    todo = [s for s in manifest.shards if not s.indexed]
    if not todo:
        return manifest
    if store is None:
        from .cache import ShardStore

        store = ShardStore(on_event=on_event)
    for s in todo:
        path = store.ensure(s)
        t0 = time.perf_counter()
        idx = tario.scan_file(path, s.url)
        if s.size is not None and s.size != idx.size:
            raise ChecksumMismatch(s.url, str(s.size), str(idx.size), what="size")
        if s.xxh3_64 is not None and s.xxh3_64 != idx.xxh3_64:
            raise ChecksumMismatch(s.url, s.xxh3_64, idx.xxh3_64)
        s.size, s.xxh3_64, s.samples, s.offsets = idx.size, idx.xxh3_64, idx.samples, idx.offsets
        log.debug("indexed %s: %d samples, %d bytes in %.3fs", s.url, idx.samples, idx.size,
                  time.perf_counter() - t0)
        if progress:
            progress(1)
    manifest._starts = None
    return manifest


class _ShardReader:
    """Per-process open shards: pinned cache leases and file descriptors (LRU)."""

    def __init__(self, store: Any, limit: int):
        self.store = store
        self.limit = max(2, limit)
        self.open: "OrderedDict[int, Tuple[Any, int]]" = OrderedDict()
        self.wait = 0.0  # seconds blocked in store.acquire (stats: t_fetch_wait)

    def fd(self, idx: int, shard: ShardInfo) -> int:
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
        while self.open:
            _, (lease, fd) = self.open.popitem()
            try:
                os.close(fd)
            finally:
                lease.close()


class WebDataset:
    """A resumable, deterministic WebDataset.

    Args:
        urls: a path, URL, brace pattern, ``pipe:`` command or manifest.json,
            or a list of them, or a :class:`~resumewds.manifest.Manifest`.
        seed: seed of the order (same seed, same order on any machine).
        shuffle: False: manifest order; True / ``"window"``: shard order
            permuted per epoch and samples shuffled within windows of
            ``shuffle_window`` shards; ``"shards"``: shard order only.
        shuffle_window: shards per shuffle window.
        cache_dir, cache_size, verify: passed to the shard cache
            (:class:`resumewds.cache.ShardStore`).
        fetch: a :class:`resumewds.fetch.FetchConfig` (timeouts, retries).
        on_error: ``"raise"`` (default) stops at a shard that cannot be
            fetched or verified (recording it as failed); ``"skip"`` skips its
            samples, records it as failed and reports it in stats and the
            journal.  A skipped shard is skipped for the rest of the epoch
            (by each process that reads it) and tried again in the next
            epoch, whatever ``num_workers``; once it delivers samples again
            the journal no longer calls it failed.
        allow_pickle: let decoders unpickle (pkl/pyd): off by default.
        allow_remote_pipe: accept ``pipe:`` urls from a manifest fetched over
            the network.
        prefetch: how many upcoming shards to download in the background.
        partitions: node-local partitions of the order (:class:`resumewds.plan.Plan`);
            None: the number of nodes at the run's start (a resume keeps the
            run's recorded count); 1: one order over all shards.

    Example:
        >>> ds = WebDataset(["a.tar", "b.tar"], seed=3).decode().to_tuple("txt", "cls")  # doctest: +SKIP
    """

    def __init__(self, urls: Source, *, seed: int = 0, shuffle: Union[bool, str] = False,
                 shuffle_window: int = 8, cache_dir: Optional[str] = None,
                 cache_size: Union[int, str, None] = None, verify: str = "once",
                 fetch: Any = None, on_error: str = "raise", allow_pickle: bool = False,
                 allow_remote_pipe: bool = False, prefetch: int = 4,
                 partitions: Optional[int] = None):
        if on_error not in ON_ERROR:
            raise ValueError(f"on_error must be one of {ON_ERROR}, got {on_error!r}")
        if verify not in ("once", "always", "never"):
            raise ValueError(f"verify must be 'once', 'always' or 'never', got {verify!r}")
        self.urls = urls
        self.seed = int(seed)
        self.shuffle = shuffle
        self.shuffle_window = int(shuffle_window)
        self.cache_dir = cache_dir
        self.cache_size = cache_size
        self.verify = verify
        self.fetch = fetch
        self.on_error = on_error
        self.allow_pickle = allow_pickle
        self.allow_remote_pipe = allow_remote_pipe
        self.prefetch_depth = int(prefetch)
        self.stages: List[Callable[[Any], Any]] = []
        self.batch_stages: List[Callable[[Any], Any]] = []
        self.batch_size: Optional[int] = None
        self.collate_fn: Optional[Callable[[List[Any]], Any]] = None
        self.epoch = 0
        self._manifest: Optional[Manifest] = None
        self._plan: Optional[Plan] = None
        self._store: Any = None
        self._reader: Optional[_ShardReader] = None
        self._events: List[Dict[str, Any]] = []
        self._failed: Dict[int, str] = {}
        self.partitions = partitions  # requested; None: resolved by the loader
        self.plan_partitions = 1 if partitions is None else check_partitions(partitions)
        Plan([1], seed, shuffle, shuffle_window, self.plan_partitions)  # validate settings early

    # ---- fluent stages (WebDataset's API) -------------------------------
    def _add(self, fn: Callable[[Any], Any]) -> "WebDataset":
        (self.batch_stages if self.batch_size is not None else self.stages).append(fn)
        return self

    def decode(self, *handlers: Union[str, Callable[[str, bytes], Any]],
               allow_pickle: Optional[bool] = None) -> "WebDataset":
        """Decode members: image specs ("pil", "rgb8", "torchrgb"...) and/or callables."""
        ap = self.allow_pickle if allow_pickle is None else allow_pickle
        return self._add(Decoder(handlers, allow_pickle=ap))

    def to_tuple(self, *specs: str) -> "WebDataset":
        """Turn samples into tuples: ``to_tuple("jpg;png", "cls")``."""
        return self._add(ToTuple(*specs))

    def map(self, fn: Callable[[Any], Any]) -> "WebDataset":
        """Apply ``fn`` to each sample (or each batch, after ``batched``)."""
        return self._add(fn)

    def map_dict(self, **fns: Callable[[Any], Any]) -> "WebDataset":
        """Apply functions to named fields of dict samples."""
        return self._add(MapDict(**fns))

    def map_tuple(self, *fns: Optional[Callable[[Any], Any]]) -> "WebDataset":
        """Apply functions to the fields of tuple samples, by position."""
        return self._add(MapTuple(*fns))

    def select(self, predicate: Callable[[Any], bool]) -> "WebDataset":
        """Keep only samples for which ``predicate`` is true.

        Filtering happens inside a batch: the batch of positions
        ``[k*B, (k+1)*B)`` keeps its survivors, so batches may be smaller, and
        resume stays exact.
        """
        if self.batch_size is not None:
            raise ValueError("select() must come before batched()")
        return self._add(Select(predicate))

    def rename(self, keep: bool = False, **kw: str) -> "WebDataset":
        """Rename fields: ``rename(image="jpg;png", label="cls")``."""
        return self._add(Rename(keep=keep, **kw))

    def batched(self, batch_size: int, collation_fn: Optional[Callable[[List[Any]], Any]] = default_collate,
                partial: bool = True) -> "WebDataset":
        """Batch samples; later stages apply to batches.

        ``partial`` is accepted for WebDataset compatibility; the final short
        batch of an epoch is governed by the loader's ``remainder`` policy.
        """
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.batch_size = int(batch_size)
        self.collate_fn = collation_fn if collation_fn is not None else list_collate
        return self

    # ---- state shared with the loader ----------------------------------
    @property
    def manifest(self) -> Manifest:
        """The resolved, indexed manifest (resolving and indexing on first use)."""
        if self._manifest is None:
            m = resolve_sources(self.urls, fetch_config=self.fetch,
                                allow_remote_pipe=self.allow_remote_pipe, cache_dir=self.cache_dir)
            if not m.indexed:
                index_manifest(m, self.store, on_event=self._on_event)
            self._manifest = m
        return self._manifest

    @property
    def plan(self) -> Plan:
        if self._plan is None:
            self._plan = Plan(self.manifest.counts, self.seed, self.shuffle, self.shuffle_window,
                              self.plan_partitions)
        return self._plan

    def use_partitions(self, n: int) -> None:
        """Set the partition count the plan uses (the loader resolves None)."""
        if int(n) != self.plan_partitions:
            self.plan_partitions = int(n)
            self._plan = None

    @property
    def store(self) -> Any:
        if self._store is None:
            from .cache import ShardStore

            self._store = ShardStore(cache_dir=self.cache_dir, cache_size=self.cache_size,
                                     verify=self.verify, fetch=self.fetch, on_event=self._on_event)
        return self._store

    def config(self) -> Dict[str, Any]:
        """What the delivered order depends on (checked on resume)."""
        d = {"manifest": self.manifest.digest(), "samples": self.manifest.total_samples,
             "shards": len(self.manifest.shards)}
        d.update(self.plan.describe())
        return d

    def _on_event(self, kind: str, url: str = "", **detail: Any) -> None:
        self._events.append(event_record(kind, url, detail))  # logs it, once, here

    def take_events(self) -> List[Dict[str, Any]]:
        ev, self._events = self._events, []
        return ev

    def __getstate__(self) -> Dict[str, Any]:
        self.manifest  # index before pickling so workers never re-index
        d = dict(self.__dict__)
        d["_store"] = None
        d["_reader"] = None
        d["_events"] = []
        d["_plan"] = None
        return d

    # ---- reading ---------------------------------------------------------
    def _read(self, shard_idx: int, j: int) -> Optional[Dict[str, Any]]:
        """Read sample ``j`` of shard ``shard_idx``; None if the shard is skipped."""
        if shard_idx in self._failed:
            return None
        shard = self.manifest.shards[shard_idx]
        try:
            fd = self._shard_reader().fd(shard_idx, shard)
            start, end = shard.sample_range(j)
            sample = tario.read_sample(fd, start, end, shard.url)
        except (FetchError, IntegrityError, ShardFormatError) as exc:
            self._shard_failed(shard_idx, shard, exc)
            return None
        sample["__url__"] = shard.url
        return sample

    def _shard_reader(self) -> "_ShardReader":
        """This process's open shards (created on first use)."""
        if self._reader is None:
            # a shuffled window reads its shards at once (one window per
            # partition of this rank's node); in order, two are enough (fewer
            # pins: the cache_size budget holds better)
            parts = min(self.plan_partitions, 8)
            windowed = str(self.plan.algo).endswith("window")
            self._reader = _ShardReader(self.store, self.shuffle_window * parts + 2 if windowed else parts + 1)
        return self._reader

    def _shard_failed(self, shard_idx: int, shard: ShardInfo, exc: BaseException) -> None:
        """``on_error``: record the shard as failed and re-raise ``exc``, or
        record it as skipped."""
        if self.on_error != "skip":
            # the loader takes this event with the error, to the journal and stats
            self._on_event(EventKind.FAIL, shard.url, error=str(exc))
            raise exc
        self._failed[shard_idx] = str(exc)
        self._on_event(EventKind.SKIP, shard.url, error=str(exc))
        log.warning("skipping shard %s: %s", shard.url, exc)

    def _run_length(self, where: Sequence[Tuple[int, int]], i: int) -> int:
        """How many of ``where[i:]`` are consecutive samples of one shard,
        within :data:`_RUN_BYTES` (one sample at least)."""
        si, j = where[i]
        n = len(where)
        if i + 1 >= n or where[i + 1] != (si, j + 1):
            return 1  # the rule when shuffled: no offsets touched
        offsets = self.manifest.shards[si].offsets
        if offsets is None:
            return 1
        run = 1
        limit = int(offsets[j]) + _RUN_BYTES
        while i + run < n and where[i + run] == (si, j + run) and int(offsets[j + run + 1]) <= limit:
            run += 1
        return run

    def _read_run(self, shard_idx: int, j: int, count: int) -> List[Optional[Dict[str, Any]]]:
        """Samples ``j .. j+count-1`` of one shard with one ``pread``.

        Same results, errors and skips as ``count`` calls of :meth:`_read`:
        a shard that cannot be fetched fails (or is skipped) once, and on a
        malformed sample it falls back to one-by-one reads of the open file,
        so the samples before the bad one are delivered exactly as they would
        be one by one.
        """
        if count == 1 or shard_idx in self._failed:
            return [self._read(shard_idx, j + i) for i in range(count)]
        shard = self.manifest.shards[shard_idx]
        try:
            fd = self._shard_reader().fd(shard_idx, shard)
        except (FetchError, IntegrityError, ShardFormatError) as exc:
            self._shard_failed(shard_idx, shard, exc)  # never a second fetch
            return [None] * count
        try:
            assert shard.offsets is not None
            samples: List[Optional[Dict[str, Any]]] = list(
                tario.read_samples(fd, shard.offsets, j, j + count - 1, shard.url))
        except ShardFormatError:
            return [self._read(shard_idx, j + i) for i in range(count)]
        url = shard.url
        for sample in samples:
            sample["__url__"] = url  # type: ignore[index]
        return samples

    def _apply(self, stages: Sequence[Callable[[Any], Any]], x: Any) -> Any:
        for st in stages:
            x = st(x)
            if x is None:
                return None
        return x

    def iter_steps(self, epoch: int, start: int, layout: Layout, worker: int = 0,
                   num_workers: int = 1, collate: bool = True,
                   collate_fn: Optional[Callable[[List[Any]], Any]] = None
                   ) -> Iterator[Tuple[int, Any, Dict[str, Any]]]:
        """Yield ``(step, batch, meta)`` for this worker's steps of an epoch.

        Args:
            epoch: the epoch.
            start: global position to start from.
            layout: batch size, world size, rank, remainder policy.
            worker, num_workers: this DataLoader worker's share (round-robin
                over steps).
            collate: collate samples with the batch's collate function; if
                False the batch is the list of samples.
            collate_fn: the collate function (default: the one of
                ``batched()``, else torch-free ``default_collate``).

        ``meta`` has: ``worker``, ``step``, ``samples`` (delivered),
        ``pads``, ``skipped``, ``filtered``, ``bytes``, ``shards`` (samples
        per shard index), ``positions``, ``slot_index`` and ``pad_flags``
        (per delivered sample: its epoch position, its index in the step's
        slots, whether it is padding), ``batch_dropped`` (a batch stage
        returned None), ``t_read``, ``t_stages`` and ``t_fetch_wait``
        (seconds), ``events``.
        """
        ep = self.plan.epoch(epoch)
        total = len(ep)
        nsteps = layout.num_steps(total, start)
        shards = self.manifest.shards
        # on_error="skip": a shard that failed is skipped for the rest of this
        # iteration by the process that saw it fail, and tried again by the
        # next one (the next epoch, or a resume), with 0 workers as with N
        # (workers get a fresh copy of the dataset per iteration anyway)
        self._failed = {}
        collate_fn = collate_fn or self.collate_fn or default_collate
        last_window = -1
        sample_at, read, stages = ep.sample_at, self._read, self.stages
        names: Dict[int, str] = {}
        for k in worker_steps(nsteps, worker, num_workers):
            slots = layout.slots(total, start, k)
            meta: Dict[str, Any] = {"worker": worker, "step": k, "samples": 0, "pads": 0,
                                    "skipped": 0, "filtered": 0, "bytes": 0, "shards": {},
                                    "positions": [], "slot_index": [], "pad_flags": []}
            t_read = t_stages = 0.0
            out: List[Any] = []
            if slots:
                w = ep.window_of(slots[0][0])
                if w != last_window and self.prefetch_depth > 0:
                    last_window = w
                    # this window's shards (a shuffled window touches all of
                    # them at once) and then ``prefetch`` shards beyond it;
                    # cached ones are left out by the store
                    here = ep.window_shards(w)
                    upcoming = [shards[i] for i in ep.shards_from(slots[0][0],
                                                                  len(here) + self.prefetch_depth)]
                    if upcoming:
                        try:
                            self.store.prefetch(upcoming, depth=len(upcoming), window=len(here))
                        except ResumeWDSError:
                            pass  # surfaces again when the shard is read
            # With padding in a step, every sample carries __pad__ (True/False)
            # so that collation keeps the flag for the whole batch.
            any_pad = any(p for _, p in slots)
            per_shard = meta["shards"]
            positions = meta["positions"]
            slot_index = meta["slot_index"]
            pad_flags = meta["pad_flags"]
            nbytes = skipped = filtered = pads = 0
            t0 = time.perf_counter()
            # consecutive samples of one shard (the rule unshuffled) are read
            # with one pread: fewer syscalls, and fewer GIL hand-offs to the
            # prefetch threads
            where = [sample_at(pos) for pos, _ in slots]
            ahead: List[Optional[Dict[str, Any]]] = []
            for i, (pos, pad) in enumerate(slots):
                si, j = where[i]
                if not ahead:
                    run = self._run_length(where, i)
                    ahead = self._read_run(si, j, run) if run > 1 else [read(si, j)]
                    ahead.reverse()
                sample = ahead.pop()
                t1 = time.perf_counter()
                t_read += t1 - t0
                if sample is None:
                    skipped += 1
                    t0 = t1
                    continue
                # members only: __key__ and __url__ are the only dunder keys so far
                nbytes += sum(map(len, sample.values())) - len(sample["__key__"]) - len(sample["__url__"])
                sample["__epoch__"] = epoch
                sample["__index__"] = pos
                name = names.get(si)
                if name is None:
                    name = names[si] = shards[si].name
                sample["__shard__"] = name
                if any_pad:
                    sample["__pad__"] = bool(pad)
                if pad:
                    pads += 1
                else:
                    per_shard[si] = per_shard.get(si, 0) + 1
                x = sample
                for st in stages:
                    x = st(x)
                    if x is None:
                        break
                t0 = time.perf_counter()
                t_stages += t0 - t1
                if x is None:
                    filtered += 1
                    continue
                out.append(x)
                positions.append(pos)
                slot_index.append(i)
                pad_flags.append(bool(pad))
            meta["samples"] = len(out)
            meta["bytes"] = nbytes
            meta["skipped"] = skipped
            meta["filtered"] = filtered
            meta["pads"] = pads
            t2 = time.perf_counter()
            batch: Any = out
            if collate and out:
                batch = collate_fn(out)
                batch = self._apply(self.batch_stages, batch)
                if batch is None:
                    # a batch stage returned None: the batch is dropped, as a
                    # sample stage's None drops a sample (counted as filtered);
                    # the loader hands out an EmptyBatch for the step
                    meta["filtered"] += len(out)
                    meta["samples"] = 0
                    meta["batch_dropped"] = True
                    batch = []
            t_stages += time.perf_counter() - t2
            meta["t_read"] = t_read
            meta["t_stages"] = t_stages
            if self._reader is not None:
                meta["t_fetch_wait"], self._reader.wait = self._reader.wait, 0.0
            meta["events"] = self.take_events()
            if shards and self._failed:
                meta["failed"] = {shards[i].url: e for i, e in self._failed.items()}
            yield k, batch, meta

    def __iter__(self) -> Iterator[Any]:
        """Yield the samples of epoch ``self.epoch`` in order, in this process."""
        layout = Layout(batch_size=64)
        for _, batch, _ in self.iter_steps(self.epoch, 0, layout, collate=False):
            yield from batch

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None
        if self._store is not None and hasattr(self._store, "close"):
            self._store.close()


def build_manifest(urls: Source, output: Optional[str] = None, *, store: Any = None,
                   progress: Optional[Callable[[int], None]] = None, offsets: str = "auto",
                   digests: bool = False) -> Manifest:
    """Index shards and (optionally) write a manifest.json.

    Args:
        urls: paths, patterns, URLs (anything :class:`WebDataset` accepts).
        output: where to write the manifest (urls relative to it), or None.
        store: shard cache for remote shards (default: a new ShardStore).
        progress: called with 1 after each shard is indexed.
        offsets: ``"inline"`` (offsets in the JSON), ``"file"`` (a binary
            side file, memory-mapped by readers: for very large data sets),
            or ``"auto"``: a side file above 1,000,000 samples.
        digests: also record each sample's xxh3_64 (manifest version 3,
            :mod:`resumewds.digests`; ``resumewds index`` does by default).

    Returns:
        The indexed :class:`~resumewds.manifest.Manifest`.

    Example:
        >>> m = build_manifest("data/shard-{000000..000031}.tar", "data/manifest.json")  # doctest: +SKIP
        >>> m.total_samples                                                            # doctest: +SKIP
        32000
    """
    m = resolve_sources(urls)
    index_manifest(m, store, progress=progress)
    if digests:
        from .digests import add_sample_digests

        add_sample_digests(m, store)
    if output is not None:
        if offsets == "auto":
            offsets = "file" if m.total_samples > 1_000_000 else "inline"
        m.save(output, offsets=offsets)
    return m
