"""``resumewds report``: a real run's journal in, one offline HTML page out, rendered by Chromium.

The journal comes from real loaders (2 ranks, 2 workers each) reading over a
FaultServer on 127.0.0.1 with scripted faults (so retries, a repair and a
resume exist).  The page is opened in headless Chromium with name resolution
disabled; the test checks that every chart drew its SVG traces.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys

import pytest
from click.testing import CliRunner

from chaos.faultserver import FaultServer
from http_fixtures import fast_config
from resumewds.cli import cli
from resumewds.dataset import WebDataset, build_manifest
from resumewds.journal import Journal
from resumewds.loader import WebLoader
from resumewds.report import (ReportError, hit_rate_series, load_run, render_report,
                              throughput_series, write_report)

CHARTS = ("throughput", "cache", "events", "shards")


def _chromium() -> str:
    for name in ("chromium", "chromium-browser", "google-chrome"):
        path = shutil.which(name)
        if path:
            return path
    pytest.skip("headless Chromium is not installed (apt-get install chromium): cannot check rendering")


def _chromium_args(tmp_path, *extra):
    return [_chromium(), "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
            "--disable-background-networking", "--disable-component-update", "--disable-sync",
            f"--user-data-dir={tmp_path / 'chromium-profile'}",
            # no network at all: the page must not need any
            "--host-resolver-rules=MAP * ~NOTFOUND", "--proxy-server=127.0.0.1:9",
            "--virtual-time-budget=5000", "--window-size=1300,2000", *extra]


@pytest.fixture
def run_journal(shards, tmp_path):
    """A 2-rank run over http with faults, interrupted once and resumed; returns run.db."""
    build_manifest(shards, str(tmp_path / "data" / "manifest.json"))
    journal = str(tmp_path / "run.db")
    with FaultServer(str(tmp_path / "data"), faults="", seed=1) as srv:
        srv.script("/shard-000001.tar", ["500", "reset@0.5"])
        srv.script("/shard-000003.tar", ["flip_data"])

        def session(limit):
            loaders = [WebLoader(WebDataset(srv.url + "manifest.json", fetch=fast_config(), prefetch=0),
                                 batch_size=4, num_workers=2, rank=r, world_size=2, journal=journal,
                                 resume=True) for r in range(2)]
            try:
                for n, _ in enumerate(zip(*loaders)):
                    for ld in loaders:
                        ld.commit(ld.steps_done, stats=True)
                    if n + 1 >= limit:
                        break
            finally:
                for ld in loaders:
                    ld.close()

        session(6)          # interrupted ...
        session(10 ** 9)    # ... and resumed to the end of epoch 0
    return journal


def test_load_run_reads_every_rank(run_journal):
    data = load_run(run_journal)
    assert sorted(data["commits"]) == [0, 1]
    st = data["status"]
    assert st["counts"]["retries"] == 2 and st["counts"]["repairs"] == 1
    kinds = {e["kind"] for e in data["events"]}
    assert {"retry", "repair", "verify_fail", "resume"} <= kinds
    assert all(c["stats"] is not None for c in data["commits"][0])
    # >= 5, not 6: a batch read ahead and dropped at the interruption takes its events with it
    assert data["downloads"]["count"] >= 5 and data["downloads"]["bytes"] > 0
    assert data["latest_stats"]["samples"] > 0
    json.dumps(data, default=str)  # plain data


def test_report_renders_in_chromium_offline(run_journal, tmp_path):
    out = tmp_path / "report.html"
    r = CliRunner().invoke(cli, ["report", run_journal, "-o", str(out)])
    assert r.exit_code == 0, r.output
    page = out.read_text(encoding="utf-8")
    # one self-contained file: plotly.js inline, nothing fetched from anywhere
    assert "Plotly.newPlot" in page and len(page) > 3_000_000
    assert not re.search(r"<script[^>]+src=", page) and not re.search(r"<link[^>]+href=", page)
    assert "cdn.plot.ly" not in page.split("</script>", 1)[1]
    assert os.path.basename(run_journal) in page

    p = subprocess.run(_chromium_args(tmp_path, "--dump-dom", out.as_uri()), capture_output=True,
                       text=True, timeout=120)
    dom = p.stdout
    assert "<html" in dom, p.stderr[-2000:]
    cards = {m.group(1): m.start() for m in re.finditer(r'<section class="card[^"]*" id="card-(\w+)"', dom)}
    assert set(CHARTS) <= set(cards), sorted(cards)
    bounds = sorted(cards.values()) + [len(dom)]
    for name in CHARTS:
        start = cards[name]
        html = dom[start:bounds[bounds.index(start) + 1]]
        assert 'class="main-svg"' in html, f"chart {name} did not render"
        assert re.search(r'class="[^"]*\btrace\b[^"]*scatter', html), f"chart {name} has no traces"
    # both ranks' throughput, every timeline row, and a legend entry per shard state
    tp = dom[cards["throughput"]:cards["cache"]]
    assert "rank 0" in tp and "rank 1" in tp
    ev = dom[cards["events"]:cards["shards"]]
    for kind in ("retry", "verify_fail", "repair", "resume"):
        assert f">{kind}<" in ev, kind
    assert "verified (5)" in dom
    # the summary header
    assert "resumewds run report" in dom and "Latest errors" in dom

    shot = tmp_path / "report.png"
    subprocess.run(_chromium_args(tmp_path, f"--screenshot={shot}", "--hide-scrollbars", out.as_uri()),
                   capture_output=True, timeout=120)
    assert shot.exists() and shot.stat().st_size > 50_000  # a page with charts, not a blank one


def test_report_of_a_journal_without_commits(tmp_path):
    path = str(tmp_path / "empty.db")
    with Journal(path) as j:
        j.check_config({"seed": 1, "samples": 10})
    page = render_report(load_run(path))
    assert page.count("Nothing recorded yet.") == 4 and "No errors recorded." in page


def test_missing_journal_is_a_clean_cli_error(tmp_path):
    r = CliRunner().invoke(cli, ["report", str(tmp_path / "nope.db"), "-o", str(tmp_path / "r.html")])
    assert r.exit_code == 1 and "no journal here" in r.output
    assert not (tmp_path / "r.html").exists()


def test_without_plotly_says_what_to_install(tmp_path, monkeypatch):
    for name in [m for m in sys.modules if m == "plotly" or m.startswith("plotly.")]:
        monkeypatch.delitem(sys.modules, name)
    monkeypatch.setitem(sys.modules, "plotly", None)  # import plotly -> ImportError
    with pytest.raises(ReportError, match=r"pip install 'resumewds\[report\]'"):
        write_report(str(tmp_path / "run.db"), str(tmp_path / "r.html"))


def test_series_arithmetic():
    commits = [{"ts": 0, "samples_total": 0}, {"ts": 1, "samples_total": 10},
               {"ts": 2, "samples_total": 30}, {"ts": 3, "samples_total": 5},   # a fresh loader
               {"ts": 5, "samples_total": 25}]
    assert throughput_series(commits) == ([1, 2, 5], [10.0, 20.0, 10.0])
    assert throughput_series(commits, min_dt=2) == ([2, 5], [15.0, 10.0])
    snaps = [{"ts": 1, "stats": {"cache_hits": 1, "cache_misses": 1}},
             {"ts": 2, "stats": {"cache_hits": 1, "cache_misses": 1}},       # no opens: a gap
             {"ts": 3, "stats": {"cache_hits": 0, "cache_misses": 1}},       # a new loader
             {"ts": 4, "stats": None}]
    assert hit_rate_series(snaps) == ([1, 2, 3], [0.5, None, 0.0], [0.5, 0.5, 0.0])
