"""Exactly-once corners (issue 12 items 8, 10, 11, 13): whole sequences compared
against an uninterrupted run, real SQLite journals, real worker processes and
real concurrent processes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import time
from typing import Any, List, Optional

import pytest

import resumewds as rw
from conftest import REPO

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")


def _env() -> dict:
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    return env


# ---------------------------------------------------------------------------
# item 11: the resume point is read under the journal's lock
# ---------------------------------------------------------------------------

_RUNNER = textwrap.dedent("""
    import json, os, sys, time
    import resumewds as rw
    import resumewds.journal as J
    data, journal, out, slow, go = sys.argv[1:]
    ds = rw.WebDataset(json.loads(data))
    ds.manifest
    if slow == "1":   # a slow file system: reading the run's files takes 3 s
        real = J.resolve_resume
        def slow_resolve(*a, **k):
            point = real(*a, **k)
            time.sleep(3)
            return point
        J.resolve_resume = slow_resolve
    while not os.path.exists(go):
        time.sleep(0.005)
    try:
        loader = rw.WebLoader(ds, batch_size=4, journal=journal, resume=True,
                              collate_fn=lambda s: [x["__key__"] for x in s])
    except rw.JournalError as exc:
        json.dump({"refused": str(exc)}, open(out, "w"))
        sys.exit(0)
    keys, start = [], loader.steps_done
    for step, batch in enumerate(loader, start=start):
        keys += batch
        loader.commit(step)
        if step - start >= 4:
            break
    loader.close()
    json.dump({"keys": keys}, open(out, "w"))
""")


def test_two_runs_started_together_never_resume_from_the_same_point(make_shards, tmp_path):
    data = make_shards(shards=2, samples=30)
    journal = str(tmp_path / "run.db")
    go = str(tmp_path / "go")
    procs = []
    for name, slow in (("fast", "0"), ("slow", "1")):
        procs.append(subprocess.Popen(
            [sys.executable, "-c", _RUNNER, json.dumps(data), journal, str(tmp_path / name), slow, go],
            env=_env()))
    time.sleep(4)  # both have imported torch and built their datasets by now
    open(go, "w").close()
    for p in procs:
        assert p.wait(timeout=120) == 0
    results = [json.load(open(tmp_path / n)) for n in ("fast", "slow")]
    delivered: List[str] = [k for r in results for k in r.get("keys", [])]
    assert delivered, results
    # whatever the interleaving: never a sample twice
    assert len(delivered) == len(set(delivered)), results
    assert any("refused" in r for r in results) or len(delivered) == 40, results
