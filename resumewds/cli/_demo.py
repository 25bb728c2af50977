"""``resumewds demo``: generate shards, index, shuffle, interrupt, resume, compare.

On a shuffled order: a run stopped, saved with ``state_dict()`` and resumed
with another worker count; and ``resumewds cat --journal`` killed with SIGKILL
twice and rerun.  Each must equal the uninterrupted sequence.
"""

from __future__ import annotations

import contextlib
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import List, Optional

import click

from ..dataset import WebDataset, build_manifest
from ..journal import resolve_resume, run_journal_paths
from ..synth import write_shards
from ._out import quiet_numpy_warning


def _keys(batch: dict) -> List[str]:
    return list(batch["__key__"])


def _collate(samples: list) -> dict:
    return {"__key__": [s["__key__"] for s in samples], "n": len(samples)}


def run_demo(directory: Optional[str] = None, shards: int = 16, samples: int = 250,
             seed: int = 7) -> bool:
    """Run the demo in ``directory`` (a temporary one by default); True if every sequence matched."""
    quiet_numpy_warning()  # the demo needs no numpy (`pip install -e .`); torch says so on import
    from ..loader import WebLoader  # lazy: torch, imported after quiet_numpy_warning()

    tmp = None
    if directory is None:
        tmp = directory = tempfile.mkdtemp(prefix="resumewds-demo-")
    t_start = time.time()
    try:
        os.environ.setdefault("RESUMEWDS_CACHE_DIR", os.path.join(directory, "cache"))
        data = os.path.join(directory, "data")
        click.echo(f"1. writing {shards} shards x {samples} samples to {data}")
        write_shards(data, shards=shards, samples=samples, size_range=(500, 5000), seed=seed)
        manifest = os.path.join(data, "manifest.json")
        m = build_manifest(os.path.join(data, f"shard-{{000000..{shards - 1:06d}}}.tar"), manifest)
        click.echo(f"   indexed: {len(m.shards)} shards, {m.total_samples} samples -> {manifest}")

        def loader(workers: int) -> WebLoader:
            ds = WebDataset(manifest, seed=seed, shuffle=True, shuffle_window=4)
            return WebLoader(ds, batch_size=64, num_workers=workers, collate_fn=_collate)

        click.echo("2. uninterrupted: 2 epochs, shuffled, batch 64, 2 workers")
        full: List[List[str]] = []
        ref = loader(2)
        while ref.epoch < 2:
            full.extend(_keys(b) for b in ref)
        click.echo(f"   {len(full)} batches; first keys {full[0][:3]}")

        stop = len(full) // 2 + 3  # past the epoch boundary's neighbourhood
        click.echo(f"3. interrupted: stop after {stop} batches, save state_dict(), resume with 0 workers")
        first = loader(2)
        got: List[List[str]] = []
        it = iter(first)
        while len(got) < stop:
            try:
                got.append(_keys(next(it)))
            except StopIteration:
                it = iter(first)
        del it
        state = first.state_dict()
        click.echo(f"   state: epoch {state['epoch']}, position {state['position']}")
        second = loader(0)
        second.load_state_dict(state)
        while second.epoch < 2:
            got.extend(_keys(b) for b in second)
        ok1 = got == full
        click.echo(f"   resumed sequence == uninterrupted: {ok1}")

        click.echo("4. crash: `resumewds cat --journal` killed with SIGKILL twice, rerun each time")
        ok2 = _crash_demo(directory, manifest, seed)
        click.echo(f"done in {time.time() - t_start:.1f}s: " + ("sequences match" if ok1 and ok2 else "MISMATCH"))
        return ok1 and ok2
    finally:
        if tmp is not None:
            shutil.rmtree(tmp, ignore_errors=True)


def _cat_cmd(manifest: str, journal: Optional[str]) -> List[str]:
    cmd = [sys.executable, "-m", "resumewds", "cat", manifest, "--seed", "7", "--shuffle",
           "--epochs", "2", "--workers", "2", "--chunk", "16"]
    if journal:
        cmd += ["--journal", journal, "--commit-every", "50"]
    return cmd


def _committed(journal: str) -> int:
    point = resolve_resume(journal)
    return int(point["samples_total"]) if point else 0


def _remove_run(journal: str) -> None:
    """Delete the journal files of an earlier demo run (every rank, SQLite's side files, the lock)."""
    for path in run_journal_paths(journal):
        for suffix in ("", "-wal", "-shm", "-journal", ".lock"):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(path + suffix)


def _crash_demo(directory: str, manifest: str, seed: int) -> bool:
    ref = subprocess.run(_cat_cmd(manifest, None), capture_output=True, text=True, check=True).stdout
    ref_lines = ref.splitlines()
    journal = os.path.join(directory, "run.db")
    _remove_run(journal)  # a rerun in the same directory starts over, not from the last run's end
    rng = random.Random(seed)
    kept: List[str] = []
    for attempt in range(3):
        before = _committed(journal)
        out_path = os.path.join(directory, f"cat-{attempt}.txt")
        with open(out_path, "w") as out:
            p = subprocess.Popen(_cat_cmd(manifest, journal), stdout=out, stderr=subprocess.DEVNULL)
            if attempt < 2:
                # kill at a random point of the remaining output
                target = rng.randint(200, max(201, (len(ref_lines) - before) // 2))
                deadline = time.time() + 60
                while p.poll() is None and time.time() < deadline:
                    with open(out_path, "rb") as f:
                        if f.read().count(b"\n") >= target:
                            break
                    time.sleep(0.01)
                p.send_signal(signal.SIGKILL)
            p.wait()
        after = _committed(journal)
        with open(out_path) as f:
            lines = f.read().splitlines()
        kept.extend(lines[:after - before])
        how = "killed (SIGKILL)" if attempt < 2 else "finished"
        click.echo(f"   run {attempt + 1}: {how} after {len(lines)} lines; committed {before} -> {after}")
    ok = kept == ref_lines
    click.echo(f"   committed output of 3 runs == uninterrupted ({len(ref_lines)} lines): {ok}")
    return ok
