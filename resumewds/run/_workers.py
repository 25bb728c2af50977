"""What a loader's DataLoader workers run (:class:`_EpochSource`), and what comes back from them.

Example:
    >>> EmptyBatch(BatchInfo(0, 3, 0, (), 0, 0, True)).info.step
    3
"""

from __future__ import annotations

import logging
import os
import sys
from typing import TYPE_CHECKING, Any, Dict, Iterator, List, NamedTuple, Optional, Sequence, Tuple

from torch.utils.data import IterableDataset, default_convert, get_worker_info

from ..errors import HandlerStop, ResumeWDSError
from ..events import worker_logging
from ..plan import Layout
from ..stages import default_collate
from ._preemption import _worker_signals
from ._watchdog import die_with_parent

if TYPE_CHECKING:
    from ..read import ShardDataset

__all__ = ["BatchInfo", "EmptyBatch"]


class _WorkerFailure:
    """One of our errors from a worker, yielded instead of raised so that the exception itself is
    pickled: the main process re-raises it with its type and fields (torch would rebuild it from text)."""

    def __init__(self, exc: ResumeWDSError, worker: int):
        self.exc = exc
        self.worker = worker


#: what a worker yields in place of the step where a webdataset handler said stop
_HANDLER_STOP = "resumewds-handler-stop"


class BatchInfo(NamedTuple):
    """What the loader knows about the batch it handed out last (``loader.batch_info``).

    ``pads`` survives any stage (``to_tuple`` drops ``__pad__``): mask the loss with it, e.g.
    ``keep = ~torch.tensor(loader.batch_info.pads)``.

    Attributes:
        epoch: the epoch of the batch.
        step: the step's index from where this ``iter(loader)`` started.
        samples: samples in the batch (padding included).
        pads: per sample, whether it is padding (``remainder`` "pad"/"keep").
        skipped: samples of the step lost to shards skipped (``on_error="skip"``).
        filtered: samples removed by ``select`` or a stage / batch stage returning None.
        empty: the step lost every sample: the batch is an :class:`EmptyBatch`.
    """

    epoch: int
    step: int
    samples: int
    pads: Tuple[bool, ...]
    skipped: int
    filtered: int
    empty: bool


class EmptyBatch(list):
    """The batch of a step that lost all its samples (filtered or skipped).

    Every rank yields exactly one batch per step so that DDP ranks stay in lock step; a rank whose
    share of a step is empty gets this empty, falsy ``list`` with the step's ``info`` (counted in
    ``empty_batches``).  A DDP loop still takes part in the all-reduce, e.g. with a zero loss::

        for batch in loader:
            if isinstance(batch, rw.EmptyBatch):
                loss = sum(p.sum() for p in model.parameters()) * 0.0
            else:
                loss = criterion(model(batch[0]), batch[1])
            loss.backward(); opt.step(); loader.commit(step)

    Example:
        >>> b = EmptyBatch(BatchInfo(0, 3, 0, (), 0, 4, True))
        >>> (len(b), bool(b), b.info.filtered)
        (0, False, 4)
    """

    def __init__(self, info: BatchInfo):
        super().__init__()
        self.info = info

    def __repr__(self) -> str:
        return (f"EmptyBatch(epoch={self.info.epoch}, step={self.info.step}, "
                f"skipped={self.info.skipped}, filtered={self.info.filtered})")

    def __reduce__(self) -> Any:
        return (EmptyBatch, (self.info,))


class _SampleLayout:
    """The chunk layout of ``batch_size=None`` on one rank: a grid fixed to the epoch.

    A resume may start mid-chunk, so the tail is a property of the epoch alone: ``"drop"`` leaves out
    the last ``total % batch_size`` positions; ``"pad"`` follows the epoch with ``(-total) %
    batch_size`` pads (copies of positions 0, 1, ...), the position counting on past ``total`` so a
    resume inside the padding delivers exactly the pads left.  Duck-types
    :class:`resumewds.plan.Layout`.
    """

    def __init__(self, base: Layout):
        self.batch_size = base.batch_size
        self.world_size = 1
        self.rank = 0
        self.remainder = base.remainder
        self.step_size = base.batch_size

    def end(self, total: int) -> int:
        """The position after the last sample this layout delivers in an epoch."""
        b = self.batch_size
        if self.remainder == "drop":
            return total - total % b
        if self.remainder == "pad" and total:
            return total + (-total) % b
        return total

    def num_steps(self, total: int, start: int) -> int:
        left = self.end(total) - start
        return 0 if left <= 0 else -(-left // self.batch_size)

    def position_after(self, total: int, start: int, step: int) -> int:
        p = start + (step + 1) * self.batch_size
        return total if p >= self.end(total) else p

    def slots(self, total: int, start: int, step: int, rank: Optional[int] = None
              ) -> List[Tuple[int, bool]]:
        s0 = start + step * self.batch_size
        stop = min(s0 + self.batch_size, self.end(total))
        return [(g, False) if g < total else ((g - total) % total, True) for g in range(s0, stop)]


def _pin_memory(batch: Any, device: Optional[str]) -> Any:
    """torch's ``pin_memory`` of a batch (what its pin thread does to the queue's)."""
    from torch.utils.data._utils.pin_memory import pin_memory

    return pin_memory(batch, device) if device else pin_memory(batch)


class _EpochSource(IterableDataset):
    """What each DataLoader worker iterates: its round-robin share of steps."""

    def __init__(self, ds: ShardDataset, epoch: int, start: int, layout: Layout, collate: bool,
                 collate_fn: Any = None, ignore_signals: Sequence[int] = (),
                 stopping: Any = None, ring: Any = None, convert: bool = False):
        self.ds = ds
        self.ring = ring  # a shmbatch.BytesRing inherited by forked workers, or None
        self.collate_fn = collate_fn
        self.convert = convert  # torch's default_convert on each item (DataLoader's batch_size=None)
        self.ignore_signals = tuple(ignore_signals)
        self.stopping = stopping  # shared flag: the main process is shutting the workers down
        self.epoch = epoch
        self.start = start
        self.layout = layout
        self.collate = collate
        self.log_level = logging.getLogger("resumewds").level  # for spawned workers
        self.parent = os.getpid()  # the main process: a worker whose parent is gone exits

    def __iter__(self) -> Iterator[Tuple[int, Any, Dict[str, Any]]]:
        info = get_worker_info()
        w, nw = (info.id, info.num_workers) if info is not None else (0, 1)
        if info is not None:
            lock = sys.modules.get("resumewds.journal._lock")  # (not loaded: no journal was open to inherit)
            if lock is not None:
                lock.close_inherited()  # the journal's lock dies with the loader's process, not with its workers
            die_with_parent(self.parent)
            if self.ignore_signals:
                _worker_signals(self.ignore_signals, self.stopping)
            worker_logging(self.log_level)
        ring = self.ring if info is not None else None
        collate_fn = self.collate_fn
        if ring is not None and ring.tensors is not None and self.collate and collate_fn is default_collate:
            collate_fn = ring.tensors.collate(w)  # the same batches, large tensors stacked into slots
        try:
            steps = self.ds.iter_steps(self.epoch, self.start, self.layout, w, nw,
                                       collate=self.collate, collate_fn=collate_fn)
            if self.convert:  # as torch's DataLoader(batch_size=None) does: numpy arrays become tensors
                steps = ((k, default_convert(b) if k >= 0 else b, m) for k, b, m in steps)
            if ring is None:
                yield from steps
            else:
                pack = ring.pack
                for k, batch, meta in steps:
                    yield k, pack(w, batch), meta
        except ResumeWDSError as exc:
            if info is None:
                raise  # in the main process already
            # the shard's "fail" event travels with the error (journal, stats)
            yield -1, _WorkerFailure(exc, w), {"events": self.ds.take_events()}
        except HandlerStop:  # a handler said stop (ignore_and_stop): the epoch ends at this step
            yield -1, _HANDLER_STOP, {"events": self.ds.take_events()}
        finally:
            if info is not None:
                self.ds.close()
