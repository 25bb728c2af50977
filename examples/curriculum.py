"""A two-phase curriculum over two mixed sources that survives kill -9.

Phase 0 (steps ``0 .. --phase-step - 1``) mixes the sources 3:1, phase 1
mixes them 1:1 (``--weights0`` / ``--weights1``).  The mixture is endless
(``with_epoch``: an epoch is ``--epoch-steps`` steps), the order a pure
function of the seeds, so a rerun continues at the sample after the last
commit, in the same phase, with the same proportions.

Every ``step``:

1. trains a tiny model on the batch,
2. prints one line (flushed)::

       step 17 epoch 1 phase 0 n 8 src 6/2 keys 5e0c... loss 0.693147182

3. saves model + optimizer + step to ``<work>/ckpt-<step>.pt`` atomically,
4. calls ``loader.commit(step)``, then deletes older checkpoints.

On restart the newest checkpoint whose step is committed is loaded and the
loader resumes right after it; the first line is then
``resume step <next step> epoch <e> position <p>``.

Under torchrun with several nodes each node reads only its own partitions
of each source (``--partitions``, default: the node count at the run's
start; a resume keeps the run's), see docs/MIXTURES.md.

To change the curriculum of a run that already started (a phase it did not
declare), pass the new phase at a resume: ``--phase-step`` at or after the
resume point is recorded in the journal as a config change; changing the
weights of the past is refused (JournalConfigMismatch).

Examples:
    python examples/curriculum.py --work /tmp/cur --serve                  # generates and serves data
    kill -9 <pid>; python examples/curriculum.py --work /tmp/cur --serve   # continues exactly
    python examples/curriculum.py --work /tmp/c2 --source 'http://127.0.0.1:8000/a/shard-{000000..000005}.tar' \\
        --source 'http://127.0.0.1:8000/b/shard-{000000..000001}.tar'
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import sys
from typing import Any, Dict, List, Optional

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

import torch  # noqa: E402
import xxhash  # noqa: E402

import resumewds as rw  # noqa: E402
from resumewds.journal import resolve_resume  # noqa: E402
from resumewds.mixing import at_step  # noqa: E402


def collate(batch: List[Dict[str, Any]]) -> Dict[str, Any]:
    feats = torch.tensor([[len(x["bin"]) / 400.0, (x["cls"] % 7) / 7.0] for x in batch])
    target = torch.tensor([[float(x["cls"] % 2)] for x in batch])
    return {"x": feats, "y": target, "keys": [f"{x['__source__']}:{x['__shard__']}:{x['__key__']}" for x in batch],
            "sources": [x["__source__"] for x in batch], "epoch": batch[0]["__epoch__"]}


def save_atomic(obj: Any, path: str) -> None:
    tmp = path + ".tmp"
    with open(tmp, "wb") as f:
        torch.save(obj, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    fd = os.open(os.path.dirname(path), os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def newest_committed_checkpoint(work: str, journal: str) -> Optional[str]:
    """The newest checkpoint whose step the journal has committed."""
    found = sorted(glob.glob(os.path.join(work, "ckpt-*.pt")), reverse=True)
    for path in found:
        step = int(re.findall(r"ckpt-(\d+)\.pt$", path)[0])
        try:
            if resolve_resume(journal, step) is not None:
                return path
        except rw.JournalError:
            continue
    return None


def serve(work: str) -> List[str]:
    from chaos.faultserver import FaultServer
    from resumewds.synth import write_shards

    root = os.path.join(work, "srv")
    if not os.path.isdir(root):
        write_shards(os.path.join(root, "web"), shards=6, samples=23, size_range=(50, 400), seed=1)
        write_shards(os.path.join(root, "code"), shards=2, samples=9, size_range=(50, 400), seed=2)
    srv = FaultServer(root).start()
    return [f"{srv.url}/web/shard-{{000000..000005}}.tar", f"{srv.url}/code/shard-{{000000..000001}}.tar"]


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", required=True, help="journal and checkpoints go here")
    ap.add_argument("--source", action="append", default=[], help="shards of one source (twice)")
    ap.add_argument("--serve", action="store_true", help="generate two sources and serve them locally")
    ap.add_argument("--weights0", default="3,1")
    ap.add_argument("--weights1", default="1,1")
    ap.add_argument("--phase-step", type=int, default=20, help="first step of phase 1")
    ap.add_argument("--steps", type=int, default=40)
    ap.add_argument("--epoch-steps", type=int, default=7, help="steps per (mixed) epoch")
    ap.add_argument("--batch-size", type=int, default=8)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--partitions", type=int, default=None,
                    help="node-local partitions of every source (default: the number of nodes)")
    args = ap.parse_args(argv)
    os.makedirs(args.work, exist_ok=True)
    urls = serve(args.work) if args.serve else args.source
    if len(urls) != 2:
        ap.error("give two --source patterns, or --serve")
    w0 = [float(w) for w in args.weights0.split(",")]
    w1 = [float(w) for w in args.weights1.split(",")]

    sources = [rw.WebDataset(u, seed=11 + i, shuffle=True, shuffle_window=2).decode() for i, u in enumerate(urls)]
    mixed = rw.MixedDataset(sources, weights=w0, names=["web", "code"], seed=5,
                            phases=[(at_step(args.phase_step, args.batch_size), w1)],
                            partitions=args.partitions)
    mixed.with_epoch(args.epoch_steps * args.batch_size)

    torch.manual_seed(0)
    model = torch.nn.Linear(2, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    journal = os.path.join(args.work, "run.db")
    ckpt = newest_committed_checkpoint(args.work, journal) if os.path.exists(journal) else None
    resume: Any = False
    if ckpt is not None:
        state = torch.load(ckpt, weights_only=True)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        resume = int(state["step"])
    loader = rw.WebLoader(mixed, batch_size=args.batch_size, num_workers=args.workers,
                          collate_fn=collate, journal=journal, resume=resume)
    step = loader.steps_done
    if step:
        print(f"resume step {step} epoch {loader.epoch} position {loader.position}", flush=True)
    try:
        while step < args.steps:
            for batch in loader:
                loss = torch.nn.functional.binary_cross_entropy_with_logits(model(batch["x"]), batch["y"])
                opt.zero_grad()
                loss.backward()
                opt.step()
                phase = mixed.mixplan.phase_of(at_step(step, args.batch_size))
                n_web = batch["sources"].count("web")
                keys = xxhash.xxh3_64("\n".join(batch["keys"]).encode()).hexdigest()
                print(f"step {step} epoch {batch['epoch']} phase {phase} n {len(batch['keys'])} "
                      f"src {n_web}/{len(batch['keys']) - n_web} keys {keys} loss {loss.item():.9f}",
                      flush=True)
                path = os.path.join(args.work, f"ckpt-{step:06d}.pt")
                save_atomic({"model": model.state_dict(), "opt": opt.state_dict(), "step": step}, path)
                loader.commit(step)
                for old in glob.glob(os.path.join(args.work, "ckpt-*.pt")):
                    if old != path:
                        os.remove(old)
                step += 1
                if step >= args.steps:
                    break
        mx = loader.stats()["mixture"]
        print("delivered " + " ".join(f"{s['name']} {s['delivered']} ({s['delivered_fraction']:.3f}, "
                                      f"asked {s['expected']:.1f})" for s in mx["sources"]), flush=True)
    finally:
        loader.close()
    return 0


if __name__ == "__main__":
    sys.exit(main())
