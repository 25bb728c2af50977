"""Rows of ``python -m chaos run`` for the journal: damaged, full, shared, stopped.

* the journal's filesystem fills up, then space is freed;
* the journal deleted, truncated or overwritten between runs: the rerun
  refuses it clearly (deleting it with its lock file starts fresh);
* two processes on one journal (one after the other, and started together):
  one is refused, clearly;
* exactly-once hardening: SIGTERM to the process group (as Slurm sends it),
  commit, rerun; a shard failing under ``on_error=raise`` is journaled as
  failed.

Example:
    >>> journal_damage("header").label
    'journal header overwritten'
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import tempfile
import threading
import time
from typing import IO, List, Sequence, Tuple

from chaos import diskfaults
from chaos.crash import Proc, cat_cmd, child_env, committed_samples, compare, run
from chaos.harness import BOUND, Row, Scenario, Suite, labelled, last_line
from resumewds.journal._status import status

__all__ = ["exactly_once_rows", "fail_is_journaled", "journal_damage", "journal_dir_full",
           "journal_started_together", "journal_two_writers", "sigterm_cycles"]


def journal_dir_full(s: Suite) -> Row:
    """The journal's filesystem fills up: a clear error; after space is freed a rerun continues exactly."""
    row = Row("journal directory full, then space freed", "resume")
    d = s.tmp("jfull")
    mnt = os.path.join(d, "mnt")
    journal = os.path.join(mnt, "run.db")
    cmd = cat_cmd(s.data.manifest, journal=journal, cache_dir=os.path.join(d, "cache"), epochs=1,
                  commit_every=3)
    try:
        with diskfaults.tmpfs(mnt, "1m"):
            filler = diskfaults.fill(mnt, leave=60 * 1024)
            kept: List[str] = []
            for attempt in range(2):
                before = committed_samples(journal) if os.path.exists(journal) else 0
                p = run(cmd, bound=BOUND)
                row.runs += 1
                after = committed_samples(journal) if os.path.exists(journal) else 0
                kept.extend(p.lines[: after - before])
                if attempt == 0:
                    row.faults = 1
                    if p.rc == 0:
                        row.note = "journal fit in the space left"
                    elif p.clear_error:
                        row.clear_errors += 1
                        row.note = last_line(p.err)[:100]
                    else:
                        row.bad_exits.append(f"unclear exit {p.rc}: {last_line(p.err)}")
                    os.unlink(filler)
                elif p.rc != 0:
                    row.bad_exits.append(f"rerun failed: {last_line(p.err)}")
                if p.hung:
                    row.hung += 1
            row.tally.add(compare(s.ref, kept, s.data.digests))
    except diskfaults.MountUnavailable as exc:
        row.skip = str(exc)
    return row



def journal_damage(kind: str) -> Scenario:
    """The journal of a finished run damaged (``kind``) before the rerun."""
    names = {"delete": "journal deleted between runs", "delete_all": "journal + lock file deleted",
             "truncate": "journal truncated to 0 bytes", "truncate_half": "journal truncated to half",
             "header": "journal header overwritten", "pages": "journal pages overwritten with junk"}

    def scenario(s: Suite) -> Row:
        row = Row(names[kind], "error")
        d = s.tmp("jdamage")
        journal = os.path.join(d, "run.db")
        cmd = cat_cmd(s.data.manifest, journal=journal, cache_dir=os.path.join(d, "cache"), epochs=1,
                      commit_every=10, workers=0, extra=["--limit", "100"])
        first = run(cmd, bound=BOUND)
        if first.rc != 0:
            row.bad_exits.append(f"first run failed: {last_line(first.err)}")
            return row
        size = os.path.getsize(journal)
        rng = random.Random(s.seed)
        if kind == "delete":
            os.unlink(journal)
        elif kind == "delete_all":
            for suffix in ("", "-wal", "-shm", ".lock"):
                if os.path.exists(journal + suffix):
                    os.unlink(journal + suffix)
            row.expect = "fresh"
        elif kind == "truncate":
            os.truncate(journal, 0)
        elif kind == "truncate_half":
            os.truncate(journal, size // 2)
        elif kind == "header":
            with open(journal, "r+b") as f:
                f.write(rng.randbytes(100))
        else:
            with open(journal, "r+b") as f:
                for _ in range(3):
                    page = rng.randrange(1, max(2, size // 4096))
                    f.seek(page * 4096)
                    f.write(rng.randbytes(4096))
        cmd2 = cat_cmd(s.data.manifest, journal=journal, cache_dir=os.path.join(d, "cache"), epochs=1,
                       commit_every=10, workers=0)
        p = run(cmd2, bound=BOUND)
        row.runs = 2
        row.faults = 1
        if kind == "delete_all":
            # nothing is left to say a run existed: starting fresh is the only honest outcome
            s.judge(row, p, "exact")
            row.note = "no trace left: starts fresh (documented)"
            return row
        if p.rc == 0:
            row.bad_exits.append(f"silent restart: exit 0 after printing {len(p.lines)} lines")
        elif p.clear_error and "journal" in p.err.lower():
            row.clear_errors += 1
            row.note = last_line(p.err)[:100]
        else:
            row.bad_exits.append(f"unclear exit {p.rc}: {last_line(p.err)}")
        row.tally.add(compare(s.ref[100:100 + len(p.lines)], p.lines, s.data.digests))
        return row
    return labelled(names[kind], scenario)


def journal_two_writers(s: Suite) -> Row:
    """A second process opens the journal while the first holds it.  The
    server holds every shard request until the second has finished, so the
    two always overlap (on a loaded machine the first could otherwise end
    before the second starts, and nothing would be refused)."""
    row = Row("two processes open one journal (same rank)", "resume")
    srv = s.server(bytes_per_second=2e5)
    d = s.tmp("twowriters")
    journal = os.path.join(d, "run.db")
    cmd = cat_cmd(srv.url + "manifest.json", journal=journal, cache_dir=os.path.join(d, "cache"), epochs=1)
    second: List[Proc] = []
    threads: List[threading.Thread] = []

    def start_second(p) -> None:
        def go() -> None:
            try:
                t0 = time.monotonic()
                while time.monotonic() - t0 < 60 and p.poll() is None:
                    if os.path.exists(journal + ".lock") and os.path.getsize(journal + ".lock") > 0:
                        second.append(run(cmd, bound=60.0))
                        return
                    time.sleep(0.02)
            finally:
                srv.release()  # the first run goes on only once the second has ended
        th = threading.Thread(target=go, daemon=True)
        th.start()
        threads.append(th)

    srv.hold()
    try:
        first = run(cmd, bound=BOUND, on_start=start_second)
        for th in threads:
            th.join(70)
        row.runs = 1 + len(second)
        row.faults = len(second)
        s.judge(row, first, "exact")
        if not second:
            row.bad_exits.append("second process was never started")
        else:
            q = second[0]
            if q.rc != 0 and q.clear_error and "in use" in q.err:
                row.clear_errors += 1
                row.note = last_line(q.err)[:100]
            else:
                row.bad_exits.append(f"second writer not refused clearly: exit {q.rc}: {last_line(q.err)}")
            if q.lines:
                row.bad_exits.append(f"second writer printed {len(q.lines)} lines")
    finally:
        srv.release()
        srv.stop()
    return row


# ---------------------------------------------------------------------------
# exactly-once hardening (the "fail" event among them)
# ---------------------------------------------------------------------------
def _start(cmd: Sequence[str]) -> Tuple[subprocess.Popen, IO[bytes], IO[bytes]]:
    """Start ``cmd`` in its own session, its output into temporary files."""
    fo, fe = tempfile.TemporaryFile(), tempfile.TemporaryFile()
    p = subprocess.Popen(list(cmd), stdout=fo, stderr=fe, stdin=subprocess.DEVNULL, env=child_env(),
                         start_new_session=True)
    return p, fo, fe


def _finish(p: subprocess.Popen, fo: IO[bytes], fe: IO[bytes], t0: float, bound: float) -> Proc:
    """Wait for a :func:`_start` ed run until ``bound`` s after ``t0`` (then kill it: hung)."""
    hung = False
    try:
        p.wait(max(0.1, bound - (time.monotonic() - t0)))
    except subprocess.TimeoutExpired:
        hung = True
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
    fo.seek(0)
    fe.seek(0)
    return Proc(rc=p.returncode, killed=False, hung=hung, seconds=time.monotonic() - t0,
                out=fo.read().decode(errors="replace"), err=fe.read().decode(errors="replace"))


def sigterm_cycles(n: int) -> Scenario:
    """SIGTERM to the whole process group of ``cat --journal`` (as Slurm sends it), rerun."""
    def scenario(s: Suite) -> Row:
        row = Row(f"SIGTERM x{n} to cat --journal (exit 143, commit, rerun)", "resume")
        srv = s.server(bytes_per_second=4e5)
        d = s.tmp("sigterm")
        journal = os.path.join(d, "run.db")
        cmd = cat_cmd(srv.url + "manifest.json", journal=journal, cache_dir=os.path.join(d, "cache"),
                      epochs=1, commit_every=100000)
        rng = random.Random(f"{s.seed}:sigterm")
        out: List[str] = []
        try:
            for i in range(n + 6):
                t0 = time.monotonic()
                p, fo, fe = _start(cmd)
                if i < n:
                    # once it delivers (a SIGTERM before the loader exists kills
                    # it, as it would any program: nothing is committed then)
                    while p.poll() is None and os.fstat(fo.fileno()).st_size == 0 \
                            and time.monotonic() - t0 < BOUND:
                        time.sleep(0.02)
                    time.sleep(rng.uniform(0.0, 0.5))
                    if p.poll() is None:
                        os.killpg(p.pid, signal.SIGTERM)
                        row.faults += 1
                q = _finish(p, fo, fe, t0, BOUND)
                row.runs += 1
                out += q.lines
                if q.hung:
                    row.hung += 1
                    break
                if q.rc == 0 or (q.rc == -signal.SIGTERM and len(out) == len(s.ref)):
                    break  # (-15: the signal came after the last commit and close)
                if q.rc == 143 and "stopped by signal 15" in last_line(q.err):
                    row.clear_errors += 1
                    row.note = last_line(q.err)[:100]
                else:
                    row.bad_exits.append(f"exit {q.rc}: {last_line(q.err)}")
                    break
            row.tally.add(compare(s.ref, out, s.data.digests))
        finally:
            srv.stop()
        return row
    return labelled("sigterm_cycles", scenario)


def journal_started_together(s: Suite) -> Row:
    """Two ``cat --journal`` started at the same moment: one resumes, the other is refused."""
    row = Row("two runs started together on one journal", "resume")
    d = s.tmp("together")
    journal = os.path.join(d, "run.db")
    # a throttled server and a cold cache for each run, so the two runs surely
    # overlap (a local run can finish before the other one has even started)
    srv = s.server(bytes_per_second=4e5)
    src = srv.url + "manifest.json"
    try:
        first = cat_cmd(src, journal=journal, cache_dir=os.path.join(d, "cache0"), epochs=1,
                        commit_every=10, workers=0, extra=["--limit", "100"])
        q = run(first, bound=BOUND)
        row.runs += 1
        out = list(q.lines)
        # every shard request is held until one of the two has ended: the two
        # surely overlap however loaded the machine is
        srv.hold()
        t0 = time.monotonic()
        started = [_start(cat_cmd(src, journal=journal, cache_dir=os.path.join(d, f"cache{i}"), epochs=1,
                                  commit_every=10, workers=0)) for i in (1, 2)]

        def release_when_one_ends() -> None:
            while time.monotonic() - t0 < 90 and all(p.poll() is None for p, _, _ in started):
                time.sleep(0.05)
            srv.release()
        releaser = threading.Thread(target=release_when_one_ends, daemon=True)
        releaser.start()
        procs = [_finish(p, fo, fe, t0, BOUND) for p, fo, fe in started]
        releaser.join(5)
    finally:
        srv.release()
        srv.stop()
    row.runs += 2
    row.faults = 1
    for q in procs:
        if q.hung:
            row.hung += 1
        elif q.rc == 0:
            out += q.lines
        elif q.clear_error and "in use" in q.err:
            row.clear_errors += 1
            row.note = last_line(q.err)[:100]
            if q.lines:
                row.bad_exits.append(f"refused run printed {len(q.lines)} lines")
        else:
            row.bad_exits.append(f"exit {q.rc}: {last_line(q.err)}")
    if sum(1 for q in procs if q.rc == 0) != 1:
        row.bad_exits.append(f"{sum(1 for q in procs if q.rc == 0)} of 2 concurrent runs finished")
    row.tally.add(compare(s.ref, out, s.data.digests))
    return row


def fail_is_journaled(s: Suite) -> Row:
    """on_error=raise: the missing shard is 'failed' in the journal and counted as a failure."""
    row = Row("shard fails under on_error=raise: journaled as failed", "error")
    d = s.tmp("failjournal")
    with open(s.data.manifest) as f:
        m = json.load(f)
    root = os.path.dirname(os.path.abspath(s.data.manifest))
    for sh in m["shards"]:
        sh["url"] = os.path.join(root, os.path.basename(sh["url"]))
    gone = m["shards"][2]["url"] + ".missing"
    m["shards"][2]["url"] = gone
    path = os.path.join(d, "manifest.json")
    with open(path, "w") as f:
        json.dump(m, f)
    journal = os.path.join(d, "run.db")
    p = run(cat_cmd(path, journal=journal, cache_dir=os.path.join(d, "cache"), epochs=1, workers=2,
                    extra=["--shuffle-mode", "none"]), bound=BOUND)
    row.runs, row.faults = 1, 1
    ref_none = run(cat_cmd(s.data.manifest, workers=0, epochs=1, extra=["--shuffle-mode", "none"]),
                   bound=BOUND).lines
    if p.hung:
        row.hung += 1
    elif p.rc == 0:
        row.bad_exits.append("exit 0 with a missing shard")
    elif p.clear_error:
        row.clear_errors += 1
        st = status(journal)
        state = {x["url"]: x["state"] for x in st["shards"]["list"]}.get(gone)
        if state != "failed" or st["counts"]["failures"] != 1:
            row.bad_exits.append(f"journal: shard state {state}, failures {st['counts']['failures']}")
        row.note = f"journal: {state}, failures {st['counts']['failures']}"
    else:
        row.bad_exits.append(f"unclear exit {p.rc}: {last_line(p.err)}")
    row.tally.add(compare(ref_none[:len(p.lines)], p.lines, s.data.digests))
    return row


def exactly_once_rows(quick: bool) -> List[Scenario]:
    """SIGTERM cycles, two runs started together, a failure journaled."""
    return [sigterm_cycles(3 if quick else 8), journal_started_together, fail_is_journaled]
