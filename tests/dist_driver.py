"""A torchrun driver for tests/test_distributed.py: load, record, commit.

Run under ``python -m torch.distributed.run --nproc_per_node=N``.  Each rank
joins a gloo process group, builds a :class:`resumewds.WebLoader` over the
given data and, for every batch, appends one JSON line to
``OUT/<tag>.rank<r>.jsonl``::

    {"rank", "world", "workers", "node", "nodes", "partitions", "remainder", "step", "epoch",
     "idx": [global positions], "keys": [...], "pads": [bools], "pads_stat", "gen"}

(``gen``: rank 0's start time, the same on every rank of one process group: under
torchrun's elastic restarts it tells the generations of ranks apart.)

then all-reduces the batch size (as DDP's gradient all-reduce would; it
also keeps the ranks in lock step and fails fast if they disagree on the
number of batches) and, with ``--journal``, commits the step.  At the end it
writes ``OUT/<tag>.rank<r>.done`` with the loader's stats.  With
``--expect-error``, a JournalError from ``WebLoader()`` (e.g. ``--resume-step``
of a step that not every rank committed) is written to
``OUT/<tag>.rank<r>.error`` instead of failing the launch.

Several remainder policies can run one after another in one launch
(``--remainders keep,pad,drop``), each with its own journal, to pay for
torchrun's start-up once.  ``OUT/pid.rank<r>`` holds the rank's pid so that
a test can SIGKILL the whole job: torchrun starts each rank in its own
session, so killing torchrun's process group alone leaves the ranks running.

Example:
    python -m torch.distributed.run --nproc_per_node=2 --master_port 29555 \\
        tests/dist_driver.py --data d/manifest.json --out out --journal out/run.db
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import time
from typing import Any, Dict, List

import torch
import torch.distributed as dist

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))

import resumewds as rw


def collate(samples: List[Dict[str, Any]]) -> Dict[str, Any]:
    return {"keys": [s["__key__"] for s in samples],
            "idx": [int(s["__index__"]) for s in samples],
            "epoch": [int(s["__epoch__"]) for s in samples],
            "pads": [bool(s.get("__pad__", False)) for s in samples]}


def run(args: argparse.Namespace, remainder: str, journal: str | None, gen: float) -> None:
    rank, world = dist.get_rank(), dist.get_world_size()
    ds = rw.WebDataset(args.data, seed=args.seed, shuffle=args.shuffle,
                       shuffle_window=args.window, partitions=args.partitions)
    resume = args.resume_step if args.resume_step is not None else bool(args.resume)
    tag = args.tag if len(args.remainders.split(",")) == 1 else f"{args.tag}-{remainder}"
    try:
        loader = rw.WebLoader(ds, batch_size=args.batch, num_workers=args.workers,
                              collate_fn=collate, remainder=remainder, journal=journal,
                              resume=resume if journal else False)
    except rw.JournalError as exc:
        if not args.expect_error:
            raise
        with open(os.path.join(args.out, f"{tag}.rank{rank}.error"), "w") as f:
            json.dump({"type": type(exc).__name__, "message": str(exc)}, f)
        return
    if (loader.rank, loader.world_size) != (rank, world):
        raise SystemExit(f"loader sees rank {loader.rank}/{loader.world_size}, "
                         f"torch.distributed says {rank}/{world}")
    out_path = os.path.join(args.out, f"{tag}.rank{rank}.jsonl")
    step = loader.steps_done
    pads_seen = 0
    with open(out_path, "a") as out:
        while loader.epoch < args.epochs:
            for batch in loader:
                epochs = set(batch["epoch"])
                if len(epochs) != 1:
                    raise SystemExit(f"batch spans epochs {sorted(epochs)}")
                pads_seen += sum(batch["pads"])
                line = {"rank": rank, "world": world, "workers": args.workers,
                        "node": loader.world.node, "nodes": loader.world.nodes,
                        "partitions": loader.dataset.plan.partitions,
                        "remainder": remainder, "step": step, "epoch": epochs.pop(),
                        "idx": batch["idx"], "keys": batch["keys"], "pads": batch["pads"],
                        "pads_stat": loader.stats().get("pads"), "gen": gen}
                out.write(json.dumps(line) + "\n")
                out.flush()
                n = torch.tensor([len(batch["keys"])], dtype=torch.int64)
                dist.all_reduce(n)
                if args.step_sleep:
                    time.sleep(args.step_sleep)
                if journal:
                    loader.commit(step)
                step += 1
    stats = loader.stats()
    loader.close()
    # every rank must leave the epoch loop after the same number of steps
    n = torch.tensor([step], dtype=torch.int64)
    lo, hi = n.clone(), n.clone()
    dist.all_reduce(lo, op=dist.ReduceOp.MIN)
    dist.all_reduce(hi, op=dist.ReduceOp.MAX)
    with open(os.path.join(args.out, f"{tag}.rank{rank}.done"), "w") as f:
        json.dump({"steps": step, "min_steps": int(lo), "max_steps": int(hi),
                   "pads": stats.get("pads"), "pads_seen": pads_seen,
                   "samples": stats.get("samples")}, f)


def elastic_group() -> None:
    """The process group of a restarted generation of ranks.

    torchrun (2.13) keeps one store in its agent for every round of an elastic
    job and the workers' process group writes its keys there without a prefix
    per attempt: a restarted rank can then read the address a rank of the dead
    generation published, and gloo's connect is refused (or waits forever).
    Here the keys get a prefix per restart count and world size; a set-up that
    still fails times out after 45 s, and torchrun restarts the group again.
    """
    world, rank = int(os.environ["WORLD_SIZE"]), int(os.environ["RANK"])
    timeout = datetime.timedelta(seconds=45)
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                          timeout=timeout)
    prefix = f"resumewds-tests/{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}/{world}"
    dist.init_process_group("gloo", store=dist.PrefixStore(prefix, store), rank=rank, world_size=world,
                            timeout=timeout)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", required=True, help="manifest.json (local path or http url)")
    p.add_argument("--out", required=True)
    p.add_argument("--tag", default="run")
    p.add_argument("--journal", default=None, help="journal path ({remainder} is substituted)")
    p.add_argument("--resume", action="store_true")
    p.add_argument("--resume-step", type=int, default=None, help="resume=STEP instead of True")
    p.add_argument("--expect-error", action="store_true",
                   help="a JournalError from WebLoader() is written to OUT/<tag>.rank<r>.error")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--remainders", default="keep")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--seed", type=int, default=3)
    p.add_argument("--shuffle", default="window")
    p.add_argument("--window", type=int, default=2)
    p.add_argument("--step-sleep", type=float, default=0.0)
    p.add_argument("--partitions", type=int, default=None,
                   help="WebDataset(partitions=); default: the number of nodes (or the run's)")
    p.add_argument("--elastic", action="store_true",
                   help="under torchrun's elastic restarts: the process group's keys in the agent's store "
                        "get a prefix of their own per restart and world size (see elastic_group)")
    args = p.parse_args()
    if args.elastic:
        elastic_group()
    else:
        dist.init_process_group("gloo")
    rank = dist.get_rank()
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"pid.rank{rank}"), "w") as f:
        f.write(str(os.getpid()))
    gen = torch.tensor([time.time()], dtype=torch.float64)
    dist.broadcast(gen, 0)
    try:
        for rem in args.remainders.split(","):
            journal = args.journal.replace("{remainder}", rem) if args.journal else None
            run(args, rem, journal, float(gen))
            dist.barrier()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
