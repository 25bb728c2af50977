"""ShardDataset: the engine's data set, composing source, cache, plan, tar reading and stages.

A :class:`ShardDataset` is a *definition*: sources, seed, shuffle settings and a
list of stages.  It produces batches for any ``(epoch, start position,
layout, worker)`` by computing which global positions those are
(:mod:`resumewds.plan`), reading exactly those samples' byte ranges from
local or cached shards (:mod:`resumewds.tario`, :mod:`resumewds.cache`,
:mod:`resumewds.reading`), and running the stages.  It never reads a sample
it does not deliver, so resuming at position ``n`` costs the same for any ``n``.

It does not import torch; :class:`resumewds.WebLoader` wraps it in a
DataLoader.  Iterating it directly yields samples of epoch 0 (or of
``ds.epoch``) in order, in this process (:class:`resumewds.direct.DirectDataset`).
:class:`resumewds.WebDataset` is this class with webdataset's constructor
arguments and fluent methods (the wing, :mod:`resumewds.wds.webdataset`).

Example:
    >>> ds = (ShardDataset("data/shard-{000000..000003}.tar", seed=7, shuffle=True)  # doctest: +SKIP
    ...       .decode("pil").to_tuple("jpg;png", "cls"))
    >>> img, cls = next(iter(ds))                                                   # doctest: +SKIP
"""

from __future__ import annotations

import copy
import logging
import warnings
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Tuple, Union

from . import config
from ._torchreg import register_iterable_dataset
from .beside import fill_from_beside
from .cache import ShardStore
from .events import event_record
from .handling import reraise_exception
from .indexing import index_manifest, index_skipping
from .manifest import Manifest, ShardInfo
from .openshards import RUN_BYTES
from .openshards import ShardReader as _ShardReader
from .plan import Layout, Plan, check_partitions, worker_steps
from .shardindex import Counted
from .shardsplit import SplitSequence, empty_worker_error
from .sources import Source, resolve_sources
from .stages import (
    Decoder,
    Handled,
    Map,
    MapDict,
    MapTuple,
    Rename,
    Select,
    Stage,
    ToTuple,
    default_collate,
    default_collation_fn,
    list_collate,
)
from .stepengine import Slots, StepPlan, run_steps
from .stepengine import Source as _StepSource

__all__ = ["ON_ERROR", "WORKER_SPLITS", "ShardDataset"]

log = logging.getLogger("resumewds")

_RUN_BYTES = RUN_BYTES  # most bytes read with one pread (tests lower it)

ON_ERROR = ("raise", "skip")

#: how DataLoader workers share an epoch (``worker_split=``): webdataset's shards per worker, or
#: the engine's split of the sample sequence (:mod:`resumewds.shardsplit`, :mod:`resumewds.steplayout`)
WORKER_SPLITS = ("shards", "samples")


#: fewest shards in a window of ``.shuffle(n)`` compiled into the plan
_BUFFER_MIN_WINDOW = 8


class _EpochSteps(StepPlan):
    """The steps of one epoch of a data set (:func:`resumewds.stepengine.run_steps`'s plan):
    its plan's samples at the layout's slots; prefetch: the window of a step's first
    position and then ``prefetch`` shards beyond it, once per window."""

    def __init__(self, ds: ShardDataset, ep: Any, layout: Layout, start: int, worker: int, num_workers: int):
        self.ds, self.ep, self.layout, self.start = ds, ep, layout, start
        self.total = len(ep)
        self.mine = worker_steps(layout.num_steps(self.total, start), worker, num_workers)
        self.last_window = -1

    def steps(self) -> Iterable[int]:
        return self.mine

    def step(self, k: int) -> Slots:
        slots = self.layout.slots(self.total, self.start, k)
        return slots, self.ep.samples_at([pos for pos, _ in slots]), None

    def prefetch(self, n: int, k: int, slots: Slots) -> Iterable[Tuple[int, List[ShardInfo], int]]:
        if not slots[0] or self.ds.prefetch_depth <= 0:
            return ()
        first = slots[0][0][0]  # the step's first position
        ep = self.ep
        w = ep.window_of(first)
        if w == self.last_window:
            return ()
        self.last_window = w
        # this window's shards (a shuffled window touches all of them at once) and
        # then ``prefetch`` shards beyond it; cached ones are left out by the store
        here = ep.window_shards(w)
        shards = self.ds.manifest.shards
        upcoming = [shards[i] for i in ep.shards_from(first, len(here) + self.ds.prefetch_depth)]
        return [(0, upcoming, len(here))] if upcoming else ()


class ShardDataset:
    """A resumable, deterministic data set over tar shards: the engine's data set.

    A *definition*: sources, seed, shuffle settings and a list of stages.  It
    produces the steps of any ``(epoch, start position, layout, worker)``
    (:meth:`iter_steps`); :class:`resumewds.direct.DirectDataset` adds direct
    iteration, as webdataset iterates.  :class:`resumewds.WebDataset`
    is this class with webdataset's constructor and fluent methods
    (:class:`resumewds.wds.webdataset.WebDatasetAPI`).

    Args:
        urls: a path, URL, brace pattern, ``pipe:`` command or manifest.json,
            or a list of them, or a :class:`~resumewds.manifest.Manifest`.
        seed: seed of the order (same seed, same order on any machine);
            None: ``RESUMEWDS_SEED``, else ``WDS_SEED``, else 0.
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
        handler: a handler for shard and sample (tar) errors
            (:mod:`resumewds.handling`): ``reraise_exception`` (default,
            ``on_error="raise"``); a handler returning True skips the shard
            like ``on_error="skip"``; False stops the iteration.
        allow_pickle: let decoders unpickle (pkl/pyd): off by default.
        allow_remote_pipe: accept ``pipe:`` urls from a manifest fetched over
            the network (and the local files it names).
        allow_remote_local: let a manifest fetched over the network name local
            files (absolute paths, ``file://``); None: ``RESUMEWDS_ALLOW_REMOTE_LOCAL``.
        manifest_max_bytes: the largest manifest fetched over the network
            (bytes or ``"1GiB"``); None: ``RESUMEWDS_MANIFEST_MAX_BYTES``, else 256 MiB.
        cache_sync: how the cache makes its files durable (``"auto"``,
            ``"fsync"`` or ``"boot"``, :class:`resumewds.cache.ShardStore`);
            None: ``RESUMEWDS_CACHE_SYNC``, else ``"auto"``.
        prefetch: how many upcoming shards to download in the background.
        partitions: node-local partitions of the order (:class:`resumewds.plan.Plan`);
            None: the number of nodes at the run's start (a resume keeps the
            run's recorded count); 1: one order over all shards.
        ranged_reads: accepted for compatibility and ignored: remote v3 shards
            that are not cached yet are always read sample by sample (verified
            ranges; docs/DIGESTS.md); a warning says so when it is given.
        resampled: draw each epoch's shards with replacement (deterministic:
            a pure function of seed, epoch and position); iteration goes on
            over epochs (use ``.with_epoch(n)``).
        repeat: iterate over epochs without end.
        empty_check: raise ValueError when an epoch has no samples at all
            (and, with the shard split, when a DataLoader worker gets no shard).
        worker_split: how DataLoader workers (``num_workers >= 2``, one rank)
            share an epoch: ``"samples"`` (default here): the steps of the one
            sample sequence, the same data for any worker count;
            ``"shards"``: webdataset's ``split_by_worker``, each worker its own
            shards, batches interleaved round-robin (:mod:`resumewds.shardsplit`).
            None: ``"samples"`` (:class:`resumewds.WebDataset` picks
            webdataset's split for webdataset's forms, docs/COMPAT.md).

    Example:
        >>> ds = ShardDataset(["a.tar", "b.tar"], seed=3).decode().to_tuple("txt", "cls")  # doctest: +SKIP
    """

    def __init__(self, urls: Source, *, seed: Optional[int] = None, shuffle: Union[bool, str, None] = False,
                 shuffle_window: Optional[int] = None, cache_dir: Optional[str] = None,
                 cache_size: Union[int, str, None] = None, verify: str = "once", fetch: Any = None,
                 on_error: str = "raise", handler: Any = None, allow_pickle: bool = False,
                 allow_remote_pipe: bool = False, allow_remote_local: Optional[bool] = None,
                 manifest_max_bytes: Union[int, str, None] = None, cache_sync: Optional[str] = None,
                 prefetch: int = 4, partitions: Optional[int] = None,
                 ranged_reads: Optional[bool] = None, resampled: bool = False, repeat: bool = False,
                 empty_check: bool = True, worker_split: Optional[str] = None):
        if on_error not in ON_ERROR:
            raise ValueError(f"on_error must be one of {ON_ERROR}, got {on_error!r}")
        if verify not in ("once", "always", "never"):
            raise ValueError(f"verify must be 'once', 'always' or 'never', got {verify!r}")
        if handler is not None and not callable(handler):
            raise TypeError(f"handler= must be callable, got {handler!r}")
        if handler is reraise_exception:
            handler = None
        if handler is not None:
            on_error = "skip"  # a skipped shard is recorded exactly like on_error="skip"
        if seed is None:  # the one default: RESUMEWDS_SEED, else webdataset's WDS_SEED, else 0
            seed = config.seed()
        if cache_size is not None and not isinstance(cache_size, str) and int(cache_size) < 0:
            cache_size = None  # webdataset's -1: unlimited
        self.urls = urls
        self.seed = int(seed)
        shuffle = False if shuffle is None else shuffle
        self._shuffle = shuffle  # (not .shuffle: that is the fluent stage)
        self.shuffle_window = int(shuffle_window if shuffle_window is not None else 8)
        self.cache_dir = cache_dir
        self.cache_size = cache_size
        self.verify = verify
        self.fetch = fetch
        self.on_error = on_error
        self.handler = handler
        self.allow_pickle = allow_pickle
        self.allow_remote_pipe = allow_remote_pipe
        self.allow_remote_local = allow_remote_local
        if manifest_max_bytes is not None:
            config.manifest_max_bytes(manifest_max_bytes)  # checked now (a ValueError naming it)
        if cache_sync is not None:
            config.cache_sync(cache_sync)
        self.manifest_max_bytes = manifest_max_bytes
        self.cache_sync = cache_sync
        self.prefetch_depth = int(prefetch)
        if ranged_reads is not None:
            warnings.warn("ranged_reads= is ignored: remote shards with sample digests are always read by "
                          "verified ranges until they are cached (docs/DIGESTS.md)", DeprecationWarning,
                          stacklevel=2)
        self.resampled = bool(resampled)
        self.empty_check = empty_check
        if worker_split is not None and worker_split not in WORKER_SPLITS:
            raise ValueError(f"worker_split must be one of {WORKER_SPLITS} or None, got {worker_split!r}")
        self.worker_split = worker_split
        self._spec: List[Stage] = []
        # iteration mode: once / repeat / with_epoch (webdataset's repetitions, nsamples)
        self._mode = "forever" if (self.resampled or repeat) else "once"
        self._nepochs = -1
        self._limit = -1
        self.epoch = 0
        self._cursor: Optional[Dict[str, Any]] = None
        self._pending: Optional[Dict[str, Any]] = None
        self._advanced = False  # direct iteration: the last iter() handed an item out
        self._pinned = False  # ... and no state was taken after it (resumewds.direct)
        self._warned_opaque = False
        self._manifest: Optional[Manifest] = None
        self._plan: Optional[Plan] = None
        self._store: Any = None
        self._reader: Optional[_ShardReader] = None
        self._events: List[Dict[str, Any]] = []
        self._index_skipped: Optional[Dict[str, str]] = None
        self.partitions = partitions  # requested; None: resolved by the loader
        self.plan_partitions = 1 if partitions is None else check_partitions(partitions)
        self.collate_fn: Optional[Callable[[List[Any]], Any]] = None
        self._compile()
        Plan([1], self.seed, shuffle, self.shuffle_window, self.plan_partitions)  # validate settings early

    # ---- fluent stages ---------------------------------------------------
    #: fluent stages return a copy (webdataset's compose); a subclass that builds
    #: itself with them sets this True (or overrides compose()) to append in place
    _mutable_fluent = False

    def _compile(self) -> None:
        """Split the stages: the per-sample prefix (run where the sample is read), the
        ``.shuffle(n)`` compiled into the plan, one ``.batched`` and the maps after it
        (what WebLoader runs), and the stream stages after that."""
        p = self._spec
        i, stages, buffer = 0, [], 0
        while i < len(p) and p[i].kind in ("sample", "shuffle"):
            if p[i].kind == "shuffle":
                buffer = max(buffer, int(p[i].args["n"]))
            else:
                stages.append(p[i].fn)
            i += 1
        self.stages = stages
        self._buffer = buffer
        self._stream_from = i
        self.batch_size = None
        self.batch_partial = True
        self.batch_stages = []
        collate = self.collate_fn
        if i < len(p) and p[i].kind == "batched":
            self.batch_size = int(p[i].args["n"])
            self.batch_partial = bool(p[i].args.get("partial", True))
            collate = p[i].args["collation_fn"] or list_collate
            j = i + 1
            while j < len(p) and p[j].kind == "sample" and p[j].name != "select":
                self.batch_stages.append(p[j].fn)
                j += 1
            self._loader_from = j
        else:
            self._loader_from = i
        self.collate_fn = collate
        self._plan = None

    def compose(self, *stages: Any) -> ShardDataset:
        """A copy with more stages: a :class:`~resumewds.stages.Stage`, or (webdataset's
        ``compose(f)``) a generator function ``f(iterator) -> iterator``, run over
        each worker's stream; an opaque generator replays an epoch from its start on resume."""
        return ShardDataset._with_stages(self, *stages)

    def _with_stages(self, *stages: Any) -> ShardDataset:
        """``compose`` itself (the fluent methods call this, so a subclass may override
        ``compose`` with webdataset's DataPipeline signature)."""
        if self._mutable_fluent or type(self).compose is not ShardDataset.compose:
            # a subclass building itself stage by stage: resumewds.DataPipeline (whose
            # compose() is webdataset's DataPipeline.compose)
            ds = self
        else:
            ds = self._derived()
        for st in stages:
            if not isinstance(st, Stage):
                if not callable(st):
                    raise TypeError(f"compose() needs callables, got {st!r}")
                st = Stage("stream", getattr(st, "__name__", "compose"), st)
            ds._spec.append(st)
        ds._compile()
        return ds

    def _derived(self) -> ShardDataset:
        """A copy with its own list of stages and no iteration in progress (the same data,
        manifest and settings): what a fluent stage returns, and what a loader restructures
        instead of the caller's object (a ``DataPipeline`` included)."""
        ds = copy.copy(self)
        ds._spec = list(self._spec)
        ds._events = []
        ds._cursor = None
        ds._pending = None
        ds._advanced = ds._pinned = False
        return ds

    def _sample(self, name: str, fn: Callable[[Any], Any], handler: Any = None) -> ShardDataset:
        if handler is not None and handler is not reraise_exception:
            fn = Handled(fn, handler, name)
        return ShardDataset._with_stages(self, Stage("sample", name, fn))

    def decode(self, *handlers: Union[str, Callable[[str, bytes], Any]],
               allow_pickle: Optional[bool] = None, handler: Any = None, only: Any = None,
               partial: bool = False, pre: Any = None, post: Any = None) -> ShardDataset:
        """Decode members: image specs ("pil", "rgb8", "torchrgb"...) and/or callables
        ``(key, data) -> value or None``; ``only=`` limits decoding to those extensions,
        ``handler=`` handles a decoding error (skip / stop)."""
        ap = self.allow_pickle if allow_pickle is None else allow_pickle
        dec = Decoder(handlers, allow_pickle=ap, only=only, partial=partial, pre=pre, post=post)
        return self._sample("decode", dec, handler)

    def to_tuple(self, *specs: str, missing_is_error: bool = True, none_is_error: Optional[bool] = None,
                 handler: Any = None) -> ShardDataset:
        """Turn samples into tuples: ``to_tuple("jpg;png", "cls")`` or ``to_tuple("jpg;png cls")``."""
        return self._sample("to_tuple", ToTuple(*specs, missing_is_error=missing_is_error,
                                                none_is_error=none_is_error), handler)

    def map(self, fn: Callable[[Any], Any], handler: Any = None) -> ShardDataset:
        """Apply ``fn`` to each item (a sample, or a batch after ``batched``); a None
        result drops it; ``handler=`` decides about an exception (skip or stop)."""
        return self._sample("map", Map(fn), handler)

    def map_dict(self, handler: Any = None, **fns: Callable[[Any], Any]) -> ShardDataset:
        """Apply functions to named fields of dict samples (a missing field: KeyError)."""
        return self._sample("map_dict", MapDict(**fns), handler)

    def map_tuple(self, *fns: Optional[Callable[[Any], Any]], handler: Any = None) -> ShardDataset:
        """Apply functions to the fields of tuple samples, by position."""
        return self._sample("map_tuple", MapTuple(*fns), handler)

    def select(self, predicate: Callable[[Any], bool], **kw: Any) -> ShardDataset:
        """Keep only the items for which ``predicate`` is true.

        Under WebLoader, filtering happens inside a batch: the batch of
        positions ``[k*B, (k+1)*B)`` keeps its survivors, so batches may be
        smaller, and resume stays exact.  Iterated directly, ``.batched(n)``
        fills each batch from the filtered stream, as webdataset does.
        """
        return self._sample("select", Select(predicate))

    def rename(self, keep: bool = True, handler: Any = None, **kw: str) -> ShardDataset:
        """Rename fields: ``rename(image="jpg;png", label="cls")`` (webdataset's ``keep``)."""
        return self._sample("rename", Rename(keep=keep, **kw), handler)

    def shuffle(self, size: int, initial: int = 100, **kw: Any) -> ShardDataset:
        """Shuffle, exactly resumable and without a buffer of samples.

        Before any ``batched`` / ``slice`` / ... stage, ``.shuffle(n)`` is
        compiled into the plan: samples are shuffled uniformly within windows
        of whole shards holding at least ``3 * n`` samples (on average) and at
        least 8 shards, so
        the mixing is at least that of webdataset's buffer of ``n`` (whose
        effective span is about ``2n``), and a resume recomputes any position
        in O(1).  After such a stage it is webdataset's buffer shuffle, with
        every pick a hash of (seed, epoch, count).  ``size < 1``: no shuffle.
        """
        if size < 1:
            return self
        return ShardDataset._with_stages(self, Stage("shuffle", "shuffle", n=int(size), initial=int(initial)))

    def batched(self, batchsize: int, collation_fn: Optional[Callable[[List[Any]], Any]] = default_collation_fn,
                partial: bool = True) -> ShardDataset:
        """Batch items; later stages apply to batches.

        The default collation is webdataset's (numbers -> numpy array, tensors
        and arrays stacked, anything else a list); ``collation_fn=None``
        gives lists.  Iterated directly, ``partial=False`` drops a short last
        batch; under WebLoader the loader's ``remainder`` decides.
        """
        if batchsize < 1:
            raise ValueError(f"batch_size must be >= 1, got {batchsize}")
        return ShardDataset._with_stages(self, Stage("batched", "batched", n=int(batchsize), collation_fn=collation_fn,
                                  partial=bool(partial)))

    def repeat(self, nepochs: int = -1, nbatches: int = -1) -> ShardDataset:
        """Iterate ``nepochs`` epochs per ``iter()`` (forever if < 1), at most ``nbatches`` items.

        As in webdataset, each ``iter()`` is a new pass: one left mid-epoch is
        followed by the next epoch from its start, unless a state was taken
        since its last item (then the next ``iter()`` continues there, as a
        run resumed from that state would)."""
        if nepochs > 0:
            self._mode, self._nepochs = ("once" if nepochs == 1 and nbatches < 1 else "repeat"), int(nepochs)
        else:
            self._mode, self._nepochs = "forever", -1
        self._limit = int(nbatches)
        return self

    def with_epoch(self, nsamples: int = -1, nbatches: int = -1) -> ShardDataset:
        """Each ``iter()`` yields ``max(nsamples, nbatches)`` items, continuing the
        stream over epochs (the next ``iter()`` goes on where this one stopped)."""
        self._mode, self._nepochs, self._limit = "forever", -1, int(max(nsamples, nbatches))
        return self

    def __bool__(self) -> bool:
        return True

    def __enter__(self) -> ShardDataset:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def set_epoch(self, epoch: int) -> None:
        """Start the next ``iter()`` at the beginning of ``epoch`` (like a DistributedSampler)."""
        self.epoch = int(epoch)
        self._cursor = None
        self._pending = None

    # ---- state shared with the loader ----------------------------------
    @property
    def manifest(self) -> Manifest:
        """The resolved, indexed manifest (resolved and indexed on first use, in the
        calling thread: a loader does it before its workers start, so that they
        inherit it)."""
        if self._manifest is None:
            m, skipped = self._resolve()
            if skipped is not None:
                self._index_skipped = {**(self._index_skipped or {}), **skipped}
            self._manifest = m
        return self._manifest

    def _resolve(self) -> Tuple[Manifest, Optional[Dict[str, str]]]:
        """The sources resolved and indexed (a manifest.json beside named shards first:
        :mod:`resumewds.beside`); the shards skipped under a ``handler``."""
        trust: Dict[str, Any] = {"allow_remote_pipe": self.allow_remote_pipe,
                                 "allow_remote_local": self.allow_remote_local,
                                 "manifest_max_bytes": self.manifest_max_bytes}
        m = resolve_sources(self.urls, fetch_config=self.fetch, cache_dir=self.cache_dir, **trust)
        # counts-only shards (a wids shard index, img2dataset stats) are recorded when
        # first opened (resumewds.shardindex.RecordBook): the plan needs their counts only
        todo = [s for s in m.shards if not s.indexed and not isinstance(s.index, Counted)]
        if not todo:
            return m, None
        fill_from_beside(m, fetch_config=self.fetch, cache_dir=self.cache_dir, **trust)
        todo = [s for s in todo if not s.indexed]
        if not todo:
            return m, None
        part = m if len(todo) == len(m.shards) else Manifest(todo)
        if self.handler is None:
            index_manifest(part, self.store, on_event=self._on_event)
            m._starts = None
            return m, None
        skipped = index_skipping(part, self.store, self.handler, self._on_event)
        m._starts = None
        return m, skipped

    @property
    def plan(self) -> Plan:
        if self._plan is None:
            algo, window = self._order()
            self._plan = Plan(self.manifest.counts, self.seed, algo, window, self.plan_partitions)
        return self._plan

    def use_partitions(self, n: int) -> None:
        """Set the partition count the plan uses (the loader resolves None)."""
        if int(n) != self.plan_partitions:
            self.plan_partitions = int(n)
            self._plan = None

    def _order(self) -> Tuple[Union[bool, str], int]:
        """The plan's order and window: ``shuffle``, plus ``.shuffle(n)`` (windows of
        whole shards holding about ``3n`` samples, and at least 8 shards) and ``resampled``."""
        base = self._shuffle
        base = "window" if base is True else ("none" if base in (False, None) else base)
        window = self.shuffle_window if base == "window" else 1
        if self._buffer:
            m = self.manifest
            mean = max(1.0, m.total_samples / max(1, len(m.shards)))
            # at least the default window (8 shards): with large shards a window
            # of ~3n samples is 2-3 shards, and a batch could then hold samples of
            # fewer shards than webdataset's buffer of n spans (bench_mixing)
            window = max(window, _BUFFER_MIN_WINDOW, min(256, -(-3 * self._buffer // int(mean))))
            base = {"none": "manifest_window", "shards": "window"}.get(str(base), base)
        if self.resampled:
            base = "resampled_window" if base in ("window", "manifest_window") else "resampled"
        if str(base).endswith("window"):
            self.shuffle_window = window  # the reader keeps a window of shards open
        return base, window

    @property
    def store(self) -> Any:
        if self._store is None:
            self._store = ShardStore(cache_dir=self.cache_dir, cache_size=self.cache_size, verify=self.verify,
                                     fetch=self.fetch, on_event=self._on_event, sync=self.cache_sync)
        return self._store

    def cache_dirs(self) -> List[str]:
        """The directory of this data set's shard cache (its store's, from ``cache_dir=``, else
        ``RESUMEWDS_CACHE_DIR``...): ranks on one host that share it are one node
        (:func:`resumewds.world.node_key`).

        Example:
            >>> ShardDataset(["a.tar"], cache_dir="/tmp/c").cache_dirs()
            ['/tmp/c']
        """
        return [self.store.cache_dir]

    #: a worker of the shard split without a shard raises (with ``empty_check``), as webdataset's
    #: ``WebDataset`` does; a ``DataPipeline`` (no such check in webdataset) sets it False
    _empty_worker_check = True

    def worker_split_mode(self) -> str:
        """``"shards"`` or ``"samples"``: how DataLoader workers share an epoch (``worker_split``)."""
        return self.worker_split or "samples"

    def split_workers(self, num_workers: int, world_size: int = 1, mode: Optional[str] = None) -> int:
        """``W`` of the shard split for ``num_workers`` DataLoader workers, or 0 (the sample split).

        The shard split applies with ``mode`` (default: :meth:`worker_split_mode`)
        ``"shards"``, ``num_workers >= 2``, one rank, one partition and shards
        read once per epoch (not ``resampled``).

        Example:
            >>> ShardDataset(["a.tar"], worker_split="shards").split_workers(2)
            2
        """
        if ((mode or self.worker_split_mode()) != "shards" or int(num_workers) < 2 or int(world_size) != 1
                or self.plan_partitions != 1 or self.resampled):
            return 0
        return int(num_workers)

    def steps_of(self, layout: Any, epoch: int) -> Any:
        """``layout`` for epoch ``epoch``: a shard split (:mod:`resumewds.shardsplit`)
        bound to the epoch's plan; any other layout as it is.

        Raises:
            ValueError: with ``empty_check``, a worker of the shard split gets no shard
                (as webdataset's ``split_by_worker`` then raises).
        """
        bind = getattr(layout, "bind", None)
        if bind is None:
            return layout
        ep = self.plan.epoch(epoch)
        bound = bind(ep)
        seq = bound.sequence
        if self.empty_check and self._empty_worker_check:
            empty = 0 in seq.shard_counts if isinstance(seq, SplitSequence) else not len(seq.seg_shard)
            if empty:
                raise empty_worker_error(layout.workers, len(ep.seg_shard))
        return bound

    def config(self) -> Dict[str, Any]:
        """What the delivered order depends on (checked on resume).

        Raises:
            ValueError: a stage WebLoader cannot run (anything after ``.batched``
                and its maps: ``unbatched``, ``slice``, ``rsample``, ``compose``...).
        """
        rest = self._spec[self._loader_from:]
        if rest:
            raise ValueError(
                f"WebLoader runs a dataset's per-sample stages, .shuffle(n) and one .batched(n) with "
                f"the maps after it, not {', '.join('.' + st.name + '()' for st in rest)}: use the "
                "WebLoader's own .unbatched()/.shuffle()/.batched()/.with_epoch(), or iterate the "
                "dataset with a torch DataLoader / torchdata StatefulDataLoader")
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
        _ = self.manifest  # index before pickling so workers never re-index
        d = dict(self.__dict__)
        d["_store"] = None
        d["_reader"] = None
        d["_events"] = []
        d["_plan"] = None
        return d

    # ---- reading (resumewds.openshards) ---------------------------------------------
    @property
    def reader(self) -> _ShardReader:
        """This process's reading state and read path (made on first use; pickling drops it).

        Sized to the shards a step can touch: a shuffled window reads its shards at
        once (one window per partition of this rank's node); in order, two are
        enough (fewer pins: the ``cache_size`` budget holds better).

        Example:
            >>> ds.reader.read(0, 5)["__key__"]        # doctest: +SKIP
            'sample000005'
        """
        if self._reader is None:
            parts = min(self.plan_partitions, 8)
            windowed = str(self.plan.algo).endswith("window")
            self._reader = _ShardReader(self.store, self.shuffle_window * parts + 2 if windowed else parts + 1,
                                        self.manifest.shards, on_error=self.on_error, handler=self.handler,
                                        on_event=self._on_event, ranged=self.prefetch_depth > 0,
                                        run_bytes=_RUN_BYTES)
        return self._reader

    def iter_steps(self, epoch: int, start: int, layout: Layout, worker: int = 0,
                   num_workers: int = 1, collate: bool = True,
                   collate_fn: Optional[Callable[[List[Any]], Any]] = None, each: bool = False
                   ) -> Iterator[Tuple[int, Any, Any]]:
        """Yield ``(step, batch, meta)`` for this worker's steps of an epoch.

        Args:
            epoch: the epoch.
            start: global position to start from.
            layout: batch size, world size, rank, remainder policy; or a
                shard split (:class:`resumewds.shardsplit.ShardSplit`, bound or
                not), whose steps are webdataset's workers' batches.
            worker, num_workers: this DataLoader worker's share (round-robin
                over steps).
            collate: collate samples with the batch's collate function; if
                False the batch is the list of samples.
            collate_fn: the collate function (default: the one of
                ``batched()``, else torch-free ``default_collate``).
            each: with ``collate=False``: each delivered sample as soon as it
                is read, ``(step, [sample], None)``, then ``(step, [], meta)``
                (:func:`resumewds.stepengine.run_steps`).

        ``meta`` has: ``worker``, ``step``, ``samples`` (delivered),
        ``pads``, ``skipped``, ``filtered``, ``bytes``, ``shards`` (samples
        per shard index), ``positions``, ``slot_index`` and ``pad_flags``
        (per delivered sample: its epoch position, its index in the step's
        slots, whether it is padding), ``sample_shards`` (without
        ``collate``: each delivered sample's shard index, None for padding),
        ``batch_dropped`` (a batch stage
        returned None), ``t_read``, ``t_stages`` and ``t_fetch_wait``
        (seconds), ``events``.  The steps are read by the one step engine
        (:func:`resumewds.stepengine.run_steps`), this data set its one source.
        """
        ep = self.plan.epoch(epoch)
        if hasattr(layout, "bind"):  # a shard split (resumewds.shardsplit): its steps of this epoch
            layout = layout.bind(ep)
        ep = getattr(layout, "sequence", ep)  # the epoch as the layout delivers it
        collate_fn = collate_fn or self.collate_fn or default_collate
        plan = _EpochSteps(self, ep, layout, start, worker, num_workers)
        source = _StepSource(self, self.stages, stream=not str(self.plan.algo).endswith("window"))
        if each and collate:
            raise ValueError("iter_steps(each=True) hands out samples one by one: use collate=False")
        yield from run_steps([source], plan, epoch, worker, collate_fn if collate else None,
                             self.batch_stages, self.take_events, each=each)

    def close(self) -> None:
        if self._reader is not None:
            self._reader.close()
            self._reader = None
        if self._store is not None and hasattr(self._store, "close"):
            self._store.close()


register_iterable_dataset(ShardDataset)
