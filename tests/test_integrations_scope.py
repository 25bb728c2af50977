"""Each integration changes only the object it is given (the trainer, the accelerator, the loader):
after every integration has been used for real (a Lightning fit with ``ResumeWDSCallback``, a crash
and ``load_state`` + ``accelerator.skip_first_batches`` under ``prepare_loader``, a crash and a resumed
``transformers.Trainer`` under ``attach``, torchdata's ``load_state_dict``), every function and class of
the frameworks' modules, and every method of their classes, is the very object it was before.  A
framework's module global patched for every trainer in the process fails here.

The look for a framework that drives a data set happens where the framework asks the data set
something before it iterates it, in the training process: with DataLoader workers the warning is
given there too (the workers' own copies of the data set say nothing)."""

from __future__ import annotations

import importlib
import os
import sys
import types
import warnings
from typing import Any, Dict, Tuple

import pytest

pytest.importorskip("lightning")
pytest.importorskip("accelerate")
pytest.importorskip("transformers")
pytest.importorskip("torchdata.stateful_dataloader")

import frameworks_driver as drv

from resumewds.run import _framecheck as framecheck
from resumewds.synth import write_shards

pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning")
_FRAMEWORKS = ("accelerate", "transformers", "lightning", "pytorch_lightning", "torchdata")
_METHODS = (types.FunctionType, classmethod, staticmethod, property)


@pytest.fixture
def shards(tmp_path, cache_dir) -> str:
    write_shards(str(tmp_path / "data"), shards=8, samples=25, size_range=(10, 40))
    return str(tmp_path / "data")


def _frameworks() -> Dict[Tuple[str, ...], Any]:
    """Every function and class in the frameworks' loaded modules (and torch.utils.data's), and every
    method of the classes they define: ``{(module, name[, attribute]): object}``."""
    found: Dict[Tuple[str, ...], Any] = {}
    for modname, module in list(sys.modules.items()):
        if module is None or not (modname.split(".")[0] in _FRAMEWORKS or modname.startswith("torch.utils.data")):
            continue
        for name, value in list(vars(module).items()):
            if callable(value):
                found[(modname, name)] = value
            if isinstance(value, type) and value.__module__ == modname:
                for attr, member in list(vars(value).items()):
                    if isinstance(member, _METHODS):
                        found[(modname, name, attr)] = member
    return found


def test_using_every_integration_changes_no_framework_module_or_class(shards, tmp_path):
    from accelerate import Accelerator
    from torch.utils.data import DataLoader
    from torchdata.stateful_dataloader import StatefulDataLoader

    import resumewds as rw
    from resumewds.integrations.accelerate import prepare_loader
    from resumewds.integrations.stateful import load_state_dict

    for name in ("accelerate.accelerator", "accelerate.data_loader", "lightning.pytorch.loops.fit_loop",
                 "transformers.trainer", "resumewds.integrations.lightning", "resumewds.integrations.transformers"):
        importlib.import_module(name)  # every module an integration serves, loaded before the snapshot
    before = _frameworks()
    data = ("--data", shards, "--epochs", "1")
    # Lightning: a StatefulDataLoader through ResumeWDSCallback (its fit loop serves both of Lightning's functions)
    drv.main(["lightning", *data, "--out", str(tmp_path / "pl"), "--form", "stateful", "--workers", "0"])
    # Accelerate: prepare_loader, a crash, load_state and Accelerate's recipe accelerator.skip_first_batches
    with pytest.raises(drv.Crash):
        drv.main(["accelerate", *data, "--out", str(tmp_path / "acc"), "--raise-at", "6"])
    drv.main(["accelerate", *data, "--out", str(tmp_path / "acc"), "--resume", "--skip"])
    # transformers: attach, a crash, a resume (the Trainer's skip of the resumed epoch's batches)
    with pytest.raises(drv.Crash):
        drv.main(["transformers", *data, "--out", str(tmp_path / "hf"), "--raise-at", "6"])
    drv.main(["transformers", *data, "--out", str(tmp_path / "hf"), "--resume"])
    # torchdata
    ds = rw.WebDataset(sorted(os.path.join(shards, f) for f in os.listdir(shards)), seed=1).to_tuple("__key__")
    loader = StatefulDataLoader(ds, batch_size=8)
    next(iter(loader))
    load_state_dict(StatefulDataLoader(ds, batch_size=8), loader.state_dict())
    # an accelerator given to prepare_loader still skips other loaders as Accelerate does
    acc = Accelerator(cpu=True)
    prepare_loader(acc, rw.WebLoader(ds, batch_size=8))
    assert [int(b) for b in acc.skip_first_batches(DataLoader(list(range(5)), batch_size=1), 3)] == [3, 4]

    after = _frameworks()
    changed = sorted(".".join(key) for key, value in before.items() if after.get(key) is not value)
    assert not changed


@pytest.mark.parametrize("form", ["stateful", "dataloader"])
def test_the_data_set_warns_in_the_training_process_with_workers(shards, tmp_path, form):
    """Lightning over a ``StatefulDataLoader`` / ``DataLoader`` of a resumewds WebDataset with 2 workers and no
    callback: the warning that names the fixes comes in the training process, where ``warnings`` shows it;
    with ``ResumeWDSCallback`` nothing is said."""
    argv = ["lightning", "--data", shards, "--form", form, "--workers", "2", "--epochs", "1", "--max-steps", "3"]
    framecheck._WARNED.clear()
    try:
        with warnings.catch_warnings(record=True) as bare:
            warnings.simplefilter("always")
            drv.main([*argv, "--out", str(tmp_path / "bare"), "--no-callback"])
        framecheck._WARNED.clear()
        with warnings.catch_warnings(record=True) as served:
            warnings.simplefilter("always")
            drv.main([*argv, "--out", str(tmp_path / "served")])
    finally:
        framecheck._WARNED.clear()
    msgs = [str(w.message) for w in bare if "Lightning Trainer does not resume exactly" in str(w.message)]
    assert len(msgs) == 1 and "ResumeWDSCallback()" in msgs[0] and "resumewds.WebLoader" in msgs[0]
    assert not [w for w in served if "does not resume exactly" in str(w.message)]


def test_a_trainer_given_a_train_dataset_and_an_attached_loader_says_nothing(shards, tmp_path):
    """``Trainer(train_dataset=rw.WebDataset(...))`` asks the data set's length when it is built; trained on
    the loader given to ``attach``, it never iterates that data set: no warning (without ``attach``, the
    data set warns: tests/test_integrations_transformers.py)."""
    import torch
    from transformers import Trainer, TrainingArguments

    import resumewds as rw
    from resumewds.integrations.transformers import attach

    class Tiny(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(1, 1)

        def forward(self, x: Any, keys: Any = None) -> Any:
            return {"loss": self.lin(x).pow(2).mean()}

    def tensors(samples: Any) -> Any:
        return {"x": torch.ones(len(samples), 1)}

    ds = rw.WebDataset(sorted(os.path.join(shards, f) for f in os.listdir(shards)), seed=1).to_tuple("__key__", "cls")
    targs = TrainingArguments(output_dir=str(tmp_path / "hf"), max_steps=3, save_strategy="no", logging_strategy="no",
                              report_to="none", use_cpu=True, disable_tqdm=True, remove_unused_columns=False)
    framecheck._WARNED.clear()
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            trainer = Trainer(model=Tiny(), args=targs, train_dataset=ds, data_collator=tensors)
            attach(trainer, rw.WebLoader(ds, batch_size=4, collate_fn=tensors))
            trainer.train()
    finally:
        framecheck._WARNED.clear()
    assert not [w for w in caught if str(w.message).startswith("resumewds:")]
