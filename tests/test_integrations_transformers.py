"""transformers.Trainer: attach() makes train(resume_from_checkpoint=True) restore a WebLoader's
state instead of fast-forwarding it (records of sample keys per step: tests/frameworks_driver.py)."""

from __future__ import annotations

import glob
import os
import subprocess
import sys
from typing import List

import pytest

pytest.importorskip("transformers")

import frameworks_driver as drv

from resumewds.errors import StateError
from resumewds.synth import write_shards

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning",
                                        "ignore::FutureWarning")
DRIVER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "frameworks_driver.py")
STEPS = 2 * 25


@pytest.fixture
def shards(tmp_path, cache_dir) -> str:
    write_shards(str(tmp_path / "data"), shards=8, samples=25, size_range=(10, 40))
    return str(tmp_path / "data")


def records(out: str) -> List[str]:
    with open(drv.record_path(out)) as f:
        return f.read().splitlines()


def hf(*argv: str) -> None:
    drv.main(["transformers", *argv])


@pytest.mark.parametrize("accumulate,crash", [(1, 14), pytest.param(3, 6, marks=pytest.mark.slow)])
def test_train_resume_after_a_crash_is_exact(shards, tmp_path, accumulate, crash):
    """Crash mid-epoch 0 after a checkpoint; train(resume_from_checkpoint=True) with a fresh loader
    (another worker count) trains on exactly the uninterrupted run's keys, both epochs, also with
    gradient accumulation over an epoch that does not divide evenly (25 batches by 3)."""
    ref, run = str(tmp_path / "ref"), str(tmp_path / "run")
    acc = ("--accumulate", str(accumulate))
    hf("--data", shards, "--out", ref, *acc)
    assert len(records(ref)) == STEPS
    with pytest.raises(drv.Crash):
        hf("--data", shards, "--out", run, "--raise-at", str(crash), *acc)
    hf("--data", shards, "--out", run, "--resume", "--workers", "1", *acc)
    assert records(run) == records(ref)


def test_a_checkpoint_without_the_loader_state_is_refused(shards, tmp_path):
    run = str(tmp_path / "run")
    with pytest.raises(drv.Crash):
        hf("--data", shards, "--out", run, "--raise-at", "6")
    for path in glob.glob(os.path.join(run, "hf", "checkpoint-*", "resumewds_loader.json")):
        os.remove(path)
    with pytest.raises(StateError, match="no resumewds_loader.json in this checkpoint"):
        hf("--data", shards, "--out", run, "--resume")


def driver(shards: str, out: str, *argv: str) -> int:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (os.getcwd(), os.environ.get("PYTHONPATH")) if p))
    return subprocess.run([sys.executable, DRIVER, "transformers", "--data", shards, "--out", out, *argv], env=env,
                          timeout=600, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE).returncode


@pytest.mark.slow
def test_kill9_twice_other_worker_counts_is_exact(shards, tmp_path):
    """SIGKILL mid-epoch 0 (2 workers), resume with 0 workers, SIGKILL mid-epoch 1, resume with 1."""
    ref, run = str(tmp_path / "ref"), str(tmp_path / "run")
    assert driver(shards, ref) == 0
    assert driver(shards, run, "--kill-at", "14", "--workers", "2") == -9
    assert driver(shards, run, "--kill-at", "38", "--resume", "--workers", "0") == -9
    assert driver(shards, run, "--resume", "--workers", "1") == 0
    assert records(run) == records(ref)


@pytest.mark.slow
def test_torchrun_two_processes_kill9_resume_is_exact(tmp_path, cache_dir):
    """torchrun, 2 processes (gloo on CPU, the Trainer's DDP): both ranks SIGKILLed mid-epoch 1,
    train(resume_from_checkpoint=True) with another worker count: each rank's whole record is an
    uninterrupted 2-process run's; every rank loads the loader state rank 0 wrote (a global
    position) from the checkpoint folder (frameworks_driver.check_two_rank_kill9)."""
    write_shards(str(tmp_path / "data"), shards=8, samples=24, size_range=(10, 40))
    drv.check_two_rank_kill9("transformers", str(tmp_path / "data"), str(tmp_path / "ref"), str(tmp_path / "run"))


@pytest.mark.slow  # four launches of the Trainer (~55 s)
def test_journal_commit_on_save_resumes_at_the_restored_checkpoint(shards, tmp_path):
    """The journal instead of attach's state file: a TrainerCallback commits in ``on_save``
    (``loader.commit(state.global_step - 1)``), the resumed run builds its loader with ``resume=`` the
    step of the ``checkpoint-<step>`` folder - 1 and the Trainer does not skip (``ignore_data_skip``).
    SIGKILL right after the commit of step 12, resume with 1 worker, SIGKILL between checkpoints
    (step 30), resume with 0: the whole record is the uninterrupted run's."""
    ref, run = str(tmp_path / "ref"), str(tmp_path / "run")
    hf("--data", shards, "--out", ref)

    def resumed_at() -> int:
        with open(os.path.join(run, "resumed_at")) as f:
            return int(f.read())

    assert driver(shards, run, "--journal", "--kill-in-save", "12", "--workers", "2") == -9
    assert driver(shards, run, "--journal", "--resume", "--kill-at", "30", "--workers", "1") == -9
    assert resumed_at() == 12
    assert driver(shards, run, "--journal", "--resume") == 0
    assert resumed_at() == 28
    assert records(run) == records(ref)


def test_a_web_dataset_as_train_dataset_is_warned(shards, tmp_path):
    """``Trainer(train_dataset=rw.WebDataset(...))`` cannot resume exactly through
    ``resume_from_checkpoint``: the data set says so when the Trainer iterates it, naming
    ``attach``; the attached WebLoader trains without that warning."""
    import warnings

    import torch
    from transformers import Trainer, TrainingArguments

    import resumewds as rw
    from resumewds.integrations.transformers import attach
    from resumewds.run import _framecheck as framecheck

    class Tiny(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(1, 1)

        def forward(self, x, keys=None):
            return {"loss": self.lin(x).pow(2).mean()}

    def trainer(name, **kw):
        targs = TrainingArguments(output_dir=str(tmp_path / name), max_steps=3, save_strategy="no",
                                  logging_strategy="no", report_to="none", use_cpu=True, disable_tqdm=True,
                                  remove_unused_columns=False, per_device_train_batch_size=4)
        return Trainer(model=Tiny(), args=targs, data_collator=tensors, **kw)

    def tensors(samples):  # only tensors: Accelerate's loader finds the batch size in them
        return {"x": torch.ones(len(samples), 1)}

    def dataset():
        return rw.WebDataset(sorted(glob.glob(os.path.join(shards, "*.tar"))), seed=1).to_tuple("__key__", "cls")

    framecheck._WARNED.clear()
    try:
        with warnings.catch_warnings(record=True) as natural:
            warnings.simplefilter("always")
            trainer("natural", train_dataset=dataset()).train()
        framecheck._WARNED.clear()
        with warnings.catch_warnings(record=True) as attached:
            warnings.simplefilter("always")
            t = trainer("attached")
            attach(t, rw.WebLoader(dataset(), batch_size=4, collate_fn=tensors))
            t.train()
    finally:
        framecheck._WARNED.clear()
    msgs = [str(w.message) for w in natural if str(w.message).startswith("resumewds: transformers.Trainer")]
    assert len(msgs) == 1 and "resumewds.integrations.transformers.attach(trainer" in msgs[0]
    assert not [w for w in attached if str(w.message).startswith("resumewds:")]


@pytest.mark.parametrize("form", [pytest.param("webloader", marks=pytest.mark.slow), "select"])
def test_max_steps_across_an_epoch_with_checkpoints_at_its_last_batch(shards, tmp_path, form):
    """``max_steps=30`` over epochs of 20 batches (batches of 10; with ``select``, webdataset's filtered form
    ``WebLoader(ds.select(f).batched(8), batch_size=None)``, which has no len(): the Trainer then runs epochs
    until max_steps, where a len() counting positions made it stop after one epoch), a checkpoint every 5
    steps (step 20 is epoch 0's last batch): uninterrupted, and crashed after step 20's checkpoint and after
    step 25's, resumed twice: the whole record is the loader's own sequence."""
    argv = ("--select",) if form == "select" else ("--batch", "10")
    argv += ("--ckpt-every", "5", "--max-steps", "30")
    exact = drv.loader_records(shards, ranks=1, select=form == "select", batch=8 if form == "select" else 10)[0]
    assert drv.crash_and_resume("transformers", shards, str(tmp_path / "ref"), [], *argv) == exact[:30]
    assert drv.crash_and_resume("transformers", shards, str(tmp_path / "run"), [22, 27], *argv) == exact[:30]
