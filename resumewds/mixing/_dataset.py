"""MixedDataset / RandomMix: several WebDatasets mixed by weight, exactly resumable.

Each source keeps its own manifest, cache, ``on_error`` and stages; the
mixture decides only which source feeds each position (:class:`MixPlan`) and
which sample of its endless stream (:class:`SourceStream`).  It speaks the
interface :class:`~resumewds.loader.WebLoader` uses, so a loader over it
resumes exactly at any worker count and world size.

Example:
    >>> web = rw.WebDataset("data/shard-{000000..000002}.tar", seed=1, shuffle=True)
    >>> code = rw.WebDataset("data/shard-000003.tar", seed=2)
    >>> mixed = rw.MixedDataset([web, code], weights=[0.75, 0.25], names=["web", "code"],
    ...                         seed=7).with_epoch(16)
    >>> "".join(s["__source__"][0] for s in mixed)
    'cwwwcwwwcwwwcwww'
    >>> loader = rw.WebLoader(mixed, batch_size=4, num_workers=2, journal="run.db")
    >>> [len(b["__key__"]) for b in loader], loader.stats()["mixture"]["sources"][1]["delivered"]
    ([4, 4, 4, 4], 4)
    >>> loader.close()
"""

from __future__ import annotations

from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple, Union

import xxhash

from .. import config
from ..manifest import ShardInfo
from ..plan import Layout, check_partitions, worker_steps
from ..plan import mix as seed_mix
from ..read import Slots, Source, StepPlan, run_steps
from ..stages import Handled, Stage, default_collate, hide_positions, list_collate, reraise_exception, until_stop
from ._plan import MixPlan, SourceStream, Weights
from ._status import _proportions, format_mixture, mixture_status  # noqa: F401  (public here too)


class _MixManifest:
    """The sources' shards as one list (global shard index = offset + local index)."""

    def __init__(self, manifests: Sequence[Any]):
        self.parts = list(manifests)
        self.offsets: List[int] = []
        self.shards: List[ShardInfo] = []
        for m in self.parts:
            self.offsets.append(len(self.shards))
            self.shards.extend(m.shards)

    @property
    def total_samples(self) -> int:
        return sum(m.total_samples for m in self.parts)

    @property
    def counts(self) -> List[int]:
        return [int(s.samples or 0) for s in self.shards]

    @property
    def indexed(self) -> bool:
        return all(m.indexed for m in self.parts)

    def digest(self) -> str:
        h = xxhash.xxh3_64()
        for m in self.parts:
            h.update((m.digest() + "\n").encode())
        return h.hexdigest()


class _MixPlanView:
    """What the loader reads of ``dataset.plan``: ``len(plan.epoch(e))``, the same
    for every epoch."""

    same_epochs = True

    def __init__(self, n: int):
        self.n = n

    def epoch(self, e: int) -> range:
        return range(self.n)


class _MixSteps(StepPlan):
    """The steps of one epoch of a mixture (:func:`resumewds.read.run_steps`'s plan):
    each slot's source and its sample in that source's endless stream; prefetch: each
    source's shards of this step and the next."""

    def __init__(self, mix: MixedDataset, epoch: int, start: int, layout: Layout, worker: int, num_workers: int):
        self.mix, self.epoch, self.start, self.layout = mix, epoch, start, layout
        self.mp, self.streams = mix.mixplan, mix.streams
        self.total = self.mp.epoch_size
        self.mine = list(worker_steps(layout.num_steps(self.total, start), worker, num_workers))
        self.ahead: Dict[int, Slots] = {}  # the next step's slots, computed for its prefetch

    def steps(self) -> Iterable[int]:
        return self.mine

    def step(self, k: int) -> Slots:
        hit = self.ahead.pop(k, None)
        if hit is not None:
            return hit
        where_, streams = self.mp.where, self.streams
        slots = self.layout.slots(self.total, self.start, k)
        where: List[Tuple[int, int]] = []
        srcs: List[int] = []
        for pos, _ in slots:
            src, part, q = where_(self.epoch, pos)
            where.append(streams[src].at(q, part))
            srcs.append(src)
        return slots, where, srcs

    def prefetch(self, n: int, k: int, slots: Slots) -> Iterable[Tuple[int, List[ShardInfo], int]]:
        # fetch this step's and the next step's shards in the background
        steps = [slots]
        if n + 1 < len(self.mine):
            nxt = self.mine[n + 1]
            steps.append(self.ahead.setdefault(nxt, self.step(nxt)))
        want: Dict[int, List[int]] = {}
        for _, where, srcs in steps:
            for (shard, _), src in zip(where, srcs or ()):
                if shard not in want.setdefault(src, []):
                    want[src].append(shard)
        out = []
        for src, idxs in want.items():
            ds = self.mix.datasets[src]
            if ds.prefetch_depth > 0:
                todo = [ds.manifest.shards[s] for s in idxs if s not in ds.reader.failed]
                if todo:
                    out.append((src, todo, 0))
        return out


def _source_name(ds: Any, i: int) -> str:
    urls = getattr(ds, "urls", None)
    if isinstance(urls, str):
        return urls
    return f"source{i}"


class MixedDataset:
    """Several WebDatasets mixed by weight into one exactly-resumable stream.

    Args:
        datasets: the sources (each a :class:`~resumewds.dataset.WebDataset`,
            not ``batched``: the mixture batches).
        weights, repeat, choose, epoch_size, block: as :class:`MixPlan`'s
            (``epoch_size`` also ``.with_epoch(n)``).
        resampled: per source (or one bool for all): draw its shards with
            replacement.  Default: the source's own ``resampled``.
        seed: seed of the interleave; None: :func:`resumewds.config.seed`.
        phases: curriculum: ``[(global_position, weights), ...]`` (a step's
            position: :func:`at_step`).  Adding a phase at or after a
            journal's resume point is a recorded change; any other change of
            sources or weights is refused (JournalConfigMismatch).
        names: a name per source (stats and samples' ``__source__``).
        partitions: node-local partitions, as a single data set's; None: the
            number of nodes at the run's start (a resume keeps the run's).

    Sources are endless: each continues its own stream across mixed epochs,
    so (without resampling) no sample of a source comes twice before all came once.

    Example:
        >>> web, code = rw.WebDataset("data/shard-{000000..000002}.tar"), rw.WebDataset("data/shard-000003.tar")
        >>> mixed = MixedDataset([web, code], weights=[3, 1], names=["web", "code"])
        >>> mixed.mixplan.epoch_size, [s["__source__"] for s in mixed].count("code")
        (32, 8)
    """

    def __init__(self, datasets: Sequence[Any], weights: Optional[Sequence[Optional[float]]] = None, *,
                 repeat: Optional[Sequence[Optional[float]]] = None,
                 choose: Optional[Sequence[Optional[int]]] = None,
                 resampled: Union[bool, Sequence[bool], None] = None,
                 epoch_size: Optional[int] = None, seed: Optional[int] = None,
                 phases: Optional[Sequence[Tuple[int, Weights]]] = None,
                 names: Optional[Sequence[str]] = None, block: int = 1,
                 partitions: Optional[int] = None):
        self.datasets = list(datasets)
        if not self.datasets:
            raise ValueError("MixedDataset needs at least one dataset")
        for i, ds in enumerate(self.datasets):
            if not hasattr(ds, "reader") or not hasattr(ds, "manifest"):
                raise TypeError(f"mixture source {i} is a {type(ds).__name__}, not a resumewds.WebDataset")
            if getattr(ds, "batch_size", None) is not None:
                raise ValueError(f"mixture source {i} is batched(); batch the mixture instead")
        k = len(self.datasets)
        if isinstance(resampled, bool):
            resampled = [resampled] * k
        elif resampled is None:
            resampled = [bool(getattr(ds, "resampled", False)) for ds in self.datasets]
        self.resampled = [bool(r) for r in resampled]
        if len(self.resampled) != k:
            raise ValueError(f"resampled has {len(self.resampled)} entries for {k} sources")
        self.names = list(names) if names is not None else [_source_name(d, i) for i, d in enumerate(self.datasets)]
        if len(self.names) != k:
            raise ValueError(f"names has {len(self.names)} entries for {k} sources")
        self.weights = list(weights) if weights is not None else None
        self.repeat = list(repeat) if repeat is not None else None
        self.choose = list(choose) if choose is not None else None
        self.epoch_size = epoch_size
        self.seed = config.seed(seed)
        self.block = int(block)
        self.partitions = partitions  # requested; None: the loader's node count (or the run's)
        self.plan_partitions = 1 if partitions is None else check_partitions(partitions)
        self.phases = [(int(a), dict(w) if isinstance(w, dict) else list(w)) for a, w in (phases or [])]
        self.stages: List[Callable[[Any], Any]] = []
        self.batch_stages: List[Callable[[Any], Any]] = []
        self.batch_size: Optional[int] = None
        self.batch_partial = True
        self.collate_fn: Optional[Callable[[List[Any]], Any]] = None
        self.epoch = 0
        self._mix: Optional[MixPlan] = None
        self._streams: Optional[List[SourceStream]] = None
        self._manifest: Optional[_MixManifest] = None

    # ---- fluent -------------------------------------------------------------
    def with_epoch(self, n: int) -> MixedDataset:
        """An epoch of ``n`` samples (positions) over the endless sources."""
        if int(n) < 1:
            raise ValueError(f"with_epoch needs n >= 1, got {n}")
        self.epoch_size = int(n)
        self._mix = None
        return self

    def map(self, fn: Callable[[Any], Any], handler: Any = None) -> MixedDataset:
        """Apply ``fn`` to each mixed sample (after the source's own stages), or to each
        batch after :meth:`batched`; a None result drops it.  ``handler=`` decides about
        an exception as a data set's ``.map`` does (skip, counted as skipped; or stop)."""

        if handler is not None and handler is not reraise_exception:
            fn = Handled(fn, handler, "map")
        (self.batch_stages if self.batch_size is not None else self.stages).append(fn)
        return self

    def batched(self, batch_size: int, collation_fn: Optional[Callable[[List[Any]], Any]] = default_collate,
                partial: bool = True) -> MixedDataset:
        """Batch the mixed samples; later :meth:`map` calls apply to batches.  Iterated
        directly, ``partial=False`` drops a short last batch (as a data set's ``.batched``);
        under WebLoader the loader's ``remainder`` rules it."""
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        self.batch_size = int(batch_size)
        self.collate_fn = collation_fn if collation_fn is not None else list_collate
        self.batch_partial = bool(partial)
        return self

    def stream_stages(self) -> List[Stage]:
        """What runs on the mixed stream when the mixture is iterated directly: its
        :meth:`batched` and the maps after it, as :class:`~resumewds.stages.Stage` s run by
        the runners a data set's direct iteration uses (:mod:`resumewds.stages`)."""
        if self.batch_size is None:
            return []
        return [Stage("batched", "batched", n=self.batch_size, collation_fn=self.collate_fn,
                      partial=self.batch_partial)] + [Stage("sample", "map", fn) for fn in self.batch_stages]

    # ---- plan ---------------------------------------------------------------
    @property
    def mixplan(self) -> MixPlan:
        if self._mix is None:
            sizes = [ds.manifest.total_samples for ds in self.datasets]
            self._mix = MixPlan(sizes, self.weights, repeat=self.repeat, choose=self.choose,
                                epoch_size=self.epoch_size, seed=self.seed, phases=self.phases,
                                block=self.block, partitions=self.plan_partitions)
        return self._mix

    @property
    def streams(self) -> List[SourceStream]:
        if self._streams is None:
            # each source's own order (its shuffle settings, a .shuffle(n) compiled into
            # the plan: WebDataset._order), repeated or resampled by the mixture
            orders = [ds._order() for ds in self.datasets]
            for ds in self.datasets:  # their readers keep a window open per partition, as one data set's
                ds.use_partitions(self.plan_partitions)
            self._streams = [SourceStream(ds.manifest.counts, ds.seed, algo, window, resampled=r,
                                          partitions=self.plan_partitions)
                             for ds, (algo, window), r in zip(self.datasets, orders, self.resampled)]
        return self._streams

    @property
    def manifest(self) -> _MixManifest:
        if self._manifest is None:
            self._manifest = _MixManifest([ds.manifest for ds in self.datasets])
        return self._manifest

    @property
    def plan(self) -> _MixPlanView:
        return _MixPlanView(self.mixplan.epoch_size)

    def locate(self, epoch: int, position: int) -> Tuple[int, int, int]:
        """``(source, shard index in that source, sample in shard)`` of a position."""
        src, part, q = self.mixplan.where(epoch, position)
        shard, j = self.streams[src].at(q, part)
        return src, shard, j

    # ---- loader interface ---------------------------------------------------
    def _sources_config(self) -> List[Dict[str, Any]]:
        out = []
        for i, (ds, st) in enumerate(zip(self.datasets, self.streams)):
            d = {"name": self.names[i], "manifest": ds.manifest.digest(),
                 "samples": ds.manifest.total_samples}
            d.update(st.describe())
            out.append(d)
        return out

    # ---- node partitions (resumewds.plan) ----------------------------------
    def use_partitions(self, partitions: int) -> None:
        """Set the partition count (the loader resolves None); the sources' readers follow it.

        Example:
            >>> mixed = MixedDataset([rw.WebDataset("data/shard-000000.tar")] * 2, weights=[1, 1])
            >>> mixed.use_partitions(2); mixed.config()["partitions"]
            2
        """
        n = check_partitions(partitions)
        if n != self.plan_partitions:
            self.plan_partitions = n
            self._mix = None
            self._streams = None
        for ds in self.datasets:
            ds.use_partitions(n)

    def config(self) -> Dict[str, Any]:
        """What the delivered order depends on (the journal's config check).

        ``mixture_phases`` may grow at a resume (an explicit curriculum step,
        see :meth:`compatible_config`); everything else must stay equal.
        """
        mp = self.mixplan
        d = mp.describe()
        # "manifest" covers all but the later phases (mixture_phases: the journal checks them)
        h = xxhash.xxh3_64(self.manifest.digest().encode())
        h.update(repr((self._sources_config(), self.seed, mp.epoch_size, d["phases"][0], mp.block)).encode())
        return {"manifest": h.hexdigest(), "samples": mp.epoch_size,
                "shards": len(self.manifest.shards), "seed": self.seed, "shuffle": "mixture",
                "shuffle_window": None, "mixture_sources": self._sources_config(),
                "mixture_phases": d["phases"], "mixture_block": mp.block,
                **({"partitions": mp.partitions} if mp.partitions != 1 else {})}

    def compatible_config(self, old: Dict[str, Any], point: Optional[Dict[str, Any]]) -> Tuple[str, ...]:
        """Config keys that may differ from the journal's ``old`` config at this resume.

        ``mixture_phases`` may only gain phases that start at or after the
        resume point (``point``, the commit being resumed).
        """
        if not old or "mixture_phases" not in old:
            return ()
        new = self.config()
        oldp, newp = old["mixture_phases"], new["mixture_phases"]
        if oldp == newp or len(newp) <= len(oldp) or newp[:len(oldp)] != oldp:
            return ()
        g = 0
        if point is not None:
            g = int(point["epoch"]) * int(new["samples"]) + int(point["position"])
        if any(int(s) < g for s, _ in newp[len(oldp):]):
            return ()
        return ("mixture_phases",)

    def mixture_stats(self, epoch: int, position: int) -> Dict[str, Any]:
        """Delivered vs requested proportions, exact, for the whole run so far (any resumes)."""
        return _proportions(self.mixplan, self.names, epoch, position)

    def cache_dirs(self) -> List[str]:
        """The directories of the sources' shard caches (:meth:`resumewds.WebDataset.cache_dirs`)."""
        return sorted({d for ds in self.datasets for d in ds.cache_dirs()})

    def take_events(self) -> List[Dict[str, Any]]:
        return [ev for ds in self.datasets for ev in ds.take_events()]

    def __getstate__(self) -> Dict[str, Any]:
        _ = self.manifest  # every source indexed before workers start
        d = dict(self.__dict__)
        d["_mix"] = None
        d["_streams"] = None
        return d

    def close(self) -> None:
        for ds in self.datasets:
            ds.close()

    # ---- reading ------------------------------------------------------------
    def iter_steps(self, epoch: int, start: int, layout: Layout, worker: int = 0,
                   num_workers: int = 1, collate: bool = True,
                   collate_fn: Optional[Callable[[List[Any]], Any]] = None
                   ) -> Iterator[Tuple[int, Any, Dict[str, Any]]]:
        """Yield ``(step, batch, meta)`` for this worker's steps, as WebDataset does.

        ``collate_fn`` overrides the mixture's own; ``meta`` also has ``sources``
        (samples per source index).  Read by :func:`resumewds.read.run_steps`.
        """
        streams = self.streams
        collate_fn = collate_fn or self.collate_fn or default_collate
        plan = _MixSteps(self, epoch, start, layout, worker, num_workers)
        # a source whose order is not a shuffled window reads its shards front to back
        sources = [Source(ds, list(ds.stages) + self.stages, name=self.names[i],
                          stream=not str(st.describe()["shuffle"]).endswith("window"))
                   for i, (ds, st) in enumerate(zip(self.datasets, streams))]
        yield from run_steps(sources, plan, epoch, worker, collate_fn if collate else None,
                             self.batch_stages, self.take_events, mixture=True)

    def __iter__(self) -> Iterator[Any]:
        """Yield the items of epoch ``self.epoch`` in order, in this process: the mixed samples
        through each source's stages and the mixture's, then its :meth:`stream_stages`
        (``batched`` and the maps after it), as a data set iterated directly runs them."""

        def samples() -> Iterator[Any]:
            for _, batch, _ in self.iter_steps(self.epoch, 0, Layout(batch_size=64), collate=False):
                yield from batch

        it: Iterator[Any] = samples()
        on_event = self.datasets[0]._on_event  # (a mixture's events are its sources')
        for i, st in enumerate(self.stream_stages()):
            it = st.runner(seed_mix(self.seed, self.epoch, 0x5354, i), on_event).run(it)
        for item in until_stop(it):
            yield hide_positions(item)  # webdataset's keys only (position keys still readable)


def RandomMix(datasets: Sequence[Any], probs: Optional[Sequence[float]] = None,
              longest: bool = False) -> MixedDataset:
    """webdataset's ``RandomMix(datasets, probs=None, longest=False)``, deterministic.

    ``probs`` (default: equal) are the weights; an epoch is ``min_i(size_i / p_i)``
    positions.  ``longest=True``: every sample of every source once per epoch,
    interleaved evenly (docs/MIXTURES.md).  The seed is the first dataset's.

    Example:
        >>> a, b = rw.WebDataset("data/shard-{000000..000002}.tar"), rw.WebDataset("data/shard-000003.tar")
        >>> len(list(RandomMix([a, b], probs=[0.5, 0.5])))  # b (8 samples) runs out after 16
        16
    """
    datasets = list(datasets)
    seed = int(getattr(datasets[0], "seed", 0)) if datasets else 0
    if longest:
        return MixedDataset(datasets, None, seed=seed)
    if probs is None:
        probs = [1.0] * len(datasets)
    probs = [float(p) for p in probs]
    if len(probs) != len(datasets):
        raise ValueError(f"RandomMix: {len(probs)} probs for {len(datasets)} datasets")
    tot = sum(probs)
    if tot <= 0 or any(p < 0 for p in probs):
        raise ValueError(f"RandomMix: probs {probs} must be >= 0 with a positive sum")
    sizes = [ds.manifest.total_samples for ds in datasets]
    n = min(int(s * tot / p) for s, p in zip(sizes, probs) if p > 0)
    return MixedDataset(datasets, probs, epoch_size=max(1, n), seed=seed)


def at_step(step: int, batch_size: int, world_size: int = 1) -> int:
    """The global position of training step ``step`` (for ``phases``).

    Example:
        >>> at_step(1000, 32, 8)
        256000
    """
    return int(step) * int(batch_size) * int(world_size)
