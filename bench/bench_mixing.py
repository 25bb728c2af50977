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

The ``.shuffle(n)`` stage (a buffer shuffle in webdataset,
compiled into our plan as uniform shuffles within windows of whole shards
holding about ``3n`` samples, so exactly resumable with no sample bytes
stored).  These rows run the **real pipeline** end to end: real tar shards
(one tiny ``.cls`` member per sample) and a ``manifest.json`` are written,
and each rank's samples are read through resumewds, the source shard taken
from each delivered ``__key__``; every sample of the epoch is checked to be
delivered exactly once over the ranks:

* **rw .shuffle(1000)**: ``WebDataset(manifest, shuffle=True).shuffle(1000)``
  read by ``WebLoader(ds, batch_size=64, rank=r, world_size=W, nodes=N)``;
* **rw ss=100 drop-in**: ``WebDataset(manifest, shardshuffle=100,
  nodesplitter=split_by_node).shuffle(1000)``, webdataset's constructor
  arguments, iterated directly under ``RANK`` / ``WORLD_SIZE`` as a
  webdataset script does (our direct iteration: one plan over all shards,
  rank ``r`` takes positions ``r, r+W, ...``);
* **rw buffer only**: ``WebDataset(manifest).shuffle(1000)`` (no shard
  shuffle: the stage alone) by the same WebLoader, against
* **wds buffer only**: webdataset's ``WebDataset(urls, shardshuffle=False,
  nodesplitter=split_by_node).shuffle(1000)`` (its stages, as above).

Targets, per node count: each resumewds row at least as well mixed as its
webdataset peer (``resumewds``, ``rw .shuffle(1000)`` and ``rw ss=100
drop-in`` against ``webdataset``; ``rw buffer only`` against ``wds buffer
only``) on every figure (``|corr|`` also passes when it is within the noise
of a random shard order: below ``2 / sqrt(shards a rank reads)``).  Prints
ratios and PASS/FAIL per figure; exit status 1 on a FAIL.

Run::

    python bench/bench_mixing.py            # 256 shards x 1,000 samples, 1/2/4/8 nodes
    python bench/bench_mixing.py --quick    # 64 shards x 500 samples, 1/2/4 nodes
    python bench/bench_mixing.py --json out.json   # also the figures, per node count
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import time
from typing import Callable, Dict, List, Optional, Sequence

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

import numpy as np  # noqa: E402

from resumewds.plan._plan import Layout, Plan  # noqa: E402

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


def write_data(directory: str, counts: List[int]) -> str:
    """Real tar shards, one tiny ``.cls`` member per sample keyed ``s{shard:06d}_{j:06d}``,
    and their indexed ``manifest.json`` (``build_manifest``); return its path."""
    import io
    import tarfile

    from resumewds import build_manifest

    for i, n in enumerate(counts):
        with tarfile.open(os.path.join(directory, f"shard-{i:06d}.tar"), "w", format=tarfile.USTAR_FORMAT) as tf:
            data = b"%d" % i
            for j in range(n):
                info = tarfile.TarInfo(f"s{i:06d}_{j:06d}.cls")
                info.size = len(data)
                tf.addfile(info, io.BytesIO(data))
    manifest = os.path.join(directory, "manifest.json")
    build_manifest(os.path.join(directory, f"shard-{{000000..{len(counts) - 1:06d}}}.tar"), manifest)
    return manifest


def _shard_of(sample: Dict[str, object]) -> int:
    return int(str(sample["__key__"])[1:7])


def _check_once(streams: Sequence[np.ndarray], keys: int, counts: List[int], what: str) -> None:
    """Every sample of the epoch delivered exactly once over the ranks (shard counts add up)."""
    got = np.bincount(np.concatenate(streams), minlength=len(counts)) if streams else np.zeros(0)
    if keys != sum(counts) or list(got) != list(counts):
        raise SystemExit(f"{what}: the ranks delivered {keys} samples, not each of the {sum(counts)} once")


def rw_loader_streams(manifest: str, counts: List[int], nodes: int, per_node: int, seed: int,
                      **ds_args: object) -> List[np.ndarray]:
    """``rw.WebDataset(manifest, **ds_args).shuffle(1000)`` read by each rank's WebLoader."""
    import resumewds as rw

    world, out, keys = nodes * per_node, [], set()
    for r in range(world):
        ds = rw.WebDataset(manifest, seed=seed, **ds_args).shuffle(1000)  # type: ignore[arg-type]
        loader = rw.WebLoader(ds, batch_size=BATCH, rank=r, world_size=world, nodes=nodes,
                              collate_fn=lambda b: [s["__key__"] for s in b])
        got = [k for batch in loader for k in batch]
        keys.update(got)
        out.append(np.asarray([int(k[1:7]) for k in got], dtype=np.int64))
    _check_once(out, len(keys), counts, f"WebDataset({ds_args}).shuffle(1000)")
    return out


def rw_direct_streams(manifest: str, counts: List[int], nodes: int, per_node: int,
                      seed: int) -> List[np.ndarray]:
    """``rw.WebDataset(manifest, shardshuffle=100, nodesplitter=split_by_node).shuffle(1000)``
    iterated directly under RANK / WORLD_SIZE (webdataset's way)."""
    import resumewds as rw

    world, out, keys = nodes * per_node, [], set()
    with _rank_env() as set_rank:
        for r in range(world):
            set_rank(r, world)
            ds = rw.WebDataset(manifest, shardshuffle=100, nodesplitter=rw.split_by_node,
                               seed=seed).shuffle(1000)
            got = [s["__key__"] for s in ds]
            keys.update(got)
            out.append(np.asarray([int(k[1:7]) for k in got], dtype=np.int64))
    _check_once(out, len(keys), counts, "WebDataset(shardshuffle=100, nodesplitter=split_by_node).shuffle(1000)")
    return out


class _rank_env:
    """Set RANK / WORLD_SIZE per rank; restore them afterwards."""

    def __enter__(self) -> Callable[[int, int], None]:
        self.saved = {k: os.environ.get(k) for k in ("RANK", "WORLD_SIZE")}

        def set_rank(r: int, world: int) -> None:
            os.environ["RANK"], os.environ["WORLD_SIZE"] = str(r), str(world)
        return set_rank

    def __exit__(self, *exc: object) -> None:
        for k, v in self.saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def webdataset_streams(counts: List[int], nodes: int, per_node: int, seed: int,
                       shardshuffle: int = 100) -> List[np.ndarray]:
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
    with _rank_env() as set_rank:
        for r in range(world):
            set_rank(r, world)
            shard_stages = [filters.shuffle(shardshuffle, seed=seed + r)] if shardshuffle else []
            pipe = wds.DataPipeline(wds.SimpleShardList(urls), wds.split_by_node, wds.split_by_worker,
                                    *shard_stages, expand,
                                    filters.shuffle(1000, seed=seed + 1000 + r))
            out.append(np.asarray([s["shard"] for s in pipe], dtype=np.int64))
    return out


#: (row, the webdataset row it must be at least as well mixed as)
PAIRS = (("resumewds", "webdataset"), ("rw .shuffle(1000)", "webdataset"),
         ("rw ss=100 drop-in", "webdataset"), ("rw buffer only", "wds buffer only"))
ORDER = ("resumewds", "rw .shuffle(1000)", "rw ss=100 drop-in", "webdataset",
         "rw buffer only", "wds buffer only", "uniform", "P=8xnodes")


def checks_of(o: Dict[str, float], w: Dict[str, float]) -> Dict[str, bool]:
    """Row ``o`` at least as well mixed as ``w``; ``|corr|`` also within a random order's noise."""
    noise = 2 / math.sqrt(max(1.0, o["shards_per_rank"]))
    return {"adjacent": o["adjacent"] <= w["adjacent"], "distinct": o["distinct"] >= w["distinct"],
            "corr": o["corr"] <= max(w["corr"], noise)}


def main(argv: Optional[Sequence[str]] = None) -> int:
    import shutil
    import tempfile

    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--shards", type=int, default=256)
    p.add_argument("--samples", type=int, default=1000, help="samples per shard")
    p.add_argument("--nodes", default="1,2,4,8")
    p.add_argument("--ranks-per-node", type=int, default=8)
    p.add_argument("--window", type=int, default=8, help="resumewds shuffle window (shards)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--quick", action="store_true", help="64 shards x 500 samples, 1/2/4 nodes")
    p.add_argument("--tmp", default=None, help="parent directory of the generated shards")
    p.add_argument("--json", default=None)
    args = p.parse_args(argv)
    if args.quick:
        args.shards, args.samples, args.nodes = 64, 500, "1,2,4"
    counts = [args.samples] * args.shards
    per_node = args.ranks_per_node
    print(f"# {args.shards} shards x {args.samples} samples; {per_node} ranks per node, batch {BATCH}; "
          f"resumewds window {args.window}, partitions = nodes; webdataset shardshuffle=100 + "
          f"shuffle(1000)")
    print("# pairs (row >= peer on every figure): " + "; ".join(f"{a} vs {b}" for a, b in PAIRS))
    tmp = tempfile.mkdtemp(prefix="rwbench-mixing-", dir=args.tmp)
    try:
        t0 = time.perf_counter()
        manifest = write_data(tmp, counts)
        print(f"# wrote {args.shards} tar shards + manifest.json in {time.perf_counter() - t0:.1f}s "
              f"under {tmp}", flush=True)
        return _run(args, counts, per_node, manifest, argv)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def _run(args: argparse.Namespace, counts: List[int], per_node: int, manifest: str,
         argv: Optional[Sequence[str]]) -> int:
    head = (f"{'nodes':>5} {'order':<17} {'adjacent':>9} {'distinct':>9} {'|corr|':>7}   "
            f"{'ratios vs peer (adj, distinct, corr)':<44} result")
    results = []
    ok = True
    for nodes in [int(x) for x in args.nodes.split(",")]:
        t0 = time.perf_counter()
        seed = args.seed
        f = {"resumewds": figures(ours(counts, nodes, per_node, seed, args.window)),
             "rw .shuffle(1000)": figures(rw_loader_streams(manifest, counts, nodes, per_node, seed,
                                                            shuffle=True)),
             "rw ss=100 drop-in": figures(rw_direct_streams(manifest, counts, nodes, per_node, seed)),
             "webdataset": figures(webdataset_streams(counts, nodes, per_node, seed)),
             "rw buffer only": figures(rw_loader_streams(manifest, counts, nodes, per_node, seed)),
             "wds buffer only": figures(webdataset_streams(counts, nodes, per_node, seed, shardshuffle=0)),
             "uniform": figures(uniform(counts, nodes, per_node, seed)),
             # info: more partitions than nodes (an elastic-friendly count)
             "P=8xnodes": figures(ours(counts, nodes, per_node, seed, args.window, 8 * nodes))}
        checks = {a: checks_of(f[a], f[b]) for a, b in PAIRS}
        peer = dict(PAIRS)
        print(head)
        for name in ORDER:
            x = f[name]
            line = f"{nodes:>5} {name:<17} {x['adjacent']:>9.4f} {x['distinct']:>9.2f} {x['corr']:>7.3f}"
            if name in peer:
                w = f[peer[name]]
                noise = 2 / math.sqrt(max(1.0, x["shards_per_rank"]))
                ratios = (f"{x['adjacent'] / max(w['adjacent'], 1e-12):.2f}x, "
                          f"{x['distinct'] / max(w['distinct'], 1e-12):.2f}x, "
                          f"{x['corr'] / max(w['corr'], 1e-12):.2f}x (noise {noise:.3f})")
                verdict = " ".join(f"{k}:{'PASS' if v else 'FAIL'}" for k, v in checks[name].items())
                line += f"   {ratios:<44} {verdict}"
            print(line)
        print(flush=True)
        ok &= all(all(c.values()) for c in checks.values())
        results.append({"nodes": nodes, "figures": f, "checks": checks,
                        "seconds": time.perf_counter() - t0})
    print("PASS: every resumewds row at least as well mixed as its webdataset peer on every figure" if ok else
          "FAIL: see the rows above")
    print("command: python bench/bench_mixing.py " + " ".join(argv if argv is not None else sys.argv[1:]))
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(results, fh, indent=1)
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
