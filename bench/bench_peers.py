"""resumewds against its peers: the comparison table, regenerated in one run.

Systems, each reading data written by its own writer from the same samples
(``resumewds.synth`` 256x256 JPEGs + a class; 16,000 samples, ``--quick`` 2,000):

* ``resumewds``  - tar shards + manifest.json, ``rw.WebLoader(rw.WebDataset(..., shuffle=True), batch_size=64)``
* ``webdataset`` - the same tars, ``wds.WebLoader(wds.WebDataset(..., shardshuffle=True).shuffle(1000)
  ...batched(64), batch_size=None)`` (webdataset 1.0.2)
* ``streaming``  - MDS written by ``streaming.MDSWriter``, ``streaming.StreamingDataLoader(
  StreamingDataset(local=..., shuffle=True, batch_size=64), batch_size=64)`` (MosaicML Streaming 0.13)
* ``litdata``    - chunks written by ``litdata.optimize``, ``litdata.StreamingDataLoader(
  litdata.StreamingDataset(dir, shuffle=True), batch_size=64)`` (LitData 0.2.76)

Every system runs in its own subprocesses (imports and memory never mix); the
rounds are interleaved (the system order rotates each round) and each cell is
the median with min..max.  Rows: samples/s without decode at 0 and 2 workers,
CPU us/sample (process + reaped workers), JPEG decode (PIL -> uint8 HWC) at 1
and 2 workers, first batch after import (2 workers, cold page cache when run as
root, else warm only), resume at 90% vs 5% of an epoch (time to the first batch
after ``load_state_dict``, plus whether that batch is the one an uninterrupted
run delivered), peak PSS of a 2-worker decode pass (the process tree, polled, in a
child of its own: the polling takes CPU, so both decode rates come from the throughput child).

Run it with the peers' venv (see bench/README.md)::

    /work/peers-venv/bin/python bench/bench_peers.py --quick
    /work/peers-venv/bin/python bench/bench_peers.py [--repeats 3] [--decode-samples N]

A system whose package is missing is reported ``n/a`` and its targets are skipped.
"""

from __future__ import annotations

import io
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import warnings
from typing import Any, Dict, List, Optional

from _common import drop_caches

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
SYSTEMS = ("resumewds", "webdataset", "streaming", "litdata")
PEERS = SYSTEMS[1:]
BATCH = 64
SEED = 0


# =============================================================================
# child side: everything below up to "parent side" runs in a subprocess
# =============================================================================

def _import_streaming() -> Any:
    """Import MosaicML Streaming without its ``streaming.vision`` subpackage.

    ``streaming/__init__.py`` imports ``streaming.vision``, whose datasets
    import ``torchvision`` at import time; PyPI's torchvision wheel is a CUDA
    build whose ``_C.so`` needs ``libc10_cuda.so`` and fails beside a CPU torch
    ("operator torchvision::nms does not exist").  The bench uses only
    ``streaming.base`` (MDSWriter, StreamingDataset, StreamingDataLoader), so
    an empty placeholder module stands in for ``streaming.vision``.
    """
    import types

    try:
        import torchvision  # noqa: F401
    except Exception:
        sys.modules.setdefault("streaming.vision", types.ModuleType("streaming.vision"))
    import streaming

    return streaming


def _decode_jpg(b: bytes) -> Any:
    """The one decode every system uses: PIL, RGB, uint8 HWC (webdataset's "rgb8")."""
    import numpy as np
    from PIL import Image

    return np.asarray(Image.open(io.BytesIO(b)).convert("RGB"))


def _cpu() -> float:
    import resource

    a, b = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return a.ru_utime + a.ru_stime + b.ru_utime + b.ru_stime


def _tar_samples(tars: List[str]) -> List[Dict[str, Any]]:
    """(key, tar, offset, size, cls) of each sample's jpg, in shard order."""
    import tarfile

    out: Dict[str, Dict[str, Any]] = {}
    for t in tars:
        with tarfile.open(t) as tf:
            for m in tf:
                key, _, ext = m.name.partition(".")
                rec = out.setdefault(key, {"key": key})
                if ext == "jpg":
                    rec.update(tar=t, offset=m.offset_data, size=m.size)
                elif ext == "cls":
                    rec["cls"] = int(tf.extractfile(m).read())  # type: ignore[union-attr]
    return list(out.values())


def _read(rec: Dict[str, Any]) -> bytes:
    with open(rec["tar"], "rb") as f:
        f.seek(rec["offset"])
        return f.read(rec["size"])


def _litdata_item(rec: Dict[str, Any]) -> Dict[str, Any]:
    return {"key": rec["key"], "jpg": _read(rec), "cls": rec["cls"]}


def child_write(system: str, tars: List[str], out: str) -> Dict[str, Any]:
    recs = _tar_samples(tars)
    t0 = time.perf_counter()
    if system == "streaming":
        streaming = _import_streaming()
        with streaming.MDSWriter(out=out, columns={"key": "str", "jpg": "bytes", "cls": "int"}) as w:
            for r in recs:
                w.write(_litdata_item(r))
    elif system == "litdata":
        # its scratch folders (default /tmp/chunks, /tmp/data) inside the bench's temp dir
        os.environ["DATA_OPTIMIZER_CACHE_FOLDER"] = out + ".scratch/chunks"
        os.environ["DATA_OPTIMIZER_DATA_CACHE_FOLDER"] = out + ".scratch/data"
        import litdata

        litdata.optimize(fn=_litdata_item, inputs=recs, output_dir=out, chunk_bytes="64MB", num_workers=1,
                         mode="overwrite", reorder_files=False, verbose=False)
    else:
        raise ValueError(system)
    return {"samples": len(recs), "seconds": time.perf_counter() - t0}


class _Sys:
    """Builds one system's idiomatic shuffled loader over its own data."""

    def __init__(self, system: str, data: Dict[str, str], cache: str):
        self.system, self.data, self.cache = system, data, cache
        # A training script has torch imported before it builds its loader.  The peers import
        # torch in their own import; resumewds imports it lazily (resumewds.WebLoader, so that
        # its CLI starts without torch): import it here, outside every timed section.
        import torch  # noqa: F401

        if system == "resumewds":
            import resumewds as rw

            rw.WebLoader  # noqa: B018  (resolve the lazy import of resumewds.loader)
            self.mod = rw
        elif system == "webdataset":
            import webdataset as wds

            self.mod = wds
        elif system == "streaming":
            self.mod = _import_streaming()
            from streaming.base.util import clean_stale_shared_memory

            clean_stale_shared_memory()
        elif system == "litdata":
            import litdata

            self.mod = litdata

    def loader(self, workers: int, decode: bool) -> Any:
        s, m = self.system, self.mod
        if s == "resumewds":
            ds = m.WebDataset(self.data["manifest"], shuffle=True, seed=SEED, cache_dir=self.cache)
            ds = ds.decode("rgb8").to_tuple("jpg", "cls") if decode else ds.to_tuple("__key__", "jpg", "cls")
            return m.WebLoader(ds, batch_size=BATCH, num_workers=workers)
        if s == "webdataset":
            ds = m.WebDataset(self.data["pattern"], shardshuffle=True, seed=SEED, empty_check=False).shuffle(1000)
            ds = ds.decode("rgb8").to_tuple("jpg", "cls") if decode else ds.to_tuple("__key__", "jpg", "cls")
            return m.WebLoader(ds.batched(BATCH), batch_size=None, num_workers=workers)
        if s == "streaming":
            base = m.StreamingDataset

            class DS(base):  # type: ignore[misc, valid-type]
                def __getitem__(self, i: int) -> Any:
                    x = super().__getitem__(i)
                    return (_decode_jpg(x["jpg"]), x["cls"]) if decode else (x["key"], x["jpg"], x["cls"])

            ds = DS(local=self.data["streaming"], shuffle=True, shuffle_seed=SEED, batch_size=BATCH)
            return m.StreamingDataLoader(ds, batch_size=BATCH, num_workers=workers)
        if s == "litdata":
            base = m.StreamingDataset

            class LDS(base):  # type: ignore[misc, valid-type]
                def __getitem__(self, i: Any) -> Any:  # litdata gives a zero-copy memoryview: bytes to collate
                    x = super().__getitem__(i)
                    return (_decode_jpg(x["jpg"]), x["cls"]) if decode else (x["key"], bytes(x["jpg"]), x["cls"])

            ds = LDS(self.data["litdata"], shuffle=True, seed=SEED)
            return m.StreamingDataLoader(ds, batch_size=BATCH, num_workers=workers)
        raise ValueError(s)


def _count(batch: Any) -> int:
    return len(batch[-1])


def _pass(sy: _Sys, workers: int, decode: bool, limit: Optional[int]) -> Dict[str, float]:
    import gc

    gc.collect()
    c0, t0 = _cpu(), time.perf_counter()
    n = 0
    it = iter(sy.loader(workers, decode))
    for batch in it:
        n += _count(batch)
        if limit and n >= limit:
            break
    del it, batch
    gc.collect()  # shuts the workers down and reaps them: their CPU counts
    s, cpu = time.perf_counter() - t0, _cpu() - c0
    # A full collection costs ~85 ms in a child that has torch imported, garbage
    # or not (the heap walk): 5 us/sample of a 16,000-sample pass, the same for
    # every system, that is the harness's and no loader's.  The one above stays
    # timed (it reaps workers and frees what the loader left in cycles); the
    # cost of a second, idle one is taken off, for every system alike.
    g0, gc0 = time.perf_counter(), _cpu()
    gc.collect()
    gs, gcpu = time.perf_counter() - g0, _cpu() - gc0
    return {"n": n, "s": max(s - gs, 1e-9), "cpu": max(cpu - gcpu, 0.0), "gc_s": gs}


def child_tput(sy: _Sys, decode_limit: Optional[int]) -> Dict[str, Any]:
    # Both decode rates are measured here, alike; the peak PSS of a 2-worker
    # decode pass is taken in a child of its own ("decode2"), because the
    # parent's sampling of /proc/<pid>/smaps_rollup (a page-table walk of
    # every process of the tree, every 50 ms) takes CPU from the pass it
    # measures: its rate would not compare with the 1-worker one.
    return {"nodecode0": _pass(sy, 0, False, None), "nodecode2": _pass(sy, 2, False, None),
            "decode1": _pass(sy, 1, True, decode_limit), "decode2": _pass(sy, 2, True, decode_limit)}


def child_resume(sy: _Sys, total: int) -> Dict[str, Any]:
    """State after 5% / 90% of an epoch; time to the first batch of a fresh loader that loads it."""
    points = {"p05": max(1, int(total * 0.05) // BATCH), "p90": int(total * 0.90) // BATCH}
    states: Dict[str, Any] = {}
    expect: Dict[str, List[str]] = {}
    loader = sy.loader(2, False)
    for i, batch in enumerate(loader):
        for name, k in points.items():
            if i == k - 1:
                states[name] = loader.state_dict()
            if i == k:
                expect[name] = [str(x) for x in batch[0]]
    out: Dict[str, Any] = {}
    for name in points:
        t0 = time.perf_counter()
        loader = sy.loader(2, False)
        loader.load_state_dict(states[name])
        it = iter(loader)
        first = next(it)
        dt = time.perf_counter() - t0
        got = [str(x) for x in first[0]]
        exact = "exact" if got == expect[name] else ("same set" if sorted(got) == sorted(expect[name]) else "differs")
        del it
        out[name] = {"s": dt, "exact": exact}
    return out


def child_main(spec: Dict[str, Any]) -> Dict[str, Any]:
    warnings.filterwarnings("ignore")
    mode = spec["mode"]
    if mode == "write":
        return child_write(spec["system"], spec["tars"], spec["out"])
    sy = _Sys(spec["system"], spec["data"], spec["cache"])
    if mode == "tput":
        return child_tput(sy, spec.get("decode_limit"))
    if mode == "decode2":
        return _pass(sy, 2, True, spec.get("decode_limit"))
    if mode == "first":  # timed from after the imports to the first batch
        t0 = time.perf_counter()
        it = iter(sy.loader(2, False))
        next(it)
        dt = time.perf_counter() - t0
        del it
        return {"s": dt}
    if mode == "resume":
        return child_resume(sy, spec["total"])
    raise ValueError(mode)


# =============================================================================
# parent side: no torch, no peer imported here
# =============================================================================

def _warm(root: str) -> None:
    """Read every file under ``root`` once, 4 MB at a time, so that a system's
    timed child starts with its data in the page cache.  Without this the
    data a system last read a minute ago may be partly on disk: this
    machine's kernel runs DAMON's proactive reclaim (``kdamond``, scheme
    ``pageout`` for memory idle 12 x 5 s, up to 128 MB/s), which pages out
    the page cache of whichever system's data sat idle while the other
    systems ran, whatever memory is free: passes of one system then
    varied 2.5x between rounds.  The cold rows drop the cache on purpose."""
    for dirpath, _, files in os.walk(root):
        for name in files:
            try:
                with open(os.path.join(dirpath, name), "rb", buffering=0) as f:
                    while f.read(4 << 20):
                        pass
            except OSError:
                pass


def _children(pid: int) -> List[int]:
    out: List[int] = []
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children") as f:
                out.extend(int(x) for x in f.read().split())
    except OSError:
        pass
    return out


def _tree_pss_mb(root: int) -> float:
    total, todo = 0, [root]
    while todo:
        pid = todo.pop()
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                for line in f:
                    if line.startswith("Pss:"):
                        total += int(line.split()[1])
                        break
        except OSError:
            continue
        todo.extend(_children(pid))
    return total / 1024


def run_child(python: str, spec: Dict[str, Any], timeout: float, pss: bool = False) -> Dict[str, Any]:
    """Run one measurement in a fresh interpreter (own session: nothing survives it)."""
    env = _child_env()
    with tempfile.NamedTemporaryFile("r", suffix=".json", delete=False) as res:
        spec = dict(spec, result=res.name)
    p = subprocess.Popen([python, os.path.abspath(__file__), "--child", json.dumps(spec)], env=env,
                         stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    peak, deadline = 0.0, time.monotonic() + timeout
    try:
        while p.poll() is None:
            if time.monotonic() > deadline:
                raise TimeoutError(f"{spec['system']} {spec['mode']}: no result after {timeout:.0f}s")
            if pss:
                peak = max(peak, _tree_pss_mb(p.pid))
            time.sleep(0.05 if pss else 0.02)
        err = p.stderr.read().decode(errors="replace") if p.stderr else ""
        with open(res.name) as f:
            text = f.read()
        if p.returncode != 0 or not text:
            tail = err.strip().splitlines()[-1:] or [f"exit {p.returncode}"]
            raise RuntimeError(f"{spec['system']} {spec['mode']}: {tail[0]}")
        out = json.loads(text)
        if pss:
            out["pss_mb"] = peak
        return out
    finally:
        try:  # the child's whole session, always: DataLoader workers, streaming's helpers
            os.killpg(p.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            pass
        p.wait()
        if p.stderr:
            p.stderr.close()
        os.unlink(res.name)


def _child_env() -> Dict[str, str]:
    """The children's environment: the repository first on the path, and bytecode
    caching on (``PYTHONDONTWRITEBYTECODE`` off).  The peers are installed
    packages, whose ``.pyc`` files pip wrote at install time; resumewds runs from
    this checkout, and without written bytecode every child would compile each
    resumewds module it imports, most of them inside the timed first-batch
    window (the store, fetch and journal modules are imported lazily).  An
    installed resumewds has its ``.pyc`` like the peers; :func:`_compile_ours`
    writes them once before any measurement."""
    env = dict(os.environ, PYTHONPATH=ROOT + os.pathsep + os.environ.get("PYTHONPATH", ""),
               PYTHONWARNINGS="ignore", TOKENIZERS_PARALLELISM="false")
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    return env


def _compile_ours(python: str) -> None:
    """Write resumewds's bytecode (``__pycache__``, git-ignored), as ``pip install`` does."""
    subprocess.run([python, "-m", "compileall", "-q", os.path.join(ROOT, "resumewds")], env=_child_env(),
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=300, check=False)


def _available(python: str, system: str) -> Optional[str]:
    code = {"resumewds": "import resumewds", "webdataset": "import webdataset",
            "litdata": "import litdata",
            "streaming": "import sys; sys.argv=['x']; sys.path.insert(0, %r); import bench_peers as b; "
                         "b._import_streaming()" % HERE}[system]
    r = subprocess.run([python, "-c", code], capture_output=True, text=True, timeout=300,
                       env=dict(os.environ, PYTHONPATH=ROOT))
    return None if r.returncode == 0 else (r.stderr.strip().splitlines() or ["?"])[-1]


def _cell(vals: List[float], fmt: str) -> str:
    if not vals:
        return "n/a"
    if len(vals) == 1:
        return fmt.format(vals[0])
    return f"{fmt.format(statistics.median(vals))} ({fmt.format(min(vals))}..{fmt.format(max(vals))})"


def _med(vals: List[float]) -> Optional[float]:
    return statistics.median(vals) if vals else None


def main(argv: Optional[List[str]] = None) -> int:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--quick", action="store_true", help="2,000 samples, 2 rounds (a few minutes under load)")
    ap.add_argument("--samples", type=int, default=None, help="samples (default 16,000; quick 2,000)")
    ap.add_argument("--decode-samples", type=int, default=None,
                    help="samples per decode pass (default: all)")
    ap.add_argument("--repeats", type=int, default=None, help="interleaved rounds (default 3; quick 2)")
    ap.add_argument("--python", default=sys.executable, help="interpreter of the children (with the peers)")
    ap.add_argument("--systems", default=",".join(SYSTEMS), help="comma-separated subset")
    ap.add_argument("--tmp", default=None, help="parent directory of the generated data")
    ap.add_argument("--keep", action="store_true", help="keep the generated data")
    ap.add_argument("--child", default=None, help=argparse.SUPPRESS)
    args = ap.parse_args(argv)
    if args.child:
        spec = json.loads(args.child)
        out = child_main(spec)
        with open(spec["result"], "w") as f:
            json.dump(out, f)
        return 0

    sys.path.insert(0, ROOT)
    import shutil

    from resumewds import build_manifest, synth

    total = args.samples or (2000 if args.quick else 16000)
    repeats = args.repeats or (2 if args.quick else 3)
    per_shard = 500 if args.quick else 1000
    shards = max(1, total // per_shard)
    total = shards * per_shard
    dlimit = args.decode_samples
    systems = [s for s in args.systems.split(",") if s]
    d = tempfile.mkdtemp(prefix="rwbench-peers-", dir=args.tmp)
    t_start = time.perf_counter()
    try:
        missing = {}
        for s in systems:
            why = _available(args.python, s)
            if why:
                missing[s] = why
                print(f"# {s}: n/a ({why})", flush=True)
        live = [s for s in systems if s not in missing]
        _compile_ours(args.python)
        t0 = time.perf_counter()
        tar_dir = os.path.join(d, "tar")
        tars = synth.write_shards(tar_dir, shards=shards, samples=per_shard, images=True, image_side=256, seed=SEED)
        pattern = os.path.join(tar_dir, f"shard-{{000000..{shards - 1:06d}}}.tar")
        manifest = os.path.join(tar_dir, "manifest.json")
        build_manifest(pattern, manifest)
        mb = sum(os.path.getsize(p) for p in tars) / 1e6
        print(f"# {total} samples (256x256 JPEG + cls), {shards} tar shards, {mb:.0f} MB, "
              f"in {time.perf_counter() - t0:.1f}s under {d}", flush=True)
        data = {"pattern": pattern, "manifest": manifest}
        for s in ("streaming", "litdata"):
            if s in live:
                out = os.path.join(d, s)
                r = run_child(args.python, {"mode": "write", "system": s, "tars": tars, "out": out}, 900)
                data[s] = out
                print(f"# {s}: wrote {r['samples']} samples with its own writer in {r['seconds']:.1f}s", flush=True)
        # the writers just wrote ~2.4 GB: flush it now, so that no round runs
        # beside the kernel's background writeback of another system's data
        os.sync()
        base = {"data": data, "decode_limit": dlimit, "total": total}

        def spec(system: str, mode: str) -> Dict[str, Any]:
            return dict(base, system=system, mode=mode, cache=os.path.join(d, "cache-" + system))

        def warm(system: str) -> None:
            _warm(os.path.dirname(manifest) if system in ("resumewds", "webdataset") else data[system])

        res: Dict[str, Dict[str, List[Any]]] = {s: {} for s in live}

        def add(system: str, key: str, v: Any) -> None:
            res[system].setdefault(key, []).append(v)

        # ---- throughput and memory rounds, interleaved -----------------------------
        for r in range(repeats):
            order = live[r % len(live):] + live[:r % len(live)]
            for s in order:
                warm(s)
                t = run_child(args.python, spec(s, "tput"), 1800)
                for k in ("nodecode0", "nodecode2"):
                    if t[k]["n"] != total:
                        print(f"# WARNING {s} {k}: {t[k]['n']} samples in an epoch of {total}", flush=True)
                for k, v in t.items():
                    add(s, k + "_rate", v["n"] / v["s"])
                    add(s, k + "_cpu", v["cpu"] / v["n"] * 1e6)
                warm(s)
                t = run_child(args.python, spec(s, "decode2"), 1800, pss=True)
                add(s, "pss", t["pss_mb"])
            print("# round %d: %s" % (r + 1, "  ".join(
                f"{s}={res[s]['nodecode0_rate'][-1]:,.0f}/{res[s]['nodecode2_rate'][-1]:,.0f}/"
                f"{res[s]['decode1_rate'][-1]:,.0f}/{res[s]['decode2_rate'][-1]:,.0f}" for s in live)), flush=True)
        # ---- first batch after import: cold (caches dropped) then warm ----------------
        cold = os.geteuid() == 0 and drop_caches()
        if not cold:
            print("# first batch: cannot drop the page cache (not root): warm only", flush=True)
        for r in range(repeats):
            order = live[r % len(live):] + live[:r % len(live)]
            for s in order:
                if cold:
                    drop_caches()
                    add(s, "first_cold", run_child(args.python, spec(s, "first"), 600)["s"])
                warm(s)
                add(s, "first_warm", run_child(args.python, spec(s, "first"), 600)["s"])
        # ---- resume ----------------------------------------------------------------------
        for s in live:
            if s == "webdataset":
                continue
            try:
                warm(s)
                t = run_child(args.python, spec(s, "resume"), 900)
                add(s, "resume", t["p90"]["s"] / t["p05"]["s"])
                add(s, "resume_exact", f"{t['p05']['exact']}/{t['p90']['exact']}")
                print(f"# resume {s}: 5% {t['p05']['s']:.3f}s ({t['p05']['exact']}), "
                      f"90% {t['p90']['s']:.3f}s ({t['p90']['exact']})", flush=True)
            except (RuntimeError, TimeoutError) as e:
                print(f"# resume {s}: failed: {e}", flush=True)
        failed = report(res, systems, missing, cold, args, total, repeats)
        print(f"# total {time.perf_counter() - t_start:.0f}s on {os.cpu_count()} cores, "
              f"load average {os.getloadavg()[0]:.1f} at the end", flush=True)
        return 1 if failed else 0
    finally:
        if args.keep:
            print(f"(kept {d})")
        else:
            shutil.rmtree(d, ignore_errors=True)


# (row key, title, format, higher is better)
ROWS = [
    ("nodecode0_rate", "no decode, 0 workers, samples/s", "{:,.0f}", True),
    ("nodecode2_rate", "no decode, 2 workers, samples/s", "{:,.0f}", True),
    ("nodecode0_cpu", "CPU us/sample, no decode, 0 workers", "{:,.1f}", False),
    ("nodecode2_cpu", "CPU us/sample, no decode, 2 workers", "{:,.1f}", False),
    ("decode1_rate", "JPEG decode (PIL, uint8), 1 worker, samples/s", "{:,.0f}", True),
    ("decode2_rate", "JPEG decode, 2 workers, samples/s", "{:,.0f}", True),
    ("decode1_cpu", "decode CPU us/sample, 1 worker", "{:,.0f}", False),
    ("decode2_cpu", "decode CPU us/sample, 2 workers", "{:,.0f}", False),
    ("first_cold", "first batch after import, cold page cache, 2 workers, s", "{:.3f}", False),
    ("first_warm", "first batch after import, warm page cache, 2 workers, s", "{:.3f}", False),
    ("resume", "resume: first batch at 90% / at 5% (O(1) ~ 1)", "{:.2f}", False),
    ("pss", "peak PSS, 2-worker decode pass, MB", "{:,.0f}", False),
]


def report(res: Dict[str, Dict[str, List[Any]]], systems: List[str], missing: Dict[str, str], cold: bool,
           args: Any, total: int, repeats: int) -> int:
    cols = ["figure"] + systems + [f"ours/{p}" for p in systems if p != "resumewds"]
    rows = [cols]
    ours = res.get("resumewds", {})
    for key, title, fmt, _hib in ROWS:
        row = [title]
        for s in systems:
            row.append("n/a" if s in missing else ("-" if not res[s].get(key) else _cell(res[s][key], fmt)))
        for p in systems:
            if p == "resumewds":
                continue
            a, b = _med(ours.get(key, [])), _med(res.get(p, {}).get(key, []))
            row.append(f"{a / b:.2f}x" if a and b else "-")
        rows.append(row)
    ex = ["resume exact (next batch = uninterrupted run's), 5%/90%"]
    for s in systems:
        ex.append(",".join(res.get(s, {}).get("resume_exact", [])) or "-")
    rows.append(ex + [""] * (len(cols) - len(ex)))
    w = [max(len(r[i]) for r in rows) for i in range(len(cols))]
    print()
    print(f"== bench_peers{' --quick' if args.quick else ''}: {total} samples, batch {BATCH}, "
          f"shuffled, {repeats} interleaved rounds, median (min..max); on a loaded shared machine ==")
    for i, r in enumerate(rows):
        print("| " + " | ".join(c.ljust(w[j]) for j, c in enumerate(r)) + " |")
        if i == 0:
            print("|" + "|".join("-" * (x + 2) for x in w) + "|")
    if not cold:
        print("(first batch: warm page cache only, the cold row needs root to drop the page cache)")

    # ---- targets ---------------------------------------------------------------
    def m(s: str, k: str) -> Optional[float]:
        return _med(res.get(s, {}).get(k, []))

    checks: List[tuple] = []
    peers = [p for p in PEERS if p in res]
    for key, title, _fmt, hib in ROWS:
        if key in ("resume",):
            continue
        a = m("resumewds", key)
        vals = [(m(p, key), p) for p in peers if m(p, key)]
        if a is None or not vals:
            continue
        best, who = (max if hib else min)(vals)
        ratio = a / best
        checks.append((f"{title}: ours / best peer ({who})", ratio, ">= 1.00x" if hib else "<= 1.00x",
                       ratio >= 1 if hib else ratio <= 1))
    if ours:
        c0, c2 = m("resumewds", "nodecode0_cpu"), m("resumewds", "nodecode2_cpu")
        if c0 and c2:
            checks.append(("item 3: our CPU/sample 2 workers / 0 workers", c2 / c0, "<= 1.30x", c2 / c0 <= 1.3))
        d1, d2 = m("resumewds", "decode1_rate"), m("resumewds", "decode2_rate")
        if d1 and d2:
            checks.append(("item 3: our decode 2 workers / 1 worker", d2 / d1, ">= 1.90x", d2 / d1 >= 1.9))
        f, fw = m("resumewds", "first_cold" if cold else "first_warm"), m("webdataset", "first_cold" if cold
                                                                           else "first_warm")
        if f and fw:
            checks.append((f"item 5: first batch ({'cold' if cold else 'warm'}) / webdataset", f / fw,
                           "<= 1.50x", f / fw <= 1.5))
        rr = m("resumewds", "resume")
        if rr:
            checks.append(("item 6: resume 90%/5% (O(1))", rr, "<= 1.50x", rr <= 1.5))
        exact = res["resumewds"].get("resume_exact", [])
        if exact:
            checks.append(("item 6: resume exact at 5% and 90%", 0.0, "exact/exact", exact == ["exact/exact"]))
        p = m("resumewds", "pss")
        if p:
            checks.append(("item 6: peak PSS MB vs the 633 MB target", p / 633, "<= 1.00x", p <= 633))
    print()
    wt = max(len(c[0]) for c in checks) if checks else 10
    failed = 0
    for name, ratio, target, ok in checks:
        r = f"{ratio:.2f}x" if ratio else ""
        print(f"{name.ljust(wt)}  {r:>7}  {target:>11}  {'PASS' if ok else 'FAIL'}")
        failed += 0 if ok else 1
    print(f"{len(checks) - failed} PASS, {failed} FAIL")
    return failed


if __name__ == "__main__":
    sys.exit(main())
