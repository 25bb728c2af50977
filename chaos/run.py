"""``python -m chaos run``: a matrix of faults against real ``resumewds`` processes.

Every scenario runs ``resumewds cat`` (or ``examples/train.py``) as a
subprocess, usually with ``--workers 2``, and compares every delivered line
(``SHARD<TAB>KEY<TAB>DIGEST``) with the source data: the digest of each
sample read straight from the local shards, and the order of an
uninterrupted local run.  One table comes out:

    fault | runs | faults injected | samples expected | delivered | lost |
    repeated | corrupt delivered | clear-error exits | verdict

A scenario expects one of:

``exact``     every run exits 0 and the output equals the local output.
``error``     every run exits non-zero by itself, with an ``Error:`` line and
              no traceback, within its time bound; what it printed before is
              a correct prefix of the local output.
``either``    each run is ``exact`` or ``error``.
``resume``    runs with a journal are killed or fail, are rerun, and the
              committed output concatenated over the reruns equals the local
              output exactly.

The verdict is FAIL on any lost, repeated, corrupt or reordered sample, a
run past its bound (a hang), or an exit that is not the expected kind; SKIP
(with the reason) when the environment cannot inject the fault (tmpfs mounts
need root).  Exit status 1 on any FAIL.

Run::

    python -m chaos run --quick            # < 2 minutes
    python -m chaos run                    # more cycles
    python -m chaos run --soak 30          # repeat the matrix with new seeds for 30 minutes
    python -m chaos run --quick --list     # the scenario names, in matrix order (nothing runs)

The rows live in the row modules (``chaos/netrows.py``, ``killrows.py``,
``workerfaults.py``, ``diskrows.py``, ``journalrows.py``, ``inputrows.py``,
``integrity.py``, ``s3rows.py``, ``fetchrows.py``, ``rangerows.py``,
``readrows.py``, ``skiprows.py``) on the shared harness (``chaos/harness.py``); this module
puts them in order, runs them and prints the table.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import shutil
import sys
import tempfile
import time
from typing import Dict, List, Optional, Sequence

from chaos import workerfaults
from chaos.crash import reap_orphans
from chaos.diskrows import disk_rows
from chaos.fetchrows import fetch_fault_rows
from chaos.harness import BOUND, Row, Scenario, Suite, name_of
from chaos.inputrows import bad_manifest, fuzz_rows, input_hardening_rows, malformed_through_cat
from chaos.integrity import integrity_rows
from chaos.journalrows import exactly_once_rows, journal_damage, journal_dir_full, journal_two_writers
from chaos.killrows import crash_cycles, mixture_kills
from chaos.netrows import hardening_rows, transport_rows
from chaos.rangerows import ranged_read_rows, sample_digest_rows
from chaos.readrows import read_rows
from chaos.s3rows import s3_rows
from chaos.skiprows import skip_rows

__all__ = ["BOUND", "HEADER", "Row", "Suite", "format_table", "main", "matrix", "run_matrix", "select"]


def matrix(quick: bool) -> List[Scenario]:
    """Every scenario, in the order of the table."""
    kills = 4 if quick else 12
    return [
        *transport_rows(quick),  # resets, 5xx, cut/flipped bodies, stalls (chaos/netrows.py)
        crash_cycles(kills, "cat"),
        crash_cycles(max(3, kills // 2), "train"),
        *workerfaults.rows(),  # SIGKILL, PID 1, SIGSTOP of a worker
        *disk_rows(quick),  # full, read-only, damaged cache (chaos/diskrows.py)
        journal_dir_full,
        fuzz_rows(300 if quick else 3000),
        malformed_through_cat,
        bad_manifest("checksum"),
        bad_manifest("size"),
        bad_manifest("missing"),
        journal_damage("delete"),
        journal_damage("truncate"),
        journal_damage("truncate_half"),
        journal_damage("header"),
        journal_damage("pages"),
        journal_damage("delete_all"),
        journal_two_writers,
        *integrity_rows(),  # lost -wal, replaced cache entry, secrets in URLs
        *input_hardening_rows(),
        *exactly_once_rows(quick),  # SIGTERM cycles, two runs together, a failure journaled
        *s3_rows(quick),
        *hardening_rows(),  # fetch hardening (chaos/netrows.py) ...
        *fetch_fault_rows(),  # ... then wrong answers to Range, odd bodies (chaos/fetchrows.py)
        *sample_digest_rows(),
        *ranged_read_rows(),
        *read_rows(quick),  # named fault profiles on every shard request, http and s3 (chaos/readrows.py)
        *skip_rows(),  # a local shard corrupted in place, skipped whole
        mixture_kills(3 if quick else 8),
    ]


HEADER = ("fault", "runs", "faults injected", "samples expected", "delivered", "lost", "repeated",
          "corrupt delivered", "clear-error exits", "verdict")


def format_table(rows: Sequence[Row], notes: bool = True) -> str:
    """The table (and its notes and failures) as printed by ``python -m chaos run``."""
    cells = [HEADER]
    for r in rows:
        t = r.tally
        v = r.verdict + (f" ({r.skip})" if r.skip else "")
        if r.tally.misordered:
            v += " (order differs)"
        cells.append((r.fault, str(r.runs), str(r.faults), str(t.expected), str(t.delivered), str(t.lost),
                      str(t.repeated), str(t.corrupt), str(r.clear_errors), v))
    widths = [max(len(c[i]) for c in cells) for i in range(len(HEADER))]
    out = ["| " + " | ".join(c[i].ljust(widths[i]) for i in range(len(HEADER))) + " |" for c in cells]
    out.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    if notes:
        extra = [f"- {r.fault}: {r.note}" for r in rows if r.note]
        bad = [f"- {r.fault}: " + "; ".join(r.bad_exits[:3]) for r in rows if r.bad_exits]
        if extra:
            out += ["", "Notes:"] + extra
        if bad:
            out += ["", "Failures:"] + bad
    return "\n".join(out)


def select(scenarios: Sequence[Scenario], only: Optional[Sequence[str]]) -> List[Scenario]:
    """The scenarios whose name (label or function name) contains one of ``only`` (all without it)."""
    if not only:
        return list(scenarios)
    return [sc for sc in scenarios if any(o in name_of(sc) or o in getattr(sc, "__name__", "") for o in only)]


def run_matrix(seed: int, quick: bool, work: Optional[str] = None, only: Optional[Sequence[str]] = None,
               jobs: int = 3, progress: bool = True) -> List[Row]:
    """Run the matrix; return its rows (in matrix order)."""
    own = work is None
    work = work or tempfile.mkdtemp(prefix="resumewds-chaos-")
    try:
        suite = Suite(work, seed, quick)
        scenarios = select(matrix(quick), only)
        rows: List[Optional[Row]] = [None] * len(scenarios)

        def one(i: int) -> None:
            t0 = time.monotonic()
            try:
                r = scenarios[i](suite)
            except Exception as exc:  # a harness bug is a failure, not a crash of the table
                r = Row(name_of(scenarios[i]), "exact")
                r.bad_exits.append(f"harness error {type(exc).__name__}: {exc}")
            r.seconds = time.monotonic() - t0
            rows[i] = r
            if progress:
                print(f"  [{r.seconds:5.1f}s] {r.verdict:4} {r.fault}", file=sys.stderr, flush=True)

        # A scenario marked ``alone`` (hypothesis in this process) runs after the others, by
        # itself: CPython 3.11 fails with "SystemError: AST constructor recursion depth
        # mismatch" when two threads build ast objects at once (hypothesis reads sources
        # with ast, and so does a traceback printed in another scenario's thread).
        alone = [i for i, sc in enumerate(scenarios) if getattr(sc, "alone", False)]
        with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as ex:
            list(ex.map(one, [i for i in range(len(scenarios)) if i not in alone]))
        for i in alone:
            one(i)
        return [r for r in rows if r is not None]
    finally:
        reap_orphans()
        if own:
            shutil.rmtree(work, ignore_errors=True)


def main(argv: Optional[Sequence[str]] = None) -> int:
    """``python -m chaos run``: see the module docs."""
    p = argparse.ArgumentParser(prog="python -m chaos run", description=__doc__.split("\n\n")[0])
    g = p.add_mutually_exclusive_group()
    g.add_argument("--quick", action="store_true", help="The short matrix (under ~2 minutes).")
    g.add_argument("--soak", type=float, metavar="MINUTES", help="Repeat the matrix with new seeds.")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--jobs", type=int, default=3, help="Scenarios run at once.")
    p.add_argument("--only", action="append", help="Run scenarios whose name contains this (repeatable).")
    p.add_argument("--list", action="store_true",
                   help="Print the names of the scenarios that would run, in order, and run none.")
    a = p.parse_args(argv)
    if a.list:
        for sc in select(matrix(a.quick), a.only):
            print(name_of(sc))
        return 0
    t0 = time.monotonic()
    rows: List[Row] = []
    if a.soak:
        seed = a.seed
        while time.monotonic() - t0 < a.soak * 60:
            rows.extend(run_matrix(seed, False, only=a.only, jobs=a.jobs))
            seed += 1
        rows = _merge(rows)
    else:
        rows = run_matrix(a.seed, a.quick, only=a.only, jobs=a.jobs)
    print(format_table(rows))
    failed = [r for r in rows if r.verdict == "FAIL"]
    mode = "quick" if a.quick else (f"soak {a.soak:g} min" if a.soak else "full")
    print(f"\nchaos run ({mode}, seed {a.seed}): {len(rows)} scenarios, "
          f"{sum(r.verdict == 'PASS' for r in rows)} pass, {len(failed)} fail, "
          f"{sum(r.verdict == 'SKIP' for r in rows)} skipped, {time.monotonic() - t0:.0f}s")
    return 1 if failed else 0


def _merge(rows: List[Row]) -> List[Row]:
    """One row per fault over the soak's repeats."""
    by: Dict[str, Row] = {}
    for r in rows:
        m = by.get(r.fault)
        if m is None:
            by[r.fault] = r
            continue
        m.runs += r.runs
        m.faults += r.faults
        m.tally.add(r.tally)
        m.clear_errors += r.clear_errors
        m.bad_exits += r.bad_exits
        m.hung += r.hung
        m.skip = m.skip or r.skip
    return list(by.values())


if __name__ == "__main__":
    sys.exit(main())
