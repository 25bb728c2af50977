"""A run as plain data, read from its journal (every rank file) through its public read API: no
HTML, no plotly.  :func:`full_status` is what ``resumewds status`` shows, :func:`load_run` what
the report draws, :func:`throughput_series` / :func:`hit_rate_series` the plotted series (pure).

Example:
    >>> with rw.journal.Journal("run.db") as j:
    ...     j.commit(1, epoch=0, position=5, consumed={("data/a.tar", 0): (5, 5)})
    >>> full_status("run.db")["shards"]["counts"]
    {'read': 1}
"""

from __future__ import annotations

import bisect
import math
import os
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ..journal import RunReader, summarize
from ..mixing import mixture_status

#: at most this many commits per rank, and events per kind, go into load_run's data
MAX_POINTS = 2000
MAX_EVENTS = 5000

#: event kinds on the timeline, in display order (top to bottom), with colours
TIMELINE_KINDS: Dict[str, str] = {
    "resume": "#6c5ce7",
    "retry": "#f0a202",
    "verify_fail": "#e17055",
    "repair": "#0984e3",
    "skip": "#d63031",
    "fail": "#b71c1c",
    "evict": "#636e72",
    "rewind": "#00b894",
    "config_change": "#00cec9",
    "invalid_transition": "#a29bfe",
    "skip_steps": "#e84393",
}

#: shard states in display order (the status counts, the report's shard map), with colours
STATE_COLORS: Dict[str, str] = {
    "verified": "#2e9e5b",
    "downloaded": "#74b9ff",
    "downloading": "#0984e3",
    "pending": "#b2bec3",
    "corrupt": "#f0a202",
    "failed": "#d63031",
    "read": "#55a87a",
    "evicted": "#8395a7",
    "not tracked": "#dfe6e9",
}


def _strided(rows: List[Dict[str, Any]], limit: int) -> List[Dict[str, Any]]:
    if len(rows) <= limit:
        return rows
    stride = math.ceil(len(rows) / limit)
    out = rows[::stride]
    if out[-1] is not rows[-1]:
        out.append(rows[-1])
    return out


def load_run(path: str) -> Dict[str, Any]:
    """Everything the report draws, as JSON-able data, from one :class:`~resumewds.journal.RunReader`:
    ``{"status", "commits": {rank: [...]}, "events", "consumption": {url: {samples, total}}, "downloads":
    {count, bytes, seconds}, "evicted": {url: n}, "latest_stats"}`` (rank 0's newest snapshot or None).
    At most :data:`MAX_POINTS` commits per rank (strided) and :data:`MAX_EVENTS` events per kind (the
    newest); ``consumption`` is the latest epoch with any; downloads and evictions are summed over
    every rank and loader.  Raises :class:`~resumewds.errors.JournalError` where no readable journal is
    at ``path``.
    """
    with RunReader(path) as run:
        st = summarize(run)
        totals = run.event_totals()
        by_epoch = run.consumption()
        all_commits = run.commits()
        events = run.events(list(TIMELINE_KINDS), MAX_EVENTS)
    st = complete_status(st, by_epoch, totals)
    commits: Dict[int, List[Dict[str, Any]]] = {}
    for r, rows in all_commits.items():
        snaps = [row for row in rows if row["stats"]]
        kept = _strided(rows, MAX_POINTS)
        keep = {id(x) for x in kept}
        kept = kept + [x for x in _strided(snaps, MAX_POINTS) if id(x) not in keep]
        kept.sort(key=lambda x: (x["ts"], x["step"]))
        commits[r] = kept
    shown = st.get("consumption", {}).get("epoch")
    consumption = by_epoch.get(shown, {}) if shown is not None else {}
    snaps0 = [c for c in commits.get(0, []) if c.get("stats")]
    return {"status": st, "commits": commits, "events": events, "consumption": consumption,
            "downloads": totals["downloads"], "evicted": totals["evicted"],
            "latest_stats": snaps0[-1]["stats"] if snaps0 else None}


def full_status(path: str) -> Dict[str, Any]:
    """What ``resumewds status`` shows: the journal's summary completed by :func:`complete_status` (a
    :class:`~resumewds.errors.JournalError` where no readable journal is at ``path``)."""
    with RunReader(path) as run:
        st = summarize(run)
        if st.get("run_id") is None and st.get("latest") is None:
            return st
        return complete_status(st, run.consumption(), run.event_totals())


def complete_status(st: Dict[str, Any], by_epoch: Dict[int, Dict[str, Dict[str, Any]]],
                    totals: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """Fill in what the journal's summary leaves out (changes ``st`` in place and returns it).

    * Shards read from local files have no cache state: they count as ``read`` (from the
      consumption of every epoch); ``shards.total`` is at least the configured shard count.
    * A shard the cache evicted is ``evicted``, not ``pending``.
    * A latest commit at position 0 of epoch e > 0 finished epoch e - 1: ``complete_epochs`` says
      so, and ``consumption`` shows that epoch with ``complete: True``.

    Example:
        >>> st = {"shards": {"total": 0, "counts": {}, "list": []}, "config": {"shards": 1},
        ...       "latest": {"epoch": 1, "position": 0}, "consumption": {"epoch": 1}}
        >>> st = complete_status(st, {0: {"/d/a.tar": {"samples": 5, "total": 5}}})
        >>> st["shards"]["counts"], st["complete_epochs"], st["consumption"]["shards_complete"]
        ({'read': 1}, 1, 1)
    """
    totals = totals or {}
    sh = st.setdefault("shards", {"total": 0, "counts": {}, "list": []})
    listed = {x["url"]: x for x in sh.get("list") or []}
    evicted = totals.get("evicted") or {}
    last_evict = totals.get("last_evict") or {}
    last_fetch = totals.get("last_fetch") or {}
    for url, x in listed.items():
        if x.get("state") == "pending" and evicted.get(url) and \
                last_evict.get(url, 0) >= last_fetch.get(url, 0):
            x["state"] = "evicted"
            x["evictions"] = evicted[url]
    consumed: Dict[str, int] = {}
    for rows in by_epoch.values():
        for url, c in rows.items():
            consumed[url] = consumed.get(url, 0) + int(c.get("samples") or 0)
    for url, n in sorted(consumed.items()):
        if url not in listed and n > 0:
            listed[url] = {"url": url, "name": os.path.basename(url), "state": "read",
                           "note": "local shard (read in place, not cached)"}
    counts: Dict[str, int] = {}
    for x in listed.values():
        counts[x["state"]] = counts.get(x["state"], 0) + 1
    ordered = {k: counts[k] for k in STATE_COLORS if k in counts}
    ordered.update({k: v for k, v in counts.items() if k not in ordered})
    sh["counts"] = {k: v for k, v in ordered.items() if v} if listed else (sh.get("counts") or {})
    sh["list"] = sorted(listed.values(), key=lambda x: x["url"])
    cfg_shards = (st.get("config") or {}).get("shards")
    sh["total"] = max(len(listed), int(cfg_shards or 0), int(sh.get("total") or 0))
    latest = st.get("latest") or {}
    done = int(latest["epoch"]) if latest.get("position") == 0 and (latest.get("epoch") or 0) > 0 else None
    st["complete_epochs"] = done if done is not None else int(latest.get("epoch") or 0)
    _add_mixture(st)
    cons = st.get("consumption") or {}
    shown = cons.get("epoch")
    if done is not None and (shown is None or not by_epoch.get(shown)) and by_epoch.get(done - 1):
        rows = by_epoch[done - 1]
        st["consumption"] = {
            "epoch": done - 1, "samples": sum(int(c.get("samples") or 0) for c in rows.values()),
            "shards_started": sum(1 for c in rows.values() if c.get("samples")),
            "shards_complete": sum(1 for c in rows.values()
                                   if c.get("total") is not None and c["samples"] >= c["total"]),
            "complete": True}
    return st


def _add_mixture(st: Dict[str, Any]) -> None:
    """``st["mixture"]``, for a mixture run only: per-source delivered vs requested at the latest
    commit (:func:`resumewds.mixing.mixture_status`, equal to the live ``loader.stats()["mixture"]``);
    a config that cannot be evaluated gets ``st["mixture_error"]``."""
    cfg = st.get("config") or {}
    if not cfg.get("mixture_sources"):
        return
    latest = st.get("latest") or {}
    try:
        mx = mixture_status(cfg, int(latest.get("epoch") or 0), int(latest.get("position") or 0))
    except (ArithmeticError, KeyError, TypeError, ValueError) as exc:
        st["mixture_error"] = f"the journal's mixture config cannot be evaluated: {type(exc).__name__}: {exc}"
        return
    if mx is not None:
        st["mixture"] = mx


def throughput_series(commits: List[Dict[str, Any]], min_dt: float = 0.0, breaks: Sequence[float] = ()
                      ) -> Tuple[List[float], List[Optional[float]]]:
    """``(ts, samples/s)`` between commits of one rank at least ``min_dt`` apart (each point: the rate
    since the previous one).  A drop in ``samples_total`` (a fresh loader) starts over; a resume (a
    time in ``breaks``) is a gap (a ``None`` point), not slow progress.

    Example:
        >>> throughput_series([{"ts": 0, "samples_total": 0}, {"ts": 2, "samples_total": 10}])
        ([2], [5.0])
        >>> throughput_series([{"ts": 0, "samples_total": 0}, {"ts": 1, "samples_total": 10},
        ...                    {"ts": 60, "samples_total": 12}, {"ts": 61, "samples_total": 22}],
        ...                   breaks=[59.5])
        ([1, 59.5, 61], [10.0, None, 10.0])
    """
    cuts = sorted(breaks)
    xs: List[float] = []
    ys: List[Optional[float]] = []
    prev = None
    for c in commits:
        if c.get("samples_total") is None:
            continue
        if prev is not None:
            k = bisect.bisect_right(cuts, prev["ts"])
            if k < len(cuts) and cuts[k] <= c["ts"]:  # a resume lies between: a gap
                if ys and ys[-1] is not None:
                    xs.append(cuts[k])
                    ys.append(None)
                prev = c
                continue
            dt = c["ts"] - prev["ts"]
            dn = c["samples_total"] - prev["samples_total"]
            if dn < 0:
                prev = c
                continue
            if dt <= 0 or dt < min_dt:
                continue
            xs.append(c["ts"])
            ys.append(dn / dt)
        prev = c
    return xs, ys


def hit_rate_series(commits: List[Dict[str, Any]], breaks: Sequence[float] = ()
                    ) -> Tuple[List[float], List[Optional[float]], List[Optional[float]]]:
    """``(ts, interval hit rate, cumulative hit rate)`` from stats snapshots; the cumulative rate
    restarts with each loader, an interval without opens is None, a resume (``breaks``) a gap.

    Example:
        >>> snaps = [{"ts": 1, "stats": {"cache_hits": 0, "cache_misses": 2}},
        ...          {"ts": 2, "stats": {"cache_hits": 6, "cache_misses": 2}}]
        >>> hit_rate_series(snaps)
        ([1, 2], [0.0, 1.0], [0.0, 0.75])
        >>> hit_rate_series(snaps, breaks=[1.5])
        ([1, 1.5, 2], [0.0, None, 1.0], [0.0, None, 0.75])
    """
    cuts = sorted(breaks)
    xs: List[float] = []
    interval: List[Optional[float]] = []
    cumulative: List[Optional[float]] = []
    ph = pm = 0
    prev_ts: Optional[float] = None
    for c in commits:
        s = c.get("stats")
        if not s or "cache_hits" not in s:
            continue
        if prev_ts is not None:
            k = bisect.bisect_right(cuts, prev_ts)
            if k < len(cuts) and cuts[k] <= c["ts"]:
                xs.append(cuts[k])
                interval.append(None)
                cumulative.append(None)
        h, m = int(s.get("cache_hits") or 0), int(s.get("cache_misses") or 0)
        if h < ph or m < pm:  # a new loader: its counters restarted
            ph = pm = 0
        dh, dm = h - ph, m - pm
        xs.append(c["ts"])
        interval.append(dh / (dh + dm) if dh + dm else None)
        cumulative.append(h / (h + m) if h + m else None)
        ph, pm = h, m
        prev_ts = c["ts"]
    return xs, interval, cumulative


__all__ = ["MAX_EVENTS", "MAX_POINTS", "STATE_COLORS", "TIMELINE_KINDS", "complete_status", "full_status",
           "hit_rate_series", "load_run", "throughput_series"]
