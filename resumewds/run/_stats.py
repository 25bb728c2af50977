"""Counters and rates, aggregated in the main process from worker metadata.

Every batch a worker produces carries a small ``meta`` dict that :meth:`Stats.update` folds in; the
events it carries are counted by :meth:`Stats.events` (the same path feeds the journal).  The fields
of :meth:`Stats.snapshot` are documented once, in ``docs/STATS.md``.  Every event is logged once, in
the process where it happens (:func:`resumewds.events.event_record`).

Example:
    >>> s = Stats()
    >>> s.update({"worker": 0, "samples": 4, "bytes": 100})
    >>> s.events([{"kind": "retry"}, {"kind": "cache_miss"}, {"kind": "cache_hit"}])
    >>> snap = s.snapshot()
    >>> snap["samples"], snap["retries"], snap["cache_hit_rate"]
    (4, 1, 0.5)
"""

from __future__ import annotations

import collections
import time
from typing import Any, Deque, Dict, Iterable, Optional, Tuple

from ..events import EventKind, stats_counters

#: event kind -> counter it increments (derived from :data:`resumewds.events.EVENTS`)
EVENT_COUNTERS = stats_counters()

#: every integer counter, present (0) in a snapshot even before it moves
COUNTERS = ("samples", "batches", "bytes", "pads", "skipped_samples", "filtered", "empty_batches",
            "shards_downloaded", "bytes_fetched", "cache_hits", "cache_misses",
            "prefetch_fetches", "retries", "repairs", "evictions", "bytes_evicted",
            "verifications", "verify_failures", "failures")
#: every duration, in seconds
TIMERS = ("t_fetch", "t_fetch_wait", "t_read", "t_stages", "t_wait")


class Stats:
    """Loader statistics (``window``: seconds of ``recent_samples_per_s``)."""

    def __init__(self, window: float = 10.0):
        self.window = window
        self.started = time.time()
        self.c: Dict[str, float] = collections.defaultdict(float)
        self.per_worker: Dict[int, list] = {}
        self.failed: Dict[str, str] = {}
        self.recent: Deque[Tuple[float, int]] = collections.deque()
        self.queue_depth: Optional[int] = None
        self.per_worker_queue: Optional[Dict[int, int]] = None

    def update(self, meta: Dict[str, Any], wait: float = 0.0) -> None:
        """Fold in one batch's ``meta`` (``wait``: seconds the main process waited for it)."""
        c = self.c
        n = int(meta.get("samples", 0))
        t_read = meta.get("t_read", 0.0)
        t_stages = meta.get("t_stages", 0.0)
        c["samples"] += n
        c["batches"] += 1
        if n == 0:
            c["empty_batches"] += 1
        c["bytes"] += meta.get("bytes", 0)
        c["pads"] += meta.get("pads", 0)
        c["skipped_samples"] += meta.get("skipped", 0)
        c["filtered"] += meta.get("filtered", 0)
        c["t_read"] += t_read
        c["t_stages"] += t_stages
        c["t_fetch_wait"] += meta.get("t_fetch_wait", 0.0)
        c["t_wait"] += wait
        w = int(meta.get("worker", 0))
        pw = self.per_worker.get(w)
        if pw is None:
            pw = self.per_worker[w] = [0, 0, 0.0, 0.0]
        pw[0] += n
        pw[1] += 1
        pw[2] += t_read
        pw[3] += t_stages
        if meta.get("failed"):
            self.failed.update(meta["failed"])
        now = time.time()
        self.recent.append((now, n))
        self._trim(now)

    def _trim(self, now: float) -> None:
        while self.recent and now - self.recent[0][0] > self.window:
            self.recent.popleft()

    def events(self, events: Iterable[Dict[str, Any]]) -> None:
        """Count cache/fetch events (``EVENT_COUNTERS``, bytes and seconds)."""
        c = self.c
        for ev in events:
            kind = ev.get("kind", "")
            if kind == EventKind.FETCH_DONE:
                c["bytes_fetched"] += ev.get("bytes", 0) or 0
                c["t_fetch"] += ev.get("seconds", 0.0) or 0.0
            elif kind == EventKind.EVICT:
                c["bytes_evicted"] += ev.get("bytes", 0) or 0
            elif kind in (EventKind.CACHE_HIT, EventKind.CACHE_MISS) and ev.get("prefetch"):
                # the prefetch thread's opens are not reads; its downloads are
                if kind == EventKind.CACHE_MISS:
                    c["prefetch_fetches"] += 1
                continue
            elif kind == EventKind.SKIP and ev.get("url"):
                self.failed[ev["url"]] = str(ev.get("error", ""))
            name = EVENT_COUNTERS.get(kind)
            if name:
                c[name] += 1

    def observe_queue(self, it: Any) -> None:
        """Record the DataLoader iterator's outstanding tasks (torch's private ``_tasks_outstanding`` /
        ``_task_info``); None for a single-process iterator."""
        depth = getattr(it, "_tasks_outstanding", None)
        if depth is None:
            return
        self.queue_depth = int(depth)
        info = getattr(it, "_task_info", None)
        if isinstance(info, dict):
            per: Dict[int, int] = dict.fromkeys(range(int(getattr(it, "_num_workers", 0) or 0)), 0)
            for t in list(info.values()):
                if len(t) == 1:  # sent to worker t[0], result not received yet
                    per[t[0]] = per.get(t[0], 0) + 1
            self.per_worker_queue = per

    def snapshot(self) -> Dict[str, Any]:
        """A JSON-able dict of every counter and rate (fields: ``docs/STATS.md``)."""
        c = self.c
        now = time.time()
        elapsed = max(1e-9, now - self.started)
        self._trim(now)
        if len(self.recent) >= 2:
            # samples after the first batch in the window, over the time since it
            span = max(1e-9, now - self.recent[0][0])
            recent_rate: float = sum(n for _, n in self.recent) - self.recent[0][1]
            recent_rate /= span
        else:
            recent_rate = c["samples"] / elapsed
        out: Dict[str, Any] = {k: int(c.get(k, 0)) for k in COUNTERS}
        out.update({k: float(c.get(k, 0.0)) for k in TIMERS})
        hits, misses = out["cache_hits"], out["cache_misses"]
        out["elapsed"] = elapsed
        out["samples_per_s"] = c["samples"] / elapsed
        out["recent_samples_per_s"] = recent_rate
        out["cache_hit_rate"] = hits / (hits + misses) if hits + misses else None
        out["shards_skipped"] = len(self.failed)
        out["failed_shards"] = dict(self.failed)
        out["per_worker_samples"] = {w: pw[0] for w, pw in sorted(self.per_worker.items())}
        out["per_worker"] = {w: {"samples": pw[0], "batches": pw[1], "t_read": pw[2], "t_stages": pw[3]}
                             for w, pw in sorted(self.per_worker.items())}
        out["queue_depth"] = self.queue_depth
        out["per_worker_queue"] = None if self.per_worker_queue is None else dict(self.per_worker_queue)
        return out


def flat_scalars(snapshot: Dict[str, Any]) -> Dict[str, float]:
    """The numeric fields of a snapshot, nested dicts flattened with ``/`` (what ``to_tensorboard`` writes).

    Example:
        >>> flat_scalars({"samples": 3, "cache_hit_rate": None, "per_worker": {0: {"samples": 3}}})
        {'samples': 3, 'worker0/samples': 3}
    """
    out: Dict[str, float] = {}
    for k, v in snapshot.items():
        if isinstance(v, bool):
            continue
        if isinstance(v, (int, float)):
            out[k] = v
        elif k == "per_worker" and isinstance(v, dict):
            for w, d in v.items():
                for name, x in d.items():
                    out[f"worker{w}/{name}"] = x
        elif k == "per_worker_queue" and isinstance(v, dict):
            for w, x in v.items():
                out[f"worker{w}/queue"] = x
    return out


__all__ = ["COUNTERS", "EVENT_COUNTERS", "Stats", "TIMERS", "flat_scalars"]
