"""Time to the first sample from the user's first call on every path; cold throughput of one.

Default mode (first call, every public path; see bench/_firstpaths.py): each
run is a fresh process that times from constructing the data set / loader to
its first sample and first batch, resumewds and webdataset 1.0.2 interleaved
(medians), over http (a FaultServer process at ``--rate`` MB/s per
connection, cold cache) and from a cold local disk (pages dropped with
``posix_fadvise``), at 8 x 32 MB and 2 x 256 MB shards of ~80 kB samples;
then one cold epoch per resumewds path over http counts the bytes the
server sent (its counters, printed when it stops) against the shards'
bytes.  Targets: first sample <= 1.0x webdataset's over http, <= 1.5x
from a local disk; bytes <= 1.02x.  An info row, "import + first sample",
adds each side's import (untimed above): webdataset loads its read path in
``import webdataset``, resumewds with the first call.  ``--profile``: cProfile of the
first-sample region of each resumewds path instead.

    python bench/bench_firstbatch.py --quick            # 32 MB shards, both sources, one repeat (~5 min here)
    python bench/bench_firstbatch.py --quick --sizes 32,256   # both sizes, one repeat (~11 min here)
    python bench/bench_firstbatch.py                    # both sizes, 3 repeats (medians)
    python bench/bench_firstbatch.py --quick --sources http --pre-import requests   # what importing
                                                        # requests before the first call would save
    python bench/bench_firstbatch.py --quick --sizes 32 --paths iter,pipeline --sources http
    python bench/bench_firstbatch.py --profile --sizes 32 --sources http

``--throughput`` mode (the options below it): the older comparison of one
path, time to first batch and cold throughput over a rate-limited loopback server.

A FaultServer on 127.0.0.1 serves the shards with every response body
limited to ``--rate`` MB/s (per connection, as a remote object store or
CDN limits one stream).  From a cold cache, each system builds its default
shuffled pipeline and iterates batches of 64:

* ``resumewds``: ``WebDataset(manifest_url, shuffle=True).batched(64)``
  (window shuffle of 8 shards, manifest v3 with sample digests: the first
  batches are verified ranged reads, kept in the shards' sparse partials,
  which the background downloads fill around them);
* ``webdataset``: webdataset 1.0.2's
  ``WebDataset(urls, shardshuffle=100).shuffle(1000).batched(64)`` over
  the same http urls (its curl pipe).

Reported, per shard size: seconds to the first batch and cold throughput
(MB/s of sample payload over the whole epoch), and the ratios
``first batch resumewds / webdataset`` (target <= 2) and ``throughput
resumewds / webdataset`` (target >= 3), all measured in this run.

Run::

    python bench/bench_firstbatch.py --throughput --quick     # 32 MB and 256 MB shards, one repeat
    python bench/bench_firstbatch.py --throughput             # the same, 3 repeats (medians)
    python bench/bench_firstbatch.py --throughput --quick --sizes 32 --prefetch-threads 2,4 --repeats 3
                                                 # whole-shard downloads at once, interleaved, medians

``--sent`` (or ``--sent-only``) adds cold epochs, each with a server of its
own: shuffled window and in order, and shuffled through
``WebLoader(num_workers=2)`` and ``=3``; it reports the bytes the server sent
against the shards' bytes (target <= 1.02x)::

    python bench/bench_firstbatch.py --throughput --quick --sizes 32,256 --sent-only
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tarfile
import time
from typing import Any, Dict, Iterator, List, Tuple

import _firstpaths

from _common import ROOT, parse_args, workdir

SAMPLE = 100_000  # bytes of payload per sample (about)
BATCH = 64


def make_data(directory: str, shards: int, shard_mb: int, seed: int = 0,
              sample: int = SAMPLE) -> Tuple[List[str], str]:
    """``shards`` tars of about ``shard_mb`` MB (``.bin`` + ``.cls`` samples of about ``sample``
    bytes) and a v3 manifest."""
    import resumewds as rw

    os.makedirs(directory, exist_ok=True)
    rnd = random.Random(seed)
    names = []
    per = max(1, shard_mb * 1_000_000 // sample)
    for s in range(shards):
        name = f"shard-{s:06d}.tar"
        with tarfile.open(os.path.join(directory, name), "w", format=tarfile.USTAR_FORMAT) as tf:
            for i in range(per):
                key = f"s{s:06d}_{i:06d}"
                for ext, data in (("bin", rnd.randbytes(rnd.randint(sample // 2, sample * 3 // 2))),
                                  ("cls", str(i % 10).encode())):
                    ti = tarfile.TarInfo(f"{key}.{ext}")
                    ti.size = len(data)
                    ti.mtime = 0
                    tf.addfile(ti, io.BytesIO(data))
        names.append(name)
    pattern = os.path.join(directory, f"shard-{{000000..{shards - 1:06d}}}.tar")
    rw.build_manifest(pattern, os.path.join(directory, "manifest.json"), digests=True)
    return names, os.path.join(directory, "manifest.json")


def run_resumewds(url: str, cache: str, limit: int, threads: int = 0, shuffle: bool = True,
                  workers: int = 0) -> Tuple[float, float, int, int]:
    """(seconds to the first batch, seconds for ``limit`` batches, payload bytes, 0)."""
    import resumewds as rw

    shutil.rmtree(cache, ignore_errors=True)
    ds = rw.WebDataset(url + "manifest.json", cache_dir=cache, shuffle=shuffle, seed=1)
    if workers:
        it: Any = rw.WebLoader(ds, batch_size=BATCH, num_workers=workers, collate_fn=list)
    else:
        it = ds.batched(BATCH, collation_fn=None)
        if threads:
            it.store.prefetch_threads = threads  # whole-shard downloads at once (default: 4 for a window, else 2)
    t0 = time.perf_counter()
    first = None
    nbytes = 0
    n = 0
    try:
        for batch in it:
            if first is None:
                first = time.perf_counter() - t0
            nbytes += sum(len(s["bin"]) for s in batch)
            n += 1
            if n >= limit:
                break
    finally:
        total = time.perf_counter() - t0
        ds.close()
    assert first is not None
    return first, total, nbytes, 0


def run_webdataset(url: str, names: List[str], limit: int) -> Tuple[float, float, int, int]:
    import webdataset as wds

    urls = [url + n for n in names]
    ds = wds.WebDataset(urls, shardshuffle=100, seed=1, empty_check=False).shuffle(1000).batched(
        BATCH, collation_fn=None)
    t0 = time.perf_counter()
    first = None
    nbytes = 0
    n = 0
    for batch in ds:
        if first is None:
            first = time.perf_counter() - t0
        nbytes += sum(len(s["bin"]) for s in batch)
        n += 1
        if n >= limit:
            break
    total = time.perf_counter() - t0
    assert first is not None
    return first, total, nbytes, 0


@contextlib.contextmanager
def served(root: str, bps: float, stats: Any = None) -> Iterator[str]:
    """A FaultServer in its own process (its threads must not share our GIL), on 127.0.0.1;
    ``stats`` (a dict) gets its counters when it stops (``bytes_sent``, per path...)."""
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    proc = subprocess.Popen([sys.executable, "-m", "chaos.faultserver", root, "--port", "0",
                             "--bytes-per-second", str(bps)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, env=env, cwd=ROOT)
    try:
        assert proc.stdout is not None
        url = proc.stdout.readline().strip()
        if not url.startswith("http://127.0.0.1:"):
            raise RuntimeError(f"faultserver did not start: {url!r}")
        yield url.rstrip("/") + "/"
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=10)
        if stats is not None:
            for line in reversed((err or "").strip().splitlines()):
                if line.startswith("{"):
                    stats.update(json.loads(line))
                    break


def main(argv: Any = None) -> int:
    args = parse_args(__doc__.splitlines()[0], argv, extra=lambda p: (
        p.add_argument("--rate", type=float, default=50.0, help="MB/s per connection (default 50)"),
        p.add_argument("--sizes", default=None, help="shard sizes in MB, e.g. 32,256"),
        p.add_argument("--prefetch-threads", default="0",
                       help="ShardStore.prefetch_threads for resumewds (0: the library default, 4 for a "
                            "shuffled window); a list (e.g. 2,0) runs one resumewds variant per value, interleaved"),
        p.add_argument("--sent", action="store_true",
                       help="throughput mode: also one cold resumewds epoch per order (shuffled, in order), "
                            "each with a server of its own: the bytes it sent / the data set's bytes"),
        p.add_argument("--sent-only", action="store_true", help="throughput mode: only the --sent epochs"),
        p.add_argument("--throughput", action="store_true",
                       help="the cold-throughput comparison of one path (batched WebDataset, timed from the "
                            "first next(); the options above) instead of the first-call comparison of every path"),
        p.add_argument("--paths", default=None, help="first-call mode: paths to run, e.g. iter,webloader2 "
                       "(default: " + ",".join(_firstpaths.PATHS) + ")"),
        p.add_argument("--sources", default="http,local", help="first-call mode: http, local or both"),
        p.add_argument("--sample-kb", type=int, default=80, help="first-call mode: sample size (default 80 kB)"),
        p.add_argument("--no-bytes", action="store_true", help="first-call mode: skip the cold epochs that "
                       "count the bytes the server sent"),
        p.add_argument("--profile", action="store_true", help="first-call mode: instead, cProfile the "
                       "first-sample region of each resumewds path (default size 32) and print the top"),
        p.add_argument("--profile-top", type=int, default=30, help="functions shown per profile"),
        p.add_argument("--pre-import", default="", help="first-call mode: also run resumewds with these "
                       "modules (e.g. requests) imported before the clock starts, interleaved (what moving "
                       "that import off the path would save)")))
    if not args.throughput:
        with workdir(args, "firstcall") as d:
            if args.profile:
                return _firstpaths.run_profiles(args, d, make_data)
            return _firstpaths.run_paths(args, d, make_data)
    sizes = [int(x) for x in (args.sizes or "32,256").split(",")]
    threads = [int(x) for x in str(args.prefetch_threads).split(",")]
    repeats = args.repeats or (1 if args.quick else 3)
    # shards per size: the default window of 8 shuffles 8 shards at once
    count = {32: 8, 256: 2}  # the full run repeats more (a larger one took ~7 min on a loaded machine)
    rows: List[Tuple[str, float]] = []
    ok = True
    variants: Dict[str, int] = {}  # name -> prefetch threads
    for t in threads:
        variants["resumewds" + (f"@t{t}" if len(threads) > 1 else "")] = t
    with workdir(args, "firstbatch") as d:
        for mb in sizes:
            n = count.get(mb, 4)
            t0 = time.perf_counter()
            names, _ = make_data(os.path.join(d, f"d{mb}"), n, mb)
            data_bytes = sum(os.path.getsize(os.path.join(d, f"d{mb}", x)) for x in names)
            print(f"# {n} shards x {mb} MB, samples of ~{SAMPLE // 1000} kB, generated in "
                  f"{time.perf_counter() - t0:.1f}s; server limited to {args.rate:g} MB/s per connection",
                  flush=True)
            if args.sent or args.sent_only:
                # (shuffled, DataLoader workers)
                for shuffle, workers in [(True, 0), (False, 0), (True, 2), (True, 3)]:
                    stats: Dict[str, Any] = {}
                    with served(os.path.join(d, f"d{mb}"), args.rate * 1e6, stats) as url:
                        out = run_resumewds(url, os.path.join(d, "cache"), limit=10 ** 9, shuffle=shuffle,
                                            workers=workers)
                    shutil.rmtree(os.path.join(d, "cache"), ignore_errors=True)
                    sent = sum(v for k, v in stats.get("bytes_by_path", {}).items() if k.endswith(".tar")) \
                        or int(stats.get("bytes_sent", 0))
                    order = (("shuffled" if shuffle else "in order")
                             + (f", WebLoader num_workers={workers}" if workers else ""))
                    print(f"# {mb} MB shards, {order}: the server sent {sent / 1e6:.1f} MB for {data_bytes / 1e6:.1f} "
                          f"MB of shards ({sent / data_bytes:.3f}x); epoch {out[1]:.2f}s, "
                          f"{out[2] / 1e6 / out[1]:.1f} MB/s", flush=True)
                    rows.append((f"bytes sent / data bytes, {mb} MB, {order}", sent / data_bytes))
                if args.sent_only:
                    continue
            res: Dict[str, List[Tuple[float, float, int, int]]] = {name: [] for name in variants}
            res["webdataset"] = []
            with served(os.path.join(d, f"d{mb}"), args.rate * 1e6) as url:
                # first batch: the first batches only; throughput: the whole epoch (cold)
                for r in range(repeats):
                    for name in (list(res) if r % 2 == 0 else list(res)[::-1]):
                        cache = os.path.join(d, "cache")
                        if name == "webdataset":
                            out = run_webdataset(url, names, limit=10 ** 9)
                        else:
                            out = run_resumewds(url, cache, limit=10 ** 9, threads=variants[name])
                        res[name].append(out)
                        print(f"#   {name:16s} first batch {out[0]:6.2f}s  epoch {out[1]:6.2f}s  "
                              f"{out[2] / 1e6 / out[1]:7.1f} MB/s", flush=True)
                        shutil.rmtree(os.path.join(d, "cache"), ignore_errors=True)

            def med(name: str, i: int, res: Dict[str, List[Tuple[float, float, int, int]]] = res) -> float:
                return statistics.median(x[i] for x in res[name])

            def rate(name: str, res: Dict[str, List[Tuple[float, float, int, int]]] = res) -> float:
                return statistics.median(x[2] / x[1] for x in res[name])

            for name in variants:
                first_ratio = med(name, 0) / med("webdataset", 0)
                thr_ratio = rate(name) / rate("webdataset")
                print(f"{mb} MB shards: first batch {name} {med(name, 0):.2f}s, "
                      f"webdataset {med('webdataset', 0):.2f}s  -> ratio {first_ratio:.2f}x (target <= 2)")
                print(f"{mb} MB shards: cold throughput {name} {rate(name) / 1e6:.1f} MB/s, "
                      f"webdataset {rate('webdataset') / 1e6:.1f} MB/s  -> ratio {thr_ratio:.2f}x (target >= 3)")
                label = "" if len(variants) == 1 or name == "resumewds" else f" ({name})"
                rows += [(f"first batch / webdataset, {mb} MB{label}", first_ratio),
                         (f"cold throughput / webdataset, {mb} MB{label}", thr_ratio)]
                ok = ok and first_ratio <= 2 and thr_ratio >= 3
    print("| metric | ratio |\n|---|---|")
    for k, v in rows:
        print(f"| {k} | {v:.2f}x |")
    if args.sent_only:
        return 0
    print("PASS" if ok else "BELOW TARGET")
    return 0


if __name__ == "__main__":
    sys.exit(main())
