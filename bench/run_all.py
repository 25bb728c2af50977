"""Run every benchmark (``--quick`` by default; ``--full`` for the full sizes).

Each bench runs in its own interpreter, one after the other (never in
parallel: they would measure each other).  Exit status 1 if any target
failed, 2 if a bench crashed.

    python bench/run_all.py            # all, quick (~1-2 min)
    python bench/run_all.py --full     # all, full sizes (several minutes)
    python bench/run_all.py read fetch # a subset
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
BENCHES = ["read", "fetch", "journal", "stats", "repair"]


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("names", nargs="*", choices=BENCHES + [[]], help="benches to run (default: all)")
    p.add_argument("--full", action="store_true", help="full sizes instead of --quick")
    a = p.parse_args(argv)
    names = a.names or BENCHES
    worst = 0
    summary = []
    for name in names:
        cmd = [sys.executable, os.path.join(HERE, f"bench_{name}.py")] + ([] if a.full else ["--quick"])
        print(f"\n### {' '.join(os.path.relpath(c) if c.endswith('.py') else c for c in cmd[1:])}", flush=True)
        t0 = time.perf_counter()
        rc = subprocess.call(cmd)
        dt = time.perf_counter() - t0
        summary.append((name, rc, dt))
        worst = max(worst, 1 if rc == 1 else (2 if rc else 0))
    print("\n### summary")
    for name, rc, dt in summary:
        state = {0: "all targets PASS", 1: "some target FAILED"}.get(rc, f"CRASHED (exit {rc})")
        print(f"  bench_{name:<8} {dt:6.1f}s  {state}")
    return worst


if __name__ == "__main__":
    sys.exit(main())
