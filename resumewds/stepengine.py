"""The step engine: one loop that reads, tags, stages and collates the steps of any data set.

:meth:`resumewds.shardset.ShardDataset.iter_steps` (one data set) and
:meth:`resumewds.mixdataset.MixedDataset.iter_steps` (several, mixed) both
run :func:`run_steps`; a single data set is a mixture of one source.  What
differs between them is only *which* samples a step holds, which a
:class:`StepPlan` says: per step, each slot's ``(position, pad)``, its
``(shard, sample)`` in its source and its source, and the shards to fetch
in the background.  Everything else happens here, the same way for both:

* the background prefetch the plan asks for, per source;
* per source: verified ranged reads of shards not cached yet
  (:func:`resumewds.reading.prepare`), and the kernel's read-ahead of the
  first step's local byte ranges (:func:`resumewds.openshards.hint_pages`);
* the reads: samples of open shards read here (one ``pread``, parsed by
  the shard's member pattern: :func:`resumewds.tario.parse_sample_as`),
  consecutive samples of one shard in one ``pread``
  (:func:`resumewds.reading.read_run`) when the source reads its shards
  front to back, anything else through :func:`resumewds.reading.read`,
  which raises or skips as ``on_error`` / ``handler`` says;
* a handler's stop (:mod:`resumewds.steps`): the step ends for every
  source and it is the last one;
* the tags (``__epoch__``, ``__index__``, ``__shard__``, ``__source__`` for
  mixtures, ``__pad__`` when the step has padding), the per-sample stages,
  the collation and batch stages (:func:`resumewds.steps.collate_step`),
  the step's ``meta`` (counts, timings, events, failed shards).

Example:
    >>> src = Source(ds, ds.stages, stream=True)                          # doctest: +SKIP
    >>> for k, batch, meta in run_steps([src], plan, 0, 0, collate_fn, [], ds.take_events):  # doctest: +SKIP
    ...     pass
"""

from __future__ import annotations

import os
import time
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

from . import openshards, reading, steps, tario
from .errors import ResumeWDSError
from .manifest import ShardInfo

__all__ = ["Slots", "Source", "StepPlan", "run_steps"]

#: one step: each slot's ``(position, pad)``, ``(shard, sample)`` in its source, and
#: its source index (None: every slot is source 0's)
Slots = Tuple[List[Tuple[int, bool]], List[Tuple[int, int]], Optional[List[int]]]


class Source:
    """One data set the engine reads from, and what it does with its samples.

    Args:
        ds: the data set (:class:`~resumewds.shardset.ShardDataset`: its
            manifest, store, reader, ``on_error`` / ``handler``).
        stages: the per-sample stages its samples go through.
        stream: its order reads each shard front to back (not a shuffled
            window): consecutive samples are read as runs, and ranged reads
            wait for a growing partial download.
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


def _prefetch(dss: Sequence[Any], todo: Iterable[Tuple[int, List[ShardInfo], int]]) -> None:
    """Start the background downloads a step asks for (``StepPlan.prefetch``)."""
    for s, shards, window in todo:
        try:
            dss[s].store.prefetch(shards, depth=len(shards), window=window)
        except ResumeWDSError:
            pass  # surfaces again when the shard is read


#: samples whose ranged reads a small step fetches ahead for the steps after it (:func:`run_steps`)
READ_AHEAD = 64


def run_steps(sources: Sequence[Source], plan: StepPlan, epoch: int, worker: int,
              collate_fn: Optional[Callable[[List[Any]], Any]],
              batch_stages: Sequence[Callable[[Any], Any]],
              take_events: Callable[[], List[Dict[str, Any]]],
              mixture: bool = False, each: bool = False) -> Iterator[Tuple[int, Any, Any]]:
    """Yield ``(step, batch, meta)`` for the plan's steps of ``epoch``.

    Args:
        sources: the data sets read (one: a single data set).
        plan: the steps and their slots.
        epoch, worker: the ``__epoch__`` tag; ``meta["worker"]``.
        collate_fn: the collation (then the ``batch_stages``); None: the batch
            is the list of samples.
        take_events: the events of the step (drained at its end).
        mixture: ``meta["sources"]`` (samples per source) and ``__source__`` tags.
        each: without collation only: each delivered sample as soon as it is read,
            ``(step, [sample], None)``, then the step's ``(step, [], meta)`` (the same
            samples, in the same order).  The first sample of a pass is then not held
            back by the reads of the rest of its step: the first step's ranged reads
            fetch the first sample's range first, then the others.

    ``meta`` has ``worker``, ``step``, ``samples``, ``pads``, ``skipped``,
    ``filtered``, ``bytes``, ``shards`` (samples per global shard index: a
    source's shards follow the previous sources'), ``positions``,
    ``slot_index``, ``pad_flags``, then ``t_read``, ``t_stages``,
    ``t_fetch_wait``, ``events`` and, when they apply, ``sources``,
    ``sample_shards`` (not collating: each delivered sample's global shard
    index, None for padding), ``batch_dropped``, ``stopped``, ``failed``.
    """
    dss = [s.ds for s in sources]
    for ds in dss:
        steps.start_steps(ds)  # no shard failed, no handler's stop yet (workers: a fresh copy anyway)
    offsets: List[int] = []
    shards: List[ShardInfo] = []  # every source's shards, one list (global index = offset + local)
    for ds in dss:
        offsets.append(len(shards))
        shards.extend(ds.manifest.shards)
    if len(dss) == 1:
        shards = dss[0].manifest.shards
    run_bytes = [int(getattr(ds, "_run_bytes", reading.RUN_BYTES)) for ds in dss]
    read, read_run, run_length = steps.read_or_stop, steps.read_run_or_stop, openshards.run_length
    pread, parse, clock, most = os.pread, tario.parse_sample, time.perf_counter, tario.CHECKED_PREAD
    parse_as, learn = tario.parse_sample_as, tario.learn_pattern
    patterns: Dict[int, Any] = {}  # global shard -> tario.member_pattern, or () once it stopped paying
    misses: Dict[int, int] = {}
    names: Dict[int, str] = {}
    tags = [s.name for s in sources] if mixture else None
    stopping = False  # a handler said stop (steps.read_or_stop): this step is the last
    order = plan.steps()
    # small steps (a DataLoader worker's share of one sample at a time): the ranged reads of
    # the next steps are started together, up to READ_AHEAD samples, not one request per step
    upcoming = order if isinstance(order, (list, range)) and len(dss) == 1 else None
    ahead_to = 1  # the steps before this index had their ranges asked for already
    # a shuffled pass's first step: its ranged reads go first, its background downloads start
    # once its first sample is out (they would compete with those reads for the first batch)
    deferred: List[Tuple[int, List[ShardInfo], int]] = []
    for n, k in enumerate(order):
        step = plan.step(k)
        slots, where, srcs = step
        meta: Dict[str, Any] = {"worker": worker, "step": k, "samples": 0, "pads": 0,
                                "skipped": 0, "filtered": 0, "bytes": 0, "shards": {},
                                "positions": [], "slot_index": [], "pad_flags": []}
        if mixture:
            meta["sources"] = {}
        pf = list(plan.prefetch(n, k, step))
        if n == 0 and not all(src.stream for src in sources):
            deferred = pf
        else:
            _prefetch(dss, pf)  # in order, the download is the read: it starts first
        t_read = t_stages = 0.0
        t0 = clock()
        # each source's pairs: read ahead by the kernel (the first step), and the
        # samples of its shards not cached yet started by verified ranges
        if srcs is None:
            groups = {0: where}
        else:
            groups = {}
            for i, s in enumerate(srcs):
                groups.setdefault(s, []).append(where[i])
        for s, pairs in groups.items():
            if n == 0:  # the first step: its reads start at once (cold disk)
                openshards.hint_pages(dss[s], pairs)
            reading.prepare(dss[s], pairs, sources[s].stream)
        if upcoming is not None and n and n >= ahead_to and srcs is None and len(where) < READ_AHEAD \
                and not sources[0].stream:
            more: List[Tuple[int, int]] = []
            ahead_to = n + 1
            while ahead_to < len(upcoming) and len(where) + len(more) < READ_AHEAD:
                more.extend(plan.step(upcoming[ahead_to])[1])
                ahead_to += 1
            if more:
                reading.prepare(dss[0], more, False, ahead=True)
        # per source: its reads of open shards (``fast``, not while ranged samples
        # wait to be taken), failed shards, stages, where its shards start
        state: List[Tuple[Any, ...]] = []
        for s, src in enumerate(sources):
            ds = src.ds
            rd = openshards.shard_reader(ds)
            fast = rd.fast if rd.ranged is None or not rd.ranged.ready else None
            touch: Any = rd.open.move_to_end if fast is not None else None  # the fd LRU
            state.append((ds, fast, touch, rd.failed, src.stages, offsets[s], src.stream, run_bytes[s]))
        ds, fast, touch, failed, stages, off, stream, rb = state[0]
        cur = 0
        gwhere = where if srcs is None else [(si + offsets[s], j) for (si, j), s in zip(where, srcs)]
        # With padding in a step, every sample carries __pad__ (True/False)
        # so that collation keeps the flag for the whole batch.
        any_pad = any(p for _, p in slots)
        per_shard = meta["shards"]
        per_src = meta.get("sources")
        slot_index = meta["slot_index"]  # positions and pad_flags follow from it, after the loop
        out: List[Any] = []
        nbytes = skipped = filtered = pads = 0
        nslots = len(slots)
        ahead: List[Optional[Dict[str, Any]]] = []
        for i, (pos, pad) in enumerate(slots):
            if deferred and i == 1:  # the first sample is out: the downloads start
                _prefetch(dss, deferred)
                deferred = []
            si, j = where[i]
            if srcs is not None and srcs[i] != cur:
                cur = srcs[i]
                ds, fast, touch, failed, stages, off, stream, rb = state[cur]
            g = si + off
            if ahead:
                sample = ahead.pop()
            elif stopping:  # a handler's stop ends the step for every source
                sample = None
            elif stream and i + 1 < nslots and gwhere[i + 1] == (g, j + 1):  # a run may start here
                # consecutive samples of one shard (the rule unshuffled) are read
                # with one pread: fewer syscalls, and fewer GIL hand-offs to the
                # prefetch threads
                run = run_length(shards, gwhere, i, rb)
                # (fewer than ``run`` when a sample fails its digest: the next slot reads it alone)
                ahead = read_run(ds, si, j, run) if run > 1 else [read(ds, si, j)]
                stopping = ds._stopping
                ahead.reverse()
                sample = ahead.pop()
            elif fast is not None and (hit := fast.get(si)) is not None and si not in failed:
                # The open shards' samples are read here, not through the five calls
                # of ``read`` (a third of the in-process time per sample): the same
                # pread and parse; anything else (a shard not open yet, samples
                # fetched by range, a failed shard, a short read or a malformed
                # sample) takes ``read``, which raises or skips as it always does.
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
                        pat = patterns.get(g) if verified else ()
                        sample = parse_as(buf, pat) if pat else None
                        if sample is None:
                            sample = parse(buf, url, a, 0, size, verified)
                            if pat != ():  # () : not verified, or no more tries
                                learn(patterns, misses, g, sample, pat)
                except (OSError, ResumeWDSError):
                    sample = None
                if sample is None:
                    sample = read(ds, si, j)  # the error, or the skip, as read gives it
                    stopping = ds._stopping
                else:
                    sample["__url__"] = url
                    touch(si)
            else:  # shuffled: one sample, no run to look for
                sample = read(ds, si, j)
                stopping = ds._stopping
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
            name = names.get(g)
            if name is None:
                name = names[g] = shards[g].name
            sample["__shard__"] = name
            if tags is not None:
                sample["__source__"] = tags[cur]
            if any_pad:
                sample["__pad__"] = bool(pad)
            if pad:
                pads += 1
            else:
                per_shard[g] = per_shard.get(g, 0) + 1
                if per_src is not None:
                    per_src[cur] = per_src.get(cur, 0) + 1
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
            if each:
                yield k, [x], None
                t0 = clock()  # the consumer's time is not the step's
        if slot_index:
            meta["positions"] = [slots[i][0] for i in slot_index]
            meta["pad_flags"] = [bool(slots[i][1]) for i in slot_index]
            if collate_fn is None:  # handed out one by one: whose each sample is (consumption)
                meta["sample_shards"] = [None if slots[i][1] else gwhere[i][0] for i in slot_index]
        meta["samples"] = len(out)
        meta["bytes"] = nbytes
        meta["skipped"] = skipped
        meta["filtered"] = filtered
        meta["pads"] = pads
        t2 = clock()
        batch = steps.collate_step(meta, out, collate_fn, batch_stages)
        t_stages += clock() - t2
        meta["t_read"] = t_read
        meta["t_stages"] = t_stages
        wait = 0.0
        readers = [openshards.shard_reader(ds) for ds in dss]
        for r in readers:
            wait += r.wait
            r.wait = 0.0
        meta["t_fetch_wait"] = wait
        steps.finish_step(meta, take_events(), stopping)
        failed_now = {shards[offsets[s] + i].url: e for s, r in enumerate(readers) for i, e in r.failed.items()}
        if failed_now:
            meta["failed"] = failed_now
        if deferred:  # (a step of one sample)
            _prefetch(dss, deferred)
            deferred = []
        yield k, ([] if each else batch), meta
        if stopping:  # the samples before the stop were delivered: no more steps
            return
    for ds in dss:  # the pass is over: every shard read by range is checked whole
        reading.finish(ds)
