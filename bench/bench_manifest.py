"""Manifest size, process memory and time to the first sample, by manifest format; indexing throughput.

For each size (1,000 shards of 100 and of 1,000 samples by default), the
shards are written once under ``--dir`` and indexed with ``resumewds index``
into a version-4 manifest (an index file per shard; the default above 10,000
samples) and an inline version-3 one (``--offsets inline``, what earlier
versions wrote).  Then, in fresh processes, ``WebDataset(manifest,
shuffle=True)`` takes one sample; each process reports:

* the time from the constructor to the first sample;
* its resident memory (VmRSS) after the first sample minus after ``import
  resumewds`` (and the peak, VmHWM, likewise);

Indexing: ``resumewds index -j 1`` and ``-j 2`` of the same shards, samples/s
(on a machine shared with other work: the ratio is what it is there).

Run::

    python bench/bench_manifest.py                       # 10^5 and 10^6 samples
    python bench/bench_manifest.py --per-shard 100 --repeats 3
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from typing import Any, Dict, List

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)

PROBE = r"""
import json, os, sys, time
def mem():
    d = {}
    with open("/proc/self/status") as f:
        for line in f:
            k, _, v = line.partition(":")
            if k in ("VmRSS", "VmHWM"):
                d[k] = int(v.split()[0]) * 1024
    return d
import resumewds as rw
m0 = mem()
t0 = time.perf_counter()
ds = rw.WebDataset(sys.argv[1], shuffle=True, cache_dir=sys.argv[2])
s = next(iter(ds))
t1 = time.perf_counter()
m1 = mem()
print(json.dumps({"first_s": t1 - t0, "rss": m1["VmRSS"] - m0["VmRSS"], "hwm": m1["VmHWM"] - m0["VmRSS"],
                  "key": s["__key__"]}))
"""


def env() -> Dict[str, str]:
    e = dict(os.environ)
    e["PYTHONPATH"] = ROOT + os.pathsep + e.get("PYTHONPATH", "")
    return e


def du(path: str) -> int:
    if os.path.isfile(path):
        return os.path.getsize(path)
    return sum(os.path.getsize(os.path.join(d, f)) for d, _, fs in os.walk(path) for f in fs)


def index(pattern: str, out: str, jobs: int, extra: List[str]) -> float:
    for p in (out, out + ".indexing"):
        if os.path.exists(p):
            os.remove(p)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "resumewds", "index", pattern, "-o", out, "-j", str(jobs),
                    "--no-progress", *extra], check=True, env=env(), capture_output=True)
    return time.perf_counter() - t0


def probe(manifest: str, cache: str) -> Dict[str, Any]:
    r = subprocess.run([sys.executable, "-c", PROBE, manifest, cache], check=True, env=env(),
                       capture_output=True, text=True)
    return json.loads(r.stdout.strip().splitlines()[-1])


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dir", default="/tmp/rwbench-manifest", help="where the shards are written (kept)")
    p.add_argument("--shards", type=int, default=1000)
    p.add_argument("--per-shard", default="100,1000", help="samples per shard, comma-separated")
    p.add_argument("--repeats", type=int, default=5, help="fresh processes per manifest")
    p.add_argument("--jobs", default="1,2", help="indexing processes to compare")
    p.add_argument("--json", default=None)
    args = p.parse_args()
    from resumewds.synth import write_shards

    rows: List[Dict[str, Any]] = []
    for n in (int(x) for x in args.per_shard.split(",")):
        d = os.path.join(args.dir, f"{args.shards}x{n}")
        pattern = os.path.join(d, "data", f"shard-{{000000..{args.shards - 1:06d}}}.tar")
        if not os.path.exists(os.path.join(d, "data", f"shard-{args.shards - 1:06d}.tar")):
            t0 = time.perf_counter()
            write_shards(os.path.join(d, "data"), shards=args.shards, samples=n, size_range=(20, 200))
            print(f"# wrote {args.shards} x {n} samples in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
        data_bytes = du(os.path.join(d, "data"))
        total = args.shards * n
        idx_times = {}
        for j in (int(x) for x in args.jobs.split(",")):
            idx_times[j] = index(pattern, os.path.join(d, f"v4-j{j}.json"), j, [])
        v4 = os.path.join(d, f"v4-j{max(idx_times)}.json")
        v3 = os.path.join(d, "v3.json")
        index(pattern, v3, max(idx_times), ["--offsets", "inline"])
        for name, m in (("v3 inline (earlier versions)", v3), ("v4 index files", v4)):
            runs = [probe(m, os.path.join(d, "cache")) for _ in range(args.repeats)]
            row = {"samples": total, "format": name, "json_bytes": os.path.getsize(m),
                   "index_bytes": du(m + ".index") if os.path.isdir(m + ".index") else 0,
                   "rss_mb": statistics.median(r["rss"] for r in runs) / 1e6,
                   "hwm_mb": statistics.median(r["hwm"] for r in runs) / 1e6,
                   "first_s_min": min(r["first_s"] for r in runs),
                   "first_s_median": statistics.median(r["first_s"] for r in runs),
                   "data_bytes": data_bytes,
                   "index_s": dict(idx_times),
                   "index_samples_per_s": {j: total / t for j, t in idx_times.items()}}
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    print("| samples | format | manifest.json | index files | memory to the first sample (RSS / peak) "
          "| first sample (min / median) |")
    print("|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r['samples']:,} | {r['format']} | {r['json_bytes'] / 1e6:.2f} MB | "
              f"{r['index_bytes'] / 1e6:.1f} MB | +{r['rss_mb']:.1f} / +{r['hwm_mb']:.1f} MB | "
              f"{r['first_s_min']:.3f} / {r['first_s_median']:.3f} s |")
    print()
    print("| samples | data | index -j 1 | index -j 2 | ratio |")
    print("|---|---|---|---|---|")
    for r in rows[1::2]:
        t = r["index_s"]
        if 1 in t and 2 in t:
            print(f"| {r['samples']:,} | {r['data_bytes'] / 1e9:.2f} GB | {t[1]:.1f} s "
                  f"({r['index_samples_per_s'][1]:,.0f}/s) | {t[2]:.1f} s ({r['index_samples_per_s'][2]:,.0f}/s) "
                  f"| {t[1] / t[2]:.2f}x |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
