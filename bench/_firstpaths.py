"""Time to the first sample and the first batch, from the user's first call, on every public path.

Each run is a fresh Python process (a restart): the child imports torch and
the system under test (resumewds *or* webdataset 1.0.2, never both), then
starts the clock *before* constructing the data set / loader and stops it
at the first sample and at the first batch (64 samples).  What the library
imports lazily on its first fetch (``requests``...), the threads it starts,
the manifest fetch, the store and session, worker start: all inside the
timed region.  Cold every run: a fresh cache directory and, over http, a
fresh FaultServer process (rate-limited per connection); from a local disk,
the shard files' pages are dropped with ``posix_fadvise(DONTNEED)`` first.

Paths (resumewds vs webdataset's equivalent, same process layout):

* ``iter``: ``rw.WebDataset(manifest, seed=1, shuffle=True, cache_dir=c)``
  vs ``wds.WebDataset(urls, shardshuffle=8, seed=1).shuffle(1000)``,
  iterated directly (first batch: the 64th sample);
* ``webloader0`` / ``webloader2``: ``rw.WebLoader(ds, batch_size=64,
  num_workers=0/2)`` vs ``wds.WebLoader(wds_ds.batched(64), batch_size=None,
  num_workers=0/2)``;
* ``pipeline``: ``DataPipeline(SimpleShardList(urls), shuffle(100),
  split_by_worker, tarfile_to_samples(), shuffle(1000))`` on both (the
  README's pipeline without decode/map; iterated directly);
* ``dataloader2``: ``torch.utils.data.DataLoader(ds, batch_size=64,
  num_workers=2, collate_fn=list)`` over each data set (``collate_fn=list``:
  the raw samples hold bytes, which ``default_collate`` refuses);
* ``stateful2``: torchdata's ``StatefulDataLoader`` the same way.

For a loader, the first sample arrives with the first batch (same time).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from typing import Any, Dict, List, Optional

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)

PATHS = ("iter", "webloader0", "webloader2", "pipeline", "dataloader2", "stateful2")
BATCH = 64


def drop_file_pages(paths: List[str]) -> None:
    """Drop the page cache of ``paths`` (``POSIX_FADV_DONTNEED``; the files must be clean: sync first)."""
    for p in paths:
        fd = os.open(p, os.O_RDONLY)
        try:
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        finally:
            os.close(fd)


def _collate(batch: List[Any]) -> List[Any]:
    return batch


def build(system: str, path: str, spec: Dict[str, Any]) -> Any:
    """The iterable the user builds for ``path`` (construction is timed by the caller)."""
    urls: List[str] = spec["urls"]
    workers = 2 if path.endswith("2") else 0
    if system == "rw":
        import resumewds as rw

        if path == "pipeline":
            return rw.DataPipeline(rw.SimpleShardList(urls), rw.shuffle(100), rw.split_by_worker,
                                   rw.tarfile_to_samples(), rw.shuffle(1000))
        ds = rw.WebDataset(spec["manifest"], seed=1, shuffle=True, cache_dir=spec["cache"])
        if path == "iter":
            return ds
        if path.startswith("webloader"):
            return rw.WebLoader(ds, batch_size=BATCH, num_workers=workers)
    else:
        import webdataset as wds

        if path == "pipeline":
            return wds.DataPipeline(wds.SimpleShardList(urls), wds.shuffle(100), wds.split_by_worker,
                                    wds.tarfile_to_samples(), wds.shuffle(1000))
        ds = wds.WebDataset(urls, shardshuffle=8, seed=1, empty_check=False).shuffle(1000)
        if path == "iter":
            return ds
        if path.startswith("webloader"):
            return wds.WebLoader(ds.batched(BATCH, collation_fn=None), batch_size=None, num_workers=workers)
    if path == "dataloader2":
        from torch.utils.data import DataLoader

        return DataLoader(ds, batch_size=BATCH, num_workers=2, collate_fn=_collate)
    if path == "stateful2":
        from torchdata.stateful_dataloader import StatefulDataLoader

        return StatefulDataLoader(ds, batch_size=BATCH, num_workers=2, collate_fn=_collate)
    raise ValueError(f"unknown path {path!r}")


def _payload(x: Any) -> int:
    """Payload bytes of a sample, a list of samples or a collated batch (a dict of lists)."""
    if isinstance(x, dict):
        b = x.get("bin", b"")
        return len(b) if isinstance(b, (bytes, bytearray)) else sum(len(y) for y in b)
    return sum(_payload(s) for s in x)


def _count(x: Any) -> int:
    """Samples in a batch: a list of samples or a collated batch (a dict of lists)."""
    if isinstance(x, dict):
        return len(x["__key__"])
    return len(x)


def child(spec: Dict[str, Any]) -> Dict[str, Any]:
    """One cold run in this (fresh) process; returns the timings (seconds from the first call)."""
    import torch  # noqa: F401  (both systems import it: outside the timed region)

    t_imp = time.perf_counter()
    if spec["system"] == "rw":
        import resumewds  # noqa: F401
    else:
        import webdataset  # noqa: F401
    if spec["path"] == "stateful2":
        import torchdata.stateful_dataloader  # noqa: F401
    for mod in spec.get("pre_import") or ():  # what-if: modules imported before the clock starts
        __import__(mod)
    out: Dict[str, Any] = {"import": time.perf_counter() - t_imp}
    if spec["system"] == "rw" and spec["path"] in ("pipeline", "dataloader2", "stateful2"):
        os.environ["RESUMEWDS_CACHE_DIR"] = spec["cache"]
    prof = None
    if spec.get("profile"):
        import cProfile

        prof = cProfile.Profile()
        prof.enable()
    t0 = time.perf_counter()
    obj = build(spec["system"], spec["path"], spec)
    out["construct"] = time.perf_counter() - t0
    it = iter(obj)
    out["iter"] = time.perf_counter() - t0
    limit = spec.get("limit")
    loader = spec["path"] not in ("iter", "pipeline")
    n = 0
    nbytes = 0
    for x in it:
        if n == 0:
            out["first_sample"] = time.perf_counter() - t0
            if prof is not None:
                prof.disable()
                prof.dump_stats(spec["profile"])
                prof = None
        n += _count(x) if loader else 1
        nbytes += _payload(x) if loader else _payload([x])
        if "first_batch" not in out and n >= BATCH:
            out["first_batch"] = time.perf_counter() - t0
        if limit is not None and n >= limit:
            break
    out["total"] = time.perf_counter() - t0
    out["samples"] = n
    out["payload"] = nbytes
    close = getattr(obj, "close", None)
    if callable(close) and spec["system"] == "rw":
        close()
    del it
    return out


def compile_sources() -> None:
    """Write the .pyc files of this checkout once (a shell with PYTHONDONTWRITEBYTECODE=1 would
    otherwise make every child compile resumewds from source inside the timed region, while
    webdataset, installed, imports from its .pyc files)."""
    import compileall

    compileall.compile_dir(os.path.join(ROOT, "resumewds"), quiet=1)
    compileall.compile_dir(HERE, quiet=1, maxlevels=0)


def run_child(spec: Dict[str, Any], timeout: float = 900) -> Dict[str, Any]:
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""))
    env.pop("RESUMEWDS_CACHE_DIR", None)
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # users import from .pyc files: so do the children
    proc = subprocess.run([sys.executable, os.path.join(HERE, "_firstpaths.py"), json.dumps(spec)],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=timeout)
    for line in reversed(proc.stdout.strip().splitlines()):
        if line.startswith("{"):
            return dict(json.loads(line))
    raise RuntimeError(f"child {spec['system']}/{spec['path']} failed (rc {proc.returncode}):\n"
                       f"{proc.stderr[-3000:]}")


def profile_report(path: str, top: int = 25) -> str:
    """The ``top`` functions by cumulative time of a cProfile dump, as text."""
    import io
    import pstats

    buf = io.StringIO()
    st = pstats.Stats(path, stream=buf)
    st.sort_stats("cumulative").print_stats(top)
    return buf.getvalue()


def median(xs: List[float]) -> Optional[float]:
    import statistics

    return statistics.median(xs) if xs else None



def run_paths(args: Any, d: str, make_data: Any) -> int:
    """The driver: every (size, source, path), resumewds and webdataset interleaved, medians."""

    from _common import Table, machine_note

    sizes = [int(x) for x in (args.sizes or ("32" if args.quick else "32,256")).split(",")]
    paths = [p for p in (args.paths or ",".join(PATHS)).split(",") if p]
    sources = [s for s in args.sources.split(",") if s]
    repeats = args.repeats or (1 if args.quick else 3)
    count = {32: 8, 256: 2}
    print(machine_note(), flush=True)
    compile_sources()
    print("# the machine is shared and loaded: absolute seconds are noisy; each row's two systems run "
          "back to back (order alternating), the figures are medians", flush=True)
    table = Table("first sample from the user's first call (cold), resumewds vs webdataset 1.0.2")
    bytes_rows: List[Any] = []
    summary: List[str] = []
    for mb in sizes:
        n = count.get(mb, 4)
        root = os.path.join(d, f"d{mb}")
        t0 = time.perf_counter()
        names, manifest = make_data(root, n, mb, sample=args.sample_kb * 1000)
        os.sync()
        files = [os.path.join(root, x) for x in names] + [manifest]
        data_bytes = sum(os.path.getsize(f) for f in files[:-1])
        print(f"# {n} shards x {mb} MB (samples of ~{args.sample_kb} kB), generated in "
              f"{time.perf_counter() - t0:.1f}s; http: FaultServer process at {args.rate:g} MB/s per "
              f"connection; local: pages dropped (posix_fadvise DONTNEED) before each run", flush=True)
        res: Dict[Any, List[Dict[str, Any]]] = {}
        k = 0
        for r in range(repeats):
            for src in sources:
                for path in paths:
                    k += 1
                    systems = ["rw", "wds"] + (["rw+"] if args.pre_import else [])
                    for system in (systems if k % 2 == r % 2 else systems[::-1]):
                        pre = args.pre_import.split(",") if system == "rw+" else None
                        out = one_run(system.rstrip("+"), path, src, root, names, d, args.rate, limit=BATCH,
                                      pre_import=pre)
                        res.setdefault((src, path, system), []).append(out)
                        print(f"#   {mb:3d} MB {src:5s} {path:11s} {system:3s} first sample "
                              f"{out['first_sample']:7.3f}s  first batch {out['first_batch']:7.3f}s  "
                              f"(construct {out['construct'] * 1e3:6.0f} ms, iter() "
                              f"{out['iter'] * 1e3:6.0f} ms; import {out['import'] * 1e3:5.0f} ms "
                              f"untimed)", flush=True)
        nbytes: Dict[str, float] = {}
        if "http" in sources and not args.no_bytes:
            for path in paths:  # a cold epoch per path, its own server: the bytes it sent
                out = one_run("rw", path, "http", root, names, d, args.rate, limit=None)
                nbytes[path] = out["bytes_sent"] / data_bytes
                print(f"#   {mb:3d} MB http  {path:11s} rw  cold epoch: {out['samples']} samples, "
                      f"{out['bytes_sent'] / 1e6:.1f} MB sent for {data_bytes / 1e6:.1f} MB of shards "
                      f"({out['requests']} requests) in {out['total']:.1f}s", flush=True)
        for src in sources:
            target = 1.0 if src == "http" else 1.5
            for path in paths:
                a, b = res[(src, path, "rw")], res[(src, path, "wds")]
                fs_a = median([x["first_sample"] for x in a]) or 0.0
                fs_b = median([x["first_sample"] for x in b]) or 0.0
                fb_a = median([x["first_batch"] for x in a]) or 0.0
                fb_b = median([x["first_batch"] for x in b]) or 0.0
                table.add(f"first sample, {path}, {mb} MB, {src}", fs_a, fs_b, target=target,
                          higher_is_better=False, fmt="{:.2f}", unit="s")
                table.add(f"first batch, {path}, {mb} MB, {src}", fb_a, fb_b, fmt="{:.2f}", unit="s")
                # what the user waits from ``import`` on: webdataset loads its read path there, resumewds
                # at the first call (so the first sample above holds imports that webdataset's does not)
                ia = median([x["import"] + x["first_sample"] for x in a]) or 0.0
                ib = median([x["import"] + x["first_sample"] for x in b]) or 0.0
                table.add(f"import + first sample, {path}, {mb} MB, {src}", ia, ib, fmt="{:.3f}", unit="s")
                if args.pre_import:
                    fs_c = median([x["first_sample"] for x in res[(src, path, "rw+")]]) or 0.0
                    table.add(f"first sample with {args.pre_import} imported first, {path}, {mb} MB, {src}",
                              fs_c, fs_b, fmt="{:.2f}", unit="s")
                br = nbytes.get(path) if src == "http" else None
                summary.append(f"| {path} | {mb} MB | {src} | {fs_a:.2f}s | {fs_b:.2f}s | {fs_a / fs_b:.2f}x "
                               f"(<= {target:g}x) | {fb_a:.2f}s | {fb_b:.2f}s | {fb_a / fb_b:.2f}x | "
                               + ("-" if br is None else f"{br:.3f}x (<= 1.02x)") + " |")
                if br is not None:
                    bytes_rows.append((f"bytes sent / data bytes, {path}, {mb} MB, http", br))
    for name, br in bytes_rows:
        table.add(name, br, None, ratio=br, target=1.02, higher_is_better=False, fmt="{:.3f}",
                  unit="x")
    table.print()
    print("\n| path | shards | source | rw first sample | wds first sample | ratio (target) | "
          "rw first batch | wds first batch | ratio | bytes sent / data bytes (rw, cold epoch) |")
    print("|---|---|---|---|---|---|---|---|---|---|")
    print("\n".join(summary))
    return 0


def one_run(system: str, path: str, src: str, root: str, names: List[str], d: str, rate: float,
            limit: Optional[int], profile: Optional[str] = None,
            pre_import: Optional[List[str]] = None) -> Dict[str, Any]:
    """One cold run in a fresh process: fresh cache, fresh server (http) or dropped pages (local)."""
    import shutil

    from _common import ServerProc

    cache = os.path.join(d, "cache")
    shutil.rmtree(cache, ignore_errors=True)
    spec: Dict[str, Any] = {"system": system, "path": path, "cache": cache, "limit": limit,
                            "profile": profile, "pre_import": pre_import or []}
    if src == "http":
        srv = ServerProc(root, bytes_per_second=rate * 1e6).start()
        base = srv.url.rstrip("/") + "/"
    else:
        srv = None
        files = [os.path.join(root, x) for x in names] + [os.path.join(root, "manifest.json")]
        drop_file_pages(files)
        base = root + "/"
    spec["urls"] = [base + x for x in names]
    spec["manifest"] = base + "manifest.json"
    try:
        out = run_child(spec)
    finally:
        if srv is not None:
            srv.stop()
        shutil.rmtree(cache, ignore_errors=True)
    if srv is not None:
        out["bytes_sent"] = int(srv.stats.get("bytes_sent", 0))  # type: ignore[call-overload]
        reqs = srv.stats.get("requests", {})
        out["requests"] = sum(reqs.values()) if isinstance(reqs, dict) else reqs
    return out


def run_profiles(args: Any, d: str, make_data: Any) -> int:
    """cProfile of the first-sample region of each resumewds path (main process only)."""
    sizes = [int(x) for x in (args.sizes or "32").split(",")]
    paths = [p for p in (args.paths or ",".join(PATHS)).split(",") if p]
    sources = [s for s in args.sources.split(",") if s]
    count = {32: 8, 256: 2}
    compile_sources()
    for mb in sizes:
        root = os.path.join(d, f"d{mb}")
        names, _ = make_data(root, count.get(mb, 4), mb, sample=args.sample_kb * 1000)
        os.sync()
        for src in sources:
            for path in paths:
                prof = os.path.join(d, f"prof-{mb}-{src}-{path}.out")
                out = one_run("rw", path, src, root, names, d, args.rate, limit=BATCH, profile=prof)
                print(f"\n===== rw {path} {mb} MB {src}: first sample {out['first_sample']:.2f}s "
                      f"(construct {out['construct'] * 1e3:.0f} ms, iter() {out['iter'] * 1e3:.0f} ms) =====")
                print(profile_report(prof, args.profile_top), flush=True)
    return 0


if __name__ == "__main__":
    print(json.dumps(child(json.loads(sys.argv[1]))), flush=True)
    sys.exit(0)
