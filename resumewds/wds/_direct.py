"""Direct iteration of a data set, as webdataset iterates: ``for sample in ds``.

:class:`DirectDataset`: this process's share of an epoch through every stage (stream stages
included), ``repeat`` / ``with_epoch``, webdataset's worker split, and the torchdata state
protocol, which resumes exactly after the last item yielded.
"""

from __future__ import annotations

import logging
from typing import Any, Dict, Iterator, List, Optional, Tuple

from ..errors import StateError
from ..fetch import is_remote_url, local_path
from ..plan import Layout, mix, worker_info
from ..read import ShardDataset
from ..run import CHECKSUM_KEY, check_restored_state, check_seal, note_framework, seal
from ..sources import Source
from ..stages import Stage, empty_epoch_error, hide_positions, until_stop
from ._shardsplit import WORKER_SPLITS, WorkerStream

__all__ = ["DATASET_STATE", "DirectDataset"]

log = logging.getLogger("resumewds")

#: the ``format`` of a data set's own state (direct iteration)
DATASET_STATE = "resumewds.dataset"
_KNOWN_STREAM = ("unbatched", "unlisted", "slice", "rsample", "log_keys")


class _NoPadLayout(Layout):
    """WebLoader's split, but a share that would get a padding sample gets nothing, as in webdataset."""

    def slots(self, total: int, start: int, step: int, rank: Optional[int] = None
              ) -> List[Tuple[int, bool]]:
        return [s for s in super().slots(total, start, step, rank) if not s[1]]


class _KeepShards:
    """A custom node/worker splitter's choice of shards, as a per-sample filter."""

    def __init__(self, urls: frozenset):
        self.urls = urls

    def __call__(self, sample: Any) -> Any:
        return sample if sample.get("__url__") in self.urls else None


class DirectDataset(ShardDataset):
    """A :class:`~resumewds.read.ShardDataset` that is also iterated directly, with exact state.

    ``worker_split``: ``"samples"`` (the one sample sequence), ``"shards"`` (webdataset's
    ``split_by_worker``) or None (:meth:`worker_split_mode`).

    Example:
        >>> ds = DirectDataset("data/shard-{000000..000003}.tar").with_epoch(3)
        >>> [s["__key__"] for s in ds]
        ['s000000_000000', 's000000_000001', 's000000_000002']
    """

    #: a worker of the shard split without a shard raises (with ``empty_check``); not a DataPipeline's
    empty_worker_check = True

    def __init__(self, urls: Source, *, repeat: bool = False, worker_split: Optional[str] = None, **kw: Any):
        if worker_split is not None and worker_split not in WORKER_SPLITS:
            raise ValueError(f"worker_split must be one of {WORKER_SPLITS} or None, got {worker_split!r}")
        super().__init__(urls, **kw)
        self.worker_split = worker_split
        # iteration mode: once / repeat / with_epoch (webdataset's repetitions, nsamples)
        self._mode = "forever" if (self.resampled or repeat) else "once"
        self._nepochs = -1
        self._limit = -1
        self._warned_opaque = False
        self._fresh_copy()

    def _fresh_copy(self) -> None:
        self._cursor: Optional[Dict[str, Any]] = None
        self._pending: Optional[Dict[str, Any]] = None
        self._advanced = False  # the last iter() handed an item out
        self._pinned = False  # ... and no state was taken after it

    def repeat(self, nepochs: int = -1, nbatches: int = -1) -> DirectDataset:
        """Iterate ``nepochs`` epochs per ``iter()`` (forever if < 1), at most ``nbatches`` items.

        Example:
            >>> ds = DirectDataset("data/shard-000000.tar").repeat(2)
            >>> len(list(ds))
            16
        """
        if nepochs > 0:
            self._mode, self._nepochs = ("once" if nepochs == 1 and nbatches < 1 else "repeat"), int(nepochs)
        else:
            self._mode, self._nepochs = "forever", -1
        self._limit = int(nbatches)
        return self

    def with_epoch(self, nsamples: int = -1, nbatches: int = -1) -> DirectDataset:
        """Each ``iter()`` yields ``max(nsamples, nbatches)`` items, continuing the stream over epochs.

        Example:
            >>> ds = DirectDataset("data/shard-000000.tar").with_epoch(5)
            >>> [len(list(ds)) for _ in range(3)]
            [5, 5, 5]
        """
        self._mode, self._nepochs, self._limit = "forever", -1, int(max(nsamples, nbatches))
        return self

    @property
    def passes(self) -> Optional[Tuple[int, int]]:
        """``(epochs, items)`` of one ``iter()`` (``-1``: no limit), None for one epoch per ``iter()``.

        Example:
            >>> DirectDataset("data/shard-000000.tar").with_epoch(5).passes
            (-1, 5)
        """
        if self._mode == "once":
            return None
        return (self._nepochs if self._mode == "repeat" else -1), self._limit

    def worker_split_mode(self) -> str:
        """``"shards"`` or ``"samples"``: how DataLoader workers share an epoch (``worker_split``)."""
        return self.worker_split or "samples"

    def split_workers(self, num_workers: int, world_size: int = 1, mode: Optional[str] = None) -> int:
        """``W`` of the shard split for ``num_workers`` DataLoader workers, or 0 (the sample split).

        Example:
            >>> DirectDataset("data/shard-000000.tar", worker_split="shards").split_workers(2)
            2
        """
        if ((mode or self.worker_split_mode()) != "shards" or int(num_workers) < 2 or int(world_size) != 1
                or self.plan_partitions != 1 or self.resampled):
            return 0
        return int(num_workers)

    def _split(self) -> Tuple[int, int, int, int, List[Any]]:
        """``(rank, world, worker, num_workers, custom splitters)`` for this process."""
        rank, world, worker, nworkers = worker_info()
        return rank, world, worker, nworkers, []

    def _fresh(self, epoch: int) -> Dict[str, Any]:
        return {"epoch": int(epoch), "step": 0, "skip": 0, "counts": [], "served": 0, "first": int(epoch)}

    def _stream_stages(self) -> List[Stage]:
        return list(self.stage_specs[self.stream_from:])

    def __iter__(self) -> Iterator[Any]:
        """Iterate this process's share of epoch ``self.epoch`` through every stage, as webdataset does."""
        rank, world, worker, nworkers, custom = self._split()
        V = world * nworkers
        kept: Optional[frozenset] = None
        if custom:  # a splitter of your own: the shards it keeps (of the shard list, as webdataset's)
            urls = [{"url": s.url} for s in self.manifest.shards]
            for f in custom:
                urls = list(f(iter(urls)))
            kept = frozenset(d["url"] if isinstance(d, dict) else d for d in urls)
        W = self.split_workers(nworkers, world)
        layout: Any
        if W:  # webdataset's split: this worker's own shards, whole (resumewds.wds._shardsplit), of the kept ones
            chunk = self.batch_size or 64
            keep = None if kept is None else frozenset(i for i, s in enumerate(self.manifest.shards) if s.url in kept)
            layout = WorkerStream(W, worker, Layout(chunk), keep, check=self.empty_check and self.empty_worker_check)
            lay: List[Any] = ["shards", W, worker, chunk]
        else:
            chunk = self.batch_size or (64 if V == 1 else 1)
            layout = _NoPadLayout(batch_size=chunk, world_size=V, rank=rank + world * worker)
            lay = [V, rank + world * worker, chunk]
        if self._pending is not None:
            st = dict(self._pending)
            self._pending = None
            if st.get("layout") not in (None, lay):
                raise StateError(f"dataset state was taken with (virtual world, rank, chunk) = "
                                 f"{st.get('layout')}, this iterator has {lay}: resume with the same "
                                 "world size and num_workers (or use WebLoader, which resumes "
                                 "under any layout)")
            if 0 < self._limit <= st.get("served", 0) and (st.get("step") or st.get("skip")):
                st = dict(self._fresh(st["epoch"] + 1), layout=st.get("layout"))  # its chunk was done: a new pass
            st["served"] = st.get("served", 0) if st.get("served", 0) < self._limit else 0  # a chunk done: a new one
        elif self._mode != "once" and self._cursor is not None:
            st = dict(self._cursor, first=self._cursor["epoch"])
            done = 0 < self._limit <= st.get("served", 0)  # the last iter() gave its with_epoch(n) items
            if (st["step"] or st["skip"]) and (done or (self._advanced and not self._pinned)):
                # webdataset starts its pipeline again at each iter(): the next epoch from its start
                st = dict(self._fresh(st["epoch"] + 1), layout=st.get("layout"))
            elif done or not self._pinned:
                st["served"] = 0
        else:
            st = self._fresh(self.epoch)
        st["layout"] = lay
        self._advanced = False
        saved_stages = self.stages
        if kept is not None and not W:
            self.stages = [_KeepShards(kept)] + list(saved_stages)
        if any(s.kind == "stream" and s.name not in _KNOWN_STREAM for s in self._stream_stages()) \
                and not self._warned_opaque:
            self._warned_opaque = True
            log.warning("a compose() stage is opaque to resumewds: a resume replays its epoch "
                        "from the start (still exact if the stage is deterministic)")
        try:
            yield from self._iterate(st, layout)
        finally:
            self.stages = saved_stages

    def _iterate(self, st: Dict[str, Any], layout: Any) -> Iterator[Any]:
        limit = self._limit if self._mode != "once" else -1
        nepochs = {"once": 1, "repeat": self._nepochs}.get(self._mode, -1)
        self._cursor = st
        empty = 0
        while True:
            if limit > 0 and st["served"] >= limit:
                return  # the epoch goes on in the next iter()
            if nepochs > 0 and st["epoch"] >= st["first"] + nepochs:
                break
            produced, resumed = 0, bool(st["step"] or st["skip"])  # the rest of a resumed epoch may be empty
            for item in self._epoch_items(st, layout):
                produced += 1
                yield item
                if limit > 0 and st["served"] >= limit:
                    return
            nxt = self._fresh(st["epoch"] + 1)
            nxt.update(served=st["served"], first=st["first"], layout=st["layout"])
            st.clear()
            st.update(nxt)
            if self._mode == "once":
                self.epoch = st["epoch"]
            empty = 0 if (produced or resumed) else empty + 1
            if empty and nepochs < 0:
                return  # an epoch gave nothing: do not loop forever (webdataset's rule)
        self.epoch = st["epoch"]

    def _epoch_items(self, st: Dict[str, Any], layout: Any) -> Iterator[Any]:
        """One epoch of this share from the clean point in ``st``; updates ``st``."""
        epoch = st["epoch"]
        ep: Any = self.plan.epoch(epoch)
        if isinstance(layout, WorkerStream):  # this worker's stream of the epoch
            layout = self.steps_of(layout, epoch)
            ep = layout.sequence
        if self.empty_check and len(ep) == 0:
            raise empty_epoch_error(epoch, getattr(self, "_index_skipped", None))
        stream = self._stream_stages()
        runners = [s.runner(mix(self.seed, epoch, 0x5354, i), self._on_event) for i, s in enumerate(stream)]
        for r, c in zip(runners, st.get("counts") or []):
            r.count = int(c)
        # from the clean step: st["skip"] counts every item handed out, the ones skipped now included
        skip, st["skip"] = int(st.get("skip", 0)), 0
        state = {"step": int(st["step"])}

        def source() -> Iterator[Any]:
            j = state["step"]
            start = j * layout.step_size
            url_index: Dict[str, int] = {}
            local = self.cache_dir is not None
            on_disk: Dict[str, Optional[str]] = {}
            current = -1
            for k, batch, meta in self.iter_steps(epoch, start, layout, 0, 1, collate=False, each=True):
                if k != current:  # step k starts: a clean point if no stage holds items
                    current = k
                    if all(r.buffered == 0 for r in runners):
                        st["step"], st["skip"] = j + k, 0
                        st["counts"] = [r.count for r in runners]
                if meta is not None:
                    self._absorb_meta(meta)
                    continue
                for sample in batch:
                    if isinstance(sample, dict):
                        if sample.get("__pad__"):
                            continue
                        if local and "__url__" in sample:
                            sample["__local_path__"] = self._local_path(sample["__url__"], url_index)
                        elif "__url__" in sample:  # a local shard: its path, as webdataset sets it
                            lp = on_disk.get(sample["__url__"], "")
                            if lp == "":
                                u = sample["__url__"]
                                lp = on_disk[u] = None if is_remote_url(u) else local_path(u)
                            if lp is not None:
                                sample["__local_path__"] = lp
                    yield sample
            if all(r.buffered == 0 for r in runners):
                st["step"], st["skip"] = layout.num_steps(len(ep), 0), 0
                st["counts"] = [r.count for r in runners]

        it: Iterator[Any] = source()
        for r in runners:
            it = r.run(it)
        for item in until_stop(it):  # a handler's stop ends the epoch quietly
            st["skip"] += 1
            if skip:
                skip -= 1
                continue
            st["served"] += 1
            self._advanced, self._pinned = True, False
            yield hide_positions(item)  # webdataset's keys only (position keys still readable)

    def _absorb_meta(self, meta: Dict[str, Any]) -> None:
        """Keep what a step reports for ``take_events`` (direct iteration has no loader)."""
        ev = meta.get("events")
        if ev:
            self._events.extend(e for e in ev if e.get("kind") in ("skip", "fail", "sample_skip"))
            del self._events[:-1000]

    def _local_path(self, url: str, index: Dict[str, int]) -> Optional[str]:
        if not index:
            index.update({s.url: i for i, s in enumerate(self.manifest.shards)})
        si = index.get(url)
        hit = self._reader.open.get(si) if (self._reader is not None and si is not None) else None
        return getattr(hit[0], "path", None) if hit else None

    def set_epoch(self, epoch: int) -> None:
        """Start the next ``iter()`` at the beginning of ``epoch``.

        A framework's loader calls this before it iterates: it warns about a framework that loses
        data at a resume, and refuses a torchdata state of another ``num_workers`` (``StateError``).
        """
        note_framework(self, "set_epoch")
        check_restored_state(self)
        super().set_epoch(epoch)
        self._cursor = None
        self._pending = None

    def state_dict(self) -> Dict[str, Any]:
        """Where this process's iteration is (in a DataLoader worker, that worker's): no sample data."""
        if self._pending is not None:  # loaded, not iterated yet: where the next iter() starts
            cur = self._pending
        else:
            cur = self._cursor if self._cursor is not None else self._fresh(self.epoch)
        out = {k: v for k, v in cur.items() if not k.startswith("_")}
        out["counts"] = list(out.get("counts") or [])
        out.update(format=DATASET_STATE, version=1, order=self._order_key())
        self._pinned = True
        return seal(out)

    def load_state_dict(self, state: Dict[str, Any]) -> None:
        """The next ``iter()`` continues exactly after the state's last item.

        Raises:
            StateError: not a dataset state, changed after it was taken, or taken with another order.
        """
        if not isinstance(state, dict) or state.get("format") != DATASET_STATE:
            raise StateError("not a resumewds dataset state (missing format field)")
        check_seal(state, "this dataset state")
        if state.get("order") != self._order_key():
            raise StateError(f"dataset state was taken with order {state.get('order')}, "
                             f"this dataset has {self._order_key()}")
        self._pending = {k: v for k, v in state.items() if k not in ("format", "version", "order", CHECKSUM_KEY)}
        self.epoch = int(state["epoch"])

    get_state = state_dict
    set_state = load_state_dict

    def _order_key(self) -> Dict[str, Any]:
        d = dict(self.plan.describe())
        d["stages"] = [s.name for s in self.stage_specs]
        return d
