"""Training runs under Lightning, Accelerate and transformers.Trainer, for tests/test_integrations_*.py.

Run as ``python tests/frameworks_driver.py FRAMEWORK --data DIR --out DIR [--kill-at STEP] [--resume]``.
Each optimizer step appends ``step<TAB>key key ...`` (the sample keys of its
batch) to ``OUT/record.txt`` and fsyncs it; ``--kill-at S`` SIGKILLs the
process at the start of step S (before it records anything), so the process
dies mid-epoch with its DataLoader workers running.  A resumed run first cuts
the record at the step its checkpoint restored: the record of a killed and
resumed run is then exactly what the model trained on, to be compared with an
uninterrupted run's.  The frameworks are imported inside the functions (this
module is collected by ``--doctest-modules``).
"""

from __future__ import annotations

import argparse
import glob
import os
import signal
import sys
from typing import Any, List

STEPS_PER_CKPT = 4


def record_path(out: str) -> str:
    """``OUT/record.txt``; ``OUT/record.rankR.txt`` in a job of several ranks (WORLD_SIZE > 1)."""
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:  # Lightning's DDP launcher sets LOCAL_RANK only
        return os.path.join(out, f"record.rank{os.environ.get('RANK', os.environ.get('LOCAL_RANK'))}.txt")
    return os.path.join(out, "record.txt")


def cut_record(out: str, step: int) -> None:
    """Keep the lines of steps before ``step`` (what the restored checkpoint trained on)."""
    path = record_path(out)
    if not os.path.exists(path):
        return
    with open(path) as f:
        keep = [line for line in f if line.strip() and int(line.split("\t", 1)[0]) < step]
    tmp = path + ".tmp"
    with open(tmp, "w") as f:
        f.writelines(keep)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def record(out: str, step: int, keys: List[str]) -> None:
    with open(record_path(out), "a") as f:
        f.write(f"{step}\t{' '.join(keys)}\n")
        f.flush()
        os.fsync(f.fileno())


def rank_records(out: str, ranks: int = 2) -> List[List[str]]:
    """The record of each rank of a run of several processes."""
    result = []
    for r in range(ranks):
        with open(os.path.join(out, f"record.rank{r}.txt")) as f:
            result.append(f.read().splitlines())
    return result


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def torchrun(framework: str, shards: str, out: str, *argv: str) -> Any:
    """This driver under ``torchrun --nproc_per_node 2`` (gloo on CPU); the finished ``subprocess.run``."""
    import subprocess

    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (os.getcwd(), os.environ.get("PYTHONPATH")) if p))
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_PORT", "MASTER_ADDR"):
        env.pop(name, None)
    return subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
                           "--master_addr", "127.0.0.1", "--master_port", str(free_port()), os.path.abspath(__file__),
                           framework, "--data", shards, "--out", out, *argv], env=env, timeout=600,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)


def loader_records(data: str, ranks: int = 2, epochs: int = 2, batch: int = 8, select: bool = False
                   ) -> List[List[str]]:
    """The record each rank of a ``ranks``-process run must have: the loader's own split by rank
    (``rank=`` / ``world_size=`` given), read here in one process, without a framework."""
    out = []
    for r in range(ranks):
        loader = make_loader(argparse.Namespace(data=data, batch=batch, workers=0, select=select), rank=r,
                             world_size=ranks)
        lines: List[str] = []
        while loader.epoch < epochs:
            for keys, _cls in loader:
                lines.append(f"{len(lines)}\t{' '.join(keys)}")
        out.append(lines)
    return out


def check_two_rank_kill9(framework: str, shards: str, ref: str, run: str, framework_reference: bool = True) -> None:
    """Both ranks of a 2-process run SIGKILLed at step 14 (1 worker each; last checkpoint: step 12,
    the start of epoch 1), resumed with 0 workers, SIGKILLed again at step 21 (the checkpoint of step 20,
    taken after that resume), resumed with 2 workers: each rank's record is the uninterrupted sequence.  That is
    the loader's own split by rank (:func:`loader_records`: 2 epochs of 192 samples, 12 global steps
    of 2 x 8, each covering the data set once); with ``framework_reference`` an uninterrupted run
    under the framework is checked to be that too (a third launch)."""
    reference = loader_records(shards)
    for epoch in range(2):
        lines = [line for rec in reference for line in rec[epoch * 12:(epoch + 1) * 12]]
        keys = [k for line in lines for k in line.split("\t")[1].split()]
        assert len(keys) == len(set(keys)) == 192
    if framework_reference:
        done = torchrun(framework, shards, ref)
        assert done.returncode == 0, done.stderr.decode()[-2000:]
        assert rank_records(ref) == reference
    killed = torchrun(framework, shards, run, "--kill-at", "14", "--workers", "1")
    assert killed.returncode != 0 and b"Signal 9 (SIGKILL)" in killed.stderr, killed.stderr.decode()[-2000:]
    assert [len(r) for r in rank_records(run)] == [14, 14]
    killed = torchrun(framework, shards, run, "--resume", "--kill-at", "21", "--workers", "0")
    assert killed.returncode != 0 and b"Signal 9 (SIGKILL)" in killed.stderr, killed.stderr.decode()[-2000:]
    assert [len(r) for r in rank_records(run)] == [21, 21]
    done = torchrun(framework, shards, run, "--resume", "--workers", "2")
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    assert rank_records(run) == reference


def crash_and_resume(framework: str, data: str, out: str, cuts: List[int], *argv: str) -> List[str]:
    """A run in this process crashed at each step of ``cuts`` (``--raise-at``), each time resumed from
    its latest checkpoint, then run to its end: its record (what the model trained on)."""
    for i, cut in enumerate(cuts):
        try:
            main([framework, "--data", data, "--out", out, "--raise-at", str(cut), *argv,
                  *(("--resume",) if i else ())])
        except Crash:
            pass
        else:
            raise AssertionError(f"the run ended before step {cut}")
    main([framework, "--data", data, "--out", out, *argv, *(("--resume",) if cuts else ())])
    with open(record_path(out)) as f:
        return f.read().splitlines()


class Crash(RuntimeError):
    """``--raise-at``: the in-process stand-in for a kill (the fast tests)."""


def maybe_die(args: Any, step: int) -> None:
    if args.kill_at is not None and step == args.kill_at:
        os.kill(os.getpid(), signal.SIGKILL)
    if args.raise_at is not None and step == args.raise_at:
        raise Crash(f"crash at step {step}")


def keep(sample: Any) -> bool:
    """``--select``: the samples kept (4 of 5: an epoch of 8 shards of 25 has 160, 20 batches of 8)."""
    return int(sample["__key__"].rsplit("_", 1)[1]) % 5 != 2


def make_dataset(args: Any) -> Any:
    """The data set: samples shuffled in windows of 2 shards, or with ``--shardshuffle N`` webdataset's
    ``WebDataset(urls, shardshuffle=N)`` (each DataLoader worker its own shards)."""
    import resumewds as rw

    shards = sorted(glob.glob(os.path.join(args.data, "*.tar")))
    if getattr(args, "shardshuffle", 0):
        ds = rw.WebDataset(shards, shardshuffle=args.shardshuffle, seed=11)
    else:
        ds = rw.WebDataset(shards, seed=11, shuffle=True, shuffle_window=2)
    return ds.select(keep) if getattr(args, "select", False) else ds


def make_loader(args: Any, collate: Any = None, **kw: Any) -> Any:
    """``WebLoader(ds, batch_size=B)``; with ``--select``, webdataset's form of a filtered data set:
    ``WebLoader(ds.select(f).batched(B), batch_size=None)`` (batches filled from the filtered stream)."""
    import resumewds as rw

    ds = make_dataset(args).to_tuple("__key__", "cls")
    if getattr(args, "select", False):
        batched = ds.batched(args.batch, collation_fn=collate) if collate else ds.batched(args.batch)
        return rw.WebLoader(batched, batch_size=None, num_workers=args.workers, **kw)
    kw = dict(kw, collate_fn=collate) if collate else kw
    return rw.WebLoader(ds, batch_size=args.batch, num_workers=args.workers, **kw)


def foreign_loader(args: Any) -> Any:
    """``--form dataloader`` / ``stateful``: a torch DataLoader / torchdata StatefulDataLoader over the data set."""
    from torch.utils.data import DataLoader
    from torchdata.stateful_dataloader import StatefulDataLoader

    cls = StatefulDataLoader if args.form == "stateful" else DataLoader
    return cls(make_dataset(args).to_tuple("__key__", "cls"), batch_size=args.batch, num_workers=args.workers)


def direct_records(data: str, workers: int, epochs: int = 2, batch: int = 8, shardshuffle: int = 0) -> List[str]:
    """The record of an exact run over ``DataLoader(dataset, num_workers=workers)``: epoch ``e`` is what the
    loader gives after ``dataset.set_epoch(e)``, read here without a framework."""
    from torch.utils.data import DataLoader

    ds = make_dataset(argparse.Namespace(data=data, shardshuffle=shardshuffle)).to_tuple("__key__", "cls")
    lines: List[str] = []
    for epoch in range(epochs):
        ds.set_epoch(epoch)
        for keys, _cls in DataLoader(ds, batch_size=batch, num_workers=workers):
            lines.append(f"{len(lines)}\t{' '.join(keys)}")
    return lines


def write_resumed_at(args: Any, steps_done: int) -> None:
    """``OUT/resumed_at``: the step a journaled loader resumed at (before training runs)."""
    with open(os.path.join(args.out, "resumed_at"), "w") as f:
        f.write(str(steps_done))


def lightning_journal_loader(args: Any) -> Any:
    """``--journal``: the loader resumes from its journal at the step of the checkpoint Lightning restores
    (``OUT/resumed_at`` says where, before ``fit`` runs)."""
    import torch

    last = os.path.join(args.out, "ckpt", "last.ckpt")
    step = torch.load(last, weights_only=False)["global_step"] if args.resume and os.path.exists(last) else 0
    loader = make_loader(args, journal=os.path.join(args.out, "run.db"), resume=step - 1 if step else False)
    rank = os.environ.get("RANK", os.environ.get("LOCAL_RANK", "0"))
    with open(os.path.join(args.out, "resumed_at" if rank == "0" else f"resumed_at.rank{rank}"), "w") as f:
        f.write(str(loader.steps_done))
    return loader


# ---- Lightning --------------------------------------------------------------
def run_lightning(args: Any) -> None:
    import lightning.pytorch as L
    import torch
    from lightning.pytorch.callbacks import ModelCheckpoint

    from resumewds.integrations.lightning import ResumeWDSCallback

    class Tiny(L.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(1, 1)

        def training_step(self, batch: Any, batch_idx: int) -> Any:
            keys = batch[0]
            maybe_die(args, self.global_step)
            record(args.out, self.global_step, list(keys))
            return self.lin(torch.ones(len(keys), 1)).pow(2).mean()

        def configure_optimizers(self) -> Any:
            if args.esb:  # sizes a schedule: Lightning builds the loader before restoring it
                assert self.trainer.estimated_stepping_batches > 0
            return torch.optim.SGD(self.parameters(), lr=0.01)

        def on_train_start(self) -> None:
            if args.devices > 1:  # the test waits for every rank's process to be gone after a kill
                with open(os.path.join(args.out, f"pid.rank{self.global_rank}"), "w") as f:
                    f.write(str(os.getpid()))
            if args.resume:
                cut_record(args.out, self.global_step)

    callbacks: List[Any] = [ModelCheckpoint(dirpath=os.path.join(args.out, "ckpt"), every_n_train_steps=args.ckpt_every,
                                            save_last=True, save_top_k=-1)]
    if args.callback:
        callbacks.append(ResumeWDSCallback())
    built: List[Any] = []
    in_module = args.journal and args.devices > 1
    if args.journal and not in_module:
        built.append(lightning_journal_loader(args))
    if args.form != "webloader":
        built.append(foreign_loader(args))
    loader = None if in_module else built[0] if built else make_loader(args)
    reload = {}
    if args.reload:  # train_dataloader() builds a new loader for every epoch
        reload, loader = {"reload_dataloaders_every_n_epochs": 1}, None
    if args.journal:
        class CommitOnSave(L.Callback):  # the documented hook: the journal records each checkpoint's step
            def on_save_checkpoint(self, trainer: Any, pl_module: Any, checkpoint: Any) -> None:
                built[-1].commit(trainer.global_step - 1)
                if trainer.global_step == args.kill_in_save:  # committed, the checkpoint file not written
                    os.kill(os.getpid(), signal.SIGKILL)

        callbacks.append(CommitOnSave())
    ddp = {"strategy": "ddp", "devices": args.devices} if args.devices > 1 else {"devices": 1}
    trainer = L.Trainer(max_epochs=args.epochs, max_steps=args.max_steps, accelerator="cpu", **ddp, logger=False,
                        enable_progress_bar=False, enable_model_summary=False, callbacks=callbacks,
                        default_root_dir=args.out, num_sanity_val_steps=0, **reload)
    class Journaled(Tiny):
        def train_dataloader(self) -> Any:  # DDP with a journal: built once the processes are set up
            built.append(lightning_journal_loader(args))
            return built[-1]

    class Reloaded(Tiny):
        def train_dataloader(self) -> Any:
            return foreign_loader(args) if args.form != "webloader" else make_loader(args)

    module = Journaled() if in_module else Reloaded() if args.reload else Tiny()
    trainer.fit(module, train_dataloaders=loader, ckpt_path="last" if args.resume else None)


# ---- Accelerate -------------------------------------------------------------
class Counter:
    """The global step, registered for checkpointing next to the loader."""

    def __init__(self) -> None:
        self.step = 0

    def state_dict(self) -> Any:
        return {"step": self.step}

    def load_state_dict(self, state: Any) -> None:
        self.step = int(state["step"])


def run_accelerate(args: Any) -> None:
    import torch
    from accelerate import Accelerator
    from accelerate.utils import ProjectConfiguration

    from resumewds.integrations.accelerate import prepare_loader

    acc = Accelerator(cpu=True, project_config=ProjectConfiguration(
        project_dir=os.path.join(args.out, "acc"), automatic_checkpoint_naming=True))
    model = torch.nn.Linear(1, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    model, opt = acc.prepare(model, opt)
    counter = Counter()
    acc.register_for_checkpointing(counter)
    if args.journal:  # the journal holds the data position: commit before each save_state, resume= its step
        if args.resume:
            acc.load_state()
            acc.project_configuration.iteration = counter.step // args.ckpt_every
            cut_record(args.out, counter.step)
        loader = make_loader(args, journal=os.path.join(args.out, "run.db"),
                             resume=counter.step - 1 if counter.step else False)
        write_resumed_at(args, loader.steps_done)
    elif args.dataloader:  # a torch DataLoader over the dataset: prepare_loader makes it a WebLoader
        from torch.utils.data import DataLoader

        loader = prepare_loader(acc, DataLoader(make_loader(args).dataset, batch_size=args.batch))
    elif args.prepare:  # Accelerate's own line, which leaves a WebLoader out of its checkpoints
        loader = acc.prepare(make_loader(args))
    else:
        loader = prepare_loader(acc, make_loader(args))
    if args.resume and not args.journal:
        acc.load_state()  # the latest checkpoint (Accelerate does not restore its save counter)
        acc.project_configuration.iteration = counter.step // args.ckpt_every
        cut_record(args.out, counter.step)
        if args.skip:  # Accelerate's recipe: skip the batches of the epoch already trained on
            loader = acc.skip_first_batches(loader, counter.step % len(loader))
    while loader.epoch < args.epochs:
        for keys, _cls in loader:
            maybe_die(args, counter.step)
            record(args.out, counter.step, list(keys))
            loss = model(torch.ones(len(keys), 1)).pow(2).mean()
            acc.backward(loss)
            opt.step()
            opt.zero_grad()
            counter.step += 1
            if counter.step % args.ckpt_every == 0:
                if args.journal:  # the documented hook: commit, then save the checkpoint
                    loader.commit(counter.step - 1)
                    if counter.step == args.kill_in_save:  # committed, the checkpoint not written
                        os.kill(os.getpid(), signal.SIGKILL)
                acc.save_state()


# ---- transformers.Trainer ---------------------------------------------------
def hf_collate(samples: List[Any]) -> Any:
    """A dict the model takes: the keys (recorded) and an input tensor."""
    import torch

    return {"keys": [s[0] for s in samples], "x": torch.ones(len(samples), 1)}


def run_transformers(args: Any) -> None:
    import torch
    from transformers import Trainer, TrainerCallback, TrainingArguments

    from resumewds.integrations.transformers import attach

    class Tiny(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.lin = torch.nn.Linear(1, 1)

        def forward(self, x: Any, keys: Any = None) -> Any:
            return {"loss": self.lin(x).pow(2).mean()}

    class Record(Trainer):
        def compute_loss(self, model: Any, inputs: Any, *a: Any, **kw: Any) -> Any:
            maybe_die(args, self.state.global_step)
            record(args.out, self.state.global_step, list(inputs["keys"]))
            return super().compute_loss(model, inputs, *a, **kw)

    class Cut(TrainerCallback):
        def on_train_begin(self, a: Any, state: Any, control: Any, **kw: Any) -> None:
            if args.resume:
                cut_record(args.out, state.global_step)

    targs = TrainingArguments(output_dir=os.path.join(args.out, "hf"), num_train_epochs=args.epochs,
                              save_strategy="steps", save_steps=args.ckpt_every, max_steps=args.max_steps,
                              logging_strategy="no", report_to="none", use_cpu=True, disable_tqdm=True, seed=3,
                              gradient_accumulation_steps=args.accumulate, remove_unused_columns=False,
                              ignore_data_skip=args.journal)
    trainer = Record(model=Tiny(), args=targs, callbacks=[Cut()])
    if not args.journal:
        attach(trainer, make_loader(args, collate=hf_collate))
        trainer.train(resume_from_checkpoint=True if args.resume else None)
        return
    # the journal holds the data position: commit at each save, resume= the restored checkpoint's step
    from transformers.trainer_utils import get_last_checkpoint

    folder = get_last_checkpoint(targs.output_dir) if args.resume else None
    step = int(folder.rsplit("-", 1)[1]) if folder else 0
    loader = make_loader(args, collate=hf_collate, journal=os.path.join(args.out, "run.db"),
                         resume=step - 1 if step else False)
    write_resumed_at(args, loader.steps_done)

    class CommitOnSave(TrainerCallback):  # the documented hook
        def on_save(self, a: Any, state: Any, control: Any, **kw: Any) -> None:
            loader.commit(state.global_step - 1)
            if state.global_step == args.kill_in_save:  # committed after the checkpoint folder was written
                os.kill(os.getpid(), signal.SIGKILL)

    trainer.add_callback(CommitOnSave())
    trainer.get_train_dataloader = lambda: loader  # the Trainer must not skip: the loader resumed itself
    trainer.train(resume_from_checkpoint=folder)


def main(argv: Any = None) -> None:
    p = argparse.ArgumentParser()
    p.add_argument("framework", choices=["lightning", "accelerate", "transformers"])
    p.add_argument("--data", required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--kill-at", type=int, default=None)
    p.add_argument("--raise-at", type=int, default=None)
    p.add_argument("--resume", action="store_true")
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--max-steps", type=int, default=-1, help="lightning, transformers: max_steps")
    p.add_argument("--ckpt-every", type=int, default=STEPS_PER_CKPT, help="a checkpoint every N steps")
    p.add_argument("--shardshuffle", type=int, default=0, help="the data set: WebDataset(urls, shardshuffle=N)")
    p.add_argument("--select", action="store_true",
                   help="the loader: WebLoader(ds.select(f).batched(B), batch_size=None) (not with --form)")
    p.add_argument("--accumulate", type=int, default=1, help="transformers: gradient_accumulation_steps")
    p.add_argument("--esb", action="store_true", help="Lightning: read estimated_stepping_batches")
    p.add_argument("--devices", type=int, default=1, help="Lightning: processes of strategy='ddp' (gloo on CPU)")
    p.add_argument("--journal", action="store_true", help="commit to a journal at each checkpoint, resume= its step")
    p.add_argument("--kill-in-save", type=int, default=None, help="--journal: SIGKILL after the commit of step S")
    p.add_argument("--no-callback", dest="callback", action="store_false")
    p.add_argument("--reload", action="store_true", help="Lightning: reload_dataloaders_every_n_epochs=1")
    p.add_argument("--form", choices=["webloader", "dataloader", "stateful"], default="webloader",
                   help="lightning: the training loader (a WebLoader, or a torch / torchdata loader over the data set)")
    p.add_argument("--dataloader", action="store_true", help="accelerate: a torch DataLoader over the dataset")
    p.add_argument("--prepare", action="store_true", help="accelerate: accelerator.prepare(WebLoader(...))")
    p.add_argument("--skip", action="store_true", help="accelerate: accelerator.skip_first_batches after load_state")
    args = p.parse_args(argv)
    os.makedirs(args.out, exist_ok=True)
    {"lightning": run_lightning, "accelerate": run_accelerate, "transformers": run_transformers}[args.framework](args)


if __name__ == "__main__":
    sys.exit(main())
