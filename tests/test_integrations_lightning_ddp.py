"""PyTorch Lightning DDP (2 processes, gloo on CPU): the natural code resumes exactly.

The natural code builds the WebLoader before ``trainer.fit`` and passes it in.
Lightning's DDP launcher sets up rank 0's process group inside ``fit``: the loader
then takes its rank and world size when Lightning first asks for its length or
iterates it.  Lightning writes rank 0's copy of the loader's state in its
checkpoint and every rank loads it: the state is a global position, the same on
every rank.  A run SIGKILLed on both ranks mid-epoch and resumed with
``fit(ckpt_path="last")`` and another worker count trains, on each rank, on exactly
the sequence of an uninterrupted 2-process run (records: tests/frameworks_driver.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from typing import List

import pytest

pytest.importorskip("lightning")

import frameworks_driver as drv

from resumewds.synth import write_shards

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning")
DRIVER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "frameworks_driver.py")
STEPS_PER_EPOCH = 12  # 192 samples, global steps of 2 ranks x 8


@pytest.fixture
def shards(tmp_path, cache_dir) -> str:
    write_shards(str(tmp_path / "data"), shards=8, samples=24, size_range=(10, 40))
    return str(tmp_path / "data")


def run_driver(shards: str, out: str, *argv: str) -> subprocess.CompletedProcess:
    """The driver under Lightning's DDP launcher, 2 processes (a later ``--devices`` wins)."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (os.getcwd(), os.environ.get("PYTHONPATH")) if p))
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_PORT", "MASTER_ADDR"):
        env.pop(name, None)
    return subprocess.run([sys.executable, DRIVER, "lightning", "--data", shards, "--out", out, "--devices", "2",
                           *argv], env=env, timeout=600, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                          text=True)


def driver(shards: str, out: str, *argv: str) -> int:
    return run_driver(shards, out, *argv).returncode


def rank_records(out: str) -> List[List[str]]:
    result = []
    for r in range(2):
        with open(os.path.join(out, f"record.rank{r}.txt")) as f:
            result.append(f.read().splitlines())
    return result


def wait_gone(out: str) -> None:
    """Rank 1 is rank 0's child: after the kill, wait until it has died too (it kills itself at
    the same step) before the resumed run starts."""
    for r in range(2):
        with open(os.path.join(out, f"pid.rank{r}")) as f:
            pid = int(f.read())
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                with open(f"/proc/{pid}/stat") as f:
                    if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                        break
            except OSError:
                break
            time.sleep(0.1)
        else:
            raise AssertionError(f"rank {r} (pid {pid}) still runs")


@pytest.mark.slow  # two real Lightning processes (~50 s): .ci/run runs the slow tests too
def test_ddp_kill9_resume_with_other_workers_is_exact(shards, tmp_path):
    """SIGKILL both ranks at step 10 (1 worker each; last checkpoint: step 8, mid-epoch 0), resume
    with 0 workers: each rank's whole record is the uninterrupted sequence, the loader's own split by
    rank (an uninterrupted Lightning run is checked to be that too in the slow tests)."""
    run = str(tmp_path / "run")
    reference = drv.loader_records(shards)
    assert driver(shards, run, "--kill-at", "10", "--workers", "1") == -9
    wait_gone(run)
    assert [len(r) for r in rank_records(run)] == [10, 10]
    assert driver(shards, run, "--resume", "--workers", "0") == 0
    assert rank_records(run) == reference


@pytest.mark.slow
def test_ddp_kill9_twice_is_exact(shards, tmp_path):
    """An uninterrupted Lightning DDP run (each epoch covers the data set once; each rank trains on
    the loader's split by rank); SIGKILL both ranks mid-epoch 0 (2 workers each), resume with 0
    workers, SIGKILL mid-epoch 1 (last checkpoint: step 20), resume with 1 worker: each rank's whole
    record is the uninterrupted run's."""
    ref, run = str(tmp_path / "ref"), str(tmp_path / "run")
    assert driver(shards, ref) == 0
    reference = rank_records(ref)
    assert [len(r) for r in reference] == [2 * STEPS_PER_EPOCH] * 2
    for epoch in range(2):
        keys = [k for rec in reference for line in rec[epoch * STEPS_PER_EPOCH:(epoch + 1) * STEPS_PER_EPOCH]
                for k in line.split("\t")[1].split()]
        assert len(keys) == len(set(keys)) == 192
    assert reference == drv.loader_records(shards)  # what the loader's split by rank gives each rank
    assert driver(shards, run, "--kill-at", "6", "--workers", "2") == -9
    wait_gone(run)
    assert driver(shards, run, "--resume", "--kill-at", "22", "--workers", "0") == -9
    wait_gone(run)
    assert driver(shards, run, "--resume", "--workers", "1") == 0
    assert rank_records(run) == rank_records(ref)


@pytest.mark.slow
def test_ddp_journal_commit_on_save_is_exact(shards, tmp_path):
    """DDP with the journal instead of the checkpointed state: the loader built in
    train_dataloader() with ``resume=`` the restored checkpoint's step - 1, a callback commits at
    each checkpoint on every rank.  SIGKILL after the commit of step 8 (before its checkpoint
    file), resume (both ranks at step 4), SIGKILL between checkpoints, resume (step 12): each
    rank's whole record is the uninterrupted run's."""
    ref, run = str(tmp_path / "ref"), str(tmp_path / "run")
    assert driver(shards, ref) == 0

    def resumed_at() -> List[int]:
        out = []
        for name in ("resumed_at", "resumed_at.rank1"):
            with open(os.path.join(run, name)) as f:
                out.append(int(f.read()))
        return out

    assert driver(shards, run, "--journal", "--kill-in-save", "8", "--workers", "1") == -9
    wait_gone(run)
    assert driver(shards, run, "--journal", "--resume", "--kill-at", "14") == -9
    assert resumed_at() == [4, 4]
    wait_gone(run)
    assert driver(shards, run, "--journal", "--resume", "--workers", "0") == 0
    assert resumed_at() == [12, 12]
    assert rank_records(run) == rank_records(ref)


@pytest.mark.slow
def test_ddp_torch_dataloader_kill9_is_exact(shards, tmp_path):
    """A torch DataLoader over the data set, with ResumeWDSCallback (trained on as the equivalent
    WebLoader, built once the processes are set up): both ranks SIGKILLed at step 10 (1 worker each),
    resumed with 0 workers, SIGKILLed again at step 18 (the checkpoint of step 16, taken after that
    resume), resumed with 2 workers: each rank's whole record is the loader's own split by rank."""
    run = str(tmp_path / "run")
    assert driver(shards, run, "--kill-at", "10", "--form", "dataloader", "--workers", "1") == -9
    wait_gone(run)
    assert driver(shards, run, "--resume", "--kill-at", "18", "--form", "dataloader", "--workers", "0") == -9
    wait_gone(run)
    assert driver(shards, run, "--resume", "--form", "dataloader", "--workers", "2") == 0
    assert rank_records(run) == drv.loader_records(shards)


@pytest.mark.slow
def test_ddp_stateful_dataloader_kill9_is_exact(shards, tmp_path):
    """A torchdata StatefulDataLoader over the data set, with ResumeWDSCallback: Lightning keeps rank 0's
    loader state only and gives it to every rank (rank 1 would get rank 0's share: a StateError); the
    callback keeps each rank's.  An uninterrupted run covers the data set once per epoch, epochs in their
    own orders; both ranks SIGKILLed at step 10, resumed (1 worker each), SIGKILLed again at step 18 (the
    checkpoint of step 16, taken after that resume), resumed: each rank's whole record is the uninterrupted
    run's."""
    ref, run = str(tmp_path / "ref"), str(tmp_path / "run")
    form = ("--form", "stateful", "--workers", "1")
    assert driver(shards, ref, *form) == 0
    reference = rank_records(ref)
    per_epoch = []
    for epoch in range(2):
        keys = [k for rec in reference for line in rec[epoch * STEPS_PER_EPOCH:(epoch + 1) * STEPS_PER_EPOCH]
                for k in line.split("\t")[1].split()]
        assert len(keys) == len(set(keys)) == 192
        per_epoch.append(keys)
    assert per_epoch[0] != per_epoch[1]
    assert driver(shards, run, "--kill-at", "10", *form) == -9
    wait_gone(run)
    assert driver(shards, run, "--resume", "--kill-at", "18", *form) == -9
    wait_gone(run)
    assert driver(shards, run, "--resume", *form) == 0
    assert rank_records(run) == reference


@pytest.mark.slow
def test_ddp_stateful_dataloader_resumed_on_one_process_is_a_state_error(shards, tmp_path):
    """A StatefulDataLoader's state is one rank's share: a 2-process run SIGKILLed at step 10 and resumed
    on 1 process is refused with a StateError naming both world sizes and the fix (torchdata would
    resume rank 0's share alone: half the data set lost from then on)."""
    run = str(tmp_path / "run")
    form = ("--form", "stateful", "--workers", "1")
    assert driver(shards, run, "--kill-at", "10", *form) == -9
    wait_gone(run)
    res = run_driver(shards, run, "--resume", "--devices", "1", *form)
    assert res.returncode != 0
    assert "StateError" in res.stderr and "StatefulDataLoader states of 2 rank(s), this run has 1 process" in res.stderr
    assert "resumewds.WebLoader" in res.stderr
