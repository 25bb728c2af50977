"""Under real torchrun: every rank yields exactly one batch per
step, whatever ``select`` and ``on_error="skip"`` remove (tests/exactly_once_driver.py)."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

import resumewds as rw
from conftest import REPO
from resumewds.synth import write_shards

pytestmark = pytest.mark.timeout(300) if hasattr(pytest.mark, "timeout") else []


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _keep(sample) -> bool:
    return (int(sample["__index__"]) // 4) % 3 != 1


def test_ranks_stay_in_lock_step_when_a_share_is_filtered_or_skipped(tmp_path, cache_dir):
    paths = write_shards(str(tmp_path / "d"), shards=5, samples=37, size_range=(10, 50))
    manifest = str(tmp_path / "d" / "manifest.json")
    rw.build_manifest(paths, manifest)
    os.remove(paths[2])  # indexed, then lost: on_error="skip" skips its samples
    out = tmp_path / "out"
    out.mkdir()
    env = dict(os.environ)
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(var, None)
    env.update(OMP_NUM_THREADS="1", PYTHONPATH=REPO + os.pathsep + env.get("PYTHONPATH", ""))
    cmd = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=2",
           "--master_addr=127.0.0.1", f"--master_port={_port()}",
           os.path.join(REPO, "tests", "exactly_once_driver.py"), manifest, str(out)]
    p = subprocess.run(cmd, env=env, cwd=REPO, capture_output=True, text=True, timeout=240)
    assert p.returncode == 0, p.stdout[-3000:] + p.stderr[-3000:]

    # what one rank delivers over the same positions: the reference set
    ref = rw.WebLoader(rw.WebDataset(manifest, seed=1, shuffle=True, shuffle_window=2,
                                     on_error="skip").select(_keep),
                       batch_size=8, collate_fn=lambda s: [(x["__epoch__"], x["__key__"]) for x in s])
    want = set()
    while ref.epoch < 2:
        for batch in ref:
            want.update(batch)
    ref.close()
    assert 0 < len(want) < 2 * 148
    steps = -(-185 // 8)
    runs = {}
    for w in (0, 2):
        ranks = [json.load(open(out / f"w{w}.rank{r}.json")) for r in range(2)]
        for r, res in enumerate(ranks):
            rows = res["rows"]
            # exactly one batch per step on every rank
            assert len(rows) == 2 * steps, (w, r, len(rows))
            n_empty = sum(1 for row in rows if row[2])
            assert n_empty == res["empty_batches"] > 0
            assert all((row[1] == 0) == row[2] for row in rows)
        # the union is every sample the filter keeps outside the lost shard
        got = [(row[0], k) for res in ranks for row in res["rows"] for k, pad in zip(row[3], row[4])
               if not pad]
        assert len(set(got)) == len(got)
        assert {tuple(x) for x in got} == want
        runs[w] = [[row[:3] + [row[3]] for row in res["rows"]] for res in ranks]
    # same batches, same empties, with 0 or 2 workers
    assert runs[0] == runs[2]
