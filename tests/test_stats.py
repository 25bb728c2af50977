"""Stats, logging, progress bars and TensorBoard: counters checked against known data.

Local shards for delivery counters; a live FaultServer on 127.0.0.1 for the
cache, fetch and retry counters; a subprocess for worker logging; a pty for
the progress bar.
"""

from __future__ import annotations

import logging
import math
import os
import pty
import re
import subprocess
import textwrap
import time

import pytest
from click.testing import CliRunner

from chaos.faultserver import FaultServer
from conftest import N_SAMPLES, N_SHARDS, PY, raw_samples, subprocess_env
from http_fixtures import fast_config
from resumewds.cli._main import _NoBar, _progress, cli
from resumewds.dataset import WebDataset, build_manifest
from resumewds.events import event_record
from resumewds.loader import WebLoader
from resumewds.run._stats import COUNTERS, TIMERS, Stats, flat_scalars

TOTAL = N_SHARDS * N_SAMPLES  # 185


@pytest.fixture
def quiet_logger():
    """Restore the ``resumewds`` logger (level, handlers) after the test."""
    logger = logging.getLogger("resumewds")
    level, handlers = logger.level, list(logger.handlers)
    logger.setLevel(logging.NOTSET)
    yield logger
    logger.setLevel(level)
    logger.handlers[:] = handlers


@pytest.fixture
def served(shards, tmp_path):
    """The 5 test shards and their manifest behind a FaultServer (no faults yet)."""
    build_manifest(shards, str(tmp_path / "data" / "manifest.json"))
    with FaultServer(str(tmp_path / "data"), faults="", seed=1) as srv:
        yield srv


def _sample_bytes(paths):
    return sum(len(v) for p in paths for s in raw_samples(p) for k, v in s.items()
               if not k.startswith("__"))


def _run(loader):
    n = 0
    for _batch in loader:
        n += 1
    return n


def _http_loader(srv, num_workers=0, prefetch=0, **kw):
    ds = WebDataset(srv.url + "manifest.json", fetch=fast_config(), prefetch=prefetch,
                    **{k: kw.pop(k) for k in ("cache_size", "shuffle_window") if k in kw})
    return WebLoader(ds, batch_size=8, num_workers=num_workers, **kw)


# ---- Stats on its own ------------------------------------------------------------------

def test_snapshot_has_every_field_before_anything_happens():
    snap = Stats().snapshot()
    for k in COUNTERS + TIMERS:
        assert snap[k] == 0
    assert snap["cache_hit_rate"] is None
    assert snap["queue_depth"] is None and snap["per_worker_queue"] is None
    assert snap["per_worker_samples"] == {} and snap["failed_shards"] == {}


def test_events_are_counted_once_and_prefetch_opens_are_not_reads():
    s = Stats()
    s.update({"worker": 1, "samples": 8, "bytes": 80, "t_read": 0.5, "t_stages": 0.25,
              "t_fetch_wait": 0.125, "events": [{"kind": "retry"}]})
    assert s.snapshot()["retries"] == 0  # update() leaves events to events()
    s.events([{"kind": "retry"}, {"kind": "cache_miss"}, {"kind": "fetch_done", "bytes": 1000, "seconds": 2.0},
              {"kind": "cache_hit", "prefetch": True}, {"kind": "cache_miss", "prefetch": True},
              {"kind": "cache_hit"}, {"kind": "cache_hit"}, {"kind": "evict", "bytes": 30},
              {"kind": "skip", "url": "u1", "error": "boom"}, {"kind": "skip", "url": "u1", "error": "boom"}])
    snap = s.snapshot()
    assert (snap["retries"], snap["cache_hits"], snap["cache_misses"], snap["prefetch_fetches"]) == (1, 2, 1, 1)
    assert snap["cache_hit_rate"] == pytest.approx(2 / 3)
    assert (snap["shards_downloaded"], snap["bytes_fetched"], snap["t_fetch"]) == (1, 1000, 2.0)
    assert (snap["evictions"], snap["bytes_evicted"]) == (1, 30)
    assert snap["shards_skipped"] == 1 and snap["failed_shards"] == {"u1": "boom"}
    assert snap["per_worker"] == {1: {"samples": 8, "batches": 1, "t_read": 0.5, "t_stages": 0.25}}
    assert (snap["t_read"], snap["t_stages"], snap["t_fetch_wait"]) == (0.5, 0.25, 0.125)


def test_recent_rate_uses_only_the_window(monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(time, "time", lambda: now[0])
    s = Stats(window=10.0)
    s.update({"samples": 1000})          # t=1000, falls out of the window later
    now[0] = 1020.0
    s.update({"samples": 10})            # t=1020
    now[0] = 1022.0
    s.update({"samples": 30})            # t=1022
    now[0] = 1024.0
    snap = s.snapshot()
    # window holds t=1020 and t=1022: the 30 samples after the first, over 4 s
    assert snap["recent_samples_per_s"] == pytest.approx(30 / 4)
    assert snap["samples_per_s"] == pytest.approx(1040 / 24)


def test_flat_scalars_for_tensorboard():
    flat = flat_scalars({"samples": 3, "cache_hit_rate": None, "ok": True, "failed_shards": {},
                         "per_worker": {0: {"samples": 2}, 1: {"samples": 1}}, "per_worker_queue": {0: 2}})
    assert flat == {"samples": 3, "worker0/samples": 2, "worker1/samples": 1, "worker0/queue": 2}


# ---- counters against known data ----------------------------------------------------------

def test_delivery_counters_with_two_workers(shards):
    loader = WebLoader(WebDataset(shards), batch_size=8, num_workers=2)
    batches = _run(loader)
    s = loader.stats()
    nsteps = math.ceil(TOTAL / 8)
    assert batches == nsteps == s["batches"]
    assert s["samples"] == TOTAL == s["samples_total"]
    assert s["bytes"] == _sample_bytes(shards)
    # worker w makes steps k with k % 2 == w; the last step (k = 23, worker 1) has 1 sample
    last = TOTAL - (nsteps - 1) * 8
    assert s["per_worker_samples"] == {0: 8 * 12, 1: 8 * 11 + last}
    assert s["per_worker"][0]["batches"] == s["per_worker"][1]["batches"] == 12
    assert s["queue_depth"] is not None and s["queue_depth"] >= 0
    assert set(s["per_worker_queue"]) == {0, 1}
    assert s["cache_hits"] == s["cache_misses"] == s["shards_downloaded"] == 0  # local: no cache
    assert s["cache_hit_rate"] is None
    assert s["t_read"] > 0 and s["t_stages"] > 0 and s["t_wait"] > 0
    assert 0 <= s["t_fetch_wait"] <= s["t_read"]
    assert s["samples_per_s"] > 0 and s["recent_samples_per_s"] > 0
    assert (s["epoch"], s["position"], s["num_workers"]) == (1, 0, 2)


def test_single_process_has_no_queue_depth(shards):
    loader = WebLoader(WebDataset(shards), batch_size=8, num_workers=0)
    _run(loader)
    s = loader.stats()
    assert s["queue_depth"] is None and s["per_worker_samples"] == {0: TOTAL}


@pytest.mark.parametrize("workers", [0, 2])
def test_cache_hits_and_misses_cold_then_warm(served, shards, workers):
    sizes = sum(os.path.getsize(p) for p in shards)
    cold = _http_loader(served, num_workers=workers)
    _run(cold)
    s = cold.stats()
    # every shard is downloaded exactly once (webdataset's worker split: a worker reads its own
    # shards; another one hits only a shard it prefetched)
    assert s["cache_misses"] == N_SHARDS and s["shards_downloaded"] == N_SHARDS
    assert s["bytes_fetched"] == sizes and s["verifications"] == N_SHARDS
    assert s["cache_hits"] <= (N_SHARDS if workers == 2 else 0)
    assert s["t_fetch"] > 0 and s["t_fetch_wait"] > 0
    assert s["samples"] == TOTAL

    warm = _http_loader(served, num_workers=workers)
    _run(warm)
    s = warm.stats()
    assert s["cache_misses"] == s["shards_downloaded"] == s["bytes_fetched"] == 0
    assert N_SHARDS <= s["cache_hits"] <= N_SHARDS * max(1, workers)  # each worker opens its own shards
    assert s["cache_hit_rate"] == 1.0


def test_prefetched_shards_count_as_hits(served):
    loader = _http_loader(served, num_workers=0, prefetch=4)
    _run(loader)
    s = loader.stats()
    assert s["shards_downloaded"] == N_SHARDS
    # downloads by the prefetch thread are prefetch_fetches; the reader then hits
    assert s["cache_misses"] + s["prefetch_fetches"] == N_SHARDS
    assert s["cache_hits"] + s["cache_misses"] == N_SHARDS
    assert s["prefetch_fetches"] >= 1


def test_retries_and_repairs_with_faults(served, tmp_path):
    served.script("/shard-000001.tar", ["500", "reset@0.5"])
    served.script("/shard-000003.tar", ["flip_data"])
    loader = _http_loader(served, num_workers=2, journal=str(tmp_path / "run.db"))
    for step, _ in enumerate(loader):
        loader.commit(step)
    s = loader.stats()
    loader.close()
    assert s["retries"] == 2
    assert (s["verify_failures"], s["repairs"]) == (1, 1)
    assert s["shards_downloaded"] == N_SHARDS + 1  # the repair downloads shard 3 again
    assert s["samples"] == TOTAL and s["shards_skipped"] == 0
    from resumewds.journal._status import status

    st = status(str(tmp_path / "run.db"))
    assert (st["counts"]["retries"], st["counts"]["repairs"], st["counts"]["verify_failures"]) == (2, 1, 1)


def test_skipped_shard_is_counted_once(served):
    served.script("/shard-000002.tar", ["404"] * 4)
    ds = WebDataset(served.url + "manifest.json", fetch=fast_config(), prefetch=0, on_error="skip")
    loader = WebLoader(ds, batch_size=8, num_workers=2)
    _run(loader)
    s = loader.stats()
    assert s["shards_skipped"] == 1 and list(s["failed_shards"]) == [served.url + "shard-000002.tar"]
    assert s["samples"] == TOTAL - N_SAMPLES and s["skipped_samples"] == N_SAMPLES


# ---- logging --------------------------------------------------------------------------------

def _messages(caplog):
    return [r.getMessage() for r in caplog.records if r.name == "resumewds"]


def test_verbose_logs_fetch_retry_verify_repair_evict_resume(served, shards, tmp_path, monkeypatch,
                                                              caplog, quiet_logger):
    monkeypatch.setenv("RESUMEWDS_VERBOSE", "1")
    served.script("/shard-000000.tar", ["503"])
    served.script("/shard-000001.tar", ["flip_data"])
    one = max(os.path.getsize(p) for p in shards)
    journal = str(tmp_path / "run.db")
    # no caplog.set_level: RESUMEWDS_VERBOSE=1 alone must make the records flow
    # a small cache and few open shards (shuffle_window=1 pins at most 3): evictions happen
    loader = _http_loader(served, cache_size=2 * one + 1, shuffle_window=1, journal=journal)
    assert quiet_logger.level == logging.INFO
    for step, _ in enumerate(loader):
        loader.commit(step)
        if step == 5:
            break
    loader.close()
    loader.dataset.close()  # drop its open shards (pinned cache entries cannot be evicted)
    again = _http_loader(served, cache_size=2 * one + 1, shuffle_window=1, journal=journal, resume=True)
    _run(again)
    again.close()
    info = [r.getMessage() for r in caplog.records if r.name == "resumewds" and r.levelno == logging.INFO]
    url0 = served.url + "shard-000000.tar"
    fetched = [m for m in info if m.startswith(f"fetched {url0}: ")]
    assert fetched and re.search(r": \d+ bytes in \d+\.\d{3}s \(", fetched[0])
    assert any(m.startswith(f"retry {url0}: attempt 1 failed (") and "next in" in m for m in info)
    assert any(m.startswith("verified " + served.url) for m in info)
    assert any(m.startswith("verification failed " + served.url + "shard-000001.tar") for m in info)
    assert any(m.startswith("repairing " + served.url + "shard-000001.tar") for m in info)
    assert any(m.startswith("evicted ") and "bytes)" in m for m in info)
    assert any(m.startswith(f"resuming {journal} at step 5") for m in info)
    # cache hits and misses are DEBUG: not shown at RESUMEWDS_VERBOSE=1
    assert not any(r.levelno < logging.INFO for r in caplog.records if r.name == "resumewds")


def test_not_verbose_is_quiet(served, caplog, quiet_logger):
    served.script("/shard-000000.tar", ["503"])
    _run(_http_loader(served, verbose=False))
    assert quiet_logger.level == logging.NOTSET  # nothing configured: the application decides
    assert [r for r in caplog.records if r.name == "resumewds"] == []


def test_verbose_argument_sets_info(shards, quiet_logger):
    WebLoader(WebDataset(shards), batch_size=8, verbose=True)
    assert quiet_logger.level == logging.INFO


def test_load_state_dict_logs_resume(shards, caplog, quiet_logger):
    caplog.set_level(logging.INFO, logger="resumewds")
    a = WebLoader(WebDataset(shards), batch_size=8)
    it = iter(a)
    next(it), next(it)
    state = a.state_dict()
    WebLoader(WebDataset(shards), batch_size=8).load_state_dict(state)
    assert "resuming from a state dict: epoch 0, position 16" in _messages(caplog)


def test_event_record_logs_once_and_a_background_downloads_events_are_tagged(caplog, quiet_logger, tmp_path):
    import threading

    from resumewds.cache import ShardStore

    caplog.set_level(logging.INFO, logger="resumewds")
    ev = event_record("fetch_done", "http://h/a.tar", {"bytes": 2_000_000, "seconds": 0.5})
    assert ev["kind"] == "fetch_done" and ev["bytes"] == 2_000_000 and "prefetch" not in ev
    assert _messages(caplog) == ["fetched http://h/a.tar: 2000000 bytes in 0.500s (4.0 MB/s)"]
    seen = []
    store = ShardStore(str(tmp_path / "cache"), on_event=lambda kind, url, **d: seen.append((kind, d)))

    def background():
        store.in_background()
        store.emit("cache_miss", "u")

    # a thread's name says nothing: only a thread that says it downloads in the background is tagged
    t = threading.Thread(target=background, name="not-a-prefetch-name")
    t.start()
    t.join()
    named = threading.Thread(target=lambda: store.emit("cache_miss", "v"), name="resumewds-prefetch")
    named.start()
    named.join()
    store.emit("cache_hit", "w")
    assert seen == [("cache_miss", {"prefetch": True}), ("cache_miss", {}), ("cache_hit", {})]
    store.close()


WORKER_SCRIPT = textwrap.dedent("""
    import os, sys
    from resumewds import WebDataset, WebLoader
    from resumewds.fetch import FetchConfig, no_sleep

    if __name__ == "__main__":
        print(os.getpid(), flush=True)
        ds = WebDataset(sys.argv[1], prefetch=0, fetch=FetchConfig(attempts=3, sleep=no_sleep))
        loader = WebLoader(ds, batch_size=8, num_workers=2, multiprocessing_context=sys.argv[2])
        for _ in loader:
            pass
""")


@pytest.mark.parametrize("context", ["fork", pytest.param("spawn", marks=pytest.mark.slow)])
def test_workers_log_their_events_once(served, tmp_path, context):
    script = tmp_path / "w.py"
    script.write_text(WORKER_SCRIPT)
    env = subprocess_env()
    env["RESUMEWDS_VERBOSE"] = "1"
    env["RESUMEWDS_CACHE_DIR"] = str(tmp_path / "wcache")
    env["NO_PROXY"] = "127.0.0.1"
    for k in ("HTTP_PROXY", "http_proxy"):
        env.pop(k, None)
    p = subprocess.run([PY, str(script), served.url + "manifest.json", context], env=env,
                       capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    main_pid = int(p.stdout.split()[0])
    fetched = re.findall(r"resumewds\[(\d+)\] INFO fetched (\S+): \d+ bytes in", p.stderr)
    urls = [u for _, u in fetched]
    assert sorted(urls) == sorted(set(urls)) and len(urls) == N_SHARDS  # each download logged once
    assert all(int(pid) != main_pid for pid, _ in fetched)             # ... by the worker that made it


# ---- progress bars --------------------------------------------------------------------------

def test_progress_is_quiet_when_stderr_is_not_a_tty(shards, tmp_path):
    assert isinstance(_progress(10, "x"), _NoBar)  # pytest captures stderr: not a terminal
    assert not isinstance(_progress(10, "x", True), _NoBar)
    r = CliRunner().invoke(cli, ["index", *shards, "-o", str(tmp_path / "m.json")])
    assert r.exit_code == 0, r.output
    assert r.stderr.strip().splitlines() == [
        f"{tmp_path / 'm.json'}: {N_SHARDS} shards, {TOTAL} samples, {sum(os.path.getsize(p) for p in shards)} bytes"]
    r = CliRunner().invoke(cli, ["verify", str(tmp_path / "m.json")])
    assert r.exit_code == 0 and r.stderr.strip() == "verify: 5 ok, 0 failed"
    r = CliRunner().invoke(cli, ["cat", str(tmp_path / "m.json")])
    assert r.exit_code == 0 and r.stderr == "" and len(r.stdout.splitlines()) == TOTAL


def test_progress_bar_shows_on_a_terminal(shards, tmp_path):
    master, slave = pty.openpty()
    try:
        p = subprocess.run([PY, "-m", "resumewds", "index", *shards, "-o", str(tmp_path / "m.json")],
                           env=subprocess_env(), stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                           stderr=slave, timeout=120)
        os.close(slave)
        slave = -1
        out = b""
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:
                break
            if not chunk:
                break
            out += chunk
    finally:
        if slave != -1:
            os.close(slave)
        os.close(master)
    assert p.returncode == 0
    text = out.decode(errors="replace")
    assert "indexing [" in text and f"{N_SHARDS}/{N_SHARDS}" in text and "#" * 24 + "]" in text


# ---- TensorBoard ------------------------------------------------------------------------------

def test_to_tensorboard_writes_readable_scalars(shards, tmp_path):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
    from torch.utils.tensorboard import SummaryWriter

    loader = WebLoader(WebDataset(shards), batch_size=8, num_workers=2)
    _run(loader)
    logdir = str(tmp_path / "tb")
    with SummaryWriter(logdir) as w:
        loader.to_tensorboard(w, step=7)
    acc = EventAccumulator(logdir)
    acc.Reload()
    tags = set(acc.Tags()["scalars"])
    for t in ("data/samples", "data/bytes", "data/recent_samples_per_s", "data/t_read", "data/t_wait",
              "data/worker0/samples", "data/worker1/samples", "data/queue_depth", "data/position"):
        assert t in tags, (t, sorted(tags))
    assert "data/cache_hit_rate" not in tags  # None (no remote shards) is not written
    (ev,) = acc.Scalars("data/samples")
    assert (ev.step, ev.value) == (7, TOTAL)
    assert acc.Scalars("data/worker1/samples")[0].value == loader.stats()["per_worker_samples"][1]
