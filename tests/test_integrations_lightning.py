"""PyTorch Lightning: a WebLoader resumes exactly through ``Trainer.fit(ckpt_path="last")``.

Every run records the sample keys of each optimizer step (tests/frameworks_driver.py);
a crashed and resumed run must have trained on exactly the uninterrupted run's
sequence, through the epoch boundary and the later epochs.
"""

from __future__ import annotations

import os
import subprocess
import sys
from typing import List

import pytest

pytest.importorskip("lightning")

import frameworks_driver as drv

from resumewds.synth import write_shards

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning")
DRIVER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "frameworks_driver.py")
STEPS = 2 * 25  # 2 epochs of 200 samples in batches of 8


@pytest.fixture
def shards(tmp_path, cache_dir) -> str:
    write_shards(str(tmp_path / "data"), shards=8, samples=25, size_range=(10, 40))
    return str(tmp_path / "data")


def records(out: str) -> List[str]:
    with open(drv.record_path(out)) as f:
        return f.read().splitlines()


def in_process(*argv: str) -> None:
    drv.main(["lightning", *argv])


@pytest.mark.parametrize("esb", [False, True])
def test_fit_resume_after_a_crash_is_exact(shards, tmp_path, esb):
    """Crash in epoch 0 after a checkpoint, resume with ckpt_path="last" (a fresh loader): the
    keys trained on, over both epochs, are the uninterrupted run's; every epoch is whole
    (Lightning reads len(loader) after loading its state).  With ``esb`` the resumed run's
    configure_optimizers reads estimated_stepping_batches (Lightning then does not load the
    loader's state: ResumeWDSCallback does)."""
    ref, run = str(tmp_path / "ref"), str(tmp_path / "run")
    in_process("--data", shards, "--out", ref)
    assert len(records(ref)) == STEPS
    with pytest.raises(drv.Crash):
        in_process("--data", shards, "--out", run, "--raise-at", "14")
    in_process("--data", shards, "--out", run, "--resume", *(("--esb",) if esb else ()))
    assert records(run) == records(ref)


def driver(shards: str, out: str, *argv: str) -> int:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (os.getcwd(), os.environ.get("PYTHONPATH")) if p))
    return subprocess.run([sys.executable, DRIVER, "lightning", "--data", shards, "--out", out, *argv], env=env,
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
@pytest.mark.parametrize("callback", [True, False])
def test_kill9_with_estimated_stepping_batches(shards, tmp_path, callback):
    """configure_optimizers reads estimated_stepping_batches: Lightning then never loads the
    loader's state; ResumeWDSCallback does (without it the run restarts at epoch 0)."""
    ref, run = str(tmp_path / "ref"), str(tmp_path / "run")
    extra = () if callback else ("--no-callback",)
    assert driver(shards, ref, "--esb", *extra) == 0
    assert driver(shards, run, "--kill-at", "14", "--esb", *extra) == -9
    assert driver(shards, run, "--resume", "--esb", *extra) == 0
    assert (records(run) == records(ref)) is callback


def test_a_loader_built_for_another_world_size_is_refused(shards):
    """A WebLoader built before Lightning set up its processes sees the wrong world: refused."""
    import lightning.pytorch as L
    import torch

    import resumewds as rw
    from resumewds.integrations.lightning import ResumeWDSCallback

    class Tiny(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.lin = torch.nn.Linear(1, 1)

        def training_step(self, batch, batch_idx):
            return self.lin(torch.ones(1, 1)).sum()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.1)

    ds = rw.WebDataset(sorted(os.path.join(shards, f) for f in os.listdir(shards)), seed=1)
    loader = rw.WebLoader(ds.to_tuple("__key__"), batch_size=8, rank=0, world_size=2)
    trainer = L.Trainer(max_steps=2, accelerator="cpu", logger=False, enable_progress_bar=False,
                        enable_checkpointing=False, callbacks=[ResumeWDSCallback()])
    with pytest.raises(ValueError, match="built for world size 2, Lightning runs 1"):
        trainer.fit(Tiny(), loader)


@pytest.mark.slow
def test_journal_commit_on_save_resumes_at_the_restored_checkpoint(shards, tmp_path):
    """The journal instead of the loader's state in the checkpoint: a callback commits at each
    checkpoint (``on_save_checkpoint``: ``loader.commit(trainer.global_step - 1)``) and the resumed
    run builds its loader with ``resume=`` the restored checkpoint's step - 1.  SIGKILL right after
    the commit of step 12, before its checkpoint file is written (the journal is ahead of the
    model: the loader must resume at step 8, where Lightning restores the model), resume with
    1 worker, SIGKILL between checkpoints (step 30), resume with 0: the whole record is the
    uninterrupted run's."""
    ref, run = str(tmp_path / "ref"), str(tmp_path / "run")
    in_process("--data", shards, "--out", ref)

    def resumed_at() -> int:
        with open(os.path.join(run, "resumed_at")) as f:
            return int(f.read())

    assert driver(shards, run, "--journal", "--kill-in-save", "12", "--workers", "2") == -9
    assert driver(shards, run, "--journal", "--resume", "--kill-at", "30", "--workers", "1") == -9
    assert resumed_at() == 8
    assert driver(shards, run, "--journal", "--resume") == 0
    assert resumed_at() == 28
    assert records(run) == records(ref)


@pytest.mark.parametrize("max_steps", [-1, 35])
def test_checkpoints_at_an_epochs_last_batch_resume_exactly(shards, tmp_path, max_steps):
    """A checkpoint every 5 steps: step 25 is epoch 0's last batch.  Crashed after it, resumed, crashed
    again after the checkpoint of step 30, resumed: the whole record is the uninterrupted run's (2 epochs,
    or ``max_steps=35``, which ends in epoch 1)."""
    argv = ("--ckpt-every", "5", "--max-steps", str(max_steps))
    ref = drv.crash_and_resume("lightning", shards, str(tmp_path / "ref"), [], *argv)
    assert ref == drv.loader_records(shards, ranks=1)[0][:max_steps if max_steps > 0 else STEPS]
    assert drv.crash_and_resume("lightning", shards, str(tmp_path / "run"), [27, 33], *argv) == ref


@pytest.mark.parametrize("max_steps,cuts", [(-1, [22, 27]), (30, [22, 27]), pytest.param(-1, [13, 22, 37],
                                                                                         marks=pytest.mark.slow)])
def test_a_filtered_batched_loader_resumes_exactly(shards, tmp_path, max_steps, cuts):
    """webdataset's form of a filtered data set, ``WebLoader(ds.select(f).batched(8), batch_size=None)``:
    an epoch has 20 batches, which cannot be known before it is read, so the loader has no len() and
    the callback turns Lightning's prefetch off.  A checkpoint at epoch 0's last batch (step 20), a crash
    after it and another after the checkpoint of step 25, two resumes: the whole record is the loader's own
    sequence (no data epoch trained twice), for 2 epochs and for ``max_steps=30``."""
    argv = ("--select", "--ckpt-every", "5", "--max-steps", str(max_steps))
    exact = drv.loader_records(shards, ranks=1, select=True)[0][:30 if max_steps > 0 else 40]
    assert drv.crash_and_resume("lightning", shards, str(tmp_path / "ref"), [], *argv) == exact
    assert drv.crash_and_resume("lightning", shards, str(tmp_path / "run"), cuts, *argv) == exact


def test_a_loader_without_len_and_without_the_callback_is_warned(shards, tmp_path):
    """Without ResumeWDSCallback, Lightning prefetches one batch from a loader of unknown length and
    checkpoints its state a batch ahead: the loader warns, naming the callback (and the record of a
    resumed run indeed misses a batch: what the warning is about)."""
    import warnings

    from resumewds.run import _framecheck as framecheck

    framecheck._WARNED.clear()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = drv.crash_and_resume("lightning", shards, str(tmp_path / "run"), [13], "--select", "--ckpt-every",
                                       "5", "--no-callback")
    finally:
        framecheck._WARNED.clear()
    msgs = [str(w.message) for w in caught if "WebLoader without len()" in str(w.message)]
    assert msgs and "ResumeWDSCallback()" in msgs[0] and "one batch ahead" in msgs[0]
    assert len(got) == 39 and got != drv.loader_records(shards, ranks=1, select=True)[0]
