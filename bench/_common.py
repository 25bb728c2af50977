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
import json
import os
import re
import shutil
import statistics
import sys
import tempfile
import time
from typing import Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple, Union

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
    p.add_argument("--json", default=None, metavar="PATH",
                   help="also write the table's figures to PATH as a flat JSON dict "
                        "{'<metric> [<column>]': value} (what bench/compare_revs.py reads)")
    if extra:
        extra(p)
    args = p.parse_args(argv)
    global JSON_PATH
    JSON_PATH = args.json
    return args


#: where :meth:`Table.print` writes the figures (``--json``); None: nowhere
JSON_PATH: Optional[str] = None
#: every printed table's figures in this process (one file, several tables)
_FIGURES: Dict[str, object] = {}
#: the table columns that are figures (``metric`` names the row; ``target`` is a constant)
FIGURE_COLUMNS = ("resumewds", "peer", "ratio", "result")
_NUMBER = re.compile(r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?(?:[eE][-+]?\d+)?|[-+]?\.\d+")


def cell_value(text: str) -> Union[float, str, None]:
    """The figure a printed table cell holds: its first number (``"58,596"`` -> 58596.0,
    ``"5.117x"``, ``"0.42s"``, ``"1.80%"``, ``"32,553 (29,194..35,555)"`` -> 32553.0);
    a word cell (``PASS``, ``exact/exact``) as itself; None for an empty cell or ``-``.

    Example:
        >>> cell_value("1,821"), cell_value("0.612x"), cell_value("PASS"), cell_value("-")
        (1821.0, 0.612, 'PASS', None)
    """
    t = text.strip()
    if t in ("", "-", "n/a"):
        return None
    m = _NUMBER.search(t)
    if m is None:
        return t
    return float(m.group(0).replace(",", ""))


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


def drop_caches() -> bool:
    """Drop the page cache (``echo 3 > /proc/sys/vm/drop_caches`` after a
    sync) for a cold-disk measurement; False when that is not allowed (not root)."""
    try:
        os.sync()
        with open("/proc/sys/vm/drop_caches", "w") as f:
            f.write("3\n")
        return True
    except OSError:
        return False


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
        #: per row, the unrounded (ours, peer, ratio) where add() had them
        self.values: List[Tuple[Optional[float], Optional[float], Optional[float]]] = []
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
        self.values.append((float(ours), None if peer is None else float(peer),
                            None if ratio is None else float(ratio)))
        if ok is False:
            self.failed += 1
        return ok

    def add_raw(self, metric: str, ours: str, peer: str, ratio: str, target: str, ok: Optional[bool]) -> None:
        self.rows.append((metric, ours, peer, ratio, target, "info" if ok is None else ("PASS" if ok else "FAIL")))
        self.values.append((None, None, None))
        if ok is False:
            self.failed += 1

    def figures(self) -> Dict[str, object]:
        """The rows as a flat dict ``{"<metric> [<column>]": value}`` for the columns
        resumewds, peer, ratio (floats, unrounded where :meth:`add` had them; else
        :func:`cell_value` of the printed cell) and result (``PASS`` / ``FAIL`` / ``info``).
        The keys are the ones bench/compare_revs.py derives from the printed table."""
        out: Dict[str, object] = {}
        for row, exact in zip(self.rows, self.values):
            metric = row[0]
            cells = dict(zip(("resumewds", "peer", "ratio", "result"), (row[1], row[2], row[3], row[5])))
            for col, x in zip(("resumewds", "peer", "ratio"), exact):
                value = cell_value(cells[col]) if x is None else x
                if value is not None:
                    out[f"{metric} [{col}]"] = value
            out[f"{metric} [result]"] = row[5]
        return out

    def write_json(self, path: str) -> None:
        """Merge this table's :meth:`figures` into the process's figures and write them to ``path``."""
        _FIGURES.update(self.figures())
        with open(path, "w") as fh:
            json.dump(_FIGURES, fh, indent=1, sort_keys=True)

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
        if JSON_PATH:
            self.write_json(JSON_PATH)


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
        self.proc: Any = None  # subprocess.Popen[str] once started
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
