"""WebLoader: torch's DataLoader with an exact, layout-independent resume.

The main process owns the position.  Workers produce whole steps (the step
numbers are a pure function of the position, see :mod:`resumewds.plan`);
the DataLoader returns them round-robin, which is the global order; the
loader checks every step number it receives, so an out-of-order delivery is
an error, not a silent divergence.  ``state_dict()`` is therefore just
``{epoch, position}`` plus the configuration it must agree with, and it loads
into a loader with any ``num_workers`` or world size.

Example:
    >>> import resumewds as rw                                         # doctest: +SKIP
    >>> ds = rw.WebDataset("d/shard-{0000..0031}.tar", seed=7, shuffle=True)
    >>> loader = rw.WebLoader(ds.decode().to_tuple("txt", "cls"), batch_size=64, num_workers=2)
    >>> for step, (txt, cls) in enumerate(loader): ...
    >>> state = loader.state_dict()
    >>> fresh = rw.WebLoader(<same dataset>, batch_size=64, num_workers=0)
    >>> fresh.load_state_dict(state)   # yields exactly what `loader` would have
"""

from __future__ import annotations

import logging
import os
import sys
import time
from typing import Any, Dict, Iterator, List, Optional, Tuple, Union

import torch
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

from .dataset import WebDataset
from .errors import JournalError, ResumeWDSError, StateError
from .pipeline import default_collate, list_collate
from .plan import Layout
from .stats import Stats, flat_scalars, setup_logging, worker_logging

log = logging.getLogger("resumewds")

STATE_FORMAT = "resumewds.loader"
STATE_VERSION = 1
_ORDER_KEYS = ("manifest", "seed", "shuffle", "shuffle_window", "samples")
_UNSET: Any = object()


def _identity(x: Any) -> Any:
    return x


def _env_int(*names: str) -> Optional[int]:
    """The first of the environment variables ``names`` that is set, as an int."""
    for name in names:
        raw = os.environ.get(name)
        if raw is not None and raw.strip() != "":
            try:
                return int(raw)
            except ValueError:
                raise ValueError(f"environment variable {name}={raw!r} is not an integer") from None
    return None


def world_from_env(rank: Optional[int] = None, world_size: Optional[int] = None) -> Tuple[int, int]:
    """Rank and world size: explicit arguments, else torch.distributed, else env.

    Each explicit argument overrides on its own.  Without an initialized
    process group the environment is read: ``RANK`` / ``WORLD_SIZE`` (set by
    torchrun), else ``LOCAL_RANK`` / ``LOCAL_WORLD_SIZE`` (launchers that set
    only the per-node variables, i.e. a single node); neither means (0, 1).

    Raises:
        ValueError: an environment variable is not an integer, or the result
            is not a valid rank in a world of that size.

    Example:
        >>> world_from_env(1, 4)
        (1, 4)
    """
    r, w = rank, world_size
    if r is None or w is None:
        dr = dw = None
        try:
            import torch.distributed as dist

            if dist.is_available() and dist.is_initialized():
                dr, dw = dist.get_rank(), dist.get_world_size()
        except Exception:  # pragma: no cover - torch without distributed
            pass
        if dr is None:
            # a rank without a world size would silently read rank 0's share
            dr = _env_int("RANK", "LOCAL_RANK")
            dw = _env_int("WORLD_SIZE", "LOCAL_WORLD_SIZE")
            dr = 0 if dr is None else dr
            dw = 1 if dw is None else dw
        r = dr if r is None else r
        w = dw if w is None else w
    r, w = int(r), int(w)
    if w < 1 or not 0 <= r < w:
        raise ValueError(f"rank {r} is not in a world of size {w} (explicit arguments, "
                         "torch.distributed, then RANK/WORLD_SIZE or LOCAL_RANK/LOCAL_WORLD_SIZE)")
    return r, w


def _die_with_parent() -> None:
    """Make this DataLoader worker die with its parent (Linux).

    When the main process is SIGKILLed, torch's workers notice only while idle,
    and a worker blocked flushing its result queue (whose read end the other
    workers still hold) never exits: it would keep cache pins and memory
    forever.  PR_SET_PDEATHSIG has the kernel kill it instead.
    """
    if not sys.platform.startswith("linux"):
        return
    try:
        import ctypes
        import signal as _signal

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(_signal.SIGKILL), 0, 0, 0)  # PR_SET_PDEATHSIG
    except Exception:  # pragma: no cover - exotic libc
        return
    if os.getppid() == 1:  # parent already gone before prctl took effect
        os._exit(1)


def _worker_error(exc: BaseException) -> Optional[ResumeWDSError]:
    """One of our errors, with a one-line message, for what torch raised from a worker.

    torch re-raises a worker's exception as ``type(msg)`` with the worker's
    traceback inside ``msg`` (or as RuntimeError when the type cannot be built
    from one string), and reports a worker killed by a signal as a bare
    RuntimeError.  None: not a worker failure (re-raise as is).
    """
    text = str(exc)
    if isinstance(exc, RuntimeError) and "DataLoader worker" in text and (
            "exited unexpectedly" in text or "killed by signal" in text):
        return ResumeWDSError(f"{text.strip()} (killed, or out of memory?); progress up to the last "
                              "commit is intact: rerun to continue")
    if not (text.startswith("Caught ") and "in DataLoader worker process" in text):
        return None
    where = text.split("\n", 1)[0][len("Caught "):].split(" ", 1)[-1].rstrip(".")
    last = text.rstrip().rsplit("\n", 1)[-1]
    name, _, msg = last.partition(": ")
    if not name.startswith("resumewds."):
        return None
    from . import errors

    cls = getattr(errors, name.rsplit(".", 1)[-1], None)
    if not (isinstance(cls, type) and issubclass(cls, ResumeWDSError)):
        return None
    for c in cls.__mro__:  # ChecksumMismatch needs 3 args: fall back to IntegrityError
        if isinstance(c, type) and issubclass(c, ResumeWDSError):
            try:
                return c(f"{msg} ({where})")
            except TypeError:
                continue
    return None


class _EpochSource(IterableDataset):
    """What each DataLoader worker iterates: its round-robin share of steps."""

    def __init__(self, ds: WebDataset, epoch: int, start: int, layout: Layout, collate: bool):
        self.ds = ds
        self.epoch = epoch
        self.start = start
        self.layout = layout
        self.collate = collate
        self.log_level = logging.getLogger("resumewds").level  # for spawned workers

    def __iter__(self) -> Iterator[Tuple[int, Any, Dict[str, Any]]]:
        info = get_worker_info()
        w, nw = (info.id, info.num_workers) if info is not None else (0, 1)
        if info is not None:
            _die_with_parent()
        if info is not None:
            worker_logging(self.log_level)
        try:
            for k, batch, meta in self.ds.iter_steps(self.epoch, self.start, self.layout, w, nw,
                                                     collate=self.collate):
                yield k, batch, meta
        finally:
            if info is not None:
                self.ds.close()


class WebLoader:
    """A resumable loader over a :class:`~resumewds.dataset.WebDataset`.

    Each ``iter(loader)`` runs the rest of the current epoch; when an epoch's
    last batch is handed out, ``loader.epoch`` advances and the position
    returns to 0.

    Args:
        dataset: the WebDataset.
        batch_size: samples per batch per rank; None yields single samples.
            If the dataset was ``.batched(n)``, leave this None (or n).
        num_workers: DataLoader worker processes (any number; resume works
            across different counts).
        collate_fn: how to collate a batch (default: torch's default_collate).
        rank, world_size: override torch.distributed / RANK / WORLD_SIZE.
        remainder: the final short step of an epoch: ``"keep"``, ``"pad"`` or
            ``"drop"`` (see :mod:`resumewds.plan`).  Every rank always yields
            the same number of batches.
        journal: path of a SQLite journal (see :mod:`resumewds.journal`);
            ``commit(step)`` records positions there.
        resume: with a journal: True resumes at the latest complete commit,
            an int resumes at that step's commit, False starts fresh (and
            refuses a journal that already holds commits).
        verbose: log fetches, retries, repairs, evictions and resumes (also
            ``RESUMEWDS_VERBOSE=1``).
        chunk_size: samples per worker task when ``batch_size`` is None.
        **dataloader_kwargs: passed to torch's DataLoader (pin_memory,
            timeout, prefetch_factor, multiprocessing_context, ...).

    Example:
        >>> loader = WebLoader(ds, batch_size=64, num_workers=2,     # doctest: +SKIP
        ...                    journal="run.db", resume=True)
        >>> for step, batch in enumerate(loader, start=loader.steps_done):
        ...     train(batch); loader.commit(step)
    """

    def __init__(self, dataset: WebDataset, batch_size: Optional[int] = _UNSET, num_workers: int = 0, *,
                 collate_fn: Any = None, rank: Optional[int] = None, world_size: Optional[int] = None,
                 remainder: str = "keep", journal: Optional[str] = None,
                 resume: Union[bool, int] = False, verbose: bool = False, chunk_size: int = 64,
                 journal_sync: str = "NORMAL", **dataloader_kwargs: Any):
        if not isinstance(dataset, WebDataset):
            raise TypeError(f"WebLoader needs a resumewds.WebDataset, got {type(dataset).__name__}")
        for bad in ("shuffle", "sampler", "batch_sampler"):
            if dataloader_kwargs.get(bad):
                raise ValueError(f"{bad}= is not supported: the order comes from the dataset's seed "
                                 "and shuffle settings")
            dataloader_kwargs.pop(bad, None)
        if dataloader_kwargs.pop("drop_last", False):
            remainder = "drop"
        setup_logging(verbose)
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
            self._collate_fn = collate_fn
            if self._collate:
                dataset.collate_fn = collate_fn or default_collate
        if self.batch_size is not None and int(self.batch_size) < 1:
            raise ValueError(f"batch_size must be >= 1 or None, got {self.batch_size}")
        self.num_workers = int(num_workers)
        self.rank, self.world_size = world_from_env(rank, world_size)
        self.layout = Layout(int(self.batch_size or chunk_size), self.world_size, self.rank, remainder)
        self.remainder = remainder
        self.dataloader_kwargs = dataloader_kwargs
        self.epoch = 0
        self.position = 0
        self.samples_total = 0
        self.steps_done = 0
        self.stats_ = Stats()
        self._consumed: Dict[Tuple[int, int], int] = {}
        self._events: List[Dict[str, Any]] = []
        self._shard_updates: List[Dict[str, Any]] = []
        self._last_stats_commit = 0.0
        self._last_commit_epoch: Optional[int] = None
        self.journal_path = journal
        self.journal: Any = None
        # resolve + index in the main process, once, before any worker starts
        self.config = dataset.config()
        self._absorb(dataset.take_events())
        if journal is not None:
            self._open_journal(journal, resume, journal_sync)

    # ---- journal ----------------------------------------------------------
    def _journal_config(self) -> Dict[str, Any]:
        cfg = dict(self.config)
        cfg.update(batch_size=self.batch_size, world_size=self.world_size,
                   num_workers=self.num_workers, remainder=self.remainder)
        return cfg

    def _open_journal(self, path: str, resume: Union[bool, int], sync: str) -> None:
        from .journal import Journal, resolve_resume

        point = None
        if resume is not False:
            point = self._resolve_together(path, None if resume is True else int(resume),
                                           resolve_resume)
        j = Journal(path, rank=self.rank, world_size=self.world_size, synchronous=sync)
        try:
            j.check_config(self._journal_config(),
                           compatible_keys=("batch_size", "world_size", "num_workers", "rank"))
            remote = [{"url": sh.url} for sh in self.dataset.manifest.shards
                      if sh.url.startswith(("http://", "https://", "pipe:"))]
            if remote and j.latest_commit() is None:
                j.update_shards(remote)  # every remote shard starts as 'pending'
            if point is None:
                if j.latest_commit() is not None and resume is False:
                    raise JournalError(f"{path}: journal already holds commits; pass resume=True to "
                                       "continue that run, or use a new journal path")
            else:
                self.epoch = int(point["epoch"])
                self.position = int(point["position"])
                self.steps_done = int(point["step"]) + 1
                per_rank = point.get("samples_total_per_rank") or []
                mine = per_rank[self.rank] if self.rank < len(per_rank) else None
                if point.get("world_size", 1) == self.world_size and mine is not None:
                    self.samples_total = int(mine)
                elif self.world_size == 1:
                    self.samples_total = int(point.get("samples_total") or 0)
                else:
                    self.samples_total = 0
                detail = {"step": point["step"], "epoch": self.epoch, "position": self.position,
                          "world_size": self.world_size, "num_workers": self.num_workers}
                if point.get("skipped_incomplete"):
                    detail["skipped_incomplete"] = point["skipped_incomplete"]
                j.record_events([dict(kind="resume", **detail)])
                log.info("resuming %s at step %s: epoch %d, position %d", path, point["step"],
                         self.epoch, self.position)
        except BaseException:
            j.close()
            raise
        self.journal = j

    def _process_group(self) -> Any:
        """torch.distributed, when its default group is exactly this loader's world."""
        if self.world_size < 2:
            return None
        try:
            import torch.distributed as dist

            if (dist.is_available() and dist.is_initialized()
                    and (dist.get_rank(), dist.get_world_size()) == (self.rank, self.world_size)):
                return dist
        except Exception:  # pragma: no cover - torch without distributed
            pass
        return None

    def _resolve_together(self, path: str, step: Optional[int], resolve: Any
                          ) -> Optional[Dict[str, Any]]:
        """Find the resume point once for all ranks, before any rank opens its journal.

        With a process group, rank 0 runs ``resolve(path, step)`` and
        broadcasts the answer (or its error): every rank starts from the same
        point, the run's files are read once instead of once per rank (at
        1,000 ranks, 1,000 opens instead of 1,000,000), and no rank creates
        its journal file while rank 0 is still reading the run's files (a
        fresh rank file next to a missing rank 0 file reads as a damaged
        run).  Without a process group (ranks started by hand) every rank
        resolves on its own; start them after the previous run has stopped.
        """
        from . import errors

        dist = self._process_group()
        if dist is None:
            return resolve(path, step)
        payload: List[Any] = [None]
        err: Optional[BaseException] = None
        if self.rank == 0:
            try:
                payload[0] = (resolve(path, step), None, None)
            except Exception as exc:  # the other ranks must not wait for a broadcast forever
                err = exc
                payload[0] = (None, type(exc).__name__, str(exc))
        dist.broadcast_object_list(payload, src=0)
        if err is not None:
            raise err
        point, kind, msg = payload[0]
        if kind is not None:
            cls = getattr(errors, kind, None)
            if not (isinstance(cls, type) and issubclass(cls, JournalError)):
                cls = JournalError
            raise cls(f"{msg} (found by rank 0)")
        return point

    def commit(self, step: int, stats: Optional[bool] = None) -> None:
        """Record atomically, in the journal, the position after ``step``.

        Call it after the training step that consumed the last batch (and,
        ideally, right after saving the model checkpoint for that step).  A
        commit that returned survives kill -9.

        Args:
            step: the training step (any increasing int; ``resume=S`` finds it).
            stats: include a stats snapshot (default: at most every 5 s).
        """
        if self.journal is None:
            raise JournalError("commit() needs a journal: WebLoader(..., journal='run.db')")
        now = time.time()
        if stats is None:
            stats = now - self._last_stats_commit >= 5.0
        snap = None
        if stats:
            snap = self.stats()
            self._last_stats_commit = now
        self._flush_journal()
        consumed = {}
        shards = self.dataset.manifest.shards
        for (si, ep), n in self._consumed.items():
            consumed[(shards[si].url, ep)] = (n, int(shards[si].samples or 0))
        # the consumption table is folded in every few commits, and at once
        # when an epoch ended (its shards are then complete)
        epoch_done = self._last_commit_epoch is not None and self.epoch != self._last_commit_epoch
        self.journal.commit(step, epoch=self.epoch, position=self.position, consumed=consumed,
                            world_size=self.world_size, batch_size=self.batch_size,
                            samples_total=self.samples_total, stats=snap, materialize=epoch_done)
        self._last_commit_epoch = self.epoch
        self._consumed.clear()
        self.steps_done = step + 1

    def _flush_journal(self) -> None:
        if self.journal is None:
            return
        if self._events:
            self.journal.record_events(self._events)
            self._events = []
        if self._shard_updates:
            self.journal.update_shards(self._shard_updates)
            self._shard_updates = []

    def _absorb(self, events: List[Dict[str, Any]]) -> None:
        if not events:
            return
        self.stats_.events(events)
        if self.journal_path is None:
            return
        from .journal import shard_updates_from_events

        self._events.extend(e for e in events if e.get("kind") not in ("cache_hit", "verify_ok", "fetch_start"))
        self._shard_updates.extend(shard_updates_from_events(events))
        if len(self._events) > 10000:  # no journal, or no commits: keep memory bounded
            del self._events[:-1000]
        if len(self._shard_updates) > 10000:
            del self._shard_updates[:-1000]

    # ---- state --------------------------------------------------------------
    def state_dict(self) -> Dict[str, Any]:
        """The loader's position: load it into any loader over the same data.

        Returns:
            ``{"format", "version", "epoch", "position", "samples_total",
            "steps_done", "config", "batch_size", "world_size"}``.
        """
        return {"format": STATE_FORMAT, "version": STATE_VERSION, "epoch": self.epoch,
                "position": self.position, "samples_total": self.samples_total,
                "steps_done": self.steps_done, "config": dict(self.config),
                "batch_size": self.batch_size, "world_size": self.world_size}

    get_state = state_dict

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """Continue from ``state`` (from any num_workers / world size).

        Raises:
            StateError: the state is not a resumewds state, is newer than
                this version, or was taken on different data or order settings.
        """
        if not isinstance(state, dict) or state.get("format") != STATE_FORMAT:
            raise StateError("not a resumewds loader state (missing format field)")
        if int(state.get("version", 0)) > STATE_VERSION:
            raise StateError(f"loader state version {state.get('version')} is newer than this resumewds")
        cfg = state.get("config", {})
        diffs = [f"{k}: state has {cfg.get(k)!r}, loader has {self.config.get(k)!r}"
                 for k in _ORDER_KEYS if cfg.get(k) != self.config.get(k)]
        if diffs:
            raise StateError("loader state does not match this dataset: " + "; ".join(diffs))
        epoch, pos = int(state["epoch"]), int(state["position"])
        if not 0 <= pos <= int(self.config["samples"]):
            raise StateError(f"position {pos} outside an epoch of {self.config['samples']} samples")
        self.epoch, self.position = epoch, pos
        self.samples_total = int(state.get("samples_total", 0))
        self.steps_done = int(state.get("steps_done", 0))
        log.info("resuming from a state dict: epoch %d, position %d", epoch, pos)
        self._absorb([{"kind": "resume", "epoch": epoch, "position": pos, "ts": time.time()}])

    set_state = load_state_dict

    def stats(self) -> Dict[str, Any]:
        """Counters and rates aggregated over all workers (fields: :mod:`resumewds.stats`)."""
        s = self.stats_.snapshot()
        s.update(epoch=self.epoch, position=self.position, samples_total=self.samples_total,
                 rank=self.rank, world_size=self.world_size, num_workers=self.num_workers)
        return s

    def to_tensorboard(self, writer: Any, step: Optional[int] = None, prefix: str = "data/") -> None:
        """Write the numeric stats to a TensorBoard ``SummaryWriter`` (or anything
        with ``add_scalar(tag, value, step)``): ``data/samples_per_s``,
        ``data/worker0/samples``, ... (see :func:`resumewds.stats.flat_scalars`).

        Args:
            writer: e.g. ``torch.utils.tensorboard.SummaryWriter(logdir)``.
            step: the global step (default: ``steps_done``).
            prefix: tag prefix.
        """
        step = step if step is not None else self.steps_done
        for k, v in flat_scalars(self.stats()).items():
            writer.add_scalar(prefix + k, v, step)

    # ---- iteration ----------------------------------------------------------
    def __len__(self) -> int:
        """Batches left in the current epoch (from the current position)."""
        total = int(self.config["samples"])
        n = self.layout.num_steps(total, self.position)
        if self.batch_size is None:
            return max(0, total - self.position) if self.world_size == 1 else n * self.layout.batch_size
        return n

    def _end_epoch(self) -> None:
        failed = self.stats_.failed
        if failed:
            log.warning("epoch %d ended with %d shard(s) skipped after errors (on_error='skip'): %s",
                        self.epoch, len(failed), "; ".join(f"{u}: {e}" for u, e in sorted(failed.items())))
        self.epoch += 1
        self.position = 0

    def __iter__(self) -> Iterator[Any]:
        ds = self.dataset
        epoch, start = self.epoch, self.position
        total = len(ds.plan.epoch(epoch))
        layout = self.layout
        nsteps = layout.num_steps(total, start)
        if nsteps == 0:
            self._end_epoch()
            return
        src = _EpochSource(ds, epoch, start, layout, collate=self._collate)
        kw = dict(self.dataloader_kwargs)
        if self.num_workers == 0:
            for k in ("prefetch_factor", "persistent_workers"):
                kw.pop(k, None)
        dl = DataLoader(src, batch_size=None, num_workers=self.num_workers, collate_fn=_identity, **kw)
        expected = 0
        it = iter(dl)
        try:
            while True:
                t0 = time.perf_counter()
                try:
                    k, batch, meta = next(it)
                except StopIteration:
                    break
                except Exception as exc:
                    mapped = _worker_error(exc)
                    if mapped is None:
                        raise
                    raise mapped from None
                wait = time.perf_counter() - t0
                self.stats_.observe_queue(it)
                if k != expected:
                    raise StateError(f"step {k} arrived where step {expected} was expected "
                                     "(DataLoader order broken)")
                expected += 1
                self.stats_.update(meta, wait)
                self._absorb(meta.get("events") or [])
                for si, n in meta.get("shards", {}).items():
                    self._consumed[(si, epoch)] = self._consumed.get((si, epoch), 0) + n
                last = k + 1 >= nsteps
                if self._collate:
                    self.samples_total += int(meta.get("samples", 0))
                    self.position = layout.position_after(total, start, k)
                    if last:
                        self._end_epoch()
                    if meta.get("samples", 0):
                        yield batch
                    continue
                # unbatched: hand out samples one by one, positions per sample
                n = len(batch)
                positions = meta["positions"]
                for i, sample in enumerate(batch):
                    self.samples_total += 1
                    if i + 1 == n:
                        self.position = layout.position_after(total, start, k)
                        if last:
                            self._end_epoch()
                    elif self.world_size == 1:
                        # one rank: positions are contiguous, so a sample is a position
                        self.position = positions[i] + 1
                    yield sample
                if n == 0:
                    self.position = layout.position_after(total, start, k)
                    if last:
                        self._end_epoch()
        finally:
            del it
        if self.epoch == epoch and self.position >= total:
            self._end_epoch()

    def close(self) -> None:
        """Flush pending journal events, close the journal, and release the
        shards this process holds open (num_workers=0 reads in this process)."""
        try:
            if self.journal is not None:
                try:
                    self._flush_journal()
                finally:
                    self.journal.close()
                    self.journal = None
        finally:
            self.dataset.close()

    def __enter__(self) -> "WebLoader":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ---- webdataset's WebLoader fluent methods (issue 13; resumewds/loaderchain.py) ----
    def unbatched(self) -> Any:
        """Single samples: ``loader.unbatched().shuffle(n).batched(m)`` re-mixes exactly
        (see :mod:`resumewds.loaderchain`)."""
        from .loaderchain import LoaderPipeline

        return LoaderPipeline(self).unbatched()

    def shuffle(self, size: int, **kw: Any) -> Any:
        """The dataset's ``.shuffle(size)``, in the plan (see :mod:`resumewds.loaderchain`)."""
        from .loaderchain import LoaderPipeline

        return LoaderPipeline(self).shuffle(size, **kw)

    def batched(self, batchsize: int, collation_fn: Any = _UNSET, partial: bool = True) -> Any:
        """Batches of ``batchsize`` consecutive positions (see :mod:`resumewds.loaderchain`)."""
        from .loaderchain import LoaderPipeline
        from .pipeline import default_collation_fn

        fn = default_collation_fn if collation_fn is _UNSET else collation_fn
        return LoaderPipeline(self).batched(batchsize, collation_fn=fn, partial=partial)

    def with_epoch(self, nsamples: int = -1, nbatches: int = -1) -> Any:
        """``max(nsamples, nbatches)`` items per ``iter()``, continuing over epochs."""
        from .loaderchain import LoaderPipeline

        return LoaderPipeline(self).with_epoch(nsamples, nbatches)

    def repeat(self, nepochs: int = -1, nbatches: int = -1) -> Any:
        """``nepochs`` epochs per ``iter()`` (forever if < 1), at most ``nbatches`` items."""
        from .loaderchain import LoaderPipeline

        return LoaderPipeline(self).repeat(nepochs, nbatches)
