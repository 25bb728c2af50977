"""ShardDataset: the engine's data set, composing source, cache, plan, tar reading and stages.

It computes which global positions a step holds (:mod:`resumewds.plan`) and
reads exactly those samples' byte ranges, so resuming at position ``n`` costs
the same for any ``n``.  It does not import torch.

Example:
    >>> from resumewds.stages import Map, Stage, ToTuple
    >>> ds = ShardDataset("data/shard-{000000..000003}.tar", seed=7, shuffle=True).with_stages(
    ...     [Stage("sample", "to_tuple", ToTuple("__key__", "cls"))])
    >>> steps = ds.iter_steps(0, 0, Layout(4))
    >>> k, batch, meta = next(steps); k, len(batch), meta["samples"]
    (0, 2, 4)
"""

from __future__ import annotations

import copy
import logging
import warnings
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple, Union

from .. import config
from ..cache import ShardStore
from ..events import event_record
from ..fetch import is_remote_url
from ..manifest import Manifest, ShardInfo
from ..plan import EpochLayout, Layout, Plan, check_partitions, worker_steps
from ..sources import Source, index_manifest, index_skipping, resolve_sources
from ..stages import Stage, default_collate, list_collate, reraise_exception
from ._engine import Slots, StepPlan, run_steps
from ._engine import Source as _StepSource
from ._shards import RUN_BYTES
from ._shards import ShardReader as _ShardReader
from ._torchreg import register_iterable_dataset

__all__ = ["ON_ERROR", "ShardDataset"]

log = logging.getLogger("resumewds")

_RUN_BYTES = RUN_BYTES  # most bytes read with one pread (tests lower it)

ON_ERROR = ("raise", "skip")

#: fewest shards in a window of ``.shuffle(n)`` compiled into the plan
_BUFFER_MIN_WINDOW = 8


class _EpochSteps(StepPlan):
    """The steps of one epoch of a data set (:func:`resumewds.read.run_steps`'s plan)."""

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
        # this window's shards (a shuffled window touches them all at once), then ``prefetch`` more
        here = ep.window_shards(w)
        shards = self.ds.manifest.shards
        upcoming = [shards[i] for i in ep.shards_from(first, len(here) + self.ds.prefetch_depth)]
        return [(0, upcoming, len(here))] if upcoming else ()


class ShardDataset:
    """A resumable, deterministic data set over tar shards: the engine's data set.

    A *definition*: sources, seed, shuffle settings and a list of stage specs
    (:attr:`stage_specs`, :meth:`with_stages`, :meth:`compose`), producing the
    steps of any ``(epoch, start position, layout, worker)`` (:meth:`iter_steps`).
    :class:`resumewds.WebDataset` is this class with webdataset's face.

    Args:
        urls: a path, URL, brace pattern, ``pipe:`` command or manifest.json,
            or a list of them, or a :class:`~resumewds.manifest.Manifest`.
        seed: seed of the order (same seed, same order on any machine);
            None: ``RESUMEWDS_SEED``, else ``WDS_SEED``, else 0.
        shuffle: False: manifest order; True / ``"window"``: shard order
            permuted per epoch and samples shuffled within windows of
            ``shuffle_window`` shards; ``"shards"``: shard order only.
        shuffle_window: shards per shuffle window.
        cache_dir, cache_size, verify, fetch: passed to the shard cache
            (:class:`resumewds.cache.ShardStore`).
        on_error: ``"raise"`` (default) stops at a shard that cannot be
            fetched or verified; ``"skip"`` skips it for the rest of the epoch
            (tried again in the next), recorded as failed.
        handler: a handler for shard and sample errors (:mod:`resumewds.stages`):
            True skips like ``on_error="skip"``; False stops the iteration.
        allow_pickle: let decoders unpickle (pkl/pyd): off by default.
        allow_remote_pipe, allow_remote_local, manifest_max_bytes: the trust given
            to remote manifests (:func:`resumewds.sources.resolve_sources`).
        cache_sync: ``"auto"``, ``"fsync"`` or ``"boot"`` (:class:`resumewds.cache.ShardStore`);
            None: ``RESUMEWDS_CACHE_SYNC``, else ``"auto"``.
        prefetch: how many upcoming shards to download in the background.
        partitions: node-local partitions of the order (:class:`resumewds.plan.Plan`);
            None: the number of nodes at the run's start (a resume keeps the
            run's recorded count); 1: one order over all shards.
        ranged_reads: accepted for compatibility and ignored (with a warning).
        resampled: draw each epoch's shards with replacement (deterministically).
        empty_check: raise ValueError when an epoch (or a worker of a shard split) gets no samples.

    Example:
        >>> from resumewds.stages import Stage, ToTuple
        >>> spec = Stage("sample", "to_tuple", ToTuple("txt", "cls"))
        >>> ds = ShardDataset(["a.tar", "b.tar"], seed=3).compose(spec)  # doctest: +SKIP
    """

    def __init__(self, urls: Source, *, seed: Optional[int] = None, shuffle: Union[bool, str, None] = False,
                 shuffle_window: Optional[int] = None, cache_dir: Optional[str] = None,
                 cache_size: Union[int, str, None] = None, verify: str = "once", fetch: Any = None,
                 on_error: str = "raise", handler: Any = None, allow_pickle: bool = False,
                 allow_remote_pipe: bool = False, allow_remote_local: Optional[bool] = None,
                 manifest_max_bytes: Union[int, str, None] = None, cache_sync: Optional[str] = None,
                 prefetch: int = 4, partitions: Optional[int] = None,
                 ranged_reads: Optional[bool] = None, resampled: bool = False, empty_check: bool = True):
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
        self._spec: List[Stage] = []
        self.epoch = 0
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

    # ---- stages: the engine's stage specs -----------------------------------
    @property
    def stage_specs(self) -> Tuple[Stage, ...]:
        """The data set's stages, in order, as :class:`~resumewds.stages.Stage` specs (read-only:
        :meth:`with_stages` gives a copy with others).

        Example:
            >>> from resumewds.stages import Map, Stage
            >>> ds = ShardDataset("data/shard-000000.tar").compose(Stage("sample", "map", Map(str)))
            >>> [(st.kind, st.name) for st in ds.stage_specs]
            [('sample', 'map')]
        """
        return tuple(self._spec)

    @property
    def stream_from(self) -> int:
        """The index in :attr:`stage_specs` of the first stage not run where each sample is read.

        Example:
            >>> from resumewds.stages import Map, Stage
            >>> ds = ShardDataset("data/shard-000000.tar").compose(
            ...     Stage("sample", "map", Map(str)), Stage("batched", "batched", n=4, collation_fn=None, partial=True))
            >>> ds.stream_from, ds.batch_size
            (1, 4)
        """
        return self._stream_from

    @property
    def loader_from(self) -> int:
        """The index in :attr:`stage_specs` of the first stage the engine's loader does not run
        (after the per-sample prefix, one ``batched`` spec and its :attr:`batch_stages`).

        Example:
            >>> from resumewds.stages import Stage
            >>> batched = Stage("batched", "batched", n=4, collation_fn=None, partial=True)
            >>> ds = ShardDataset("data/shard-000000.tar").compose(batched, Stage("stream", "unbatched"))
            >>> ds.stream_from, ds.loader_from
            (0, 1)
        """
        return self._loader_from

    def with_stages(self, specs: Sequence[Stage]) -> ShardDataset:
        """A copy whose stages are ``specs`` (e.g. a slice of :attr:`stage_specs`; the same
        data, manifest and settings, no iteration in progress).

        Raises:
            TypeError: an item of ``specs`` is not a ``Stage``.

        Example:
            >>> from resumewds.stages import Map, Stage
            >>> ds = ShardDataset("data/shard-000000.tar").compose(Stage("sample", "map", Map(str)),
            ...                                                    Stage("stream", "unbatched"))
            >>> cut = ds.with_stages(ds.stage_specs[:ds.stream_from])
            >>> len(cut.stage_specs), len(ds.stage_specs)
            (1, 2)
        """
        ds = self._derived()
        ds._set_stages(specs)
        return ds

    def compose(self, *stages: Any) -> ShardDataset:
        """A copy with more stages: :class:`~resumewds.stages.Stage` specs, or generator
        functions ``f(iterator) -> iterator`` (webdataset's ``compose(f)``), run over each
        worker's stream; an opaque generator replays an epoch from its start on resume.

        Example:
            >>> from resumewds.stages import Select, Stage
            >>> ds = ShardDataset("data/shard-000000.tar").compose(Stage("sample", "select", Select(bool)))
            >>> ds.stage_specs
            (Stage(select),)
        """
        specs = []
        for st in stages:
            if not isinstance(st, Stage):
                if not callable(st):
                    raise TypeError(f"compose() needs callables, got {st!r}")
                st = Stage("stream", getattr(st, "__name__", "compose"), st)
            specs.append(st)
        return self.with_stages(self.stage_specs + tuple(specs))

    def _set_stages(self, specs: Sequence[Stage]) -> None:
        """Use ``specs`` as this data set's stages, in place (:meth:`with_stages` on its copy)."""
        specs = list(specs)
        bad = next((st for st in specs if not isinstance(st, Stage)), None)
        if bad is not None:
            raise TypeError(f"with_stages() needs resumewds.stages.Stage specs, got {bad!r}")
        self._spec = specs
        self.collate_fn = None  # (the batched spec's, if any, is compiled again)
        self._compile()

    def _compile(self) -> None:
        """Split the stages: the per-sample prefix and ``.shuffle(n)`` (into the plan), one
        ``.batched`` and the maps after it (what WebLoader runs), the stream stages."""
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

    def _derived(self) -> ShardDataset:
        """A copy with its own list of stages and no iteration in progress."""
        ds = copy.copy(self)
        ds._spec = list(self._spec)
        ds._events = []
        ds._fresh_copy()
        return ds

    def _fresh_copy(self) -> None:
        """Called on a copy :meth:`with_stages` made: a subclass forgets its iteration in progress here."""

    def __bool__(self) -> bool:
        return True

    def __enter__(self) -> ShardDataset:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def set_epoch(self, epoch: int) -> None:
        """The epoch of the next iteration (like a DistributedSampler's)."""
        self.epoch = int(epoch)


    # ---- state shared with the loader ----------------------------------
    @property
    def manifest(self) -> Manifest:
        """The resolved, indexed manifest (on first use, in the calling thread: a loader
        does it before its workers start, so that they inherit it)."""
        if self._manifest is None:
            m, skipped = self._resolve()
            if skipped is not None:
                self._index_skipped = {**(self._index_skipped or {}), **skipped}
            self._manifest = m
        return self._manifest

    def _resolve(self) -> Tuple[Manifest, Optional[Dict[str, str]]]:
        """The sources resolved and indexed; the shards skipped under a ``handler``."""
        trust: Dict[str, Any] = {"allow_remote_pipe": self.allow_remote_pipe,
                                 "allow_remote_local": self.allow_remote_local,
                                 "manifest_max_bytes": self.manifest_max_bytes}
        m = resolve_sources(self.urls, fetch_config=self.fetch, cache_dir=self.cache_dir, **trust)
        # counts-only shards (a wids shard index, img2dataset stats) are recorded when
        # first opened (resumewds.manifest.RecordBook): the plan needs their counts only
        todo = [s for s in m.shards if not s.indexed and s.counted is None]
        if not todo:
            return m, None
        from ..sources import fill_from_beside  # lazy: shards named one by one, not yet indexed

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
        """The directory of this data set's shard cache: ranks on one host that share it are
        one node (:func:`resumewds.plan._world.node_key`).

        Example:
            >>> ShardDataset(["a.tar"], cache_dir="/tmp/c").cache_dirs()
            ['/tmp/c']
        """
        return [self.store.cache_dir]

    def steps_of(self, layout: Union[Layout, EpochLayout], epoch: int) -> Any:
        """``layout``'s steps of epoch ``epoch``: an :class:`~resumewds.plan.EpochLayout`
        bound to the epoch's plan; any other layout as it is.

        Example:
            >>> ds = ShardDataset("data/shard-{000000..000003}.tar")
            >>> ds.steps_of(Layout(4), 0) == Layout(4)
            True
        """
        bind = getattr(layout, "bind", None)
        return layout if bind is None else bind(self.plan.epoch(epoch))

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

    # ---- reading (resumewds.read) ---------------------------------------------
    @property
    def reader(self) -> _ShardReader:
        """This process's reading state and read path (made on first use; pickling drops it),
        sized to the shards a step can touch (a window per partition when shuffled)."""
        if self._reader is None:
            parts = min(self.plan_partitions, 8)
            windowed = str(self.plan.algo).endswith("window")
            self._reader = _ShardReader(self.store, self.shuffle_window * parts + 2 if windowed else parts + 1,
                                        self.manifest.shards, on_error=self.on_error, handler=self.handler,
                                        on_event=self._on_event,
                                        ranged=self.prefetch_depth > 0 and any(is_remote_url(s.url)
                                                                               for s in self.manifest.shards),
                                        run_bytes=_RUN_BYTES)
        return self._reader

    def iter_steps(self, epoch: int, start: int, layout: Layout, worker: int = 0,
                   num_workers: int = 1, collate: bool = True,
                   collate_fn: Optional[Callable[[List[Any]], Any]] = None, each: bool = False
                   ) -> Iterator[Tuple[int, Any, Any]]:
        """Yield ``(step, batch, meta)`` for this worker's steps of an epoch.

        Args:
            start: global position to start from.
            layout: a :class:`~resumewds.plan.Layout`, or an
                :class:`~resumewds.plan.EpochLayout`, bound or not.
            worker, num_workers: this DataLoader worker's share (round-robin
                over steps).
            collate: collate samples; if False the batch is the list of samples.
            collate_fn: the collate function (default: the one of
                ``batched()``, else torch-free ``default_collate``).
            each: with ``collate=False``: each sample as soon as it is read
                (:func:`resumewds.read.run_steps`, which also lists ``meta``).
        """
        ep = self.plan.epoch(epoch)
        if hasattr(layout, "bind"):  # an EpochLayout (resumewds.plan): its steps of this epoch
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
