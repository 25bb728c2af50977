"""``resumewds status`` and ``resumewds report`` show a mixture's per-source proportions.

Real shards (two generated data sets), a real WebLoader with real DataLoader
workers over a MixedDataset, a real SQLite journal, and the real CLI run as a
subprocess (``python -m resumewds status ...``).  The figures printed must be
exactly ``loader.stats()["mixture"]`` at the last commit.
"""

from __future__ import annotations

import json
import os
import re
import sqlite3
import subprocess
import sys
from typing import Any, Dict, List, Optional, Sequence

import pytest

import resumewds as rw
from resumewds.synth import write_shards

pytestmark = pytest.mark.usefixtures("cache_dir")

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
LINE = re.compile(r"^  (?P<name>\S+)\s+(?P<delivered>\d+) samples \((?P<frac>[0-9.]+)\), requested "
                  r"(?P<req>[0-9.]+), deviation (?P<dev>[+-][0-9.]+) \(bound < (?P<bound>[0-9.]+)\)$")
HEAD = re.compile(r"^mixture phase (?P<phase>\d+) at position (?P<pos>\d+):$")


@pytest.fixture(scope="module")
def two_sources(tmp_path_factory) -> List[List[str]]:
    """Two small data sets of different sizes: 3 x 7 = 21 and 2 x 20 = 40 samples."""
    root = str(tmp_path_factory.mktemp("mixstat"))
    a = write_shards(os.path.join(root, "web"), shards=3, samples=7, size_range=(5, 40), seed=1)
    b = write_shards(os.path.join(root, "code"), shards=2, samples=20, size_range=(5, 40), seed=2)
    return [sorted(a), sorted(b)]


def _mixed(paths: List[List[str]], phases: Any = None, weights: Sequence[float] = (3, 1)) -> rw.MixedDataset:
    ds = [rw.WebDataset(p, seed=10 + i, shuffle=True, shuffle_window=2) for i, p in enumerate(paths)]
    return rw.MixedDataset(ds, weights=list(weights), names=["web", "code"], seed=5, epoch_size=48,
                           phases=phases)


def _collate(batch: List[Dict[str, Any]]) -> List[str]:
    return [x.get("__source__", "") for x in batch]


def _train(ds: Any, journal: str, steps: int, workers: int, batch: int = 4) -> Dict[str, Any]:
    """Commit ``steps`` steps (resuming from the journal), return the loader's final stats."""
    ld = rw.WebLoader(ds, batch_size=batch, num_workers=workers, collate_fn=_collate,
                      journal=journal, resume=True)
    step, n = ld.steps_done, 0
    try:
        while n < steps:
            for _ in ld:
                ld.commit(step)
                step += 1
                n += 1
                if n >= steps:
                    break
        return ld.stats()
    finally:
        ld.close()


def _cli(*args: str) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    return subprocess.run([sys.executable, "-m", "resumewds", *args], capture_output=True, text=True,
                          env=env, timeout=120)


def _parse(text: str) -> Optional[Dict[str, Any]]:
    lines = text.splitlines()
    heads = [i for i, x in enumerate(lines) if HEAD.match(x)]
    if not heads:
        return None
    assert len(heads) == 1, text
    h = HEAD.match(lines[heads[0]])
    rows = []
    for x in lines[heads[0] + 1:]:
        m = LINE.match(x)
        if not m:
            break
        rows.append(m.groupdict())
    return {"phase": int(h["phase"]), "global_position": int(h["pos"]), "sources": rows}


def _assert_printed_equals(printed: Optional[Dict[str, Any]], live: Dict[str, Any]) -> None:
    assert printed is not None
    assert printed["phase"] == live["phase"] and printed["global_position"] == live["global_position"]
    assert [r["name"] for r in printed["sources"]] == [s["name"] for s in live["sources"]]
    for r, s in zip(printed["sources"], live["sources"]):
        assert int(r["delivered"]) == s["delivered"]
        assert r["frac"] == f"{s['delivered_fraction']:.3f}"
        assert r["req"] == f"{s['requested_fraction']:.3f}"
        assert r["dev"] == f"{s['deviation']:+.2f}"


def test_status_cli_prints_the_live_mixture_stats_across_a_curriculum_resume(two_sources, tmp_path):
    j = str(tmp_path / "run.db")
    # phase 0 (weights 3:1) for 5 steps of 4 with 2 worker processes
    live0 = _train(_mixed(two_sources), j, 5, workers=2)["mixture"]
    r = _cli("status", j)
    assert r.returncode == 0, r.stderr
    printed = _parse(r.stdout)
    _assert_printed_equals(printed, live0)
    assert printed["phase"] == 0 and printed["global_position"] == 20
    assert [int(s["delivered"]) for s in printed["sources"]] == [15, 5]
    assert [s["req"] for s in printed["sources"]] == ["0.750", "0.250"]

    # a curriculum step declared at the resume: 1:3 from position 28 on; 6 more steps, 1 worker
    live1 = _train(_mixed(two_sources, phases=[(28, [1, 3])]), j, 6, workers=1)["mixture"]
    assert live1["phase"] == 1 and live1["global_position"] == 44
    r = _cli("status", j)
    assert r.returncode == 0, r.stderr
    printed = _parse(r.stdout)
    _assert_printed_equals(printed, live1)
    # 28 positions at 3:1, then 16 at 1:3: 21 + 4 = 25 web, 7 + 12 = 19 code
    assert [int(s["delivered"]) for s in printed["sources"]] == [25, 19]
    assert [s["req"] for s in printed["sources"]] == ["0.250", "0.750"]
    # the text sits between the epoch line and the events line
    lines = r.stdout.splitlines()
    at = next(i for i, x in enumerate(lines) if HEAD.match(x))
    assert lines[at + 3].startswith("events   ")

    # --json carries the same dict
    r = _cli("status", j, "--json")
    assert r.returncode == 0, r.stderr
    assert json.loads(r.stdout)["mixture"] == json.loads(json.dumps(live1))


def test_report_has_the_mixture_table(two_sources, tmp_path):
    pytest.importorskip("plotly")
    j = str(tmp_path / "run.db")
    live = _train(_mixed(two_sources, phases=[(16, [1, 1])]), j, 7, workers=2)["mixture"]
    out = str(tmp_path / "report.html")
    r = _cli("report", j, "-o", out)
    assert r.returncode == 0, r.stderr
    page = open(out, encoding="utf-8").read()
    card = page[page.index('id="card-mixture"'):page.index('id="card-errors"')]
    assert f"phase {live['phase']} at global position {live['global_position']:,}" in card
    rows = re.findall(r"<tr><td>(\w+)</td><td>([\d,]+)</td><td>([0-9.]+)</td><td>([0-9.]+)</td>"
                      r"<td>([\d,.]+)</td><td>([+-][0-9.]+)</td>", card)
    assert [(n, int(d.replace(",", "")), f, q, float(e.replace(",", "")), float(v)) for n, d, f, q, e, v in rows] \
        == [(s["name"], s["delivered"], f"{s['delivered_fraction']:.3f}", f"{s['requested_fraction']:.3f}",
             round(s["expected"], 2), round(s["deviation"], 2)) for s in live["sources"]]
    assert live["phase"] == 1 and "requested (phase 1)" in card


def test_a_plain_run_prints_no_mixture(two_sources, tmp_path):
    j = str(tmp_path / "plain.db")
    _train(rw.WebDataset(two_sources[0], seed=1, shuffle=True), j, 3, workers=0)
    r = _cli("status", j)
    assert r.returncode == 0, r.stderr
    assert "mixture" not in r.stdout
    prefixes = {x.split()[0] for x in r.stdout.splitlines() if x.strip()}
    assert prefixes <= {"journal", "latest", "resume", "rank", "rate", "shards", "epoch", "events"}, prefixes
    assert "mixture" not in json.loads(_cli("status", j, "--json").stdout)
    pytest.importorskip("plotly")
    out = str(tmp_path / "r.html")
    assert _cli("report", j, "-o", out).returncode == 0
    assert "card-mixture" not in open(out, encoding="utf-8").read()


def test_a_broken_mixture_config_is_one_line_not_a_traceback(two_sources, tmp_path):
    j = str(tmp_path / "run.db")
    _train(_mixed(two_sources), j, 2, workers=0)
    with sqlite3.connect(j) as db:  # a journal whose mixture phases were damaged by hand
        db.execute("UPDATE config SET value = ? WHERE key = 'mixture_phases'", (json.dumps([[0, "x"]]),))
    r = _cli("status", j)
    assert r.returncode == 0, r.stderr
    assert "Traceback" not in r.stderr + r.stdout
    bad = [x for x in r.stdout.splitlines() if x.startswith("mixture")]
    assert len(bad) == 1 and "cannot be evaluated" in bad[0], r.stdout


def test_status_of_a_two_rank_run_counts_every_rank(two_sources, tmp_path):
    """World size 2 (each rank its own loader and journal file): the counts are over both ranks."""
    j = str(tmp_path / "w2.db")
    live = []
    for rank in range(2):
        ld = rw.WebLoader(_mixed(two_sources, phases=[(28, [1, 3])]), batch_size=4, num_workers=rank,
                          rank=rank, world_size=2, collate_fn=_collate, journal=j)
        for step, _ in enumerate(ld):
            ld.commit(step)
            if step == 4:
                break
        live.append(ld.stats()["mixture"])
        ld.close()
    assert live[0] == live[1] and live[0]["global_position"] == 40
    r = _cli("status", j)
    assert r.returncode == 0, r.stderr
    assert "rank 1:" in r.stdout
    _assert_printed_equals(_parse(r.stdout), live[0])
    assert sum(s["delivered"] for s in live[0]["sources"]) == 40
