"""Rows of ``python -m chaos run`` for faults of the DataLoader worker processes.

* "SIGKILL of one DataLoader worker": one worker of ``resumewds cat
  --journal`` is killed with SIGKILL; the run must end by itself with a
  clear error within its bound, and the rerun completes exactly.
* "PID 1 with workers": ``resumewds cat --workers 2`` as PID 1 of a new PID
  namespace (a container entrypoint without an init) must deliver exactly
  the local output.  SKIP where the kernel refuses ``unshare -p``.
* "SIGSTOP of a worker": one worker of ``resumewds cat --journal`` is
  stopped with a real SIGSTOP; the run must end by itself with a clear error
  naming it (``RESUMEWDS_WORKER_STALL=2`` here; 60 s by default) and exit
  without waiting for the stopped worker; the rerun completes and the
  committed output over both runs equals the local output.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from typing import List

from chaos.crash import cat_cmd, child_env, committed_samples, compare, run
from chaos.harness import BOUND, Row, Scenario, Suite, labelled, last_line, signal_a_worker

__all__ = ["kill_worker", "pid1_with_workers", "rows", "sigstop_worker"]


def kill_worker(s: Suite) -> Row:
    """SIGKILL one DataLoader worker: a clear error within the bound, then a rerun completes exactly."""
    row = Row("SIGKILL of one DataLoader worker, then rerun", "resume")
    srv = s.server(bytes_per_second=1.5e6)
    d = s.tmp("killworker")
    journal = os.path.join(d, "run.db")
    cmd = cat_cmd(srv.url + "manifest.json", journal=journal, cache_dir=os.path.join(d, "cache"), epochs=1)
    killed: List[int] = []
    killer = signal_a_worker(signal.SIGKILL, killed)
    kept: List[str] = []
    try:
        for attempt in range(3):
            before = committed_samples(journal)
            p = run(cmd, bound=30.0, on_start=killer if attempt == 0 else None)
            row.runs += 1
            after = committed_samples(journal)
            kept.extend(p.lines[: after - before])
            if p.hung:
                row.hung += 1
                row.bad_exits.append("hung after a worker was killed")
                break
            if attempt == 0:
                if p.rc == 0:
                    row.note = "worker killed after it finished; run completed"
                elif p.clear_error and "worker" in p.err:
                    row.clear_errors += 1
                    row.note = f"exit {p.rc} after {p.seconds:.1f}s: {last_line(p.err)[:90]}"
                else:
                    row.bad_exits.append(f"unclear exit {p.rc}: {last_line(p.err)}")
            if p.rc == 0:
                break
        row.faults = len(killed)
        row.tally.add(compare(s.ref, kept, s.data.digests))
    finally:
        srv.stop()
    return row


def pid1_with_workers(s: Suite) -> Row:
    """``cat --workers 2`` as PID 1 of a new PID namespace."""
    row = Row("PID 1 with workers (unshare -p, cat --workers 2)", "exact")
    exe = shutil.which("unshare")
    if exe is None:
        row.skip = "no unshare(1)"
        return row
    ns = [exe, "-p", "-f", "--mount-proc"]
    probe = subprocess.run(ns + ["sh", "-c", "echo $$"], capture_output=True, text=True, timeout=60)
    if probe.returncode != 0 or probe.stdout.strip() != "1":
        row.skip = f"the kernel refuses a new PID namespace ({(probe.stderr or probe.stdout).strip()[:80]})"
        return row
    d = s.tmp("pid1")
    cmd = cat_cmd(s.data.manifest, cache_dir=os.path.join(d, "cache"), epochs=1)
    p = run(ns + ["sh", "-c", 'test $$ = 1 && exec "$@"', "sh"] + cmd, bound=BOUND)
    s.judge(row, p)
    row.faults = 1  # the run as PID 1
    row.note = row.note or f"exit {p.rc} in {p.seconds:.1f}s as PID 1"
    return row


def sigstop_worker(s: Suite) -> Row:
    """SIGSTOP of one worker: the run ends by itself with a clear error naming it; the rerun completes."""
    row = Row("SIGSTOP of a worker (cat --journal, stall limit 2s), then rerun", "resume")
    srv = s.server(bytes_per_second=1.5e6)
    d = s.tmp("stopworker")
    journal = os.path.join(d, "run.db")
    cmd = cat_cmd(srv.url + "manifest.json", journal=journal, cache_dir=os.path.join(d, "cache"), epochs=1)
    env = child_env(RESUMEWDS_WORKER_STALL="2")
    stopped: List[int] = []
    stopper = signal_a_worker(signal.SIGSTOP, stopped)
    kept: List[str] = []
    try:
        for attempt in range(3):
            before = committed_samples(journal)
            p = run(cmd, env=env, bound=45.0, on_start=stopper if attempt == 0 else None)
            row.runs += 1
            after = committed_samples(journal)
            kept.extend(p.lines[: after - before])
            if p.hung:
                row.hung += 1
                row.bad_exits.append("hung after a worker was stopped")
                break
            if attempt == 0:
                left = [pid for pid in stopped if os.path.exists(f"/proc/{pid}")
                        and open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0] == "T"]
                if left:
                    row.bad_exits.append(f"stopped worker {left} left behind")
                if p.rc == 0:
                    row.note = "worker stopped after it finished; run completed"
                elif p.clear_error and stopped and f"(pid {stopped[0]}) is stopped" in p.err:
                    row.clear_errors += 1
                    row.note = f"exit {p.rc} after {p.seconds:.1f}s: {last_line(p.err)[:90]}"
                else:
                    row.bad_exits.append(f"unclear exit {p.rc}: {last_line(p.err)}")
            if p.rc == 0:
                break
        row.faults = len(stopped)
        row.tally.add(compare(s.ref, kept, s.data.digests))
    finally:
        for pid in stopped:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        srv.stop()
    return row


def rows() -> List[Scenario]:
    """The rows above, for :func:`chaos.run.matrix` (``--only`` matches ``kill_worker`` and these labels)."""
    return [kill_worker, labelled("PID 1 with workers", pid1_with_workers),
            labelled("SIGSTOP of a worker", sigstop_worker)]
