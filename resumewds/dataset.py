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

import copy
import logging
import os
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union

from . import reading, steps, tario, warmup
from .errors import (
    CacheError,
    ChecksumMismatch,
    FetchError,
    IntegrityError,
    ResumeWDSError,
    ShardFormatError,
    StateError,
    naming,
)
from .handlers import until_stop
from .manifest import Manifest, ShardInfo
from .pipeline import (
    Decoder,
    ExtractKeys,
    Handled,
    Map,
    MapDict,
    MapTuple,
    Rename,
    RenameKeys,
    Select,
    SelectFiles,
    Stage,
    ToTuple,
    default_collate,
    default_collation_fn,
    hide_positions,
    list_collate,
)
from .plan import Layout, Plan, check_partitions, mix, worker_steps
from .reading import ShardReader as _ShardReader
from .sources import Source, resolve_sources
from .splitters import single_node_only, split_by_node, split_by_worker, worker_info
from .stats import event_record

log = logging.getLogger("resumewds")

_RUN_BYTES = reading.RUN_BYTES  # most bytes read with one pread (tests lower it)

ON_ERROR = ("raise", "skip")
DATASET_STATE = "resumewds.dataset"
_KNOWN_STREAM = ("unbatched", "unlisted", "slice", "rsample", "log_keys")


class _NoPadLayout(Layout):
    """The split of direct iteration: like WebLoader's, but a share that would get a
    padding sample (fewer leftover samples than workers) gets nothing, as in webdataset."""

    def slots(self, total: int, start: int, step: int, rank: Optional[int] = None
              ) -> List[Tuple[int, bool]]:
        return [s for s in super().slots(total, start, step, rank) if not s[1]]


class _KeepShards:
    """A custom node/worker splitter's choice of shards, as a per-sample filter."""

    def __init__(self, urls: frozenset):
        self.urls = urls

    def __call__(self, sample: Any) -> Any:
        return sample if sample.get("__url__") in self.urls else None


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


_UNSET: Any = object()
_BUILTIN_NAMES = ("split_by_node", "split_by_worker", "single_node_only")


def _builtin_splitter(f: Any) -> Optional[str]:
    """The name of a built-in splitter (ours, or webdataset's own), else None."""
    if f is split_by_node or f is split_by_worker or f is single_node_only:
        return f.__name__
    name, mod = getattr(f, "__name__", None), getattr(f, "__module__", "") or ""
    if name in _BUILTIN_NAMES and mod.split(".")[0] in ("webdataset", "resumewds"):
        return name
    return None


def _names_http(urls: Any) -> bool:
    """Whether a data set's source (a url, a list of them, a manifest url) is fetched over http(s)."""
    first = urls if isinstance(urls, str) else (urls[0] if isinstance(urls, (list, tuple)) and urls else None)
    return isinstance(first, str) and first[:8].lower().startswith(("http://", "https://"))


def _wds_urls(urls: Any) -> Any:
    """webdataset's URL forms: ``a::b`` joined patterns, ``file:/abs/path``."""
    def one(u: Any) -> List[Any]:
        if not isinstance(u, str) or u.startswith("pipe:"):
            return [u]
        out = []
        for part in (u.split("::") if "::" in u else [u]):
            if part.startswith("file:") and not part.startswith("file://"):
                part = part[len("file:"):]
            out.append(part)
        return out

    if isinstance(urls, (str, os.PathLike)):
        parts = one(os.fspath(urls))
        return parts[0] if len(parts) == 1 else parts
    if isinstance(urls, (list, tuple)):
        return [p for u in urls for p in one(os.fspath(u) if isinstance(u, os.PathLike) else u)]
    return urls


#: fewest shards in a window of ``.shuffle(n)`` compiled into the plan
_BUFFER_MIN_WINDOW = 8


class WebDataset:
    """A resumable, deterministic WebDataset; also webdataset 1.0.2's ``WebDataset``.

    ``import resumewds as wds`` runs webdataset code unchanged: the
    constructor takes webdataset's arguments and every fluent stage
    (docs/COMPAT.md lists the exact semantics and differences).  It is a
    ``torch.utils.data.IterableDataset`` (registered when torch is imported,
    so ``import resumewds`` stays torch-free): a plain torch ``DataLoader``
    works, each worker taking its own share of the sample sequence, and
    ``state_dict()`` / ``load_state_dict()`` speak torchdata's
    ``StatefulDataLoader`` protocol.

    Args:
        urls: a path, URL, brace pattern, ``pipe:`` command or manifest.json,
            or a list of them, or a :class:`~resumewds.manifest.Manifest`;
            also webdataset's ``"a.tar::b-{0..3}.tar"`` and ``file:/abs/path``.
        seed: seed of the order (same seed, same order on any machine);
            None: ``WDS_SEED`` if set, else 0.
        shuffle: False: manifest order; True / ``"window"``: shard order
            permuted per epoch and samples shuffled within windows of
            ``shuffle_window`` shards; ``"shards"``: shard order only.
            Default: ``"shards"`` if ``shardshuffle`` is set, else False.
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
        ranged_reads: read remote v3 shards that are not cached yet sample by
            sample (verified ranges, the partial download; docs/DIGESTS.md);
            None: ``RESUMEWDS_RANGED_READS`` (default on).
        handler: webdataset's handler for shard and sample (tar) errors:
            ``reraise_exception`` (default, ``on_error="raise"``); a handler
            returning True skips the shard like ``on_error="skip"``; False
            stops the iteration.
        resampled: draw each epoch's shards with replacement (deterministic:
            a pure function of seed, epoch and position); iteration goes on
            over epochs (use ``.with_epoch(n)``).
        shardshuffle: webdataset's shard shuffle: True or N > 0 permutes the
            shard order per epoch (``shuffle="shards"``); False/None/0: manifest order.
        detshuffle: accepted; our shuffles are always deterministic.
        nodesplitter, workersplitter: ``split_by_node``, ``split_by_worker``,
            ``single_node_only`` (ours or webdataset's) map onto the rank /
            worker split of the sample sequence; None: no split (every rank /
            worker sees everything, as in webdataset); a user callable gets
            the shard list (``{"url": ...}`` dicts) and keeps what it yields.
        select_files, rename_files: webdataset's member filters (by
            ``"<key>.<ext>"`` name).
        empty_check: raise ValueError when an epoch has no samples at all.
        url_to_name, cache_size semantics, verbose, mode: accepted for
            compatibility (our cache names entries by URL digest).

    Example:
        >>> ds = WebDataset(["a.tar", "b.tar"], seed=3).decode().to_tuple("txt", "cls")  # doctest: +SKIP
        >>> ds = (WebDataset("shards-{000..099}.tar", shardshuffle=100)            # doctest: +SKIP
        ...       .shuffle(1000).decode("pil").to_tuple("jpg;png", "cls").batched(64))
    """

    def __init__(self, urls: Source, handler: Any = None, mode: Optional[str] = None,
                 resampled: bool = False, repeat: bool = False, shardshuffle: Any = None,
                 cache_size: Union[int, str, None] = None, cache_dir: Optional[str] = None,
                 url_to_name: Any = None, detshuffle: bool = False, nodesplitter: Any = _UNSET,
                 workersplitter: Any = _UNSET, select_files: Optional[Callable[[str], bool]] = None,
                 rename_files: Optional[Callable[[str], str]] = None, empty_check: bool = True,
                 verbose: bool = False, seed: Optional[int] = None, *,
                 shuffle: Union[bool, str, None] = None, shuffle_window: Optional[int] = None,
                 verify: str = "once", fetch: Any = None, on_error: str = "raise",
                 allow_pickle: bool = False, allow_remote_pipe: bool = False, prefetch: int = 4,
                 partitions: Optional[int] = None, ranged_reads: Optional[bool] = None):
        from .handlers import reraise_exception

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
            from . import config

            seed = config.seed()
        if cache_size is not None and not isinstance(cache_size, str) and int(cache_size) < 0:
            cache_size = None  # webdataset's -1: unlimited
        self.urls = _wds_urls(urls)
        if _names_http(self.urls):  # requests is imported while the manifest, plan and store are set up
            warmup.import_in_background("requests")
        self.seed = int(seed)
        self._shuffle_arg = shuffle
        if shuffle is None:
            shuffle = "shards" if (shardshuffle not in (None, False, 0) and not resampled) else False
        self._shuffle = shuffle  # (not .shuffle: that is the fluent stage)
        self._window_arg = shuffle_window
        self.shuffle_window = int(shuffle_window if shuffle_window is not None else 8)
        self.cache_dir = cache_dir
        self.cache_size = cache_size
        self.verify = verify
        self.fetch = fetch
        self.on_error = on_error
        self.handler = handler
        self.allow_pickle = allow_pickle
        self.allow_remote_pipe = allow_remote_pipe
        self.prefetch_depth = int(prefetch)
        self.ranged_reads = ranged_reads  # None: RESUMEWDS_RANGED_READS (resumewds.reading.prepare)
        self.resampled = bool(resampled or mode == "resampled")
        self.shardshuffle = shardshuffle
        self.detshuffle = detshuffle
        self.url_to_name = url_to_name
        self.nodesplitter = nodesplitter
        self.workersplitter = workersplitter
        self.empty_check = empty_check
        self._spec: List[Stage] = []
        if select_files is not None or rename_files is not None:
            self._spec.append(Stage("sample", "select_files", SelectFiles(select_files, rename_files)))
        # iteration mode: once / repeat / with_epoch (webdataset's repetitions, nsamples)
        self._mode = "forever" if (self.resampled or repeat) else "once"
        self._nepochs = -1
        self._limit = -1
        self._length: Optional[int] = None
        self.epoch = 0
        self._cursor: Optional[Dict[str, Any]] = None
        self._pending: Optional[Dict[str, Any]] = None
        self._warned_opaque = False
        self._manifest: Optional[Manifest] = None
        self._plan: Optional[Plan] = None
        self._store: Any = None
        self._reader: Optional[_ShardReader] = None
        self._events: List[Dict[str, Any]] = []
        self._failed: Dict[int, str] = {}
        self.partitions = partitions  # requested; None: resolved by the loader
        self.plan_partitions = 1 if partitions is None else check_partitions(partitions)
        self.collate_fn: Optional[Callable[[List[Any]], Any]] = None
        self._compile()
        Plan([1], self.seed, shuffle, self.shuffle_window, self.plan_partitions)  # validate settings early

    # ---- fluent stages (webdataset's API) -------------------------------
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
        self.batch_stages = []
        collate = self.collate_fn
        if i < len(p) and p[i].kind == "batched":
            self.batch_size = int(p[i].args["n"])
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

    def compose(self, *stages: Any) -> WebDataset:
        """A copy with more stages: a :class:`~resumewds.pipeline.Stage`, or (webdataset's
        ``compose(f)``) a generator function ``f(iterator) -> iterator``, run over
        each worker's stream; an opaque generator replays an epoch from its start on resume."""
        return WebDataset._with_stages(self, *stages)

    def _with_stages(self, *stages: Any) -> WebDataset:
        """``compose`` itself (the fluent methods call this, so a subclass may override
        ``compose`` with webdataset's DataPipeline signature)."""
        if self._mutable_fluent or type(self).compose is not WebDataset.compose:
            # a subclass building itself stage by stage: resumewds.DataPipeline (whose
            # compose() is webdataset's DataPipeline.compose)
            ds = self
        else:
            ds = copy.copy(self)
            ds._spec = list(self._spec)
            ds._events = []
            ds._cursor = None
            ds._pending = None
        for st in stages:
            if not isinstance(st, Stage):
                if not callable(st):
                    raise TypeError(f"compose() needs callables, got {st!r}")
                st = Stage("stream", getattr(st, "__name__", "compose"), st)
            ds._spec.append(st)
        ds._compile()
        return ds

    def _sample(self, name: str, fn: Callable[[Any], Any], handler: Any = None) -> WebDataset:
        from .handlers import reraise_exception

        if handler is not None and handler is not reraise_exception:
            fn = Handled(fn, handler, name)
        return WebDataset._with_stages(self, Stage("sample", name, fn))

    def decode(self, *handlers: Union[str, Callable[[str, bytes], Any]],
               allow_pickle: Optional[bool] = None, handler: Any = None, only: Any = None,
               partial: bool = False, pre: Any = None, post: Any = None) -> WebDataset:
        """Decode members: image specs ("pil", "rgb8", "torchrgb"...) and/or callables
        ``(key, data) -> value or None``; ``only=`` limits decoding to those extensions,
        ``handler=`` handles a decoding error (skip / stop)."""
        ap = self.allow_pickle if allow_pickle is None else allow_pickle
        dec = Decoder(handlers, allow_pickle=ap, only=only, partial=partial, pre=pre, post=post)
        return self._sample("decode", dec, handler)

    def to_tuple(self, *specs: str, missing_is_error: bool = True, none_is_error: Optional[bool] = None,
                 handler: Any = None) -> WebDataset:
        """Turn samples into tuples: ``to_tuple("jpg;png", "cls")`` or ``to_tuple("jpg;png cls")``."""
        return self._sample("to_tuple", ToTuple(*specs, missing_is_error=missing_is_error,
                                                none_is_error=none_is_error), handler)

    def map(self, fn: Callable[[Any], Any], handler: Any = None) -> WebDataset:
        """Apply ``fn`` to each item (a sample, or a batch after ``batched``); a None
        result drops it; ``handler=`` decides about an exception (skip or stop)."""
        return self._sample("map", Map(fn), handler)

    def map_dict(self, handler: Any = None, **fns: Callable[[Any], Any]) -> WebDataset:
        """Apply functions to named fields of dict samples (a missing field: KeyError)."""
        return self._sample("map_dict", MapDict(**fns), handler)

    def map_tuple(self, *fns: Optional[Callable[[Any], Any]], handler: Any = None) -> WebDataset:
        """Apply functions to the fields of tuple samples, by position."""
        return self._sample("map_tuple", MapTuple(*fns), handler)

    def select(self, predicate: Callable[[Any], bool], **kw: Any) -> WebDataset:
        """Keep only the items for which ``predicate`` is true.

        Under WebLoader, filtering happens inside a batch: the batch of
        positions ``[k*B, (k+1)*B)`` keeps its survivors, so batches may be
        smaller, and resume stays exact.  Iterated directly, ``.batched(n)``
        fills each batch from the filtered stream, as webdataset does.
        """
        return self._sample("select", Select(predicate))

    def rename(self, keep: bool = True, handler: Any = None, **kw: str) -> WebDataset:
        """Rename fields: ``rename(image="jpg;png", label="cls")`` (webdataset's ``keep``)."""
        return self._sample("rename", Rename(keep=keep, **kw), handler)

    def rename_keys(self, *args: Any, **kw: Any) -> WebDataset:
        """webdataset's ``rename_keys``: rename fields by glob patterns."""
        opts = {k: kw.pop(k) for k in ("keep_unselected", "must_match", "duplicate_is_error") if k in kw}
        return self._sample("rename_keys", RenameKeys(*args, **opts, **kw))

    def extract_keys(self, *patterns: Any, **kw: Any) -> WebDataset:
        """webdataset's ``extract_keys``: a tuple of the fields matching glob patterns."""
        return self._sample("extract_keys", ExtractKeys(*patterns, **kw))

    def xdecode(self, *args: Any, **kw: Any) -> WebDataset:
        """webdataset's ``xdecode`` (decoders chosen by glob patterns on the key)."""
        from . import filters

        return self._sample("xdecode", filters.xdecode(*args, **kw).fn)

    def shuffle(self, size: int, initial: int = 100, **kw: Any) -> WebDataset:
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
        return WebDataset._with_stages(self, Stage("shuffle", "shuffle", n=int(size), initial=int(initial)))

    def batched(self, batchsize: int, collation_fn: Optional[Callable[[List[Any]], Any]] = default_collation_fn,
                partial: bool = True) -> WebDataset:
        """Batch items; later stages apply to batches.

        The default collation is webdataset's (numbers -> numpy array, tensors
        and arrays stacked, anything else a list); ``collation_fn=None``
        gives lists.  Iterated directly, ``partial=False`` drops a short last
        batch; under WebLoader the loader's ``remainder`` decides.
        """
        if batchsize < 1:
            raise ValueError(f"batch_size must be >= 1, got {batchsize}")
        return WebDataset._with_stages(self, Stage("batched", "batched", n=int(batchsize), collation_fn=collation_fn,
                                  partial=bool(partial)))

    def listed(self, batchsize: int, partial: bool = True) -> WebDataset:
        """Lists of ``batchsize`` items, without collation."""
        return self.batched(batchsize, collation_fn=None, partial=partial)

    def unbatched(self) -> WebDataset:
        """Split collated batches back into samples."""
        return WebDataset._with_stages(self, Stage("stream", "unbatched"))

    def unlisted(self) -> WebDataset:
        """Split lists (from ``listed``) back into items."""
        return WebDataset._with_stages(self, Stage("stream", "unlisted"))

    def slice(self, *args: Optional[int]) -> WebDataset:
        """``itertools.islice`` over each worker's stream of an epoch."""
        return WebDataset._with_stages(self, Stage("stream", "slice", args=args))

    def rsample(self, p: float = 0.5) -> WebDataset:
        """Keep each item with probability ``p`` (deterministic per seed, epoch and count)."""
        if not 0.0 <= p <= 1.0:
            raise ValueError(f"rsample: p must be in [0, 1], got {p}")
        return WebDataset._with_stages(self, Stage("stream", "rsample", p=float(p)))

    def log_keys(self, logfile: Optional[str] = None) -> WebDataset:
        """Append ``index, worker, rank, key`` lines to ``logfile`` (None: off)."""
        return WebDataset._with_stages(self, Stage("stream", "log_keys", logfile=logfile))

    def mcached(self) -> WebDataset:
        """Not supported: samples are read by position, never kept in memory."""
        raise NotImplementedError("mcached() is not supported by resumewds: the page cache and the "
                                  "verified shard cache already keep reads cheap")

    def lmdb_cached(self, *args: Any, **kw: Any) -> WebDataset:
        """Not supported (see docs/COMPAT.md)."""
        raise NotImplementedError("lmdb_cached() is not supported by resumewds")

    def repeat(self, nepochs: int = -1, nbatches: int = -1) -> WebDataset:
        """Iterate ``nepochs`` epochs per ``iter()`` (forever if < 1), at most ``nbatches`` items."""
        if nepochs > 0:
            self._mode, self._nepochs = ("once" if nepochs == 1 and nbatches < 1 else "repeat"), int(nepochs)
        else:
            self._mode, self._nepochs = "forever", -1
        self._limit = int(nbatches)
        return self

    def with_epoch(self, nsamples: int = -1, nbatches: int = -1) -> WebDataset:
        """Each ``iter()`` yields ``max(nsamples, nbatches)`` items, continuing the
        stream over epochs (the next ``iter()`` goes on where this one stopped)."""
        self._mode, self._nepochs, self._limit = "forever", -1, int(max(nsamples, nbatches))
        return self

    def with_length(self, n: int, silent: bool = False) -> WebDataset:
        """Give the dataset a ``__len__`` of ``n`` (it does not change an epoch)."""
        if not silent:
            import warnings

            warnings.warn(".with_length() only sets the value of __len__ for compatibility with "
                          "some training environments. It does not change the number of samples "
                          "in an epoch.", stacklevel=2)
        self._length = int(n)
        return self

    def __len__(self) -> int:
        if self._length is None:
            raise TypeError("WebDataset has no len(); use .with_length(n)")
        return self._length

    def __bool__(self) -> bool:
        return True

    def __enter__(self) -> WebDataset:
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
        """The resolved, indexed manifest (resolving and indexing on first use)."""
        if self._manifest is None:
            m = resolve_sources(self.urls, fetch_config=self.fetch,
                                allow_remote_pipe=self.allow_remote_pipe, cache_dir=self.cache_dir)
            if not m.indexed:
                if self.handler is None:
                    index_manifest(m, self.store, on_event=self._on_event)
                else:
                    self._index_with_handler(m)
            self._manifest = m
        return self._manifest

    def _index_with_handler(self, m: Manifest) -> None:
        """Index shard by shard; one that cannot be fetched or indexed goes to the
        ``handler`` (webdataset's), and if it does not re-raise, the shard is
        recorded as skipped and contributes no samples."""
        for s in m.shards:
            if s.indexed:
                continue
            try:
                index_manifest(Manifest([s]), self.store, on_event=self._on_event)
            except (FetchError, IntegrityError, ShardFormatError, CacheError) as exc:
                stop = self.handler(exc) is False
                from .tariterators import salvage_shard

                kept = salvage_shard(s, self.store, exc, stop)  # the samples before the damage, as webdataset
                self._index_skipped = {**(getattr(self, "_index_skipped", None) or {}), s.url: str(exc)}
                self._on_event("skip", s.url, error=str(exc), samples_kept=kept)
                log.warning("skipping shard %s%s", naming(s.url, exc),
                            f" (kept its first {kept} samples)" if kept else "")
        m._starts = None

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
            from .cache import ShardStore

            self._store = ShardStore(cache_dir=self.cache_dir, cache_size=self.cache_size,
                                     verify=self.verify, fetch=self.fetch, on_event=self._on_event)
        return self._store

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
        from . import pipeline

        if pipeline.SKIPPED:  # items a stage's handler skipped in this process
            self._events.extend(pipeline.SKIPPED)
            pipeline.SKIPPED.clear()
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

    # ---- reading (resumewds.reading) ------------------------------------------------
    def _read(self, shard_idx: int, j: int) -> Optional[Dict[str, Any]]:
        """Read sample ``j`` of shard ``shard_idx``; None if the shard is skipped."""
        return reading.read(self, shard_idx, j)

    def _shard_reader(self) -> _ShardReader:
        """This process's open shards (created on first use)."""
        return reading.shard_reader(self)

    def _shard_failed(self, shard_idx: int, shard: ShardInfo, exc: BaseException) -> None:
        """``on_error`` for a shard: raise, skip or stop (:func:`resumewds.reading.shard_failed`)."""
        reading.shard_failed(self, shard_idx, shard, exc)

    def _run_length(self, where: Sequence[Tuple[int, int]], i: int) -> int:
        """How many of ``where[i:]`` are consecutive samples of one shard (within ``_RUN_BYTES``)."""
        return reading.run_length(self.manifest.shards, where, i, _RUN_BYTES)

    def _read_run(self, shard_idx: int, j: int, count: int) -> List[Optional[Dict[str, Any]]]:
        """Samples ``j .. j+count-1`` of one shard with one ``pread`` (:func:`resumewds.reading.read_run`)."""
        return reading.read_run(self, shard_idx, j, count)

    _stopping: bool = False

    def _read_or_stop(self, shard_idx: int, j: int) -> Optional[Dict[str, Any]]:
        """:meth:`_read`, where a handler's stop (``ignore_and_stop``) ends the step
        (:func:`resumewds.steps.read_or_stop`)."""
        return steps.read_or_stop(self, shard_idx, j)

    def _read_run_or_stop(self, shard_idx: int, j: int, count: int) -> List[Optional[Dict[str, Any]]]:
        return steps.read_run_or_stop(self, shard_idx, j, count)

    def _apply(self, stages: Sequence[Callable[[Any], Any]], x: Any) -> Any:
        return steps.apply_stages(stages, x)

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
        slots, whether it is padding), ``sample_shards`` (without
        ``collate``: each delivered sample's shard index, None for padding),
        ``batch_dropped`` (a batch stage
        returned None), ``t_read``, ``t_stages`` and ``t_fetch_wait``
        (seconds), ``events``.
        """
        ep = self.plan.epoch(epoch)
        total = len(ep)
        nsteps = layout.num_steps(total, start)
        shards = self.manifest.shards
        steps.start_steps(self)  # no shard failed, no handler's stop yet (workers: a fresh copy anyway)
        collate_fn = collate_fn or self.collate_fn or default_collate
        last_window = -1
        samples_at, read, stages = ep.samples_at, self._read_or_stop, self.stages
        pread, parse, clock, most = os.pread, tario.parse_sample, time.perf_counter, tario.CHECKED_PREAD
        parse_as = tario.parse_sample_as
        patterns: Dict[int, Any] = {}  # shard -> tario.member_pattern, or () once it stopped paying
        misses: Dict[int, int] = {}
        names: Dict[int, str] = {}
        stream = not str(self.plan.algo).endswith("window")  # shards read front to back
        hint = True
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
            slot_index = meta["slot_index"]  # positions and pad_flags follow from it, after the loop
            nbytes = skipped = filtered = pads = 0
            nslots = len(slots)
            t0 = time.perf_counter()
            # consecutive samples of one shard (the rule unshuffled) are read
            # with one pread: fewer syscalls, and fewer GIL hand-offs to the
            # prefetch threads
            where = samples_at([pos for pos, _ in slots])
            if hint:  # the first step: its reads start at once (cold disk)
                hint = False
                reading.hint_pages(self, where)
            reading.prepare(self, where, stream)  # samples of shards not cached yet: verified ranges
            # The open shards' samples are read here, not through the five calls
            # of ``read`` (a third of the in-process time per sample): the same
            # pread and parse; anything else (a shard not open yet,
            # samples fetched by range, a failed shard, a
            # short read or a malformed sample) takes ``read``, which raises or
            # skips as it always does.
            rd = self._reader
            fast = rd.fast if rd is not None and (rd.ranged is None or not rd.ranged.ready) else None
            touch: Any = rd.open.move_to_end if fast is not None else None  # type: ignore[union-attr]  # the fd LRU
            failed = self._failed
            ahead: List[Optional[Dict[str, Any]]] = []
            for i, (pos, pad) in enumerate(slots):
                si, j = where[i]
                if ahead:
                    sample = ahead.pop()
                elif stream and i + 1 < nslots and where[i + 1] == (si, j + 1):  # a run may start here
                    run = self._run_length(where, i)
                    ahead = self._read_run_or_stop(si, j, run) if run > 1 else [read(si, j)]
                    ahead.reverse()
                    sample = ahead.pop()
                elif fast is not None and (hit := fast.get(si)) is not None and si not in failed \
                        and not self._stopping:
                    fd, offs, url, verified = hit
                    a = int(offs[j])
                    size = int(offs[j + 1]) - a
                    try:
                        buf = pread(fd, size, a) if 0 <= size <= most else b""
                        if len(buf) != size:
                            sample = None
                        else:
                            # verified bytes of a shard whose samples share one member
                            # pattern take tario.parse_sample_as (a miss returns None)
                            pat = patterns.get(si) if verified else ()
                            sample = parse_as(buf, pat) if pat else None
                            if sample is None:
                                sample = parse(buf, url, a, 0, size, verified)
                                if pat != ():  # () : not verified, or no more tries
                                    tario.learn_pattern(patterns, misses, si, sample, pat)
                    except (OSError, ResumeWDSError):
                        sample = None
                    if sample is None:
                        sample = read(si, j)  # the error, or the skip, as read gives it
                    else:
                        sample["__url__"] = url
                        touch(si)
                else:  # shuffled: one sample, no run to look for
                    sample = read(si, j)
                t1 = clock()
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
                t0 = clock()
                t_stages += t0 - t1
                if x is None:
                    filtered += 1
                    continue
                out.append(x)
                slot_index.append(i)
            if slot_index:
                meta["positions"] = [slots[i][0] for i in slot_index]
                meta["pad_flags"] = [bool(slots[i][1]) for i in slot_index]
                if not collate:  # handed out one by one: whose each sample is (consumption)
                    meta["sample_shards"] = [None if slots[i][1] else where[i][0] for i in slot_index]
            meta["samples"] = len(out)
            meta["bytes"] = nbytes
            meta["skipped"] = skipped
            meta["filtered"] = filtered
            meta["pads"] = pads
            t2 = time.perf_counter()
            batch = steps.collate_step(meta, out, collate_fn if collate else None, self.batch_stages)
            t_stages += time.perf_counter() - t2
            meta["t_read"] = t_read
            meta["t_stages"] = t_stages
            if self._reader is not None:
                meta["t_fetch_wait"], self._reader.wait = self._reader.wait, 0.0
            steps.finish_step(meta, self.take_events(), self._stopping)
            if shards and self._failed:
                meta["failed"] = {shards[i].url: e for i, e in self._failed.items()}
            yield k, batch, meta
            if self._stopping:  # the samples before the stop were delivered: no more steps
                return

    # ---- direct iteration (webdataset's semantics, torch DataLoader workers) ----
    def _split(self) -> Tuple[int, int, int, int, List[Any]]:
        """``(rank, world, worker, num_workers, custom splitters)`` for this process."""
        custom: List[Any] = []
        rank, world = 0, 1
        ns = self.nodesplitter
        kind = "split_by_node" if ns is _UNSET else (None if ns is None else _builtin_splitter(ns))
        info = worker_info()
        if kind == "split_by_node":
            rank, world = info[0], info[1]
        elif kind == "single_node_only":
            if info[1] > 1:
                raise ValueError("input pipeline needs to be reconfigured for multinode training "
                                 "(nodesplitter=single_node_only with WORLD_SIZE > 1)")
        elif ns is not None:
            custom.append(ns)
        worker, nworkers = 0, 1
        ws = self.workersplitter
        kind = "split_by_worker" if ws is _UNSET else (None if ws is None else _builtin_splitter(ws))
        if kind == "split_by_worker":
            worker, nworkers = info[2], info[3]
        elif ws is not None and kind is None:
            custom.append(ws)
        return rank, world, worker, nworkers, custom

    def _fresh(self, epoch: int) -> Dict[str, Any]:
        return {"epoch": int(epoch), "step": 0, "skip": 0, "counts": [], "served": 0, "first": int(epoch)}

    def _stream_stages(self) -> List[Stage]:
        return self._spec[self._stream_from:]

    def __iter__(self) -> Iterator[Any]:
        """Iterate as webdataset does: this process's share (rank and DataLoader worker,
        see ``nodesplitter`` / ``workersplitter``) of epoch ``self.epoch``, through every
        stage; ``repeat`` / ``with_epoch`` go on over epochs.  ``state_dict()`` at any
        moment resumes exactly after the last item yielded."""
        rank, world, worker, nworkers, custom = self._split()
        V = world * nworkers
        chunk = self.batch_size or (64 if V == 1 else 1)
        layout = _NoPadLayout(batch_size=chunk, world_size=V, rank=rank + world * worker)
        lay = [V, rank + world * worker, chunk]
        if self._pending is not None:
            st = dict(self._pending)
            self._pending = None
            if st.get("layout") not in (None, lay):
                raise StateError(f"dataset state was taken with (virtual world, rank, chunk) = "
                                 f"{st.get('layout')}, this iterator has {lay}: resume with the same "
                                 "world size and num_workers (or use WebLoader, which resumes "
                                 "under any layout)")
            st["served"] = st.get("served", 0) if st.get("served", 0) < self._limit else 0  # a chunk done: a new one
        elif self._mode != "once" and self._cursor is not None:
            st = dict(self._cursor, served=0, first=self._cursor["epoch"])
        else:
            st = self._fresh(self.epoch)
        st["layout"] = lay
        saved_stages = self.stages
        if custom:
            urls = [{"url": s.url} for s in self.manifest.shards]
            for f in custom:
                urls = list(f(iter(urls)))
            kept = frozenset(d["url"] if isinstance(d, dict) else d for d in urls)
            self.stages = [_KeepShards(kept)] + list(saved_stages)
        if any(s.kind == "stream" and s.name not in _KNOWN_STREAM for s in self._stream_stages()) \
                and not self._warned_opaque:
            self._warned_opaque = True
            log.warning("a compose() stage is opaque to resumewds: a resume replays its epoch "
                        "from the start (still exact if the stage is deterministic)")
        try:
            yield from self._iterate(st, layout)
        finally:
            self.stages = saved_stages

    def _iterate(self, st: Dict[str, Any], layout: Layout) -> Iterator[Any]:
        limit = self._limit if self._mode != "once" else -1
        nepochs = {"once": 1, "repeat": self._nepochs}.get(self._mode, -1)
        self._cursor = st
        empty = 0
        while True:
            if limit > 0 and st["served"] >= limit:
                return  # the epoch goes on in the next iter()
            if nepochs > 0 and st["epoch"] >= st["first"] + nepochs:
                break
            produced, resumed = 0, bool(st["step"] or st["skip"])  # the rest of a resumed epoch may be empty
            for item in self._epoch_items(st, layout):
                produced += 1
                yield item
                if limit > 0 and st["served"] >= limit:
                    return
            nxt = self._fresh(st["epoch"] + 1)
            nxt.update(served=st["served"], first=st["first"], layout=st["layout"])
            st.clear()
            st.update(nxt)
            if self._mode == "once":
                self.epoch = st["epoch"]
            empty = 0 if (produced or resumed) else empty + 1
            if empty and nepochs < 0:
                return  # an epoch gave nothing: do not loop forever (webdataset's rule)
        self.epoch = st["epoch"]

    def _epoch_items(self, st: Dict[str, Any], layout: Layout) -> Iterator[Any]:
        """One epoch of this share from the clean point in ``st``; updates ``st``."""
        epoch = st["epoch"]
        ep = self.plan.epoch(epoch)
        if self.empty_check and len(ep) == 0:
            from .handlers import empty_epoch_error
            raise empty_epoch_error(epoch, getattr(self, "_index_skipped", None))
        stream = self._stream_stages()
        runners = [s.runner(mix(self.seed, epoch, 0x5354, i)) for i, s in enumerate(stream)]
        for r, c in zip(runners, st.get("counts") or []):
            r.count = int(c)
        skip = int(st.get("skip", 0))
        state = {"step": int(st["step"])}

        def source() -> Iterator[Any]:
            j = state["step"]
            start = j * layout.step_size
            url_index: Dict[str, int] = {}
            local = self.cache_dir is not None
            from .fetch import is_remote_url, local_path

            on_disk: Dict[str, Optional[str]] = {}
            for k, batch, meta in self.iter_steps(epoch, start, layout, 0, 1, collate=False):
                self._absorb_meta(meta)
                step = j + k
                if all(r.buffered == 0 for r in runners):
                    st["step"], st["skip"] = step, 0
                    st["counts"] = [r.count for r in runners]
                for sample in batch:
                    if isinstance(sample, dict):
                        if sample.get("__pad__"):
                            continue
                        if local and "__url__" in sample:
                            sample["__local_path__"] = self._local_path(sample["__url__"], url_index)
                        elif "__url__" in sample:  # a local shard: its path, as webdataset sets it
                            lp = on_disk.get(sample["__url__"], "")
                            if lp == "":
                                u = sample["__url__"]
                                lp = on_disk[u] = None if is_remote_url(u) else local_path(u)
                            if lp is not None:
                                sample["__local_path__"] = lp
                    yield sample
            if all(r.buffered == 0 for r in runners):
                st["step"], st["skip"] = layout.num_steps(len(ep), 0), 0
                st["counts"] = [r.count for r in runners]

        it: Iterator[Any] = source()
        for r in runners:
            it = r.run(it)
        for item in until_stop(it):  # a handler's stop ends the epoch quietly
            if skip:
                skip -= 1
                continue
            st["skip"] += 1
            st["served"] += 1
            yield hide_positions(item)  # webdataset's keys only (position keys still readable)

    def _absorb_meta(self, meta: Dict[str, Any]) -> None:
        """Keep what a step reports for ``take_events`` (direct iteration has no loader)."""
        ev = meta.get("events")
        if ev:
            self._events.extend(e for e in ev if e.get("kind") in ("skip", "fail", "sample_skip"))
            del self._events[:-1000]

    def _local_path(self, url: str, index: Dict[str, int]) -> Optional[str]:
        if not index:
            index.update({s.url: i for i, s in enumerate(self.manifest.shards)})
        si = index.get(url)
        hit = self._reader.open.get(si) if (self._reader is not None and si is not None) else None
        return getattr(hit[0], "path", None) if hit else None

    # ---- state (torchdata StatefulDataLoader protocol) -------------------
    def state_dict(self) -> Dict[str, Any]:
        """Where this process's iteration is: resume exactly after the last item yielded.

        Inside a torch DataLoader worker this is that worker's state, which is
        what torchdata's ``StatefulDataLoader`` collects and hands back to
        :meth:`load_state_dict` in the same worker.  No sample data: epoch, the
        last clean step, how many items to skip after it, stage counters.
        """
        cur = self._cursor if self._cursor is not None else self._fresh(self.epoch)
        out = {k: v for k, v in cur.items() if not k.startswith("_")}
        out["counts"] = list(out.get("counts") or [])
        out.update(format=DATASET_STATE, version=1, order=self._order_key())
        return out

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """The next ``iter()`` continues exactly after the state's last item.

        Raises:
            StateError: not a dataset state, or taken with another order.
        """
        if not isinstance(state, dict) or state.get("format") != DATASET_STATE:
            raise StateError("not a resumewds dataset state (missing format field)")
        if state.get("order") != self._order_key():
            raise StateError(f"dataset state was taken with order {state.get('order')}, "
                             f"this dataset has {self._order_key()}")
        self._pending = {k: v for k, v in state.items() if k not in ("format", "version", "order")}
        self.epoch = int(state["epoch"])

    get_state = state_dict
    set_state = load_state_dict

    def _order_key(self) -> Dict[str, Any]:
        try:
            d = dict(self.plan.describe())
        except ResumeWDSError:
            raise
        d["stages"] = [s.name for s in self._spec]
        return d

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


from ._torchreg import register_iterable_dataset  # noqa: E402

register_iterable_dataset(WebDataset)
