"""Kill -9 campaign of a two-source curriculum (examples/curriculum.py) over HTTP.

One uninterrupted reference run, then a run killed with SIGKILL ``kills``
times at random steps and restarted each time with another worker count,
against a fault-injecting server on 127.0.0.1.  The committed sequence (each
run's step lines up to where the next run resumed, then the last run's) must
equal the reference line for line: same samples, same sources, same phase,
same loss.

Run it::

    python -m chaos.mixcrash --work /tmp/mixcrash --kills 8
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import random
import signal
import subprocess
import sys
from typing import Dict, List, Optional, Sequence

from chaos.faultserver import FaultServer
from resumewds.synth import write_shards

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
SCRIPT = os.path.join(REPO, "examples", "curriculum.py")
WORKERS = (0, 3, 1)  # restarts cycle through these; the reference uses 2


@dataclasses.dataclass
class MixCrashReport:
    expected: List[str]
    committed: List[str]
    kills: int = 0
    runs: int = 0
    faults: Dict[str, int] = dataclasses.field(default_factory=dict)
    errors: List[str] = dataclasses.field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.errors and self.committed == self.expected


def _env(cache: str) -> Dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    env["RESUMEWDS_CACHE_DIR"] = cache
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy"):
        env.pop(var, None)
    env["NO_PROXY"] = "127.0.0.1,localhost"
    return env


def campaign(work: str, kills: int, rng: random.Random, *, faults: str = "mixed:0.08", steps: int = 40,
             phase_step: int = 20, timeout: float = 300.0) -> MixCrashReport:
    """Run the reference and the killed runs under ``work``; see the module docs."""
    srv_root = os.path.join(work, "srv")
    write_shards(os.path.join(srv_root, "web"), shards=6, samples=23, size_range=(50, 400), seed=1)
    write_shards(os.path.join(srv_root, "code"), shards=2, samples=9, size_range=(50, 400), seed=2)
    with FaultServer(srv_root, stall_seconds=0.5, retry_after=0, seed=rng.randrange(1 << 30)) as srv:
        srv.set_faults(faults)
        urls = [f"{srv.url}/web/shard-{{000000..000005}}.tar", f"{srv.url}/code/shard-{{000000..000001}}.tar"]

        def cmd(run: str, workers: int) -> List[str]:
            return [sys.executable, SCRIPT, "--work", os.path.join(work, run), "--source", urls[0],
                    "--source", urls[1], "--steps", str(steps), "--phase-step", str(phase_step),
                    "--batch-size", "8", "--workers", str(workers)]

        ref = subprocess.run(cmd("ref", 2), env=_env(os.path.join(work, "cache-ref")), capture_output=True,
                             text=True, timeout=timeout)
        rep = MixCrashReport(expected=[ln for ln in ref.stdout.splitlines() if ln.startswith("step ")],
                             committed=[])
        if ref.returncode != 0:
            rep.errors.append(f"reference run failed: {ref.stderr[-1000:]}")
            return rep
        srv.reset_counters()
        for path, kinds in (("/web/shard-000003.tar", ["reset", "503", None]),
                            ("/code/shard-000001.tar", ["500", "truncate", None]),
                            ("/web/shard-000000.tar", ["stall", None])):
            srv.script(path, kinds)
        env = _env(os.path.join(work, "cache-run"))
        for attempt in range(kills + 8):
            workers = WORKERS[attempt % len(WORKERS)]
            p = subprocess.Popen(cmd("run", workers), env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                 text=True)
            rep.runs += 1
            target = rng.randint(2, 9)
            seen: List[str] = []
            start: Optional[int] = None
            assert p.stdout is not None and p.stderr is not None
            for line in p.stdout:
                if line.startswith("resume "):
                    start = int(line.split()[2])
                if line.startswith("step "):
                    seen.append(line.rstrip("\n"))
                    if len(seen) >= target and rep.kills < kills:
                        os.kill(p.pid, signal.SIGKILL)
                        rep.kills += 1
                        break
            p.wait(timeout=timeout)
            # what the killed run printed after the line we killed it at is still in
            # the pipe (and may have been committed): read it, or the record of the
            # committed sequence would miss those steps
            for line in p.stdout:
                if line.startswith("step "):
                    seen.append(line.rstrip("\n"))
            err = p.stderr.read()
            p.stdout.close()
            p.stderr.close()
            if start is not None:
                if seen and int(seen[0].split()[1]) != start:
                    rep.errors.append(f"run {rep.runs} resumed at {start} but printed {seen[0]!r} first")
                # a killed run's last lines may be printed but not committed:
                # the next run starts at its first uncommitted step
                del rep.committed[start:]
            rep.committed.extend(seen)
            if p.returncode == 0:
                break
            if p.returncode != -signal.SIGKILL:
                rep.errors.append(f"run {rep.runs} exited {p.returncode}: {err.strip()[-500:]}")
                break
        rep.faults = dict(srv.faults)
    return rep


def main(argv: Optional[Sequence[str]] = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--work", required=True)
    ap.add_argument("--kills", type=int, default=8)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--faults", default="mixed:0.08")
    a = ap.parse_args(argv)
    rep = campaign(a.work, a.kills, random.Random(a.seed), faults=a.faults)
    print(f"mixture kill -9 campaign: {rep.kills} kills, {rep.runs} runs, faults {rep.faults}, "
          f"{len(rep.committed)}/{len(rep.expected)} committed lines, "
          f"{'equal to the uninterrupted run' if rep.ok else 'DIFFERENT'}")
    for e in rep.errors:
        print("  " + e)
    return 0 if rep.ok else 1


if __name__ == "__main__":
    sys.exit(main())
