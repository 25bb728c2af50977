"""How the design holds at 1,000 ranks and 100,000 shards: a simulation.

Nothing here needs 1,000 machines or 10^9 samples.  The plan is pure
arithmetic over sample counts (:class:`resumewds.plan.Plan`), so the global
order, the per-rank split, the cache traffic of a node and the cost of a
failure can be computed exactly for the full-size layout; the only I/O
measured is the journal, on this machine's disk.

Measured (time: wall clock without tracing; memory: tracemalloc peak and
what stays allocated, in a second, traced run):

1. ``Plan(counts)`` for 100,000 shards x 10,000 samples.
2. ``plan.epoch(0)``: the shard permutation and the window starts.
3. One rank's first steps: ``Layout.slots`` + ``EpochPlan.sample_at``; and,
   from the window sequence each DataLoader worker walks, the window
   permutations a worker computes per epoch (its CPU cost for the plan).
4. Manifest memory per process: shard records without offsets, offsets of
   every shard loaded at once (array of int64, and the JSON text), vs only
   the shards a reader has open.
5. Journal: ``Journal.commit`` rate of one rank file (NORMAL and FULL sync),
   with N processes committing to their own files at once, and
   ``resolve_resume`` over many rank files.
6. Cache traffic of one node (``--ranks-per-node`` ranks sharing a cache)
   with one partition: shards it must fetch vs the samples it uses; and,
   with the node-local plan (partitions = nodes), the bytes each node
   fetches per epoch / its share for 1, 2, 4 and all nodes (checked against
   ``Layout.slots`` + ``sample_at`` of a node's ranks), and what an elastic
   change of the node count costs (per-epoch ratio at the new count, and
   the one-time refetch with warm caches on the surviving nodes).
7. What a node failure costs: steps replayed, samples re-read, shards a
   replacement node fetches before its first step.

Run::

    python bench/scale_sim.py                 # full size, ~1 minute
    python bench/scale_sim.py --quick         # small, a few seconds
"""

from __future__ import annotations

import argparse
import gc
import json
import math
import multiprocessing as mp
import os
import resource
import shutil
import sys
import tempfile
import time
import tracemalloc
from array import array
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

from resumewds.manifest._manifest import ShardInfo  # noqa: E402
from resumewds.plan import Layout, Plan, worker_steps  # noqa: E402
from resumewds.plan._keyed import permutation  # noqa: E402

MB = 1 << 20


class Table:
    def __init__(self) -> None:
        self.rows: List[Tuple[str, str, str, str]] = []

    def add(self, what: str, value: str, seconds: Optional[float] = None,
            memory: Optional[str] = None) -> None:
        t = "" if seconds is None else (f"{seconds * 1e3:.1f} ms" if seconds < 1 else f"{seconds:.2f} s")
        self.rows.append((what, value, t, memory or ""))
        print(f"  {what}: {value}  {t}  {memory or ''}", file=sys.stderr, flush=True)

    def section(self, title: str) -> None:
        self.rows.append((f"**{title}**", "", "", ""))

    def markdown(self) -> str:
        head = ("what", "value", "time", "memory (peak / kept)")
        w = [max(len(r[i]) for r in self.rows + [head]) for i in range(4)]
        line = lambda r: "| " + " | ".join(c.ljust(w[i]) for i, c in enumerate(r)) + " |"
        return "\n".join([line(head), "|" + "|".join("-" * (x + 2) for x in w) + "|"]
                         + [line(r) for r in self.rows])


def fmt_bytes(n: float) -> str:
    for unit, size in (("TB", 1e12), ("GB", 1e9), ("MB", 1e6), ("KB", 1e3)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n:.0f} B"


def measure(fn: Callable[[], Any], trace: bool = True) -> Tuple[Any, float, str]:
    """(result, seconds, "peak / kept" memory).  Timed untraced, then traced."""
    gc.collect()
    t0 = time.perf_counter()
    result = fn()
    seconds = time.perf_counter() - t0
    mem = ""
    if trace:
        del result
        gc.collect()
        tracemalloc.start()
        base = tracemalloc.get_traced_memory()[0]
        result = fn()
        cur, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
        mem = f"{fmt_bytes(peak - base)} / {fmt_bytes(cur - base)}"
    return result, seconds, mem


# ---------------------------------------------------------------------------
# 3. the plan CPU a DataLoader worker spends per epoch
# ---------------------------------------------------------------------------

def worker_window_misses(ep: Any, layout: Layout, total: int, worker: int, workers: int,
                         steps: int, cache: int = 4) -> Tuple[int, int]:
    """(window permutations computed, steps produced) by one worker over its
    first ``steps`` steps, replaying EpochPlan's FIFO window cache."""
    held: List[int] = []
    misses = done = 0
    for k in worker_steps(layout.num_steps(total, 0), worker, workers):
        if done >= steps:
            break
        slots = layout.slots(total, 0, k)
        for w in sorted({ep.window_of(slots[0][0]), ep.window_of(slots[-1][0])}):
            if w not in held:
                misses += 1
                held.append(w)
                if len(held) > cache:
                    held.pop(0)
        done += 1
    return misses, done


# ---------------------------------------------------------------------------
# 6b. the node-local plan: per-node egress and the cost of an elastic change
# ---------------------------------------------------------------------------

def node_shard_sets(ep: Any, nodes: int) -> List[set]:
    """The shards each node's ranks read in an epoch.

    Node n's ranks deliver the positions ``p % nodes == n`` (Layout with
    ``nodes``), and position p is in partition ``p % P``: node n reads the
    partitions ``q % gcd(nodes, P) == n % gcd(nodes, P)``.  Checked against
    the real ``Layout.slots`` + ``sample_at`` by :func:`check_node_reads`.
    """
    P = ep.partitions
    g = math.gcd(nodes, P)
    per_class = [set() for _ in range(g)]
    for q in range(P):
        per_class[q % g].update(ep.partition_shards(q))
    return [per_class[n % g] for n in range(nodes)]


def check_node_reads(ep: Any, total: int, batch: int, nodes: int, per_node: int, node: int,
                     allowed: set, steps: Optional[Sequence[int]] = None) -> Tuple[int, int]:
    """(samples checked, shards seen) of ``node``'s ranks at ``steps`` (all
    steps if None): every sample must come from ``allowed``."""
    world = nodes * per_node
    seen: set = set()
    checked = 0
    lays = [Layout(batch, world, node * per_node + lr, "keep", nodes=nodes) for lr in range(per_node)]
    n_steps = lays[0].num_steps(total, 0)
    for k in (range(n_steps) if steps is None else steps):
        for lay in lays:
            for pos, _ in lay.slots(total, 0, k):
                s, _ = ep.sample_at(pos)
                if s not in allowed:
                    raise AssertionError(f"node {node} of {nodes} read shard {s} outside its partitions")
                seen.add(s)
                checked += 1
    return checked, len(seen)


# ---------------------------------------------------------------------------
# 5. journal
# ---------------------------------------------------------------------------

def _commit_loop(path: str, seconds: float, sync: str, rank: int, q: Any) -> None:
    from resumewds.journal import Journal

    j = Journal(path, rank=rank, world_size=max(1, rank + 1), synchronous=sync)
    n, t0 = 0, time.perf_counter()
    while time.perf_counter() - t0 < seconds:
        consumed = {(f"shard-{(n + i) % 100000:06d}.tar", 0): (4, 10000) for i in range(8)}
        j.commit(n, epoch=0, position=(n + 1) * 32000, consumed=consumed, world_size=rank + 1,
                 batch_size=32, samples_total=(n + 1) * 32)
        n += 1
    elapsed = time.perf_counter() - t0
    j.close()
    q.put(n / elapsed)


def commit_rate(d: str, seconds: float, sync: str, procs: int) -> List[float]:
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    ps = [ctx.Process(target=_commit_loop, args=(os.path.join(d, f"{sync}-{procs}.db"), seconds, sync, r, q))
          for r in range(procs)]
    for p in ps:
        p.start()
    rates = [q.get() for _ in ps]
    for p in ps:
        p.join()
    return rates


def make_rank_files(path: str, ranks: int, steps: int) -> None:
    """A run of ``ranks`` rank files with ``steps`` commits each (rank R-1 lacks the last)."""
    from resumewds.journal import Journal

    for r in range(ranks):
        with Journal(path, rank=r, world_size=ranks) as j:
            for s in range(steps - (1 if r == ranks - 1 else 0)):
                j.commit(s, epoch=0, position=(s + 1) * 32 * ranks, world_size=ranks, batch_size=32,
                         samples_total=(s + 1) * 32)


# ---------------------------------------------------------------------------

PROBE = r"""
import json, pickle, sys, time
def rss():
    with open("/proc/self/status") as f:
        return {k: int(v.split()[0]) * 1024 for k, _, v in (l.partition(":") for l in f) if k in ("VmRSS", "VmHWM")}
import resumewds
from resumewds.plan import Layout, Plan
from resumewds.sources import resolve_sources
path, warm, B, R, rank, W, P = sys.argv[1], sys.argv[2], *map(int, sys.argv[3:8])
resolve_sources(warm)  # a one-shard manifest of the same form first: the code it needs is loaded
m0 = rss(); t0 = time.perf_counter(); c0 = time.process_time()
m = resolve_sources(path)
t1 = time.perf_counter(); m1 = rss(); c1 = time.process_time()
ep = Plan(m.counts, seed=7, shuffle=True, window=W, partitions=P).epoch(0)
t2 = time.perf_counter(); m2 = rss(); c2 = time.process_time()
total = m.total_samples
n = 0
for pos, _ in Layout(B, R, rank, "keep", nodes=P).slots(total, 0, 0):
    s, j = ep.sample_at(pos)
    a, b = m.shards[s].sample_range(j)
    d = m.shards[s].sample_digests[j]
    n += b > a
t3 = time.perf_counter(); m3 = rss(); c3 = time.process_time()
print(json.dumps({"load_s": t1 - t0, "plan_s": t2 - t1, "step_s": t3 - t2, "samples": n,
                  "load_cpu": c1 - c0, "plan_cpu": c2 - c1, "step_cpu": c3 - c2,
                  "rss_manifest": m1["VmRSS"] - m0["VmRSS"], "rss_total": m3["VmRSS"] - m0["VmRSS"],
                  "peak": m3["VmHWM"] - m0["VmRSS"], "pickle": len(pickle.dumps(m.shards))}))
"""


def _probe(path: str, warm: str, B: int, R: int, rank: int, W: int, P: int) -> Dict[str, Any]:
    import subprocess

    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = subprocess.run([sys.executable, "-c", PROBE, path, warm, str(B), str(R), str(rank), str(W), str(P)],
                         check=True, capture_output=True, text=True, env=env).stdout
    return json.loads(out.strip().splitlines()[-1])


def write_scaled(d: str, S: int, n: int, sample_bytes: int, fmt: str, need: set) -> str:
    """A synthetic manifest of ``S`` shards x ``n`` samples in format ``fmt`` (``"index"``:
    version 4; ``"file"``: version 3 with side files, written sparse; ``"inline"``), whose
    binary parts are real only for the shards in ``need`` (the ones the probe reads):
    every figure is what a process of a real data set of that size would see."""
    import struct

    import xxhash

    from resumewds.manifest import encode_inline
    from resumewds.manifest._shardindex import MAGIC, encode, index_name

    size = n * sample_bytes + 1024
    offs = array("q", range(0, n * sample_bytes + 1, sample_bytes))
    digs = array("Q", ((i * 0x9E3779B97F4A7C15) & (2 ** 64 - 1) for i in range(n)))
    body = offs.tobytes() + digs.tobytes()
    path = os.path.join(d, f"{fmt}.json")
    idir = path + ".index"
    os.makedirs(idir, exist_ok=True)
    head = {"format": "resumewds.manifest", "version": {"index": 4, "file": 3, "inline": 3}[fmt],
            "created": "2026-12-04T00:00:00Z"}
    if fmt == "index":
        head.update(index_dir=os.path.basename(idir), index_digests=True)
    if fmt == "file":
        head.update(offsets_file=f"{fmt}.json.offsets", digests_file=f"{fmt}.json.digests")
        for side, count in ((".offsets", S * (n + 1)), (".digests", S * n)):
            with open(path + side, "wb") as f:
                f.truncate(8 * count)  # sparse: only the shards read are written
    inline_offs = json.dumps(offs.tolist()) if fmt == "inline" else ""
    inline_digs = encode_inline(digs) if fmt == "inline" else ""
    with open(path, "w") as f:
        f.write(json.dumps(head)[:-1] + ', "shards": [')
        for k in range(S):
            xxh = f"{(k * 2654435761 + 12345) % (1 << 64):016x}"
            e = f'{{"url": "train/shard-{k:06d}.tar", "size": {size}, "xxh3_64": "{xxh}", "samples": {n}'
            if fmt == "index":
                h = xxhash.xxh3_64(struct.pack("<8sQQQQ", MAGIC, n, size, int(xxh, 16), 3))
                h.update(body)
                e += f', "index_xxh3_64": "{h.hexdigest()}"'
                if k in need:
                    buf = encode(offs, digs, size, xxh)
                    assert xxhash.xxh3_64_hexdigest(buf) == h.hexdigest()
                    with open(os.path.join(idir, index_name(h.hexdigest())), "wb") as g:
                        g.write(buf)
            elif fmt == "file":
                e += f', "offsets_at": {k * (n + 1)}, "digests_at": {k * n}'
                if k in need:
                    for side, arr, at in ((".offsets", offs, k * (n + 1)), (".digests", digs, k * n)):
                        with open(path + side, "r+b") as g:
                            g.seek(8 * at)
                            g.write(arr.tobytes())
            else:
                e += f', "offsets": {inline_offs}, "sample_xxh3_64": "{inline_digs}"'
            f.write(("" if k == 0 else ", ") + e + "}")
        f.write("]}")
    return path


def manifest_at_scale(t: Table, figures: Dict[str, Any], args: argparse.Namespace, S: int, n: int,
                      R: int, B: int, W: int) -> None:
    """Section 4: a fresh process per format loads the manifest, builds the plan and
    reads the offsets and digests of one rank's first step, at full size."""
    P = max(1, R // args.ranks_per_node)
    rank = R // 2
    total = S * n
    ep = Plan([n] * S, seed=7, shuffle=True, window=W, partitions=P).epoch(0)
    need = {ep.sample_at(pos)[0] for pos, _ in Layout(B, R, rank, "keep", nodes=P).slots(total, 0, 0)}
    d = tempfile.mkdtemp(prefix="rw-scale-manifest-", dir=args.tmp)
    t.section(f"the manifest in one process, measured: {S:,} shards x {n:,} samples, rank {rank} of {R:,}, "
              f"partitions {P}")
    small = max(1, S // args.old_scale)
    try:
        for fmt, shards, note in (("index", S, "version 4: index file per shard"),
                                  ("file", S, "version 3, offsets + digests side files (mmap)"),
                                  ("inline", small, f"version 3 inline, at {small:,} shards")):
            t0 = time.perf_counter()
            path = write_scaled(d, shards, n, args.sample_bytes, fmt, need if shards == S else
                                {s % shards for s in need})
            made = time.perf_counter() - t0
            os.makedirs(os.path.join(d, "warm"), exist_ok=True)
            warm = write_scaled(os.path.join(d, "warm"), 1, n, args.sample_bytes, fmt, {0})
            r = _probe(path, warm, B, R if shards == S else args.ranks_per_node,
                       rank if shards == S else 0, W, P if shards == S else 1)
            scale = S / shards
            side = sum(os.path.getsize(path + x) for x in (".offsets", ".digests") if os.path.exists(path + x))
            t.add(f"{note}: manifest.json", f"{fmt_bytes(os.path.getsize(path) * scale)}"
                  + (f" (+ side files {fmt_bytes(side)}, fetched whole before the first sample when remote)"
                     if side else "") + (f" (x {scale:,.0f}: linear)" if scale > 1 else ""))
            t.add("  load (resolve_sources)", f"{fmt_bytes(r['rss_manifest'] * scale)} per process"
                  + (f" (x {scale:,.0f})" if scale > 1 else "") + f"; CPU {r['load_cpu'] * scale:.2f} s",
                  r["load_s"] * scale)
            t.add("  plan (Plan + epoch 0)", f"CPU {r['plan_cpu']:.2f} s", r["plan_s"])
            t.add(f"  first step: {B} samples' offsets and digests", f"{r['samples']} samples; "
                  f"CPU {r['step_cpu']:.3f} s", r["step_s"], f"{fmt_bytes(r['rss_total'] * scale)} total / "
                  f"{fmt_bytes(r['peak'] * scale)} peak")
            t.add("  load + plan + first step", f"CPU {(r['load_cpu'] * scale + r['plan_cpu'] + r['step_cpu']):.2f} s",
                  r["load_s"] * scale + r["plan_s"] + r["step_s"])
            t.add("  the shards pickled for a spawned worker", fmt_bytes(r["pickle"] * scale))
            figures[f"manifest_{fmt}"] = dict(r, scale=scale, json_bytes=os.path.getsize(path) * scale,
                                              write_s=made)
            for name in os.listdir(d):
                p = os.path.join(d, name)
                shutil.rmtree(p) if os.path.isdir(p) else os.remove(p)
    finally:
        shutil.rmtree(d, ignore_errors=True)


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shards", type=int, default=100_000)
    p.add_argument("--samples", type=int, default=10_000, help="samples per shard")
    p.add_argument("--ranks", type=int, default=1000)
    p.add_argument("--ranks-per-node", type=int, default=8)
    p.add_argument("--batch", type=int, default=32, help="samples per rank per step")
    p.add_argument("--window", type=int, default=8, help="shuffle window (shards)")
    p.add_argument("--workers", type=int, default=4, help="DataLoader workers per rank")
    p.add_argument("--steps", type=int, default=10, help="steps of one rank to compute")
    p.add_argument("--sample-bytes", type=int, default=100_000, help="mean sample size, for traffic")
    p.add_argument("--step-seconds", type=float, default=0.5, help="assumed training step time")
    p.add_argument("--journal-seconds", type=float, default=2.0)
    p.add_argument("--journal-ranks", type=int, default=None,
                   help="rank files for the resolve_resume timing (default: --ranks)")
    p.add_argument("--quick", action="store_true", help="1,000 shards x 1,000 samples, 64 ranks")
    p.add_argument("--old-scale", type=int, default=1000,
                   help="the inline (old) manifest is measured at 1/N of the shards and scaled (its cost is linear)")
    p.add_argument("--tmp", default=None, help="where the synthetic manifests are written (default: $TMPDIR)")
    p.add_argument("--no-manifest", action="store_true", help="skip the measured manifest section")
    p.add_argument("--json", default=None, help="also write the figures here")
    args = p.parse_args(argv)
    if args.quick:
        args.shards, args.samples, args.ranks, args.journal_seconds = 1000, 1000, 64, 0.5
        args.old_scale = 1
    jranks = args.journal_ranks or args.ranks
    S, n, R, B, W = args.shards, args.samples, args.ranks, args.batch, args.window
    total = S * n
    figures: Dict[str, Any] = {"shards": S, "samples_per_shard": n, "ranks": R, "batch": B,
                               "window": W, "workers": args.workers}
    t = Table()
    print(f"# {S:,} shards x {n:,} samples = {total:,} samples; {R:,} ranks x batch {B} "
          f"(step = {B * R:,} samples); window {W} shards; {args.workers} workers/rank",
          file=sys.stderr)

    # 1-2. the plan -------------------------------------------------------
    t.section("plan (every process builds it; pure arithmetic)")
    counts = [n] * S
    plan, sec, mem = measure(lambda: Plan(counts, seed=7, shuffle=True, window=W))
    t.add("Plan(counts)", f"{S:,} shards", sec, mem)
    figures["plan_s"] = sec

    def epoch0() -> Any:
        plan._epochs.clear()
        return plan.epoch(0)

    ep, sec, mem = measure(epoch0)
    t.add("epoch(0): shard permutation + window starts", f"{len(ep.window_starts) - 1:,} windows",
          sec, mem)
    figures["epoch_s"] = sec
    assert len(ep) == total

    # 3. one rank's first steps ------------------------------------------
    layout = Layout(B, R, R // 2, "keep")
    steps_per_epoch = layout.num_steps(total, 0)

    def rank_steps() -> List[Tuple[int, int]]:
        ep._cache.clear()
        out = []
        for k in range(args.steps):
            out.extend(ep.sample_at(pos) for pos, _ in layout.slots(total, 0, k))
        return out

    got, sec, mem = measure(rank_steps)
    windows = len({ep.window_of(pos) for k in range(args.steps) for pos, _ in layout.slots(total, 0, k)})
    t.add(f"rank {R // 2}: slots + sample_at of its first {args.steps} steps",
          f"{len(got)} samples from {len({s for s, _ in got})} shards, {windows} windows",
          sec, mem)
    # Window shuffles are random-access (plan.FeistelPermutation): a worker pays
    # per position it delivers, not per window it touches.  For contrast, the
    # cost of materialising one window's permutation by sorting (what a
    # sort-based shuffle would pay per window touched, per worker).
    _, t_sort, mem = measure(lambda: permutation(W * n, 12345))
    t.add("materialising one window permutation by sorting (NOT done)", f"{W * n:,} samples", t_sort, mem)
    per_sample = sec / max(1, len(got))
    samples_per_worker_epoch = steps_per_epoch / args.workers * layout.batch_size
    cpu_epoch = per_sample * samples_per_worker_epoch
    t.add("plan CPU per delivered sample (slots + Feistel sample_at)",
          f"{per_sample * 1e6:.1f} us -> {cpu_epoch:,.1f} CPU-s per worker per epoch "
          f"of {steps_per_epoch:,} steps", sec, None)
    misses, done = worker_window_misses(ep, layout, total, 0, args.workers, 400)
    per_step = misses / max(1, done)
    t.add("windows a worker touches per step",
          f"{per_step:.2f} (a sort-based shuffle would pay {per_step * t_sort * 1e3:.0f} ms per batch)")
    figures.update(sample_at_steps_s=sec, window_sort_s=t_sort, plan_us_per_sample=per_sample * 1e6,
                   plan_cpu_per_worker_epoch_s=cpu_epoch, steps_per_epoch=steps_per_epoch,
                   windows_per_worker_step=per_step)
    del got

    # 4. manifest memory ---------------------------------------------------
    if not args.no_manifest:
        manifest_at_scale(t, figures, args, S, n, R, B, W)
    t.section("manifest in memory, per process (rank or worker): the arithmetic")

    def records() -> List[ShardInfo]:
        return [ShardInfo(url=f"https://data.example.com/ds/train/shard-{i:06d}.tar",
                          size=n * args.sample_bytes, xxh3_64=f"{i * 2654435761 % (1 << 64):016x}",
                          samples=n) for i in range(S)]

    _, sec, mem = measure(records)
    t.add(f"{S:,} shard records without offsets", "url, size, xxh3_64, samples", sec, mem)
    offs = array("q", range(0, (n + 1) * args.sample_bytes, args.sample_bytes))
    per_shard_arr = offs.itemsize * len(offs)
    big = [x + 10_000_000_000 for x in offs]  # offsets of a 100 GB-ish file: 11 digits
    per_shard_json = len(json.dumps(big))
    tracemalloc.start()
    b0 = tracemalloc.get_traced_memory()[0]
    parsed = json.loads(json.dumps(big))
    per_shard_list = tracemalloc.get_traced_memory()[0] - b0
    tracemalloc.stop()
    del parsed, big
    all_arr, all_json, all_list = S * per_shard_arr, S * per_shard_json, S * per_shard_list
    t.add("offsets of all shards, array('q') (what load_manifest keeps)",
          f"{fmt_bytes(all_arr)} per process ({fmt_bytes(per_shard_arr)} per shard)")
    t.add("  ... as JSON text in manifest.json", f"{fmt_bytes(all_json)} file")
    t.add("  ... as Python ints while json.load parses it", f"{fmt_bytes(all_list)} transient")
    open_shards = W + 2
    procs_per_rank = 1 + args.workers
    t.add(f"offsets loaded lazily for the open shards ({open_shards} per reader)",
          f"{fmt_bytes(open_shards * per_shard_arr)} per process, "
          f"{fmt_bytes(open_shards * per_shard_arr * procs_per_rank * args.ranks_per_node)} per node")
    t.add("  vs all at once, per node",
          f"{fmt_bytes(all_arr * procs_per_rank * args.ranks_per_node)} "
          f"({procs_per_rank} processes x {args.ranks_per_node} ranks)")
    figures.update(offsets_all_bytes=all_arr, offsets_json_bytes=all_json,
                   offsets_parse_bytes=all_list, offsets_lazy_bytes=open_shards * per_shard_arr)

    # 5. journal -------------------------------------------------------------
    t.section("journal (one SQLite file per rank, measured on this disk)")
    d = tempfile.mkdtemp(prefix="rw-scale-")
    try:
        for sync in ("NORMAL", "FULL"):
            rate = commit_rate(d, args.journal_seconds, sync, 1)[0]
            t.add(f"commits/s, one rank, synchronous={sync}", f"{rate:,.0f}")
            figures[f"commits_per_s_{sync.lower()}"] = rate
        procs = max(2, os.cpu_count() or 2)
        rates = commit_rate(d, args.journal_seconds, "NORMAL", procs)
        t.add(f"commits/s, {procs} ranks at once on one disk (NORMAL)",
              f"{sum(rates):,.0f} total, {min(rates):,.0f}-{max(rates):,.0f} per rank")
        need = R / args.step_seconds
        t.add(f"needed at {R:,} ranks, a commit every step of {args.step_seconds} s",
              f"{need:,.0f} commits/s in total, {1 / args.step_seconds:.0f}/s per rank file")
        figures.update(commits_per_s_concurrent=sum(rates), concurrent_procs=procs,
                       commits_needed_per_s=need)
        jpath = os.path.join(d, "run", "run.db")
        os.makedirs(os.path.dirname(jpath))
        _, sec, _ = measure(lambda: make_rank_files(jpath, jranks, 3), trace=False)
        t.add(f"create {jranks:,} rank files (3 commits each)", "", sec)
        from resumewds.journal import resolve_resume
        from resumewds.journal._status import status

        point, sec, mem = measure(lambda: resolve_resume(jpath), trace=True)
        assert point["step"] == 1 and point["skipped_incomplete"][0]["missing_ranks"] == [jranks - 1]
        t.add(f"resolve_resume over {jranks:,} rank files (newest step incomplete)",
              f"step {point['step']}", sec, mem)
        figures["resolve_resume_s"] = sec
        t.add("  done by rank 0 only, answer broadcast (WebLoader under torch.distributed)",
              f"{jranks:,} file opens per restart; every rank on its own would be "
              f"{jranks * jranks:,} opens, {sec * jranks:,.0f} s of reads on shared storage")
        _, sec, _ = measure(lambda: status(jpath), trace=False)
        t.add(f"resumewds status over {jranks:,} rank files", "", sec)
        figures["status_s"] = sec
    finally:
        shutil.rmtree(d, ignore_errors=True)

    # 6. cache traffic per node --------------------------------------------
    t.section(f"partitions=1 (one order over all shards): cache traffic of one node "
              f"({args.ranks_per_node} ranks share one cache)")
    node = range(args.ranks_per_node)
    n_windows = 8
    end = ep.window_starts[n_windows]
    k_end = (end - 1) // (B * R) + 1
    ep._cache.clear()
    touched: Dict[int, int] = {}
    used = 0
    t0 = time.perf_counter()
    for k in range(k_end):
        for r in node:
            for pos, _ in layout.slots(total, 0, k, rank=r):
                if pos >= end:
                    continue
                s, _ = ep.sample_at(pos)
                touched[s] = touched.get(s, 0) + 1
                used += 1
    sec = time.perf_counter() - t0
    in_windows = n_windows * W
    frac_shards = len(touched) / in_windows
    shard_bytes = n * args.sample_bytes
    t.add(f"first {n_windows} windows ({k_end} steps): shards the node reads",
          f"{len(touched)} of {in_windows} ({frac_shards:.0%}); uses {used:,} of their "
          f"{len(touched) * n:,} samples ({used / max(1, len(touched) * n):.2%})", sec)
    per_node_epoch = frac_shards * S * shard_bytes
    dataset = S * shard_bytes
    t.add("whole-shard fetches per node per epoch", f"{fmt_bytes(per_node_epoch)} "
          f"(data set {fmt_bytes(dataset)}; {R // args.ranks_per_node} nodes fetch "
          f"{fmt_bytes(per_node_epoch * R / args.ranks_per_node)} in total)")
    t.add("samples a node actually delivers per epoch",
          f"{fmt_bytes(dataset * args.ranks_per_node / R)} (what ranged reads would fetch)")
    t.add("each shard is fetched once per node (flock)",
          f"not once per rank: saves {args.ranks_per_node}x")
    figures.update(node_shard_fraction=frac_shards, node_bytes_per_epoch=per_node_epoch,
                   node_used_fraction=used / max(1, len(touched) * n), dataset_bytes=dataset)

    # 6b. node-local plan ---------------------------------------------------
    per_node = args.ranks_per_node
    t.section(f"node-local plan (partitions = nodes, the default): per-node egress per epoch, "
              f"{per_node} ranks per node")
    shard_bytes = n * args.sample_bytes
    dataset = S * shard_bytes
    egress: Dict[str, Any] = {}
    node_counts = [1, 2, 4, R // per_node]
    for N in sorted(set(node_counts)):
        if N < 1 or R % per_node:
            continue
        epN, sec, _ = measure(lambda N=N: Plan(counts, seed=7, shuffle=True, window=W, partitions=N).epoch(0),
                              trace=False)
        sets = node_shard_sets(epN, N)
        share = dataset / N
        ratios = [len(x) * shard_bytes / share for x in sets]
        node = N // 2
        if args.quick:
            chk, seen = check_node_reads(epN, total, B, N, per_node, node, sets[node])
            how = "every step"
        else:
            ks = Layout(B, N * per_node, 0, "keep", nodes=N).num_steps(total, 0)
            steps = sorted({(i * 7919) % ks for i in range(200)})
            chk, seen = check_node_reads(epN, total, B, N, per_node, node, sets[node], steps)
            how = f"{len(steps)} steps"
        t.add(f"{N} node(s) x {per_node} ranks: bytes fetched per node per epoch / (data set / nodes)",
              f"max {max(ratios):.3f}, mean {sum(ratios) / N:.3f} "
              f"({fmt_bytes(max(len(x) for x in sets) * shard_bytes)} "
              f"per node; {fmt_bytes(sum(len(x) for x in sets) * shard_bytes)} for the job); "
              f"node {node}: {chk:,} samples of {how} checked, all from its {len(sets[node]):,} shards",
              sec, None)
        egress[str(N)] = {"max_ratio": max(ratios), "mean_ratio": sum(ratios) / N,
                          "node_bytes": max(len(x) for x in sets) * shard_bytes}
        if N == R // per_node:
            t.add(f"  {N} nodes with partitions=1 (one order over all shards, as before)",
                  f"every node reads all {S:,} shards: {fmt_bytes(dataset)} per node, "
                  f"ratio {N:.0f}; {fmt_bytes(dataset * N)} for the job")
        del epN, sets
    # uneven shards: partitions are cut by samples, so a cut splits a shard
    # that both neighbours then fetch whole
    Nmax = R // per_node
    uneven = [n // 2 + (i * 2654435761) % (n + 1) for i in range(S)]  # n/2 .. 3n/2 samples
    epU = Plan(uneven, seed=7, shuffle=True, window=W, partitions=Nmax).epoch(0)
    setsU = node_shard_sets(epU, Nmax)
    shareU = sum(uneven) * args.sample_bytes / Nmax
    ratiosU = [sum(uneven[x] for x in st) * args.sample_bytes / shareU for st in setsU]
    t.add(f"{Nmax} nodes, shards of {n // 2:,}-{n + n // 2:,} samples (bytes proportional)",
          f"bytes per node / share: max {max(ratiosU):.4f}, mean {sum(ratiosU) / Nmax:.4f} "
          f"(a cut splits at most one shard)")
    egress["uneven_max_ratio"] = max(ratiosU)
    del epU, setsU
    figures["node_egress"] = egress
    t.add("with a cache that holds a node's share",
          "partitions are fixed for the run: after epoch 0 a node fetches nothing (epoch 1: 0 bytes)")

    t.section("elastic change: a resume at another node count keeps the run's partitions")
    elastic = []
    n1 = R // per_node
    scen = [(n1, n1, 2 * n1), (n1, n1, max(1, n1 // 5)), (n1, n1, max(1, (n1 * 4) // 5)),
            (n1, 8 * n1, (n1 * 4) // 5), (n1, 8 * n1, 2 * n1)]
    for N1, P, N2 in scen:
        if N2 < 1 or P < 1:
            continue
        pl = Plan(counts, seed=7, shuffle=True, window=W, partitions=P)
        e0 = pl.epoch(0)
        before, after = node_shard_sets(e0, N1), node_shard_sets(e0, N2)
        share2 = dataset / N2
        extra = [len(after[k] - (before[k] if k < N1 else set())) * shard_bytes for k in range(N2)]
        steady = max(len(x) for x in after) * shard_bytes / share2
        row = {"from_nodes": N1, "partitions": P, "to_nodes": N2, "steady_ratio": steady,
               "one_time_bytes": sum(extra), "one_time_max_node_share": max(extra) / share2}
        elastic.append(row)
        t.add(f"{N1} -> {N2} nodes, partitions {P}",
              f"per epoch at {N2}: {steady:.2f} x share"
              + (" (locality kept)" if steady <= 1.1 else f" (gcd({N2}, {P}) = {math.gcd(N2, P)}: "
                 "no locality for the rest of the run)")
              + f"; one-time refetch with warm caches on surviving nodes: {fmt_bytes(sum(extra))} "
              f"({sum(extra) / dataset:.2f} x the data set; max {max(extra) / share2:.2f} x a node share)")
        del pl, e0, before, after
    figures["elastic"] = elastic

    # 7. node failure --------------------------------------------------------
    t.section("a node failure (the whole job restarts from the newest complete commit)")
    for every in (1, 10, 100):
        t.add(f"commit every {every} step(s)",
              f"<= {every} steps replayed: {every * B * R:,} samples over all ranks, "
              f"{every * B} per rank, {every * args.step_seconds:g} s of training")
    t.add("replacement node, cold cache, before its first step",
          f"the current window + prefetch: <= {W + 4} shards = {fmt_bytes((W + 4) * shard_bytes)}")
    t.add("other nodes", "keep their caches; resume reads only the committed position")

    rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    t.add("max RSS of this simulation", fmt_bytes(rss))
    figures["max_rss_bytes"] = rss
    print()
    print(t.markdown())
    print()
    print("command: python bench/scale_sim.py " + " ".join(argv if argv is not None else sys.argv[1:]))
    if args.json:
        with open(args.json, "w") as f:
            json.dump(figures, f, indent=2)
    return 0


if __name__ == "__main__":
    sys.exit(main())
