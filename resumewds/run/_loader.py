"""ShardLoader: torch's DataLoader with an exact, layout-independent resume (the engine's loader).

The main process owns the position.  Workers produce whole steps (step numbers are a pure function
of the position, :mod:`resumewds.plan`); the DataLoader returns them round-robin, the global order,
and the loader checks every step number it receives (an out-of-order delivery is an error).
``state_dict()`` is ``{epoch, position}`` plus the configuration it must agree with, and loads into
any ``num_workers`` or world size.  :class:`resumewds.WebLoader` is this class with webdataset's
loader face (:mod:`resumewds.wds.loaderchain`), which also uses the hooks :class:`SplitPolicy`,
:meth:`ShardLoader.extra_place` / :meth:`ShardLoader.adopt_place`, :meth:`ShardLoader.mark` /
:meth:`ShardLoader.rewind` / :meth:`ShardLoader.hold_place` and :meth:`ShardLoader.sub_loader`.

Example:
    >>> import resumewds as rw
    >>> ds = rw.WebDataset("data/shard-{000000..000003}.tar", seed=7, shuffle=True).map(lambda s: s["__key__"])
    >>> loader = rw.WebLoader(ds, batch_size=4)
    >>> it = iter(loader)
    >>> first = next(it)
    >>> state = loader.state_dict()
    >>> fresh = rw.WebLoader(ds, batch_size=4)   # any num_workers, another process...
    >>> fresh.load_state_dict(state)
    >>> next(iter(fresh)) == next(it)            # the batch `loader` gives next
    True
"""

from __future__ import annotations

import contextlib
import logging
import time
from typing import Any, Dict, Iterator, List, NamedTuple, Optional, Protocol, Sequence, Tuple, Union

from torch.utils.data import DataLoader

from ..errors import ResumeWDSError, StateError, naming
from ..events import EventKind, event_record, setup_logging
from ..plan import Layout, detect_world, late_world, resolve_partitions
from ..read import ShardDataset
from ..stages import default_collate, empty_epoch_error, hide_positions
from . import _skipping as skipping
from ._framecheck import warn_unsaved_loader
from ._preemption import _LIVE_FLAGS, Preemptible, _blocked_for_start, _preempt_signals, _stop_flag
from ._session import JournalSession, LoaderPlace
from ._shmbatch import BytesRing, Packed, ring_for
from ._statecheck import check_seal, seal
from ._stats import Stats, flat_scalars
from ._watchdog import WorkerWatchdog, frozen_for_fork, stall_limit
from ._workers import _HANDLER_STOP, BatchInfo, EmptyBatch, _EpochSource, _pin_memory, _SampleLayout, _WorkerFailure

__all__ = ["STATE_FORMAT", "ShardLoader", "SplitPolicy"]

log = logging.getLogger("resumewds")

STATE_FORMAT = "resumewds.loader"
STATE_VERSION = 1
_ORDER_KEYS = ("manifest", "seed", "shuffle", "shuffle_window", "samples", "partitions")
_UNSET: Any = object()


def _identity(x: Any) -> Any:
    return x


def _auto_partitions(ds: ShardDataset) -> bool:
    return getattr(ds, "partitions", 1) is None


class SplitPolicy(Protocol):
    """Another split of an epoch between DataLoader workers than the engine's split of the sample
    sequence: ``W`` workers (recorded as ``config["worker_split"]``, kept whatever ``num_workers``)
    and its layout.  webdataset's shard split is one (:data:`resumewds.wds._shardsplit.SHARD_SPLIT`).

    Example:
        >>> class EveryOther:                                   # doctest: +SKIP
        ...     def workers(self, dataset, num_workers, world_size, remainder, mode=None):
        ...         return 2 if num_workers >= 2 and world_size == 1 else 0
        ...     def layout(self, dataset, workers, world_size, batch_size, remainder, chunk):
        ...         return MyEpochLayout(workers, batch_size or 1)   # an EpochLayout
        >>> class MyLoader(ShardLoader):                        # doctest: +SKIP
        ...     split_policy = EveryOther()
    """

    def workers(self, dataset: Any, num_workers: int, world_size: int, remainder: str,
                mode: Optional[str] = None) -> int:
        """``W`` of the split a new loader follows (0: the engine's split); ``mode``: the
        loader's ``worker_split=``."""

    def layout(self, dataset: Any, workers: int, world_size: int, batch_size: Optional[int], remainder: str,
               chunk: int) -> Any:
        """The loader's layout (an :class:`~resumewds.plan.EpochLayout`) of the split over ``workers``;
        raises :class:`~resumewds.errors.StateError` where it cannot go on."""


class _StepAt(NamedTuple):
    """Where a step is: epoch, index, the iteration's start, the epoch's total, layout, last step."""

    epoch: int
    step: int
    start: int
    total: int
    layout: Any
    last: bool


class _EpochRun:
    """One iteration's DataLoader, iterator, watchdog, ring and workers' stop flag."""

    def __init__(self, dl: Any, it: Any, watch: WorkerWatchdog, ring: Optional[BytesRing],
                 stopping: Any) -> None:
        self.dl, self.it, self.watch, self.ring, self.stopping = dl, it, watch, ring, stopping
        self.nxt = watch.next_of()
        # torch pins a batch only where it is allowed to (an accelerator is
        # present): the iterator says whether it does
        self.pin = bool(getattr(it, "_pin_memory", False)) and ring is not None

    def close(self) -> None:
        if self.stopping is not None:
            self.stopping.value = 1  # from here on a SIGTERM (torch's shutdown) ends a worker
            if self.stopping in _LIVE_FLAGS:
                _LIVE_FLAGS.remove(self.stopping)
        self.watch.close()  # kills stopped workers: torch's shutdown would wait for them
        self.it = self.nxt = self.watch = None  # type: ignore[assignment]
        if self.ring is not None:
            self.dl = None  # shuts the workers down (they hold their own mapping anyway)
            self.ring.close()


class ShardLoader(Preemptible):
    """A resumable loader over a :class:`~resumewds.dataset.WebDataset`.

    Each ``iter(loader)`` runs the rest of the current epoch; when an epoch's last batch is handed
    out, ``loader.epoch`` advances and the position returns to 0.

    Args:
        dataset: the WebDataset.
        batch_size: samples per batch per rank; None yields single samples.  If the dataset was
            ``.batched(n)``, leave this None (or n).
        num_workers: DataLoader worker processes (a resume works across counts).
        worker_split: ``"shards"``, ``"samples"``, or None: the data set's; the engine's loader
            alone (no :attr:`split_policy`) knows ``"samples"`` only.
        collate_fn: how to collate a batch (default: torch's default_collate).
        convert: with ``batch_size=None``, each item through torch's ``default_convert`` as a
            DataLoader does; None (default): when no ``collate_fn`` is given.
        rank, world_size: override torch.distributed / RANK / WORLD_SIZE (neither given and a world
            of 1 found: looked up again at the first len() or iteration, see docs/FRAMEWORKS.md).
        nodes: groups of ranks that share a cache (default: from LOCAL_WORLD_SIZE).
        remainder: the final short step of an epoch: ``"keep"``, ``"pad"`` or ``"drop"`` (see
            :mod:`resumewds.plan`); every rank yields the same number of batches.
        journal: path of a SQLite journal; ``commit(step)`` records positions there.
        resume: with a journal: True resumes at the latest complete commit, an int at that step's
            commit, False starts fresh (and refuses a journal that holds commits).
        verbose: log fetches, retries, repairs, evictions and resumes (also ``RESUMEWDS_VERBOSE=1``).
        chunk_size: samples per worker task when ``batch_size`` is None.
        transport: ``"auto"`` (default): with ``fork`` workers, bytes, small tensors and (default
            collation) large batch tensors travel through shared memory (:mod:`resumewds.run._shmbatch`;
            the batches are equal either way, a tensor over a slot is not resizable in place);
            ``"queue"``: everything pickled through torch's queue.
        preempt: stop at the next step boundary on a signal (False: none; True: SIGTERM and SIGUSR1;
            or a list).  ``loader.preempted`` becomes True and the current ``for batch in loader``
            ends before its next batch; checkpoint, ``commit`` and exit.  A second signal runs the
            previous handler.  Workers ignore these signals.  See :meth:`request_stop`.
        stall_timeout: seconds a worker may stay stopped (SIGSTOP) while the loader waits for it;
            then it is killed and :class:`~resumewds.run._watchdog.WorkerStallError` names it.
            None: ``RESUMEWDS_WORKER_STALL``, else 60; 0: no limit.
        **dataloader_kwargs: passed to torch's DataLoader (pin_memory, timeout, prefetch_factor, ...).

    Samples a stage or ``on_error="skip"`` removes leave their batch (counted as ``filtered`` /
    ``skipped_samples``); a step that lost every sample still yields an :class:`EmptyBatch` on every
    rank (DDP lock step).  ``loader.batch_info`` describes the last batch, pad mask included.  A shard
    that fails under ``on_error="raise"`` is recorded as ``failed`` in the journal before the error
    propagates; an error raised in a worker reaches the caller as the same exception object.

    Example:
        >>> ds = rw.WebDataset("data/shard-{000000..000003}.tar").decode("rgb8").to_tuple("jpg;png", "cls")
        >>> loader = rw.WebLoader(ds, batch_size=8, journal="run.db", resume=True)
        >>> for step, (images, labels) in enumerate(loader, start=loader.steps_done):
        ...     loader.commit(step)        # after the training step (and checkpoint) of `step`
        >>> loader.steps_done, tuple(images.shape)
        (4, (8, 16, 16, 3))
        >>> loader.close()
    """

    def __init__(self, dataset: ShardDataset, batch_size: Optional[int] = _UNSET, num_workers: int = 0, *,
                 collate_fn: Any = None, rank: Optional[int] = None, world_size: Optional[int] = None,
                 remainder: str = "keep", journal: Optional[str] = None,
                 resume: Union[bool, int] = False, verbose: bool = False, chunk_size: int = 64,
                 journal_sync: str = "NORMAL", nodes: Optional[int] = None,
                 preempt: Union[bool, Sequence[int]] = False, transport: str = "auto",
                 stall_timeout: Optional[float] = None, worker_split: Optional[str] = None,
                 convert: Optional[bool] = None, **dataloader_kwargs: Any):
        if not (isinstance(dataset, ShardDataset) or hasattr(dataset, "iter_steps")):  # or a MixedDataset
            raise TypeError(f"WebLoader needs a resumewds.WebDataset, got {type(dataset).__name__}")
        for bad in ("shuffle", "sampler", "batch_sampler"):
            if dataloader_kwargs.get(bad):
                raise ValueError(f"{bad}= is not supported: the order comes from the dataset's seed "
                                 "and shuffle settings")
            dataloader_kwargs.pop(bad, None)
        if dataloader_kwargs.pop("drop_last", False):
            remainder = "drop"
        setup_logging(verbose)
        if transport not in ("auto", "queue"):
            raise ValueError(f"transport must be 'auto' or 'queue', got {transport!r}")
        self.transport = transport
        self.stall_timeout = stall_limit(stall_timeout)
        self.dataset = dataset
        if dataset.batch_size is not None:
            if batch_size not in (_UNSET, None, dataset.batch_size):
                raise ValueError(f"dataset is batched({dataset.batch_size}) but WebLoader got "
                                 f"batch_size={batch_size}")
            self.batch_size: Optional[int] = dataset.batch_size
            self._collate = True
            self._collate_fn = dataset.collate_fn
        else:
            self.batch_size = 1 if batch_size is _UNSET else batch_size
            self._collate = self.batch_size is not None
            # handed to the workers with each epoch; the dataset is not modified
            self._collate_fn = (collate_fn or default_collate) if self._collate else None
        # batch_size=None asked for, and no collate_fn: each item goes through torch's
        # default_convert, as in a DataLoader (and webdataset's WebLoader) with automatic batching off
        #: whether each item goes through torch's ``default_convert`` (``convert=``)
        self.convert = (batch_size is None and collate_fn is None) if convert is None else bool(convert)
        if self.batch_size is not None and int(self.batch_size) < 1:
            raise ValueError(f"batch_size must be >= 1 or None, got {self.batch_size}")
        self.num_workers = int(num_workers)
        self.remainder, self._chunk = remainder, int(self.batch_size or chunk_size)
        self._bind_world(detect_world(rank, world_size, nodes=nodes, cache_dirs=dataset.cache_dirs()))
        # no world given nor found: looked up again until the first iteration (world.late_world)
        self._world_open = rank is None and world_size is None and self.world_size == 1
        dataset.use_partitions(resolve_partitions(dataset.partitions, self.world.nodes))
        self.dataloader_kwargs = dataloader_kwargs
        self.epoch = 0
        self.position = 0
        self.samples_total = 0
        self.steps_done = 0
        self.stats_ = Stats()
        # webdataset's new pass (see :meth:`_begin_iter`): an iter() handed an item out and did
        # not finish, and whether a state was given away since that item
        self._advanced = False
        self._pinned = False
        self._origin: Any = None  # a place given (a resume), while its first iter() may be left
        self._handed = 0  # items the current iter() handed out
        self._journal_place: Dict[str, Any] = {}  # the resumed commit's place beyond (epoch, position)
        self._session = JournalSession(journal)  # the journal: open/resume, events, commits
        #: the last batch handed out (see :class:`BatchInfo`), None before the first;
        #: with ``batch_size=None``, the chunk the last sample came from
        self.batch_info: Optional[BatchInfo] = None
        #: with ``batch_size=None``: whether the sample just yielded is padding
        #: (visible even after ``to_tuple``, which drops ``__pad__``)
        self.sample_is_pad = False
        self._failed_urls: set = set()  # recorded failed; a read clears it (``recovered``)
        self._epoch_failed: Dict[str, str] = {}  # skipped this epoch: the end-of-epoch warning
        self._epoch_sample_skips: List[str] = []  # samples a stage's handler skipped this epoch
        #: True once a preemption signal arrived (or :meth:`request_stop` was called)
        self.preempted = False
        #: the signal number that set ``preempted`` (None: none, or request_stop)
        self.preempt_signal: Optional[int] = None
        self._old_handlers: Dict[int, Any] = {}
        self._preempt_signals = _preempt_signals(preempt)
        # resolve + index in the main process, once, before any worker starts
        self.config = dataset.config()
        policy = self.split_policy
        if policy is None and worker_split not in (None, "samples"):
            raise ValueError(f"worker_split={worker_split!r}: the engine's loader splits the sample sequence "
                             "between its workers ('samples'); resumewds.WebLoader also follows webdataset's "
                             "split ('shards')")
        self._use_split(policy.workers(dataset, self.num_workers, self.world_size, remainder, worker_split)
                        if policy is not None else 0)
        self._absorb(dataset.take_events())
        if journal is not None:
            self._open_journal(journal, resume, journal_sync)
        self._install_preemption()

    #: another split of an epoch between DataLoader workers than the engine's split of the sample
    #: sequence (None: that one only); :class:`resumewds.WebLoader` gives webdataset's shard split
    split_policy: Optional[SplitPolicy] = None

    # ---- journal (resumewds/run/_session.py) --------------------------------------
    @property
    def session(self) -> JournalSession:
        """The loader's :class:`~resumewds.run._session.JournalSession`: its journal, buffered events and the
        consumption counted since the last commit.

        Example:
            >>> loader = rw.WebLoader(rw.WebDataset("data/shard-000000.tar"), batch_size=4)
            >>> first = next(iter(loader)); loader.session.consumed_now()
            {(0, 0): 4}
        """
        return self._session

    @property
    def journal(self) -> Any:
        """The open :class:`resumewds.journal.Journal` (None without one)."""
        return self._session.journal

    @journal.setter
    def journal(self, value: Any) -> None:  # loaderchain hands a base loader's journal over
        self._session.journal = value

    @property
    def journal_path(self) -> Optional[str]:
        """The journal's path (None without one)."""
        return self._session.path

    @journal_path.setter
    def journal_path(self, value: Optional[str]) -> None:
        self._session.path = value

    def _place(self) -> LoaderPlace:
        return LoaderPlace(rank=self.rank, world_size=self.world_size, nodes=self.world.nodes,
                           config=dict(self.config),
                           layout={"batch_size": self.batch_size, "world_size": self.world_size,
                                   "num_workers": self.num_workers, "remainder": self.remainder})

    def _open_journal(self, path: str, resume: Union[bool, int], sync: str) -> None:
        found = self._session.open(self.dataset, self._place(), resume, sync)
        self.config = found.config
        self._use_split(int(found.config.get("worker_split") or 0),  # the run's split (session adopts it)
                        kept=found.epoch is not None)
        if found.epoch is not None:
            self.epoch, self.position = found.epoch, found.position
            self.steps_done, self.samples_total = found.steps_done, found.samples_total
        self._failed_urls.update(found.failed_urls)
        self._journal_place = dict(found.place or {})
        if found.epoch is not None:
            self.adopt_place(self._journal_place, f"the commit of step {self.steps_done - 1} in {path}")
            self._given()

    @property
    def resumed_place(self) -> Optional[Dict[str, Any]]:
        """While the loader stands at a place it was given and has not iterated since: what the journal
        commit it resumed at recorded beyond ``(epoch, position)`` (``commit(step, place=...)``); else None.

        Example:
            >>> loader = rw.WebLoader(rw.WebDataset("data/shard-000000.tar"), batch_size=4,
            ...                       journal="run.db")
            >>> for step, batch in enumerate(loader):
            ...     loader.commit(step, place={"mine": step})
            >>> loader.close()
            >>> again = rw.WebLoader(rw.WebDataset("data/shard-000000.tar"), batch_size=4,
            ...                      journal="run.db", resume=True)
            >>> again.resumed_place
            {'mine': 1}
            >>> again.close()
        """
        return dict(self._journal_place) if self._origin is not None else None

    # ---- the place hooks: what a subclass records beyond (epoch, position) ------------
    def extra_place(self) -> Dict[str, Any]:
        """Hook: where this loader stands beyond ``(epoch, position)``, as JSON-able fields added to
        :meth:`state_dict` and to each commit's place (and kept by :meth:`mark`).

        Example:
            >>> class Counting(ShardLoader):                          # doctest: +SKIP
            ...     def extra_place(self): return {"seen": self.seen}
            ...     def adopt_place(self, place, source): self.seen = place.get("seen", 0)
        """
        return {}

    def adopt_place(self, place: Dict[str, Any], source: Optional[str]) -> None:
        """Hook: stand at ``place``'s fields beyond ``(epoch, position)`` (a loaded state, a journal
        commit's place, or, ``source`` None, a :meth:`mark`); raise :class:`~resumewds.errors.StateError`
        naming ``source`` for a place it cannot stand at.
        """

    def commit(self, step: int, stats: Optional[bool] = None, place: Optional[Dict[str, Any]] = None) -> None:
        """Record atomically, in the journal, the position after ``step``.

        Call it after the training step that consumed the last batch (ideally right after saving the
        model checkpoint for that step).  A commit that returned survives kill -9.

        Args:
            step: the training step (any increasing int; ``resume=S`` finds it).
            stats: include a stats snapshot (default: at most every 5 s).
            place: JSON-able fields of a wrapper's own progress, recorded with the commit (see
                :attr:`resumed_place`).

        Example:
            >>> loader.commit(41)                                      # doctest: +SKIP
        """
        place = {**self.extra_place(), **(place or {})}
        self._session.commit(step, epoch=self.epoch, position=self.position, world_size=self.world_size,
                             batch_size=self.batch_size, samples_total=self.samples_total,
                             shards=self.dataset.manifest.shards,
                             stats=self.stats() if self._session.wants_stats(stats) else None,
                             place=place or None)
        self.steps_done = step + 1
        self._pinned = True

    def skip_steps(self, k: int, reason: str = "") -> Dict[str, Any]:
        """Skip the data of the next ``k`` steps on purpose (loss-spike recovery).

        Call it between passes, typically right after resuming at the step of the checkpoint you rewound
        to.  The position moves past the samples of the next ``k`` steps (crossing epoch ends) without
        reading them, ``steps_done`` grows by ``k``, and with a journal the skip is committed at once with
        a ``skip_steps`` event.  The same at any worker count and world size: every rank calls it with
        the same ``k``.

        Returns:
            ``{"first_step", "steps", "from": [epoch, position], "to": [...], "reason"}``.

        Raises:
            TypeError: ``k`` is not an int.
            ValueError: ``k`` is negative, or crosses more than
                :data:`resumewds.run._skipping.MAX_WALKED_EPOCHS` epochs whose steps differ.

        Example:
            >>> loader = rw.WebLoader(ds, batch_size=32, journal="run.db", resume=999)  # doctest: +SKIP
            >>> loader.skip_steps(50, reason="loss spike at 1020")  # steps 1000..1049  # doctest: +SKIP
        """
        k = skipping.check_steps(k)
        plan = self.dataset.plan
        first = int(self.steps_done)
        before = [int(self.epoch), int(self.position)]
        epoch, position = skipping.advance(self.layout, lambda e: len(plan.epoch(e)), before[0], before[1], k,
                                           layout_of=self._layout_of, same_epochs=not hasattr(self.layout, "bind")
                                           and bool(getattr(plan, "same_epochs", False)))
        detail: Dict[str, Any] = {"first_step": first, "steps": int(k), "from": before,
                                  "to": [epoch, position], "reason": reason}
        if k:
            self.epoch, self.position = epoch, position
            self._absorb([event_record(EventKind.SKIP_STEPS, "", detail)])
            if self.journal is not None:
                self.commit(first + int(k) - 1)  # durable: a crash now resumes after the skip
            else:
                self.steps_done = first + int(k)
            log.info("skipped steps %d..%d: epoch %d position %d -> epoch %d position %d", first,
                     first + int(k) - 1, before[0], before[1], epoch, position)
        self._given()  # a place given: the next iter() starts there
        return detail

    def _flush_journal(self) -> None:
        self._session.flush()

    def _absorb(self, events: List[Dict[str, Any]]) -> None:
        if not events:
            return
        self.stats_.events(events)
        for e in events:
            if e.get("kind") in (EventKind.SKIP, EventKind.FAIL) and e.get("url"):
                self._failed_urls.add(e["url"])
                self._epoch_failed[e["url"]] = str(e.get("error", ""))
            elif e.get("kind") == "sample_skip":
                self._epoch_sample_skips.append(f"{e.get('key')} ({e.get('stage')}: {e.get('error')})")
        self._session.record(events)

    def _failed_now(self, exc: BaseException, events: List[Dict[str, Any]]) -> None:
        """An error ends the iteration: its events go to stats and, at once, to the journal."""
        try:
            self._absorb(events)
            self._flush_journal()
        except Exception as err:  # never hide the original error
            log.warning("could not record the failure in the journal: %s", err)

    def _recovered(self, url: str) -> None:
        """A shard recorded as failed delivered samples: it is not failed any more."""
        if url in self._failed_urls:
            self._failed_urls.discard(url)
            self._absorb([event_record(EventKind.RECOVERED, url, {})])

    # ---- state --------------------------------------------------------------
    def state_dict(self) -> Dict[str, Any]:
        """The loader's position, loadable into any loader over the same data: ``{"format", "version",
        "epoch", "position", "samples_total", "steps_done", "config", "batch_size", "world_size",
        "checksum"}`` and the fields of :meth:`extra_place`."""
        state = {"format": STATE_FORMAT, "version": STATE_VERSION, "epoch": self.epoch,
                 "position": self.position, "samples_total": self.samples_total,
                 "steps_done": self.steps_done, "config": dict(self.config),
                 "batch_size": self.batch_size, "world_size": self.world_size}
        state.update(self.extra_place())
        self._pinned = True
        return seal(state)

    get_state = state_dict

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Continue from ``state`` (from any num_workers / world size).

        Raises:
            StateError: not a resumewds state, newer than this version, changed after it was taken, or
                taken on different data or order settings.
        """
        if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
            raise StateError("not a resumewds loader state (missing format field)")
        if int(state.get("version", 0)) > STATE_VERSION:
            raise StateError(f"loader state version {state.get('version')} is newer than this resumewds")
        check_seal(state, "this loader state")
        cfg = state.get("config", {})
        if _auto_partitions(self.dataset):  # adopt the state's partitions
            self.dataset.use_partitions(int(cfg.get("partitions") or 1))
            self.config = self.dataset.config()
        if cfg.get("worker_split") or self._split_w:  # the state's split, ours (config may lack it)
            self._use_split(int(cfg.get("worker_split") or 0), kept=True)  # the state's, whatever num_workers
        diffs = [f"{k}: state has {cfg.get(k)!r}, loader has {self.config.get(k)!r}"
                 for k in _ORDER_KEYS if cfg.get(k) != self.config.get(k)]
        if diffs:
            raise StateError("loader state does not match this dataset: " + "; ".join(diffs))
        epoch, pos = int(state["epoch"]), int(state["position"])
        total = int(self.config["samples"])
        # past ``total``: inside the padding of batch_size=None, remainder="pad"
        limit = self.layout.end(total) if isinstance(self.layout, _SampleLayout) else total
        if not 0 <= pos <= max(total, limit):
            raise StateError(f"position {pos} outside an epoch of {self.config['samples']} samples")
        self.epoch, self.position = epoch, pos
        self.samples_total = int(state.get("samples_total", 0))
        self.steps_done = int(state.get("steps_done", 0))
        self.adopt_place(state, "this state")
        self._given()
        log.info("resuming from a state dict: epoch %d, position %d", epoch, pos)
        self._absorb([{"kind": EventKind.RESUME.value, "epoch": epoch, "position": pos,
                       "ts": time.time()}])

    set_state = load_state_dict

    def stats(self) -> Dict[str, Any]:
        """Counters and rates aggregated over all workers (fields: :mod:`resumewds.run`)."""
        s = self.stats_.snapshot()
        s.update(epoch=self.epoch, position=self.position, samples_total=self.samples_total,
                 rank=self.rank, world_size=self.world_size, num_workers=self.num_workers)
        mixture = getattr(self.dataset, "mixture_stats", None)  # a MixedDataset: per-source proportions
        if mixture is not None:
            s["mixture"] = mixture(self.epoch, self.position)
        return s

    def to_tensorboard(self, writer: Any, step: Optional[int] = None, prefix: str = "data/") -> None:
        """Write the numeric stats to a TensorBoard ``SummaryWriter`` (anything with ``add_scalar``) as
        ``prefix + name`` (:func:`resumewds.run._stats.flat_scalars`) at ``step`` (default: ``steps_done``)."""
        step = step if step is not None else self.steps_done
        for k, v in flat_scalars(self.stats()).items():
            writer.add_scalar(prefix + k, v, step)

    # ---- iteration ----------------------------------------------------------
    # DataLoader's attributes and a whole epoch's len(): the wing's WebLoader (resumewds.wds._loader_compat)

    def _end_epoch(self) -> None:
        failed, self._epoch_failed = self._epoch_failed, {}
        if failed:
            log.warning("epoch %d ended with %d shard(s) skipped after errors (on_error='skip'): %s",
                        self.epoch, len(failed), "; ".join(naming(u, e) for u, e in sorted(failed.items())))
        skips, self._epoch_sample_skips = self._epoch_sample_skips, []
        if skips:
            log.warning("epoch %d ended with %d sample(s) skipped by a stage's handler or their digest: %s%s",
                        self.epoch, len(skips), "; ".join(skips[:5]),
                        f"; ... ({len(skips) - 5} more)" if len(skips) > 5 else "")
        self.epoch += 1
        self.position = 0

    def end_epoch(self) -> None:
        """End the current epoch where the loader stands (webdataset's new pass, :meth:`_begin_iter`): the
        next ``iter()`` starts the next epoch.  Nothing happens at an epoch's start.

        Example:
            >>> loader.end_epoch()      # doctest: +SKIP
            >>> (loader.epoch, loader.position)   # doctest: +SKIP
            (1, 0)
        """
        if self.position:
            log.info("epoch %d ends at position %d: a new pass starts epoch %d", self.epoch, self.position,
                     self.epoch + 1)
            self._end_epoch()

    def _begin_iter(self) -> None:
        """webdataset's (and torch's) new pass: an ``iter()`` left mid-epoch is followed by the next
        epoch from its start, unless a state was given away since its last item (:meth:`state_dict`,
        :meth:`commit`: a run resumed from it continues there, so this one does too).  The first
        ``iter()`` after a place was given (a resume), left after its first item, is followed by that
        place again.  An ``iter()`` that ended (an error included) keeps its place."""
        origin, self._origin = self._origin, None
        handed, self._handed = self._handed, 0
        if self._advanced and not self._pinned and self.position:  # left mid-epoch (at an epoch's
            if origin is not None and handed == 1:  # end it ended, even if not asked for more)
                self.rewind(origin[0])
                self._session.set_consumed(origin[1])  # its samples are delivered (and counted) again
            else:
                self.end_epoch()
        elif not self._advanced:
            self._origin = origin  # nothing handed out from there yet
        self._advanced = False

    def _given(self) -> None:
        """A place was given to the loader (see :meth:`_begin_iter`)."""
        self._origin = (self.mark(), self._session.consumed_now())
        self._pinned, self._advanced = True, False

    def hold_place(self) -> None:
        """The next ``iter()`` continues where the loader stands, whatever the last one did.

        Example:
            >>> loader = rw.WebLoader(rw.WebDataset("data/shard-000000.tar"), batch_size=2)
            >>> first = next(iter(loader)); loader.hold_place()
            >>> loader.position, len(list(loader))
            (2, 3)
        """
        self._advanced = False
        self._origin = None

    def mark(self) -> Tuple[Any, ...]:
        """Where the loader stands, cheaply (its place and :meth:`extra_place`): :meth:`rewind`
        goes back there.  The consumption counted since is the session's (:attr:`session`).

        Example:
            >>> loader = rw.WebLoader(rw.WebDataset("data/shard-000000.tar"), batch_size=2)
            >>> here = loader.mark(); first = next(iter(loader))
            >>> loader.rewind(here); loader.position
            0
        """
        return (self.epoch, self.position, self.samples_total, self.extra_place())

    def rewind(self, mark: Tuple[Any, ...]) -> None:
        """Stand at ``mark`` (from :meth:`mark`) again: the next ``iter()`` starts there (see
        :meth:`hold_place`).

        Example:
            >>> loader = rw.WebLoader(rw.WebDataset("data/shard-000000.tar"), batch_size=2)
            >>> it = iter(loader); first = next(it); here = loader.mark(); second = next(it)
            >>> loader.rewind(here); loader.position
            2
        """
        self.epoch, self.position, self.samples_total = mark[0], mark[1], mark[2]
        self.adopt_place(mark[3], None)

    def use_dataset(self, dataset: Any) -> None:
        """Run over ``dataset`` instead, before any iteration: the same data and split in another order (a
        wrapper's ``.shuffle(n)`` compiled into the plan).

        Example:
            >>> from resumewds.stages import Stage
            >>> ds = rw.WebDataset("data/shard-{000000..000003}.tar", shardshuffle=False)
            >>> loader = rw.WebLoader(ds, batch_size=4)
            >>> loader.use_dataset(ds.with_stages([Stage("shuffle", "shuffle", n=100, initial=100)]))
            >>> loader.config["shuffle"] == "manifest_window"
            True
        """
        self.dataset = dataset
        self.config = dataset.config()
        self._use_split(self._split_w, kept=self._split_kept)

    @property
    def preempt_signals(self) -> Tuple[int, ...]:
        """The signals this loader stops on at a step boundary (``preempt=``; ``()``: none).

        Example:
            >>> rw.WebLoader(rw.WebDataset("data/shard-000000.tar"), batch_size=2).preempt_signals
            ()
        """
        return tuple(self._preempt_signals)

    def sub_loader(self, layout: Any, num_workers: int, position: int) -> ShardLoader:
        """A loader of ``layout``'s steps of this epoch from ``position``, run on this loader's behalf: one
        sample per item, its consumption and events in this loader's session and stats, its workers
        ignoring this loader's preemption signals (webdataset's worker rotation runs one per stream).

        Example:
            >>> loader = rw.WebLoader(rw.WebDataset("data/shard-000000.tar"), batch_size=None)
            >>> sub = loader.sub_loader(Layout(4), 0, 5)
            >>> [s["__key__"] for s in sub]
            ['s000000_000005', 's000000_000006', 's000000_000007']
        """
        sub = ShardLoader(self.dataset, None, num_workers, chunk_size=self._chunk, transport=self.transport,
                          stall_timeout=self.stall_timeout, rank=0, world_size=1, convert=self.convert,
                          **self.dataloader_kwargs)
        sub.layout = layout
        sub._session = self._session
        sub.stats_ = self.stats_
        sub._preempt_signals = self._preempt_signals
        sub.epoch, sub.position = self.epoch, int(position)
        return sub

    def _bind_world(self, world: Any) -> None:
        self.world, self.rank, self.world_size = world, world.rank, world.world_size
        self.layout: Any = Layout(self._chunk, self.world_size, self.rank, self.remainder, nodes=world.nodes)
        if self.batch_size is None and self.world_size == 1:
            self.layout = _SampleLayout(self.layout)
        if getattr(self, "_split_w", 0) and self.world_size != 1 and not getattr(self, "_split_kept", False):
            # chosen for one rank, and the world found at the first iteration is larger
            self._split_w = 0
            self.config = {k: v for k, v in self.config.items() if k != "worker_split"}
        if getattr(self, "_split_w", 0):  # another split (SplitPolicy): webdataset's shard split
            if self.split_policy is None:
                raise StateError(f"this run follows a split of its epochs between {self._split_w} DataLoader "
                                 "workers (config['worker_split']: webdataset's shard split); the engine's "
                                 "loader has no such split: resume it with resumewds.WebLoader")
            self.layout = self.split_policy.layout(self.dataset, self._split_w, self.world_size, self.batch_size,
                                                   self.remainder, self._chunk)

    def _use_split(self, workers: int, kept: bool = False) -> None:
        """Follow the split over ``workers`` (0: the sample split), recorded in ``config["worker_split"]``."""
        self._split_w, self._split_kept = int(workers), bool(kept and workers)  # kept: a run's, not ours
        self.config = {k: v for k, v in self.config.items() if k != "worker_split"}
        if self._split_w:
            self.config["worker_split"] = self._split_w
        self._bind_world(self.world)

    def _layout_of(self, epoch: int) -> Any:
        """The layout of epoch ``epoch``'s steps (an EpochLayout bound to the epoch)."""
        return self.dataset.steps_of(self.layout, epoch) if hasattr(self.layout, "bind") else self.layout

    def _take_world(self) -> None:
        """Built before the processes were set up: the world of the first ``len()`` / iteration."""
        world = late_world(self.world, self.journal_path) if getattr(self, "_world_open", False) else None
        if world is not None:
            self._bind_world(world)

    def __iter__(self) -> Iterator[Any]:
        self._take_world()
        self._world_open = False
        warn_unsaved_loader(self)  # a framework that would not save this loader's position: say so
        self._begin_iter()
        ds = self.dataset
        epoch, start = self.epoch, self.position
        total = len(ds.plan.epoch(epoch))
        if self.preempted:
            return
        layout = self._layout_of(epoch)
        nsteps = layout.num_steps(total, start)
        if nsteps == 0:
            if total == 0 and getattr(ds, "_index_skipped", None) and getattr(ds, "empty_check", False):
                raise empty_epoch_error(epoch, ds._index_skipped)  # every shard was skipped: no success
            self._end_epoch()
            return
        run = self._start_run(epoch, start, layout)
        expected = 0
        left = False  # the consumer left this iter() mid-epoch (closed it)
        try:
            while True:
                t0 = time.perf_counter()
                step = self._next_step(run)
                if step is None:
                    break
                k, batch, meta = step
                if isinstance(batch, str) and batch == _HANDLER_STOP:
                    # webdataset's handler returned False: the epoch ends here (what
                    # came before was delivered; a rerun stops at the same step)
                    self._absorb(meta.get("events") or [])
                    self.position = total
                    self._end_epoch()
                    return
                batch = self._received(run, batch, meta)
                if self.preempted:
                    # a step boundary: this batch is not handed out, the position
                    # stays after the last one that was
                    self._absorb(meta.get("events") or [])
                    log.info("stopping at a step boundary (signal %s): epoch %d, position %d",
                             self.preempt_signal, self.epoch, self.position)
                    return
                wait = time.perf_counter() - t0
                self.stats_.observe_queue(run.it)
                if k != expected:
                    raise StateError(f"step {k} arrived where step {expected} was expected "
                                     "(DataLoader order broken)")
                expected += 1
                owed = self._account(meta, epoch, wait)
                halt = bool(meta.get("stopped"))  # a handler said stop in this step: the epoch ends
                yield from self._hand_out(batch, meta, owed, _StepAt(epoch, k, start, total, layout,
                                                                     k + 1 >= nsteps or halt))
                if halt:
                    return
        except GeneratorExit:
            left = True
            raise
        finally:
            if not left:  # ended (the epoch, a preemption, an error): the next iter() goes on from here
                self._advanced, self._origin = False, None
            run.close()
        if self.epoch == epoch and self.position >= total:
            self._end_epoch()

    def _start_run(self, epoch: int, start: int, layout: Any) -> _EpochRun:
        """This iteration's DataLoader over the epoch's steps from ``start``, its workers started."""
        stopping = _stop_flag() if self._preempt_signals and self.num_workers else None
        kw = dict(self.dataloader_kwargs)
        ring = self._make_ring(kw)
        src = _EpochSource(self.dataset, epoch, start, layout, collate=self._collate,
                           collate_fn=self._collate_fn, ignore_signals=self._preempt_signals,
                           stopping=stopping, ring=ring, convert=self.convert)
        if self.num_workers == 0:
            for k in ("prefetch_factor", "persistent_workers"):
                kw.pop(k, None)
        dl = DataLoader(src, batch_size=None, num_workers=self.num_workers, collate_fn=_identity, **kw)
        with contextlib.ExitStack() as starting:
            if self.num_workers:  # the workers start here: they never scan what they inherited
                starting.enter_context(frozen_for_fork())  # (resumewds.run), and a preemption
                starting.enter_context(_blocked_for_start(  # signal waits for their handlers
                    self._preempt_signals, kw.get("multiprocessing_context")))
            it = iter(dl)
        return _EpochRun(dl, it, WorkerWatchdog(it, self.stall_timeout), ring, stopping)

    def _next_step(self, run: _EpochRun) -> Optional[Tuple[int, Any, Dict[str, Any]]]:
        """The next ``(step, batch, meta)`` from the workers, None at the end."""
        try:
            return run.nxt()
        except StopIteration:
            return None
        except ResumeWDSError as exc:  # num_workers=0: raised here, in this process
            self._failed_now(exc, self.dataset.take_events())
            raise
        except Exception as exc:
            mapped = run.watch.explain(exc)
            if mapped is None:
                raise
            raise mapped from None

    def _received(self, run: _EpochRun, batch: Any, meta: Dict[str, Any]) -> Any:
        """A batch as it came from a worker: unpacked from the ring (and pinned), or its failure raised."""
        if type(batch) is Packed:
            batch = run.ring.unpack(batch)  # type: ignore[union-attr]
            if run.pin:  # torch's pin thread saw only the Packed marker: pin what it stood for
                batch = _pin_memory(batch, getattr(run.it, "_pin_memory_device", None) or None)
        elif isinstance(batch, _WorkerFailure):
            failure = batch.exc
            self._failed_now(failure, meta.get("events") or [])
            if hasattr(failure, "add_note"):  # Python 3.11+
                failure.add_note(f"(raised in DataLoader worker {batch.worker})")
            raise failure
        return batch

    def _account(self, meta: Dict[str, Any], epoch: int, wait: float) -> Any:
        """A step's stats, events and consumption; unbatched, the consumption owed as its samples are
        handed out."""
        self.stats_.update(meta, wait)
        self._absorb(meta.get("events") or [])
        # unbatched, a step's samples count as consumed one by one, as handed out
        # (one rank: with the samples a stage dropped before each, as the position passes them)
        owed = None if self._collate else self._session.consume_step(epoch, meta, self.world_size == 1)
        for si, n in meta.get("shards", {}).items():
            if owed is None:
                self._session.consume(si, epoch, n)
            if self._failed_urls and n:
                url = self.dataset.manifest.shards[si].url
                if url not in (meta.get("failed") or ()):  # not failed again in this worker
                    self._recovered(url)
        return owed

    def _hand_out(self, batch: Any, meta: Dict[str, Any], owed: Any, at: _StepAt) -> Iterator[Any]:
        """Step ``at.step``'s batch (unbatched: its samples one by one), the position moved past them."""
        n = int(meta.get("samples", 0))
        info = BatchInfo(at.epoch, at.step, n, tuple(meta.get("pad_flags") or ()),
                         int(meta.get("skipped", 0)), int(meta.get("filtered", 0)), n == 0)
        self.batch_info = info
        if self._collate:
            self.samples_total += n
            self._step_done(at)
            # one batch per step on every rank, even when nothing is left; the
            # position keys hidden (readable, not listed), as direct iteration does
            self._advanced, self._pinned = True, False
            self._handed += 1
            yield hide_positions(batch) if n else EmptyBatch(info)
            return
        # unbatched: hand out samples one by one, positions per sample
        n = len(batch)
        s0 = at.start + at.step * at.layout.step_size
        slot_of = meta.get("slot_index") or []
        pad_of = info.pads
        for i, sample in enumerate(batch):
            self.sample_is_pad = bool(pad_of[i]) if i < len(pad_of) else False
            self.samples_total += 1
            owed.deliver(i, i + 1 == n)
            if i + 1 == n:
                self._step_done(at)
            elif self.world_size == 1:
                # one rank: the grid is contiguous, so a slot is a position
                # (past ``total`` inside the padding, see _SampleLayout)
                self.position = s0 + slot_of[i] + 1
            self._advanced, self._pinned = True, False
            self._handed += 1
            yield hide_positions(sample)
        if n == 0:
            owed.deliver(0, True)  # read, all filtered or skipped
            self._step_done(at)

    def _step_done(self, at: _StepAt) -> None:
        """The position after step ``at.step``; the epoch's end after its last step."""
        self.position = at.layout.position_after(at.total, at.start, at.step)
        if at.last:
            self._end_epoch()

    def _make_ring(self, kw: Dict[str, Any]) -> Optional[BytesRing]:
        """This iteration's shared-memory transport, or None (no forked workers, ``transport="queue"``)."""
        if self.num_workers <= 0 or self.transport != "auto":
            return None
        return ring_for(self.num_workers, kw, self.dataset.manifest.shards, self.layout.batch_size,
                        tensors=self._collate and self._collate_fn is default_collate)

    def close(self) -> None:
        """Flush and close the journal, release the shards this process holds open and restore the
        signal handlers ``preempt`` replaced."""
        self.release_signals()
        try:
            self._session.close()
        finally:
            self.dataset.close()

    def __enter__(self) -> ShardLoader:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()
