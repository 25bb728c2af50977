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
from a local disk; bytes <= 1.02x.  ``--profile``: cProfile of the
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
  batches are verified ranged reads and reads of the partial downloads,
  which are sparse partials: the default configuration);
* ``resumewds-off``: the same with sparse partial downloads off
  (``resumewds.cache.sparse.SPARSE_PARTIALS = False``: the whole-shard
  download fetches the ranged bytes a second time); ``--no-off`` skips it;
* ``resumewds-whole``: the same with ranged reads off
  (``WebDataset(..., ranged_reads=False)``: every shard is read once it
  is downloaded whole and verified);
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
    python bench/bench_firstbatch.py --throughput --quick --prefetch-threads 4   # more whole-shard downloads
    python bench/bench_firstbatch.py --throughput --quick --sizes 32 --prefetch-threads 2,4 --repeats 3 --no-whole
                                                 # old vs new default, interleaved, medians

Also reported: the bytes fetched by range (kept in the sparse partials by
default; downloaded a second time by ``resumewds-off``), as a share of the
epoch's bytes.  ``--sent`` (or ``--sent-only``) adds cold epochs, each with
a server of its own: shuffled window and in order, with the default
configuration and with sparse partials off, and a shuffled one through
``WebLoader(num_workers=2)``; it reports the bytes the server sent against
the shards' bytes (target <= 1.02x)::

    python bench/bench_firstbatch.py --throughput --quick --sizes 32,256 --sent-only
    python bench/bench_firstbatch.py --throughput --quick --sizes 32,256 --no-whole --repeats 5
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


def run_resumewds(url: str, cache: str, ranged: bool, limit: int, threads: int = 0,
                  ahead: float = -1, shuffle: bool = True, sparse: Any = None,
                  workers: int = 0) -> Tuple[float, float, int, int]:
    """(seconds to the first batch, seconds for ``limit`` batches, payload bytes,
    bytes fetched by range: downloaded a second time by the whole-shard prefetch)."""
    import resumewds as rw
    from resumewds import reading
    from resumewds.cache import sparse as sparse_mod

    # None: the default (on); False: the reader's ranges are downloaded again by the prefetch
    sparse_mod.SPARSE_PARTIALS = sparse
    if workers:
        return _run_loader(url, cache, shuffle, workers, sparse)
    default_ahead = reading.WINDOW_AHEAD
    if ahead >= 0:
        reading.WINDOW_AHEAD = int(ahead * 1e6)
    shutil.rmtree(cache, ignore_errors=True)
    ds = rw.WebDataset(url + "manifest.json", cache_dir=cache, shuffle=shuffle, seed=1,
                       ranged_reads=ranged).batched(BATCH, collation_fn=None)
    if threads:
        ds.store.prefetch_threads = threads  # whole-shard downloads at once (default: 4 for a window, else 2)
    t0 = time.perf_counter()
    first = None
    nbytes = 0
    n = 0
    try:
        for batch in ds:
            if first is None:
                first = time.perf_counter() - t0
            nbytes += sum(len(s["bin"]) for s in batch)
            n += 1
            if n >= limit:
                break
    finally:
        total = time.perf_counter() - t0
        rr = ds._reader.ranged if ds._reader is not None else None
        ranged_bytes = rr.counters["range_bytes"] if rr is not None else 0
        ds.close()
        reading.WINDOW_AHEAD = default_ahead
    assert first is not None
    return first, total, nbytes, ranged_bytes


def _run_loader(url: str, cache: str, shuffle: bool, workers: int, sparse: Any) -> Tuple[float, float, int, int]:
    """One cold epoch of ``WebLoader(..., num_workers=workers)``, batches of 64: as :func:`run_resumewds`
    (no range counter: the workers keep theirs)."""
    import resumewds as rw

    shutil.rmtree(cache, ignore_errors=True)
    old = os.environ.get("RESUMEWDS_SPARSE_PARTIALS")
    if sparse is not None:
        os.environ["RESUMEWDS_SPARSE_PARTIALS"] = "1" if sparse else "0"  # workers started by spawn too
    ds = rw.WebDataset(url + "manifest.json", cache_dir=cache, shuffle=shuffle, seed=1)
    loader = rw.WebLoader(ds, batch_size=BATCH, num_workers=workers, collate_fn=list)
    t0 = time.perf_counter()
    first = None
    nbytes = 0
    try:
        for batch in loader:
            if first is None:
                first = time.perf_counter() - t0
            nbytes += sum(len(s["bin"]) for s in batch)
    finally:
        total = time.perf_counter() - t0
        if old is None:
            os.environ.pop("RESUMEWDS_SPARSE_PARTIALS", None)
        else:
            os.environ["RESUMEWDS_SPARSE_PARTIALS"] = old
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
        p.add_argument("--window-ahead", default="-1",
                       help="resumewds.reading.WINDOW_AHEAD in MB (-1: the default); a list (e.g. 0,2): "
                            "one variant per value, interleaved"),
        p.add_argument("--no-whole", action="store_true", help="skip the whole-shard-reads variant"),
        p.add_argument("--sent", action="store_true",
                       help="throughput mode: also one cold resumewds epoch per order (shuffled, in order), "
                            "each with a server of its own: the bytes it sent / the data set's bytes"),
        p.add_argument("--sparse", action="store_true",
                       help="throughput mode: accepted for old command lines (sparse partial downloads are "
                            "the default; the resumewds-off variant runs without them)"),
        p.add_argument("--no-off", action="store_true",
                       help="throughput mode: skip the resumewds-off variant (sparse partial downloads off)"),
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
    aheads = [float(x) for x in str(args.window_ahead).split(",")]
    variants: Dict[str, Tuple[bool, int, float]] = {}  # name -> (ranged reads, prefetch threads, ahead)
    for t in threads:
        for a in aheads:
            tag = (f"t{t}" if len(threads) > 1 else "") + (f"a{a:g}" if len(aheads) > 1 else "")
            variants["resumewds" + ("@" + tag if tag else "")] = (True, t, a)
    if not args.no_whole:
        variants["resumewds-whole"] = (False, threads[0], aheads[0])
    if not args.no_off:  # the default (sparse partial downloads) against them off, interleaved
        variants["resumewds-off"] = (True, threads[0], aheads[0])
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
                # (shuffled, sparse partials: None = the default / False = off, DataLoader workers)
                epochs = [(sh, sp, 0) for sh in (True, False) for sp in (None, False)] + [(True, None, 2)]
                for shuffle, sparse, workers in epochs:
                    stats: Dict[str, Any] = {}
                    with served(os.path.join(d, f"d{mb}"), args.rate * 1e6, stats) as url:
                        out = run_resumewds(url, os.path.join(d, "cache"), True, limit=10 ** 9, shuffle=shuffle,
                                            sparse=sparse, workers=workers)
                    shutil.rmtree(os.path.join(d, "cache"), ignore_errors=True)
                    sent = sum(v for k, v in stats.get("bytes_by_path", {}).items() if k.endswith(".tar")) \
                        or int(stats.get("bytes_sent", 0))
                    order = (("shuffled" if shuffle else "in order") + (", sparse partials off" if sparse is False
                                                                        else "")
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
                            ranged, t, a = variants[name]
                            out = run_resumewds(url, cache, ranged, limit=10 ** 9, threads=t, ahead=a,
                                                sparse=False if name in ("resumewds-off", "resumewds-whole") else None)
                        res[name].append(out)
                        extra = f"  ranged {out[3] / 1e6:6.1f} MB ({100 * out[3] / data_bytes:4.1f}% extra)" \
                            if name in variants and variants[name][0] else ""
                        print(f"#   {name:16s} first batch {out[0]:6.2f}s  epoch {out[1]:6.2f}s  "
                              f"{out[2] / 1e6 / out[1]:7.1f} MB/s{extra}", flush=True)
                        shutil.rmtree(os.path.join(d, "cache"), ignore_errors=True)

            def med(name: str, i: int, res: Dict[str, List[Tuple[float, float, int, int]]] = res) -> float:
                return statistics.median(x[i] for x in res[name])

            def rate(name: str, res: Dict[str, List[Tuple[float, float, int, int]]] = res) -> float:
                return statistics.median(x[2] / x[1] for x in res[name])

            for name, (ranged, _t, _a) in variants.items():
                if not ranged:
                    continue
                first_ratio = med(name, 0) / med("webdataset", 0)
                thr_ratio = rate(name) / rate("webdataset")
                whole = (f"whole-shard reads {med('resumewds-whole', 0):.2f}s, " if "resumewds-whole" in res
                         else "")
                print(f"{mb} MB shards: first batch {name} {med(name, 0):.2f}s, {whole}"
                      f"webdataset {med('webdataset', 0):.2f}s  -> ratio {first_ratio:.2f}x (target <= 2)")
                whole = (f"whole-shard reads {rate('resumewds-whole') / 1e6:.1f} MB/s, " if "resumewds-whole" in res
                         else "")
                print(f"{mb} MB shards: cold throughput {name} {rate(name) / 1e6:.1f} MB/s, {whole}"
                      f"webdataset {rate('webdataset') / 1e6:.1f} MB/s  -> ratio {thr_ratio:.2f}x (target >= 3)")
                again = ("downloaded again by the whole-shard prefetch" if name == "resumewds-off"
                         else "kept in sparse partials, not downloaded again")
                print(f"{mb} MB shards: {name} fetched {med(name, 3) / 1e6:.1f} MB by range, {again}: "
                      f"{100 * med(name, 3) / data_bytes:.1f}% of the {data_bytes / 1e6:.0f} MB epoch")
                label = "" if len(variants) == 1 or name == "resumewds" else f" ({name})"
                rows += [(f"first batch / webdataset, {mb} MB{label}", first_ratio),
                         (f"cold throughput / webdataset, {mb} MB{label}", thr_ratio),
                         (f"extra bytes by range / epoch bytes, {mb} MB{label}", med(name, 3) / data_bytes)]
                ok = ok and first_ratio <= 2 and thr_ratio >= 3
            if "resumewds" in res and "resumewds-off" in res:  # the default against sparse partials off
                print(f"{mb} MB shards: resumewds / resumewds-off: first batch "
                      f"{med('resumewds', 0) / med('resumewds-off', 0):.2f}x (target <= 1), cold throughput "
                      f"{rate('resumewds') / rate('resumewds-off'):.2f}x (target >= 1)")
                rows += [(f"first batch / sparse partials off, {mb} MB", med("resumewds", 0) / med("resumewds-off", 0)),
                         (f"cold throughput / sparse partials off, {mb} MB",
                          rate("resumewds") / rate("resumewds-off"))]
    print("| metric | ratio |\n|---|---|")
    for k, v in rows:
        print(f"| {k} | {v:.2f}x |" if "extra" not in k else f"| {k} | {100 * v:.1f}% |")
    if args.sent_only:
        return 0
    print("PASS" if ok else "BELOW TARGET")
    return 0


if __name__ == "__main__":
    sys.exit(main())
