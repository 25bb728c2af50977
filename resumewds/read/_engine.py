"""The step engine: one loop that reads, tags, stages and collates the steps of any data set.

``ShardDataset.iter_steps`` and ``MixedDataset.iter_steps`` both run
:func:`run_steps` (a single data set is a mixture of one source); a
:class:`StepPlan` says only *which* samples a step holds.  Here: the
:class:`Scheduler` (downloads, read-ahead and ranged reads started ahead of
the reads), the reads through each source's reader, and the
:class:`StepBuilder` (tags, stages, collation, the step's ``meta``).  A
handler's stop ends the step for every source, and it is the last one.

Example:
    >>> src = Source(ds, ds.stages, stream=True)                          # doctest: +SKIP
    >>> for k, batch, meta in run_steps([src], plan, 0, 0, collate_fn, [], ds.take_events):  # doctest: +SKIP
    ...     pass
"""

from __future__ import annotations

import time
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

from ..errors import ResumeWDSError
from ..events import EventKind
from ..manifest import ShardInfo
from ..stages import OnEvent, apply_stages
from ._shards import DIGEST_STAGE, run_length

__all__ = ["READ_AHEAD", "Scheduler", "Slots", "Source", "StepBuilder", "StepPlan", "run_steps"]

#: one step: each slot's ``(position, pad)``, ``(shard, sample)`` in its source, and
#: its source index (None: every slot is source 0's)
Slots = Tuple[List[Tuple[int, bool]], List[Tuple[int, int]], Optional[List[int]]]

#: samples whose ranged reads a small step fetches ahead for the steps after it
READ_AHEAD = 64


def _reading() -> Any:
    """:mod:`resumewds.read._ranged`, for a reader that may read remote shards by range."""
    from . import _ranged  # lazy: ranged reads and sparse partials, for remote shards only

    return _ranged


class Source:
    """One data set the engine reads from, and what it does with its samples.

    Args:
        ds: the data set (its manifest, store and reader).
        stages: the per-sample stages its samples go through.
        stream: its order reads each shard front to back: consecutive samples are read as runs.
        name: the ``__source__`` tag of its samples (mixtures), or None.
    """

    __slots__ = ("ds", "stages", "stream", "name")

    def __init__(self, ds: Any, stages: Sequence[Callable[[Any], Any]], stream: bool,
                 name: Optional[str] = None):
        self.ds = ds
        self.stages = list(stages)
        self.stream = bool(stream)
        self.name = name


class StepPlan:
    """Which samples the steps hold: what a data set or a mixture tells :func:`run_steps`."""

    def steps(self) -> Iterable[int]:
        """This worker's steps, in order."""
        raise NotImplementedError

    def step(self, k: int) -> Slots:
        """Step ``k``'s slots (:data:`Slots`)."""
        raise NotImplementedError

    def prefetch(self, n: int, k: int, slots: Slots) -> Iterable[Tuple[int, List[ShardInfo], int]]:
        """Before step ``k`` (this worker's ``n``-th) is read: ``(source, shards, window)``
        to download in the background (``store.prefetch``)."""
        return ()


def _by_source(step: Slots) -> Dict[int, List[Tuple[int, int]]]:
    """A step's ``(shard, sample)`` pairs per source."""
    _, where, srcs = step
    if srcs is None:
        return {0: where}
    groups: Dict[int, List[Tuple[int, int]]] = {}
    for i, s in enumerate(srcs):
        groups.setdefault(s, []).append(where[i])
    return groups


class Scheduler:
    """What a pass of steps starts ahead of its reads.

    Before each step (:meth:`before`): the background downloads the plan asks
    for (a shuffled pass's first step defers them until its first sample is
    out, :meth:`first_out`: they would compete with its reads), and the ranged
    reads of the step's samples not cached yet; small shuffled steps of one
    source also those of the next steps, up to :data:`READ_AHEAD` samples
    together.  The kernel's read-ahead of the first step's local samples is
    asked for once its first sample is out, too (queued before it, it put
    that sample's read behind the others on a cold disk).
    """

    def __init__(self, sources: Sequence[Source], plan: StepPlan, order: Iterable[int]):
        self.sources = sources
        self.readers = [s.ds.reader for s in sources]
        self.plan = plan
        shuffled_one = len(sources) == 1 and not sources[0].stream
        self.upcoming = order if shuffled_one and isinstance(order, (list, range)) else None
        self.ahead_to = 1  # the steps before this index had their ranges asked for already
        self.deferred: List[Tuple[int, List[ShardInfo], int]] = []
        self.hints: List[Tuple[int, List[Tuple[int, int]]]] = []

    def before(self, n: int, k: int, step: Slots) -> None:
        """Start what step ``k`` (this pass's ``n``-th) needs before its samples are read."""
        todo = list(self.plan.prefetch(n, k, step))
        if n == 0 and not all(src.stream for src in self.sources):
            self.deferred = todo
        else:
            self._prefetch(todo)
        for s, pairs in _by_source(step).items():
            if n == 0:  # the first step's reads start together (cold disk) once its first sample is out
                self.hints.append((s, pairs))
            if self.readers[s].can_range:
                _reading().prepare(self.readers[s], pairs)
        where = step[1]
        if self.upcoming is not None and n >= self.ahead_to and len(where) < READ_AHEAD:
            more: List[Tuple[int, int]] = []
            self.ahead_to = n + 1
            while self.ahead_to < len(self.upcoming) and len(where) + len(more) < READ_AHEAD:
                more.extend(self.plan.step(self.upcoming[self.ahead_to])[1])
                self.ahead_to += 1
            if more and self.readers[0].can_range:
                _reading().prepare(self.readers[0], more)

    def first_out(self) -> None:
        """The step's first sample is out: the kernel's read-ahead of the first step's other
        samples and the deferred downloads start (a cold disk serves that sample alone first)."""
        if self.hints:
            hints, self.hints = self.hints, []
            for s, pairs in hints:
                self.readers[s].hint_pages(pairs)
        if self.deferred:
            todo, self.deferred = self.deferred, []
            self._prefetch(todo)

    def _prefetch(self, todo: Iterable[Tuple[int, List[ShardInfo], int]]) -> None:
        for s, shards, window in todo:
            try:
                self.sources[s].ds.store.prefetch(shards, depth=len(shards), window=window)
            except ResumeWDSError:
                pass  # surfaces again when the shard is read


class StepBuilder:
    """The assembly of one step: its samples tagged and staged, its batch and its ``meta``
    (``slots``: each slot's ``(position, pad)``; ``names``: each source's ``__source__`` tag)."""

    def __init__(self, k: int, worker: int, epoch: int, slots: List[Tuple[int, bool]],
                 names: Optional[List[Optional[str]]]):
        self.slots = slots
        self.epoch = epoch
        self.names = names
        # with padding in a step, every sample carries __pad__, so collation keeps the flag
        self.any_pad = any(p for _, p in slots)
        self.meta: Dict[str, Any] = {"worker": worker, "step": k, "samples": 0, "pads": 0,
                                     "skipped": 0, "filtered": 0, "bytes": 0, "shards": {},
                                     "positions": [], "slot_index": [], "pad_flags": []}
        if names is not None:
            self.meta["sources"] = {}
        self.out: List[Any] = []
        self.t_stages = 0.0

    def add(self, i: int, sample: Dict[str, Any], shard: int, shard_name: str, source: int,
            stages: Sequence[Callable[[Any], Any]], on_event: Optional[OnEvent] = None) -> Any:
        """Slot ``i``'s sample, read from global shard ``shard`` of ``source``, tagged and
        staged: what the step delivers, or None (filtered or skipped)."""
        meta = self.meta
        # members only: __key__ and __url__ are the only dunder keys so far
        meta["bytes"] += sum(map(len, sample.values())) - len(sample["__key__"]) - len(sample["__url__"])
        pos, pad = self.slots[i]
        sample["__epoch__"] = self.epoch
        sample["__index__"] = pos
        sample["__shard__"] = shard_name
        if self.names is not None:
            sample["__source__"] = self.names[source]
        if self.any_pad:
            sample["__pad__"] = bool(pad)
        if pad:
            meta["pads"] += 1
        else:
            per_shard = meta["shards"]
            per_shard[shard] = per_shard.get(shard, 0) + 1
            if self.names is not None:
                per_src = meta["sources"]
                per_src[source] = per_src.get(source, 0) + 1
        t0 = time.perf_counter()
        x = apply_stages(stages, sample, on_event)
        self.t_stages += time.perf_counter() - t0
        if x is None:
            meta["filtered"] += 1
            return None
        self.out.append(x)
        meta["slot_index"].append(i)
        return x

    def fill(self, r: Any, stages: Sequence[Callable[[Any], Any]], shards: Sequence[ShardInfo],
             where: List[Tuple[int, int]], stream: bool, shard_names: Dict[int, str],
             first_out: Callable[[], None]) -> Tuple[int, float]:
        """A step of one source read (reader ``r``), tagged and staged in one loop: what
        :func:`_samples`, :meth:`ShardReader.read` and :meth:`add` do slot by slot, without
        their calls per sample but :meth:`ShardReader.hit` (about 7% of the in-process time).
        Anything else (a shard not open, a short read, a run, a failed shard) takes ``r``'s
        methods, which raise or skip as they always do.  Returns ``(skipped, t_read)``."""
        meta, slots, out, epoch, any_pad = self.meta, self.slots, self.out, self.epoch, self.any_pad
        index, per_shard, on_event, clock = meta["slot_index"], meta["shards"], r.on_event, time.perf_counter
        hit = r.hit
        ahead: List[Optional[Dict[str, Any]]] = []
        n, stopping = len(where), False
        skipped = nbytes = pads = filtered = 0
        t_read = t_stages = 0.0
        t0 = clock()
        for i in range(n):
            si, j = where[i]
            sample = None
            if ahead:
                sample = ahead.pop()
            elif stopping:  # a handler's stop ends the step
                pass
            elif stream and i + 1 < n and where[i + 1] == (si, j + 1):  # one pread for a run
                run = run_length(shards, where, i, r.run_bytes)
                ahead = r.read_run(si, j, run) if run > 1 else [r.read(si, j)]
                ahead.reverse()
                sample, stopping = ahead.pop(), r.stopping
            else:  # an open shard's sample by one pread and a parse; else the whole path
                sample = hit(si, j)
                if sample is None:
                    sample, stopping = r.read(si, j), r.stopping
            t1 = clock()
            t_read += t1 - t0
            if sample is None:
                skipped += 1
            else:
                nbytes += sum(map(len, sample.values())) - len(sample["__key__"]) - len(sample["__url__"])
                pos, pad = slots[i]
                sample["__epoch__"], sample["__index__"] = epoch, pos
                name = shard_names.get(si)
                sample["__shard__"] = name if name is not None else shard_names.setdefault(si, shards[si].name)
                if any_pad:
                    sample["__pad__"] = bool(pad)
                if pad:
                    pads += 1
                else:
                    per_shard[si] = per_shard.get(si, 0) + 1
                sample = apply_stages(stages, sample, on_event)
                if sample is None:
                    filtered += 1
                else:
                    out.append(sample)
                    index.append(i)
                t0 = clock()
                t_stages, t1 = t_stages + t0 - t1, t0
            if i == 0:
                first_out()  # the first sample is out: the deferred downloads start
                t1 = clock()
            t0 = t1
        meta["bytes"] += nbytes
        meta["pads"] += pads
        meta["filtered"] += filtered
        self.t_stages += t_stages
        return skipped, t_read

    def batch(self, collate_fn: Optional[Callable[[List[Any]], Any]],
              batch_stages: Sequence[Callable[[Any], Any]], gwhere: Sequence[Tuple[int, int]],
              on_event: Optional[OnEvent] = None) -> Any:
        """The step's batch: its samples collated (``collate_fn`` None: the list itself),
        then the batch stages; a batch stage's None drops the batch (``[]``, its samples
        counted as filtered).  ``gwhere[i]``: slot ``i``'s global ``(shard, sample)``."""
        meta, out, slots = self.meta, self.out, self.slots
        index = meta["slot_index"]
        if index:
            meta["positions"] = [slots[i][0] for i in index]
            meta["pad_flags"] = [bool(slots[i][1]) for i in index]
            if collate_fn is None:  # handed out one by one: whose each sample is (consumption)
                meta["sample_shards"] = [None if slots[i][1] else gwhere[i][0] for i in index]
                if len(index) < len(slots):  # some dropped: whose each slot is (counted as the position passes)
                    meta["slot_shards"] = [None if pad else gwhere[j][0] for j, (_, pad) in enumerate(slots)]
        meta["samples"] = len(out)
        if collate_fn is None or not out:
            return out
        t0 = time.perf_counter()
        batch = apply_stages(batch_stages, collate_fn(out), on_event)
        self.t_stages += time.perf_counter() - t0
        if batch is None:
            meta["filtered"] += len(out)
            meta["samples"] = 0
            meta["batch_dropped"] = True
            return []
        return batch

    def finish(self, events: List[Dict[str, Any]], stopped: bool, t_read: float, t_wait: float,
               failed: Dict[str, str]) -> Dict[str, Any]:
        """The step's ``meta``: its events (a sample a stage's handler skipped counted as
        skipped, not filtered), timings, failed shards, ``stopped`` (a handler's stop)."""
        meta = self.meta
        meta["t_read"] = t_read
        meta["t_stages"] = self.t_stages
        meta["t_fetch_wait"] = t_wait
        meta["events"] = events
        # a sample that failed its digest was counted skipped when it was read (openshards.DIGEST_STAGE)
        handled = sum(1 for e in events if e.get("kind") == EventKind.SAMPLE_SKIP and e.get("stage") != DIGEST_STAGE)
        if handled:
            meta["skipped"] += handled
            meta["filtered"] = max(0, meta["filtered"] - handled)
        if stopped:
            meta["stopped"] = True
        if failed:
            meta["failed"] = failed
        return meta


def _samples(sources: Sequence[Source], readers: List[Any], shards: Sequence[ShardInfo],
             gwhere: List[Tuple[int, int]], step: Slots) -> Iterator[Tuple[int, Optional[Dict[str, Any]]]]:
    """Slot by slot, ``(i, sample or None)`` of one step, read through each source's
    reader (runs of a streaming source with one ``pread``); None after a handler's stop."""
    _, where, srcs = step
    n = len(where)
    ahead: List[Optional[Dict[str, Any]]] = []
    stopping = False  # (the readers' flags are clear when a step starts: a stop ends the pass)
    for i in range(n):
        cur = 0 if srcs is None else srcs[i]
        r = readers[cur]
        si, j = where[i]
        if ahead:
            sample = ahead.pop()
        elif stopping:  # a handler's stop ends the step for every source
            sample = None
        elif sources[cur].stream and i + 1 < n and gwhere[i + 1] == (gwhere[i][0], j + 1):
            # one pread: fewer syscalls, and fewer GIL hand-offs to the prefetch threads
            run = run_length(shards, gwhere, i, r.run_bytes)
            # (fewer than ``run`` when a sample fails its digest: the next slot reads it alone)
            ahead = r.read_run(si, j, run) if run > 1 else [r.read(si, j)]
            ahead.reverse()
            sample = ahead.pop()
            stopping = r.stopping
        else:
            sample = r.read(si, j)
            stopping = r.stopping
        yield i, sample


def run_steps(sources: Sequence[Source], plan: StepPlan, epoch: int, worker: int,
              collate_fn: Optional[Callable[[List[Any]], Any]],
              batch_stages: Sequence[Callable[[Any], Any]],
              take_events: Callable[[], List[Dict[str, Any]]],
              mixture: bool = False, each: bool = False) -> Iterator[Tuple[int, Any, Any]]:
    """Yield ``(step, batch, meta)`` for the plan's steps of ``epoch``.

    Args:
        epoch, worker: the ``__epoch__`` tag; ``meta["worker"]``.
        collate_fn: the collation (then the ``batch_stages``); None: the batch
            is the list of samples.
        take_events: the events of the step (drained at its end).
        mixture: ``meta["sources"]`` (samples per source) and ``__source__`` tags.
        each: without collation only: each delivered sample as soon as it is read,
            ``(step, [sample], None)``, then the step's ``(step, [], meta)``.

    ``meta`` has ``worker``, ``step``, ``samples``, ``pads``, ``skipped``,
    ``filtered``, ``bytes``, ``shards`` (samples per global shard index: a
    source's shards follow the previous sources'), ``positions``,
    ``slot_index``, ``pad_flags``, then ``t_read``, ``t_stages``,
    ``t_fetch_wait``, ``events`` and, when they apply, ``sources``,
    ``sample_shards`` (not collating: each delivered sample's global shard
    index, None for padding), ``slot_shards`` (not collating, and samples
    dropped: each slot's), ``batch_dropped``, ``stopped``, ``failed``.
    """
    readers = [s.ds.reader for s in sources]
    for r in readers:
        r.start()  # no shard failed, no handler's stop yet (workers: a fresh copy anyway)
    offsets: List[int] = []
    shards: List[ShardInfo] = []  # every source's shards, one list (global index = offset + local)
    for s in sources:
        offsets.append(len(shards))
        shards.extend(s.ds.manifest.shards)
    if len(sources) == 1:
        shards = sources[0].ds.manifest.shards
    names = [s.name for s in sources] if mixture else None
    shard_names: Dict[int, str] = {}
    order = plan.steps()
    scheduler = Scheduler(sources, plan, order)
    clock = time.perf_counter
    for n, k in enumerate(order):
        step = plan.step(k)
        scheduler.before(n, k, step)
        slots, where, srcs = step
        gwhere = where if srcs is None else [(si + offsets[s], j) for (si, j), s in zip(where, srcs)]
        builder = StepBuilder(k, worker, epoch, slots, names)
        skipped = 0
        t_read = 0.0
        one_loop = not each and srcs is None and names is None  # one source, batched: StepBuilder.fill
        if one_loop:
            skipped, t_read = builder.fill(readers[0], sources[0].stages, shards, where, sources[0].stream,
                                           shard_names, scheduler.first_out)
        t0 = clock()
        for i, sample in (() if one_loop else _samples(sources, readers, shards, gwhere, step)):
            t_read += clock() - t0
            if sample is None:
                skipped += 1
            else:
                g = gwhere[i][0]
                name = shard_names.get(g)
                if name is None:
                    name = shard_names[g] = shards[g].name
                src = 0 if srcs is None else srcs[i]
                x = builder.add(i, sample, g, name, src, sources[src].stages, readers[src].on_event)
                if each and x is not None:
                    yield k, [x], None
            if i == 0:
                scheduler.first_out()  # the first sample is out: the deferred downloads start
            t0 = clock()  # (the consumer's time is not the step's)
        builder.meta["skipped"] = skipped
        # (a mixture's events are its sources': a batch stage's skip is the first one's)
        batch = builder.batch(collate_fn, batch_stages, gwhere, readers[0].on_event)
        stopped = any(r.stopping for r in readers)
        wait = 0.0
        for r in readers:
            wait, r.wait = wait + r.wait, 0.0
        failed = {shards[offsets[s] + i].url: e for s, r in enumerate(readers) for i, e in r.failed.items()}
        meta = builder.finish(take_events(), stopped, t_read, wait, failed)
        scheduler.first_out()  # (a step of one sample)
        yield k, ([] if each else batch), meta
        if stopped:  # the samples before the stop were delivered: no more steps
            return
    for r in readers:  # the pass is over: every shard read by range is checked whole
        if r.ranged is not None:
            _reading().finish(r)
