"""The ``resumewds status --json`` summary of a whole run, from a RunReader."""

from __future__ import annotations

import time
from typing import Any, Dict, Optional, Tuple

from ..errors import JournalError
from ..events import EventKind
from ._read import RunReader
from ._states import SHARD_STATES


def status(path: str, *, last_errors: int = 10, throughput_window: int = 50) -> Dict[str, Any]:
    """A JSON-serializable summary of a whole run (all rank files).

    This is the ``resumewds status --json`` contract.  Fields:

    - ``path`` (str, rank 0's file), ``generated`` (float, Unix time), and rank
      0's ``run_id`` (str | None), ``schema_version`` (int) and ``config`` (dict).
    - ``latest`` (dict | None): rank 0's newest commit: ``step``, ``epoch``,
      ``position``, ``world_size``, ``batch_size``, ``ts``, ``samples_total``.
    - ``resume`` (dict | None): ``resolve_resume(path)`` (None: from the
      beginning); ``resume_error`` (str | None): why there is none.
    - ``ranks`` (list): per rank file, by rank: ``rank``, ``path``,
      ``latest_step`` (int | None), ``epoch``, ``position``, ``ts`` (of that
      commit), ``samples_total``, ``commits`` (number of commit rows).
    - ``shards`` (dict): ``total`` (int); ``counts`` ({state: n} with every
      state of ``SHARD_STATES``); ``list``: one dict per url, the ``shards``
      table's columns (:meth:`RunReader.shards`: over all rank files).
    - ``counts`` (dict): event totals over all ranks: ``retries``,
      ``repairs``, ``failures`` (``fail``), ``skips``, ``evictions``,
      ``verify_failures``, ``config_changes``, ``rewinds``, ``step_skips``.
    - ``skipped_steps`` (list): the steps skipped on purpose
      (``WebLoader.skip_steps``), oldest first, as rank 0 recorded them:
      ``rank``, ``ts``, ``first_step``, ``steps``, ``reason``.
    - ``events_by_kind`` ({kind: n}): every event kind over all ranks.
    - ``last_errors`` (list): the newest ``last_errors`` events of kinds
      ``ERROR_EVENT_KINDS``, newest first: ``ts``, ``rank``, ``kind``,
      ``url``, ``detail`` (dict | None).
    - ``throughput`` (dict): from each rank's last ``throughput_window``
      commits: ``samples_per_s`` (sum over ranks, None if unknown),
      ``steps_per_s`` (rank 0), ``per_rank`` ([{``rank``, ``samples_per_s``}]),
      ``window_s`` (rank 0's active time in the window: :func:`active_rate`).
    - ``consumption`` (dict): for rank 0's latest epoch (``epoch``), summed
      over ranks: ``shards_started``, ``shards_complete`` (samples reached the
      shard total), ``samples``.
    - ``stats`` (dict | None): the ``stats`` snapshot of rank 0's latest commit.

    Raises:
        JournalError: there is no journal at ``path``, or a file is unreadable.
    """
    with RunReader(path) as run:
        return summarize(run, last_errors=last_errors, throughput_window=throughput_window)


def summarize(run: RunReader, *, last_errors: int = 10, throughput_window: int = 50) -> Dict[str, Any]:
    """:func:`status` of a run already open (JournalError: it has no journal file)."""
    path = run.path
    if not run:
        raise JournalError(f"{path}: no journal here")
    j0 = run.journal(0)
    latest = j0.latest_commit()
    out: Dict[str, Any] = {
        "path": path, "run_id": j0.run_id, "schema_version": j0.schema_version,
        "generated": time.time(), "config": j0.config(),
        "latest": None if latest is None else {
            k: latest[k] for k in ("step", "epoch", "position", "world_size", "batch_size",
                                   "ts", "samples_total")},
    }
    try:
        out["resume"], out["resume_error"] = run.resume_point(), None
    except JournalError as exc:
        out["resume"], out["resume_error"] = None, str(exc)

    ranks = []
    per_rank_rate = []
    for r in run.ranks():
        c = run.journal(r).latest_commit()
        ranks.append({"rank": r, "path": run.journal(r).path,
                      "latest_step": c and c["step"], "epoch": c and c["epoch"],
                      "position": c and c["position"], "ts": c and c["ts"],
                      "samples_total": c and c["samples_total"], "commits": run.commit_count(r)})
        per_rank_rate.append({"rank": r, "samples_per_s": active_rate(run, r, throughput_window)[0]})
    out["ranks"] = ranks

    shards = run.shards()
    counts = dict.fromkeys(SHARD_STATES, 0)
    for s in shards.values():
        counts[s["state"]] = counts.get(s["state"], 0) + 1
    out["shards"] = {"total": len(shards), "counts": counts,
                     "list": sorted(shards.values(), key=lambda s: s["url"])}

    by_kind = run.event_counts()
    K = EventKind
    out["counts"] = {name: by_kind.get(kind.value, 0) for name, kind in (
        ("retries", K.RETRY), ("repairs", K.REPAIR), ("failures", K.FAIL), ("skips", K.SKIP),
        ("evictions", K.EVICT), ("verify_failures", K.VERIFY_FAIL),
        ("config_changes", K.CONFIG_CHANGE), ("rewinds", K.REWIND), ("step_skips", K.SKIP_STEPS))}
    out["skipped_steps"] = [
        {"rank": e["rank"], "ts": e["ts"], **{k: e["detail"].get(k) for k in ("first_step", "steps", "reason")}}
        for e in run.events([K.SKIP_STEPS.value]) if e["rank"] == 0]
    out["events_by_kind"] = dict(sorted(by_kind.items()))
    out["last_errors"] = run.error_events(last_errors)

    rates = [p["samples_per_s"] for p in per_rank_rate]
    _, steps_per_s, window = active_rate(run, 0, throughput_window)
    out["throughput"] = {
        "samples_per_s": sum(rates) if rates and all(x is not None for x in rates) else None,
        "steps_per_s": steps_per_s, "per_rank": per_rank_rate, "window_s": window}

    cons: Dict[str, Any] = {"epoch": None, "shards_started": 0, "shards_complete": 0, "samples": 0}
    if latest is not None:
        cons = run.epoch_consumption(latest["epoch"])
    out["consumption"] = cons
    out["stats"] = None if latest is None else latest["stats"]
    return out


def active_rate(run: RunReader, rank: int, window: int
                ) -> Tuple[Optional[float], Optional[float], Optional[float]]:
    """``(samples/s, steps/s, active seconds)`` over ``rank``'s last ``window`` commits.

    Only the time a process was running counts: across a restart (a
    ``resume`` event) the idle time before it is left out.  Nones when fewer
    than two commits, or no time passed.
    """
    conn = run.journal(rank).conn
    rows = list(conn.execute(
        "SELECT step, ts, samples_total FROM commits ORDER BY step DESC LIMIT ?", (window,)))[::-1]
    if len(rows) < 2:
        return None, None, None
    restarts = [float(t) for (t,) in conn.execute(
        "SELECT ts FROM events WHERE kind = ? AND ts > ? AND ts <= ? ORDER BY ts",
        (EventKind.RESUME.value, rows[0]["ts"], rows[-1]["ts"]))]
    active = steps = 0.0
    samples: Optional[float] = 0.0
    i = 0
    for a, b in zip(rows, rows[1:]):
        start = a["ts"]
        while i < len(restarts) and restarts[i] <= b["ts"]:
            start = max(start, restarts[i])  # restarted in between: active since the restart
            i += 1
        active += max(0.0, b["ts"] - start)
        steps += max(0, b["step"] - a["step"])
        if samples is not None and a["samples_total"] is not None and b["samples_total"] is not None:
            samples += max(0, b["samples_total"] - a["samples_total"])
        else:
            samples = None
    if active <= 0:
        return None, None, None
    return (None if samples is None else samples / active), steps / active, active
