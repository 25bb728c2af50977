"""A local shard corrupted in place, v3 manifest: the damaged sample alone follows ``on_error``.

The rule (docs/DIGESTS.md, "Local shards: each sample its own"): a local
shard with per-sample digests is opened without hashing it whole (its size
and end-of-archive marker are checked at once) and each sample is delivered
once its own bytes match its digest; a sample that does not match is skipped
alone (``on_error="skip"``: a ``sample_skip`` event, counted as a skipped
sample) or raises :class:`ChecksumMismatch` naming the file, the sample, its
key and its bytes.  So every run delivers the same samples: 0 or 2
DataLoader workers, repeated, resumed from the journal or from a
``state_dict()``.  Each run uses a fresh cache (the shards' first use).

The whole-file check runs only on the background thread that sets the
"verified" mark, where it is held until the test ends: a run that waited
for it, or ran it on the reading path, fails (the held check raises anywhere
else).  So the first sample of a cold shard is delivered without the file
being read whole, and the background check changes nothing delivered.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from typing import Any, Dict, List, Optional, Tuple

import pytest

from chaos.diskfaults import flip_byte

SHARDS, SAMPLES, BATCH = 4, 20, 5
BAD, BAD_SAMPLE = 1, 12  # shard 1 corrupted in place, in its (late) sample 12


@pytest.fixture
def data(tmp_path, monkeypatch):
    """A v3 manifest over 4 local shards, shard 1 damaged in sample 12 (size kept); the
    reference: a good run's keys without that sample."""
    import resumewds as rw
    from resumewds import synth
    from resumewds.cache import _local as local

    synth.write_shards(str(tmp_path / "s"), shards=SHARDS, samples=SAMPLES)
    m = str(tmp_path / "m3.json")
    rw.build_manifest(str(tmp_path / "s" / f"shard-{{000000..{SHARDS - 1:06d}}}.tar"), m, digests=True)
    refs = {}
    for shuffle in (True, False):
        ds = rw.WebDataset(m, shuffle=shuffle, seed=3, cache_dir=str(tmp_path / f"ref{shuffle}"))
        refs[shuffle] = [(s["__key__"], os.path.basename(s["__url__"])) for s in ds]
    shard = rw.WebDataset(m).manifest.shards[BAD]
    bad_key = refs[False][BAD * SAMPLES + BAD_SAMPLE][0]
    start, end = int(shard.offsets[BAD_SAMPLE]), int(shard.offsets[BAD_SAMPLE + 1])
    flip_byte(str(tmp_path / "s" / f"shard-{BAD:06d}.tar"), start + 700)  # inside sample 12's data

    gate = threading.Event()
    real = local.check_local

    def held(*args: Any, **kw: Any) -> str:
        if threading.current_thread().name != "resumewds-verify":
            raise AssertionError("a local v3 shard was hashed whole on the reading path")
        gate.wait(120)  # the background check: held until the test ends
        return real(*args, **kw)

    monkeypatch.setattr(local, "check_local", held)
    yield {"m": m, "dir": tmp_path, "n": 0, "key": bad_key, "range": (start, end),
           "path": str(tmp_path / "s" / f"shard-{BAD:06d}.tar"),
           "want": {sh: [k for k, _ in ref if k != bad_key] for sh, ref in refs.items()}}
    gate.set()


def _cache(data: Dict[str, Any]) -> str:
    data["n"] += 1
    return str(data["dir"] / f"c{data['n']}")


def _run(data: Dict[str, Any], workers: int, shuffle: bool = True, stop: Optional[int] = None,
         state: Optional[dict] = None, journal: Optional[str] = None, resume: bool = False,
         stats: Optional[dict] = None) -> Tuple[List[List[str]], Optional[dict]]:
    """Per step, the keys delivered; with ``stop``: the first ``stop`` steps and the state after them
    (each step committed to ``journal`` when one is given)."""
    import resumewds as rw

    ds = rw.WebDataset(data["m"], shuffle=shuffle, seed=3, cache_dir=_cache(data),
                       on_error="skip").to_tuple("__key__", "cls")
    kw: Dict[str, Any] = {"multiprocessing_context": "fork"} if workers else {}
    loader = rw.WebLoader(ds, batch_size=BATCH, num_workers=workers, journal=journal, resume=resume, **kw)
    if state is not None:
        loader.load_state_dict(state)
    steps: List[List[str]] = []
    with loader:
        for i, b in enumerate(loader):
            steps.append([] if isinstance(b, rw.EmptyBatch) else list(b[0]))
            if journal is not None:
                loader.commit(i)
            if stop is not None and len(steps) == stop:
                return steps, loader.state_dict()
        if stats is not None:
            stats.update(loader.stats())
    return steps, None


def _flat(steps: List[List[str]]) -> List[str]:
    return [k for s in steps for k in s]


@pytest.mark.parametrize("workers", [0, 2])
def test_uninterrupted_runs_skip_the_damaged_sample_alone(data, workers):
    runs = [_flat(_run(data, workers)[0]) for _ in range(3)]
    assert data["key"] not in runs[0]
    assert runs == [data["want"][True]] * 3  # the damaged shard's 19 other samples included
    assert _flat(_run(data, workers, shuffle=False)[0]) == data["want"][False]


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("shuffle,stop", [(True, 3), (True, 9), (False, 5), (False, 7)])
def test_resumed_runs_equal_the_uninterrupted_one(data, workers, shuffle, stop):
    """Stopped after ``stop`` steps (in order: shard 1 is steps 4-7 and its sample 12 is in
    step 6, so before and after it), then resumed from its ``state_dict()`` and, separately,
    from its journal."""
    full, _ = _run(data, workers, shuffle)
    assert _flat(full) == data["want"][shuffle]
    head, state = _run(data, workers, shuffle, stop=stop)
    assert head == full[:stop]
    tail, _ = _run(data, workers, shuffle, state=state)
    assert head + tail == full
    journal = str(data["dir"] / f"run{workers}{shuffle}{stop}.db")
    head, _ = _run(data, workers, shuffle, stop=stop, journal=journal)
    tail, _ = _run(data, workers, shuffle, journal=journal, resume=True)
    assert head + tail == full


@pytest.mark.parametrize("workers", [0, 2])
def test_the_skipped_sample_is_counted_and_journaled(data, workers):
    journal = str(data["dir"] / f"ev{workers}.db")
    stats: Dict[str, Any] = {}
    steps, _ = _run(data, workers, shuffle=False, journal=journal, stats=stats)
    assert _flat(steps) == data["want"][False]
    assert stats["skipped_samples"] == 1 and stats["samples"] == SHARDS * SAMPLES - 1
    with sqlite3.connect(journal) as db:
        rows = db.execute("select url, detail from events where kind = 'sample_skip'").fetchall()
        failed = db.execute("select count(*) from events where kind in ('skip', 'fail')").fetchone()[0]
    assert len(rows) == 1 and rows[0][0].endswith(f"shard-{BAD:06d}.tar") and data["key"] in rows[0][1]
    assert failed == 0  # the shard is not failed: its other samples were delivered


@pytest.mark.parametrize("workers", [0, 2])
def test_on_error_raise_names_the_sample_after_delivering_the_ones_before(data, workers):
    import resumewds as rw

    ds = rw.WebDataset(data["m"], shuffle=False, cache_dir=_cache(data)).to_tuple("__key__")
    kw: Dict[str, Any] = {"multiprocessing_context": "fork"} if workers else {}
    got: List[str] = []
    with pytest.raises(rw.ChecksumMismatch) as ei:
        with rw.WebLoader(ds, batch_size=1, num_workers=workers, **kw) as loader:
            for b in loader:
                got += list(b[0])
    a, b = data["range"]
    msg = str(ei.value)
    assert data["path"] in msg and f"sample {BAD_SAMPLE} " in msg and data["key"] in msg and f"bytes {a}-{b}" in msg
    want = data["want"][False]
    n = BAD * SAMPLES + BAD_SAMPLE  # every sample before the damaged one, its shard's first 12 included
    assert got[:n] == want[:n] and data["key"] not in got


def test_the_mark_is_set_behind_the_samples_and_changes_nothing(tmp_path):
    """Undamaged shards, the background check not held: it verifies them whole and sets
    their marks; the next start (whose reader trusts a marked shard whole) delivers the same
    sequence.  A damaged shard never gets a mark."""
    import resumewds as rw
    from resumewds import synth
    from resumewds.cache import _local as local

    synth.write_shards(str(tmp_path / "s"), shards=2, samples=10)
    m = str(tmp_path / "m3.json")
    rw.build_manifest(str(tmp_path / "s" / "shard-{000000..000001}.tar"), m, digests=True)
    shard1 = rw.WebDataset(m).manifest.shards[1]
    flip_byte(str(tmp_path / "s" / "shard-000001.tar"), int(shard1.offsets[3]) + 700)
    cache = str(tmp_path / "c")
    ds = rw.WebDataset(m, shuffle=False, cache_dir=cache, on_error="skip")
    first = [s["__key__"] for s in ds]
    assert len(first) == 19
    marks = os.path.join(cache, "verified")
    assert local.wait_checks(120)  # both background checks have ended (asserts no duration)
    assert len([f for f in os.listdir(marks) if not f.startswith(".")]) == 1  # only the good shard
    ds2 = rw.WebDataset(m, shuffle=False, cache_dir=cache, on_error="skip")
    assert [s["__key__"] for s in ds2] == first
    reader = ds2.reader
    assert 0 not in reader.sampled and 1 in reader.sampled  # the good shard: read as verified
