"""webdataset's WebLoader fluent methods, with exact semantics.

A resumewds loader hands out one global sequence, so webdataset's re-mixing chain
(``loader.unbatched().shuffle(n).batched(m).with_epoch(k)``) compiles into the loader's own
settings and stays exactly resumable (see :class:`LoaderPipeline`); the other fluent methods
run on the output stream, as webdataset's do.  A dataset the plan cannot run gets webdataset's
``WebLoader``: :func:`stream_loader`.
"""

from __future__ import annotations

import sys
import warnings
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

from ..errors import HandlerStop, StateError
from ..plan import detect_world
from ..run import STATE_FORMAT, BatchInfo, EmptyBatch, ShardLoader, seal
from ..stages import BatchRunner, Handled, Stage, UnbatchRunner, apply_stages, default_collation_fn, hide_positions
from . import filters
from ._fluent import FluidInterface
from ._loader_compat import DataLoaderAttributes
from ._rotation import RotatingLoader, refuse_rotation
from ._shardsplit import SHARD_SPLIT
from .filters import Cached

__all__ = ["STATE_FORMAT", "BatchInfo", "EmptyBatch", "FluentLoader", "LoaderPipeline", "WebLoader", "route",
           "stream_loader"]

_MISSING: Any = object()
# WebLoader's own arguments, which a torch DataLoader does not take
_RESUMEWDS_ONLY = ("rank", "world_size", "remainder", "journal", "resume", "verbose", "chunk_size",
                   "journal_sync", "nodes", "preempt", "transport", "worker_split", "convert")


class _Each:
    """A per-item stage of the chain's stream: ``fn(item)`` -> an item, or None to drop it."""

    def __init__(self, fn: Callable[[Any], Any]):
        self.fn = fn


class _Split:
    """``unbatched()`` / ``unlisted()`` on the chain's stream: an item -> its samples."""

    def __init__(self, listed: bool):
        self.listed = listed

    def __call__(self, item: Any) -> List[Any]:
        return list(UnbatchRunner(self.listed).run(iter([item])))


class _Group:
    """``batched(n)`` on the chain's stream (``after``: the batch stages of a refilled
    data set batch, then torch's ``default_convert``, as a ``DataLoader(batch_size=None)``)."""

    def __init__(self, n: int, collation_fn: Any, partial: bool, after: Sequence[Any] = (),
                 convert: bool = False):
        self.n, self.collation_fn, self.partial = int(n), collation_fn, bool(partial)
        self.after, self.convert = list(after), convert

    def finish(self, items: List[Any]) -> Any:
        items = [hide_positions(s) for s in items]
        batch = self.collation_fn(items) if self.collation_fn is not None else items
        batch = apply_stages(self.after, batch)
        if batch is not None and self.convert:
            from torch.utils.data import default_convert  # lazy: torch is loaded with the loader anyway

            batch = default_convert(batch)
        return batch


# stream stages whose output depends on what they hold between items (a count, a buffer, a
# random draw): on the loader's output stream a state cannot hold that
_HOLDING = ("shuffle", "detshuffle", "batched", "unbatched", "unlisted", "slice", "rsample")


def _op_of(stage: Any) -> Any:
    """The chain's own form of ``stage`` (:class:`_Each`, :class:`_Split`, :class:`_Group`),
    or None: a stage the chain runs as given, on its stream."""
    if isinstance(stage, filters.SampleStage):
        return _Each(stage.fn)
    if isinstance(stage, _BatchOfOne):
        return _Each(stage.one)
    if isinstance(stage, filters.BatchedStage):
        return _Group(stage.batchsize, stage.collation_fn, stage.partial)
    if isinstance(stage, _RefillBatches):
        return _Group(stage.n, stage.collation_fn, stage.partial, stage.batch_stages, convert=True)
    if isinstance(stage, filters.StreamStage) and getattr(stage, "name", None) in ("unbatched", "unlisted"):
        return _Split(stage.name == "unlisted")
    return None


def _layout(ops: Sequence[Any]) -> Optional[Tuple[List[Any], Any, List[Any], Any, List[Any]]]:
    """``ops`` as ``(each*, split, each*, group, each*)`` (split, group: None if absent), the
    shapes whose state is a place of the loader and a count of samples: None otherwise."""
    parts: List[Any] = [[], None, [], None, []]
    at = 0
    for op in ops:
        if isinstance(op, _Split):
            if at > 0:
                return None
            parts[1], at = op, 2
        elif isinstance(op, _Group):
            if at > 2:
                return None
            parts[3], at = op, 4
        else:
            parts[at].append(op.fn)  # (at: 0, 2 or 4, the per-item stages before, between, after)
    return parts[0], parts[1], parts[2], parts[3], parts[4]


#: a chain's settings (``LoaderPipeline(base, **settings)``, each kept as ``_<name>``); a fluent
#: method returns a new chain with some of them changed
_SETTINGS = ("fixed", "unbatched", "shuffle", "batch", "limit", "nepochs", "unit", "limit_items", "span",
             "length", "ops", "post")


class LoaderPipeline(FluidInterface):
    """A WebLoader with webdataset's fluent re-mixing chain compiled in (see module docs)."""

    def __init__(self, base: Any, fixed: bool = False, **settings: Any):
        self._base = base
        # the loader's items cannot be undone: the re-mixing methods run on its stream
        self._fixed = bool(fixed or getattr(base, "stream_items", False))
        self._unbatched = False
        self._shuffle = 0
        self._batch: Optional[Dict[str, Any]] = None
        self._limit = -1
        self._nepochs = 1
        self._served = 0
        self._chunk = 0  # the items of the chunk in progress (_limit, in samples with _unit)
        self._unit = 1  # samples per item of ``_limit`` (a batched dataset's .with_epoch(n): its batches)
        self._limit_items = False  # _limit counts the loader's items (before _ops), not the chain's
        # the passes are the data set's (route): the re-batching stages run across its epochs
        self._span = False
        self._rebatch: Optional[Dict[str, Any]] = None  # .batched(m) run on the stream of samples
        self._length: Optional[int] = None
        # the stream stages: the chain's own (_ops, whose state a state holds), then the others as given
        self._ops: List[Any] = []
        self._post: List[Any] = []
        self._built: Any = None
        # epochs done in a repeat(n) pass; where to replay from when the stream stages hold samples:
        # ``(mark, skip)``: the loader's place before that item, and its samples already delivered
        self._pass_done = 0
        self._resume: Optional[Tuple[Any, int]] = None
        self._skip = 0
        # webdataset's new pass per iter() (see _start)
        self._pass: Any = None
        self._advanced = False
        self._pinned = False
        self._origin: Any = None  # the place a resume gave, while its first iter() may be left
        self._handed = 0  # items the current iter() handed out
        for k, v in settings.items():
            if k not in _SETTINGS:
                raise TypeError(f"LoaderPipeline: no setting {k!r}")
            setattr(self, "_" + k, v)
        resumed = getattr(base, "resumed_place", None)  # a journal resumed (at a commit of this chain?)
        if resumed is not None:
            self._adopt(resumed.get("chain") or {})

    def _with(self, **kw: Any) -> LoaderPipeline:
        """This chain with the settings ``kw`` changed (a new chain over the same loader)."""
        if self._built is not None:
            raise ValueError("add the WebLoader's fluent stages before iterating it")
        settings = {k: getattr(self, "_" + k) for k in _SETTINGS}
        settings.update(kw)
        return type(self)(self._base, **settings)

    @property
    def _streaming(self) -> bool:
        """Whether the re-mixing methods run on the loader's stream (not in its settings)."""
        return bool(self._fixed or self._ops or self._post)

    def compose(self, *stages: Any) -> LoaderPipeline:
        """Run ``stages`` (webdataset's stage callables) on the output stream."""
        ops, post = list(self._ops), list(self._post)
        extra: Dict[str, Any] = {}
        for s in stages:
            if s is None:
                continue
            op = None if post else _op_of(s)
            if isinstance(op, _Split) and ops and isinstance(ops[-1], _Group) and ops[-1].convert \
                    and ops[-1].partial and not ops[-1].after and _layout(ops[:-1]) == ([], None, [], None, []):
                # a refilled data set batch unbatched again
                g = ops.pop()
                op = _Each(_AsUnbatched(g.collation_fn or list))
                if self._limit > 0 and not self._limit_items and self._unit > 1:  # the data set's with_epoch
                    extra.update(limit=self._limit * self._unit, limit_items=True, unit=1)
            if isinstance(op, (_Split, _Group)) and (self._unbatched or self._batch is not None):
                op = None  # after re-mixing compiled into the loader: on the stream, as given
            if op is not None and _layout(ops + [op]) is not None:
                ops.append(op)
            else:
                post.append(s)
        return self._with(ops=ops, post=post, **extra)

    def unbatched(self) -> LoaderPipeline:
        """Yield single samples (see module docs)."""
        if self._streaming:
            return self.compose(filters.unbatched())
        return self._with(unbatched=True, batch=None)

    def shuffle(self, size: int, **kw: Any) -> LoaderPipeline:
        """Shuffle within windows of about ``3 * size`` samples, in the plan (see module docs)."""
        if self._post:
            return FluidInterface.shuffle(self, size, **kw)
        return self._with(shuffle=max(self._shuffle, int(size))) if size >= 1 else self

    def batched(self, batchsize: int, collation_fn: Optional[Callable[[List[Any]], Any]] = default_collation_fn,
                partial: bool = True) -> LoaderPipeline:
        """Batches of ``batchsize`` consecutive positions (see module docs)."""
        if batchsize < 1:
            raise ValueError(f"batch_size must be >= 1, got {batchsize}")
        if self._streaming:
            return self.compose(filters.batched(batchsize, collation_fn=collation_fn, partial=partial))
        return self._with(batch={"n": int(batchsize), "collation_fn": collation_fn,
                                  "partial": bool(partial)})

    def with_epoch(self, nsamples: int = -1, nbatches: int = -1) -> LoaderPipeline:
        """Each ``iter()`` yields ``max(nsamples, nbatches)`` items, continuing over epochs."""
        return self._with(limit=int(max(nsamples, nbatches)), nepochs=-1, unit=1, limit_items=False)

    def repeat(self, nepochs: int = -1, nbatches: int = -1) -> LoaderPipeline:
        """``nepochs`` loader epochs per ``iter()`` (forever if < 1), at most ``nbatches`` items."""
        return self._with(nepochs=int(nepochs) if nepochs > 0 else -1, limit=int(nbatches), unit=1,
                          limit_items=False)

    def with_length(self, n: int, silent: bool = False) -> LoaderPipeline:
        """Give the chain a ``__len__`` (it does not change an epoch)."""
        return self._with(length=int(n))

    def dataset_passes(self, nepochs: int, limit: int, unit: int = 1) -> LoaderPipeline:
        """webdataset's passes of a data set that goes on over epochs (``limit`` items per worker)."""
        if limit > 0:  # items of the dataset (with_epoch): its batches when it is batched (see __iter__)
            kw: Dict[str, Any] = dict(limit=limit * max(1, self._base.num_workers), nepochs=-1, unit=1,
                                      limit_items=False)
            kw.update({"limit_items": True} if self._fixed and not self._ops else {"unit": int(unit)})
        else:  # (repeat)
            kw = dict(nepochs=int(nepochs) if nepochs > 0 else -1, limit=-1, unit=1, limit_items=False)
        return self._with(span=True, **kw)

    @property
    def loader(self) -> Any:
        """The WebLoader the chain compiles into (built on first use)."""
        if self._built is None:
            self._built = self._build()
        return self._built

    def _build(self) -> Any:
        base = self._base
        if self._streaming:
            if self._shuffle:  # the data set's .shuffle(n), in the plan: the same loader in that order
                base.use_dataset(_shuffled(base.dataset, self._shuffle))
            return base
        if not (self._unbatched or self._shuffle or self._batch):
            return base
        ds = base.dataset
        if ds.batch_size is not None:
            specs, cut = ds.stage_specs, ds.stream_from
            if specs[cut + 1:]:
                raise ValueError("WebLoader(...).unbatched(): the dataset has stages after .batched(); "
                                 "re-mixing needs its batches to be plain consecutive samples")
            undone = specs[cut].args["collation_fn"]
            kept = list(specs[:cut])
            if undone is not None and getattr(base, "convert", False):
                # webdataset's loader converted each batch before unbatching it
                kept.append(Stage("sample", "as_unbatched", _AsUnbatched(undone)))
            ds = ds.with_stages(kept)  # (a copy: never the caller's data set, a DataPipeline included)
        if self._shuffle:
            ds = _shuffled(ds, self._shuffle)
        if self._batch is not None:
            bs: Optional[int] = self._batch["n"]
            collate = self._batch["collation_fn"] or list
            remainder = base.remainder if self._batch["partial"] else "drop"
            if self._nepochs < 0 and _resampled(ds):
                # resampled shards are an endless stream in webdataset: every batch is full
                remainder = "drop"
            if self._unit > 1 and self._unbatched and self._limit > 0 and base.world_size == 1:
                # webdataset's loader re-batches the n * (dataset batches) samples of an iter()
                self._rebatch = dict(self._batch)
                bs, collate, remainder = None, None, base.remainder
        elif self._unbatched:
            bs, collate, remainder = None, None, base.remainder
        else:
            bs, collate, remainder = base.batch_size, base.collate_fn, base.remainder
        preempt = tuple(getattr(base, "preempt_signals", ()))
        if preempt:
            base.release_signals()  # the new loader takes the signals over (and their previous handlers)
        new = object.__new__(WebLoader)  # the compiled loader itself (WebLoader() would route ``ds`` again)
        WebLoader.__init__(new, ds, batch_size=bs, num_workers=base.num_workers, collate_fn=collate,
                           rank=base.rank, world_size=base.world_size, remainder=remainder,
                           chunk_size=base.layout.batch_size, transport=base.transport,
                           preempt=preempt or False, stall_timeout=base.stall_timeout,
                           worker_split="samples",  # positions are samples of the one sequence
                           **base.dataloader_kwargs)
        new.epoch, new.position = base.epoch, base.position
        new.steps_done, new.samples_total = base.steps_done, base.samples_total
        new.journal, new.journal_path = base.journal, base.journal_path
        base.journal = None
        return new

    def __iter__(self) -> Iterator[Any]:
        loader = self.loader  # built: it decides _rebatch and _unit
        self._start()
        pairs: Iterator[Any] = self._passes()
        self._pass = pairs
        if self._unbatched and self._unit > 1 and self._limit > 0 and (self._rebatch or self._batch is None):
            # the dataset's .with_epoch(n) counted its batches: an iter() is n of them, in samples
            src: Iterator[Any] = self._limited((item for _, item in pairs), self._limit * self._unit)
            if self._rebatch is not None:
                r = self._rebatch
                src = BatchRunner(r["n"], r["collation_fn"] or list, r["partial"]).run(src)
            src = self._native(((None, item) for item in src), self._ops) if self._ops else src  # per item
            for f in self._post:
                src = f(src)
            return self._handing(src)
        if self._limit > 0 and self._limit_items:
            pairs = self._limited(pairs, self._limit)
        src = self._native(pairs, self._ops) if self._ops else (item for _, item in pairs)
        for f in self._post:
            src = f(src)
        if self._limit > 0 and not self._limit_items:
            src = self._limited(src, self._limit)
        del loader
        return self._handing(src)

    def _start(self) -> None:
        """webdataset starts its pipeline again at each ``iter()``: one left before its end is followed
        by the next epoch from its start, unless a state was given away since its last item (then it
        continues, as a run resumed from that state would), or it was the first ``iter()`` after a
        resume and left after one item (then it starts at the resume's place again).
        """
        prev, self._pass = self._pass, None
        if prev is not None and hasattr(prev, "close"):
            prev.close()  # its workers stop now, not when it is collected
        loader = self.loader
        origin, self._origin = self._origin, None
        handed, self._handed = self._handed, 0
        if self._advanced and not self._pinned and not self._done():
            if origin is None or handed != 1:
                self._resume, self._skip = None, 0
                self._served = self._pass_done = 0
                loader.end_epoch()
            else:
                self._resume, self._pass_done, self._served, mark, counted = origin
                loader.rewind(mark)
                loader.session.set_consumed(counted)
        elif not self._advanced:
            self._origin = origin  # nothing handed out from there yet
        if self._resume is not None:
            (mark, self._pass_done, served, counted), self._skip = self._resume
            if self._limit_items:
                self._served = served
            loader.rewind(mark)
            if counted is not None:  # its samples are delivered (and counted) again
                loader.session.set_consumed(counted)
        loader.hold_place()  # decided here
        self._advanced = False

    def _done(self) -> bool:
        """Whether the last ``iter()`` handed out all it had (its chunk served, or its pass ended with
        nothing held), even if its consumer did not ask for the end.
        """
        if self._limit > 0:
            return self._served >= self._chunk and (not self._limit_items or self._resume is None)
        if self._nepochs < 1:
            return False
        return self._resume is None and self._pass_done == 0 and self.loader.position == 0

    def _handing(self, src: Iterator[Any]) -> Iterator[Any]:
        """The chain's items as handed out: whether an ``iter()`` was left before its end."""
        left = False
        try:
            for item in src:
                self._advanced, self._pinned = True, False
                self._handed += 1
                yield item
        except GeneratorExit:
            left = True
            raise
        finally:
            if not left:
                self._advanced, self._origin = False, None

    def _mark(self) -> Tuple[Any, int, int, Optional[Dict[Any, int]]]:
        """The chain's place before the loader's next item (loader place, pass epochs, served, counted)."""
        loader = self.loader
        counted = loader.session.consumed_now() if loader.journal is not None else None
        return (loader.mark(), self._pass_done, self._served, counted)

    def _passes(self) -> Iterator[Tuple[Any, Any]]:
        """The loader's items, pass after pass, each with the chain's place before it (None: no stage holds)."""
        loader = self.loader
        epochs = self._pass_done
        shape = _layout(self._ops)
        marks = shape is not None and (shape[1] is not None or shape[3] is not None)  # a stage may hold
        mark = self._mark() if marks else None
        while self._nepochs < 1 or epochs < self._nepochs:
            got = 0
            start_epoch = loader.epoch
            for item in loader:
                got += 1
                done = epochs + (loader.epoch != start_epoch)  # the item that ends an epoch advanced it
                self._pass_done = done % self._nepochs if self._nepochs > 0 else 0
                yield mark, item
                mark = self._mark() if marks else None
            if getattr(loader, "preempted", False):
                return  # a preemption signal: the stream ends at this step boundary
            if loader.epoch != start_epoch:
                epochs += 1
            elif got == 0:
                break  # no progress (an empty data set): never loop forever
            self._pass_done = epochs % self._nepochs if self._nepochs > 0 else 0
            mark = self._mark() if marks else None

    def _native(self, src: Iterator[Tuple[Any, Any]], ops: Sequence[Any]) -> Iterator[Any]:
        """The chain's own stream stages over ``(mark, item)``, keeping :attr:`_resume` current."""
        shape = _layout(ops)
        assert shape is not None  # compose() keeps _ops in this shape
        pre, split, mid, group, post = shape
        skip, self._skip = self._skip, 0
        held: List[Any] = []
        first: Any = None  # the place of the first sample held
        epoch = None
        try:
            for mark, item in src:
                if group is not None and not self._span:  # webdataset's loader stages run per pass
                    if held and epoch is not None and mark[0][0] != epoch:  # of its DataLoader: an epoch
                        v, held = (group.finish(held) if group.partial else None), []
                        v = apply_stages(post, v) if v is not None else None
                        if v is not None:
                            self._resume = (mark, 0)
                            yield v
                    epoch = mark[0][0]
                x = apply_stages(pre, item)
                if x is None:
                    continue
                parts = split(x) if split is not None else [x]
                for j in range(skip, len(parts)):
                    v = apply_stages(mid, parts[j])
                    if v is None:
                        continue
                    if group is not None:
                        if not held:
                            first = (mark, j)
                        held.append(v)
                        if len(held) < group.n:
                            continue
                        v, held = group.finish(held), []
                    v = apply_stages(post, v)
                    if v is None:
                        continue
                    self._resume = (mark, j + 1) if j + 1 < len(parts) else None
                    yield v
                skip = 0
        except HandlerStop:
            pass  # a handler's stop ends the stream quietly, as webdataset's stages do
        if held and getattr(self.loader, "preempted", False):
            self._resume = first  # stopped at a step boundary: what is held comes after a resume
        elif held and group is not None and group.partial:
            v = apply_stages(post, group.finish(held))
            if v is not None:
                self._resume = None
                yield v

    def _limited(self, src: Iterator[Any], limit: int) -> Iterator[Any]:
        """``limit`` items of ``src``, counted in :attr:`_served`."""
        self._chunk = limit
        served = self._served if self._served < limit else 0
        self._served = served
        for item in src:
            served += 1
            self._served = served
            yield item
            if served >= limit:
                return

    def __len__(self) -> int:
        if self._length is not None:
            return self._length
        if self._limit > 0:
            return self._limit
        return len(self.loader)

    def _check_exact(self, what: str) -> None:
        """Refuse to give a state away where the stream holds what a state cannot."""
        for s in self._post:
            name = getattr(s, "name", None) or ("mcached" if isinstance(s, Cached) else None)
            if name in _HOLDING or name == "mcached":
                raise StateError(
                    f"{what}: .{name}() runs on the loader's output stream after a stage resumewds runs as "
                    "given, where it holds items (a buffer, a count, a random draw) that a state cannot "
                    "hold, so a resume would lose or repeat data. Call the loader's .unbatched(), "
                    ".shuffle(n) and .batched(m) before .compose(...)/.slice()/.rsample() (resumewds runs "
                    "them exactly), or put the stage in the data set")

    def _at_resume(self, f: Callable[[], Any]) -> Any:
        """``f()`` with the loader at the chain's place (:attr:`_resume`)."""
        if self._resume is None:
            return f()
        loader = self.loader
        now = loader.mark()
        loader.rewind(self._resume[0][0])
        try:
            return f()
        finally:
            loader.rewind(now)

    def _fields(self) -> Dict[str, int]:
        """The chain's place beyond the loader's (see :meth:`state_dict`)."""
        if self._resume is None:
            done, served, skip = self._pass_done, self._served, 0
        else:
            (_, done, served, _), skip = self._resume
        return {"chain_served": served if self._limit_items else self._served, "chain_epochs": done,
                "chain_skip": skip}

    def state_dict(self) -> Dict[str, Any]:
        """The compiled loader's state, plus the chain's place.

        ``chain_served``: items of the current ``with_epoch``; ``chain_epochs``: epochs done in the
        current ``repeat(n)`` pass; ``chain_skip``: samples handed out of the item the loader's state
        stands before, when the re-batching stages hold some.

        Raises:
            StateError: a stage on the stream holds what a state cannot (a buffer, a count).
        """
        self._check_exact("state_dict()")
        sd = self._at_resume(self.loader.state_dict)
        sd.update(self._fields())
        self._pinned = True
        return seal(sd)  # the checksum covers chain_served too (resumewds.run)

    def _adopt(self, chain: Dict[str, Any]) -> None:
        """Stand at a state's (a commit's) chain place, the loader at its place: a resume."""
        self._served = int(chain.get("chain_served", 0))
        self._pass_done = int(chain.get("chain_epochs", 0))
        skip = int(chain.get("chain_skip", 0))
        loader = self._built if self._built is not None else self._base
        self._resume = ((loader.mark(), self._pass_done, self._served, None), skip) if skip else None
        self._skip = 0
        self._origin = (self._resume, self._pass_done, self._served, loader.mark(),
                        loader.session.consumed_now())
        self._pinned, self._advanced = True, False

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Continue exactly after ``state`` (see :meth:`WebLoader.load_state_dict`).

        Raises:
            StateError: as the loader's; and a chain place this chain cannot have.
        """
        skip, done = int(state.get("chain_skip", 0)), int(state.get("chain_epochs", 0))
        shape = _layout(self._ops)
        if skip and (shape is None or shape[1] is None):
            raise StateError(f"this state was taken {skip} samples into an item of a chain that unbatches its "
                             "loader's items (.unbatched()); this chain does not: resume it with the same chain")
        if done and not 0 < done < max(self._nepochs, 1):
            raise StateError(f"this state was taken {done} epochs into a pass; this chain's passes have "
                             f"{self._nepochs if self._nepochs > 0 else 'no set number of'} epochs: resume it "
                             "with the same .repeat(n)")
        self.loader.load_state_dict(state)
        self._adopt(state)

    def commit(self, step: int, stats: Optional[bool] = None) -> None:
        """Record the position after ``step`` in the journal, with the chain's place."""
        self._check_exact(f"commit({step})")
        place = {"chain": self._fields()}
        if self._resume is None:
            self.loader.commit(step, stats, place=place)
        else:  # at the place of the held samples: the consumption counted up to there, the rest later
            session = self.loader.session
            now, before = session.consumed_now(), self._resume[0][3] or {}
            session.set_consumed(before)
            self._at_resume(lambda: self.loader.commit(step, stats, place=place))
            session.set_consumed({k: n - before.get(k, 0) for k, n in now.items()})
            before.clear()  # committed: going back there takes back nothing more
        self._pinned = True

    def skip_steps(self, k: int, reason: str = "") -> Dict[str, Any]:
        """Skip the data of the next ``k`` steps (see :meth:`WebLoader.skip_steps`).

        Raises:
            StateError: the chain re-batches the loader's items on its stream.
        """
        shape = _layout(self._ops)
        if k and (shape is None or shape[1] is not None or shape[3] is not None):
            raise StateError(f"skip_steps({k}): this chain re-batches its loader's items on the stream, so "
                             "its batches are not the loader's steps; iterate past the batches to skip")
        out = self.loader.skip_steps(k, reason)
        self._pinned = True
        return out

    get_state = state_dict
    set_state = load_state_dict

    def __getattr__(self, name: str) -> Any:
        if name.startswith("_"):
            raise AttributeError(name)
        return getattr(self.loader, name)

    def close(self) -> None:
        """Close the compiled loader (and its journal)."""
        self.loader.close()
        if self._built is not None and self._built is not self._base:
            self._base.close()

    def __enter__(self) -> LoaderPipeline:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def _resampled(ds: Any) -> bool:
    return bool(getattr(ds, "resampled", False) or getattr(getattr(ds, "compiled", None), "resampled", False))


def _shuffled(ds: Any, size: int) -> Any:
    """``ds`` (a copy) with the data set's ``.shuffle(size)`` compiled into the plan."""
    if hasattr(ds, "with_stages"):
        return ds.with_stages(ds.stage_specs + (Stage("shuffle", "shuffle", n=int(size), initial=100),))
    return ds.shuffle(size)


class _AsUnbatched:
    """A sample as webdataset's ``WebLoader(ds.batched(n), batch_size=None).unbatched()`` hands it
    out: collated, through torch's ``default_convert``, split again.
    """

    def __init__(self, collation_fn: Callable[[List[Any]], Any]):
        self.collation_fn = collation_fn

    def __call__(self, sample: Any) -> Any:
        from torch.utils.data import default_convert  # lazy: runs in the loader's workers, torch loaded

        return next(UnbatchRunner(False).run(iter([default_convert(self.collation_fn([sample]))])))


class FluentLoader:
    """webdataset's ``WebLoader`` fluent methods: each returns a :class:`LoaderPipeline`."""

    def unbatched(self) -> LoaderPipeline:
        """Single samples: ``loader.unbatched().shuffle(n).batched(m)`` re-mixes exactly."""
        return LoaderPipeline(self).unbatched()

    def shuffle(self, size: int, **kw: Any) -> LoaderPipeline:
        """The dataset's ``.shuffle(size)``, in the plan."""
        return LoaderPipeline(self).shuffle(size, **kw)

    def batched(self, batchsize: int, collation_fn: Any = default_collation_fn, partial: bool = True) -> LoaderPipeline:
        """Batches of ``batchsize`` consecutive positions."""
        return LoaderPipeline(self).batched(batchsize, collation_fn=collation_fn, partial=partial)

    def with_epoch(self, nsamples: int = -1, nbatches: int = -1) -> LoaderPipeline:
        """``max(nsamples, nbatches)`` items per ``iter()``, continuing over epochs."""
        return LoaderPipeline(self).with_epoch(nsamples, nbatches)

    def repeat(self, nepochs: int = -1, nbatches: int = -1) -> LoaderPipeline:
        """``nepochs`` epochs per ``iter()`` (forever if < 1), at most ``nbatches`` items."""
        return LoaderPipeline(self).repeat(nepochs, nbatches)

    def with_length(self, n: int, silent: bool = False) -> LoaderPipeline:
        """Give the chain a ``__len__`` (it does not change an epoch)."""
        return LoaderPipeline(self).with_length(n, silent)

    def compose(self, *stages: Any) -> LoaderPipeline:
        """Run ``stages`` (webdataset's stage callables) on the loader's output stream."""
        return LoaderPipeline(self).compose(*stages)


def _stream_method(name: str) -> Callable[..., Any]:
    def method(self: Any, *args: Any, **kw: Any) -> Any:
        return getattr(LoaderPipeline(self), name)(*args, **kw)

    method.__name__ = name
    method.__doc__ = f"webdataset's ``WebLoader.{name}(...)``: a stage on the loader's output stream."
    return method


for _name in ("map", "to_tuple", "map_tuple", "map_dict", "select", "slice", "rename", "rename_keys",
              "extract_keys", "decode", "xdecode", "rsample", "listed", "unlisted", "log_keys", "mcached"):
    setattr(FluentLoader, _name, _stream_method(_name))


def _opaque(dataset: Any) -> Any:
    """What keeps ``dataset`` out of the plan (a stage, a name), or None when WebLoader can run it."""
    if getattr(dataset, "iter_steps", None) is None:
        from torch.utils.data import Dataset

        # a torch data set runs as webdataset's loader would run it; anything else is refused
        return type(dataset).__name__ if isinstance(dataset, Dataset) else None
    c = getattr(dataset, "compiled", None)  # a DataPipeline's compiled form
    if c is not None and (c.generic or c.tail):
        return c.tail[0] if c.tail else c.opaque
    return None


def route(cls: Any, dataset: Any, args: Any, kw: Dict[str, Any]) -> Any:
    """What ``WebLoader(dataset, *args, **kw)`` returns (None: the WebLoader itself).

    A dataset the plan cannot run: :func:`stream_loader`; ``batch_size=None`` over stages that drop
    samples and ``.batched(n)``, one rank: batches refilled from the stream; a dataset that goes on
    over epochs: webdataset's passes; a batched ``DataPipeline`` without ``batch_size``: batches of one.
    """
    if dataset is None:
        return None
    what = _opaque(dataset)
    if what is not None:
        return stream_loader(dataset, what, *args, **kw)
    c = getattr(dataset, "compiled", None)  # a DataPipeline's compiled form (None: a WebDataset, a MixedDataset)
    nw = kw.get("num_workers", args[1] if len(args) > 1 else 0)
    if c is not None and isinstance(nw, int) and nw > 1 and not (c.worker_split or c.resampled) \
            and "split" not in _warned_stream:
        _warned_stream.add("split")
        warnings.warn(f"WebLoader: this DataPipeline has no split_by_worker; webdataset would give each of the "
                      f"{nw} DataLoader workers every shard ({nw} copies of each sample per epoch). resumewds "
                      "hands each sample out once (its loader splits the positions among the workers); add "
                      "wds.split_by_worker to say so and silence this warning", stacklevel=3)
    # webdataset's passes where the loader does not batch; one that does keeps one epoch per iter()
    batching = args[0] if args else kw.get("batch_size", _MISSING)
    passes = _passes(dataset) if batching is None or batching is _MISSING else None
    refill = _refills(dataset, args, kw)
    one = c is not None and dataset.batch_size is not None and not args and "batch_size" not in kw
    rotate = passes in (None, (1, -1)) and _rotates(dataset, args, kw)
    if not (passes or refill or one):
        # the filtered samples of webdataset's workers, round-robin (resumewds.wds._rotation)
        return object.__new__(_RotatingWebLoader) if rotate else None
    if refill:
        out = _refill_loader(cls, dataset, args, kw, rotate)
    else:
        base = object.__new__(_RotatingWebLoader if rotate else cls)
        base.__init__(dataset, *args, **kw)
        out = LoaderPipeline(base, fixed=_drops(dataset, args, kw))
    if one:
        out = out.compose(_BatchOfOne(kw.get("collate_fn")))
    if passes is not None:
        out = out.dataset_passes(*passes, unit=int(dataset.batch_size or 1))
    return out


def _passes(dataset: Any) -> Optional[Tuple[int, int]]:
    """``(epochs, items)`` of one ``iter()`` (``-1``: no limit); None: one epoch per ``iter()``."""
    if hasattr(dataset, "repetitions"):  # a DataPipeline: webdataset's repetitions / nsamples
        reps, limit = int(dataset.repetitions), int(getattr(dataset, "nsamples", -1))
        if reps == 1:
            return None
        return (-1 if reps >= sys.maxsize else reps), limit
    return getattr(dataset, "passes", None)  # (resumewds.wds._direct.DirectDataset.passes)


def _drops(dataset: Any, args: Any, kw: Dict[str, Any]) -> bool:
    """``WebLoader(dataset, batch_size=None)`` on one rank over per-sample stages that may drop samples."""
    if not hasattr(dataset, "stage_specs") or (args[0] if args else kw.get("batch_size", _MISSING)) is not None:
        return False
    if kw.get("collate_fn") is not None or dataset.stage_specs[dataset.loader_from:]:
        return False
    sample_stages = dataset.stage_specs[:dataset.stream_from]
    drops = getattr(dataset, "handler", None) is not None or any(
        st.name == "select" or isinstance(st.fn, Handled) for st in sample_stages)
    if not drops:
        return False
    world = detect_world(kw.get("rank"), kw.get("world_size"), nodes=kw.get("nodes"))
    return world.world_size == 1


def _refills(dataset: Any, args: Any, kw: Dict[str, Any]) -> bool:
    """Whether each ``.batched(n)`` batch is refilled from the filtered stream, as webdataset does."""
    return getattr(dataset, "batch_size", None) is not None and _drops(dataset, args, kw)


def _rotates(dataset: Any, args: Any, kw: Dict[str, Any]) -> bool:
    """Whether the loader follows webdataset's rotation of its workers' filtered streams."""
    return kw.get("remainder", "keep") != "pad" and _drops(dataset, args, kw)


def _refill_loader(cls: Any, dataset: Any, args: Any, kw: Dict[str, Any], rotate: bool = False) -> Any:
    """The loader of :func:`_refills`: samples one by one, batched by :class:`_RefillBatches` per
    epoch's stream, so that a state taken after a batch resumes exactly after it.
    """
    specs, cut, end = dataset.stage_specs, dataset.stream_from, dataset.loader_from
    b = specs[cut]
    batch_stages = [st.fn for st in specs[cut + 1:end]]
    ds = dataset.with_stages(specs[:cut] + specs[end:])  # (a copy: never the caller's data set)
    stage = _RefillBatches(b.args["n"], b.args["collation_fn"], b.args["partial"], batch_stages)
    if not rotate:
        kw = dict(kw, worker_split=kw.get("worker_split") or "samples")  # one filtered stream
    kw = dict(kw, convert=False)  # torch's default_convert runs on each batch, as webdataset's DataLoader's
    if _resampled(dataset):
        base = object.__new__(cls)
        base.__init__(ds, *args, **kw)
        return LoaderPipeline(base, fixed=True).compose(stage)
    rot: Any = object.__new__(_RotatingWebLoader)
    rot.__init__(ds, *args, stream_stage=stage, **kw)
    return LoaderPipeline(rot, fixed=True)


class _RefillBatches:
    """``.batched(n)`` and its batch stages on the loader's stream, then torch's ``default_convert``."""

    def __init__(self, n: int, collation_fn: Any, partial: bool, batch_stages: List[Any]):
        self.n, self.collation_fn, self.partial = n, collation_fn, partial
        self.batch_stages = batch_stages

    def __call__(self, src: Iterator[Any]) -> Iterator[Any]:
        from torch.utils.data import default_convert  # lazy: torch is loaded with the loader anyway

        for batch in BatchRunner(self.n, self.collation_fn, self.partial).run(src):
            batch = apply_stages(self.batch_stages, batch)
            if batch is not None:  # a batch stage's None drops the batch
                yield default_convert(batch)


class _BatchOfOne:
    """torch's ``batch_size=1``: each item collated into a batch of one (picklable)."""

    def __init__(self, collate_fn: Any):
        self.collate_fn = collate_fn

    def one(self, item: Any) -> Any:
        from torch.utils.data import default_collate

        return (self.collate_fn or default_collate)([item])

    def __call__(self, src: Iterator[Any]) -> Iterator[Any]:
        for item in src:
            yield self.one(item)


_warned_stream: set = set()


def stream_loader(dataset: Any, what: Any, *args: Any, **kw: Any) -> Any:
    """webdataset's ``WebLoader`` (a ``FluidWrapper`` over a ``DataLoader``) for a dataset the plan cannot run.

    Raises:
        ValueError: ``journal=`` / ``resume=``, which need the plan.
    """
    from torch.utils.data import DataLoader

    from .fluid import FluidWrapper  # lazy: DataPipeline and the stream stages, for this fallback only

    name = getattr(what, "__name__", None) or repr(what)
    if kw.get("journal") is not None or kw.get("resume"):
        raise ValueError(f"WebLoader(journal=/resume=) needs a dataset resumewds can plan; {name} is a stage "
                         "it cannot see through (see docs/COMPAT.md, DataPipeline)")
    if kw.pop("remainder", None) == "drop":
        kw["drop_last"] = True
    for k in _RESUMEWDS_ONLY:
        kw.pop(k, None)
    if name not in _warned_stream:
        _warned_stream.add(name)
        warnings.warn(f"WebLoader: resumewds cannot see through {name}: the loader runs as webdataset's "
                      "(a torch DataLoader over the pipeline; each worker runs it whole, so split the shards "
                      "with wds.split_by_worker), and a resume from state_dict() is approximate. To make it "
                      "exact, use the stages resumewds compiles (SimpleShardList / ResampledShards, the "
                      "splitters, shuffle, tarfile_to_samples, the per-sample stages, batched): see "
                      "docs/COMPAT.md", stacklevel=4)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # FluidWrapper's own "cannot see through DataLoader"
        return FluidWrapper(DataLoader(dataset, *args, **kw))


class WebLoader(FluentLoader, ShardLoader, DataLoaderAttributes):
    __doc__ = ShardLoader.__doc__

    #: webdataset's shard split (each DataLoader worker its own shards), passed into the engine
    split_policy = SHARD_SPLIT

    def __new__(cls, dataset: Any = None, *args: Any, **kw: Any) -> Any:
        out = route(cls, dataset, args, kw)  # (not ``or``: its truth would ask len(), which builds it)
        return out if out is not None else super().__new__(cls)

    def adopt_place(self, place: Dict[str, Any], source: Optional[str]) -> None:
        """A state (a commit) of webdataset's worker rotation is refused."""
        refuse_rotation(place, source)


class _RotatingWebLoader(RotatingLoader, WebLoader):
    """WebLoader over stages that drop samples: webdataset's rotation of its workers' streams."""

    stream_items = True  # its items are webdataset's (see LoaderPipeline)
