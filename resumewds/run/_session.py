"""A loader's journal session: open and resolve the resume point (under this rank's lock, once for
all ranks with a process group), check the run's configuration, buffer the events and shard state
changes the workers report, count what each step consumed, and commit.  The loader applies what
:meth:`JournalSession.open` returns (:class:`Resumed`).  The journal module is imported only when
a journal is used.

Example:
    >>> s = JournalSession(None)      # no journal: only the consumption count
    >>> s.consume(0, 0, 5); s.consumed_now()
    {(0, 0): 5}
    >>> s.journal is None
    True
"""

from __future__ import annotations

import logging
import pickle
import time
from dataclasses import dataclass, field
from typing import Any, Dict, List, Optional, Sequence, Set, Tuple, Union

from ..errors import JournalError, ResumeWDSError
from ..events import EventKind, unjournaled_kinds
from ..fetch import is_remote_url
from ..plan import resolve_partitions
from ..redact import redact_url

log = logging.getLogger("resumewds")

__all__ = ["JournalSession", "LoaderPlace", "Resumed", "StepConsumption", "process_group"]


@dataclass
class LoaderPlace:
    """Where a loader stands, as a session needs it: its rank, world, nodes, the data set's ``config``
    and the loader's ``layout`` (batch_size, world_size, num_workers, remainder)."""

    rank: int
    world_size: int
    nodes: int
    config: Dict[str, Any]
    layout: Dict[str, Any]


@dataclass
class Resumed:
    """What opening a journal found: where the loader resumes (``epoch`` None: no commit), the
    configuration after adopting the run's partitions, and the shards recorded as failed."""

    config: Dict[str, Any]
    epoch: Optional[int] = None
    position: int = 0
    steps_done: int = 0
    samples_total: int = 0
    failed_urls: Set[str] = field(default_factory=set)
    place: Optional[Dict[str, Any]] = None  # the commit's place beyond (epoch, position)

_UNJOURNALED = unjournaled_kinds()  # per-open chatter: shard effects only, no event rows


class StepConsumption:
    """A step's samples counted as consumed one by one as they are handed out.

    A commit between two samples of a step then records only the samples delivered so far.
    ``meta["sample_shards"]`` names each delivered sample's shard (None: padding).  With ``by_slot``
    (one rank) and ``meta["slot_shards"]``, a sample also counts the samples a stage dropped before it
    (the position passed them); otherwise a step's other reads count with its last sample.  Without
    ``sample_shards`` the whole step counts at once.

    Example:
        >>> s = JournalSession(None)
        >>> c = s.consume_step(0, {"shards": {3: 2, 4: 1}, "sample_shards": [3, 4]})
        >>> c.deliver(0, False); s.consumed_now()
        {(3, 0): 1}
        >>> c.deliver(1, True); s.consumed_now()
        {(3, 0): 2, (4, 0): 1}
        >>> s = JournalSession(None)                  # slot 0 (shard 3) dropped by a select
        >>> c = s.consume_step(0, {"shards": {3: 2, 4: 1}, "sample_shards": [3, 4], "slot_index": [1, 2],
        ...                        "slot_shards": [3, 3, 4]}, by_slot=True)
        >>> c.deliver(0, False); s.consumed_now()
        {(3, 0): 2}
    """

    __slots__ = ("session", "epoch", "owed", "of", "slots", "slot_of", "passed")

    def __init__(self, session: JournalSession, epoch: int, meta: Dict[str, Any], by_slot: bool = False):
        self.session, self.epoch = session, epoch
        self.owed: Dict[int, int] = dict(meta.get("shards") or {})
        self.of: Optional[List[Optional[int]]] = meta.get("sample_shards")
        self.slots: Optional[List[Optional[int]]] = meta.get("slot_shards") if by_slot else None
        self.slot_of: List[int] = meta.get("slot_index") or []
        self.passed = 0  # the slots counted so far (with ``slots``)
        if self.of is None:
            self.deliver(0, True)

    def deliver(self, i: int, last: bool) -> None:
        """Sample ``i`` of the step is handed out (``last``: and the step is done)."""
        owed = self.owed
        if not owed:
            return
        if last:
            for si, n in owed.items():
                if n:
                    self.session.consume(si, self.epoch, n)
            owed.clear()
            return
        if self.slots is not None and i < len(self.slot_of):  # every slot up to this sample's
            upto = self.slot_of[i] + 1
            for shard in self.slots[self.passed:upto]:
                if shard is not None and owed.get(shard):
                    self.session.consume(shard, self.epoch, 1)
                    owed[shard] -= 1
            self.passed = max(self.passed, upto)
            return
        one = self.of[i] if self.of is not None and i < len(self.of) else None
        if one is not None and owed.get(one):
            self.session.consume(one, self.epoch, 1)
            owed[one] -= 1


class JournalSession:
    """One loader's journal (``path`` None: only the consumption count is kept)."""

    def __init__(self, path: Optional[str]):
        self.path = path
        self.journal: Any = None
        self._consumed: Dict[Tuple[int, int], int] = {}
        self._events: List[Dict[str, Any]] = []
        self._shard_updates: List[Dict[str, Any]] = []
        self._last_stats_commit = 0.0
        self._last_commit_epoch: Optional[int] = None

    # ---- what the steps report ------------------------------------------
    def consume(self, shard: int, epoch: int, n: int) -> None:
        """Count ``n`` samples of shard index ``shard`` delivered in ``epoch``."""
        key = (shard, epoch)
        self._consumed[key] = self._consumed.get(key, 0) + n

    def consume_step(self, epoch: int, meta: Dict[str, Any], by_slot: bool = False) -> StepConsumption:
        """The consumption of an unbatched step, counted as its samples are handed out
        (:class:`StepConsumption`)."""
        return StepConsumption(self, epoch, meta, by_slot)

    def consumed_now(self) -> Dict[Tuple[int, int], int]:
        """The consumption counted since the last commit: ``{(shard, epoch): n}``."""
        return dict(self._consumed)

    def set_consumed(self, consumed: Dict[Tuple[int, int], int]) -> None:
        """Count ``consumed`` as the consumption since the last commit (a loader that goes back to an
        earlier place takes back what it counted)."""
        self._consumed = {k: n for k, n in consumed.items() if n}

    def record(self, events: List[Dict[str, Any]]) -> None:
        """Buffer ``events`` (and the shard state changes they imply) for the journal."""
        if self.path is None or not events:
            return
        from ..journal import shard_updates_from_events  # lazy: a loader without a journal never needs it

        self._events.extend(e for e in events if e.get("kind") not in _UNJOURNALED)
        self._shard_updates.extend(shard_updates_from_events(events))
        if len(self._events) > 10000:  # no journal, or no commits: keep memory bounded
            del self._events[:-1000]
        if len(self._shard_updates) > 10000:
            del self._shard_updates[:-1000]

    def flush(self) -> None:
        """Write the buffered events and shard updates to the journal (if open)."""
        if self.journal is None:
            return
        if self._events:
            self.journal.record_events(self._events)
            self._events = []
        if self._shard_updates:
            self.journal.update_shards(self._shard_updates)
            self._shard_updates = []

    # ---- open / resume -------------------------------------------------------
    def open(self, dataset: Any, where: LoaderPlace, resume: Union[bool, int], sync: str) -> Resumed:
        """Open the journal for a loader of ``dataset`` at ``where`` and find where it resumes.

        The resume point is read under this rank's journal lock (two runs started together never both
        resume from the same commit), once for all ranks with a process group (:meth:`resolve_together`).

        Raises:
            JournalError: the journal holds commits and ``resume`` is False, is in use, or its
                configuration does not match.
        """
        from ..journal import Journal, resolve_resume  # lazy: a loader without a journal never needs it

        path = self.path
        assert path is not None
        step = None if resume is True else int(resume)
        resolved: Dict[str, Any] = {}

        def find_point() -> Optional[Dict[str, Any]]:
            resolved["done"] = True
            return self.resolve_together(where.rank, where.world_size, path, step, resolve_resume)

        try:
            j = Journal(path, rank=where.rank, world_size=where.world_size, synchronous=sync,
                        after_lock=None if resume is False else find_point)
        except BaseException:
            if resume is not False and not resolved and process_group(where.rank, where.world_size) is not None:
                # the lock failed on this rank: still take part in rank 0's
                # broadcast, so the other ranks are not left waiting for it
                try:
                    self.resolve_together(where.rank, where.world_size, path, step, resolve_resume)
                except Exception:
                    pass
            raise
        point = j.after_lock_result
        try:
            out = self._apply(dataset, where, j, point, resume)
        except BaseException:
            j.close()
            raise
        self.journal = j
        return out

    def _apply(self, dataset: Any, where: LoaderPlace, j: Any, point: Optional[Dict[str, Any]],
               resume: Union[bool, int]) -> Resumed:
        stored = j.config()
        if not stored and point is not None and where.rank != 0:  # a rank new to the run
            assert self.path is not None  # open() has one
            from ..journal import Journal  # lazy: a loader without a journal never needs it

            with Journal(self.path, rank=0, readonly=True) as j0:
                stored = j0.config()
        config = where.config
        if stored and getattr(dataset, "partitions", 1) is None:  # a resume keeps the run's partitions
            dataset.use_partitions(resolve_partitions(None, where.nodes, stored))
            config = dict(config, **dataset.config())
        if stored:  # and the run's worker split (resumewds.wds._shardsplit), whatever num_workers
            config = {k: v for k, v in config.items() if k != "worker_split"}
            if stored.get("worker_split"):
                config["worker_split"] = stored["worker_split"]
        # a dataset may declare keys that can change here (a mixture's new phase)
        evolves = getattr(dataset, "compatible_config", None)
        extra = tuple(evolves(j.config(), point)) if evolves is not None else ()
        j.check_config({**config, **where.layout},  # what the journal stores and a resume agrees with
                       compatible_keys=("batch_size", "world_size", "num_workers", "rank") + extra)
        remote = [{"url": sh.url} for sh in dataset.manifest.shards
                  if is_remote_url(sh.url)]
        if remote and j.latest_commit() is None:
            j.update_shards(remote)  # every remote shard starts as 'pending'
        if point is None and resume is False and j.latest_commit() is not None:
            raise JournalError(f"{self.path}: journal already holds commits; pass resume=True to "
                               "continue that run, or use a new journal path")
        out = Resumed(config=config)
        if point is not None:
            out.epoch = int(point["epoch"])
            out.position = int(point["position"])
            out.steps_done = int(point["step"]) + 1
            out.place = point.get("place")
            per_rank = point.get("samples_total_per_rank") or []
            mine = per_rank[where.rank] if where.rank < len(per_rank) else None
            if point.get("world_size", 1) == where.world_size and mine is not None:
                out.samples_total = int(mine)
            elif where.world_size == 1:
                out.samples_total = int(point.get("samples_total") or 0)
            else:
                out.samples_total = 0
            detail = {"step": point["step"], "epoch": out.epoch, "position": out.position,
                      "world_size": where.world_size, "num_workers": where.layout.get("num_workers"),
                      "nodes": where.nodes, "partitions": dataset.plan_partitions}
            if point.get("skipped_incomplete"):
                detail["skipped_incomplete"] = point["skipped_incomplete"]
            j.record_events([dict(kind=EventKind.RESUME.value, **detail)])
            log.info("resuming %s at step %s: epoch %d, position %d", self.path, point["step"],
                     out.epoch, out.position)
        failed = set(j.shards_in_state("failed"))  # recorded redacted (resumewds.redact)
        out.failed_urls = {s.url for s in dataset.manifest.shards if redact_url(s.url) in failed}
        return out

    def resolve_together(self, rank: int, world_size: int, path: str, step: Optional[int], resolve: Any
                         ) -> Optional[Dict[str, Any]]:
        """Find the resume point once for all ranks, before any rank opens its journal.

        With a process group rank 0 resolves and broadcasts the answer (or its error): every rank starts
        from the same point, the run's files are read once, and no rank creates its file while rank 0
        still reads them (a fresh rank file next to a missing rank 0 file reads as a damaged run).
        Without one (ranks started by hand) each rank resolves on its own.
        """
        dist = process_group(rank, world_size)
        if dist is None:
            return resolve(path, step)
        payload: List[Any] = [None]
        err: Optional[BaseException] = None
        if rank == 0:
            try:
                payload[0] = (resolve(path, step), None)
            except Exception as exc:  # the other ranks must not wait for a broadcast forever
                err = exc
                try:  # our errors pickle with their type and fields
                    pickle.dumps(exc)
                    payload[0] = (None, exc)
                except Exception:
                    payload[0] = (None, JournalError(str(exc)))
        dist.broadcast_object_list(payload, src=0)
        if err is not None:
            raise err
        point, found = payload[0]
        if found is not None:
            if isinstance(found, ResumeWDSError) and found.args:  # same type, same fields
                found.args = (f"{found.args[0]} (found by rank 0)",)
            raise found
        return point

    # ---- commit / close ------------------------------------------------------
    def wants_stats(self, stats: Optional[bool] = None) -> bool:
        """Whether the next commit carries a stats snapshot (``None``: at most every 5 s)."""
        return (time.time() - self._last_stats_commit >= 5.0) if stats is None else bool(stats)

    def commit(self, step: int, *, epoch: int, position: int, world_size: int, batch_size: Optional[int],
               samples_total: int, shards: Sequence[Any], stats: Optional[Dict[str, Any]] = None,
               place: Optional[Dict[str, Any]] = None) -> None:
        """Record atomically the position after ``step`` (see ``WebLoader.commit``); ``shards``: the
        manifest's (consumption is recorded by url), ``stats``: a snapshot or None, ``place``: where the
        loader stands beyond ``(epoch, position)``."""
        if self.journal is None:
            raise JournalError("commit() needs a journal: WebLoader(..., journal='run.db')")
        if stats is not None:
            self._last_stats_commit = time.time()
        self.flush()
        consumed = {}
        for (si, ep), n in self._consumed.items():
            consumed[(shards[si].url, ep)] = (n, int(shards[si].samples or 0))
        # the consumption table is folded in every few commits, and at once
        # when an epoch ended (its shards are then complete)
        epoch_done = self._last_commit_epoch is not None and epoch != self._last_commit_epoch
        self.journal.commit(step, epoch=epoch, position=position, consumed=consumed,
                            world_size=world_size, batch_size=batch_size,
                            samples_total=samples_total, stats=stats, materialize=epoch_done, place=place)
        self._last_commit_epoch = epoch
        self._consumed.clear()

    def close(self) -> None:
        """Flush what is buffered and close the journal (idempotent)."""
        if self.journal is not None:
            try:
                self.flush()
            finally:
                self.journal.close()
                self.journal = None


def process_group(rank: int, world_size: int) -> Any:
    """torch.distributed, when its default group is exactly this world."""
    if world_size < 2:
        return None
    try:
        import torch.distributed as dist

        if (dist.is_available() and dist.is_initialized()
                and (dist.get_rank(), dist.get_world_size()) == (rank, world_size)):
            return dist
    except Exception:  # pragma: no cover - torch without distributed
        pass
    return None
