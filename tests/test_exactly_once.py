"""Exactly-once corners: whole sequences compared
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
    data, journal, out, other, go = sys.argv[1:]
    ds = rw.WebDataset(json.loads(data))
    ds.manifest
    if other:   # a slow file system: reading the run's files lasts until the other run is done
        real = J.resolve_resume
        def slow_resolve(*a, **k):
            point = real(*a, **k)
            while not os.path.exists(other):  # (it was refused, or it ran and wrote its keys)
                time.sleep(0.005)
            return point
        J.resolve_resume = slow_resolve
    open(out + ".ready", "w").close()
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


@pytest.mark.slow
def test_two_runs_started_together_never_resume_from_the_same_point(make_shards, tmp_path):
    data = make_shards(shards=2, samples=30)
    journal = str(tmp_path / "run.db")
    go = str(tmp_path / "go")
    procs = []
    for name, other in (("fast", ""), ("slow", str(tmp_path / "fast"))):
        procs.append(subprocess.Popen(
            [sys.executable, "-c", _RUNNER, json.dumps(data), journal, str(tmp_path / name), other, go],
            env=_env()))
    deadline = time.monotonic() + 120  # both have imported torch and built their datasets
    while not all(os.path.exists(tmp_path / f"{n}.ready") for n in ("fast", "slow")):
        assert time.monotonic() < deadline and all(p.poll() is None for p in procs)
        time.sleep(0.01)
    open(go, "w").close()
    for p in procs:
        assert p.wait(timeout=120) == 0
    results = [json.load(open(tmp_path / n)) for n in ("fast", "slow")]
    delivered: List[str] = [k for r in results for k in r.get("keys", [])]
    assert delivered, results
    # whatever the interleaving: never a sample twice
    assert len(delivered) == len(set(delivered)), results
    assert any("refused" in r for r in results) or len(delivered) == 40, results


# ---------------------------------------------------------------------------
# item 8: batch_size=None with remainder="drop" / "pad"
# ---------------------------------------------------------------------------

EPOCHS = 2
CHUNK = 16  # 5 x 37 = 185 samples: 185 % 16 = 9 dropped, 7 pads


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> List[str]:
    from resumewds.synth import write_shards

    root = tmp_path_factory.mktemp("exactly_once")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RESUMEWDS_CACHE_DIR", str(root / "cache"))
        for var in ("RESUMEWDS_CACHE_SIZE", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
            mp.delenv(var, raising=False)
        yield write_shards(str(root / "data"), shards=5, samples=37, size_range=(10, 100))


def _unbatched(data, remainder: str, workers: int, **kw: Any) -> rw.WebLoader:
    ds = rw.WebDataset(data, seed=3, shuffle=True, shuffle_window=2)
    return rw.WebLoader(ds, batch_size=None, num_workers=workers, remainder=remainder,
                        chunk_size=CHUNK, **kw)


def _take(loader: rw.WebLoader, n: Optional[int] = None, commit: bool = False) -> List[tuple]:
    """(epoch, key, is_pad) of each sample until EPOCHS are done or n samples."""
    out: List[tuple] = []
    while loader.epoch < EPOCHS:
        for s in loader:
            out.append((s["__epoch__"], s["__key__"], bool(s.get("__pad__", False))))
            if commit:
                loader.commit(loader.steps_done)
            if n is not None and len(out) >= n:
                return out
    return out


_SEQ: dict = {}


def _reference(data, remainder: str) -> List[tuple]:
    if remainder not in _SEQ:
        _SEQ[remainder] = _take(_unbatched(data, remainder, 0))
    return _SEQ[remainder]


def test_unbatched_drop_and_pad_reference_shape(data):
    drop, pad, keep = (_reference(data, r) for r in ("drop", "pad", "keep"))
    assert len(keep) == 2 * 185
    assert len(drop) == 2 * (185 - 185 % CHUNK)
    assert len(pad) == 2 * (185 + (-185) % CHUNK)
    assert sum(p for _, _, p in pad) == 2 * ((-185) % CHUNK)
    assert [x for x in pad if not x[2]] == keep
    # drop: each epoch loses its last 9 samples, exactly those
    assert drop == [x for i, x in enumerate(keep) if i % 185 < 185 - 185 % CHUNK]


@pytest.mark.parametrize("remainder", ["pad", pytest.param("drop", marks=pytest.mark.slow)])
def test_unbatched_resume_at_every_point_is_exact(data, remainder):
    ref = _reference(data, remainder)
    bad = []
    for n in range(1, len(ref), 3):
        first = _unbatched(data, remainder, 0)
        head = _take(first, n)
        second = _unbatched(data, remainder, 0)
        second.load_state_dict(first.state_dict())
        if head + _take(second) != ref:
            bad.append(n)
    assert not bad, f"{len(bad)} resume points of {len(range(1, len(ref), 3))} differ: {bad[:10]}"


@pytest.mark.parametrize("remainder,w1,w2,n", [
    ("drop", 2, 0, 170), ("drop", 0, 2, 176), ("drop", 2, 3, 200),
    ("pad", 2, 0, 186), ("pad", 0, 2, 190), ("pad", 3, 2, 380),
])
def test_unbatched_resume_with_workers_is_exact(data, remainder, w1, w2, n):
    ref = _reference(data, remainder)
    first = _unbatched(data, remainder, w1)
    head = _take(first, n)
    second = _unbatched(data, remainder, w2)
    second.load_state_dict(first.state_dict())
    assert head + _take(second) == ref


@pytest.mark.parametrize("remainder", ["drop", "pad"])
def test_unbatched_resume_through_the_journal_is_exact(data, tmp_path, remainder):
    ref = _reference(data, remainder)
    for n in (5, 176, 183, 190, 365):
        journal = str(tmp_path / f"{remainder}-{n}.db")
        first = _unbatched(data, remainder, 0, journal=journal)
        head = _take(first, n, commit=True)
        first.close()  # as a kill would: the journal holds the last commit
        second = _unbatched(data, remainder, 2, journal=journal, resume=True)
        assert head + _take(second, commit=True) == ref, n
        second.close()


# ---------------------------------------------------------------------------
# item 9 (one process): padding stays visible after to_tuple; empty steps
# ---------------------------------------------------------------------------

def test_padding_is_visible_after_to_tuple(data):
    ds = rw.WebDataset(data, seed=3).decode().to_tuple("cls", "txt")
    loader = rw.WebLoader(ds, batch_size=16, remainder="pad")
    pads = []
    for batch in loader:
        assert len(loader.batch_info.pads) == len(batch[0])
        pads.extend(loader.batch_info.pads)
    assert sum(pads) == (-185) % 16 == loader.stats()["pads"]
    assert pads[-1] is True and pads[0] is False


def test_a_step_that_loses_every_sample_yields_an_empty_batch(data):
    ds = rw.WebDataset(data, seed=3).select(lambda s: not 32 <= s["__index__"] < 48)
    loader = rw.WebLoader(ds, batch_size=8, collate_fn=lambda s: [x["__key__"] for x in s])
    batches = list(loader)
    assert len(batches) == -(-185 // 8)
    empties = [i for i, b in enumerate(batches) if isinstance(b, rw.EmptyBatch)]
    assert empties == [4, 5]
    b = batches[4]
    assert not b and b.info.filtered == 8 and b.info.empty and b.info.epoch == 0
    assert loader.stats()["empty_batches"] == 2
    assert loader.stats()["filtered"] == 16


# ---------------------------------------------------------------------------
# item 13: a batch stage returning None drops the batch, as a sample stage's
# None drops the sample: both are counted as filtered, the step stays
# ---------------------------------------------------------------------------

def test_batch_stage_none_drops_the_batch_like_a_sample_none(data):
    def drop_third(batch):
        return None if "000002" in batch[0][0] else batch

    ds = rw.WebDataset(data, seed=3).to_tuple("__key__").batched(8).map(drop_third)
    loader = rw.WebLoader(ds, num_workers=2)
    batches = list(loader)
    assert len(batches) == -(-185 // 8)
    assert None not in batches
    dropped = [b for b in batches if isinstance(b, rw.EmptyBatch)]
    assert dropped and all(b.info.filtered > 0 and b.info.samples == 0 for b in dropped)
    st = loader.stats()
    assert st["empty_batches"] == len(dropped)
    assert st["filtered"] == sum(b.info.filtered for b in dropped)


# ---------------------------------------------------------------------------
# item 10: on_error="skip" follows one rule for any worker count; status
# stops calling a shard failed once it was read
# ---------------------------------------------------------------------------

@pytest.mark.parametrize("workers", [0, 2])
def test_skipped_shard_is_retried_next_epoch_with_any_worker_count(make_shards, tmp_path, workers):
    paths = make_shards(shards=4, samples=10)
    manifest = str(tmp_path / "m.json")
    rw.build_manifest(paths, manifest)
    hidden = paths[1] + ".away"
    os.rename(paths[1], hidden)  # epoch 0: shard 1 is missing
    journal = str(tmp_path / f"run{workers}.db")
    ds = rw.WebDataset(manifest, seed=2, shuffle=True, on_error="skip")
    loader = rw.WebLoader(ds, batch_size=5, num_workers=workers, journal=journal,
                          collate_fn=lambda s: [(x["__epoch__"], x["__key__"]) for x in s])
    seen = []
    step = 0
    for batch in loader:
        seen.extend(batch)
        loader.commit(step)
        step += 1
    assert len(seen) == 30
    from resumewds.journal._status import status

    row = {s["url"]: s for s in status(journal)["shards"]["list"]}
    assert row[paths[1]]["state"] == "failed"
    os.rename(hidden, paths[1])  # back before epoch 1: tried again, read
    for batch in loader:
        seen.extend(batch)
        loader.commit(step)
        step += 1
    loader.close()
    assert len([k for e, k in seen if e == 1]) == 40
    row = {s["url"]: s for s in status(journal)["shards"]["list"]}
    assert row[paths[1]]["state"] == "verified"
    assert status(journal)["shards"]["counts"]["failed"] == 0


# ---------------------------------------------------------------------------
# item 8 with a real SIGKILL: batch_size=None, remainder="drop"/"pad", journal
# ---------------------------------------------------------------------------

_KILLED = textwrap.dedent("""
    import json, sys
    import resumewds as rw
    data, journal, remainder, workers = json.loads(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])
    ds = rw.WebDataset(data, seed=3, shuffle=True, shuffle_window=2)
    loader = rw.WebLoader(ds, batch_size=None, num_workers=workers, remainder=remainder, chunk_size=16,
                          journal=journal, resume=True)
    n = loader.steps_done
    while loader.epoch < 2:
        for s in loader:
            sys.stdout.write(f"{s['__epoch__']} {s['__key__']} {int(bool(s.get('__pad__')))}\\n")
            sys.stdout.flush()
            loader.commit(n)
            n += 1
    loader.close()
""")


@pytest.mark.parametrize("remainder,workers", [("drop", 2), pytest.param("pad", 0, marks=pytest.mark.slow)])
def test_unbatched_sigkill_through_the_journal_is_exact(data, tmp_path, remainder, workers):
    import random
    import signal

    from resumewds.journal import resolve_resume

    ref = [f"{e} {k} {int(p)}" for e, k, p in _reference(data, remainder)]
    journal = str(tmp_path / "run.db")
    env = _env()
    env["RESUMEWDS_CACHE_DIR"] = os.environ.get("RESUMEWDS_CACHE_DIR", str(tmp_path / "cache"))
    rng = random.Random(remainder)
    got: List[str] = []
    for attempt in range(8):
        before = resolve_resume(journal)
        done_before = 0 if before is None else before["step"] + 1
        p = subprocess.Popen([sys.executable, "-c", _KILLED, json.dumps(data), journal, remainder,
                              str(workers)], env=env, stdout=subprocess.PIPE, text=True,
                             start_new_session=True)
        lines: List[str] = []
        target = rng.randrange(20, 200) if attempt < 3 else None
        while True:
            line = p.stdout.readline()
            if not line:
                break
            lines.append(line.rstrip("\n"))
            if target is not None and len(lines) >= target:
                os.killpg(p.pid, signal.SIGKILL)
                lines += p.stdout.read().splitlines()  # printed before the kill
                break
        p.wait(timeout=60)
        after = resolve_resume(journal)
        committed = (0 if after is None else after["step"] + 1) - done_before
        assert committed <= len(lines)  # printed (flushed) before committed
        got += lines[:committed]
        if target is None:
            assert p.returncode == 0
            break
    assert got == ref


def test_unbatched_padding_is_visible_after_to_tuple(data):
    ds = rw.WebDataset(data, seed=3, shuffle=True, shuffle_window=2).to_tuple("__key__")
    loader = rw.WebLoader(ds, batch_size=None, remainder="pad", chunk_size=CHUNK)
    flags = []
    for (_key,) in loader:
        flags.append(loader.sample_is_pad)
    assert flags == [p for _, _, p in _reference(data, "pad")[:len(flags)]]
    assert sum(flags) == (-185) % CHUNK
