"""The event protocol: every event kind, and what each consumer does with it.

Events flow one way::

    fetch / cache  --on_event(kind, url, **detail)-->  WebDataset (in the worker)
        --> batch meta["events"] --> WebLoader (main process)
        --> Stats (counters), Journal (events table, shard states), log, report

An event record is a plain dict ``{"kind": str, "url": str, "ts": float,
**detail}``; :class:`EventKind` is a ``str`` enum (``EventKind.SKIP ==
"skip"``).  What each kind does is written once, in :data:`EVENTS`; the
consumers derive their tables from it (:func:`stats_counters`, ...).

Example:
    >>> EventKind.SKIP == "skip", EVENTS[EventKind.SKIP].shard_state
    (True, 'failed')
    >>> stats_counters()["retry"]
    'retries'
"""

from __future__ import annotations

import logging
import time
from enum import Enum
from typing import Any, Callable, Dict, FrozenSet, List, NamedTuple, Optional, Tuple

from .config import verbose_level  # RESUMEWDS_VERBOSE is read (and checked) there

log = logging.getLogger("resumewds")


class EventKind(str, Enum):
    """Every event kind resumewds records (value: the string in records and the journal)."""

    FETCH_START = "fetch_start"      # fetch: a download attempt starts
    FETCH_DONE = "fetch_done"        # fetch: a download completed (bytes, seconds)
    RETRY = "retry"                  # fetch: a failed attempt will be retried
    VERIFY_OK = "verify_ok"          # cache: a checksum / size check passed
    VERIFY_FAIL = "verify_fail"      # cache: a check failed (expected, actual)
    REPAIR = "repair"                # cache: a corrupt copy is fetched again
    RANGE_REPAIR = "range_repair"    # repair: a cached sample failed its digest, its range is fetched again
    RANGE_REPAIR_DONE = "range_repair_done"  # repair: a cached copy mended by ranges (bytes, samples)
    EVICT = "evict"                  # cache: an entry was removed for cache_size
    CACHE_HIT = "cache_hit"          # cache: a reader found the shard verified
    CACHE_MISS = "cache_miss"        # cache: a reader had to download it
    SKIP = "skip"                    # dataset: on_error="skip" skips a shard
    FAIL = "fail"                    # dataset: on_error="raise" gives up on a shard
    SAMPLE_SKIP = "sample_skip"      # pipeline: a stage's handler skipped one sample
    RECOVERED = "recovered"          # loader: a shard recorded as failed was read again
    RESUME = "resume"                # loader: a run resumed (journal or state dict)
    CONFIG_CHANGE = "config_change"  # journal: a compatible setting changed on resume
    REWIND = "rewind"                # journal: resumed at an older step than the newest
    SKIP_STEPS = "skip_steps"        # loader: steps [S, S+K) skipped on purpose (loss-spike recovery)
    INVALID_TRANSITION = "invalid_transition"  # journal: a shard state move outside TRANSITIONS

    def __str__(self) -> str:
        return self.value


class EventSpec(NamedTuple):
    """What one kind means to each consumer.

    Attributes:
        producer: the module that emits it (documentation; checked by the test).
        counter: the :class:`resumewds.run._stats.Stats` counter it increments, or None.
        shard_state: the journal shard state it moves the shard to, or None.
        shard_counter: the journal ``shards`` column it increments, or None.
        level: the log level :func:`event_record` logs it at.
        lane: its row on the report's timeline (0 = top), or None.
        error: listed among ``status``' ``last_errors``.
        journaled: written to the journal's ``events`` table (False: per-open
            chatter, whose effect on the shard row is still applied).
    """

    producer: str
    counter: Optional[str] = None
    shard_state: Optional[str] = None
    shard_counter: Optional[str] = None
    level: int = logging.DEBUG
    lane: Optional[int] = None
    error: bool = False
    journaled: bool = True


K = EventKind
INFO = logging.INFO

#: the one table: kind -> what stats, journal, log and report do with it
EVENTS: Dict[EventKind, EventSpec] = {
    K.FETCH_START: EventSpec("fetch", shard_state="downloading", shard_counter="attempts",
                             journaled=False),
    K.FETCH_DONE: EventSpec("fetch", counter="shards_downloaded", shard_state="downloaded", level=INFO),
    K.RETRY: EventSpec("fetch", counter="retries", shard_counter="retries", level=INFO, lane=1,
                       error=True),
    K.VERIFY_OK: EventSpec("cache", counter="verifications", shard_state="verified", level=INFO,
                           journaled=False),
    K.VERIFY_FAIL: EventSpec("cache", counter="verify_failures", shard_state="corrupt", level=INFO,
                             lane=2, error=True),
    K.REPAIR: EventSpec("cache", counter="repairs", shard_state="downloading", shard_counter="repairs",
                        level=INFO, lane=3),
    # a cached copy mended sample by sample (resumewds verify names each one); also a REPAIR
    K.RANGE_REPAIR: EventSpec("cache._repair", level=INFO),
    K.RANGE_REPAIR_DONE: EventSpec("cache._repair", level=INFO),
    K.EVICT: EventSpec("cache", counter="evictions", shard_state="pending", level=INFO, lane=6),
    K.CACHE_HIT: EventSpec("cache", counter="cache_hits", shard_state="verified", journaled=False),
    K.CACHE_MISS: EventSpec("cache", counter="cache_misses"),
    # skip: Stats keeps {url: error} (shards_skipped); the dataset logs the warning itself
    K.SKIP: EventSpec("read._shards", shard_state="failed", lane=4, error=True),
    K.FAIL: EventSpec("read._shards", counter="failures", shard_state="failed", level=INFO, lane=5,
                      error=True),
    # sample_skip: counted as skipped_samples through the step's meta; the loader warns
    # once per epoch with the keys; logged at INFO (RESUMEWDS_VERBOSE=1)
    K.SAMPLE_SKIP: EventSpec("stages._handling", level=INFO),
    K.RECOVERED: EventSpec("run._loader", shard_state="verified", level=INFO),
    K.RESUME: EventSpec("run._loader", level=INFO, lane=0),
    K.CONFIG_CHANGE: EventSpec("journal", lane=8),
    K.REWIND: EventSpec("journal", lane=7),
    K.SKIP_STEPS: EventSpec("run._loader", level=INFO, lane=10),
    K.INVALID_TRANSITION: EventSpec("journal", lane=9, error=True),
}


def _kinds(pred: Callable[[EventSpec], bool]) -> Tuple[str, ...]:
    return tuple(k.value for k, s in EVENTS.items() if pred(s))


def stats_counters() -> Dict[str, str]:
    """``{kind: Stats counter}`` for the kinds that increment one."""
    return {k.value: s.counter for k, s in EVENTS.items() if s.counter}


def shard_effects() -> Dict[str, Tuple[Optional[str], Optional[str]]]:
    """``{kind: (new shard state or None, shards column to increment or None)}``."""
    return {k.value: (s.shard_state, s.shard_counter) for k, s in EVENTS.items()
            if s.shard_state or s.shard_counter}


def info_kinds() -> FrozenSet[str]:
    """Kinds logged at INFO or above (``RESUMEWDS_VERBOSE=1``)."""
    return frozenset(_kinds(lambda s: s.level >= logging.INFO))


def error_kinds() -> Tuple[str, ...]:
    """Kinds listed as errors by ``status`` (``last_errors``)."""
    return _kinds(lambda s: s.error)


def unjournaled_kinds() -> FrozenSet[str]:
    """Kinds the loader does not write to the journal's events table."""
    return frozenset(_kinds(lambda s: not s.journaled))


def timeline_kinds() -> List[str]:
    """Kinds on the report's timeline, top to bottom."""
    return [k.value for k, s in sorted(((k, s) for k, s in EVENTS.items() if s.lane is not None),
                                       key=lambda ks: ks[1].lane)]  # type: ignore[arg-type,return-value]


def level_of(kind: str) -> int:
    """The log level of ``kind`` (DEBUG for a kind not in the table)."""
    try:
        return EVENTS[EventKind(kind)].level
    except ValueError:
        return logging.DEBUG


__all__ = ["EVENTS", "EventKind", "EventSpec", "INFO_EVENTS", "error_kinds", "event_record", "info_kinds",
           "level_of", "setup_logging", "shard_effects", "stats_counters", "timeline_kinds", "unjournaled_kinds",
           "worker_logging"]


# ---- logging: each event logged once, where it happened ----------------------------

_FORMAT = "%(asctime)s resumewds[%(process)d] %(levelname)s %(message)s"


def _mb_per_s(nbytes: float, seconds: float) -> str:
    return f"{nbytes / seconds / 1e6:.1f} MB/s" if seconds > 0 else "-"


def _describe(kind: str, url: str, d: Dict[str, Any]) -> str:
    if kind == EventKind.FETCH_DONE:
        b, s = d.get("bytes") or 0, d.get("seconds") or 0.0
        resumed = f", resumed at byte {d['resumed_from']}" if d.get("resumed_from") else ""
        return f"fetched {url}: {b} bytes in {s:.3f}s ({_mb_per_s(b, s)}{resumed})"
    if kind == EventKind.RETRY:
        return (f"retry {url}: attempt {d.get('attempt')} failed ({d.get('error')}); "
                f"next in {float(d.get('wait') or 0):.2f}s")
    if kind == EventKind.VERIFY_OK:
        return f"verified {url}"
    if kind == EventKind.VERIFY_FAIL:
        return f"verification failed {url}: expected {d.get('expected')}, got {d.get('actual')}"
    if kind == EventKind.REPAIR:
        return f"repairing {url} (attempt {d.get('attempt')})"
    if kind == EventKind.EVICT:
        return f"evicted {url} ({d.get('bytes')} bytes)"
    if kind in (EventKind.SKIP, EventKind.FAIL):
        return f"{kind} {url}: {d.get('error')}"
    if kind == EventKind.FETCH_START:
        return f"fetching {url}" + (f" from byte {d['resumed_from']}" if d.get("resumed_from") else "")
    extra = {k: v for k, v in d.items() if k not in ("kind", "url", "ts")}
    return f"{kind} {url} {extra}" if extra else f"{kind} {url}"


#: logged at INFO (``RESUMEWDS_VERBOSE=1``); everything else at DEBUG (from the events table)
INFO_EVENTS = info_kinds()


def event_record(kind: str, url: str, detail: Dict[str, Any]) -> Dict[str, Any]:
    """Build the event dict a worker attaches to its batch, and log it.

    The record holds the kind's plain string value; logged once, here, where it happened.
    """
    kind = str(getattr(kind, "value", kind))
    ev: Dict[str, Any] = {"kind": kind, "url": url, "ts": time.time()}
    ev.update(detail)
    level = level_of(kind)
    if log.isEnabledFor(level):
        log.log(level, "%s", _describe(kind, url, detail))
    return ev


def _level_from(verbose: bool) -> Optional[int]:
    return {2: logging.DEBUG, 1: logging.INFO}.get(verbose_level(verbose))


def setup_logging(verbose: bool = False) -> None:
    """Make the ``resumewds`` logger talk: INFO with ``verbose`` or
    ``RESUMEWDS_VERBOSE=1``, DEBUG with ``RESUMEWDS_VERBOSE=2``."""
    level = _level_from(verbose)
    if level is None:
        return
    logger = logging.getLogger("resumewds")
    if logger.level == logging.NOTSET or logger.level > level:
        logger.setLevel(level)
    _stderr_handler(logger)


def _stderr_handler(logger: logging.Logger) -> None:
    """One stderr handler, only if the application configured none."""
    if not logger.handlers and not logging.getLogger().handlers:
        h = logging.StreamHandler()
        h.setFormatter(logging.Formatter(_FORMAT))
        logger.addHandler(h)


def worker_logging(level: int) -> None:
    """In a DataLoader worker: use the main process's ``resumewds`` level (a no-op after ``fork``)."""
    logger = logging.getLogger("resumewds")
    if not level or logger.level != logging.NOTSET:
        return
    logger.setLevel(level)
    _stderr_handler(logger)


