"""Shuffle quality of the node-local plan vs webdataset and a uniform permutation.

Per-node partitions must not make the order much less random.  For several
node counts (8 ranks per node, batch 64 per rank) this measures, on each
rank's stream of samples (what one model replica sees, in order), averaged
over the ranks:

* ``adjacent``: fraction of consecutive samples from the same shard (lower
  is better; a uniform permutation gives about 1/shards);
* ``distinct``: distinct shards per batch of 64 (higher is better);
* ``|corr|``: absolute Pearson correlation between the position in the
  stream and the source shard's index in the manifest (lower is better: an
  order that walks the shard list in order scores near 1).

Three orders over the same shards (same sample counts):

* **resumewds**: ``WebDataset(shuffle=True)`` defaults (window 8 shards,
  partitions = nodes), the loader's layout with ``nodes`` (the real
  ``Plan`` + ``Layout``, nothing approximated);
* **webdataset 1.0.2**: ``WebDataset(urls, shardshuffle=100,
  nodesplitter=split_by_node).shuffle(1000)``: its own pipeline stages
  (SimpleShardList, split_by_node, split_by_worker, shuffle(100), then a
  stage that expands a shard into its samples in order, as the tar reader
  does, then shuffle(1000)), one DataLoader worker per rank;
* **uniform**: a uniform random permutation of all samples, cut into rank
  batches by the same layout;
* **P=8xnodes** (information, no target): resumewds with 8 partitions per
  node, where a rank's consecutive positions cycle through 8 partitions.

Targets, per node count: resumewds at least as well mixed as webdataset on
every figure (``|corr|`` also passes when it is within the noise of a random
shard order: below ``2 / sqrt(shards a rank reads)``).  Prints ratios and
PASS/FAIL; exit status 1 on a FAIL.

Run::

    python bench/bench_mixing.py            # 256 shards x 1,000 samples, 1/2/4/8 nodes
    python bench/bench_mixing.py --quick    # 64 shards x 500 samples, 1/2/4 nodes
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from typing import Dict, List, Optional, Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402

from resumewds.plan import Layout, Plan  # noqa: E402

BATCH = 64


def figures(streams: Sequence[np.ndarray]) -> Dict[str, float]:
    """Mixing figures of per-rank streams of source-shard indices."""
    adj_n = adj_d = 0
    distinct: List[int] = []
    corr: List[float] = []
    shards_per_rank: List[int] = []
    for s in streams:
        if len(s) < 2:
            continue
        adj_n += int(np.count_nonzero(s[1:] == s[:-1]))
        adj_d += len(s) - 1
        for k in range(0, len(s) - BATCH + 1, BATCH):
            distinct.append(len(np.unique(s[k:k + BATCH])))
        pos = np.arange(len(s), dtype=np.float64)
        if np.std(s) > 0:
            corr.append(abs(float(np.corrcoef(pos, s.astype(np.float64))[0, 1])))
        else:
            corr.append(0.0)
        shards_per_rank.append(len(np.unique(s)))
    return {"adjacent": adj_n / max(1, adj_d), "distinct": float(np.mean(distinct)) if distinct else 0.0,
            "corr": float(np.mean(corr)) if corr else 0.0,
            "shards_per_rank": float(np.mean(shards_per_rank)) if shards_per_rank else 0.0}


def ours(counts: List[int], nodes: int, per_node: int, seed: int, window: int,
         partitions: Optional[int] = None) -> List[np.ndarray]:
    plan = Plan(counts, seed=seed, shuffle=True, window=window, partitions=partitions or nodes)
    ep = plan.epoch(0)
    total, world = len(ep), nodes * per_node
    out = []
    for r in range(world):
        lay = Layout(BATCH, world, r, "keep", nodes=nodes)
        shards = [ep.sample_at(p)[0] for k in range(lay.num_steps(total, 0))
                  for p, pad in lay.slots(total, 0, k) if not pad]
        out.append(np.asarray(shards, dtype=np.int64))
    return out


def uniform(counts: List[int], nodes: int, per_node: int, seed: int) -> List[np.ndarray]:
    owner = np.repeat(np.arange(len(counts)), counts)
    seq = owner[np.random.default_rng(seed).permutation(len(owner))]
    total, world = len(seq), nodes * per_node
    out = []
    for r in range(world):
        lay = Layout(BATCH, world, r, "keep")
        idx = [p for k in range(lay.num_steps(total, 0)) for p, pad in lay.slots(total, 0, k) if not pad]
        out.append(seq[idx])
    return out


def webdataset_streams(counts: List[int], nodes: int, per_node: int, seed: int) -> List[np.ndarray]:
    import webdataset as wds
    from webdataset import filters

    urls = [f"shard-{i:06d}.tar" for i in range(len(counts))]
    index = {u: i for i, u in enumerate(urls)}

    def expand(src):  # a shard's samples, in the order the tar reader yields them
        for d in src:
            i = index[d["url"]]
            for j in range(counts[i]):
                yield {"__key__": f"{i}_{j}", "shard": i}

    world = nodes * per_node
    out = []
    saved = {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE")}
    try:
        for r in range(world):
            os.environ["RANK"], os.environ["WORLD_SIZE"] = str(r), str(world)
            pipe = wds.DataPipeline(wds.SimpleShardList(urls), wds.split_by_node, wds.split_by_worker,
                                    filters.shuffle(100, seed=seed + r), expand,
                                    filters.shuffle(1000, seed=seed + 1000 + r))
            out.append(np.asarray([s["shard"] for s in pipe], dtype=np.int64))
    finally:
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v
    return out


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shards", type=int, default=256)
    p.add_argument("--samples", type=int, default=1000, help="samples per shard")
    p.add_argument("--nodes", default="1,2,4,8")
    p.add_argument("--ranks-per-node", type=int, default=8)
    p.add_argument("--window", type=int, default=8, help="resumewds shuffle window (shards)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="64 shards x 500 samples, 1/2/4 nodes")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    if args.quick:
        args.shards, args.samples, args.nodes = 64, 500, "1,2,4"
    counts = [args.samples] * args.shards
    per_node = args.ranks_per_node
    print(f"# {args.shards} shards x {args.samples} samples; {per_node} ranks per node, batch {BATCH}; "
          f"resumewds window {args.window}, partitions = nodes; webdataset shardshuffle=100 + "
          f"shuffle(1000)")
    head = (f"{'nodes':>5} {'order':<11} {'adjacent':>9} {'distinct':>9} {'|corr|':>7}   "
            f"{'ratios vs webdataset (adj, distinct, corr)':<44} result")
    print(head)
    results = []
    ok = True
    for nodes in [int(x) for x in args.nodes.split(",")]:
        t0 = time.perf_counter()
        f = {"resumewds": figures(ours(counts, nodes, per_node, args.seed, args.window)),
             "webdataset": figures(webdataset_streams(counts, nodes, per_node, args.seed)),
             "uniform": figures(uniform(counts, nodes, per_node, args.seed)),
             # info: more partitions than nodes (an elastic-friendly count)
             "P=8xnodes": figures(ours(counts, nodes, per_node, args.seed, args.window, 8 * nodes))}
        o, w = f["resumewds"], f["webdataset"]
        noise = 2 / math.sqrt(max(1.0, o["shards_per_rank"]))
        checks = {"adjacent": o["adjacent"] <= w["adjacent"],
                  "distinct": o["distinct"] >= w["distinct"],
                  "corr": o["corr"] <= max(w["corr"], noise)}
        for name in ("resumewds", "webdataset", "uniform", "P=8xnodes"):
            x = f[name]
            line = f"{nodes:>5} {name:<11} {x['adjacent']:>9.4f} {x['distinct']:>9.2f} {x['corr']:>7.3f}"
            if name == "resumewds":
                ratios = (f"{o['adjacent'] / max(w['adjacent'], 1e-12):.2f}x, "
                          f"{o['distinct'] / max(w['distinct'], 1e-12):.2f}x, "
                          f"{o['corr'] / max(w['corr'], 1e-12):.2f}x (noise {noise:.3f})")
                verdict = " ".join(f"{k}:{'PASS' if v else 'FAIL'}" for k, v in checks.items())
                line += f"   {ratios:<44} {verdict}"
            print(line)
        ok &= all(checks.values())
        results.append({"nodes": nodes, "figures": f, "checks": checks, "noise": noise,
                        "seconds": time.perf_counter() - t0})
    print("PASS: at least as well mixed as webdataset on every figure" if ok else
          "FAIL: see the rows above")
    print("command: python bench/bench_mixing.py " + " ".join(argv if argv is not None else sys.argv[1:]))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
