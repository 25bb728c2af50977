"""Train a small model with DistributedDataParallel on resumable WebDataset shards.

Run it (CPU, gloo; two processes on this machine)::

    OMP_NUM_THREADS=1 python -m torch.distributed.run --nproc_per_node=2 \\
        examples/train_ddp.py --data /tmp/ddp-demo/data --ckpt-dir /tmp/ddp-demo/run

Kill it at any moment (kill -9 every process of the job, or pull the plug)
and run the same command again: it continues from the newest checkpoint whose
data position every rank committed, with the same model, optimizer state and
exactly the batches the uninterrupted run would have seen.  You may restart
with a different ``--nproc_per_node`` or ``--workers``: the data continues
the same global sequence (the model and optimizer state do not depend on
the world size).

The protocol, per checkpoint step ``S``::

    train step S  ->  rank 0 saves ckpt-S (tmp + os.replace)  ->  barrier
                  ->  every rank: loader.commit(S)

and on start::

    loader = WebLoader(..., journal=CKPT_DIR/journal.db, resume=True)
    S = loader.steps_done - 1      # newest step every rank committed
    load ckpt-S                    # it exists: it was saved before the commit

The checkpoint is saved *before* the commit, so a committed step always has
its checkpoint; a checkpoint whose commit did not complete on every rank is
simply not used.  Each rank writes its own journal file (``journal.db``,
``journal.rank1.db``, ...); ``resumewds status CKPT_DIR/journal.db`` reads them all.

Every step prints one line per rank::

    rank=0 step=12 epoch=1 n=8 pads=0 keys=3f1a0c5e9b2d loss=2.301234

``keys`` is an xxh3_64 digest of the sample keys of that rank's batch, so two
runs can be compared step by step.  At the end each rank prints
``rank=R done steps=N weights=DIGEST``.
"""

from __future__ import annotations

import argparse
import glob
import io
import os
import sys
import time
from typing import Any, Dict, List, Optional

import torch
import torch.distributed as dist
import torch.nn.functional as F
import xxhash
from torch.nn.parallel import DistributedDataParallel as DDP

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import resumewds as rw
from resumewds.synth import write_shards

FEATURES = 16
CLASSES = 10


def collate(samples: List[Dict[str, Any]]) -> Dict[str, Any]:
    """Raw samples -> tensors; padding samples get weight 0 in the loss."""
    x = torch.tensor([list(s["bin"][:FEATURES].ljust(FEATURES, b"\0")) for s in samples],
                     dtype=torch.float32) / 255.0
    y = torch.tensor([int(s["cls"]) for s in samples], dtype=torch.int64)
    w = torch.tensor([0.0 if s.get("__pad__") else 1.0 for s in samples])
    return {"x": x, "y": y, "w": w, "keys": [s["__key__"] for s in samples],
            "epoch": int(samples[0]["__epoch__"])}


def prepare_data(directory: str, shards: int, samples: int) -> str:
    """Rank 0 writes shards and a manifest once; the others wait at a barrier."""
    manifest = os.path.join(directory, "manifest.json")
    if dist.get_rank() == 0 and not os.path.exists(manifest):
        write_shards(directory, shards=shards, samples=samples, size_range=(16, 256), seed=11)
        pattern = os.path.join(directory, f"shard-{{000000..{shards - 1:06d}}}.tar")
        rw.build_manifest(pattern, manifest + ".tmp")
        os.replace(manifest + ".tmp", manifest)
    dist.barrier()
    return manifest


def ckpt_path(run: str, step: int) -> str:
    return os.path.join(run, f"ckpt-{step:08d}.pt")


def save_checkpoint(run: str, step: int, model: torch.nn.Module, opt: torch.optim.Optimizer,
                    loader_state: Dict[str, Any], keep: int = 3) -> None:
    path = ckpt_path(run, step)
    buf = io.BytesIO()
    torch.save({"step": step, "model": model.state_dict(), "optimizer": opt.state_dict(),
                "loader": loader_state}, buf)
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        f.write(buf.getvalue())
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    # a checkpoint at step k implies every rank committed the previous
    # checkpoint step (the DDP all-reduce of step k waited for them), so
    # the newest complete commit is always among the last two checkpoints
    for old in sorted(glob.glob(os.path.join(run, "ckpt-*.pt")))[:-keep]:
        os.remove(old)


def say(line: str) -> None:
    """One write per line, so lines of concurrent ranks never interleave."""
    sys.stdout.flush()
    os.write(sys.stdout.fileno(), (line + "\n").encode())


def weights_digest(model: torch.nn.Module) -> str:
    h = xxhash.xxh3_64()
    for name, t in sorted(model.state_dict().items()):
        h.update(name.encode())
        h.update(t.detach().cpu().contiguous().numpy().tobytes())
    return h.hexdigest()


def main(argv: Optional[List[str]] = None) -> None:
    p = argparse.ArgumentParser(description="DDP training on resumable WebDataset shards")
    p.add_argument("--data", required=True, help="shard directory (generated if empty)")
    p.add_argument("--ckpt-dir", required=True, help="checkpoints and the journal go here")
    p.add_argument("--shards", type=int, default=6)
    p.add_argument("--samples", type=int, default=41, help="samples per generated shard")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch", type=int, default=4, help="samples per rank per step")
    p.add_argument("--workers", type=int, default=1, help="DataLoader workers per rank")
    p.add_argument("--remainder", default="keep", choices=("keep", "pad", "drop"))
    p.add_argument("--ckpt-every", type=int, default=3, help="checkpoint + commit every N steps")
    p.add_argument("--lr", type=float, default=0.1)
    p.add_argument("--step-sleep", type=float, default=0.0, help="slow down (for kill demos)")
    args = p.parse_args(argv)

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    os.makedirs(args.ckpt_dir, exist_ok=True)
    manifest = prepare_data(args.data, args.shards, args.samples)

    ds = rw.WebDataset(manifest, seed=7, shuffle=True, shuffle_window=2)
    # rank and world size come from torch.distributed
    loader = rw.WebLoader(ds, batch_size=args.batch, num_workers=args.workers, collate_fn=collate,
                          remainder=args.remainder, journal=os.path.join(args.ckpt_dir, "journal.db"),
                          resume=True)

    torch.manual_seed(0)
    model = torch.nn.Linear(FEATURES, CLASSES)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr, momentum=0.9)
    start = loader.steps_done
    if start:
        ck = torch.load(ckpt_path(args.ckpt_dir, start - 1), map_location="cpu")
        model.load_state_dict(ck["model"])
        opt.load_state_dict(ck["optimizer"])
        say(f"rank={rank} resumed step={start - 1} epoch={loader.epoch} "
            f"position={loader.position} world={loader.world_size} workers={args.workers}")
    ddp = DDP(model)

    step = start
    committed = start - 1
    while loader.epoch < args.epochs:
        for batch in loader:
            out = ddp(batch["x"])
            w = batch["w"]
            loss = (F.cross_entropy(out, batch["y"], reduction="none") * w).sum() / w.sum().clamp(min=1)
            opt.zero_grad()
            loss.backward()
            opt.step()
            digest = xxhash.xxh3_64(",".join(batch["keys"]).encode()).hexdigest()[:12]
            say(f"rank={rank} step={step} epoch={batch['epoch']} n={len(batch['keys'])} "
                f"pads={int((w == 0).sum())} keys={digest} loss={loss.item():.6f}")
            if args.step_sleep:
                time.sleep(args.step_sleep)
            if (step + 1) % args.ckpt_every == 0:
                if rank == 0:
                    save_checkpoint(args.ckpt_dir, step, model, opt, loader.state_dict())
                dist.barrier()
                loader.commit(step)
                committed = step
            step += 1
    if committed != step - 1:  # the end of training is a checkpoint step too
        if rank == 0:
            save_checkpoint(args.ckpt_dir, step - 1, model, opt, loader.state_dict())
        dist.barrier()
        loader.commit(step - 1)
    loader.close()
    say(f"rank={rank} done steps={step} weights={weights_digest(model)}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
