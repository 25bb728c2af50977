"""A small training loop that survives kill -9 and continues at the same sample.

It trains a tiny CNN on generated image shards served over HTTP, and after
every ``--commit-every`` steps it

1. saves model + optimizer + step to ``<ckpt-dir>/ckpt-<step>.pt`` atomically
   (write a temporary file, fsync, ``os.replace``, fsync the directory),
2. then calls ``loader.commit(step)`` (one SQLite transaction),
3. then deletes older checkpoints.

A kill between 1 and 2 leaves a checkpoint without a commit; on restart the
newest checkpoint whose step is committed is loaded and the loader resumes at
that step (``WebLoader(..., journal=..., resume=<checkpoint step>)``), so the
model, the optimizer and the data position always agree.

Every step prints one line (flushed before the commit that covers it)::

    step 17 epoch 0 n 16 keys 5e0c... first s000003_000041 loss 2.302585

``keys`` is the xxh3_64 of the batch's sample keys; ``loss`` is printed in
full precision, so a resumed run can be compared line by line with an
uninterrupted one (chaos/crash.py does).  A resumed run first prints::

    resume step 15 epoch 0 position 256 checkpoint ckpt-000015.pt

Preemption (Slurm, Kubernetes, spot instances send SIGTERM, then SIGKILL after
a grace period): the loader is created with ``preempt=True``, so SIGTERM (or
SIGUSR1) makes ``for batch in loader`` end at the next step boundary; the loop
then checkpoints and commits the last finished step at once, prints
``preempted at step S (signal 15): checkpoint and commit written`` and exits
143.  The rerun continues at the next step, exactly as after a kill -9, minus
the steps since the last commit.

Examples:
    python examples/train.py --work /tmp/t --serve            # generates data, serves it
    kill -9 <pid>; python examples/train.py --work /tmp/t --serve   # continues
    python examples/train.py --work /tmp/t --url http://127.0.0.1:8711/manifest.json
"""

from __future__ import annotations

import argparse
import glob
import os
import re
import sys
from typing import Any, Dict, List, Optional, Tuple

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if REPO not in sys.path:
    sys.path.insert(0, REPO)

import torch  # noqa: E402
import xxhash  # noqa: E402

import resumewds as rw  # noqa: E402
from resumewds.journal import resolve_resume  # noqa: E402


def make_data(data_dir: str, shards: int, samples: int, seed: int = 0) -> str:
    """Write image shards and their manifest.json once; return the manifest path."""
    from resumewds.synth import write_shards

    manifest = os.path.join(data_dir, "manifest.json")
    if not os.path.exists(manifest):
        write_shards(data_dir, shards=shards, samples=samples, images=True, image_side=32, seed=seed)
        rw.build_manifest(sorted(glob.glob(os.path.join(data_dir, "shard-*.tar"))), manifest)
    return manifest


class Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv = torch.nn.Conv2d(3, 8, 3, stride=2, padding=1)
        self.head = torch.nn.Linear(8 * 16 * 16, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.relu(self.conv(x)).flatten(1))


def to_example(sample: Dict[str, Any]) -> Tuple[torch.Tensor, int, str]:
    return sample["jpg"], int(sample["cls"]), sample["__key__"]


_CKPT = re.compile(r"^ckpt-(\d+)\.pt$")


def checkpoints(ckpt_dir: str) -> List[int]:
    """Steps that have a checkpoint file, newest first."""
    steps = []
    for name in os.listdir(ckpt_dir):
        m = _CKPT.match(name)
        if m:
            steps.append(int(m.group(1)))
    return sorted(steps, reverse=True)


def ckpt_path(ckpt_dir: str, step: int) -> str:
    return os.path.join(ckpt_dir, f"ckpt-{step:06d}.pt")


def save_checkpoint(ckpt_dir: str, step: int, model: torch.nn.Module, opt: torch.optim.Optimizer) -> None:
    """Atomically write the checkpoint of ``step`` (complete or absent, never torn)."""
    path = ckpt_path(ckpt_dir, step)
    tmp = f"{path}.tmp.{os.getpid()}"
    with open(tmp, "wb") as f:
        torch.save({"step": step, "model": model.state_dict(), "opt": opt.state_dict()}, f)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
    dfd = os.open(ckpt_dir, os.O_RDONLY)
    try:
        os.fsync(dfd)
    finally:
        os.close(dfd)


def pick_resume(journal: str, ckpt_dir: str) -> Optional[int]:
    """The newest checkpoint step that the journal committed, or None (fresh start).

    A checkpoint newer than the last commit (killed between save and commit)
    is ignored and removed; a commit without its checkpoint cannot happen
    because the checkpoint is written first.
    """
    point = resolve_resume(journal)
    if point is None:
        return None
    for step in checkpoints(ckpt_dir):
        if step <= int(point["step"]):
            try:
                resolve_resume(journal, step)
            except rw.JournalIncompleteCommit:
                continue
            for newer in checkpoints(ckpt_dir):
                if newer > step:
                    os.unlink(ckpt_path(ckpt_dir, newer))
            return step
    raise SystemExit(f"train.py: {journal} has commits up to step {point['step']} but "
                     f"{ckpt_dir} holds no checkpoint for any committed step")


def main(argv: Optional[List[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--work", required=True, help="Directory for data, cache, journal and checkpoints.")
    src = p.add_mutually_exclusive_group()
    src.add_argument("--url", help="manifest.json URL (or any resumewds source) to train on.")
    src.add_argument("--serve", action="store_true",
                     help="Generate shards under WORK/data and serve them over HTTP (127.0.0.1).")
    p.add_argument("--port", type=int, default=8711, help="Port for --serve (fixed, so a rerun "
                   "uses the same URLs).")
    p.add_argument("--bytes-per-second", type=float, default=None, help="Throttle --serve.")
    p.add_argument("--faults", default="mixed:0.1",
                   help="Fault profile of the --serve fault server (resets, 5xx, 429, truncation, stalls; "
                        "'' for none). Faults are retried and repaired: training sees the same samples.")
    p.add_argument("--shards", type=int, default=8)
    p.add_argument("--samples", type=int, default=64, help="Samples per shard.")
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--commit-every", type=int, default=4, help="Checkpoint + commit every K steps.")
    p.add_argument("--seed", type=int, default=7)
    p.add_argument("--step-delay", type=float, default=0.0, help="Sleep per step (to make kills easier).")
    a = p.parse_args(argv)

    torch.set_num_threads(1)  # bit-identical losses across restarts
    work = os.path.abspath(a.work)
    ckpt_dir = os.path.join(work, "ckpt")
    os.makedirs(ckpt_dir, exist_ok=True)
    journal = os.path.join(work, "run.db")
    server = None
    if a.url:
        source = a.url
    else:
        manifest = make_data(os.path.join(work, "data"), a.shards, a.samples)
        source = manifest
        if a.serve:
            from chaos.faultserver import FaultServer

            server = FaultServer(os.path.join(work, "data"), port=a.port, faults=a.faults, seed=a.seed,
                                 max_faults_per_path=3, stall_seconds=2.0, retry_after=0,
                                 bytes_per_second=a.bytes_per_second).start()
            # DataLoader workers are forked from here: they must not keep the listening
            # socket open, or a rerun after kill -9 finds the port taken by orphans
            listener = server._httpd.socket
            os.register_at_fork(after_in_child=listener.close)
            source = server.url + "manifest.json"

    from resumewds.fetch import FetchConfig

    ds = (rw.WebDataset(source, seed=a.seed, shuffle=True, shuffle_window=4,
                        fetch=FetchConfig(read_timeout=1.0, backoff_initial=0.05, backoff_max=0.5),
                        cache_dir=os.path.join(work, "cache"))
          .decode("torchrgb").map(to_example))
    resume_step = pick_resume(journal, ckpt_dir)
    loader = rw.WebLoader(ds, batch_size=a.batch_size, num_workers=a.workers, journal=journal,
                          resume=False if resume_step is None else resume_step,
                          preempt=True)  # SIGTERM/SIGUSR1: stop at the next step boundary

    torch.manual_seed(a.seed)
    model = Net()
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    step = -1
    if resume_step is not None:
        state = torch.load(ckpt_path(ckpt_dir, resume_step), weights_only=True)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["opt"])
        step = int(state["step"])
        print(f"resume step {step} epoch {loader.epoch} position {loader.position} "
              f"checkpoint {os.path.basename(ckpt_path(ckpt_dir, step))}", flush=True)
    out = sys.stdout
    try:
        while loader.epoch < a.epochs:
            epoch = loader.epoch
            for x, y, keys in loader:
                step += 1
                loss = torch.nn.functional.cross_entropy(model(x), y)
                opt.zero_grad()
                loss.backward()
                opt.step()
                digest = xxhash.xxh3_64("\n".join(keys).encode()).hexdigest()
                out.write(f"step {step} epoch {epoch} n {len(keys)} keys {digest} first {keys[0]} "
                          f"loss {loss.item():.9g}\n")
                if a.step_delay:
                    import time

                    time.sleep(a.step_delay)
                if (step + 1) % a.commit_every == 0:
                    commit(out, ckpt_dir, step, model, opt, loader)
            if loader.preempted:
                # within the grace period: checkpoint + commit the last finished step
                if step >= 0 and checkpoints(ckpt_dir)[:1] != [step]:
                    commit(out, ckpt_dir, step, model, opt, loader)
                out.write(f"preempted at step {step} (signal {loader.preempt_signal}): "
                          "checkpoint and commit written\n")
                out.flush()
                return 143
        if checkpoints(ckpt_dir)[:1] != [step] and step >= 0:
            commit(out, ckpt_dir, step, model, opt, loader)
        out.write(f"done step {step}\n")
        out.flush()
    finally:
        loader.close()
        if server is not None:
            server.stop()
    return 0


def commit(out: Any, ckpt_dir: str, step: int, model: torch.nn.Module, opt: torch.optim.Optimizer,
           loader: Any) -> None:
    """Flush the step lines, save the checkpoint, commit, drop older checkpoints."""
    out.flush()
    save_checkpoint(ckpt_dir, step, model, opt)
    loader.commit(step)
    for old in checkpoints(ckpt_dir):
        if old < step:
            os.unlink(ckpt_path(ckpt_dir, old))


if __name__ == "__main__":
    sys.exit(main())
