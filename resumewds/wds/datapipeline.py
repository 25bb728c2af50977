"""``DataPipeline``: webdataset's composable API, compiled into the deterministic plan.

A DataPipeline compiles the stages it can see through (the shard lists, the splitters, the
shuffles, ``tarfile_to_samples``, the per-sample stages, ``batched``) into a
:class:`resumewds.WebDataset` (it is one), which resumes exactly.  Any other stage still runs,
on the stream, with every stage after it; then the pipeline warns once, ``exact`` is False and
``state_dict()["exact"]`` says so.  The deliberate differences: docs/COMPAT.md.
"""

from __future__ import annotations

import copy
import itertools
import sys
import warnings
from typing import Any, Dict, Iterator, List, Optional, Tuple

from torch.utils.data import IterableDataset, get_worker_info

from .. import config
from ..errors import ResumeWDSError, StateError
from ..plan import Layout
from ..run import check_seal, seal
from ..stages import Stage, default_collate, hide_positions
from . import filters, tariterators
from ._shardsplit import WorkerStream
from .handlers import reraise_exception
from .shardlists import ResampledShards, SimpleShardList
from .splitters import worker_info
from .utils import PipelineStage, add_length_method
from .webdataset import WebDataset

__all__ = ["DataPipeline"]

STATE_FORMAT = "resumewds.datapipeline"
STATE_VERSION = 1
_CHUNK = 64  # positions per step when the pipeline is not batched
_SPLITTERS = {"split_by_node": "node_split", "split_by_worker": "worker_split", "single_node_only": "single_node"}
_PER_SAMPLE = ("decode", "map", "map_dict", "map_tuple", "to_tuple", "select", "rename", "rename_keys",
               "extract_keys", "xdecode", "associate")
_PER_BATCH = ("map", "map_dict", "map_tuple", "to_tuple", "decode", "rename")


def _splitter_name(stage: Any) -> Optional[str]:
    name = getattr(stage, "__name__", None)
    mod = getattr(stage, "__module__", "") or ""
    if name in _SPLITTERS and mod.startswith("resumewds"):
        return name
    return None


class _Unpositioned:
    """A collation that sees each sample with webdataset's keys only (picklable)."""

    def __init__(self, fn: Any):
        self.fn = fn

    def __call__(self, samples: List[Any]) -> Any:
        return self.fn([hide_positions(s) for s in samples])


class _Compiled:
    """What the stages say, for the plan (filled by :func:`_compile`)."""

    def __init__(self) -> None:
        self.source: Any = None
        self.resampled = False
        self.shard_shuffle: Optional[filters.ShuffleStage] = None
        self.sample_shuffle: Optional[filters.ShuffleStage] = None
        self.node_split = False
        self.worker_split = False
        self.single_node = False
        self.handler: Any = reraise_exception
        self.per_sample: List[filters.SampleStage] = []
        self.batch: Optional[filters.BatchedStage] = None
        self.per_batch: List[filters.SampleStage] = []
        self.tail: List[Any] = []
        self.generic = False
        self.opaque: Any = None  # the first stage the plan cannot see through


def _compile(stages: List[Any]) -> _Compiled:
    c = _Compiled()
    if not stages or not isinstance(stages[0], (SimpleShardList, ResampledShards)):
        c.generic = True
        c.opaque = stages[0] if stages else None
        return c
    if "-" in stages[0].urls:  # stdin: a stream read once, no seeking, so no plan (webdataset's way)
        c.generic = True
        c.opaque = "url '-' (stdin)"
        return c
    c.source = stages[0]
    c.resampled = isinstance(stages[0], ResampledShards)
    i = 1
    # url-level stages
    while i < len(stages):
        st = stages[i]
        name = _splitter_name(st)
        if name is not None:
            setattr(c, _SPLITTERS[name], True)
        elif isinstance(st, filters.ShuffleStage) and c.shard_shuffle is None:
            c.shard_shuffle = st
        else:
            break
        i += 1
    st = stages[i] if i < len(stages) else None
    if isinstance(st, tariterators.TarfileToSamples) and st.select_files is None and st.rename_files is None:
        c.handler = st.handler
    elif st is tariterators.tarfile_samples:
        pass
    else:
        c.generic = True
        c.opaque = st if st is not None else "(no tarfile_to_samples stage)"
        return c
    i += 1
    # sample-level stages
    for j in range(i, len(stages)):
        st = stages[j]
        if c.batch is None:
            if isinstance(st, filters.SampleStage) and st.name in _PER_SAMPLE:
                c.per_sample.append(st)
                continue
            if isinstance(st, filters.ShuffleStage) and c.sample_shuffle is None:
                # (after per-sample stages too: the plan's shuffle before them gives the same set)
                c.sample_shuffle = st
                continue
            if isinstance(st, filters.BatchedStage):
                c.batch = st
                continue
        elif isinstance(st, filters.SampleStage) and st.name in _PER_BATCH:
            c.per_batch.append(st)
            continue
        c.tail = list(stages[j:])
        break
    return c


class DataPipeline(WebDataset, IterableDataset):
    """webdataset's ``DataPipeline(*stages)``, compiled into the plan when possible.

    Args:
        *stages: the stages (None skipped, lists spliced in), source first.
        seed: seed of the plan (default: the shuffle stage's ``seed=``, else the shard
            list's, else :func:`resumewds.config.seed`).
        **kw: passed to :class:`resumewds.WebDataset` when compiled.
    """

    def __init__(self, *args: Any, seed: Optional[int] = None, **kw: Any):
        stages: List[Any] = []
        for a in args:
            if a is None:
                continue
            if isinstance(a, list):
                stages.extend(a)
            else:
                stages.append(a)
        self.pipeline = stages
        self.repetitions = 1
        self.nsamples = -1
        self._seed_arg, self._kw = seed, dict(kw)
        self._warned = False
        self._build(warn=True)

    def _build(self, warn: bool) -> None:
        """Compile ``self.pipeline`` (again, after :meth:`append`; a subclass's ``__init__`` is not
        run again).  ``warn``: say now when a stage is opaque (else on the first ``iter()``).
        """
        c = self._c = _compile(self.pipeline)
        seed, kw = self._seed_arg, dict(self._kw)
        self._state: Dict[str, Any] = {"epoch": 0, "position": 0, "skip": 0}
        for name in ("_loaded", "_given"):  # a new pipeline: no state loaded or given away yet
            self.__dict__.pop(name, None)
        if c.generic:
            WebDataset.__init__(self, [], seed=0)
            self._engine_key = None
            if warn:
                self._warn(c.opaque, whole=True)
            return
        if seed is None:
            seed = next((s.seed for s in (c.sample_shuffle, c.shard_shuffle) if s is not None and
                         isinstance(s.seed, int)), None)
        if seed is None:
            src_seed = getattr(c.source, "seed", None)
            seed = src_seed if isinstance(src_seed, int) and not isinstance(src_seed, bool) else config.seed()
        shuffled = c.shard_shuffle is not None or c.resampled or (
            isinstance(c.source, SimpleShardList) and c.source.seed is not None)
        mode: Any = "shards" if shuffled else False
        key = (list(c.source.urls), int(seed), mode, c.handler, kw)
        if getattr(self, "_engine_key", None) != key:
            WebDataset.__init__(self, list(c.source.urls), seed=int(seed), shuffle=mode, handler=c.handler, **kw)
            self._engine_key = key
        # else the same source and settings (an append): keep the engine; only the stages are compiled again
        specs: List[Stage] = []
        sh = c.sample_shuffle
        if sh is not None and sh.bufsize >= 1:  # the plan's seeded shuffle
            specs.append(Stage("shuffle", "shuffle", n=int(sh.bufsize), initial=int(sh.initial)))
        # each stage's own callable, as webdataset's filter runs it (not .map(), which keeps __key__)
        specs += [Stage("sample", "map", st.fn) for st in c.per_sample]
        if c.batch is not None:
            specs.append(Stage("batched", "batched", n=c.batch.batchsize, collation_fn=c.batch.collation_fn,
                               partial=bool(c.batch.partial)))
            specs += [Stage("sample", "map", st.fn) for st in c.per_batch]
        self._set_stages(specs)
        if c.resampled and self.repetitions == 1:
            self.repetitions = sys.maxsize
        if c.tail and warn:
            self._warn(c.tail[0], whole=False)

    @property
    def exact(self) -> bool:
        """True when the whole pipeline is compiled into the plan (exact resume)."""
        return not self._c.generic and not self._c.tail

    @property
    def compiled(self) -> _Compiled:
        """What the stages say, for the plan (``tail``: the stages run on the stream; ``generic``:
        the plan sees through none; ``opaque``: the first it cannot see through).
        """
        return self._c

    def _warn(self, stage: Any, whole: bool) -> None:
        if self._warned:
            return
        self._warned = True
        what = "the pipeline runs as in webdataset (no plan)" if whole else \
            "it and the stages after it run on the stream"
        warnings.warn(f"DataPipeline: resumewds cannot see through stage {stage!r}: {what}; "
                      "a resume from state_dict() is not exact (state_dict()['exact'] is False). To make "
                      "it exact, use the stages resumewds compiles (SimpleShardList / ResampledShards, the "
                      "splitters, shuffle, tarfile_to_samples, the per-sample stages, batched)",
                      stacklevel=4)

    def __getstate__(self) -> Dict[str, Any]:
        if self._c.generic:
            d = dict(self.__dict__)
            d["_store"] = d["_reader"] = d["_plan"] = None
            d["_events"] = []
            return d
        return WebDataset.__getstate__(self)

    def iter_steps(self, *args: Any, **kw: Any) -> Iterator[Tuple[int, Any, Dict[str, Any]]]:
        """The compiled part's steps (what :class:`resumewds.WebLoader` runs).

        Raises:
            ResumeWDSError: the pipeline has stages the plan cannot run.
        """
        if not self.exact:
            raise ResumeWDSError("this DataPipeline has stages resumewds cannot compile "
                                 f"({self._c.tail[0] if self._c.tail else self.pipeline[0]!r}): "
                                 "iterate it directly or in a torch DataLoader instead of WebLoader")
        return WebDataset.iter_steps(self, *args, **kw)

    empty_worker_check = False  # webdataset's DataPipeline: a worker without shards yields nothing

    def worker_split_mode(self) -> str:
        """``worker_split`` if given, else ``"shards"`` with a ``split_by_worker`` stage, else ``"samples"``."""
        if self.worker_split is not None:
            return self.worker_split
        c = self._c
        return "shards" if (c.worker_split and not c.resampled and not c.generic) else "samples"

    def _layout(self) -> Layout:
        rank, world = 0, 1
        if self._c.node_split or self._c.single_node or self._c.resampled:
            r, w, _, _ = worker_info()
            if self._c.single_node and w > 1:
                raise ValueError("input pipeline needs to be reconfigured for multinode training")
            if self._c.node_split or self._c.resampled:
                rank, world = r, w
        if self.batch_size is not None:
            b = self._c.batch
            return Layout(self.batch_size, world, rank, "keep" if (b is None or b.partial) else "drop")
        return Layout(_CHUNK, world, rank, "keep")

    def _compiled_stream(self, st: Dict[str, Any]) -> Iterator[Any]:
        """Compiled outputs from the state ``st`` on, epoch after epoch; updates ``st``."""
        worker, nw = 0, 1
        info = get_worker_info()
        # ResampledShards: each worker takes its own share of the endless plan
        if info is not None and (self._c.worker_split or self._c.resampled):
            worker, nw = info.id, info.num_workers
        layout: Any = self._layout()
        W = self.split_workers(nw, layout.world_size) if info is not None else 0
        if W:  # webdataset's split_by_worker: this worker's own shards (resumewds.wds._shardsplit)
            layout, worker, nw = WorkerStream(W, worker, layout), 0, 1
        split = [layout.worker, W] if W else None
        if (st.get("position") or st.get("skip")) and st.get("split", split) != split:
            raise StateError(f"DataPipeline state was taken with the shard split (worker, of workers) "
                             f"{st.get('split')}, this iterator has {split}: resume with the same num_workers")
        st["split"] = split
        batched = self.batch_size is not None
        collate_fn = _Unpositioned(self.collate_fn or default_collate) if batched else None
        reps = 0
        while reps < self.repetitions:
            reps += 1
            epoch, start, skip = st["epoch"], st["position"], st["skip"]
            skip0 = skip
            steps = self.steps_of(layout, epoch)
            total = len(steps.sequence if W else self.plan.epoch(epoch))
            delivered = 0
            try:
                # unbatched: each sample as read (``(k, [sample], None)``), then ``(k, [], meta)``
                current, n = -1, 0
                for k, batch, _meta in WebDataset.iter_steps(self, epoch, start, steps, worker, nw,
                                                             collate=batched, collate_fn=collate_fn,
                                                             each=not batched):
                    if k != current:
                        current, n = k, 0
                        st["position"] = start + k * steps.step_size
                    if _meta is None:
                        n += 1
                        if n <= skip:
                            continue
                        st["skip"] = n
                        delivered += 1
                        yield hide_positions(batch[0])
                        continue
                    if _meta.get("events"):
                        self._absorb_meta(_meta)
                    for x in ([batch] if _meta["samples"] else []) if batched else []:
                        n += 1
                        if n <= skip:
                            continue
                        st["skip"] = n
                        delivered += 1
                        yield x
                    skip = 0
                    st["position"], st["skip"] = steps.position_after(total, start, k), 0
                    if _meta.get("stopped"):  # a handler said stop: this epoch ends here
                        st["epoch"], st["position"], st["skip"] = epoch + 1, 0, 0
                        return
            except filters.StopPipeline:
                return
            st["epoch"], st["position"], st["skip"] = epoch + 1, 0, 0
            if delivered == 0 and (start or skip0):
                if self.repetitions == 1:
                    return  # the state was at the very end of that epoch: this pass has nothing left
                reps -= 1  # a stream over epochs (with_epoch) goes on with the next one
                continue
            if delivered == 0:
                return

    def _generic_stream(self) -> Iterator[Any]:
        def invoke(f: Any, *a: Any) -> Any:
            if not a and (isinstance(f, IterableDataset) or hasattr(f, "__iter__")):
                return iter(f)
            if isinstance(f, PipelineStage):
                return f.run(*a)
            if isinstance(f, list):
                return iter(f)
            if callable(f):
                return f(*a)
            raise ValueError(f"{f!r}: not a valid pipeline stage")

        for _ in range(self.repetitions):
            src = invoke(self.pipeline[0])
            for f in self.pipeline[1:]:
                src = invoke(f, src)
            count = 0
            for x in src:
                yield x
                count += 1
            if count == 0:
                break

    def iterator(self) -> Iterator[Any]:
        """All repetitions (webdataset's name)."""
        if not self._warned and not self.exact:  # built with append(): said on the first iter()
            self._warn(self._c.tail[0] if self._c.tail else self._c.opaque, whole=self._c.generic)
        if self._c.generic:
            return self._generic_stream()
        # each iterator has its own copy of the state (RoundRobin([p, p])); state_dict() is the newest's
        st = self._state = dict(self._state)
        limit = self.nsamples if self.repetitions != 1 and self.nsamples > 0 else 0
        done = bool(limit) and int(st.get("served", 0)) >= limit  # the last iter() gave its n items
        # a state of this very point was loaded, or given away (a run resumed from it goes on here)
        held = getattr(self, "_loaded", True) or st == getattr(self, "_given", None)
        if (st["position"] or st["skip"]) and (done or not held):
            # webdataset starts its pipeline again at each iter(): the next epoch from its start
            st = self._state = {"epoch": st["epoch"] + 1, "position": 0, "skip": 0, "served": 0,
                                **({"split": st["split"]} if "split" in st else {})}
        elif done or not held:
            st["served"] = 0
        self._loaded = False
        src: Any = self._compiled_stream(self._state)
        for f in self._c.tail:
            src = f(src)
        return src

    def __iter__(self) -> Iterator[Any]:
        it = self.iterator()
        if self.repetitions != 1 and self.nsamples > 0:
            if self._c.generic:
                return itertools.islice(it, self.nsamples)
            return self._limited(it, self._state)
        return it

    def _limited(self, it: Iterator[Any], st: Dict[str, Any]) -> Iterator[Any]:
        """``with_epoch(n)``: ``n`` items per ``iter()``, counted in ``st["served"]``."""
        st.setdefault("served", 0)
        for x in itertools.islice(it, self.nsamples - int(st["served"])):
            st["served"] += 1
            yield x

    def state_dict(self) -> Dict[str, Any]:
        """Where direct iteration is (``exact``: False when a stage runs outside the plan)."""
        d: Dict[str, Any] = {"format": STATE_FORMAT, "version": STATE_VERSION, "exact": self.exact}
        d.update(self._state)
        self._given = dict(self._state)
        if not self._c.generic:
            d["config"] = self.config()
            d["step_size"] = self._layout().step_size
        return seal(d)

    get_state = state_dict

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Continue direct iteration from ``state`` (taken from the same pipeline definition).

        Raises:
            StateError: not a DataPipeline state, or another data set / order.
        """
        if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
            raise StateError("not a resumewds DataPipeline state (missing format field)")
        if int(state.get("version", 0)) > STATE_VERSION:
            raise StateError(f"DataPipeline state version {state.get('version')} is newer than this resumewds")
        check_seal(state, "this DataPipeline state")
        if not self._c.generic:
            mine = self.config()
            theirs = state.get("config") or {}
            diffs = [k for k in mine if theirs.get(k) != mine.get(k)]
            if diffs:
                raise StateError("DataPipeline state was taken on other data or order settings: "
                                 + ", ".join(f"{k} ({theirs.get(k)!r} vs {mine.get(k)!r})" for k in diffs))
            if state.get("step_size") not in (None, self._layout().step_size):
                raise StateError(f"DataPipeline state has step size {state.get('step_size')}, "
                                 f"this pipeline {self._layout().step_size}")
        self._state = {"epoch": int(state["epoch"]), "position": int(state["position"]),
                       "skip": int(state.get("skip", 0)), "served": int(state.get("served", 0))}
        if state.get("split") is not None:
            self._state["split"] = list(state["split"])
        self._loaded = True

    set_state = load_state_dict

    def stage(self, i: int) -> Any:
        """Stage ``i`` as given."""
        return self.pipeline[i]

    def append(self, f: Any) -> None:
        """Add a stage at the end, as webdataset's ``append`` (the compiled form is rebuilt)."""
        self.pipeline.append(f)
        self._warned = False
        self._build(warn=False)

    def compose(self, *args: Any) -> DataPipeline:
        """A copy with ``args`` appended (this pipeline is unchanged), as webdataset's."""
        out = copy.copy(self)
        out.pipeline = list(self.pipeline)
        for a in args:
            if a is not None:
                out.append(a)
        return out

    def with_epoch(self, nsamples: int = -1, nbatches: int = -1) -> DataPipeline:
        """Each ``iter()`` yields ``max(nsamples, nbatches)`` items, going on across epochs."""
        self.repetitions = sys.maxsize
        self.nsamples = max(nsamples, nbatches)
        return self

    def repeat(self, nepochs: int = -1, nbatches: int = -1) -> DataPipeline:
        """Repeat ``nepochs`` epochs (forever if -1), at most ``nbatches`` items."""
        self.repetitions = nepochs if nepochs > 0 else sys.maxsize
        self.nsamples = nbatches
        return self

    def with_length(self, n: int, silent: bool = False) -> DataPipeline:
        """Give the pipeline a ``__len__`` of ``n`` (it does not change the epoch)."""
        if not silent:
            warnings.warn(".with_length() only sets the value of __len__ for compatibility with some "
                          "training environments. It does not change the number of samples in an epoch.", stacklevel=2)
        self.size = n
        return add_length_method(self)

    def close(self) -> None:
        """Close open shards and the stages that have ``close``."""
        for st in self.pipeline:
            if hasattr(st, "close") and st is not self:
                try:
                    st.close()
                except Exception:
                    pass
        WebDataset.close(self)

    def __repr__(self) -> str:
        return f"DataPipeline({', '.join(repr(s) for s in self.pipeline)}, exact={self.exact})"
