"""Where resumewds' first batch after import goes, against webdataset.

The figure is bench_peers.py's "first batch after import, local, 2 workers":
``rw.WebLoader(rw.WebDataset(manifest, shuffle=True, seed=0).to_tuple("__key__", "jpg",
"cls"), batch_size=64, num_workers=2)`` against ``wds.WebLoader(wds.WebDataset(pattern,
shardshuffle=True, seed=0).shuffle(1000).to_tuple(...).batched(64), batch_size=None,
num_workers=2)``, each in a fresh interpreter with torch imported first (as a training
script has it), timed from after the imports to the first batch.  "cold" drops the page
cache (``echo 3 > /proc/sys/vm/drop_caches``, root only) before the child starts.

Cases (the systems and cases interleaved, the order rotating each round, medians of
the rounds):

* ``rw``        - the shards' verification marks exist (the bench_peers case: every
  later start of the same job on the same machine);
* ``rw-first``  - a fresh ``cache_dir``: the shards were never verified on this machine
  (the first start of a job); the manifest has sample digests (v3, what ``resumewds
  index`` writes by default); each sample is checked against its own digest as it is read,
  the whole-file hash that sets the mark runs behind on a background thread;
* ``wds``       - webdataset 1.0.2 on the same tars.

The resumewds children also print where the time goes: ``import resumewds`` (not in the
timed figure, as in bench_peers), the WebDataset (manifest load and validation), the plan,
the WebLoader, DataLoader worker start (fork) to the worker's first step, and inside the
worker that produced the first batch: waiting for the shard (open + verification),
reading and framing the samples, the stages + collate, then the hand-over to the main
process.  The worker-side times are taken from the first batch's own ``meta``
(``t_fetch_wait``, ``t_read``, ``t_stages``) and a timestamp at the worker's first step
(``time.perf_counter`` is CLOCK_MONOTONIC: comparable across processes).

Usage::

    python bench/bench_coldstart.py --quick        # 4 x 500 samples, 3 rounds
    python bench/bench_coldstart.py                # 16 x 1000 samples (bench_peers' data), 5 rounds

Target: rw cold / wds cold <= 1.5x.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from typing import Any, Dict, List, Optional

from _common import drop_caches

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
BATCH = 64
SEED = 0
CASES = ("rw", "rw-first", "wds")


# ---------------------------------------------------------------- child side
def _child_rw(spec: Dict[str, Any]) -> Dict[str, Any]:
    import torch  # noqa: F401  (a training script has it imported)

    t0 = time.perf_counter()
    import resumewds as rw

    rw.WebLoader  # noqa: B018  (resolve the lazy loader module, as bench_peers does)
    t_import = time.perf_counter() - t0
    from resumewds.dataset import WebDataset as _WDS

    evdir = spec["evdir"]
    orig = _WDS.iter_steps

    def iter_steps(self: Any, *a: Any, **kw: Any) -> Any:
        t_start = time.perf_counter()
        first = True
        for k, batch, meta in orig(self, *a, **kw):
            if first:
                first = False
                rec = {"pid": os.getpid(), "step": k, "t_start": t_start, "t_done": time.perf_counter(),
                       "fetch_wait": meta.get("t_fetch_wait", 0.0), "read": meta.get("t_read", 0.0),
                       "stages": meta.get("t_stages", 0.0)}
                with open(os.path.join(evdir, f"w{os.getpid()}.json"), "w") as f:
                    json.dump(rec, f)
            yield k, batch, meta

    _WDS.iter_steps = iter_steps  # type: ignore[method-assign]  (inherited by the forked workers)

    t1 = time.perf_counter()
    ds = rw.WebDataset(spec["manifest"], shuffle=True, seed=SEED, cache_dir=spec["cache"])
    t2 = time.perf_counter()
    ds.manifest  # noqa: B018  (loaded lazily or not: timed here, as the loader would need it)
    t3 = time.perf_counter()
    ds.plan  # noqa: B018
    t4 = time.perf_counter()
    ds = ds.to_tuple("__key__", "jpg", "cls")
    loader = rw.WebLoader(ds, batch_size=BATCH, num_workers=2)
    t5 = time.perf_counter()
    it = iter(loader)
    batch = next(it)
    t6 = time.perf_counter()
    assert len(batch[0]) == BATCH
    import pickle

    pickled = len(pickle.dumps(ds))
    del it
    recs = []
    for name in os.listdir(evdir):
        with open(os.path.join(evdir, name)) as f:
            recs.append(json.load(f))
    w = min((r for r in recs if r["step"] == 0), key=lambda r: r["t_start"])
    return {"s": t6 - t1, "import": t_import, "dataset": t2 - t1, "manifest": t3 - t2, "plan": t4 - t3,
            "loader": t5 - t4, "worker_start": w["t_start"] - t5,
            "setup": w["t_done"] - w["t_start"] - w["read"] - w["stages"],
            "shard_wait": w["fetch_wait"], "read_frame": w["read"] - w["fetch_wait"], "stages_collate": w["stages"],
            "handover": t6 - w["t_done"], "pickled_kb": pickled / 1024}


def _child_wds(spec: Dict[str, Any]) -> Dict[str, Any]:
    import torch  # noqa: F401

    t0 = time.perf_counter()
    import webdataset as wds

    t_import = time.perf_counter() - t0
    t1 = time.perf_counter()
    ds = wds.WebDataset(spec["pattern"], shardshuffle=True, seed=SEED, empty_check=False).shuffle(1000)
    loader = wds.WebLoader(ds.to_tuple("__key__", "jpg", "cls").batched(BATCH), batch_size=None, num_workers=2)
    it = iter(loader)
    batch = next(it)
    t2 = time.perf_counter()
    assert len(batch[0]) == BATCH
    del it
    return {"s": t2 - t1, "import": t_import}


# ---------------------------------------------------------------- parent side
def _run(spec: Dict[str, Any], timeout: float = 300) -> Dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               PYTHONWARNINGS="ignore")
    with tempfile.NamedTemporaryFile("r", suffix=".json", delete=False) as res:
        spec = dict(spec, result=res.name)
    p = subprocess.Popen([sys.executable, os.path.abspath(__file__), "--child", json.dumps(spec)], env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    try:
        _, err = p.communicate(timeout=timeout)
        with open(res.name) as f:
            text = f.read()
        if p.returncode != 0 or not text:
            tail = err.decode(errors="replace").strip().splitlines()[-1:] or [f"exit {p.returncode}"]
            raise RuntimeError(f"{spec['case']}: {tail[0]}")
        return dict(json.loads(text))
    finally:
        try:  # the child's session: its DataLoader workers too
            os.killpg(p.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        p.wait()
        os.unlink(res.name)


BREAKDOWN = [("import", "import resumewds (+ WebLoader), not in the figure"),
             ("dataset", "WebDataset(manifest): manifest load + validation"),
             ("manifest", "ds.manifest after construction"),
             ("plan", "ds.plan"),
             ("loader", "to_tuple + WebLoader()"),
             ("worker_start", "iter + next -> worker 0's first step (DataLoader fork)"),
             ("setup", "worker: epoch order, window prefetch, meta (rest of its first step)"),
             ("shard_wait", "worker: shard open + verification (t_fetch_wait)"),
             ("read_frame", "worker: pread + tar framing of 64 samples"),
             ("stages_collate", "worker: stages + collate"),
             ("handover", "worker's batch -> main process"),
             ("s", "= first batch after import (the figure)")]


def main(argv: Optional[List[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="4 x 500 samples, 3 rounds")
    ap.add_argument("--repeats", type=int, default=None, help="rounds (default 5; quick 3)")
    ap.add_argument("--tmp", default=None, help="parent directory of the generated data")
    ap.add_argument("--keep", action="store_true")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        import warnings

        warnings.filterwarnings("ignore")
        spec = json.loads(args.child)
        out = _child_wds(spec) if spec["case"] == "wds" else _child_rw(spec)
        with open(spec["result"], "w") as f:
            json.dump(out, f)
        return 0

    sys.path.insert(0, ROOT)
    from resumewds import build_manifest, synth

    shards, per = (4, 500) if args.quick else (16, 1000)
    repeats = args.repeats or (3 if args.quick else 5)
    d = tempfile.mkdtemp(prefix="rwbench-cold-", dir=args.tmp)
    try:
        tar_dir = os.path.join(d, "tar")
        synth.write_shards(tar_dir, shards=shards, samples=per, images=True, image_side=256, seed=SEED)
        pattern = os.path.join(tar_dir, f"shard-{{000000..{shards - 1:06d}}}.tar")
        manifest = os.path.join(tar_dir, "manifest.json")
        build_manifest(pattern, manifest, digests=True)  # v3, as `resumewds index` writes by default
        base = {"manifest": manifest, "pattern": pattern}
        # the marks of rw's cache dir exist before the rounds (a pass has verified every shard)
        _run(dict(base, case="rw", cache=os.path.join(d, "cache-rw"), evdir=tempfile.mkdtemp(dir=d)))
        cold_ok = os.geteuid() == 0 and drop_caches()
        temps = ("cold", "warm") if cold_ok else ("warm",)
        if not cold_ok:
            print("# cannot drop the page cache (not root): warm only", flush=True)
        print(f"# {shards} x {per} samples (256x256 JPEG), {repeats} rounds, load {os.getloadavg()[0]:.1f}",
              flush=True)
        if os.environ.get("PYTHONDONTWRITEBYTECODE"):
            print("# PYTHONDONTWRITEBYTECODE is set: resumewds' modules are compiled from source in every child "
                  "(webdataset's site-packages .pyc files are used); the import row pays for it", flush=True)
        res: Dict[str, Dict[str, List[Dict[str, Any]]]] = {f"{c}/{t}": {} for c in CASES for t in temps}
        runs: Dict[str, List[Dict[str, Any]]] = {k: [] for k in res}
        n = 0
        for r in range(repeats):
            order = CASES[r % len(CASES):] + CASES[:r % len(CASES)]
            for case in order:
                for temp in temps:
                    n += 1
                    cache = os.path.join(d, "cache-rw") if case == "rw" else os.path.join(d, f"cache-{n}")
                    if temp == "cold":
                        drop_caches()
                    elif case == "rw-first":
                        pass  # a fresh cache dir again: the warm first start still verifies
                    out = _run(dict(base, case=case, cache=cache, evdir=tempfile.mkdtemp(dir=d)))
                    runs[f"{case}/{temp}"].append(out)
                    if case == "rw-first":
                        shutil.rmtree(cache, ignore_errors=True)
            print("# round %d: %s" % (r + 1, "  ".join(f"{k}={v[-1]['s']:.3f}" for k, v in runs.items())),
                  flush=True)

        def med(key: str, field: str = "s") -> float:
            return statistics.median(x[field] for x in runs[key])

        print()
        cols = [k for k in runs if not k.startswith("wds")]
        print("| where the time goes (median s) | " + " | ".join(cols) + " |")
        print("|---|" + "---|" * len(cols))
        for field, title in BREAKDOWN:
            print(f"| {title} | " + " | ".join(f"{med(k, field):.3f}" for k in cols) + " |")
        print("| pickled WebDataset, KB | " + " | ".join(f"{med(k, 'pickled_kb'):.0f}" for k in cols) + " |")
        print()
        print("| first batch after import, 2 workers, s (median, min..max) | resumewds | webdataset | ratio "
              "| target | result |")
        print("|---|---|---|---|---|---|")
        failed = False
        for case in ("rw", "rw-first"):
            for temp in temps:
                ours, peer = runs[f"{case}/{temp}"], runs[f"wds/{temp}"]
                a, b = med(f"{case}/{temp}"), med(f"wds/{temp}")
                target = case == "rw" and temp == temps[0]
                ok = a / b <= 1.5
                failed |= target and not ok
                what = "verified before" if case == "rw" else "first start: fresh cache_dir"
                print(f"| {temp}, {what} | {a:.3f} ({min(x['s'] for x in ours):.3f}.."
                      f"{max(x['s'] for x in ours):.3f}) | {b:.3f} ({min(x['s'] for x in peer):.3f}.."
                      f"{max(x['s'] for x in peer):.3f}) | {a / b:.2f}x | {'<= 1.5x' if target else '-'} | "
                      f"{('PASS' if ok else 'FAIL') if target else 'info'} |")
        return 1 if failed else 0
    finally:
        if args.keep:
            print(f"(kept {d})")
        else:
            shutil.rmtree(d, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
