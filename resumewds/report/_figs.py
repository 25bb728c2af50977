"""The report's charts: one builder per chart, ``build(go, data) -> Figure or None`` (None: nothing
recorded); ``go`` is ``plotly.graph_objects``, passed in by the page.
"""

from __future__ import annotations

import datetime
import html
import math
import os
from typing import Any, Dict, List, Optional, Tuple

from ._rundata import STATE_COLORS, TIMELINE_KINDS, hit_rate_series, throughput_series


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


def _resumes(data: Dict[str, Any], rank: int) -> List[float]:
    return [e["ts"] for e in data["events"] if e["kind"] == "resume" and e.get("rank") == rank and e.get("ts")]


def _throughput_fig(go: Any, data: Dict[str, Any]) -> Optional[Any]:
    fig = go.Figure()
    rng = _time_range(data)
    min_dt = (rng[1] - rng[0]) / 150 if rng else 0.0
    any_points = False
    for i, (r, commits) in enumerate(sorted(data["commits"].items())):
        color = _PALETTE[i % len(_PALETTE)]
        xs, ys = throughput_series(commits, min_dt, breaks=_resumes(data, r))
        if xs:
            any_points = True
            fig.add_trace(go.Scatter(x=[_dt(x) for x in xs], y=ys, mode="lines", name=f"rank {r}", connectgaps=False,
                                     line=dict(color=color, width=2), fill="tozeroy" if i == 0 else "none",
                                     fillcolor="rgba(9,132,227,0.08)",
                                     hovertemplate="%{y:,.0f} samples/s<br>%{x}<extra>rank " + str(r) + "</extra>"))
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
        xs, interval, cumulative = hit_rate_series(commits, breaks=_resumes(data, r))
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


#: (id, title, caption, figure builder, wide), in page order
CHARTS = [
    ("throughput", "Throughput", "Samples per second between commits (line, per rank); circles: "
     "the loader's own recent-window estimate; dashed: resumes.", _throughput_fig, True),
    ("cache", "Cache hit rate", "Share of shard opens served from the verified cache, per interval "
     "between stats snapshots and since the loader started.", _hit_rate_fig, False),
    ("events", "Retries, repairs and faults", "Each tick is one journal event; hover for url and "
     "error.", _timeline_fig, False),
    ("shards", "Shards", "One square per shard, coloured by state; outlined: retried or repaired. "
     "Hover for details.", _shard_fig, True),
]

__all__ = ["CHARTS"]
