"""Text rendering of a run's status, for ``resumewds status``."""

from __future__ import annotations

import time
from typing import Any, Dict, Optional

from ..mixing import format_mixture
from ._schema import dumps


def format_status(st: Dict[str, Any]) -> str:
    """Human-readable text of a ``status()`` dict, for ``resumewds status``
    (a mixture run's, completed by ``report._rundata.complete_status``, adds
    one line per source)."""
    lines = [f"journal  {st['path']}  (run {st.get('run_id')}, schema v{st.get('schema_version')})"]
    latest = st.get("latest")
    if latest is None:
        lines.append("latest   no commit yet")
    else:
        lines.append(f"latest   step {latest['step']}  epoch {latest['epoch']}  position "
                     f"{latest['position']}  world {latest['world_size']}  at {_fmt_ts(latest['ts'])}")
    res = st.get("resume")
    if res is not None:
        extra = (f"  (skipped {res['skipped_incomplete_count']} incomplete newer step(s))"
                 if res.get("skipped_incomplete_count") else "")
        lines.append(f"resume   step {res['step']}  epoch {res['epoch']}  position {res['position']}{extra}")
    elif st.get("resume_error"):
        lines.append(f"resume   NOT POSSIBLE: {st['resume_error']}")
    else:
        lines.append("resume   from the beginning")
    for sk in st.get("skipped_steps") or []:
        last = int(sk["first_step"]) + int(sk["steps"]) - 1
        lines.append(f"skipped  steps {sk['first_step']}..{last} on purpose ({sk['steps']} step(s)) at "
                     f"{_fmt_ts(sk['ts'])}" + (f": {sk['reason']}" if sk.get("reason") else ""))
    for r in st.get("ranks", []):
        lines.append(f"  rank {r['rank']}: step {r['latest_step']}  position {r['position']}  "
                     f"samples {r['samples_total']}  commits {r['commits']}")
    tp = st.get("throughput") or {}
    if tp.get("samples_per_s") is not None or tp.get("steps_per_s") is not None:
        sps = tp.get("samples_per_s")
        lines.append("rate     " + (f"{sps:,.1f} samples/s  " if sps is not None else "")
                     + (f"{tp['steps_per_s']:,.2f} steps/s" if tp.get("steps_per_s") else ""))
    sh = st.get("shards") or {}
    counts = ", ".join(f"{k} {v}" for k, v in (sh.get("counts") or {}).items() if v)
    lines.append(f"shards   {sh.get('total', 0)}" + (f": {counts}" if counts else ""))
    cons = st.get("consumption") or {}
    if cons.get("epoch") is not None:
        lines.append(f"epoch {cons['epoch']}: {cons['shards_complete']}/{cons['shards_started']} "
                     f"shards done, {cons['samples']} samples")
    if st.get("mixture"):  # a mixture run (rundata.complete_status): one line per source
        lines.extend(format_mixture(st["mixture"]).splitlines())
    elif st.get("mixture_error"):
        lines.append(f"mixture  {st['mixture_error']}")
    c = st.get("counts") or {}
    lines.append("events   " + ", ".join(f"{k} {v}" for k, v in c.items()))
    errs = st.get("last_errors") or []
    if errs:
        lines.append("last errors:")
        for e in errs:
            d = e.get("detail") or {}
            msg = d.get("error") or d.get("actual") or (dumps(d) if d else "")
            lines.append(f"  {_fmt_ts(e['ts'])} rank {e['rank']} {e['kind']:<12} "
                         f"{e.get('url') or '-'}  {msg}")
    return "\n".join(lines)


def _fmt_ts(ts: Optional[float]) -> str:
    return "-" if ts is None else time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))
