"""webdataset's worker rotation when the data set's stages drop samples.

Each of webdataset's DataLoader workers filters its own stream and torch hands their items out
round-robin.  :class:`RotatingLoader` runs each worker's stream with its own engine loader and
merges their items so; the *rotation* (each stream's position, whose turn is next) goes into
each state and commit, so a resume is exact with any ``num_workers``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

from ..errors import StateError
from ..plan import Layout
from ..run import ShardLoader, check_steps
from ._shardsplit import empty_worker_error, worker_streams

__all__ = ["RotatingLoader", "StreamLayout"]


class _StreamSteps:
    """One worker's stream of an epoch, in chunks of samples (positions: its samples)."""

    def __init__(self, sequence: Any, chunk: int):
        self.sequence = sequence
        self.length = len(sequence)
        self.grid = Layout(chunk)
        self.batch_size = self.step_size = self.grid.batch_size
        self.world_size, self.rank, self.remainder = 1, 0, "keep"

    def end(self, total: int) -> int:
        return self.length

    def num_steps(self, total: int, start: int) -> int:
        return self.grid.num_steps(self.length, start)

    def position_after(self, total: int, start: int, step: int) -> int:
        return self.grid.position_after(self.length, start, step)

    def slots(self, total: int, start: int, step: int, rank: Optional[int] = None) -> List[Tuple[int, bool]]:
        return self.grid.slots(self.length, start, step)


@dataclass(frozen=True)
class StreamLayout:
    """Worker ``worker`` of ``workers``'s own stream as a loader's layout, read ``chunk`` per step."""

    workers: int
    worker: int
    chunk: int = 64
    check: bool = field(default=False, repr=False)

    @property
    def batch_size(self) -> int:
        return self.chunk

    step_size = batch_size

    def bind(self, ep: Any) -> _StreamSteps:
        """The stream's steps of epoch ``ep``."""
        stream = worker_streams(ep, self.workers)[self.worker]
        if self.check and not len(stream.seg_shard):
            raise empty_worker_error(self.workers, len(ep.seg_shard))
        return _StreamSteps(stream, self.chunk)


def _is_count(x: Any) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= 0


def _rotation_fields(rot: Any, source: str) -> Tuple[int, List[int], int]:
    """``(workers, streams, next)`` of a state's or a commit's rotation, refused (naming the field)
    unless well formed.
    """
    def bad(field: str, want: str, got: Any) -> StateError:
        return StateError(f"{source}: its rotation.{field} must be {want}, got {got!r} (a state written by "
                          "another program, edited or damaged)")

    if not isinstance(rot, dict):
        raise StateError(f"{source}: its rotation must be a dict {{'workers', 'streams', 'next'}}, got a "
                         f"{type(rot).__name__}: {rot!r} (a state written by another program, edited or damaged)")
    n, streams, nxt = rot.get("workers"), rot.get("streams"), rot.get("next", 0)
    if not isinstance(n, int) or not _is_count(n):
        raise bad("workers", "a count of workers", n)
    if not isinstance(streams, (list, tuple)) or not all(_is_count(p) for p in streams):
        raise bad("streams", "a list of each stream's position (ints >= 0)", streams)
    if not isinstance(nxt, int) or not _is_count(nxt) or nxt >= max(len(streams), 1):
        raise bad("next", f"the stream whose turn is next (0 to {max(len(streams), 1) - 1})", nxt)
    return n, [int(p) for p in streams], nxt


def refuse_rotation(place: Dict[str, Any], source: Optional[str]) -> None:
    """A loader that does not follow the rotation refuses a place that has one.

    Example:
        >>> refuse_rotation({"rotation": {"workers": 2}}, "this state")
        Traceback (most recent call last):
        ...
        resumewds.errors.StateError: this state follows webdataset's rotation of 2 workers' filtered streams: ...
    """
    rot = place.get("rotation")
    if rot and source is not None:
        workers = rot.get("workers") if isinstance(rot, dict) else "?"
        raise StateError(f"{source} follows webdataset's rotation of {workers} workers' filtered streams: "
                         "resume it with WebLoader(ds, batch_size=None) on one rank")


def _shares(num_workers: int, streams: int) -> List[int]:
    """DataLoader workers per stream: ``num_workers`` shared out, the first streams first."""
    return [num_workers // streams + (1 if w < num_workers % streams else 0) for w in range(streams)]


class RotatingLoader(ShardLoader):
    """An engine loader that follows webdataset's worker rotation over filtered streams (see the module
    docs) when the shard split applies; otherwise the engine's loader as it is.

    ``stream_stage`` (samples -> items, e.g. a refilled ``.batched(n)``) runs on each stream; it must
    hand an item out as soon as its last sample arrived (never read ahead).
    """

    def __init__(self, dataset: Any, *args: Any, stream_stage: Optional[Callable[[Iterator[Any]], Iterator[Any]]]
                 = None, **kw: Any):
        self._stream_stage = stream_stage
        self._rot: Optional[Dict[str, Any]] = None  # {"epoch", "streams", "next"} of the epoch in progress
        super().__init__(dataset, *args, **kw)

    @property
    def rotation_workers(self) -> int:
        """``W`` of the rotation this loader follows, or 0 (the engine's own order)."""
        W = int(self.config.get("worker_split") or 0)
        return W if W >= 2 and self.batch_size is None and self.world_size == 1 else 0

    def _rotation(self) -> Dict[str, Any]:
        """The rotation of the current epoch: ``{"workers", "streams", "next"}``."""
        W = self.rotation_workers
        rot = self._rot
        if rot is None or rot["epoch"] != self.epoch or len(rot["streams"]) != W:
            if self.position:
                raise StateError(f"the loader stands at position {self.position} of epoch {self.epoch} without "
                                 f"the rotation of its {W} workers' streams (a state of another order?)")
            rot = {"epoch": self.epoch, "streams": [0] * W, "next": 0}
            self._rot = rot
        return {"workers": W, "streams": list(rot["streams"]), "next": int(rot["next"])}

    def _set_rotation(self, rot: Optional[Dict[str, Any]], source: str) -> None:
        """Adopt ``rot`` (a state's or a commit's rotation) at ``self.epoch``."""
        W = self.rotation_workers
        if rot is None:
            if W and self.position:
                raise StateError(f"{source} was taken at position {self.position} without the rotation of "
                                 f"webdataset's {W} workers' filtered streams (another order, or an older "
                                 "resumewds): it cannot resume this loader exactly; start the epoch again "
                                 "(its position 0) or resume with the version that wrote it")
            self._rot = None
            return
        n, streams, nxt = _rotation_fields(rot, source)
        if not W or n != W or len(streams) != W:
            raise StateError(f"{source} follows the rotation of {n} workers' streams; this loader follows "
                             f"{W or 'none'} (num_workers={self.num_workers}, world size {self.world_size}, "
                             f"batch_size={self.batch_size}): resume it with one rank and batch_size=None")
        lengths = [len(s) for s in worker_streams(self.dataset.plan.epoch(self.epoch), W)]
        for w, (p, length) in enumerate(zip(streams, lengths)):
            if p > length:
                raise StateError(f"{source}: rotation.streams {streams}: stream {w} stands at sample {p} of "
                                 f"its {length} in epoch {self.epoch}: not a place this data's rotation can "
                                 "be at (a state of other data, edited or damaged)")
        if sum(streams) != self.position:
            raise StateError(f"{source}: the rotation's streams {streams} do not add up to its position "
                             f"{self.position}")
        self._rot = {"epoch": self.epoch, "streams": streams, "next": nxt}

    def extra_place(self) -> Dict[str, Any]:
        """Under the rotation: ``{"rotation": {"workers", "streams", "next"}}``, in each state and commit."""
        return {"rotation": self._rotation()} if self.rotation_workers else {}

    def adopt_place(self, place: Dict[str, Any], source: Optional[str]) -> None:
        """A state's or a commit's rotation (refused where this loader cannot stand at it), or a
        :meth:`mark` of this loader's (``source`` None).
        """
        rot = place.get("rotation")
        if source is None:
            self._rot = None if rot is None else {"epoch": self.epoch, "streams": list(rot["streams"]),
                                                  "next": int(rot["next"])}
            return
        self._set_rotation(rot, source)

    def skip_steps(self, k: int, reason: str = "") -> Dict[str, Any]:
        """As :meth:`ShardLoader.skip_steps`; refused under the rotation (its steps are known once read)."""
        k = check_steps(k)
        if self.rotation_workers and k:
            raise StateError(f"skip_steps({k}): under webdataset's rotation of {self.rotation_workers} "
                             "filtered streams the items ahead are known only once read; iterate past them")
        return super().skip_steps(k, reason)

    def __iter__(self) -> Iterator[Any]:
        self._take_world()
        self._world_open = False
        if not self.rotation_workers:  # (ShardLoader.__iter__ starts a new pass where one is due)
            src = super().__iter__()
            return self._stream_stage(src) if self._stream_stage is not None else src
        return self._rotate(self.rotation_workers)

    def _rotate(self, W: int) -> Iterator[Any]:
        self._begin_iter()
        epoch = self.epoch
        if self.preempted:
            return
        rot = self._rotation()
        pos, turn = rot["streams"], rot["next"]
        ep = self.dataset.plan.epoch(epoch)
        check = bool(self.dataset.empty_check and getattr(self.dataset, "empty_worker_check", True))
        for w in range(W):
            self.dataset.steps_of(StreamLayout(W, w, self._chunk, check=check), epoch)  # webdataset's empty check
        lengths = [len(s) for s in worker_streams(ep, W)]
        shares = _shares(self.num_workers, W)
        self._absorb(self.dataset.take_events())  # this process's events so far are this loader's
        live = [pos[w] < lengths[w] for w in range(W)]
        subs = [self.sub_loader(StreamLayout(W, w, self._chunk), shares[w], pos[w]) if live[w] else None
                for w in range(W)]
        raw: List[Any] = [None] * W
        items: List[Any] = [None] * W
        w = turn
        left = False
        try:
            while any(live):
                if not live[w]:
                    w = (w + 1) % W
                    continue
                sub = subs[w]
                assert sub is not None  # live
                if raw[w] is None:
                    raw[w] = iter(sub)
                    items[w] = self._stream_stage(raw[w]) if self._stream_stage is not None else raw[w]
                before = sub.samples_total
                try:
                    item = next(items[w])
                except StopIteration:
                    live[w], pos[w] = False, lengths[w]
                    w = (w + 1) % W
                    continue
                if self.preempted:  # a step boundary: this item is not handed out
                    return
                pos[w] = lengths[w] if sub.epoch != epoch else sub.position
                if pos[w] >= lengths[w]:
                    live[w] = False
                self.samples_total += sub.samples_total - before
                self.batch_info, self.sample_is_pad = sub.batch_info, sub.sample_is_pad
                w = (w + 1) % W
                self._rot = {"epoch": epoch, "streams": list(pos), "next": w}
                self.position = sum(pos)
                if not any(live):
                    self._end_epoch()  # the last item of the epoch: the state is the next epoch's start
                self._advanced, self._pinned = True, False
                self._handed += 1
                yield item
        except GeneratorExit:
            left = True
            raise
        finally:
            if not left:  # ended: the next iter() goes on from here (see ShardLoader._begin_iter)
                self._advanced, self._origin = False, None
            for it in items + raw:
                if it is not None and hasattr(it, "close"):
                    it.close()  # its DataLoader's workers stop now
        if self.epoch == epoch:
            self._end_epoch()
