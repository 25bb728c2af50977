"""Chaos rows for what a run records: a journal whose ``-wal`` was lost, a
cache entry replaced behind the cache's back, credentials in shard URLs.

    WAL deleted between runs                 error: the rerun refuses the journal
    WAL truncated to half between runs       error: the rerun refuses the journal
    cache entry replaced, same size and mtime  exact: the replacement is noticed
    secrets in URLs                          exact, and no secret in any file written
                                             or line printed

The rows are registered in :func:`chaos.run.matrix` (``integrity_rows``).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from typing import List

from chaos.crash import PY, cat_cmd, child_env, compare, run
from chaos.harness import BOUND, Row, Scenario, Suite, labelled, last_line

_HOLD_SNAPSHOT = """
import sqlite3, sys, time
c = sqlite3.connect(sys.argv[1], isolation_level=None)
c.execute("BEGIN")
c.execute("SELECT count(*) FROM commits").fetchone()
print("ready", flush=True)
time.sleep(600)
"""


def _wal_kept_run(s: Suite, journal: str, cache: str, first: int, second: int) -> str:
    """Two runs into ``journal``; the second one's commits stay in the ``-wal``
    (a reader holds a snapshot from before it, then is killed -9, as a
    killed run leaves them); returns "" or what went wrong."""
    p1 = run(cat_cmd(s.data.manifest, journal=journal, cache_dir=cache, epochs=1, commit_every=10, workers=0,
                     extra=["--limit", str(first)]), bound=BOUND)
    if p1.rc != 0:
        return f"first run failed: {last_line(p1.err)}"
    holder = subprocess.Popen([PY, "-c", _HOLD_SNAPSHOT, journal], stdout=subprocess.PIPE, text=True,
                              env=child_env())
    try:
        if holder.stdout is None or holder.stdout.readline().strip() != "ready":
            return "could not hold a read snapshot"
        p2 = run(cat_cmd(s.data.manifest, journal=journal, cache_dir=cache, epochs=1, commit_every=10, workers=0,
                         extra=["--limit", str(second)]), bound=BOUND)
        if p2.rc != 0:
            return f"second run failed: {last_line(p2.err)}"
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    if not os.path.exists(journal + "-wal") or os.path.getsize(journal + "-wal") == 0:
        return "the second run's commits did not stay in the -wal"
    return ""


def wal_damage(kind: str) -> Scenario:
    name = {"delete": "WAL deleted between runs", "truncate_half": "WAL truncated to half between runs"}[kind]

    def scenario(s: Suite) -> Row:
        row = Row(name, "error")
        d = s.tmp("waldamage")
        journal, cache = os.path.join(d, "run.db"), os.path.join(d, "cache")
        problem = _wal_kept_run(s, journal, cache, 50, 150)
        if problem:
            row.bad_exits.append(problem)
            return row
        wal = journal + "-wal"
        if kind == "delete":
            os.unlink(wal)
        else:
            os.truncate(wal, os.path.getsize(wal) // 2)
        p = run(cat_cmd(s.data.manifest, journal=journal, cache_dir=cache, epochs=1, commit_every=10, workers=0),
                bound=BOUND)
        row.runs, row.faults = 3, 1
        if p.hung:
            row.hung += 1
        elif p.rc == 0:
            row.bad_exits.append(f"silent rewind: exit 0 after printing {len(p.lines)} lines")
        elif p.clear_error and "lost committed steps" in p.err:
            row.clear_errors += 1
            row.note = last_line(p.err)[:100]
        else:
            row.bad_exits.append(f"unclear exit {p.rc}: {last_line(p.err)}")
        row.tally.add(compare(s.ref[150:150 + len(p.lines)], p.lines, s.data.digests))
        return row
    return labelled(name, scenario)


def cache_entry_replaced(s: Suite) -> Row:
    """Every cached shard replaced (os.replace) by a copy with one byte of
    member data changed, its size and mtime set back: the rerun notices."""
    row = Row("cache entry replaced, same size and mtime", "exact")
    d = s.tmp("replaced")
    cache = os.path.join(d, "cache")
    srv = s.server()
    try:
        cmd = cat_cmd(srv.url + "manifest.json", cache_dir=cache, epochs=1, workers=0)
        s.judge(row, run(cmd, bound=BOUND))
        shards = os.path.join(cache, "shards")
        for n in sorted(os.listdir(shards)):
            if not n.endswith(".tar"):
                continue
            path = os.path.join(shards, n)
            st = os.stat(path)
            with open(path, "rb") as f:
                data = bytearray(f.read())
            data[512 + 10] ^= 0xFF  # inside the first member's data
            tmp = path + ".other"
            with open(tmp, "wb") as f:
                f.write(data)
            os.utime(tmp, ns=(st.st_atime_ns, st.st_mtime_ns))
            os.replace(tmp, path)
            row.faults += 1
        s.judge(row, run(cmd, bound=BOUND))
    finally:
        srv.stop()
    return row


SECRETS = ("s3cretPW", "SIGSECRET", "CREDSECRET", "TOKSECRET")


def _signed_manifest(s: Suite, srv_url: str, d: str) -> str:
    with open(s.data.manifest) as f:
        doc = json.load(f)
    for sh in doc["shards"]:
        base = os.path.basename(sh["url"])
        sh["url"] = (srv_url.replace("http://", "http://alice:s3cretPW@") + base
                     + "?X-Amz-Credential=CREDSECRET%2Fus-east-1&X-Amz-Date=20250101T000000Z"
                     + "&X-Amz-Security-Token=TOKSECRET&X-Amz-Signature=SIGSECRET")
    out = os.path.join(d, "signed-manifest.json")
    with open(out, "w") as f:
        json.dump(doc, f)
    return out


def secrets_in_urls(s: Suite) -> Row:
    """A run over presigned URLs with user info: exact output, and no secret
    in the journal, the cache, the report, or what cat/status printed."""
    row = Row("secrets in URLs", "exact")
    d = s.tmp("secrets")
    journal, cache = os.path.join(d, "run.db"), os.path.join(d, "cache")
    srv = s.server()
    try:
        manifest = _signed_manifest(s, srv.url, d)
        p = run(cat_cmd(manifest, journal=journal, cache_dir=cache, epochs=1), bound=BOUND)
        s.judge(row, p)
        row.faults = 1
        printed: List[str] = [p.out, p.err]
        for extra in ([], ["--json"]):
            q = subprocess.run([PY, "-m", "resumewds", "status", journal, *extra], capture_output=True, text=True,
                               env=child_env(), timeout=BOUND)
            printed += [q.stdout, q.stderr]
        q = subprocess.run([PY, "-m", "resumewds", "report", journal, "-o", os.path.join(d, "report.html")],
                           capture_output=True, text=True, env=child_env(), timeout=BOUND)
        printed += [q.stdout, q.stderr]
    finally:
        srv.stop()
    leaks = [f"printed: {sec}" for text in printed for sec in SECRETS if sec in text]
    for dirpath, _, names in os.walk(d):
        for n in names:
            path = os.path.join(dirpath, n)
            if path.endswith("signed-manifest.json"):
                continue  # the user's input
            with open(path, "rb") as f:
                blob = f.read()
            leaks += [f"{os.path.relpath(path, d)}: {sec}" for sec in SECRETS if sec.encode() in blob]
    if leaks:
        row.bad_exits.append("secrets recorded or printed: " + ", ".join(sorted(set(leaks))[:6]))
    else:
        row.note = "no secret in the journal, cache, report, cat or status output"
    return row


def integrity_rows() -> List[Scenario]:
    """The rows of this module, in the order the matrix runs them."""
    return [wal_damage("delete"), wal_damage("truncate_half"),
            labelled("cache entry replaced, same size and mtime", cache_entry_replaced),
            labelled("secrets in URLs", secrets_in_urls)]


__all__ = ["cache_entry_replaced", "integrity_rows", "secrets_in_urls", "wal_damage"]

if __name__ == "__main__":  # pragma: no cover
    sys.exit("run these rows with: python -m chaos run --only WAL --only 'cache entry replaced' --only secrets")
