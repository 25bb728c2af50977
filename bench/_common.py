"""Shared helpers for the benchmarks: data generation, interleaved timing, tables.

The machine the benches run on is shared and noisy, so no bench reports an
absolute number as its verdict: every metric is a *ratio* against a peer
measured in the same run, with the two sides interleaved (A B A B ...) and
the best (or median) of several repeats taken.
"""

from __future__ import annotations

import argparse
import contextlib
import gc
import os
import shutil
import statistics
import sys
import tempfile
import time
from typing import Callable, Dict, Iterator, List, Optional, Sequence, Tuple

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
if ROOT not in sys.path:
    sys.path.insert(0, ROOT)


def parse_args(description: str, argv: Optional[Sequence[str]] = None,
               extra: Optional[Callable[[argparse.ArgumentParser], None]] = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=description)
    p.add_argument("--quick", action="store_true", help="small version (< 60 s)")
    p.add_argument("--repeats", type=int, default=None, help="interleaved repeats per measurement")
    p.add_argument("--keep", action="store_true", help="keep the temp dir (path is printed)")
    p.add_argument("--tmp", default=None, help="parent directory for generated data")
    if extra:
        extra(p)
    return p.parse_args(argv)


@contextlib.contextmanager
def workdir(args: argparse.Namespace, name: str) -> Iterator[str]:
    d = tempfile.mkdtemp(prefix=f"rwbench-{name}-", dir=args.tmp)
    try:
        yield d
    finally:
        if args.keep:
            print(f"(kept {d})")
        else:
            shutil.rmtree(d, ignore_errors=True)


def make_shards(directory: str, shards: int, samples: int, *, size_range: Tuple[int, int] = (5000, 50000),
                images: bool = False, image_side: int = 256, seed: int = 0) -> Tuple[List[str], str, str]:
    """Write shards + an indexed manifest.json; return (paths, brace pattern, manifest path)."""
    from resumewds import build_manifest, synth

    t0 = time.perf_counter()
    paths = synth.write_shards(directory, shards=shards, samples=samples, size_range=size_range,
                               seed=seed, images=images, image_side=image_side)
    pattern = os.path.join(directory, f"shard-{{000000..{shards - 1:06d}}}.tar")
    manifest = os.path.join(directory, "manifest.json")
    build_manifest(pattern, manifest)
    nbytes = sum(os.path.getsize(p) for p in paths)
    print(f"# generated {shards} shards x {samples} samples ({nbytes / 1e6:.0f} MB"
          f"{', JPEG %dx%d' % (image_side, image_side) if images else ''}) in "
          f"{time.perf_counter() - t0:.1f}s under {directory}", flush=True)
    return paths, pattern, manifest


def cpu_seconds() -> float:
    """CPU time of this process plus its reaped children (DataLoader workers)."""
    import resource

    a, b = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return a.ru_utime + a.ru_stime + b.ru_utime + b.ru_stime


def timed(fn: Callable[[], int]) -> Tuple[float, int, float]:
    """Run ``fn`` (which returns an item count); return (seconds, count, cpu seconds).

    CPU time (this process + reaped children) is much less sensitive to other
    tenants of the machine than wall time: it shows the work done per item.
    """
    gc.collect()
    c0 = cpu_seconds()
    t0 = time.perf_counter()
    n = fn()
    if isinstance(n, tuple):  # fn timed its own hot loop: (count, seconds, cpu seconds)
        return n[1], n[0], n[2]
    return time.perf_counter() - t0, n, cpu_seconds() - c0


class Clock:
    """For fns that time only their hot loop: ``with Clock() as c: ...; return c.result(n)``."""

    def __enter__(self) -> Clock:
        self.c0 = cpu_seconds()
        self.t0 = time.perf_counter()
        return self

    def __exit__(self, *exc: object) -> None:
        self.dt = time.perf_counter() - self.t0
        self.dc = cpu_seconds() - self.c0

    def result(self, n: int) -> Tuple[int, float, float]:
        return n, self.dt, self.dc


def interleave(fns: Dict[str, Callable[[], int]], repeats: int, warmup: bool = True,
               verbose: bool = True) -> Dict[str, List[Tuple[float, int, float]]]:
    """Run every fn ``repeats`` times, interleaved (rotating the order each round).

    Returns ``{name: [(seconds, count), ...]}``.
    """
    names = list(fns)
    out: Dict[str, List[Tuple[float, int, float]]] = {k: [] for k in names}
    if warmup:
        for k in names:
            fns[k]()
    for r in range(repeats):
        order = names[r % len(names):] + names[:r % len(names)]
        for k in order:
            out[k].append(timed(fns[k]))
        if verbose:
            print("#  round %d: %s" % (r + 1, "  ".join(
                f"{k}={out[k][-1][1] / out[k][-1][0]:,.0f}/s" for k in names)), flush=True)
    return out


Runs = List[Tuple[float, int, float]]


def best_rate(runs: Runs) -> float:
    return max(r[1] / r[0] for r in runs)


def median_rate(runs: Runs) -> float:
    return statistics.median(r[1] / r[0] for r in runs)


def best_time(runs: Runs) -> float:
    return min(r[0] for r in runs)


def median_time(runs: Runs) -> float:
    return statistics.median(r[0] for r in runs)


def paired_ratio(a: Runs, b: Runs) -> float:
    """Median over rounds of rate(a) / rate(b), each round's a and b adjacent in time
    (slow drifts in the machine's load cancel out)."""
    return statistics.median((x[1] / x[0]) / (y[1] / y[0]) for x, y in zip(a, b))


def cpu_per_item_us(runs: Runs) -> float:
    """Median CPU microseconds per item."""
    return statistics.median(r[2] / r[1] * 1e6 for r in runs)


class Table:
    """metric | resumewds | peer | ratio | target | result."""

    def __init__(self, title: str):
        self.title = title
        self.rows: List[Tuple[str, str, str, str, str, str]] = []
        self.failed = 0

    def add(self, metric: str, ours: float, peer: Optional[float], *, target: Optional[float] = None,
            higher_is_better: bool = True, fmt: str = "{:,.0f}", unit: str = "",
            ratio: Optional[float] = None, target_text: Optional[str] = None) -> Optional[bool]:
        if ratio is None and peer:
            ratio = ours / peer
        ok: Optional[bool] = None
        if target is not None and ratio is not None:
            ok = ratio >= target if higher_is_better else ratio <= target
        if target_text is None:
            target_text = "-" if target is None else (f">= {target:g}x" if higher_is_better else f"<= {target:g}x")
        self.rows.append((metric, fmt.format(ours) + unit, "-" if peer is None else fmt.format(peer) + unit,
                          "-" if ratio is None else f"{ratio:.3f}x", target_text,
                          "info" if ok is None else ("PASS" if ok else "FAIL")))
        if ok is False:
            self.failed += 1
        return ok

    def add_raw(self, metric: str, ours: str, peer: str, ratio: str, target: str, ok: Optional[bool]) -> None:
        self.rows.append((metric, ours, peer, ratio, target, "info" if ok is None else ("PASS" if ok else "FAIL")))
        if ok is False:
            self.failed += 1

    def print(self) -> None:
        head = ("metric", "resumewds", "peer", "ratio", "target", "result")
        rows = [head] + self.rows
        w = [max(len(r[i]) for r in rows) for i in range(len(head))]
        line = "+-" + "-+-".join("-" * x for x in w) + "-+"
        print()
        print(f"== {self.title} ==")
        print(line)
        for i, r in enumerate(rows):
            print("| " + " | ".join(c.ljust(w[j]) if j == 0 else c.rjust(w[j]) for j, c in enumerate(r)) + " |")
            if i == 0:
                print(line)
        print(line)
        print(f"{len(self.rows) - self.failed - sum(1 for r in self.rows if r[5] == 'info')} passed, "
              f"{self.failed} failed", flush=True)


def machine_note() -> str:
    import platform

    return (f"# python {platform.python_version()}, {os.cpu_count()} cpus, "
            f"load {os.getloadavg()[0]:.2f} (shared machine: ratios only)")


class ServerProc:
    """``python -m chaos.faultserver`` in its own process (so that the server's
    Python threads do not compete for the benchmarked process's GIL).

    Example:
        with ServerProc(root, faults="mixed:0.1", seed=3) as srv:
            srv.url   # "http://127.0.0.1:PORT/"
        srv.stats     # {"bytes_sent", "requests", "faults"} after stop
    """

    def __init__(self, root: str, **opts: object):
        self.root = root
        self.opts = opts
        self.proc = None
        self.url = ""
        self.stats: Dict[str, object] = {}

    def start(self) -> ServerProc:
        import subprocess

        cmd = [sys.executable, "-m", "chaos.faultserver", self.root, "--port", "0"]
        for k, v in self.opts.items():
            if v is not None and v != "":
                cmd += ["--" + k.replace("_", "-"), str(v)]
        env = dict(os.environ)
        env["PYTHONPATH"] = ROOT + os.pathsep + env.get("PYTHONPATH", "")
        self.proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, text=True)
        line = self.proc.stdout.readline().strip()
        if not line.startswith("http://"):
            self.proc.kill()
            raise RuntimeError(f"fault server did not start: {line!r} {self.proc.stderr.read()}")
        self.url = line
        return self

    def stop(self) -> None:
        import json
        import signal

        if self.proc is None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            _, err = self.proc.communicate(timeout=15)
        except Exception:
            self.proc.kill()
            _, err = self.proc.communicate()
        for line in reversed((err or "").strip().splitlines()):
            try:
                self.stats = json.loads(line)
                break
            except ValueError:
                continue
        self.proc = None

    def __enter__(self) -> ServerProc:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()
