"""``resumewds report``: one self-contained HTML page about a run (every rank file of its journal).

A summary header, then the charts of :data:`resumewds.report._figs.CHARTS` (throughput, cache hit
rate, a timeline of the journal's events, a map of the shards), a mixture's per-source table and
the latest errors.  plotly.js is embedded (no CDN: the page renders offline, years later); plotly
is imported only here, only when a report is made (without it: :class:`ReportError`).  The data
comes from :mod:`resumewds.report._rundata`.

Example:
    >>> write_report("run.db", "report.html")        # doctest: +SKIP
    'report.html'
"""

from __future__ import annotations

import html
import json
import os
import time
from typing import Any, Dict, Optional, Tuple

from ..errors import ResumeWDSError
from ._figs import CHARTS
from ._rundata import STATE_COLORS, load_run


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


def render_report(data: Dict[str, Any]) -> str:
    """The HTML page for ``load_run(...)`` data (plotly.js inline)."""
    go = _require_plotly()
    import plotly.offline

    sub, kpis = _summary(data)
    cards = []
    for cid, title, caption, build, wide in CHARTS:
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
    """Write the report of the run whose journal is ``journal`` (rank 0's file; the other ranks'
    files next to it are read too) to ``output``, through a temporary file renamed (a reader never
    sees half a page).  Returns ``output``.

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


__all__ = ["ReportError", "render_report", "write_report"]
