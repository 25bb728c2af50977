"""Lightning over a torch DataLoader / torchdata StatefulDataLoader of a resumewds WebDataset:
exact with ResumeWDSCallback where the loader has a state, loud where data would be lost or repeated.

Lightning alone calls no ``set_epoch`` on the data set (with DataLoader workers every epoch repeats
epoch 0's order) and saves a StatefulDataLoader's state one batch ahead (its prefetch): a batch lost
at each resume.  The records (tests/frameworks_driver.py) are compared with the exact sequence,
read without a framework (:func:`frameworks_driver.direct_records`).
"""

from __future__ import annotations

import os
import subprocess
import sys
import warnings
from typing import List

import pytest

pytest.importorskip("lightning")
pytest.importorskip("torchdata.stateful_dataloader")

import frameworks_driver as drv

from resumewds.errors import StateError
from resumewds.run import _framecheck as framecheck
from resumewds.synth import write_shards

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning")
DRIVER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "frameworks_driver.py")


@pytest.fixture
def shards(tmp_path, cache_dir) -> str:
    write_shards(str(tmp_path / "data"), shards=8, samples=25, size_range=(10, 40))
    return str(tmp_path / "data")


@pytest.fixture(autouse=True)
def fresh_warnings():
    framecheck._WARNED.clear()
    yield
    framecheck._WARNED.clear()


def records(out: str) -> List[str]:
    with open(drv.record_path(out)) as f:
        return f.read().splitlines()


def fit(shards: str, out: str, form: str, workers: int, *argv: str) -> None:
    drv.main(["lightning", "--data", shards, "--out", out, "--form", form, "--workers", str(workers), *argv])


def crash_and_resume(shards: str, out: str, form: str, workers: int, *argv: str, resume_workers=None) -> None:
    with pytest.raises(drv.Crash):
        fit(shards, out, form, workers, "--raise-at", "14", *argv)
    fit(shards, out, form, workers if resume_workers is None else resume_workers, "--resume", *argv)


@pytest.mark.parametrize("workers", [0, 2])
def test_stateful_dataloader_resumes_exactly_with_the_callback(shards, tmp_path, workers):
    """A crash mid-epoch 0 after a checkpoint, ``fit(ckpt_path="last")``: the whole sequence over
    2 epochs is the exact one (no batch lost to Lightning's prefetch, epoch 1 in its own order)."""
    crash_and_resume(shards, str(tmp_path / "run"), "stateful", workers)
    assert records(str(tmp_path / "run")) == drv.direct_records(shards, workers)


def test_stateful_dataloader_state_of_another_worker_count_is_a_state_error(shards, tmp_path):
    with pytest.raises(StateError, match="num_workers=2, the training loader has num_workers=1.*"
                                         "resumewds.WebLoader"):
        crash_and_resume(shards, str(tmp_path / "run"), "stateful", 2, resume_workers=1)


def webloader_records(shards: str) -> List[str]:
    """The exact sequence of the WebLoader over the data set (batches of 8, 2 epochs), without a framework."""
    return drv.loader_records(shards, ranks=1)[0]


def test_dataloader_becomes_a_webloader_and_resumes_exactly(shards, tmp_path):
    """With the callback, a torch DataLoader over the data set (2 workers) is trained on as the equivalent
    WebLoader: a crash mid-epoch 0, resumed with 0 workers, gives exactly the WebLoader's sequence over
    2 epochs (epoch 1 in its own order)."""
    crash_and_resume(shards, str(tmp_path / "run"), "dataloader", 2, resume_workers=0)
    assert records(str(tmp_path / "run")) == webloader_records(shards)


@pytest.mark.parametrize("form", ["webloader", "dataloader", "stateful"])
def test_loaders_reloaded_every_epoch_keep_each_epochs_order(shards, tmp_path, form):
    """``reload_dataloaders_every_n_epochs=1``: ``train_dataloader()`` builds a new loader for each epoch,
    which the callback starts at that epoch (not at epoch 0, whose order every epoch would repeat).
    Uninterrupted, and crashed in epoch 1 and resumed with 2 workers: the WebLoader's whole sequence
    (a StatefulDataLoader's own: the data set's epochs, resumed with its worker count)."""
    exact = drv.direct_records(shards, 0) if form == "stateful" else webloader_records(shards)
    fit(shards, str(tmp_path / "full"), form, 0, "--reload")
    assert records(str(tmp_path / "full")) == exact
    run = str(tmp_path / "run")
    with pytest.raises(drv.Crash):
        fit(shards, run, form, 0, "--reload", "--raise-at", "30")
    fit(shards, run, form, 0 if form == "stateful" else 2, "--reload", "--resume")
    assert records(run) == exact


def test_dataloader_resumed_mid_epoch_is_warned_when_it_stays_a_dataloader(shards, tmp_path, monkeypatch):
    """Where the DataLoader stays one (no conversion), a resume in the middle of an epoch starts that
    epoch over: a warning names the fix (a StateError with ``strict``)."""
    import resumewds.integrations.lightning as rwl

    monkeypatch.setattr(rwl, "_webloader_for", lambda loader, stateful=True: None)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        crash_and_resume(shards, str(tmp_path / "run"), "dataloader", 0)
    assert any("has no state: the epoch starts over" in str(w.message) and "resumewds.WebLoader" in str(w.message)
               for w in caught)
    with pytest.raises(StateError, match="has no state: the epoch starts over"):
        rwl._before_first_iter(rwl.ResumeWDSCallback(strict=True), _Resumed(drv.foreign_loader(
            drv.argparse.Namespace(data=shards, batch=8, workers=0, form="dataloader"))))


class _Resumed:
    """A trainer resumed after 3 batches of epoch 1 (what _before_first_iter reads)."""

    def __init__(self, loader):
        from types import SimpleNamespace as NS

        progress = NS(current=NS(completed=3), is_last_batch=False)
        self.fit_loop = NS(epoch_progress=NS(current=NS(processed=1)), restarting=True,
                           epoch_loop=NS(batch_progress=progress), _combined_loader=NS(flattened=[loader]))


@pytest.mark.parametrize("form", ["stateful", "dataloader"])
def test_without_the_callback_the_data_set_warns(shards, tmp_path, form):
    """No ResumeWDSCallback: the data set sees Lightning drive it and warns, naming both fixes."""
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        crash_and_resume(shards, str(tmp_path / "run"), form, 0, "--no-callback")
    msgs = [str(w.message) for w in caught if "Lightning Trainer does not resume exactly" in str(w.message)]
    assert msgs and "resumewds.WebLoader" in msgs[0] and "ResumeWDSCallback()" in msgs[0]
    assert records(str(tmp_path / "run")) != drv.direct_records(shards, 0)  # what the warning is about


def driver(shards: str, out: str, *argv: str) -> int:
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (os.getcwd(), os.environ.get("PYTHONPATH")) if p))
    return subprocess.run([sys.executable, DRIVER, "lightning", "--data", shards, "--out", out, *argv], env=env,
                          timeout=600, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE).returncode


@pytest.mark.slow
def test_dataloader_kill9_twice_other_worker_counts_is_exact(shards, tmp_path):
    """A torch DataLoader (trained on as a WebLoader by the callback): SIGKILL mid-epoch 0 (2 workers),
    resume with 0, SIGKILL mid-epoch 1, resume with 1: the whole sequence is exact."""
    run = str(tmp_path / "run")
    assert driver(shards, run, "--kill-at", "14", "--form", "dataloader", "--workers", "2") == -9
    assert driver(shards, run, "--kill-at", "38", "--resume", "--form", "dataloader", "--workers", "0") == -9
    assert driver(shards, run, "--resume", "--form", "dataloader", "--workers", "1") == 0
    assert records(run) == webloader_records(shards)


@pytest.mark.slow
def test_stateful_dataloader_kill9_twice_is_exact(shards, tmp_path):
    """SIGKILL mid-epoch 0 and mid-epoch 1 (2 workers each time): the whole sequence is exact."""
    run = str(tmp_path / "run")
    form = ("--form", "stateful", "--workers", "2")
    assert driver(shards, run, "--kill-at", "14", *form) == -9
    assert driver(shards, run, "--kill-at", "38", "--resume", *form) == -9
    assert driver(shards, run, "--resume", *form) == 0
    assert records(run) == drv.direct_records(shards, 2)


@pytest.mark.parametrize("workers,cuts", [(3, [7, 12]), pytest.param(4, [7, 12, 31], marks=pytest.mark.slow)])
def test_stateful_dataloader_resumed_twice_with_the_same_workers_is_exact(shards, tmp_path, workers, cuts):
    """webdataset's form, ``StatefulDataLoader(WebDataset(urls, shardshuffle=100))`` with 3 or 4 workers:
    crashed after a checkpoint, resumed, crashed again after a checkpoint taken right after that resume
    (some workers had yielded nothing since), resumed: the whole record is the exact sequence."""
    got = drv.crash_and_resume("lightning", shards, str(tmp_path / "run"), cuts, "--form", "stateful", "--workers",
                               str(workers), "--shardshuffle", "100", "--ckpt-every", "5")
    assert got == drv.direct_records(shards, workers, shardshuffle=100)


def test_a_stateful_state_taken_after_a_resume_is_refused_under_another_worker_count(shards, tmp_path):
    """The checkpoint's state was taken after a resume (3 workers each time); resuming it with 2 workers is
    refused with the StateError naming both counts (torchdata alone: a bare AssertionError)."""
    run, argv = str(tmp_path / "run"), ("--shardshuffle", "100", "--ckpt-every", "5")
    with pytest.raises(drv.Crash):
        fit(shards, run, "stateful", 3, "--raise-at", "7", *argv)
    with pytest.raises(drv.Crash):
        fit(shards, run, "stateful", 3, "--raise-at", "12", "--resume", *argv)
    with pytest.raises(StateError, match="num_workers=3, the training loader has num_workers=2"):
        fit(shards, run, "stateful", 2, "--resume", *argv)
