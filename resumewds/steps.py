"""The policy of one step, as the step engine applies it.

The one step engine (:func:`resumewds.stepengine.run_steps`) reads the steps of
:meth:`resumewds.WebDataset.iter_steps` (one data set) and of
:meth:`resumewds.MixedDataset.iter_steps` (a mixture of them); what it decides
about a step's reads and its batch is here:

* a shard that failed (``on_error="skip"``) is skipped for the rest of the
  run of steps and tried again by the next one (:func:`start_steps`);
* a shard read under a webdataset handler that says stop
  (``ignore_and_stop``): that read and every later read of the step give
  nothing (counted as skipped), the samples read before it are delivered,
  the step is marked ``meta["stopped"]`` and it is the last one
  (:func:`read_or_stop`, :func:`read_run_or_stop`, :func:`finish_step`);
* the batch: collated, then the batch stages; a batch stage returning None
  drops the batch, whose samples count as filtered (``meta["batch_dropped"]``,
  the loader hands out an EmptyBatch) (:func:`collate_step`);
* the events of the step, and a sample a stage's handler skipped counted as
  skipped, not filtered (:func:`finish_step`).

A stage whose handler says stop raises :class:`~resumewds.errors.HandlerStop`
out of the step engine; direct iteration ends there
(:func:`resumewds.handling.until_stop`), a WebLoader ends the epoch.

The objects passed as ``ds`` are data sets (``_read``, ``_read_run``,
``_stopping``); their reading state is their reader's
(:class:`~resumewds.openshards.ShardReader`: failed shards, a handler's stop).
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional, Sequence

from .errors import HandlerStop
from .events import EventKind
from .handling import OnEvent, SkippedSample, report_stop
from .openshards import DIGEST_STAGE, shard_reader

__all__ = ["apply_stages", "collate_step", "finish_step", "read_or_stop", "read_run_or_stop", "start_steps"]


def start_steps(ds: Any) -> None:
    """A step engine starts over ``ds``: no handler's stop yet, and no shard failed yet
    (:meth:`resumewds.openshards.ShardReader.start`).

    ``on_error="skip"``: a shard that failed is skipped for the rest of this
    run of steps by the process that saw it fail, and tried again by the next
    one (the next epoch, or a resume), with 0 workers as with N.
    """
    shard_reader(ds).start()


def read_or_stop(ds: Any, shard_idx: int, j: int) -> Optional[Dict[str, Any]]:
    """``ds._read(shard_idx, j)``, where a handler's stop stops ``ds``'s reader: this read
    and every later one (until the next step engine starts) give None."""
    if ds._stopping:
        return None
    try:
        return ds._read(shard_idx, j)
    except HandlerStop:
        shard_reader(ds).stopping = True
        return None


def read_run_or_stop(ds: Any, shard_idx: int, j: int, count: int) -> List[Optional[Dict[str, Any]]]:
    """``ds._read_run(shard_idx, j, count)`` under the same stop rule as :func:`read_or_stop`."""
    if ds._stopping:
        return [None] * count
    try:
        return ds._read_run(shard_idx, j, count)
    except HandlerStop:
        shard_reader(ds).stopping = True
        return [None] * count


def apply_stages(stages: Sequence[Callable[[Any], Any]], x: Any, on_event: Optional[OnEvent] = None) -> Any:
    """``x`` through ``stages``; None as soon as one returns None, or a stage's handler
    skips it (a ``sample_skip`` event of ``on_event``: the data set's; None: logged only)."""
    try:
        for st in stages:
            x = st(x)
            if x is None:
                return None
    except SkippedSample as skip:
        skip.report(on_event)
        return None
    except HandlerStop as stop:
        report_stop(stop, on_event)
        raise
    return x


def collate_step(meta: Dict[str, Any], out: List[Any],
                 collate_fn: Optional[Callable[[List[Any]], Any]],
                 batch_stages: Sequence[Callable[[Any], Any]], on_event: Optional[OnEvent] = None) -> Any:
    """The step's batch: ``out`` collated (``collate_fn`` None: the list itself, no
    batch stages), then the batch stages.  A batch stage's None drops the batch:
    ``[]``, its samples counted as filtered, ``meta["batch_dropped"]``; a batch stage's
    handler that skips it records a ``sample_skip`` event of ``on_event``."""
    if collate_fn is None or not out:
        return out
    batch = apply_stages(batch_stages, collate_fn(out), on_event)
    if batch is None:
        meta["filtered"] += len(out)
        meta["samples"] = 0
        meta["batch_dropped"] = True
        return []
    return batch


def finish_step(meta: Dict[str, Any], events: List[Dict[str, Any]], stopped: bool) -> None:
    """The step's events, with the samples a stage's handler skipped counted as skipped
    (like ``on_error="skip"``), not filtered; ``stopped``: a handler said stop."""
    meta["events"] = events
    # a sample that failed its digest was counted skipped when it was read (openshards.DIGEST_STAGE)
    handled = sum(1 for e in events if e.get("kind") == EventKind.SAMPLE_SKIP and e.get("stage") != DIGEST_STAGE)
    if handled:
        meta["skipped"] += handled
        meta["filtered"] = max(0, meta["filtered"] - handled)
    if stopped:  # the samples before the stop are delivered, then no more steps
        meta["stopped"] = True
