"""A torchrun driver for tests/test_mixture_multinode.py: a two-source mixture per node.

Run under ``python -m torch.distributed.run``.  Each rank joins a gloo group,
builds a :class:`resumewds.MixedDataset` of two sources given as manifest
urls (``--data URL --data URL``; in the test, the node's own HTTP server),
with per-source verification (``--verify``) and cache budget
(``--cache-size``), and a :class:`resumewds.WebLoader` over it.  For every
batch it appends one JSON line to ``OUT/<tag>.rank<r>.jsonl``::

    {"rank", "world", "node", "nodes", "partitions", "step", "epoch",
     "idx": [positions], "keys": [...], "src": [...], "shard": [...], "pads": [bools]}

then all-reduces the batch size (lock step, as DDP would) and, with
``--journal``, commits the step.  ``OUT/pid.rank<r>`` holds the rank's pid.

Example:
    python -m torch.distributed.run --nproc_per_node=2 tests/mix_dist_driver.py \\
        --data http://127.0.0.1:8000/a/manifest.json --data http://127.0.0.1:8000/b/manifest.json \\
        --out out --journal out/run.db
"""

from __future__ import annotations

import argparse
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
    return {"keys": [s["__key__"] for s in samples], "idx": [int(s["__index__"]) for s in samples],
            "epoch": [int(s["__epoch__"]) for s in samples], "src": [s["__source__"] for s in samples],
            "shard": [s["__shard__"] for s in samples],
            "pads": [bool(s.get("__pad__", False)) for s in samples]}


def build(args: argparse.Namespace) -> rw.MixedDataset:
    """The mixture (also used by the test, in-process, for the reference order)."""
    verify = (args.verify or "once").split(",")
    sizes = (args.cache_size or "").split(",")
    sources = [rw.WebDataset(url, seed=args.seed + i, shuffle=[True, "shards"][i % 2],
                             shuffle_window=args.window, resampled=bool(args.resampled) and i == 1,
                             verify=verify[i % len(verify)],
                             cache_size=(sizes[i % len(sizes)] or None) if sizes else None)
               for i, url in enumerate(args.data)]
    return rw.MixedDataset(sources, weights=[float(w) for w in args.weights.split(",")],
                           epoch_size=args.epoch_size, seed=args.seed, names=["a", "b", "c"][:len(sources)],
                           partitions=args.partitions)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--data", action="append", required=True, help="a source's manifest.json url")
    p.add_argument("--out", required=True)
    p.add_argument("--tag", default="run")
    p.add_argument("--journal", default=None)
    p.add_argument("--resume", action="store_true")
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--epoch-size", type=int, default=None)
    p.add_argument("--weights", default="3,1")
    p.add_argument("--seed", type=int, default=3)
    p.add_argument("--window", type=int, default=2)
    p.add_argument("--resampled", action="store_true", help="the second source draws with replacement")
    p.add_argument("--verify", default=None, help="per source, comma-separated: once/always/never")
    p.add_argument("--cache-size", default=None, help="per source, comma-separated cache_size")
    p.add_argument("--partitions", type=int, default=None)
    p.add_argument("--step-sleep", type=float, default=0.0)
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"pid.rank{rank}"), "w") as f:
        f.write(str(os.getpid()))
    try:
        loader = rw.WebLoader(build(args), batch_size=args.batch, num_workers=args.workers,
                              collate_fn=collate, journal=args.journal,
                              resume=bool(args.resume) if args.journal else False)
        step = loader.steps_done
        with open(os.path.join(args.out, f"{args.tag}.rank{rank}.jsonl"), "a") as out:
            while loader.epoch < args.epochs:
                for batch in loader:
                    line = {"rank": rank, "world": world, "node": loader.world.node,
                            "nodes": loader.world.nodes, "partitions": loader.dataset.plan_partitions,
                            "step": step, "epoch": batch["epoch"][0], "idx": batch["idx"],
                            "keys": batch["keys"], "src": batch["src"], "shard": batch["shard"],
                            "pads": batch["pads"]}
                    out.write(json.dumps(line) + "\n")
                    out.flush()
                    n = torch.tensor([len(batch["keys"])], dtype=torch.int64)
                    dist.all_reduce(n)
                    if args.step_sleep:
                        time.sleep(args.step_sleep)
                    if args.journal:
                        loader.commit(step)
                    step += 1
        stats = loader.stats()
        loader.close()
        with open(os.path.join(args.out, f"{args.tag}.rank{rank}.done"), "w") as f:
            json.dump({"steps": step, "mixture": stats.get("mixture")}, f)
        dist.barrier()
    finally:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
