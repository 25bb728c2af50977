"""``resumewds index`` at scale: shards in parallel processes, a kill -9 half way and a rerun.

The checks compare whole outputs: a resumed run's manifest (apart from its
``created`` time, which is the first start's) and index files equal a clean
run's, and the rerun fetches none of the shards the killed run finished.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time

import pytest

import resumewds as rw
from chaos.faultserver import FaultServer
from conftest import REPO
from resumewds.tar import scan_file

pytestmark = pytest.mark.usefixtures("cache_dir")


def run_cli(*args, env=None, **kw):
    return subprocess.run([sys.executable, "-m", "resumewds", *args], capture_output=True, text=True,
                          cwd=REPO, env=env, timeout=240, **kw)


def load(path):
    doc = json.load(open(path))
    doc.pop("created")
    return doc


def index_files(path):
    d = path + ".index"
    return {n: open(os.path.join(d, n), "rb").read() for n in sorted(os.listdir(d))}


def test_parallel_equals_serial_and_reads_the_same(make_shards, tmp_path):
    paths = make_shards(shards=8, samples=40, size_range=(10, 40))
    a, b = str(tmp_path / "a.json"), str(tmp_path / "b.json")
    pa = run_cli("index", *paths, "-o", a, "-j", "2", "--offsets", "index")
    pb = run_cli("index", *paths, "-o", b, "-j", "1", "--offsets", "index")
    assert pa.returncode == 0 and pb.returncode == 0, pa.stderr + pb.stderr
    assert load(a)["version"] == 4 and load(a)["shards"] == load(b)["shards"]
    assert index_files(a) == index_files(b)
    inline = str(tmp_path / "inline.json")
    assert run_cli("index", *paths, "-o", inline, "--offsets", "inline").returncode == 0
    assert not os.path.exists(inline + ".index") and not os.path.exists(inline + ".indexing")
    ka = [s["__key__"] for s in rw.WebDataset(a, shuffle=True, seed=2)]
    assert ka == [s["__key__"] for s in rw.WebDataset(inline, shuffle=True, seed=2)]


@pytest.mark.slow
def test_kill_9_half_way_then_the_same_command_continues(tmp_path, make_shards):
    """24 shards over a throttled http server, 2 processes; SIGKILL at about half
    way; the rerun (with an empty cache) fetches only what was not done and
    writes what a clean run writes."""
    paths = make_shards(shards=24, samples=100, size_range=(40, 120))
    srv_root = tmp_path / "srv"
    srv_root.mkdir()
    for p in paths:
        shutil.copy(p, srv_root)
    srv = FaultServer(str(srv_root), bytes_per_second=1_000_000)
    srv.start()
    try:
        url = srv.url + "/shard-{000000..000023}.tar"
        out = str(tmp_path / "m.json")
        journal = out + ".indexing"
        env = dict(os.environ, RESUMEWDS_CACHE_DIR=str(tmp_path / "cache1"))
        p = subprocess.Popen([sys.executable, "-m", "resumewds", "index", url, "-o", out, "-j", "2",
                              "--offsets", "index"],
                             cwd=REPO, env=env, start_new_session=True, stdout=subprocess.DEVNULL,
                             stderr=subprocess.PIPE)
        done = 0
        deadline = time.monotonic() + 120
        while done < 12 and p.poll() is None and time.monotonic() < deadline:
            time.sleep(0.02)  # polling the journal: the event is its 13th line
            done = open(journal).read().count("\n") - 1 if os.path.exists(journal) else 0
        os.killpg(p.pid, signal.SIGKILL)  # the CLI and its worker processes
        p.wait()
        assert 12 <= done < 24 and os.path.exists(journal) and not os.path.exists(out), done
        before = dict(srv.requests)
        env2 = dict(os.environ, RESUMEWDS_CACHE_DIR=str(tmp_path / "cache2"))
        r = run_cli("index", url, "-o", out, "-j", "2", "--offsets", "index", env=env2)
        assert r.returncode == 0, r.stderr
        kept = int(r.stderr.split("continuing an interrupted index: ")[1].split(" of ")[0])
        assert kept >= done
        again = {k: n - before.get(k, 0) for k, n in srv.requests.items() if n - before.get(k, 0)}
        assert len(again) == 24 - kept, (kept, again)  # every shard the journal kept: not fetched again
        assert not os.path.exists(journal)
        clean = str(tmp_path / "clean.json")
        r = run_cli("index", url, "-o", clean, "-j", "2", "--offsets", "index",
                    env=dict(env2, RESUMEWDS_CACHE_DIR=str(tmp_path / "c3")))
        assert r.returncode == 0, r.stderr
        assert load(out)["shards"] == load(clean)["shards"] and index_files(out) == index_files(clean)
        assert {k: v for k, v in load(out).items() if k != "index_dir"} == \
            {k: v for k, v in load(clean).items() if k != "index_dir"}
    finally:
        srv.stop()


def test_a_failed_shard_is_listed_and_the_others_kept(make_shards, tmp_path):
    paths = make_shards(shards=6, samples=10)
    wids = {"__kind__": "wids-shard-index-v1", "wids_version": 1,
            "shardlist": [{"url": p, "nsamples": scan_file(p).samples} for p in paths]}
    wids["shardlist"][3]["nsamples"] = 9
    src = str(tmp_path / "wids.json")
    json.dump(wids, open(src, "w"))
    out = str(tmp_path / "m.json")
    r = run_cli("index", src, "-o", out, "-j", "1")
    assert r.returncode == 1
    assert "1 of 6 shards could not be indexed" in r.stderr and "shard-000003.tar" in r.stderr
    assert "says it holds 9 samples, it holds 10" in r.stderr
    wids["shardlist"][3]["nsamples"] = 10  # the source fixed: only that shard is indexed now
    json.dump(wids, open(src, "w"))
    r = run_cli("index", src, "-o", out, "-j", "1")
    assert r.returncode == 0 and "5 of 6 shards already done" in r.stderr, r.stderr
    assert rw.WebDataset(out).manifest.total_samples == 60


def test_counts_only_then_completed_in_place(make_shards, tmp_path, cache_dir):
    paths = make_shards(shards=5, samples=12)
    wids = {"__kind__": "wids-shard-index-v1", "wids_version": 1,
            "shardlist": [{"url": os.path.basename(p), "nsamples": 12, "filesize": os.path.getsize(p)}
                          for p in paths]}
    src = os.path.join(os.path.dirname(paths[0]), "wids.json")
    json.dump(wids, open(src, "w"))
    out = os.path.join(os.path.dirname(paths[0]), "m.json")
    r = run_cli("index", src, "-o", out, "--counts-only")
    assert r.returncode == 0, r.stderr
    doc = json.load(open(out))
    assert doc["version"] == 4 and all("index_xxh3_64" not in s and s["xxh3_64"] is None for s in doc["shards"])
    want = [s["__key__"] for s in rw.WebDataset(paths, shuffle=True, seed=1)]
    assert [s["__key__"] for s in rw.WebDataset(out, shuffle=True, seed=1)] == want
    r = run_cli("index", out, "-o", out, "--offsets", "index")
    assert r.returncode == 0, r.stderr
    doc = json.load(open(out))
    assert all(s["xxh3_64"] and s["index_xxh3_64"] for s in doc["shards"])
    assert [s["__key__"] for s in rw.WebDataset(out, shuffle=True, seed=1)] == want
