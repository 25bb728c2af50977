"""``resumewds report``: one self-contained HTML page about a run.

The page reads every rank file of a journal (:func:`resumewds.journal.run_journal_paths`)
and shows:

- a summary header: run id, epoch and position, samples delivered, shard
  states, retries / repairs / failures / evictions / resumes, throughput,
  cache hit rate, the resume point;
- throughput over time (samples/s per rank, from the commits' ``ts`` and
  ``samples_total``; dots: the loader's own ``recent_samples_per_s`` from
  the stats snapshots; dashed lines: resumes);
- cache hit rate over time (from the stats snapshots' ``cache_hits`` and
  ``cache_misses``, per interval and cumulative);
- a timeline of retries, repairs, verification failures, skips, failures,
  evictions and resumes (the journal's events; hover for url and error);
- a map of the shards, one square per shard, coloured by state (hover for
  bytes, attempts, retries, repairs, last error and consumption);
- the latest errors.

plotly.js is embedded in the page (no CDN): it renders offline, from a file,
years later.  plotly (the Python package) is imported only here, only when a
report is made; without it :func:`write_report` raises ``ReportError``
telling the user to ``pip install 'resumewds[report]'``.

Big runs stay small: at most ``MAX_POINTS`` throughput points per rank
(commits are strided) and ``MAX_EVENTS`` events per kind (the newest).

Example:
    >>> write_report("run.db", "report.html")        # doctest: +SKIP
    'report.html'
"""

from __future__ import annotations

import datetime
import html
import json
import math
import os
import time
from typing import Any, Dict, List, Optional, Sequence, Tuple

from .errors import ResumeWDSError

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


class ReportError(ResumeWDSError):
    """The report cannot be made (plotly missing, nothing to report)."""


def _require_plotly() -> Any:
    try:
        import plotly.graph_objects as go
        import plotly.offline  # noqa: F401
    except ImportError as exc:
        raise ReportError("resumewds report needs plotly: pip install 'resumewds[report]' "
                          "(or: pip install plotly)") from exc
    return go


# ---------------------------------------------------------------------------
# Reading the journal (all ranks)
# ---------------------------------------------------------------------------

def _strided(rows: List[Dict[str, Any]], limit: int) -> List[Dict[str, Any]]:
    if len(rows) <= limit:
        return rows
    stride = math.ceil(len(rows) / limit)
    out = rows[::stride]
    if out[-1] is not rows[-1]:
        out.append(rows[-1])
    return out


def load_run(path: str) -> Dict[str, Any]:
    """Everything the report draws, as plain data (JSON-able).

    Reads the journal only through its public read API: one
    :class:`~resumewds.journal.RunReader` (every rank file, opened once) and
    :func:`~resumewds.journal.summarize` (what ``status()`` returns).

    Returns:
        ``{"status": journal.status(path) completed by :func:`complete_status`,
        "commits": {rank: [...]}, "events": [...], "consumption": {url:
        {samples, total}}, "downloads": {count, bytes, seconds}, "evicted":
        {url: n}, "latest_stats": rank 0's newest stats snapshot or None}``;
        commits carry ``step, epoch, position, ts, samples_total, stats``
        (parsed), events ``ts, rank, kind, url, detail`` (parsed).
        ``consumption`` is the epoch shown (the latest one with any
        consumption: a finished run shows its last epoch, not the empty next
        one).  Downloads and evictions are summed over every rank and every
        loader of the run.

    Raises:
        JournalError: no journal at ``path``, or an unreadable file.
    """
    from . import journal as J

    with J.RunReader(path) as run:
        st = J.summarize(run)
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
    """What ``resumewds status`` shows: :func:`resumewds.journal.status`
    completed by :func:`complete_status` (local shards, finished epochs,
    evictions), from one :class:`~resumewds.journal.RunReader`.

    Raises:
        JournalError: no journal at ``path``, or an unreadable file.

    Example:
        >>> with rw.journal.Journal("run.db") as j:
        ...     j.commit(1, epoch=0, position=5, consumed={("data/a.tar", 0): (5, 5)})
        >>> full_status("run.db")["shards"]["counts"]
        {'read': 1}
    """
    from . import journal as J

    with J.RunReader(path) as run:
        st = J.summarize(run)
        if st.get("run_id") is None and st.get("latest") is None:
            return st
        return complete_status(st, run.consumption(), run.event_totals())


def complete_status(st: Dict[str, Any], by_epoch: Dict[int, Dict[str, Dict[str, Any]]],
                    totals: Optional[Dict[str, Any]] = None) -> Dict[str, Any]:
    """Fill in what :func:`resumewds.journal.status` leaves out, for ``status`` and ``report``.

    * Shards read from local files have no cache state: they are counted as
      ``read`` (from the journal's consumption of every epoch) instead of the
      run showing "shards 0".  ``shards.total`` is at least the run's
      configured shard count.
    * A shard the cache evicted is ``evicted``, not ``pending``.
    * A run whose latest commit is at position 0 of epoch e > 0 has
      finished epoch e - 1: ``complete_epochs`` says so, and ``consumption``
      shows that epoch (not the empty next one) with ``complete: True``.

    Args:
        st: a ``status()`` dict (changed in place and returned).
        by_epoch: :func:`resumewds.journal.read_consumption` of the run.
        totals: :func:`resumewds.journal.read_event_totals` of the run.

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
    done = None
    if latest.get("position") == 0 and (latest.get("epoch") or 0) > 0:
        done = int(latest["epoch"])
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
    """``st["mixture"]``: per-source delivered vs requested, for a mixture run only.

    Computed from the journal's config and the latest commit alone
    (:func:`resumewds.mixdataset.mixture_status`), so it equals the live
    ``loader.stats()["mixture"]`` at that commit.  A run that is not a mixture
    gets no key (its status is unchanged); a mixture config that cannot be
    evaluated gets ``st["mixture_error"]``, a one-line reason.
    """
    cfg = st.get("config") or {}
    if not cfg.get("mixture_sources"):
        return
    latest = st.get("latest") or {}
    from .mixdataset import mixture_status

    try:
        mx = mixture_status(cfg, int(latest.get("epoch") or 0), int(latest.get("position") or 0))
    except (ArithmeticError, KeyError, TypeError, ValueError) as exc:
        st["mixture_error"] = f"the journal's mixture config cannot be evaluated: {type(exc).__name__}: {exc}"
        return
    if mx is not None:
        st["mixture"] = mx


# ---------------------------------------------------------------------------
# Series (pure: data in, lists out)
# ---------------------------------------------------------------------------

def throughput_series(commits: List[Dict[str, Any]], min_dt: float = 0.0, breaks: Sequence[float] = ()
                      ) -> Tuple[List[float], List[Optional[float]]]:
    """``(ts, samples/s)`` between commits of one rank at least ``min_dt`` apart.

    Each point is the rate since the previous point (so ``min_dt`` smooths
    a commit-per-step run).  A commit whose ``samples_total`` went down (a
    fresh loader without a journal) starts over.  A resume (a time in
    ``breaks``) between two commits is downtime, not slow progress: no rate
    is drawn across it; a ``None`` point (a gap in the line) is put there.

    Example:
        >>> throughput_series([{"ts": 0, "samples_total": 0}, {"ts": 2, "samples_total": 10}])
        ([2], [5.0])
        >>> throughput_series([{"ts": 0, "samples_total": 0}, {"ts": 1, "samples_total": 10},
        ...                    {"ts": 60, "samples_total": 12}, {"ts": 61, "samples_total": 22}],
        ...                   breaks=[59.5])
        ([1, 59.5, 61], [10.0, None, 10.0])
    """
    import bisect

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
    """``(ts, interval hit rate, cumulative hit rate)`` from stats snapshots.

    The cumulative rate restarts with each loader (its counters start at 0);
    an interval without shard opens has rate None (a gap).  A resume (a
    time in ``breaks``) between two snapshots is a gap in both lines.

    Example:
        >>> snaps = [{"ts": 1, "stats": {"cache_hits": 0, "cache_misses": 2}},
        ...          {"ts": 2, "stats": {"cache_hits": 6, "cache_misses": 2}}]
        >>> hit_rate_series(snaps)
        ([1, 2], [0.0, 1.0], [0.0, 0.75])
        >>> hit_rate_series(snaps, breaks=[1.5])
        ([1, 1.5, 2], [0.0, None, 1.0], [0.0, None, 0.75])
    """
    import bisect

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


# ---------------------------------------------------------------------------
# Figures
# ---------------------------------------------------------------------------

def _dt(ts: float) -> datetime.datetime:
    return datetime.datetime.fromtimestamp(ts)


_BASE_LAYOUT = dict(template="plotly_white", height=340, margin=dict(l=60, r=20, t=10, b=40),
                    font=dict(family="-apple-system, Segoe UI, Roboto, Helvetica, Arial, sans-serif",
                              size=12),
                    legend=dict(orientation="h", yanchor="bottom", y=1.02, x=0),
                    hovermode="closest")


def _time_range(data: Dict[str, Any]) -> Optional[Tuple[float, float]]:
    ts = [c["ts"] for cs in data["commits"].values() for c in cs]
    ts += [e["ts"] for e in data["events"] if e.get("ts")]
    if not ts:
        return None
    lo, hi = min(ts), max(ts)
    pad = max(0.5, (hi - lo) * 0.02)
    return lo - pad, hi + pad


def _shared_x(fig: Any, data: Dict[str, Any]) -> None:
    """Every time chart spans the whole run, so they line up by eye."""
    rng = _time_range(data)
    if rng is not None:
        fig.update_xaxes(range=[_dt(rng[0]), _dt(rng[1])], type="date")


_PALETTE = ["#0984e3", "#e17055", "#00b894", "#6c5ce7", "#fdcb6e", "#636e72"]


def _throughput_fig(go: Any, data: Dict[str, Any]) -> Optional[Any]:
    fig = go.Figure()
    rng = _time_range(data)
    min_dt = (rng[1] - rng[0]) / 150 if rng else 0.0
    palette = _PALETTE
    any_points = False
    for i, (r, commits) in enumerate(sorted(data["commits"].items())):
        color = palette[i % len(palette)]
        resumes = [e["ts"] for e in data["events"] if e["kind"] == "resume" and e.get("rank") == r
                   and e.get("ts")]
        xs, ys = throughput_series(commits, min_dt, breaks=resumes)
        if xs:
            any_points = True
            fig.add_trace(go.Scatter(x=[_dt(x) for x in xs], y=ys, mode="lines", name=f"rank {r}",
                                     connectgaps=False,
                                     line=dict(color=color, width=2),
                                     fill="tozeroy" if i == 0 else "none",
                                     fillcolor="rgba(9,132,227,0.08)",
                                     hovertemplate="%{y:,.0f} samples/s<br>%{x}<extra>rank " + str(r)
                                     + "</extra>"))
        snaps = [(c["ts"], c["stats"].get("recent_samples_per_s")) for c in commits
                 if c.get("stats") and c["stats"].get("recent_samples_per_s") is not None]
        if snaps:
            any_points = True
            fig.add_trace(go.Scatter(x=[_dt(t) for t, _ in snaps], y=[v for _, v in snaps],
                                     mode="markers", name=f"rank {r} loader estimate",
                                     marker=dict(color=color, size=6, symbol="circle-open"),
                                     hovertemplate="%{y:,.0f} samples/s (loader, recent window)"
                                     "<extra></extra>"))
    if not any_points:
        return None
    for e in data["events"]:
        if e["kind"] == "resume" and e.get("ts"):
            fig.add_vline(x=_dt(e["ts"]).isoformat(), line=dict(color=TIMELINE_KINDS["resume"],
                                                                dash="dash", width=1))
    fig.update_layout(**_BASE_LAYOUT)
    fig.update_yaxes(title_text="samples / s", rangemode="tozero")
    _shared_x(fig, data)
    return fig


def _hit_rate_fig(go: Any, data: Dict[str, Any]) -> Optional[Any]:
    fig = go.Figure()
    any_points = False
    for i, (r, commits) in enumerate(sorted(data["commits"].items())):
        color = "#2e9e5b" if len(data["commits"]) == 1 else _PALETTE[i % len(_PALETTE)]
        resumes = [e["ts"] for e in data["events"] if e["kind"] == "resume" and e.get("rank") == r
                   and e.get("ts")]
        xs, interval, cumulative = hit_rate_series(commits, breaks=resumes)
        if not any(v is not None for v in cumulative):
            continue
        any_points = True
        x = [_dt(t) for t in xs]
        fig.add_trace(go.Scatter(x=x, y=interval, mode="lines+markers", name=f"rank {r} per interval",
                                 line=dict(width=2, color=color), connectgaps=False,
                                 hovertemplate="%{y:.0%} of shard opens hit<extra></extra>"))
        fig.add_trace(go.Scatter(x=x, y=cumulative, mode="lines", name=f"rank {r} cumulative",
                                 line=dict(width=1.5, dash="dot", color=color), opacity=0.6, connectgaps=False,
                                 hovertemplate="%{y:.0%} since loader start<extra></extra>"))
    if not any_points:
        return None
    fig.update_layout(**_BASE_LAYOUT)
    fig.update_yaxes(title_text="cache hit rate", tickformat=".0%", range=[-0.03, 1.03])
    _shared_x(fig, data)
    return fig


def _event_text(e: Dict[str, Any]) -> str:
    d = e.get("detail") or {}
    parts = [f"<b>{html.escape(e['kind'])}</b> rank {e['rank']}"]
    if e.get("url"):
        parts.append(html.escape(str(e["url"])))
    for k in ("attempt", "error", "expected", "actual", "bytes", "wait", "step", "epoch", "position"):
        if d.get(k) not in (None, ""):
            v = str(d[k])
            parts.append(f"{k}: {html.escape(v[:160])}")
    return "<br>".join(parts)


def _timeline_fig(go: Any, data: Dict[str, Any]) -> Optional[Any]:
    by_kind: Dict[str, List[Dict[str, Any]]] = {}
    for e in data["events"]:
        if e.get("ts"):
            by_kind.setdefault(e["kind"], []).append(e)
    if not by_kind:
        return None
    fig = go.Figure()
    order = [k for k in TIMELINE_KINDS if k in by_kind]
    for k in order:
        evs = by_kind[k]
        fig.add_trace(go.Scatter(
            x=[_dt(e["ts"]) for e in evs], y=[k] * len(evs), mode="markers", name=f"{k} ({len(evs)})",
            marker=dict(color=TIMELINE_KINDS[k], size=11, symbol="line-ns-open", line=dict(width=2)),
            text=[_event_text(e) for e in evs], hovertemplate="%{text}<br>%{x}<extra></extra>"))
    fig.update_layout(**dict(_BASE_LAYOUT, height=max(180, 70 + 38 * len(order)), showlegend=False))
    fig.update_yaxes(categoryorder="array", categoryarray=list(reversed(order)), showgrid=True)
    _shared_x(fig, data)
    return fig


def _shard_fig(go: Any, data: Dict[str, Any]) -> Optional[Any]:
    shards = {s["url"]: dict(s) for s in data["status"]["shards"]["list"]}
    for url in data["consumption"]:
        shards.setdefault(url, {"url": url, "name": os.path.basename(url), "state": "not tracked"})
    if not shards:
        return None
    items = sorted(shards.values(), key=lambda s: s["url"])
    n = len(items)
    cols = max(1, min(n, math.ceil(math.sqrt(n * 4))))
    rows = math.ceil(n / cols)
    fig = go.Figure()
    states = [s for s in STATE_COLORS if any(x["state"] == s for x in items)]
    states += sorted({x["state"] for x in items} - set(states))
    cons = data["consumption"]
    for state in states:
        xs, ys, texts, outline = [], [], [], []
        for i, s in enumerate(items):
            if s["state"] != state:
                continue
            xs.append(i % cols)
            ys.append(i // cols)
            ev = data.get("evicted", {}).get(s["url"], 0)
            outline.append(2 if (s.get("retries") or s.get("repairs")) else 0)
            c = cons.get(s["url"])
            lines = [f"<b>{html.escape(str(s.get('name') or os.path.basename(s['url'])))}</b>",
                     f"state: {html.escape(state)}"]
            for k in ("bytes", "attempts", "retries", "repairs"):
                if s.get(k) is not None:
                    lines.append(f"{k}: {s[k]:,}" if isinstance(s[k], int) else f"{k}: {s[k]}")
            if ev:
                lines.append(f"evicted: {ev} time(s)")
            if c is not None:
                lines.append(f"consumed: {c['samples']}/{c['total'] if c['total'] is not None else '?'}")
            if s.get("last_error"):
                lines.append("last error: " + html.escape(str(s["last_error"])[:160]))
            texts.append("<br>".join(lines))
        fig.add_trace(go.Scatter(
            x=xs, y=ys, mode="markers", name=f"{state} ({len(xs)})", text=texts,
            hovertemplate="%{text}<extra></extra>",
            marker=dict(symbol="square", color=STATE_COLORS.get(state, "#6c5ce7"),
                        size=max(6, min(28, int(640 / max(cols, rows * 2)))),
                        line=dict(width=outline, color="#2d3436"))))
    height = max(160, min(600, 80 + rows * max(8, min(34, int(640 / max(cols, rows * 2))) + 4)))
    fig.update_layout(**dict(_BASE_LAYOUT, height=height, showlegend=True))
    fig.update_xaxes(visible=False, range=[-1, cols])
    fig.update_yaxes(visible=False, autorange="reversed", scaleanchor="x", scaleratio=1)
    return fig


# ---------------------------------------------------------------------------
# The page
# ---------------------------------------------------------------------------

_CSS = """
:root { --fg:#2d3436; --muted:#636e72; --card:#fff; --bg:#f4f6f8; --line:#e3e8ec; }
* { box-sizing: border-box; }
body { margin:0; font-family:-apple-system,"Segoe UI",Roboto,Helvetica,Arial,sans-serif;
       color:var(--fg); background:var(--bg); }
header { background:#1e272e; color:#fff; padding:22px 32px 18px; }
header h1 { margin:0 0 4px; font-size:22px; font-weight:600; }
header .sub { color:#b2bec3; font-size:13px; }
header .sub code { color:#dfe6e9; }
main { max-width:1280px; margin:0 auto; padding:20px 24px 40px; }
.kpis { display:grid; grid-template-columns:repeat(auto-fill,minmax(170px,1fr)); gap:12px;
        margin-bottom:18px; }
.kpi { background:var(--card); border:1px solid var(--line); border-radius:10px; padding:12px 14px; }
.kpi .label { font-size:11px; text-transform:uppercase; letter-spacing:.06em; color:var(--muted); }
.kpi .value { font-size:22px; font-weight:600; margin-top:4px; }
.kpi .note { font-size:12px; color:var(--muted); margin-top:2px; }
.kpi.bad .value { color:#d63031; } .kpi.warn .value { color:#e17055; } .kpi.good .value { color:#2e9e5b; }
.bar { height:6px; background:var(--line); border-radius:3px; margin-top:8px; overflow:hidden; }
.bar > div { height:100%; background:#0984e3; }
.chips { display:flex; flex-wrap:wrap; gap:6px; margin-top:6px; }
.chip { font-size:12px; padding:2px 8px; border-radius:10px; color:#fff; }
.grid { display:grid; grid-template-columns:1fr 1fr; gap:16px; }
@media (max-width: 1000px) { .grid { grid-template-columns:1fr; } }
.card { background:var(--card); border:1px solid var(--line); border-radius:10px; padding:14px 16px;
        min-width:0; }
.card.wide { grid-column:1 / -1; }
.card h2 { font-size:15px; margin:0 0 2px; font-weight:600; }
.card .caption { font-size:12px; color:var(--muted); margin-bottom:6px; }
.empty { color:var(--muted); font-size:13px; padding:40px 0; text-align:center; }
table { border-collapse:collapse; width:100%; font-size:12px; }
th, td { text-align:left; padding:5px 8px; border-bottom:1px solid var(--line); vertical-align:top; }
th { color:var(--muted); font-weight:600; }
td.err { font-family:ui-monospace,Menlo,Consolas,monospace; word-break:break-all; }
footer { color:var(--muted); font-size:12px; text-align:center; padding:10px; }
"""


def _fmt_num(x: Optional[float], digits: int = 0) -> str:
    if x is None:
        return "–"
    return f"{x:,.{digits}f}"


def _fmt_bytes(n: Optional[float]) -> str:
    if n is None:
        return "–"
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1000 or unit == "TB":
            return f"{n:,.0f} {unit}" if unit == "B" else f"{n:,.1f} {unit}"
        n /= 1000.0
    return str(n)


def _fmt_duration(s: Optional[float]) -> str:
    if s is None:
        return "–"
    s = int(round(s))
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"{h}h {m:02d}m" if h else (f"{m}m {sec:02d}s" if m else f"{sec}s")


def _kpi(label: str, value: str, note: str = "", cls: str = "", extra: str = "") -> str:
    return (f'<div class="kpi {cls}"><div class="label">{html.escape(label)}</div>'
            f'<div class="value">{html.escape(value)}</div>'
            + (f'<div class="note">{html.escape(note)}</div>' if note else "") + extra + "</div>")


def _summary(data: Dict[str, Any]) -> Tuple[str, str]:
    st = data["status"]
    latest = st.get("latest") or {}
    cfg = st.get("config") or {}
    counts = st.get("counts") or {}
    stats = data.get("latest_stats") or {}
    dl = data.get("downloads") or {}
    all_commits = [c for cs in data["commits"].values() for c in cs]
    t0 = min((c["ts"] for c in all_commits), default=None)
    t1 = max((c["ts"] for c in all_commits), default=None)
    samples = sum((r.get("samples_total") or 0) for r in st.get("ranks", []))
    epoch_n = cfg.get("samples")
    pos = latest.get("position")
    frac = (pos / epoch_n) if pos is not None and epoch_n else None
    resumes = sum(1 for e in data["events"] if e["kind"] == "resume")
    tp = (st.get("throughput") or {}).get("samples_per_s")
    hit = stats.get("cache_hit_rate")
    sh = st.get("shards") or {}
    bad = (counts.get("failures") or 0) + (counts.get("skips") or 0)

    chips = "".join(f'<span class="chip" style="background:{STATE_COLORS.get(k, "#6c5ce7")}">'
                    f'{html.escape(k)} {v}</span>' for k, v in (sh.get("counts") or {}).items() if v)
    bar = (f'<div class="bar"><div style="width:{100 * frac:.1f}%"></div></div>'
           if frac is not None else "")
    res = st.get("resume")
    if res is not None:
        resume_txt, resume_note, resume_cls = (f"step {res['step']}",
                                               f"epoch {res['epoch']}, position {res['position']}", "good")
    elif st.get("resume_error"):
        resume_txt, resume_note, resume_cls = "not possible", st["resume_error"][:80], "bad"
    else:
        resume_txt, resume_note, resume_cls = "from start", "no commit yet", ""
    finished = pos == 0 and (latest.get("epoch") or 0) > 0
    if finished:  # position 0 of epoch e: epoch e - 1 was delivered in full
        bar = '<div class="bar"><div style="width:100%"></div></div>'
        epoch_kpi = _kpi("epoch · position", f"epoch {latest['epoch'] - 1} complete",
                         f"all {_fmt_num(epoch_n)} samples delivered; a rerun with more epochs continues "
                         f"at epoch {latest['epoch']}", "good", extra=bar)
    else:
        epoch_kpi = _kpi("epoch · position", f"{latest.get('epoch', '–')} · {_fmt_num(pos)}",
                         f"of {_fmt_num(epoch_n)} samples per epoch"
                         + (f" ({frac:.0%})" if frac is not None else ""), extra=bar)
    kpis = [
        epoch_kpi,
        _kpi("step", _fmt_num(latest.get("step")), f"{st['ranks'][0]['commits'] if st.get('ranks') else 0} commits"
             + f", world size {latest.get('world_size', cfg.get('world_size', '–'))}"),
        _kpi("samples delivered", _fmt_num(samples), f"over {_fmt_duration(t1 - t0) if t0 is not None else '–'}"),
        _kpi("throughput", f"{_fmt_num(tp)} /s" if tp is not None else "–", "samples/s, recent commits"),
        _kpi("cache hit rate", f"{hit:.0%}" if hit is not None else "–",
             f"{stats.get('cache_hits', 0)} hits, {stats.get('cache_misses', 0)} misses (latest loader)"
             if hit is not None else ("no remote shard opened" if stats else "no stats snapshot yet"),
             "good" if hit is not None and hit >= 0.9 else ""),
        _kpi("downloaded", _fmt_bytes(dl.get("bytes") or 0),
             f"{dl.get('count', 0)} downloads"
             + (f", {_fmt_bytes(dl['bytes'] / dl['seconds'])}/s" if dl.get("seconds") else "")),
        _kpi("retries", _fmt_num(counts.get("retries", 0)), "failed fetch attempts retried",
             "warn" if counts.get("retries") else ""),
        _kpi("repairs", _fmt_num(counts.get("repairs", 0)),
             f"{counts.get('verify_failures', 0)} verification failures", "warn" if counts.get("repairs") else ""),
        _kpi("failed / skipped", f"{counts.get('failures', 0)} / {counts.get('skips', 0)}", "shards",
             "bad" if bad else "good"),
        _kpi("evictions", _fmt_num(counts.get("evictions", 0)), "cache entries removed"),
        _kpi("resumes", _fmt_num(resumes), "restarts from a commit"),
        _kpi("resume point", resume_txt, resume_note, resume_cls),
        _kpi("shards", _fmt_num(sh.get("total", 0)), "", extra=f'<div class="chips">{chips}</div>'),
    ]
    when = (f"{time.strftime('%Y-%m-%d %H:%M', time.localtime(t0))} → "
            f"{time.strftime('%Y-%m-%d %H:%M', time.localtime(t1))}" if t0 is not None else "no commits yet")
    sub = (f"run <code>{html.escape(str(st.get('run_id')))}</code> · journal "
           f"<code>{html.escape(str(st.get('path')))}</code> · {len(st.get('ranks', []))} rank file(s) · "
           f"{html.escape(when)}")
    return sub, '<section class="kpis">' + "".join(kpis) + "</section>"


def _errors_table(data: Dict[str, Any]) -> str:
    errs = data["status"].get("last_errors") or []
    if not errs:
        return '<div class="empty">No errors recorded.</div>'
    rows = []
    for e in errs:
        d = e.get("detail") or {}
        msg = d.get("error") or d.get("actual") or (json.dumps(d) if d else "")
        ts = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(e["ts"])) if e.get("ts") else "–"
        rows.append(f"<tr><td>{ts}</td><td>{e['rank']}</td><td>{html.escape(e['kind'])}</td>"
                    f"<td>{html.escape(str(e.get('url') or '–'))}</td>"
                    f'<td class="err">{html.escape(str(msg)[:300])}</td></tr>')
    return ("<table><thead><tr><th>time</th><th>rank</th><th>kind</th><th>url</th><th>error</th>"
            "</tr></thead><tbody>" + "".join(rows) + "</tbody></table>")


def _mixture_table(data: Dict[str, Any]) -> str:
    """The per-source table of a mixture run ("" for any other run)."""
    st = data["status"]
    if st.get("mixture_error"):
        return f'<div class="empty err">{html.escape(st["mixture_error"])}</div>'
    mx = st.get("mixture")
    if not mx:
        return ""
    rows = []
    for s in mx["sources"]:
        rows.append(f"<tr><td>{html.escape(str(s['name']))}</td><td>{s['delivered']:,}</td>"
                    f"<td>{s['delivered_fraction']:.3f}</td><td>{s['requested_fraction']:.3f}</td>"
                    f"<td>{s['expected']:,.2f}</td><td>{s['deviation']:+.2f}</td>"
                    f"<td>&lt; {max(1.0, s['bound']):g}</td></tr>")
    head = (f'<div class="caption">phase {mx["phase"]} at global position {mx["global_position"]:,}</div>')
    return (head + "<table><thead><tr><th>source</th><th>delivered</th><th>delivered fraction</th>"
            f"<th>requested (phase {mx['phase']})</th><th>expected</th><th>deviation</th><th>bound</th>"
            "</tr></thead><tbody>" + "".join(rows) + "</tbody></table>")


#: (id, title, caption, figure builder, wide)
_CHARTS = [
    ("throughput", "Throughput", "Samples per second between commits (line, per rank); circles: "
     "the loader's own recent-window estimate; dashed: resumes.", _throughput_fig, True),
    ("cache", "Cache hit rate", "Share of shard opens served from the verified cache, per interval "
     "between stats snapshots and since the loader started.", _hit_rate_fig, False),
    ("events", "Retries, repairs and faults", "Each tick is one journal event; hover for url and "
     "error.", _timeline_fig, False),
    ("shards", "Shards", "One square per shard, coloured by state; outlined: retried or repaired. "
     "Hover for details.", _shard_fig, True),
]


def render_report(data: Dict[str, Any]) -> str:
    """The HTML page for ``load_run(...)`` data (plotly.js inline)."""
    go = _require_plotly()
    import plotly.offline

    sub, kpis = _summary(data)
    cards = []
    for cid, title, caption, build, wide in _CHARTS:
        fig = build(go, data)
        if fig is None:
            body = '<div class="empty">Nothing recorded yet.</div>'
        else:
            body = fig.to_html(full_html=False, include_plotlyjs=False, div_id=f"chart-{cid}",
                               config={"displaylogo": False, "responsive": True})
        cards.append(f'<section class="card{" wide" if wide else ""}" id="card-{cid}"><h2>{title}</h2>'
                     f'<div class="caption">{html.escape(caption)}</div>{body}</section>')
    mix = _mixture_table(data)
    if mix:
        cards.append('<section class="card wide" id="card-mixture"><h2>Mixture</h2>'
                     '<div class="caption">Samples delivered per source up to the latest commit, against '
                     'the weights of the current phase; expected integrates every phase\'s weights over '
                     'its span, deviation = delivered - expected.</div>' + mix + "</section>")
    cards.append('<section class="card wide" id="card-errors"><h2>Latest errors</h2>'
                 '<div class="caption">Newest first, all ranks.</div>' + _errors_table(data) + "</section>")
    st = data["status"]
    title = f"resumewds run {st.get('run_id') or ''}".strip()
    # "</script" cannot occur in plotly.min.js, but make sure
    js = plotly.offline.get_plotlyjs().replace("</script", "<\\/script")
    generated = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(st.get("generated") or time.time()))
    return (
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\">"
        f"<meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"><title>{html.escape(title)}"
        f"</title><style>{_CSS}</style><script type=\"text/javascript\">{js}</script></head><body>"
        f"<header><h1>resumewds run report</h1><div class=\"sub\">{sub}</div></header><main>{kpis}"
        f"<div class=\"grid\">{''.join(cards)}</div></main>"
        f"<footer>generated {generated} by resumewds report · self-contained, works offline</footer>"
        "</body></html>\n")


def write_report(journal: str, output: str) -> str:
    """Write the report of the run whose journal is ``journal`` to ``output``.

    The file is written to ``output + ".tmp"`` and renamed, so a reader never
    sees half a page.

    Args:
        journal: the run's journal path (rank 0's file; other ranks' files
            next to it are read too).
        output: the HTML file to write.

    Returns:
        ``output``.

    Raises:
        ReportError: plotly is not installed.
        JournalError: no journal at ``journal``, or an unreadable file.
    """
    _require_plotly()
    page = render_report(load_run(journal))
    tmp = output + ".tmp"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(page)
    os.replace(tmp, output)
    return output


__all__ = ["ReportError", "complete_status", "full_status", "hit_rate_series", "load_run", "render_report",
           "throughput_series", "write_report"]
