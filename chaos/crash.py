"""Crash harness: SIGKILL real processes at random moments, rerun, compare.

Two targets, both real subprocesses reading shards over HTTP from a
throttled :class:`~chaos.faultserver.FaultServer` on 127.0.0.1:

``cat``    ``resumewds cat URL --journal run.db --commit-every 7 --workers 2
           --epochs 2``.  The committed output of one run is the first
           ``after - before`` lines it printed, where ``before``/``after`` are
           ``resolve_resume(journal)["samples_total"]`` before and after it.
``train``  ``examples/train.py`` (checkpoint, then ``loader.commit(step)``).
           The committed output of one run is its step lines with
           ``before < step <= after`` (committed steps).

A *round* runs one job to completion: each run is killed with SIGKILL after
a seeded random delay (usually the whole process group; sometimes only the
main process, leaving its DataLoader workers orphaned) and rerun with the
same arguments, until a run finishes.  A round starts with an empty shard
cache, so early kills land in downloads; ``--commit-every 7`` makes kills
during commits likely.  Rounds repeat until ``--kills`` kills were made.  The
committed output of each round, concatenated over its runs, must equal the
uninterrupted run exactly: same lines, same order, across the epoch boundary.

Run::

    python -m chaos.crash --kills 40 --seed 1
    python -m chaos.crash --kills 10 --target train

Prints kills survived, samples lost, samples repeated; exits 1 on any loss,
repetition, corruption, reordering or hang.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import glob
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from typing import Callable, Dict, List, Optional, Sequence, Tuple

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
PY = sys.executable
TRAIN = os.path.join(REPO, "examples", "train.py")


# ---------------------------------------------------------------------------
# data and processes
# ---------------------------------------------------------------------------
def child_env(**extra: str) -> Dict[str, str]:
    """Environment for subprocesses: this repo importable, loopback never proxied,
    fast fetch retries."""
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy"):
        env.pop(var, None)
    env["NO_PROXY"] = env["no_proxy"] = "127.0.0.1,localhost"
    env.setdefault("RESUMEWDS_FETCH_BACKOFF_INITIAL", "0.05")
    env.setdefault("RESUMEWDS_FETCH_BACKOFF_MAX", "0.5")
    env.setdefault("RESUMEWDS_FETCH_CONNECT_TIMEOUT", "2")
    env.setdefault("RESUMEWDS_FETCH_READ_TIMEOUT", "1.5")
    env.setdefault("RESUMEWDS_FETCH_ATTEMPTS", "10")
    env.pop("RANK", None)
    env.pop("WORLD_SIZE", None)
    env.pop("RESUMEWDS_CACHE_SIZE", None)
    env["PYTHONFAULTHANDLER"] = "1"
    env.update(extra)
    return env


@dataclasses.dataclass
class Dataset:
    """Shards on disk, their manifest, and every sample's true digest."""

    root: str
    manifest: str
    digests: Dict[Tuple[str, str], str]  # (shard basename, key) -> digest
    samples: int


def make_dataset(root: str, shards: int = 8, samples: int = 100, size_range: Tuple[int, int] = (2000, 20000),
                 seed: int = 3, images: bool = False, offsets: str = "auto") -> Dataset:
    """Write shards + manifest.json under ``root`` and read back every sample's digest
    (``offsets``: the manifest's form, :meth:`resumewds.manifest.Manifest.save`; ``"index"``
    is version 4, with sample digests)."""
    import resumewds as rw
    from resumewds.synth import write_shards
    from resumewds.tar import sample_digest
    from resumewds.tar._scan import iter_samples_file

    paths = write_shards(root, shards=shards, samples=samples, size_range=size_range, seed=seed,
                         images=images, image_side=32)
    manifest = os.path.join(root, "manifest.json")
    rw.build_manifest(paths, manifest, offsets=offsets, digests=offsets == "index")
    digests = {}
    for p in paths:
        for s in iter_samples_file(p):
            digests[(os.path.basename(p), s["__key__"])] = sample_digest(s)
    return Dataset(root, manifest, digests, len(digests))


def cat_cmd(source: str, *, journal: Optional[str] = None, cache_dir: Optional[str] = None,
            commit_every: int = 7, workers: int = 2, epochs: int = 2, seed: int = 7,
            chunk: int = 16, extra: Sequence[str] = ()) -> List[str]:
    cmd = [PY, "-m", "resumewds", "cat", source, "--seed", str(seed), "--shuffle", "--shuffle-window", "3",
           "--epochs", str(epochs), "--workers", str(workers), "--chunk", str(chunk)]
    if cache_dir:
        cmd += ["--cache-dir", cache_dir]
    if journal:
        cmd += ["--journal", journal, "--commit-every", str(commit_every)]
    return cmd + list(extra)


def train_cmd(work: str, url: str, *, workers: int = 2, epochs: int = 2, commit_every: int = 3,
              step_delay: float = 0.02) -> List[str]:
    return [PY, TRAIN, "--work", work, "--url", url, "--workers", str(workers), "--epochs", str(epochs),
            "--commit-every", str(commit_every), "--batch-size", "16", "--step-delay", str(step_delay)]


@dataclasses.dataclass
class Proc:
    """One finished (or killed) subprocess run."""

    rc: Optional[int]
    killed: bool
    hung: bool
    seconds: float
    out: str
    err: str
    in_download: bool = False  # a .partial existed in the cache at the moment of the kill
    t_first: Optional[float] = None  # seconds until the first byte of output

    @property
    def lines(self) -> List[str]:
        return self.out.splitlines()

    @property
    def clear_error(self) -> bool:
        """Exited non-zero by itself, with an ``Error:`` message and no traceback."""
        return (not self.killed and not self.hung and self.rc not in (0, None) and self.rc > 0
                and "Traceback" not in self.err and "Error" in self.err)


_ORPHANS: List[int] = []  # process groups whose main process was killed alone


def _partials(cache_dir: Optional[str]) -> bool:
    return bool(cache_dir) and bool(glob.glob(os.path.join(cache_dir, "shards", "*.partial")))


def run(cmd: Sequence[str], *, env: Optional[Dict[str, str]] = None, kill_after: Optional[float] = None,
        bound: float = 120.0, main_only: bool = False, cache_dir: Optional[str] = None,
        on_start: Optional[Callable[[subprocess.Popen], None]] = None, tmp: Optional[str] = None) -> Proc:
    """Run ``cmd`` in its own session; SIGKILL it after ``kill_after`` s; kill it if it outlives ``bound``."""
    tmp = tmp or tempfile.gettempdir()
    fo = tempfile.TemporaryFile(dir=tmp)
    fe = tempfile.TemporaryFile(dir=tmp)
    t0 = time.monotonic()
    p = subprocess.Popen(list(cmd), stdout=fo, stderr=fe, stdin=subprocess.DEVNULL,
                         env=env or child_env(), start_new_session=True)
    killed = hung = in_dl = False
    t_first: Optional[float] = None
    try:
        if on_start is not None:
            on_start(p)
        while p.poll() is None:
            now = time.monotonic() - t0
            if t_first is None and os.fstat(fo.fileno()).st_size > 0:
                t_first = now
            if kill_after is not None and now >= kill_after:
                in_dl = _partials(cache_dir)
                if main_only:
                    os.kill(p.pid, signal.SIGKILL)
                    _ORPHANS.append(p.pid)
                else:
                    os.killpg(p.pid, signal.SIGKILL)
                killed = True
                break
            if now >= bound:
                # faulthandler (PYTHONFAULTHANDLER=1) dumps every thread on SIGABRT
                _signal_group(p.pid, signal.SIGABRT)
                time.sleep(1.0)
                os.killpg(p.pid, signal.SIGKILL)
                hung = True
                break
            time.sleep(0.005)
        rc = p.wait()
    finally:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()
    if not killed and not hung:
        _reap_group(p.pid)
    fo.seek(0)
    fe.seek(0)
    out = fo.read().decode("utf-8", "replace")
    err = fe.read().decode("utf-8", "replace")
    fo.close()
    fe.close()
    if hung and os.environ.get("CHAOS_HANG_DIR"):
        os.makedirs(os.environ["CHAOS_HANG_DIR"], exist_ok=True)
        with open(os.path.join(os.environ["CHAOS_HANG_DIR"], f"hang-{p.pid}.txt"), "w") as f:
            f.write(" ".join(cmd) + "\n\n" + err)
    return Proc(rc, killed, hung, time.monotonic() - t0, out, err, in_dl, t_first)


def _signal_group(pgid: int, sig: int) -> None:
    try:
        os.killpg(pgid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def _reap_group(pgid: int) -> None:
    try:
        os.killpg(pgid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass


def reap_orphans() -> None:
    """Kill what is left of process groups whose main process was killed alone."""
    while _ORPHANS:
        _reap_group(_ORPHANS.pop())


# ---------------------------------------------------------------------------
# comparison
# ---------------------------------------------------------------------------
@dataclasses.dataclass
class Tally:
    expected: int = 0
    delivered: int = 0
    lost: int = 0
    repeated: int = 0
    corrupt: int = 0
    misordered: int = 0

    def add(self, other: Tally) -> None:
        for f in dataclasses.fields(self):
            setattr(self, f.name, getattr(self, f.name) + getattr(other, f.name))

    @property
    def ok(self) -> bool:
        return not (self.lost or self.repeated or self.corrupt or self.misordered)


def compare(expected: Sequence[str], got: Sequence[str], digests: Dict[Tuple[str, str], str]) -> Tally:
    """Compare delivered ``cat`` lines with the expected ones and with the source data.

    lost: expected occurrences not delivered; repeated: deliveries beyond the
    expected count; corrupt: lines whose digest is not the source sample's;
    misordered: 1 if the multisets agree but the order does not.
    """
    t = Tally(expected=len(expected), delivered=len(got))
    want = collections.Counter(_ident(x) for x in expected)
    have = collections.Counter()
    for line in got:
        parts = line.split("\t")
        if len(parts) != 3 or digests.get((parts[0], parts[1])) != parts[2]:
            t.corrupt += 1
        have[_ident(line)] += 1
    for k, n in want.items():
        t.lost += max(0, n - have.get(k, 0))
    for k, n in have.items():
        t.repeated += max(0, n - want.get(k, 0))
    if not (t.lost or t.repeated) and list(got) != list(expected):
        t.misordered = 1
    return t


def _ident(line: str) -> Tuple[str, ...]:
    return tuple(line.split("\t")[:2])


def committed_samples(journal: str) -> int:
    """Samples committed in ``journal`` (0 when it is missing, or unreadable: the
    rerun will then say why)."""
    from resumewds.errors import JournalError
    from resumewds.journal import resolve_resume

    try:
        point = resolve_resume(journal)
    except JournalError:
        return 0
    return int(point["samples_total"]) if point else 0


def committed_step(journal: str) -> int:
    from resumewds.journal import resolve_resume

    point = resolve_resume(journal)
    return int(point["step"]) if point else -1


def step_lines(out: str) -> Dict[int, str]:
    res = {}
    for line in out.splitlines():
        if line.startswith("step "):
            res[int(line.split()[1])] = line
    return res


# ---------------------------------------------------------------------------
# the harness
# ---------------------------------------------------------------------------
@dataclasses.dataclass
class CrashReport:
    target: str
    rounds: int = 0
    runs: int = 0
    kills: int = 0
    kills_in_download: int = 0
    kills_main_only: int = 0
    resumed_same_sample: int = 0
    hung: int = 0
    errors: List[str] = dataclasses.field(default_factory=list)
    tally: Tally = dataclasses.field(default_factory=Tally)
    loss_mismatch: int = 0
    seconds: float = 0.0

    @property
    def ok(self) -> bool:
        return self.tally.ok and not self.hung and not self.errors and not self.loss_mismatch


class Harness:
    """Shared state of crash runs: the data, a throttled server, the reference outputs."""

    def __init__(self, work: str, seed: int = 0, bytes_per_second: float = 3e6,
                 shards: int = 8, samples: int = 100, offsets: str = "auto"):
        from chaos.faultserver import FaultServer

        self.work = work
        self.seed = seed
        self.data = make_dataset(os.path.join(work, "data"), shards=shards, samples=samples, offsets=offsets)
        self.server = FaultServer(self.data.root, bytes_per_second=bytes_per_second, seed=seed).start()
        self.url = self.server.url + "manifest.json"
        self._ref_cat: Optional[Tuple[List[str], Tuple[float, float]]] = None
        self._img: Optional[Dataset] = None
        self._img_server = None
        self._ref_train: Optional[Tuple[Dict[int, str], Tuple[float, float]]] = None

    def close(self) -> None:
        reap_orphans()
        self.server.stop()
        if self._img_server is not None:
            self._img_server.stop()

    def ref_cat(self) -> Tuple[List[str], Tuple[float, float]]:
        """The uninterrupted output (local shards, no journal, no workers) and the
        duration of an uninterrupted run over HTTP with an empty cache."""
        if self._ref_cat is None:
            local = run(cat_cmd(self.data.manifest, workers=0), bound=120)
            if local.rc != 0:
                raise RuntimeError(f"reference cat failed: {local.err[-2000:]}")
            cache = os.path.join(self.work, "ref-cache")
            timed = run(cat_cmd(self.url, cache_dir=cache, journal=os.path.join(self.work, "ref.db")),
                        bound=120)
            if timed.lines != local.lines:
                raise RuntimeError(f"uninterrupted run over HTTP differs from the local run: exit {timed.rc}"
                                   f"{' (hung)' if timed.hung else ''}, {len(timed.lines)}/{len(local.lines)} "
                                   f"lines: {timed.err[-3000:]}")
            shutil.rmtree(cache, ignore_errors=True)
            self._ref_cat = (local.lines, (timed.t_first or 1.0, timed.seconds))
        return self._ref_cat

    def image_url(self) -> str:
        if self._img is None:
            from chaos.faultserver import FaultServer

            self._img = make_dataset(os.path.join(self.work, "img"), shards=8, samples=64, images=True)
            self._img_server = FaultServer(self._img.root, bytes_per_second=self.server.bytes_per_second,
                                           seed=self.seed).start()
        return self._img_server.url + "manifest.json"

    def ref_train(self) -> Tuple[Dict[int, str], Tuple[float, float]]:
        if self._ref_train is None:
            work = os.path.join(self.work, "train-ref")
            p = run(train_cmd(work, self.image_url()), bound=120)
            if p.rc != 0:
                raise RuntimeError(f"reference train.py failed: {p.err[-2000:]}")
            self._ref_train = (step_lines(p.out), (p.t_first or 1.0, p.seconds))
            shutil.rmtree(work, ignore_errors=True)
        return self._ref_train

    # ---- rounds ------------------------------------------------------------
    def crash_cat(self, kills: int, rng: random.Random, bound: float = 120.0,
                  between: Optional[Callable[[str, random.Random], int]] = None,
                  commit_every: int = 7) -> CrashReport:
        """Rounds of kill/rerun of ``resumewds cat`` until ``kills`` kills were made.

        ``between(cache_dir, rng)`` runs after every killed run (e.g. to damage
        the cache) and returns how many faults it injected.
        """
        ref, t_ref = self.ref_cat()
        rep = CrashReport("cat")
        t0 = time.monotonic()
        while rep.kills < kills:
            rep.rounds += 1
            rdir = os.path.join(self.work, f"cat-round-{rep.rounds}")
            shutil.rmtree(rdir, ignore_errors=True)
            os.makedirs(rdir)
            journal = os.path.join(rdir, "run.db")
            cache = os.path.join(rdir, "cache")
            cmd = cat_cmd(self.url, journal=journal, cache_dir=cache, commit_every=commit_every)
            kept: List[str] = []
            while True:
                before = committed_samples(journal)
                kill_at = _kill_time(rng, t_ref, before / max(1, len(ref))) if rep.kills < kills else None
                main_only = rng.random() < 0.25
                p = run(cmd, kill_after=kill_at, bound=bound, main_only=main_only, cache_dir=cache)
                rep.runs += 1
                after = committed_samples(journal)
                if after < before:
                    rep.errors.append(f"round {rep.rounds}: committed count went back {before} -> {after}")
                if len(p.lines) < after - before:
                    rep.errors.append(f"round {rep.rounds}: committed {after - before} samples but printed "
                                      f"only {len(p.lines)}")
                kept.extend(p.lines[: after - before])
                if p.hung:
                    rep.hung += 1
                    break
                if p.killed:
                    rep.kills += 1
                    rep.kills_in_download += p.in_download
                    rep.kills_main_only += main_only
                    if between is not None:
                        between(cache, rng)
                    continue
                if p.rc != 0:
                    rep.errors.append(f"round {rep.rounds}: exit {p.rc}: {p.err.strip()[-500:]}")
                break
            rep.tally.add(compare(ref, kept, self.data.digests))
            reap_orphans()
            shutil.rmtree(rdir, ignore_errors=True)
        rep.seconds = time.monotonic() - t0
        return rep

    def crash_train(self, kills: int, rng: random.Random, bound: float = 120.0) -> CrashReport:
        """Rounds of kill/rerun of examples/train.py; committed step lines must match."""
        url = self.image_url()
        ref, t_ref = self.ref_train()
        ref_steps = [ref[k] for k in sorted(ref)]
        rep = CrashReport("train")
        t0 = time.monotonic()
        while rep.kills < kills:
            rep.rounds += 1
            work = os.path.join(self.work, f"train-round-{rep.rounds}")
            shutil.rmtree(work, ignore_errors=True)
            journal = os.path.join(work, "run.db")
            kept: Dict[int, str] = {}
            while True:
                before = committed_step(journal) if os.path.exists(journal) else -1
                kill_at = (_kill_time(rng, t_ref, (before + 1) / max(1, len(ref)))
                           if rep.kills < kills else None)
                main_only = rng.random() < 0.25
                p = run(train_cmd(work, url), kill_after=kill_at, bound=bound, main_only=main_only,
                        cache_dir=os.path.join(work, "cache"))
                rep.runs += 1
                after = committed_step(journal) if os.path.exists(journal) else -1
                got = step_lines(p.out)
                resumed = [ln for ln in p.lines if ln.startswith("resume ")]
                if before >= 0 and not p.hung and (p.killed is False or resumed):
                    # the resumed run must say so, at the committed step, and its first
                    # batch must be the uninterrupted run's batch after that step
                    if not resumed or int(resumed[0].split()[2]) != before:
                        if not (p.killed and not p.out):
                            rep.errors.append(f"round {rep.rounds}: expected 'resume step {before}', got "
                                              f"{resumed[:1]}")
                    elif before + 1 in got and before + 1 in ref:
                        rep.resumed_same_sample += got[before + 1].split()[:10] == ref[before + 1].split()[:10]
                for s in range(before + 1, after + 1):
                    if s not in got:
                        rep.errors.append(f"round {rep.rounds}: step {s} committed but never printed")
                    else:
                        kept[s] = got[s]
                if p.hung:
                    rep.hung += 1
                    break
                if p.killed:
                    rep.kills += 1
                    rep.kills_in_download += p.in_download
                    rep.kills_main_only += main_only
                    continue
                if p.rc != 0:
                    rep.errors.append(f"round {rep.rounds}: exit {p.rc}: {p.err.strip()[-500:]}")
                break
            seq = [kept[k] for k in sorted(kept)]
            t = Tally(expected=len(ref_steps), delivered=len(seq))
            ref_by_batch = {tuple(ln.split()[:8]) for ln in ref_steps}
            t.lost = sum(1 for k in ref if k not in kept)
            t.repeated = max(0, len(seq) - len(set(kept)))
            t.corrupt = sum(1 for ln in seq if tuple(ln.split()[:8]) not in ref_by_batch)
            rep.loss_mismatch += sum(1 for k in kept if k in ref and kept[k] != ref[k]
                                     and tuple(kept[k].split()[:8]) == tuple(ref[k].split()[:8]))
            if not (t.lost or t.corrupt) and seq != ref_steps:
                t.misordered = 1
            rep.tally.add(t)
            reap_orphans()
            shutil.rmtree(work, ignore_errors=True)
        rep.seconds = time.monotonic() - t0
        return rep


def _kill_time(rng: random.Random, timing: Tuple[float, float], done: float) -> float:
    """A moment inside a run that resumes with fraction ``done`` finished.

    ``timing`` is (seconds to the first output line, total seconds) of an
    uninterrupted run; one kill in eight lands during start-up.
    """
    start, total = timing
    if rng.random() < 0.125:
        return rng.uniform(0.2, start)
    left = max(0.2, (total - start) * (1.0 - done))
    return rng.uniform(start * 0.8, start + left * 0.8)


def format_report(r: CrashReport) -> str:
    t = r.tally
    lines = [
        f"{r.target}: {r.kills} kills survived in {r.rounds} rounds ({r.runs} runs, {r.seconds:.0f}s); "
        f"{r.kills_in_download} during a download, {r.kills_main_only} of the main process only",
        f"  samples expected {t.expected}, delivered {t.delivered}, lost {t.lost}, repeated {t.repeated}, "
        f"corrupt {t.corrupt}, order {'same' if not t.misordered else 'DIFFERENT'}, hung {r.hung}",
    ]
    if r.target == "train":
        lines.append(f"  resumed runs whose first batch was the uninterrupted run's next batch: "
                     f"{r.resumed_same_sample}; loss mismatches {r.loss_mismatch}")
    for e in r.errors[:10]:
        lines.append(f"  ERROR {e}")
    lines.append("  verdict: " + ("PASS" if r.ok else "FAIL"))
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m chaos.crash", description=__doc__.split("\n\n")[0])
    p.add_argument("--kills", type=int, default=20, help="SIGKILLs per target.")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--target", choices=["cat", "train", "both"], default="both")
    p.add_argument("--work", default=None, help="Work directory (default: a temporary one, removed).")
    a = p.parse_args(argv)
    work = a.work or tempfile.mkdtemp(prefix="resumewds-crash-")
    h = Harness(work, seed=a.seed)
    ok = True
    try:
        targets = ["cat", "train"] if a.target == "both" else [a.target]
        for tgt in targets:
            rng = random.Random(f"{a.seed}:{tgt}")
            rep = h.crash_cat(a.kills, rng) if tgt == "cat" else h.crash_train(a.kills, rng)
            print(format_report(rep), flush=True)
            ok = ok and rep.ok
    finally:
        h.close()
        if a.work is None:
            shutil.rmtree(work, ignore_errors=True)
    total = "all samples exactly once, in order" if ok else "FAILED"
    print(f"crash harness (seed {a.seed}): {total}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
