"""Counters and rates, aggregated in the main process from worker metadata.

Workers never share memory with the main process; every batch they produce
carries a small ``meta`` dict (see :meth:`resumewds.dataset.WebDataset.iter_steps`)
and :class:`Stats` folds it in.  Collecting costs a few dict updates per
batch, not per sample.

Example:
    >>> s = Stats()
    >>> s.update({"worker": 0, "samples": 4, "bytes": 100, "events": [{"kind": "retry"}]})
    >>> s.snapshot()["samples"], s.snapshot()["retries"]
    (4, 1)
"""

from __future__ import annotations

import collections
import time
from typing import Any, Deque, Dict, Iterable, Optional, Tuple

EVENT_COUNTERS = {
    "fetch_done": "shards_downloaded",
    "retry": "retries",
    "repair": "repairs",
    "evict": "evictions",
    "skip": "shards_skipped",
    "cache_hit": "cache_hits",
    "cache_miss": "cache_misses",
    "verify_fail": "verify_failures",
    "verify_ok": "verifications",
}


class Stats:
    """Loader statistics.

    Args:
        window: seconds over which the recent rate is computed.
    """

    def __init__(self, window: float = 10.0):
        self.window = window
        self.started = time.time()
        self.c: Dict[str, float] = collections.defaultdict(float)
        self.per_worker: Dict[int, int] = collections.defaultdict(int)
        self.failed: Dict[str, str] = {}
        self.recent: Deque[Tuple[float, int]] = collections.deque()
        self.queue_depth: Optional[int] = None

    def update(self, meta: Dict[str, Any], wait: float = 0.0) -> None:
        c = self.c
        n = int(meta.get("samples", 0))
        c["samples"] += n
        c["batches"] += 1
        c["bytes"] += meta.get("bytes", 0)
        c["pads"] += meta.get("pads", 0)
        c["skipped_samples"] += meta.get("skipped", 0)
        c["filtered"] += meta.get("filtered", 0)
        c["t_read"] += meta.get("t_read", 0.0)
        c["t_stages"] += meta.get("t_stages", 0.0)
        c["t_wait"] += wait
        self.per_worker[int(meta.get("worker", 0))] += n
        self.events(meta.get("events", ()))
        if meta.get("failed"):
            self.failed.update(meta["failed"])
        now = time.time()
        self.recent.append((now, n))
        while self.recent and now - self.recent[0][0] > self.window:
            self.recent.popleft()

    def events(self, events: Iterable[Dict[str, Any]]) -> None:
        c = self.c
        for ev in events:
            kind = ev.get("kind", "")
            name = EVENT_COUNTERS.get(kind)
            if name:
                c[name] += 1
            if kind == "fetch_done":
                c["bytes_fetched"] += ev.get("bytes", 0) or 0
                c["t_fetch"] += ev.get("seconds", 0.0) or 0.0
            if kind == "skip" and ev.get("url"):
                self.failed[ev["url"]] = str(ev.get("error", ""))

    def snapshot(self) -> Dict[str, Any]:
        """A JSON-able dict of every counter and rate (see the README for fields)."""
        c = self.c
        now = time.time()
        elapsed = max(1e-9, now - self.started)
        if len(self.recent) >= 2:
            span = max(1e-9, now - self.recent[0][0])
            recent_rate = sum(n for _, n in self.recent) / span
        else:
            recent_rate = c["samples"] / elapsed
        hits, misses = c["cache_hits"], c["cache_misses"]
        out: Dict[str, Any] = {k: (int(v) if float(v).is_integer() and not k.startswith("t_") else v)
                               for k, v in c.items()}
        for k in ("samples", "batches", "bytes", "pads", "skipped_samples", "filtered",
                  "shards_downloaded", "bytes_fetched", "cache_hits", "cache_misses", "retries",
                  "repairs", "evictions", "shards_skipped", "verify_failures", "verifications"):
            out.setdefault(k, 0)
        for k in ("t_read", "t_stages", "t_wait", "t_fetch"):
            out.setdefault(k, 0.0)
        out["elapsed"] = elapsed
        out["samples_per_s"] = c["samples"] / elapsed
        out["recent_samples_per_s"] = recent_rate
        out["cache_hit_rate"] = hits / (hits + misses) if hits + misses else None
        out["per_worker_samples"] = {int(k): v for k, v in sorted(self.per_worker.items())}
        out["queue_depth"] = self.queue_depth
        out["failed_shards"] = dict(self.failed)
        return out


def setup_logging(verbose: bool = False) -> None:
    """Make the ``resumewds`` logger talk: INFO with ``verbose`` or
    ``RESUMEWDS_VERBOSE=1``, DEBUG with ``RESUMEWDS_VERBOSE=2``.

    Adds one stderr handler only if the application configured none.
    """
    import logging
    import os

    env = os.environ.get("RESUMEWDS_VERBOSE", "")
    level = None
    if env.strip() in ("2", "debug"):
        level = logging.DEBUG
    elif verbose or env.strip().lower() in ("1", "true", "yes", "info"):
        level = logging.INFO
    if level is None:
        return
    logger = logging.getLogger("resumewds")
    logger.setLevel(level)
    if not logger.handlers and not logging.getLogger().handlers:
        h = logging.StreamHandler()
        h.setFormatter(logging.Formatter("%(asctime)s resumewds %(levelname)s %(message)s"))
        logger.addHandler(h)
