"""A local shard corrupted in place, v3 manifest, ``on_error="skip"``: skipped whole.

The rule: a local shard's whole-file xxh3_64 is checked before any of its
samples is read, so a shard that mismatches delivers nothing, in every run:
0 or 2 DataLoader workers, repeated, and resumed from the journal or from a
``state_dict()``.  Each run uses a fresh cache (the shards' first use).

The whole-file check is held whenever it runs on any thread but the one that
reads the samples (a check behind the first samples, as an earlier design
ran it, would never end here): the run must not depend on when it ends.
"""

from __future__ import annotations

import os
import threading
from typing import Any, Dict, List, Optional, Tuple

import pytest

from chaos.diskfaults import flip_byte

SHARDS, SAMPLES, BATCH = 4, 20, 5
BAD = 1  # the shard corrupted in place


@pytest.fixture
def data(tmp_path, monkeypatch):
    """A v3 manifest over 4 local shards, shard 1 damaged in sample 12 (size kept); the
    reference: a good run's keys without shard 1's, and shard 1's keys."""
    import resumewds as rw
    from resumewds import synth
    from resumewds.cache import ShardStore

    synth.write_shards(str(tmp_path / "s"), shards=SHARDS, samples=SAMPLES)
    m = str(tmp_path / "m3.json")
    rw.build_manifest(str(tmp_path / "s" / f"shard-{{000000..{SHARDS - 1:06d}}}.tar"), m, digests=True)
    refs = {}
    for shuffle in (True, False):
        ds = rw.WebDataset(m, shuffle=shuffle, seed=3, cache_dir=str(tmp_path / f"ref{shuffle}"))
        refs[shuffle] = [(s["__key__"], os.path.basename(s["__url__"])) for s in ds]
    bad_name = f"shard-{BAD:06d}.tar"
    shard = rw.WebDataset(m).manifest.shards[BAD]
    flip_byte(str(tmp_path / "s" / bad_name), int(shard.offsets[12]) + 700)  # inside sample 12's data

    gate = threading.Event()
    real = ShardStore._check_local

    def held(self: Any, shard: Any, policy: str, progress: Any) -> str:
        if policy != "never" and threading.current_thread() is not threading.main_thread():
            gate.wait(120)  # a check off the reading thread: held until the test ends
        return real(self, shard, policy, progress)

    monkeypatch.setattr(ShardStore, "_check_local", held)
    yield {"m": m, "dir": tmp_path, "n": 0,
           "want": {sh: [k for k, u in ref if u != bad_name] for sh, ref in refs.items()},
           "bad": {k for k, u in refs[True] if u == bad_name}}
    gate.set()


def _cache(data: Dict[str, Any]) -> str:
    data["n"] += 1
    return str(data["dir"] / f"c{data['n']}")


def _run(data: Dict[str, Any], workers: int, shuffle: bool = True, stop: Optional[int] = None,
         state: Optional[dict] = None, journal: Optional[str] = None,
         resume: bool = False) -> Tuple[List[List[str]], Optional[dict]]:
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
    return steps, None


def _flat(steps: List[List[str]]) -> List[str]:
    return [k for s in steps for k in s]


@pytest.mark.parametrize("workers", [0, 2])
def test_uninterrupted_runs_skip_the_shard_whole(data, workers):
    runs = [_flat(_run(data, workers)[0]) for _ in range(3)]
    assert not set(runs[0]) & data["bad"]  # nothing of the damaged shard
    assert runs == [data["want"][True]] * 3
    assert _flat(_run(data, workers, shuffle=False)[0]) == data["want"][False]


@pytest.mark.parametrize("workers", [0, 2])
@pytest.mark.parametrize("shuffle,stop", [(True, 3), (True, 9), (False, 5), (False, 7)])
def test_resumed_runs_equal_the_uninterrupted_one(data, workers, shuffle, stop):
    """Stopped after ``stop`` steps (in order: shard 1 is steps 4-7, so before and inside it),
    then resumed from its ``state_dict()`` and, separately, from its journal."""
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
