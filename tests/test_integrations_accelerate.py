"""Hugging Face Accelerate: a WebLoader registered by prepare_loader resumes exactly through
``save_state`` / ``load_state`` (records of sample keys per step: tests/frameworks_driver.py)."""

from __future__ import annotations

import os
import subprocess
import sys
from typing import List

import pytest

pytest.importorskip("accelerate")

import frameworks_driver as drv

import resumewds as rw
from resumewds.synth import write_shards

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning")
DRIVER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "frameworks_driver.py")
STEPS = 2 * 25


@pytest.fixture
def shards(tmp_path, cache_dir) -> str:
    write_shards(str(tmp_path / "data"), shards=8, samples=25, size_range=(10, 40))
    return str(tmp_path / "data")


def records(out: str) -> List[str]:
    with open(drv.record_path(out)) as f:
        return f.read().splitlines()


@pytest.mark.parametrize("skip", [False, True])
def test_save_state_load_state_after_a_crash_is_exact(shards, tmp_path, skip):
    """Crash mid-epoch 0 after save_state; load_state (a fresh loader, another worker count)
    continues exactly; with ``skip``, Accelerate's recipe (skip_first_batches after load_state)
    too: it returns the loader, already in place, instead of reading the batches again."""
    ref, run = str(tmp_path / "ref"), str(tmp_path / "run")
    drv.main(["accelerate", "--data", shards, "--out", ref])
    assert len(records(ref)) == STEPS
    with pytest.raises(drv.Crash):
        drv.main(["accelerate", "--data", shards, "--out", run, "--raise-at", "14"])
    drv.main(["accelerate", "--data", shards, "--out", run, "--resume", "--workers", "1",
              *(("--skip",) if skip else ())])
    assert records(run) == records(ref)


def test_prepare_loader_registers_and_converts_a_dataloader(shards):
    from accelerate import Accelerator
    from torch.utils.data import DataLoader

    from resumewds.integrations.accelerate import PreparedLoader, prepare_loader

    acc = Accelerator(cpu=True)
    ds = rw.WebDataset(sorted(os.path.join(shards, f) for f in os.listdir(shards)), seed=1).to_tuple("__key__")
    prepared = prepare_loader(acc, DataLoader(ds, batch_size=8, drop_last=True))
    assert isinstance(prepared, PreparedLoader) and isinstance(prepared.loader, rw.WebLoader)
    assert prepared in acc._custom_objects
    assert (prepared.batch_size, prepared.drop_last, len(prepared)) == (8, True, 25)
    assert sum(1 for _ in prepared) == 25 and prepared.epoch == 1
    with pytest.raises(TypeError, match="needs a resumewds.WebLoader"):
        prepare_loader(acc, [1, 2, 3])
    assert acc.skip_first_batches(prepared, 0) is prepared
    with pytest.raises(rw.StateError, match="state was not loaded"):
        acc.skip_first_batches(prepared, 3)


def driver(shards: str, out: str, *argv: str) -> int:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (os.getcwd(), os.environ.get("PYTHONPATH")) if p))
    return subprocess.run([sys.executable, DRIVER, "accelerate", "--data", shards, "--out", out, *argv], env=env,
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


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_processes_then_resume_on_one(shards, tmp_path):
    """Two processes (gloo on CPU) train on a torch DataLoader over the dataset, which
    prepare_loader turns into a WebLoader: each global step covers the reference's samples
    once (not half of them).  Both crash at step 7; one process resumes from the checkpoint of
    step 4, is SIGKILLed at step 10 and resumed from its checkpoint of step 8: it continues with exactly the
    reference's sequence from that global position."""
    ref, run = str(tmp_path / "ref"), str(tmp_path / "run")
    drv.main(["accelerate", "--data", shards, "--out", ref])
    reference = [line.split("\t")[1].split() for line in records(ref)]
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (os.getcwd(), os.environ.get("PYTHONPATH")) if p),
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE="2", LOCAL_WORLD_SIZE="2")
    procs = [subprocess.Popen([sys.executable, DRIVER, "accelerate", "--data", shards, "--out", run, "--dataloader",
                               "--raise-at", "7"], env=dict(env, RANK=str(r), LOCAL_RANK=str(r)),
                              stdout=subprocess.DEVNULL, stderr=subprocess.PIPE) for r in range(2)]
    for p in procs:
        _, err = p.communicate(timeout=600)
        assert p.returncode == 1 and b"Crash: crash at step 7" in err, err.decode()[-2000:]
    per_rank = []
    for r in range(2):
        with open(os.path.join(run, f"record.rank{r}.txt")) as f:
            per_rank.append({int(s): set(k.split()) for s, k in (ln.split("\t") for ln in f.read().splitlines())})
    for step in range(7):  # a global step of 2 x 8 samples: the reference's steps 2s and 2s+1
        assert per_rank[0][step] | per_rank[1][step] == set(reference[2 * step]) | set(reference[2 * step + 1])
        assert not per_rank[0][step] & per_rank[1][step]
    # one process, from the checkpoint of step 4; SIGKILLed at step 10 (its checkpoint of step 8), resumed
    assert driver(shards, run, "--resume", "--kill-at", "10", "--workers", "2") == -9
    assert driver(shards, run, "--resume", "--workers", "1") == 0
    assert [line.split("\t")[1].split() for line in records(run)] == reference[8:]



@pytest.mark.slow  # two real torchrun processes (~30 s each case): .ci/run runs the slow tests too
@pytest.mark.parametrize("slow", [False, True])
def test_torchrun_two_processes_kill9_resume_is_exact(tmp_path, cache_dir, slow):
    """torchrun, 2 processes (gloo on CPU): both ranks SIGKILLed mid-epoch 1, resumed by load_state
    with another worker count: each rank's whole record is the uninterrupted sequence, the loader's
    split by rank (frameworks_driver.check_two_rank_kill9; ``-m slow`` also runs Accelerate
    uninterrupted and checks it against the same)."""
    write_shards(str(tmp_path / "data"), shards=8, samples=24, size_range=(10, 40))
    drv.check_two_rank_kill9("accelerate", str(tmp_path / "data"), str(tmp_path / "ref"), str(tmp_path / "run"),
                             framework_reference=slow)


def resumed_at(out: str) -> int:
    with open(os.path.join(out, "resumed_at")) as f:
        return int(f.read())


@pytest.mark.slow  # three launches of Accelerate (~30 s)
def test_journal_commit_before_save_state_resumes_at_the_restored_checkpoint(shards, tmp_path):
    """The journal instead of the loader's state in save_state: ``loader.commit(step - 1)`` before each
    ``save_state()``, and the resumed run builds its loader with ``resume=`` the restored counter's
    step - 1.  SIGKILL right after the commit of step 12, before save_state (the journal is ahead of the
    checkpoint: the loader must resume at step 8, where load_state restores the model), resume with 1
    worker, SIGKILL between checkpoints (step 30), resume with 0: the whole record is the uninterrupted run's."""
    ref, run = str(tmp_path / "ref"), str(tmp_path / "run")
    drv.main(["accelerate", "--data", shards, "--out", ref])
    assert driver(shards, run, "--journal", "--kill-in-save", "12", "--workers", "2") == -9
    assert driver(shards, run, "--journal", "--resume", "--kill-at", "30", "--workers", "1") == -9
    assert resumed_at(run) == 8
    assert driver(shards, run, "--journal", "--resume") == 0
    assert resumed_at(run) == 28
    assert records(run) == records(ref)


def test_prepared_torch_dataloader_over_a_web_dataset_is_warned(shards):
    """``accelerator.prepare(DataLoader(rw.WebDataset(...)))`` cannot resume exactly through
    save_state / load_state: the data set says so when Accelerate iterates it, naming prepare_loader."""
    import warnings

    from accelerate import Accelerator
    from torch.utils.data import DataLoader

    from resumewds.run import _framecheck as framecheck

    acc = Accelerator(cpu=True)
    ds = rw.WebDataset(sorted(os.path.join(shards, f) for f in os.listdir(shards)), seed=1).decode().to_tuple("cls")
    framecheck._WARNED.clear()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            assert sum(len(b[0]) for b in acc.prepare(DataLoader(ds, batch_size=8))) == 200
            direct = sum(len(b[0]) for b in DataLoader(ds, batch_size=8))  # no framework: no warning
    finally:
        framecheck._WARNED.clear()
    msgs = [str(w.message) for w in caught if "resumewds" in str(w.message)]
    assert direct == 200 and len(msgs) == 1
    assert "does not resume exactly through save_state / load_state" in msgs[0]
    assert "resumewds.integrations.accelerate.prepare_loader(accelerator" in msgs[0]


def test_stateful_dataloader_state_of_another_worker_count_is_a_state_error(shards, tmp_path):
    """``use_stateful_dataloader=True``: ``load_state`` restores torchdata's state of 2 workers into a
    prepared loader of 1; the data set's ``set_epoch`` (which Accelerate calls just before it iterates)
    raises a StateError naming both counts and the fix, where torchdata fails with a bare AssertionError."""
    from accelerate import Accelerator
    from accelerate.utils import DataLoaderConfiguration
    from torch.utils.data import DataLoader

    def prepared(workers):
        acc = Accelerator(cpu=True, dataloader_config=DataLoaderConfiguration(use_stateful_dataloader=True))
        ds = rw.WebDataset(sorted(os.path.join(shards, f) for f in os.listdir(shards)), seed=1).decode()
        return acc, acc.prepare(DataLoader(ds.to_tuple("cls"), batch_size=8, num_workers=workers))

    acc, loader = prepared(2)
    it = iter(loader)
    for _ in range(3):
        next(it)
    acc.save_state(str(tmp_path / "ckpt"))
    del it
    acc, loader = prepared(1)
    acc.load_state(str(tmp_path / "ckpt"))
    with pytest.raises(rw.StateError, match="taken with num_workers=2, the loader has num_workers=1.*"
                                            "prepare_loader"):
        next(iter(loader))


@pytest.mark.parametrize("form", ["webloader", "select"])
def test_checkpoints_at_an_epochs_last_batch_resume_exactly(shards, tmp_path, form):
    """``save_state`` every 5 steps: the last batch of epoch 0 is step 25 (20 with ``select``: webdataset's
    filtered form ``WebLoader(ds.select(f).batched(8), batch_size=None)``).  Crashed after it, resumed, crashed
    after the next checkpoint, resumed: the whole record is the loader's own sequence over 2 epochs."""
    argv = ("--ckpt-every", "5") + (("--select",) if form == "select" else ())
    cuts = [22, 27] if form == "select" else [27, 33]
    exact = drv.loader_records(shards, ranks=1, select=form == "select")[0]
    assert drv.crash_and_resume("accelerate", shards, str(tmp_path / "run"), cuts, *argv) == exact


def test_accelerator_prepare_of_a_webloader_is_warned(shards, tmp_path):
    """``accelerator.prepare(rw.WebLoader(...))`` (Accelerate's own line) returns the loader unchanged and
    leaves it out of save_state / load_state: the loader warns when it is first iterated, naming
    prepare_loader (and a resume indeed starts the data over: what the warning is about); a loader given
    to prepare_loader is not warned about."""
    import warnings

    from resumewds.run import _framecheck as framecheck

    framecheck._WARNED.clear()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = drv.crash_and_resume("accelerate", shards, str(tmp_path / "run"), [14], "--prepare")
        unsaved = [str(w.message) for w in caught if "nothing saves its position" in str(w.message)]
        framecheck._WARNED.clear()
        with warnings.catch_warnings(record=True) as quiet:
            warnings.simplefilter("always")
            exact = drv.crash_and_resume("accelerate", shards, str(tmp_path / "ok"), [14])
    finally:
        framecheck._WARNED.clear()
    assert unsaved and "accelerator.prepare(loader) returns a WebLoader unchanged" in unsaved[0]
    assert "resumewds.integrations.accelerate.prepare_loader(accelerator, loader)" in unsaved[0]
    assert not [w for w in quiet if "nothing saves its position" in str(w.message)]
    assert exact == drv.loader_records(shards, ranks=1)[0] and got != exact
