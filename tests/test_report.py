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
from resumewds.cli._main import cli
from resumewds.dataset import WebDataset, build_manifest
from resumewds.journal import Journal
from resumewds.loader import WebLoader
from resumewds.report import write_report
from resumewds.report._page import ReportError, render_report
from resumewds.report._rundata import hit_rate_series, load_run, throughput_series

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


# ---------------------------------------------------------------------------
# local shards, finished runs, downtime gaps,
# evicted shards; report reads the journal only through public functions
# ---------------------------------------------------------------------------

def _cat_journal(*args):
    r = CliRunner().invoke(cli, ["cat", *args])
    assert r.exit_code == 0, (r.output, r.exception)
    return r.stdout.splitlines()


def _status_text(journal):
    r = CliRunner().invoke(cli, ["status", journal])
    assert r.exit_code == 0, r.output
    return r.stdout


def test_local_shards_and_a_finished_run(shards, tmp_path):
    """5 local shards (no manifest, no checksums) read to the end of epoch 0.

    Before: "shards 0", the shard map "Nothing recorded yet", and "epoch 1 ·
    0 (0%)" for a run that had finished.
    """
    journal = str(tmp_path / "local.db")
    assert len(_cat_journal(*shards)) == 185  # verified once: the cache's markers say so from now on
    assert len(_cat_journal(*shards, "--journal", journal, "--commit-every", "20")) == 185
    data = load_run(journal)
    st = data["status"]
    assert st["shards"]["total"] == 5 and st["shards"]["counts"] == {"read": 5}
    assert st["complete_epochs"] == 1
    assert st["consumption"] == {"epoch": 0, "samples": 185, "shards_started": 5, "shards_complete": 5,
                                 "complete": True}
    text = _status_text(journal)
    assert "shards   5: read 5" in text and "epoch 0: 5/5 shards done, 185 samples" in text
    assert "complete: epoch 0 was delivered in full" in text
    page = render_report(data)
    shards_card = page.split('id="card-shards"', 1)[1].split("</section>", 1)[0]
    assert "Nothing recorded yet" not in shards_card and "read (5)" in shards_card
    assert "epoch 0 complete" in page and "(0%)" not in page


def test_report_leaves_a_gap_over_the_downtime(shards, tmp_path):
    """A run killed (here: stopped) and resumed 2 s later: no rate is drawn across the pause."""
    import time

    journal = str(tmp_path / "gap.db")
    assert len(_cat_journal(*shards, "--journal", journal, "--commit-every", "10", "--limit", "90")) == 90
    time.sleep(2.0)
    assert len(_cat_journal(*shards, "--journal", journal, "--commit-every", "10")) == 95
    data = load_run(journal)
    resumes = [e["ts"] for e in data["events"] if e["kind"] == "resume"]
    assert len(resumes) == 1
    commits = data["commits"][0]
    xs, ys = throughput_series(commits, breaks=resumes)
    assert None in ys and xs[ys.index(None)] == resumes[0]
    before = max(c["ts"] for c in commits if c["ts"] < resumes[0])
    after = min(c["ts"] for c in commits if c["ts"] > resumes[0])
    assert after - before >= 2.0
    # no point is the rate over an interval containing the pause
    for x, y in zip(xs, ys):
        if y is not None:
            assert not (x == after), "a rate was drawn across the downtime"
    assert throughput_series(commits)[1][0] is not None  # without breaks: the old line across


def test_evicted_shards_are_not_pending(tmp_path):
    """The journal's shard row goes back to ``pending`` on an eviction; the
    report and status call it ``evicted`` (a shard fetched again after its
    eviction is what it is now, ``verified``)."""
    from resumewds.journal import shard_updates_from_events

    path = str(tmp_path / "ev.db")
    a, b, c = ("http://h/a.tar", "http://h/b.tar", "http://h/c.tar")
    evs = [{"kind": "fetch_start", "url": u, "ts": t} for u, t in ((a, 1), (b, 2), (c, 3))]
    evs += [{"kind": "fetch_done", "url": u, "ts": t + 0.5, "bytes": 10} for u, t in ((a, 1), (b, 2), (c, 3))]
    evs += [{"kind": "verify_ok", "url": u, "ts": t + 0.6} for u, t in ((a, 1), (b, 2), (c, 3))]
    evs += [{"kind": "evict", "url": a, "ts": 5, "bytes": 10}, {"kind": "evict", "url": c, "ts": 6, "bytes": 10},
            {"kind": "fetch_start", "url": c, "ts": 7}, {"kind": "fetch_done", "url": c, "ts": 7.5},
            {"kind": "verify_ok", "url": c, "ts": 7.6}]
    evs.sort(key=lambda e: e["ts"])
    with Journal(path) as j:
        j.check_config({"seed": 1, "samples": 30, "shards": 3})
        j.record_events(evs)
        j.update_shards(shard_updates_from_events(evs))
        assert j.shard(a)["state"] == "pending"  # what the journal itself says
    data = load_run(path)
    states = {s["url"]: s["state"] for s in data["status"]["shards"]["list"]}
    assert states == {a: "evicted", b: "verified", c: "verified"}
    assert data["status"]["shards"]["counts"] == {"verified": 2, "evicted": 1}
    assert "evicted 1" in _status_text(path)
    assert "evicted (1)" in render_report(data)


def test_report_uses_only_public_journal_functions():
    import inspect

    import resumewds.report._figs as reportfigs
    import resumewds.report._page as report
    import resumewds.report._rundata as rundata

    src = "".join(inspect.getsource(m) for m in (report, rundata, reportfigs))
    for private in ("_open_run", "_close_all", "conn.execute", "SELECT ", "._db("):
        assert private not in src, private


def test_series_gap_at_a_resume():
    commits = [{"ts": 0, "samples_total": 0}, {"ts": 1, "samples_total": 10},
               {"ts": 100, "samples_total": 12}, {"ts": 101, "samples_total": 22}]
    assert throughput_series(commits) == ([1, 100, 101], [10.0, 2 / 99, 10.0])
    assert throughput_series(commits, breaks=[99.0]) == ([1, 99.0, 101], [10.0, None, 10.0])


def test_hit_rate_gap_at_a_resume():
    snaps = [{"ts": 1, "stats": {"cache_hits": 0, "cache_misses": 2}},
             {"ts": 50, "stats": {"cache_hits": 3, "cache_misses": 1}}]  # a new loader after a resume at 40
    assert hit_rate_series(snaps) == ([1, 50], [0.0, 0.75], [0.0, 0.75])
    assert hit_rate_series(snaps, breaks=[40.0]) == ([1, 40.0, 50], [0.0, None, 0.75], [0.0, None, 0.75])
