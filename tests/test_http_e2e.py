"""End to end over a real, faulty HTTP server on 127.0.0.1.

With faults on, `resumewds cat` over http prints exactly the lines it prints
over the local files; corrupt bytes are repaired, never delivered; on_error
skip says what it skipped; a journal run over http resumes exactly.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from click.testing import CliRunner

import resumewds as rw
from chaos.faultserver import FaultServer
from resumewds.cli._main import cli
from resumewds.synth import write_shards

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
FAST = {"RESUMEWDS_FETCH_BACKOFF_INITIAL": "0.01", "RESUMEWDS_FETCH_BACKOFF_MAX": "0.05",
        "RESUMEWDS_FETCH_READ_TIMEOUT": "0.5", "RESUMEWDS_FETCH_ATTEMPTS": "30"}


@pytest.fixture
def data(tmp_path, monkeypatch):
    for k, v in FAST.items():
        monkeypatch.setenv(k, v)
    for var in ("RANK", "WORLD_SIZE", "RESUMEWDS_VERBOSE"):
        monkeypatch.delenv(var, raising=False)
    d = tmp_path / "data"
    write_shards(str(d), shards=6, samples=40, size_range=(300, 3000), seed=3)
    rw.build_manifest(str(d / "shard-{000000..000005}.tar"), str(d / "manifest.json"))
    return d


def _cat(args, cache):
    res = CliRunner().invoke(cli, ["cat", *args, "--cache-dir", str(cache)], catch_exceptions=False)
    return res


@pytest.mark.parametrize("faults", [
    "mixed:0.3",
    "flip_data=0.2,flip_header=0.2",
    "truncate_nolen=0.3",
    "stall=0.15,reset=0.15,503=0.1,429=0.1",
])
def test_cat_over_faulty_http_equals_local(data, tmp_path, faults):
    local = _cat([str(data / "manifest.json"), "--seed", "7", "--shuffle", "--epochs", "2"], tmp_path / "c0")
    assert local.exit_code == 0
    with FaultServer(str(data), faults=faults, seed=11, max_faults_per_path=4, stall_seconds=2.0,
                     retry_after=0) as srv:
        remote = _cat([srv.url + "manifest.json", "--seed", "7", "--shuffle", "--epochs", "2"],
                      tmp_path / "c1")
        injected = sum(srv.faults.values()) if isinstance(srv.faults, dict) else srv.faults
    assert remote.exit_code == 0, remote.output
    assert remote.stdout == local.stdout
    assert injected > 0


def test_cat_over_http_with_workers_and_journal_resumes(data, tmp_path):
    ref = _cat([str(data / "manifest.json"), "--seed", "5", "--shuffle", "--epochs", "2"], tmp_path / "c0")
    with FaultServer(str(data), faults="mixed:0.2", seed=2, max_faults_per_path=3, stall_seconds=2.0,
                     retry_after=0) as srv:
        args = [srv.url + "manifest.json", "--seed", "5", "--shuffle", "--epochs", "2", "--workers", "2",
                "--journal", str(tmp_path / "run.db"), "--commit-every", "9"]
        a = _cat(args + ["--limit", "130"], tmp_path / "c1")
        b = _cat(args, tmp_path / "c1")
    assert a.exit_code == 0 and b.exit_code == 0, (a.output, b.output)
    assert a.stdout + b.stdout == ref.stdout


def test_unindexed_http_shards_index_on_first_use(data, tmp_path):
    ref = _cat([str(data / "manifest.json"), "--seed", "1", "--shuffle"], tmp_path / "c0")
    with FaultServer(str(data), faults="mixed:0.2", seed=5, max_faults_per_path=3, stall_seconds=2.0,
                     retry_after=0) as srv:
        out = _cat([srv.url + "shard-{000000..000005}.tar", "--seed", "1", "--shuffle"], tmp_path / "c1")
    assert out.exit_code == 0, out.output
    assert out.stdout == ref.stdout


def test_on_error_skip_says_what_it_skipped(data, tmp_path):
    os.remove(data / "shard-000002.tar")
    with FaultServer(str(data), faults="", seed=0) as srv:
        strict = _cat([srv.url + "manifest.json"], tmp_path / "c1")
        assert strict.exit_code != 0
        assert "shard-000002.tar" in strict.output and "404" in strict.output
        skip = _cat([srv.url + "manifest.json", "--on-error", "skip", "--stats"], tmp_path / "c2")
    assert skip.exit_code == 0, skip.output
    lines = skip.stdout.splitlines()
    assert len(lines) == 5 * 40
    assert not any(line.startswith("shard-000002.tar") for line in lines)
    assert "shard-000002.tar" in skip.stderr and "skipped" in skip.stderr
    stats = json.loads(skip.stderr.strip().splitlines()[-1])
    assert stats["shards_skipped"] >= 1
    assert any("shard-000002.tar" in u for u in stats["failed_shards"])


def test_remote_manifest_with_wrong_checksum_is_a_clear_error(data, tmp_path):
    m = json.loads((data / "manifest.json").read_text())
    m["shards"][1]["xxh3_64"] = "0" * 16
    (data / "manifest.json").write_text(json.dumps(m))
    with FaultServer(str(data), faults="", seed=0) as srv:
        out = _cat([srv.url + "manifest.json", "--attempts", "2"], tmp_path / "c1")
    assert out.exit_code != 0
    assert "shard-000001.tar" in out.output and "mismatch" in out.output


def test_python_m_resumewds_cat_over_http_subprocess(data, tmp_path):
    env = dict(os.environ, **FAST, RESUMEWDS_CACHE_DIR=str(tmp_path / "cache"), PYTHONPATH=REPO)
    local = subprocess.run([sys.executable, "-m", "resumewds", "cat", str(data / "manifest.json"),
                            "--seed", "9", "--shuffle"], capture_output=True, text=True, env=env,
                           check=True, timeout=120)
    with FaultServer(str(data), faults="mixed:0.3", seed=9, max_faults_per_path=3, stall_seconds=2.0,
                     retry_after=0) as srv:
        remote = subprocess.run([sys.executable, "-m", "resumewds", "cat", srv.url + "manifest.json",
                                 "--seed", "9", "--shuffle", "--workers", "2"], capture_output=True,
                                text=True, env=env, timeout=120)
    assert remote.returncode == 0, remote.stderr
    assert remote.stdout == local.stdout


def test_a_shuffled_window_is_fetched_in_parallel_before_the_next(data, tmp_path):
    """A shuffled window touches all its shards at once: its shards are the
    first ones prefetched (beside the reader's own), not the next window's."""
    write_shards(str(data), shards=8, samples=40, size_range=(2000, 4000), seed=5, prefix="big")
    rw.build_manifest(str(data / "big-{000000..000007}.tar"), str(data / "big.json"))
    with FaultServer(str(data), bytes_per_second=400_000) as srv:  # ~0.3 s a shard
        ds = rw.WebDataset(srv.url + "big.json", shuffle=True, seed=1, shuffle_window=4, prefetch=2,
                           cache_dir=str(tmp_path / "c"))
        # one background download at a time: the order of the requests is the
        # order of the wish list (with more threads, requests sent together
        # reach the server in any order)
        ds.store.prefetch_threads = 1
        window0 = {os.path.basename(ds.manifest.shards[i].url) for i in ds.plan.epoch(0).window_shards(0)}
        got = [s["__key__"] for s in rw.WebLoader(ds, batch_size=None, num_workers=0)]
        ds.close()
        shards = [p.lstrip("/") for p in srv.request_log if p.endswith(".tar")]
    assert len(got) == 8 * 40 and len(set(got)) == 8 * 40
    assert set(shards[:3]) <= window0, (shards, window0)
    assert sorted(shards) == sorted(set(shards))  # each shard fetched once


def test_a_shard_that_cannot_be_fetched_is_tried_once_per_read_of_a_run(data, tmp_path):
    """Unshuffled samples are read in runs; a shard whose fetch fails costs one
    retry budget, not one per sample of the run (on_error skip and raise)."""
    from resumewds.errors import TransientFetchError
    from resumewds.fetch import FetchConfig
    from resumewds.fetch._settings import no_sleep

    cfg = FetchConfig(attempts=2, backoff_initial=0.001, backoff_max=0.001, sleep=no_sleep)
    for on_error in ("skip", "raise"):
        with FaultServer(str(data)) as srv:
            srv.script("/shard-000002.tar", ["503"] * 50)
            ds = rw.WebDataset(srv.url + "manifest.json", fetch=cfg, prefetch=0, on_error=on_error,
                               cache_dir=str(tmp_path / on_error))
            if on_error == "skip":
                ld = rw.WebLoader(ds, batch_size=None, num_workers=0)
                keys = [s["__key__"] for s in ld]
                assert len(keys) == 5 * 40 and list(ld.stats()["failed_shards"]) == [srv.url + "shard-000002.tar"]
            else:
                with pytest.raises(TransientFetchError, match="503"):
                    list(rw.WebLoader(ds, batch_size=None, num_workers=0))
            ds.close()
            assert srv.requests["/shard-000002.tar"] == 2, on_error
