"""``python -m chaos run``: a matrix of faults against real ``resumewds`` processes.

Every scenario runs ``resumewds cat`` (or ``examples/train.py``) as a
subprocess, usually with ``--workers 2``, and compares every delivered line
(``SHARD<TAB>KEY<TAB>DIGEST``) with the source data: the digest of each
sample read straight from the local shards, and the order of an
uninterrupted local run.  One table comes out:

    fault | runs | faults injected | samples expected | delivered | lost |
    repeated | corrupt delivered | clear-error exits | verdict

A scenario expects one of:

``exact``     every run exits 0 and the output equals the local output.
``error``     every run exits non-zero by itself, with an ``Error:`` line and
              no traceback, within its time bound; what it printed before is
              a correct prefix of the local output.
``either``    each run is ``exact`` or ``error``.
``resume``    runs with a journal are killed or fail, are rerun, and the
              committed output concatenated over the reruns equals the local
              output exactly.

The verdict is FAIL on any lost, repeated, corrupt or reordered sample, a
run past its bound (a hang), or an exit that is not the expected kind; SKIP
(with the reason) when the environment cannot inject the fault (tmpfs mounts
need root).  Exit status 1 on any FAIL.

Run::

    python -m chaos run --quick            # < 2 minutes
    python -m chaos run                    # more cycles
    python -m chaos run --soak 30          # repeat the matrix with new seeds for 30 minutes
"""

from __future__ import annotations

import argparse
import concurrent.futures
import dataclasses
import json
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple

from chaos import diskfaults
from chaos.crash import (
    Dataset,
    Harness,
    Proc,
    Tally,
    cat_cmd,
    child_env,
    committed_samples,
    compare,
    make_dataset,
    reap_orphans,
    run,
)
from chaos.faultserver import FaultServer

BOUND = 60.0  # seconds a single run may take before it counts as hung


@dataclasses.dataclass
class Row:
    fault: str
    expect: str
    runs: int = 0
    faults: int = 0
    tally: Tally = dataclasses.field(default_factory=Tally)
    clear_errors: int = 0
    bad_exits: List[str] = dataclasses.field(default_factory=list)
    hung: int = 0
    skip: Optional[str] = None
    note: str = ""
    seconds: float = 0.0

    @property
    def verdict(self) -> str:
        if self.skip:
            return "SKIP"
        if self.hung or self.bad_exits or not self.tally.ok:
            return "FAIL"
        return "PASS"


class Suite:
    """Data, reference outputs and servers shared by the scenarios."""

    def __init__(self, work: str, seed: int, quick: bool):
        self.work = work
        self.seed = seed
        self.quick = quick
        self.data = make_dataset(os.path.join(work, "data"), shards=6, samples=60, size_range=(1000, 12000),
                                 seed=seed)
        ref = run(cat_cmd(self.data.manifest, workers=0, epochs=1), bound=120)
        if ref.rc != 0:
            raise RuntimeError(f"reference run failed: {ref.err[-2000:]}")
        self.ref = ref.lines
        self._n = 0
        self._lock = threading.Lock()

    def tmp(self, name: str) -> str:
        with self._lock:
            self._n += 1
            d = os.path.join(self.work, f"{self._n:03d}-{name}")
        os.makedirs(d)
        return d

    def server(self, faults: str = "", **kw) -> FaultServer:
        kw.setdefault("seed", self.seed)
        kw.setdefault("stall_seconds", 3.0)
        kw.setdefault("retry_after", 0.2)
        kw.setdefault("manifest", self.data.manifest)
        srv = FaultServer(self.data.root, faults=faults, **kw).start()
        srv.script("/manifest.json", [None] * 1000)  # faults hit shards, not the manifest
        return srv

    def judge(self, row: Row, p: Proc, expect: Optional[str] = None) -> None:
        """Count one run into ``row``."""
        expect = expect or row.expect
        row.runs += 1
        if p.hung:
            row.hung += 1
            row.bad_exits.append(f"hung > {BOUND:.0f}s")
            return
        got = p.lines
        ok_exact = p.rc == 0
        if p.clear_error:
            row.clear_errors += 1
        if expect == "exact" or (expect == "either" and ok_exact):
            row.tally.add(compare(self.ref, got, self.data.digests))
            if not ok_exact:
                row.bad_exits.append(f"exit {p.rc}: {_last_line(p.err)}")
        else:  # an error is expected (or allowed): what was printed must be a correct prefix
            row.tally.add(compare(self.ref[:len(got)], got, self.data.digests))
            if ok_exact and expect == "error":
                row.bad_exits.append("exit 0 where an error was expected")
            elif not ok_exact and not p.clear_error:
                row.bad_exits.append(f"unclear exit {p.rc}: {_last_line(p.err)}")
        if not row.note and p.rc and p.clear_error:
            row.note = _last_line(p.err)


def _last_line(text: str) -> str:
    lines = [ln for ln in text.strip().splitlines() if ln.strip()]
    return (lines[-1] if lines else "")[:160]


# ---------------------------------------------------------------------------
# scenarios: each takes the suite and returns a Row
# ---------------------------------------------------------------------------
def net(name: str, faults: str, *, max_per_path: int = 2, runs: int = 1, down: float = 0.0,
        no_manifest: bool = False, expect: str = "exact", **srv_kw) -> Callable[[Suite], Row]:
    def scenario(s: Suite) -> Row:
        row = Row(name, expect)
        for i in range(runs):
            srv = s.server(faults, max_faults_per_path=max_per_path, seed=s.seed * 100 + i, **srv_kw)
            try:
                d = s.tmp("net")
                if no_manifest:
                    names = sorted(os.path.basename(p) for p in _shard_paths(s.data))
                    src = srv.url + "{" + ",".join(names) + "}"
                    srv.script("/" + names[0], [])
                else:
                    src = srv.url + "manifest.json"
                if down:
                    srv.set_down(down)
                p = run(cat_cmd(src, cache_dir=os.path.join(d, "cache"), epochs=1), bound=BOUND)
                s.judge(row, p)
                row.faults += sum(srv.faults.values())
            finally:
                srv.stop()
        return row
    return _labelled(name, scenario)


def _shard_paths(data: Dataset) -> List[str]:
    return sorted(os.path.join(data.root, n) for n in os.listdir(data.root) if n.endswith(".tar"))


def crash_cycles(kills: int, target: str) -> Callable[[Suite], Row]:
    def scenario(s: Suite) -> Row:
        row = Row(f"SIGKILL x{kills}, {target} (download/commit/mid-batch, 2 workers)", "resume")
        h = Harness(s.tmp(f"crash-{target}"), seed=s.seed, shards=6, samples=80)
        try:
            rng = random.Random(f"{s.seed}:{target}")
            rep = h.crash_cat(kills, rng, bound=BOUND) if target == "cat" else h.crash_train(kills, rng, bound=BOUND)
        finally:
            h.close()
        row.runs, row.faults, row.tally, row.hung = rep.runs, rep.kills, rep.tally, rep.hung
        row.bad_exits = list(rep.errors)
        if rep.loss_mismatch:
            row.bad_exits.append(f"{rep.loss_mismatch} steps with a different loss after resume")
        row.note = f"{rep.kills_in_download} kills mid-download, {rep.kills_main_only} main-only"
        if target == "train":
            row.note += f", {rep.resumed_same_sample} resumes checked at the same sample"
        return row
    return _labelled(f"crash_{target}", scenario)


def _children(pid: int) -> List[int]:
    kids = []
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/stat") as f:
                    if f.read().rsplit(")", 1)[1].split()[1] == str(pid):
                        kids.append(int(d))
            except (OSError, IndexError):
                pass
    return kids


def kill_worker(s: Suite) -> Row:
    """SIGKILL one DataLoader worker: a clear error within the bound, then a rerun completes exactly."""
    row = Row("SIGKILL of one DataLoader worker, then rerun", "resume")
    srv = s.server(bytes_per_second=1.5e6)
    d = s.tmp("killworker")
    journal = os.path.join(d, "run.db")
    cmd = cat_cmd(srv.url + "manifest.json", journal=journal, cache_dir=os.path.join(d, "cache"), epochs=1)
    killed: List[int] = []

    def killer(p) -> None:
        def go() -> None:
            t0 = time.monotonic()
            while time.monotonic() - t0 < 20 and p.poll() is None:
                kids = _children(p.pid)
                if len(kids) >= 2:
                    time.sleep(0.6)
                    os.kill(kids[0], signal.SIGKILL)
                    killed.append(kids[0])
                    return
                time.sleep(0.02)
        threading.Thread(target=go, daemon=True).start()

    kept: List[str] = []
    try:
        for attempt in range(3):
            before = committed_samples(journal)
            p = run(cmd, bound=30.0, on_start=killer if attempt == 0 else None)
            row.runs += 1
            after = committed_samples(journal)
            kept.extend(p.lines[: after - before])
            if p.hung:
                row.hung += 1
                row.bad_exits.append("hung after a worker was killed")
                break
            if attempt == 0:
                if p.rc == 0:
                    row.note = "worker killed after it finished; run completed"
                elif p.clear_error and "worker" in p.err:
                    row.clear_errors += 1
                    row.note = f"exit {p.rc} after {p.seconds:.1f}s: {_last_line(p.err)[:90]}"
                else:
                    row.bad_exits.append(f"unclear exit {p.rc}: {_last_line(p.err)}")
            if p.rc == 0:
                break
        row.faults = len(killed)
        row.tally.add(compare(s.ref, kept, s.data.digests))
    finally:
        srv.stop()
    return row


def worker_fault_rows() -> List[Callable[[Suite], Row]]:
    from chaos.workerfaults import rows

    return rows()


def tmpfs_full(s: Suite) -> Row:
    """ENOSPC mid-download: the cache on a tmpfs smaller than the data."""
    row = Row("cache on a full tmpfs (ENOSPC mid-download)", "error")
    d = s.tmp("enospc")
    mnt = os.path.join(d, "mnt")
    total = sum(os.path.getsize(p) for p in _shard_paths(s.data))
    srv = s.server()
    try:
        with diskfaults.tmpfs(mnt, f"{max(64, total // 3 // 1024)}k"):
            p = run(cat_cmd(srv.url + "manifest.json", cache_dir=os.path.join(mnt, "cache"), epochs=1), bound=BOUND)
            s.judge(row, p)
            row.faults = 1
            if p.rc and "space" not in p.err:
                row.bad_exits.append(f"error does not say the disk is full: {_last_line(p.err)}")
    except diskfaults.MountUnavailable as exc:
        row.skip = str(exc)
    finally:
        srv.stop()
    return row


def readonly_cache(s: Suite) -> Row:
    row = Row("read-only cache directory", "error")
    d = s.tmp("rocache")
    mnt = os.path.join(d, "mnt")
    srv = s.server()
    try:
        with diskfaults.tmpfs(mnt, "4m", readonly=True):
            p = run(cat_cmd(srv.url + "manifest.json", cache_dir=mnt, epochs=1), bound=BOUND)
            s.judge(row, p)
            row.faults = 1
    except diskfaults.MountUnavailable as exc:
        row.skip = str(exc)
    finally:
        srv.stop()
    return row


def cache_damage_between(kills: int) -> Callable[[Suite], Row]:
    def scenario(s: Suite) -> Row:
        row = Row("cache corrupted/truncated/deleted between runs (+kills)", "resume")
        h = Harness(s.tmp("damage"), seed=s.seed, shards=6, samples=80)
        injected = [0]

        def between(cache: str, rng: random.Random) -> int:
            n = diskfaults.damage_cache(cache, rng, count=3)
            injected[0] += n
            return n
        try:
            rep = h.crash_cat(kills, random.Random(f"{s.seed}:damage"), bound=BOUND, between=between)
        finally:
            h.close()
        row.runs, row.tally, row.hung, row.bad_exits = rep.runs, rep.tally, rep.hung, list(rep.errors)
        row.faults = injected[0] + rep.kills
        row.note = f"{injected[0]} damaged files, {rep.kills} kills"
        return row
    return _labelled("cache_damage_between", scenario)


def cache_damage_during(s: Suite) -> Row:
    """Files deleted, truncated or replaced by a corrupt copy while a run reads them:
    each run ends exactly or with a clear error; reruns with the journal finish exactly."""
    row = Row("cache damaged during runs (delete/truncate/replace)", "resume")
    srv = s.server(bytes_per_second=4e6)
    d = s.tmp("during")
    cache = os.path.join(d, "cache")
    journal = os.path.join(d, "run.db")
    cmd = cat_cmd(srv.url + "manifest.json", journal=journal, cache_dir=cache, epochs=2, commit_every=5)
    ref2 = s.ref + s.ref  # epochs=2 with the same seed: epoch 1 is reshuffled, compare by multiset below
    rng = random.Random(f"{s.seed}:during")
    stop = threading.Event()
    count = [0]

    def vandal() -> None:
        while not stop.wait(rng.uniform(0.05, 0.3)):
            for path in diskfaults.cache_entries(cache)[:1]:
                kind = rng.choice(["delete", "truncate", "replace"])
                try:
                    if kind == "delete":
                        os.unlink(path)
                    elif kind == "truncate":
                        os.truncate(path, rng.randrange(max(1, os.path.getsize(path))))
                    else:
                        with open(path, "rb") as f:
                            b = bytearray(f.read())
                        if b:
                            b[rng.randrange(len(b))] ^= 0xFF
                        with open(path + ".vandal", "wb") as f:
                            f.write(b)
                        os.replace(path + ".vandal", path)
                    count[0] += 1
                except OSError:
                    pass

    kept: List[str] = []
    full: Optional[List[str]] = None
    t = threading.Thread(target=vandal, daemon=True)
    t.start()
    try:
        for attempt in range(12):
            if attempt >= 8:
                stop.set()
            before = committed_samples(journal)
            p = run(cmd, bound=BOUND)
            row.runs += 1
            after = committed_samples(journal)
            kept.extend(p.lines[: after - before])
            if p.hung:
                row.hung += 1
                row.bad_exits.append("hung")
                break
            if p.rc == 0:
                break
            if p.clear_error:
                row.clear_errors += 1
            else:
                row.bad_exits.append(f"unclear exit {p.rc}: {_last_line(p.err)}")
                break
        stop.set()
        t.join(5)
        full = run(cat_cmd(s.data.manifest, epochs=2, workers=0), bound=BOUND).lines
        row.tally.add(compare(full, kept, s.data.digests))
        row.faults = count[0]
        row.note = f"{count[0]} files damaged under running readers"
    finally:
        stop.set()
        srv.stop()
    del ref2
    return row


def stale_partials(s: Suite) -> Row:
    """Garbage .partial files whose .etag matches the server, and leftover .lock files."""
    row = Row("stale partials (garbage + valid ETag) and lock files", "exact")
    srv = s.server()
    try:
        d = s.tmp("stale")
        cache = os.path.join(d, "cache")
        rng = random.Random(s.seed)
        paths = _shard_paths(s.data)
        urls = [srv.url + os.path.basename(p) for p in paths]
        row.faults = diskfaults.plant_stale(cache, urls, rng)
        from resumewds.cache import ShardStore
        from resumewds.fetch import boot_id

        store = ShardStore(cache_dir=cache)
        for i, (url, path) in enumerate(zip(urls, paths)):
            # the sidecar as this version writes it (this boot's id: trusted),
            # and in the older plain-text form
            side = diskfaults.server_etag(path)
            if i % 2 == 0:
                side = json.dumps({"validator": side, "boot": boot_id()})
            with open(store.entry_path(url) + ".partial.etag", "w") as f:
                f.write(side)
        p = run(cat_cmd(srv.url + "manifest.json", cache_dir=cache, epochs=1), bound=BOUND)
        s.judge(row, p)
    finally:
        srv.stop()
    return row


def reboot(s: Suite) -> Row:
    """A machine crash: unsynced cache entries (sync="boot", the default) from
    the previous boot, some with zeroed pages under an unchanged size and
    mtime.  ``verify="once"`` alone would trust them; the boot id makes the
    next run hash them again (and fetch the damaged ones anew)."""
    row = Row("machine crash: unsynced cache pages lost (size/mtime kept)", "exact")
    srv = s.server()
    try:
        d = s.tmp("reboot")
        cache = os.path.join(d, "cache")
        url = srv.url + "manifest.json"
        first = run(cat_cmd(url, cache_dir=cache, epochs=1), bound=BOUND)
        s.judge(row, first)
        row.faults = diskfaults.simulate_reboot(cache, random.Random(s.seed), count=3)
        p = run(cat_cmd(url, cache_dir=cache, epochs=1), bound=BOUND)
        s.judge(row, p)
        row.note = f"{row.faults} entries with zeroed pages under unchanged stat, rerun after the 'reboot'"
    finally:
        srv.stop()
    return row


def journal_dir_full(s: Suite) -> Row:
    """The journal's filesystem fills up: a clear error; after space is freed a rerun continues exactly."""
    row = Row("journal directory full, then space freed", "resume")
    d = s.tmp("jfull")
    mnt = os.path.join(d, "mnt")
    journal = os.path.join(mnt, "run.db")
    cmd = cat_cmd(s.data.manifest, journal=journal, cache_dir=os.path.join(d, "cache"), epochs=1,
                  commit_every=3)
    try:
        with diskfaults.tmpfs(mnt, "1m"):
            filler = diskfaults.fill(mnt, leave=60 * 1024)
            kept: List[str] = []
            for attempt in range(2):
                before = committed_samples(journal) if os.path.exists(journal) else 0
                p = run(cmd, bound=BOUND)
                row.runs += 1
                after = committed_samples(journal) if os.path.exists(journal) else 0
                kept.extend(p.lines[: after - before])
                if attempt == 0:
                    row.faults = 1
                    if p.rc == 0:
                        row.note = "journal fit in the space left"
                    elif p.clear_error:
                        row.clear_errors += 1
                        row.note = _last_line(p.err)[:100]
                    else:
                        row.bad_exits.append(f"unclear exit {p.rc}: {_last_line(p.err)}")
                    os.unlink(filler)
                elif p.rc != 0:
                    row.bad_exits.append(f"rerun failed: {_last_line(p.err)}")
                if p.hung:
                    row.hung += 1
            row.tally.add(compare(s.ref, kept, s.data.digests))
    except diskfaults.MountUnavailable as exc:
        row.skip = str(exc)
    return row


def fuzz_rows(cases: int) -> Callable[[Suite], Row]:
    def scenario(s: Suite) -> Row:
        from chaos.fuzz import fuzz_tar_reader

        r = fuzz_tar_reader(cases=cases, seed=s.seed, bound=2.0)
        row = Row(f"fuzzed tar shards -> tar reader ({cases} cases)", "either")
        row.runs = r.cases
        row.faults = r.cases
        row.clear_errors = r.format_errors
        row.bad_exits = [m for m, _ in r.failures]
        row.note = f"{r.data} parsed, {r.format_errors} ShardFormatError, slowest {r.slowest * 1000:.0f} ms"
        return row
    return _labelled("fuzz_rows", scenario)


def malformed_through_cat(s: Suite) -> Row:
    """A few fuzzed shards placed among good ones, read by ``resumewds cat``."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import seed as hseed

    from chaos.fuzz import mutated_shards

    row = Row("malformed shard among good ones -> resumewds cat", "either")
    cases: List[bytes] = []

    @hseed(s.seed)
    @settings(max_examples=4 if s.quick else 12, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(mutated_shards())
    def collect(b: bytes) -> None:
        cases.append(b)

    collect()
    for b in cases[-(4 if s.quick else 12):]:
        d = s.tmp("malformed")
        good = _shard_paths(s.data)[:2]
        for g in good:
            shutil.copy(g, d)
        bad = os.path.join(d, "zz-bad.tar")
        with open(bad, "wb") as f:
            f.write(b)
        shards = sorted([*(os.path.join(d, os.path.basename(g)) for g in good), bad])
        p = run([sys.executable, "-m", "resumewds", "cat", *shards,
                 "--workers", "2", "--cache-dir", os.path.join(d, "cache")], bound=BOUND)
        row.runs += 1
        row.faults += 1
        if p.hung:
            row.hung += 1
        elif p.rc != 0 and not p.clear_error:
            row.bad_exits.append(f"unclear exit {p.rc}: {_last_line(p.err)}")
        elif p.rc != 0:
            row.clear_errors += 1
        # lines for the good shards must be the true samples
        good_lines = [ln for ln in p.lines if not ln.startswith("zz-bad.tar")]
        row.tally.add(compare(good_lines, good_lines, s.data.digests))
        row.tally.delivered += len(p.lines) - len(good_lines)
    return row


def _edited_manifest(s: Suite, d: str, edit: Callable[[dict], None]) -> str:
    with open(s.data.manifest) as f:
        m = json.load(f)
    edit(m)
    for sh in m["shards"]:
        sh["url"] = "http://placeholder/" + os.path.basename(sh["url"])
    path = os.path.join(d, "manifest.json")
    with open(path, "w") as f:
        json.dump(m, f)
    return path


def bad_manifest(kind: str) -> Callable[[Suite], Row]:
    row_names = {"checksum": "manifest with a wrong checksum", "size": "manifest with a wrong size",
                 "missing": "missing shard (404)"}

    def scenario(s: Suite) -> Row:
        row = Row(row_names[kind], "error")
        srv = s.server()
        try:
            d = s.tmp("badmanifest")

            def edit(m: dict) -> None:
                sh = m["shards"][len(m["shards"]) // 2]
                if kind == "checksum":
                    sh["xxh3_64"] = "0123456789abcdef"
                elif kind == "size":
                    sh["size"] = int(sh["size"]) + 512
                else:
                    sh["url"] = "no-such-shard.tar"
            path = _edited_manifest(s, d, edit)
            with open(path) as f:
                text = f.read().replace("http://placeholder/", srv.url)
            with open(path, "w") as f:
                f.write(text)
            p = run(cat_cmd(path, cache_dir=os.path.join(d, "cache"), epochs=1, workers=2,
                            extra=["--shuffle-mode", "none"]), bound=BOUND)
            ref_none = run(cat_cmd(s.data.manifest, workers=0, epochs=1, extra=["--shuffle-mode", "none"]),
                           bound=BOUND).lines
            row.runs += 1
            row.faults = 1
            if p.hung:
                row.hung += 1
            elif p.rc == 0:
                row.bad_exits.append("exit 0 with a bad manifest")
            elif p.clear_error:
                row.clear_errors += 1
                row.note = _last_line(p.err)[:100]
            else:
                row.bad_exits.append(f"unclear exit {p.rc}: {_last_line(p.err)}")
            row.tally.add(compare(ref_none[:len(p.lines)], p.lines, s.data.digests))
        finally:
            srv.stop()
        return row
    return _labelled(row_names[kind], scenario)


def journal_damage(kind: str) -> Callable[[Suite], Row]:
    names = {"delete": "journal deleted between runs", "delete_all": "journal + lock file deleted",
             "truncate": "journal truncated to 0 bytes", "truncate_half": "journal truncated to half",
             "header": "journal header overwritten", "pages": "journal pages overwritten with junk"}

    def scenario(s: Suite) -> Row:
        row = Row(names[kind], "error")
        d = s.tmp("jdamage")
        journal = os.path.join(d, "run.db")
        cmd = cat_cmd(s.data.manifest, journal=journal, cache_dir=os.path.join(d, "cache"), epochs=1,
                      commit_every=10, workers=0, extra=["--limit", "100"])
        first = run(cmd, bound=BOUND)
        if first.rc != 0:
            row.bad_exits.append(f"first run failed: {_last_line(first.err)}")
            return row
        size = os.path.getsize(journal)
        rng = random.Random(s.seed)
        if kind == "delete":
            os.unlink(journal)
        elif kind == "delete_all":
            for suffix in ("", "-wal", "-shm", ".lock"):
                if os.path.exists(journal + suffix):
                    os.unlink(journal + suffix)
            row.expect = "fresh"
        elif kind == "truncate":
            os.truncate(journal, 0)
        elif kind == "truncate_half":
            os.truncate(journal, size // 2)
        elif kind == "header":
            with open(journal, "r+b") as f:
                f.write(rng.randbytes(100))
        else:
            with open(journal, "r+b") as f:
                for _ in range(3):
                    page = rng.randrange(1, max(2, size // 4096))
                    f.seek(page * 4096)
                    f.write(rng.randbytes(4096))
        cmd2 = cat_cmd(s.data.manifest, journal=journal, cache_dir=os.path.join(d, "cache"), epochs=1,
                       commit_every=10, workers=0)
        p = run(cmd2, bound=BOUND)
        row.runs = 2
        row.faults = 1
        if kind == "delete_all":
            # nothing is left to say a run existed: starting fresh is the only honest outcome
            s.judge(row, p, "exact")
            row.note = "no trace left: starts fresh (documented)"
            return row
        if p.rc == 0:
            row.bad_exits.append(f"silent restart: exit 0 after printing {len(p.lines)} lines")
        elif p.clear_error and "journal" in p.err.lower():
            row.clear_errors += 1
            row.note = _last_line(p.err)[:100]
        else:
            row.bad_exits.append(f"unclear exit {p.rc}: {_last_line(p.err)}")
        row.tally.add(compare(s.ref[100:100 + len(p.lines)], p.lines, s.data.digests))
        return row
    return _labelled(names[kind], scenario)


def journal_two_writers(s: Suite) -> Row:
    """A second process opens the journal while the first holds it.  The
    server holds every shard request until the second has finished, so the
    two always overlap (on a loaded machine the first could otherwise end
    before the second starts, and nothing would be refused)."""
    row = Row("two processes open one journal (same rank)", "resume")
    srv = s.server(bytes_per_second=2e5)
    d = s.tmp("twowriters")
    journal = os.path.join(d, "run.db")
    cmd = cat_cmd(srv.url + "manifest.json", journal=journal, cache_dir=os.path.join(d, "cache"), epochs=1)
    second: List[Proc] = []
    threads: List[threading.Thread] = []

    def start_second(p) -> None:
        def go() -> None:
            try:
                t0 = time.monotonic()
                while time.monotonic() - t0 < 60 and p.poll() is None:
                    if os.path.exists(journal + ".lock") and os.path.getsize(journal + ".lock") > 0:
                        second.append(run(cmd, bound=60.0))
                        return
                    time.sleep(0.02)
            finally:
                srv.release()  # the first run goes on only once the second has ended
        th = threading.Thread(target=go, daemon=True)
        th.start()
        threads.append(th)

    srv.hold()
    try:
        first = run(cmd, bound=BOUND, on_start=start_second)
        for th in threads:
            th.join(70)
        row.runs = 1 + len(second)
        row.faults = len(second)
        s.judge(row, first, "exact")
        if not second:
            row.bad_exits.append("second process was never started")
        else:
            q = second[0]
            if q.rc != 0 and q.clear_error and "in use" in q.err:
                row.clear_errors += 1
                row.note = _last_line(q.err)[:100]
            else:
                row.bad_exits.append(f"second writer not refused clearly: exit {q.rc}: {_last_line(q.err)}")
            if q.lines:
                row.bad_exits.append(f"second writer printed {len(q.lines)} lines")
    finally:
        srv.release()
        srv.stop()
    return row


# ---------------------------------------------------------------------------
# fetch hardening (bounded waits, one budget, clear errors)
# ---------------------------------------------------------------------------
def hardening(name: str, faults: str, *, expect: str, max_per_path: int = 1, no_manifest: bool = False,
              env: Optional[Dict[str, str]] = None, workers: int = 2, within: float = BOUND,
              says: str = "", max_requests: Optional[int] = None, **srv_kw) -> Callable[[Suite], Row]:
    """A fetch fault that must end (``within`` s) as ``expect``; an error must
    say ``says``; no shard may get more than ``max_requests`` requests."""
    def scenario(s: Suite) -> Row:
        row = Row(name, expect)
        srv = s.server(faults, max_faults_per_path=max_per_path, **srv_kw)
        try:
            d = s.tmp("hard")
            if no_manifest:
                names = sorted(os.path.basename(p) for p in _shard_paths(s.data))
                src = srv.url + "{" + ",".join(names) + "}"
            else:
                src = srv.url + "manifest.json"
            p = run(cat_cmd(src, cache_dir=os.path.join(d, "cache"), epochs=1, workers=workers),
                    env=child_env(**(env or {})), bound=BOUND)
            s.judge(row, p)
            row.faults += sum(srv.faults.values())
            if not p.hung and p.seconds > within:
                row.bad_exits.append(f"took {p.seconds:.0f}s (bound {within:.0f}s)")
            if says and p.rc and says not in p.err:
                row.bad_exits.append(f"error does not say {says!r}: {_last_line(p.err)}")
            if max_requests is not None:
                worst = max((n for path, n in srv.requests.items() if path.endswith(".tar")), default=0)
                if worst > max_requests:
                    row.bad_exits.append(f"a shard got {worst} requests (budget {max_requests})")
        finally:
            srv.stop()
        return row
    return _labelled(name, scenario)


def remote_manifest_names_local_file(s: Suite) -> Row:
    row = Row("remote manifest names a local file", "error")
    d = s.tmp("remotelocal")
    with open(s.data.manifest) as f:
        m = json.load(f)
    m["shards"][1]["url"] = _shard_paths(s.data)[1]  # an absolute local path
    with open(os.path.join(d, "manifest.json"), "w") as f:
        json.dump(m, f)
    for name in os.listdir(s.data.root):
        if name.endswith(".tar"):
            shutil.copy(os.path.join(s.data.root, name), d)
    srv = FaultServer(d, seed=s.seed).start()
    try:
        p = run(cat_cmd(srv.url + "manifest.json", cache_dir=os.path.join(d, "cache"), epochs=1), bound=BOUND)
        s.judge(row, p)
        row.faults = 1
        if p.rc and "local file" not in p.err:
            row.bad_exits.append(f"error does not name the local file: {_last_line(p.err)}")
    finally:
        srv.stop()
    return row


def changed_file_ignoring_if_range(s: Suite) -> Row:
    """No manifest; a cut download is resumed from a server that ignores
    If-Range while the file was replaced: the 206 is of the new version."""
    row = Row("file replaced mid-download, If-Range ignored, no manifest", "exact")
    d = s.tmp("splice")
    v2 = make_dataset(os.path.join(d, "v2"), shards=6, samples=60, size_range=(1000, 12000), seed=s.seed + 977)
    root = os.path.join(d, "srv")
    shutil.copytree(s.data.root, root)
    for p in _shard_paths(v2):
        shutil.copy(p, os.path.join(root, os.path.basename(p) + ".v2"))
    srv = FaultServer(root, faults="truncate=1.0", seed=s.seed, max_faults_per_path=1, honour_if_range=False,
                      range_variant=".v2").start()
    try:
        names = sorted(os.path.basename(p) for p in _shard_paths(s.data))
        p = run(cat_cmd(srv.url + "{" + ",".join(names) + "}", cache_dir=os.path.join(d, "cache"), epochs=1),
                bound=BOUND)
        s.judge(row, p)
        row.faults += sum(srv.faults.values())
    finally:
        srv.stop()
    return row


def hardening_rows() -> List[Callable[[Suite], Row]]:
    slow = {"RESUMEWDS_FETCH_MIN_RATE": "2000", "RESUMEWDS_FETCH_RATE_WINDOW": "1"}
    return [
        # every request is answered so (ranged reads included): with one fault per
        # shard a ranged read could serve the data first, and the verdict would
        # depend on which request came first
        hardening("Retry-After 86400s (429)", "retry_after_huge=1.0", expect="error", within=20,
                  max_per_path=100000, says="beyond what is left"),
        hardening("Retry-After as an HTTP date a day ahead (503)", "retry_after_date=1.0", expect="error",
                  max_per_path=100000, within=20, says="beyond what is left"),
        hardening("body trickles 1 byte/0.5s (min rate)", "trickle=1.0", expect="exact", env=slow,
                  trickle_seconds=0.5),
        hardening("gzip Content-Encoding", "gzip=1.0", expect="error", max_per_path=100000, within=20,  # retried:
                  says="gzip-encoded", env={"RESUMEWDS_FETCH_ATTEMPTS": "3"}),  # a small budget, then the error
        hardening("HTML 200 error page, no manifest", "html200=1.0", expect="error", no_manifest=True,
                  max_per_path=100000, within=20, says="HTML page"),
        hardening("redirect loop", "redirect_loop=1.0", expect="error", max_per_path=100000, within=20,
                  says="redirect"),
        hardening("dead shard: one budget for prefetch + reader", "500=1.0", expect="error",
                  max_per_path=100000, workers=0, env={"RESUMEWDS_FETCH_ATTEMPTS": "4"}, max_requests=4),
        hardening("server ignores If-Range, truncated bodies", "truncate=0.6", expect="exact", max_per_path=2,
                  honour_if_range=False),
        _labelled("remote manifest names a local file", remote_manifest_names_local_file),
        _labelled("file replaced mid-download, If-Range ignored, no manifest", changed_file_ignoring_if_range),
    ] + __import__("chaos.fetchrows").fetchrows.fetch_fault_rows()  # wrong answers to Range, odd bodies
# --------------------------------------------------------------------------- end of fetch hardening


# ---------------------------------------------------------------------------
# sample digests: a download that fails its whole-shard check is
# repaired by re-fetching only the failing samples' byte ranges
# ---------------------------------------------------------------------------
def flipped_byte_repaired_by_range(faults: str, label: str, max_per_path: int) -> Callable[[Suite], Row]:
    def scenario(s: Suite) -> Row:
        import resumewds as rw

        row = Row(label, "exact")
        d = s.tmp("digests")
        root = os.path.join(d, "srv")
        shutil.copytree(s.data.root, root)
        paths = sorted(os.path.join(root, os.path.basename(p)) for p in _shard_paths(s.data))
        rw.build_manifest(paths, os.path.join(root, "manifest.json"), digests=True)  # version 3
        total = sum(os.path.getsize(p) for p in paths)
        srv = FaultServer(root, faults=faults, seed=s.seed, max_faults_per_path=max_per_path,
                          manifest=os.path.join(root, "manifest.json")).start()
        srv.script("/manifest.json", [None] * 1000)
        try:
            p = run(cat_cmd(srv.url + "manifest.json", cache_dir=os.path.join(d, "cache"), epochs=1), bound=BOUND)
            s.judge(row, p)
            row.faults += sum(srv.faults.values())
            sent = srv.bytes_sent - srv.bytes_by_path.get("/manifest.json", 0)
            row.note = f"sent {sent} bytes for {total} bytes of shards ({sent / total:.2f}x)"
            if srv.faults.get("flip_data", 0) < len(paths):
                row.bad_exits.append(f"only {srv.faults.get('flip_data', 0)} of {len(paths)} downloads flipped")
            # a whole-shard refetch of every flipped download would send >= 2x (the
            # ranged reads of a cold start add their own ranges on top: < 0.5x here)
            if sent >= 1.9 * total and max_per_path == 1:
                row.bad_exits.append(f"repairs were not by range: {row.note}")
        finally:
            srv.stop()
        return row

    return _labelled(label, scenario)


def sample_digest_rows() -> List[Callable[[Suite], Row]]:
    return [
        flipped_byte_repaired_by_range("flip_data=1.0", "flipped byte repaired by range", 1),
        flipped_byte_repaired_by_range("flip_data=0.5,reset=0.3,truncate=0.2",
                                       "flipped bytes + resets during ranged reads", 3),
    ]
# --------------------------------------------------------------------------- end of sample digests


# ---------------------------------------------------------------------------
# ranged reads: samples of shards not cached yet come
# by HTTP Range, each verified against its digest before delivery.  With a
# cache smaller than one shard nothing is prefetched, so every sample of the
# run is a ranged read and every injected fault hits one.
# ---------------------------------------------------------------------------
def ranged_reads(faults: str, label: str, max_per_path: int, cache_size: str = "1") -> Callable[[Suite], Row]:
    def scenario(s: Suite) -> Row:
        import resumewds as rw

        row = Row(label, "exact")
        d = s.tmp("ranged")
        root = os.path.join(d, "srv")
        shutil.copytree(s.data.root, root)
        paths = sorted(os.path.join(root, os.path.basename(p)) for p in _shard_paths(s.data))
        rw.build_manifest(paths, os.path.join(root, "manifest.json"), digests=True)  # version 3
        srv = FaultServer(root, faults=faults, seed=s.seed, max_faults_per_path=max_per_path,
                          manifest=os.path.join(root, "manifest.json")).start()
        srv.script("/manifest.json", [None] * 1000)
        try:
            env = dict(child_env(), RESUMEWDS_CACHE_SIZE=cache_size)
            p = run(cat_cmd(srv.url + "manifest.json", cache_dir=os.path.join(d, "cache"), epochs=1),
                    env=env, bound=BOUND)
            s.judge(row, p)
            row.faults += sum(srv.faults.values())
            shard_requests = sum(n for k, n in srv.requests.items() if k.endswith(".tar"))
            row.note = f"{shard_requests} shard requests (ranges) for {len(paths)} shards"
            if shard_requests <= 2 * len(paths):
                row.bad_exits.append(f"not read by range: {row.note}")
        finally:
            srv.stop()
        return row

    return _labelled(label, scenario)


def crash_ranged(kills: int) -> Callable[[Suite], Row]:
    """SIGKILL ``cat`` while it reads a v3 manifest by range and from partial downloads
    (a killed run leaves partials with torn tails: each sample is verified before use)."""
    def scenario(s: Suite) -> Row:
        import resumewds as rw

        row = Row(f"SIGKILL x{kills} during ranged reads (v3 manifest, 2 workers)", "resume")
        h = Harness(s.tmp("crash-ranged"), seed=s.seed, shards=6, samples=80)
        try:
            rw.build_manifest(_shard_paths(h.data), h.data.manifest, digests=True)  # version 3
            rep = h.crash_cat(kills, random.Random(f"{s.seed}:ranged"), bound=BOUND)
            shard_requests = sum(n for k, n in h.server.requests.items() if k.endswith(".tar"))
        finally:
            h.close()
        row.runs, row.faults, row.tally, row.hung = rep.runs, rep.kills, rep.tally, rep.hung
        row.bad_exits = list(rep.errors)
        row.note = (f"{rep.kills_in_download} kills mid-download, {shard_requests} shard requests "
                    f"(whole + ranges) for 6 shards")
        return row
    return _labelled("crash_ranged", scenario)


def ranged_read_rows() -> List[Callable[[Suite], Row]]:
    return [
        ranged_reads("flip_data=0.4,flip_header=0.2", "flipped bytes in ranged reads (never delivered)", 4),
        ranged_reads("reset=0.3,truncate=0.2", "resets + truncations during ranged reads", 4),
        crash_ranged(4),
    ]
# --------------------------------------------------------------------------- end of ranged reads


# ---------------------------------------------------------------------------
# input hardening: hostile tar sizes, bad
# manifests, bad CLI input, stdout on a full disk.  A clear error here is
# strict: exit > 0, no traceback, and the LAST stderr line is ``Error: ...``
# naming the thing (the shard, file, option or variable).
# ---------------------------------------------------------------------------

def _strict_error(p: Proc, *words: str) -> bool:
    lines = [ln for ln in p.err.splitlines() if ln.strip()]
    return (not p.hung and p.rc is not None and p.rc > 0 and "Traceback" not in p.err and bool(lines)
            and lines[-1].startswith("Error: ") and all(w in lines[-1] for w in words))


def _cli(*args: str) -> List[str]:
    return [sys.executable, "-m", "resumewds", *args]


def crafted_tar_sizes(s: Suite) -> Row:
    """The issue's shard (pax size=0, then a negative base-256 size after the
    last sample) and hypothesis-drawn size attacks, among good shards, through
    ``index`` and ``cat --workers 2``: each ends (data or a clear error)."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import seed as hseed

    from chaos.fuzz import crafted_size_tar, size_attack_shards

    row = Row("crafted tar sizes (pax size=0, negative base-256) -> index, cat", "either")
    cases: List[bytes] = [crafted_size_tar()]

    @hseed(s.seed)
    @settings(max_examples=4 if s.quick else 16, database=None, deadline=None,
              suppress_health_check=list(HealthCheck))
    @given(size_attack_shards())
    def collect(b: bytes) -> None:
        cases.append(b)

    collect()
    for i, b in enumerate(cases[:1 + (4 if s.quick else 16)]):
        d = s.tmp("crafted")
        good = [shutil.copy(g, d) for g in _shard_paths(s.data)[:2]]
        bad = os.path.join(d, "zz-crafted.tar")
        with open(bad, "wb") as f:
            f.write(b)
        for cmd in (_cli("index", *good, bad, "-o", os.path.join(d, "m.json")),
                    _cli("cat", *good, bad, "--workers", "2", "--cache-dir", os.path.join(d, "cache"))):
            p = run(cmd, bound=BOUND)
            row.runs += 1
            row.faults += 1
            if p.hung:
                row.hung += 1
                row.bad_exits.append(f"case {i}: {cmd[3]} hung")
            elif p.rc != 0 and not _strict_error(p, "zz-crafted.tar"):
                row.bad_exits.append(f"case {i}: {cmd[3]} unclear exit {p.rc}: {_last_line(p.err)}")
            elif p.rc != 0:
                row.clear_errors += 1
            if cmd[3] == "cat":
                good_lines = [ln for ln in p.lines if not ln.startswith("zz-crafted.tar")]
                row.tally.add(compare(good_lines, good_lines, s.data.digests))
                row.tally.delivered += len(p.lines) - len(good_lines)
                if i == 0 and (p.rc != 0 or len(p.lines) - len(good_lines) != 3):
                    row.bad_exits.append(f"the issue's shard: exit {p.rc}, "
                                         f"{len(p.lines) - len(good_lines)} of its 3 samples")
    row.note = f"{len(cases)} shards; the pax size=0 shard reads as its 3 samples (as tarfile does)"
    return row


_MANIFEST_EDITS: Dict[str, Tuple[Callable[[dict], None], str]] = {
    "negative offset": (lambda sh: sh["offsets"].__setitem__(1, -5), "negative"),
    "backwards offsets": (lambda sh: sh["offsets"].__setitem__(1, sh["offsets"][2] + 512), "backwards"),
    "float offset": (lambda sh: sh["offsets"].__setitem__(1, float(sh["offsets"][1])), "not an integer"),
    "offset 10^12": (lambda sh: sh["offsets"].__setitem__(-1, 10 ** 12), "past the shard's size"),
    "offset 2^64": (lambda sh: sh["offsets"].__setitem__(-1, 2 ** 64), "past the shard's size"),
    "samples \"10\"": (lambda sh: sh.__setitem__("samples", str(sh["samples"])), "'samples'"),
    "index ends at 10^11, no size": (lambda sh: (sh.pop("size"), sh.pop("xxh3_64"),
                                                 sh["offsets"].__setitem__(-1, 10 ** 11)), "file ends at byte"),
}


def malformed_manifest_input(s: Suite) -> Row:
    """Each malformed manifest through ``cat --workers 2``: a one-line error
    naming the manifest and shard; nothing wrong printed before it."""
    row = Row("malformed manifest (offsets negative/backwards/float/huge, samples str)", "error")
    ref_none = run(cat_cmd(s.data.manifest, workers=0, epochs=1, extra=["--shuffle-mode", "none"]),
                   bound=BOUND).lines
    for name, (edit, words) in _MANIFEST_EDITS.items():
        d = s.tmp("manifest-input")
        with open(s.data.manifest) as f:
            m = json.load(f)
        for sh in m["shards"]:
            sh["url"] = os.path.join(s.data.root, os.path.basename(sh["url"]))
        edit(m["shards"][2])
        path = os.path.join(d, "manifest.json")
        with open(path, "w") as f:
            json.dump(m, f)
        p = run(cat_cmd(path, workers=2, epochs=1, cache_dir=os.path.join(d, "cache"),
                        extra=["--shuffle-mode", "none"]), bound=BOUND)
        row.runs += 1
        row.faults += 1
        shard = os.path.basename(m["shards"][2]["url"])
        if p.hung:
            row.hung += 1
        elif _strict_error(p, shard, words):
            row.clear_errors += 1
        else:
            row.bad_exits.append(f"{name}: exit {p.rc}: {_last_line(p.err)}")
        row.tally.add(compare(ref_none[:len(p.lines)], p.lines, s.data.digests))
    row.note = f"{len(_MANIFEST_EDITS)} kinds"
    return row


def bad_cli_input(s: Suite) -> Row:
    """Bad arguments and environment: each one line naming what is wrong."""
    row = Row("bad CLI input (dir, glob, duplicates, sizes, workers, window, -o, env)", "error")
    d = s.tmp("cli-input")
    m, root = s.data.manifest, s.data.root
    cases: List[Tuple[List[str], Dict[str, str], Tuple[str, ...]]] = [
        (["cat", root], {}, (root, "is a directory")),
        (["index", root, "-o", os.path.join(d, "x.json")], {}, (root, "is a directory")),
        (["cat", os.path.join(root, "shard-*.tar")], {}, ("not expanded",)),
        (["cat", m, m], {}, ("twice",)),
        (["cat", m, "--cache-size", "abc"], {}, ("--cache-size",)),
        (["cat", m, "--cache-size", "-5GB"], {}, ("--cache-size",)),
        (["cat", m], {"RESUMEWDS_CACHE_SIZE": "abc"}, ("RESUMEWDS_CACHE_SIZE",)),
        (["cat", m, "--workers", "-1"], {}, ("--workers",)),
        (["cat", m, "--shuffle-window", "0"], {}, ("--shuffle-window",)),
        (["index", m, "-o", "/nonexistent/dir/x"], {}, ("/nonexistent/dir",)),
        (["report", os.path.join(d, "none.db"), "-o", "/nonexistent/dir/x"], {}, ("/nonexistent/dir",)),
    ]
    junk = os.path.join(d, "junk")
    os.makedirs(os.path.join(junk, "dir.tar"))
    open(os.path.join(junk, "empty.tar"), "wb").close()
    with open(os.path.join(junk, "text.tar"), "w") as f:
        f.write("not a tar\n" * 100)
    import gzip

    # gzip data that is not a gzipped tar (a gzipped tar is a compressed shard, and verifies)
    with open(os.path.join(junk, "gz.tar"), "wb") as g:
        g.write(gzip.compress(b"gzipped text, not a tar\n" * 100))
    for name in ("empty.tar", "text.tar", "gz.tar"):
        cases.append((["verify", os.path.join(junk, name)], {}, ()))
    for args, env, words in cases:
        p = run(_cli(*args), env=child_env(**env), bound=BOUND)
        row.runs += 1
        row.faults += 1
        verify_failed = args[0] == "verify" and p.rc == 1 and "0 ok, 1 failed" in p.err and "Traceback" not in p.err
        if p.hung:
            row.hung += 1
        elif _strict_error(p, *words) or verify_failed:
            row.clear_errors += 1
        else:
            row.bad_exits.append(f"{' '.join(args[:2])}: exit {p.rc}: {_last_line(p.err)}")
    row.note = f"{len(cases)} inputs"
    return row


def stdout_full_with_journal(s: Suite) -> Row:
    """``cat --journal > /dev/full``: one-line error, nothing unprinted is
    committed, and the rerun delivers everything exactly once."""
    row = Row("stdout on a full disk (/dev/full) with --journal", "resume")
    if not os.path.exists("/dev/full"):
        row.skip = "no /dev/full"
        return row
    d = s.tmp("devfull")
    j = os.path.join(d, "run.db")
    import subprocess

    with open("/dev/full", "w") as full:
        t0 = time.monotonic()
        try:
            q = subprocess.run(cat_cmd(s.data.manifest, journal=j, workers=2, epochs=1), stdout=full,
                               stderr=subprocess.PIPE, text=True, env=child_env(), timeout=BOUND)
            p = Proc(q.returncode, False, False, time.monotonic() - t0, "", q.stderr)
        except subprocess.TimeoutExpired:
            p = Proc(None, False, True, BOUND, "", "")
    row.runs += 1
    row.faults += 1
    if p.hung:
        row.hung += 1
    elif _strict_error(p, "stdout", "No space left"):
        row.clear_errors += 1
        row.note = _last_line(p.err)[:100]
    else:
        row.bad_exits.append(f"exit {p.rc}: {_last_line(p.err)}")
    again = run(cat_cmd(s.data.manifest, journal=j, workers=2, epochs=1), bound=BOUND)
    row.runs += 1
    if again.rc != 0:
        row.bad_exits.append(f"rerun exit {again.rc}: {_last_line(again.err)}")
    row.tally.add(compare(s.ref, again.lines, s.data.digests))
    return row


def escaped_keys(s: Suite) -> Row:
    """Keys with TAB, newline, CR, backslash and a non-UTF-8 byte through
    ``cat --workers 2``: every line has three fields and unescapes to the
    key tarfile reads; plain keys are printed byte-identical."""
    import io
    import tarfile

    from resumewds.cli import unescape_field

    row = Row("keys with TAB/newline/CR/backslash/non-UTF-8 -> cat line format", "exact")
    d = s.tmp("keys")
    path = os.path.join(d, "keys.tar")
    names = ["tab\there", "new\nline", "cr\rx", "back\\slash", "plain-0001", "caf\xe9"]
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT, encoding="latin-1") as tf:
        for k in names:
            for ext, data in (("txt", k.encode("latin-1")), ("cls", b"1")):
                ti = tarfile.TarInfo(f"{k}.{ext}")
                ti.size = len(data)
                tf.addfile(ti, io.BytesIO(data))
    want = [k.encode("latin-1").decode("utf-8", "surrogateescape") for k in names]
    p = run(_cli("cat", path, "--workers", "2", "--cache-dir", os.path.join(d, "cache")), bound=BOUND)
    row.runs = row.faults = 1
    row.tally.expected = len(want)
    if p.hung:
        row.hung += 1
        return row
    fields = [ln.split("\t") for ln in p.lines]
    row.tally.delivered = len(fields)
    if p.rc != 0:
        row.bad_exits.append(f"exit {p.rc}: {_last_line(p.err)}")
    elif len(fields) != len(want) or any(len(f) != 3 for f in fields):
        row.bad_exits.append(f"{len(fields)} lines for {len(want)} samples, or a line without 3 fields")
    elif [unescape_field(f[1]) for f in fields] != want or fields[4][1] != "plain-0001":
        row.tally.corrupt = sum(unescape_field(f[1]) != k for f, k in zip(fields, want))
    row.note = "escaped: " + ", ".join(f[1] for f in fields[:4]) if fields else ""
    return row


def input_hardening_rows() -> List[Callable[[Suite], Row]]:
    return [crafted_tar_sizes, malformed_manifest_input, bad_cli_input, stdout_full_with_journal, escaped_keys]

# ---------------------------------------------------------------------------
# end of input hardening
# ---------------------------------------------------------------------------


def matrix(quick: bool) -> List[Callable[[Suite], Row]]:
    from chaos.integrity import integrity_rows  # lost -wal, replaced cache entry, secrets in URLs
    from chaos.skiprows import skip_rows  # a local shard corrupted in place, skipped whole

    kills = 4 if quick else 12
    return [
        net("reset mid-body", "reset=0.6"),
        net("HTTP 500", "500=0.6"),
        net("HTTP 503 + Retry-After", "503=0.6"),
        net("HTTP 429 + Retry-After", "429=0.6"),
        net("truncated body (Content-Length)", "truncate=0.6"),
        net("truncated, no Content-Length, at sample boundary", "truncate_nolen=0.6"),
        net("truncated at sample boundary, no manifest", "truncate_nolen=0.6", no_manifest=True, expect="either"),
        net("flipped byte in member data (repaired)", "flip_data=0.6"),
        net("flipped byte in a tar header (repaired)", "flip_header=0.6"),
        net("stall past the read timeout", "stall=0.3", max_per_path=1),
        net("server down 3s, then back", "", down=3.0),
        net("mixed transport faults, 30%/request", "mixed:0.3", max_per_path=3, runs=1 if quick else 3),
        crash_cycles(kills, "cat"),
        crash_cycles(max(3, kills // 2), "train"),
        kill_worker,
        *worker_fault_rows(),  # PID 1, SIGSTOP of a worker (chaos/workerfaults.py)
        tmpfs_full,
        readonly_cache,
        cache_damage_between(3 if quick else 8),
        cache_damage_during,
        stale_partials,
        reboot,
        journal_dir_full,
        fuzz_rows(300 if quick else 3000),
        malformed_through_cat,
        bad_manifest("checksum"),
        bad_manifest("size"),
        bad_manifest("missing"),
        journal_damage("delete"),
        journal_damage("truncate"),
        journal_damage("truncate_half"),
        journal_damage("header"),
        journal_damage("pages"),
        journal_damage("delete_all"),
        journal_two_writers,
        *integrity_rows(),
        *input_hardening_rows(),  # input hardening
        *exactly_once_rows(quick),  # exactly-once hardening block (below)
        *s3_rows(quick),  # the s3 block below
    # fetch hardening; sample digests and ranged reads
    ] + hardening_rows() + sample_digest_rows() + ranged_read_rows() + skip_rows()


# ---------------------------------------------------------------------------
# exactly-once hardening (the "fail" event among them)
# ---------------------------------------------------------------------------
def _start(cmd: Sequence[str]) -> Tuple[subprocess.Popen, object, object]:
    import subprocess

    fo, fe = tempfile.TemporaryFile(), tempfile.TemporaryFile()
    p = subprocess.Popen(list(cmd), stdout=fo, stderr=fe, stdin=subprocess.DEVNULL, env=child_env(),
                         start_new_session=True)
    return p, fo, fe


def _finish(p, fo, fe, t0: float, bound: float) -> Proc:
    import subprocess

    hung = False
    try:
        p.wait(max(0.1, bound - (time.monotonic() - t0)))
    except subprocess.TimeoutExpired:
        hung = True
        os.killpg(p.pid, signal.SIGKILL)
        p.wait()
    fo.seek(0)
    fe.seek(0)
    return Proc(rc=p.returncode, killed=False, hung=hung, seconds=time.monotonic() - t0,
                out=fo.read().decode(errors="replace"), err=fe.read().decode(errors="replace"))


def sigterm_cycles(n: int) -> Callable[[Suite], Row]:
    """SIGTERM to the whole process group of ``cat --journal`` (as Slurm sends it), rerun."""
    def scenario(s: Suite) -> Row:
        row = Row(f"SIGTERM x{n} to cat --journal (exit 143, commit, rerun)", "resume")
        srv = s.server(bytes_per_second=4e5)
        d = s.tmp("sigterm")
        journal = os.path.join(d, "run.db")
        cmd = cat_cmd(srv.url + "manifest.json", journal=journal, cache_dir=os.path.join(d, "cache"),
                      epochs=1, commit_every=100000)
        rng = random.Random(f"{s.seed}:sigterm")
        out: List[str] = []
        try:
            for i in range(n + 6):
                t0 = time.monotonic()
                p, fo, fe = _start(cmd)
                if i < n:
                    # once it delivers (a SIGTERM before the loader exists kills
                    # it, as it would any program: nothing is committed then)
                    while p.poll() is None and os.fstat(fo.fileno()).st_size == 0 \
                            and time.monotonic() - t0 < BOUND:
                        time.sleep(0.02)
                    time.sleep(rng.uniform(0.0, 0.5))
                    if p.poll() is None:
                        os.killpg(p.pid, signal.SIGTERM)
                        row.faults += 1
                q = _finish(p, fo, fe, t0, BOUND)
                row.runs += 1
                out += q.lines
                if q.hung:
                    row.hung += 1
                    break
                if q.rc == 0 or (q.rc == -signal.SIGTERM and len(out) == len(s.ref)):
                    break  # (-15: the signal came after the last commit and close)
                if q.rc == 143 and "stopped by signal 15" in _last_line(q.err):
                    row.clear_errors += 1
                    row.note = _last_line(q.err)[:100]
                else:
                    row.bad_exits.append(f"exit {q.rc}: {_last_line(q.err)}")
                    break
            row.tally.add(compare(s.ref, out, s.data.digests))
        finally:
            srv.stop()
        return row
    return _labelled("sigterm_cycles", scenario)


def journal_started_together(s: Suite) -> Row:
    """Two ``cat --journal`` started at the same moment: one resumes, the other is refused."""
    row = Row("two runs started together on one journal", "resume")
    d = s.tmp("together")
    journal = os.path.join(d, "run.db")
    # a throttled server and a cold cache for each run, so the two runs surely
    # overlap (a local run can finish before the other one has even started)
    srv = s.server(bytes_per_second=4e5)
    src = srv.url + "manifest.json"
    try:
        first = cat_cmd(src, journal=journal, cache_dir=os.path.join(d, "cache0"), epochs=1,
                        commit_every=10, workers=0, extra=["--limit", "100"])
        q = run(first, bound=BOUND)
        row.runs += 1
        out = list(q.lines)
        # every shard request is held until one of the two has ended: the two
        # surely overlap however loaded the machine is
        srv.hold()
        t0 = time.monotonic()
        started = [_start(cat_cmd(src, journal=journal, cache_dir=os.path.join(d, f"cache{i}"), epochs=1,
                                  commit_every=10, workers=0)) for i in (1, 2)]

        def release_when_one_ends() -> None:
            while time.monotonic() - t0 < 90 and all(p.poll() is None for p, _, _ in started):
                time.sleep(0.05)
            srv.release()
        releaser = threading.Thread(target=release_when_one_ends, daemon=True)
        releaser.start()
        procs = [_finish(p, fo, fe, t0, BOUND) for p, fo, fe in started]
        releaser.join(5)
    finally:
        srv.release()
        srv.stop()
    row.runs += 2
    row.faults = 1
    for q in procs:
        if q.hung:
            row.hung += 1
        elif q.rc == 0:
            out += q.lines
        elif q.clear_error and "in use" in q.err:
            row.clear_errors += 1
            row.note = _last_line(q.err)[:100]
            if q.lines:
                row.bad_exits.append(f"refused run printed {len(q.lines)} lines")
        else:
            row.bad_exits.append(f"exit {q.rc}: {_last_line(q.err)}")
    if sum(1 for q in procs if q.rc == 0) != 1:
        row.bad_exits.append(f"{sum(1 for q in procs if q.rc == 0)} of 2 concurrent runs finished")
    row.tally.add(compare(s.ref, out, s.data.digests))
    return row


def fail_is_journaled(s: Suite) -> Row:
    """on_error=raise: the missing shard is 'failed' in the journal and counted as a failure."""
    row = Row("shard fails under on_error=raise: journaled as failed", "error")
    d = s.tmp("failjournal")
    with open(s.data.manifest) as f:
        m = json.load(f)
    root = os.path.dirname(os.path.abspath(s.data.manifest))
    for sh in m["shards"]:
        sh["url"] = os.path.join(root, os.path.basename(sh["url"]))
    gone = m["shards"][2]["url"] + ".missing"
    m["shards"][2]["url"] = gone
    path = os.path.join(d, "manifest.json")
    with open(path, "w") as f:
        json.dump(m, f)
    journal = os.path.join(d, "run.db")
    p = run(cat_cmd(path, journal=journal, cache_dir=os.path.join(d, "cache"), epochs=1, workers=2,
                    extra=["--shuffle-mode", "none"]), bound=BOUND)
    row.runs, row.faults = 1, 1
    ref_none = run(cat_cmd(s.data.manifest, workers=0, epochs=1, extra=["--shuffle-mode", "none"]),
                   bound=BOUND).lines
    if p.hung:
        row.hung += 1
    elif p.rc == 0:
        row.bad_exits.append("exit 0 with a missing shard")
    elif p.clear_error:
        row.clear_errors += 1
        from resumewds.journal import status

        st = status(journal)
        state = {x["url"]: x["state"] for x in st["shards"]["list"]}.get(gone)
        if state != "failed" or st["counts"]["failures"] != 1:
            row.bad_exits.append(f"journal: shard state {state}, failures {st['counts']['failures']}")
        row.note = f"journal: {state}, failures {st['counts']['failures']}"
    else:
        row.bad_exits.append(f"unclear exit {p.rc}: {_last_line(p.err)}")
    row.tally.add(compare(ref_none[:len(p.lines)], p.lines, s.data.digests))
    return row


def exactly_once_rows(quick: bool) -> List[Callable[[Suite], Row]]:
    return [sigterm_cycles(3 if quick else 8), journal_started_together, fail_is_journaled]
# s3: the same faults over s3:// (moto's S3 server on 127.0.0.1 behind
# chaos/s3proxy.py); rows named "s3: ...".  SKIP when moto[server] is missing.
# ---------------------------------------------------------------------------
_S3_CREDS = {"AWS_ACCESS_KEY_ID": "chaos", "AWS_SECRET_ACCESS_KEY": "chaos", "AWS_DEFAULT_REGION": "us-east-1",
             "AWS_EC2_METADATA_DISABLED": "true", "AWS_CONFIG_FILE": os.devnull,
             "AWS_SHARED_CREDENTIALS_FILE": os.devnull}
_S3_LOCK = threading.Lock()
_S3_SERVER: List[str] = []  # the moto endpoint, started once per process


def _s3_endpoint() -> str:
    """moto's server mode on 127.0.0.1 (started on first use, stopped at exit)."""
    with _S3_LOCK:
        if not _S3_SERVER:
            import logging

            from moto.server import ThreadedMotoServer

            logging.getLogger("werkzeug").setLevel(logging.ERROR)
            srv = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
            srv.start()
            host, port = srv.get_host_and_port()
            _S3_SERVER.append(f"http://{host}:{port}")
        return _S3_SERVER[0]


def _s3_bucket(s: Suite, endpoint: str, name: str) -> str:
    import boto3

    bucket = f"chaos-{name}-{s.seed}-{random.Random().getrandbits(32):08x}"
    c = boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="chaos", aws_secret_access_key="chaos",
                     region_name="us-east-1")
    c.create_bucket(Bucket=bucket)
    for fn in sorted(os.listdir(s.data.root)):
        c.upload_file(os.path.join(s.data.root, fn), bucket, "data/" + fn)
    return bucket


def _s3_ready(row: Row) -> bool:
    try:
        import boto3  # noqa: F401
        import moto.server  # noqa: F401
    except ImportError as exc:
        row.skip = f"needs boto3 and moto[server]: {exc}"
        return False
    return True


def s3_net(name: str, faults: str, *, max_per_path: int = 2, kills: int = 0,
           expect: str = "exact", env: Optional[Dict[str, str]] = None, workers: int = 2,
           within: float = BOUND, says: str = "", max_requests: Optional[int] = None,
           **proxy_kw: Any) -> Callable[[Suite], Row]:
    """``cat s3://bucket/data/manifest.json`` through the fault proxy (faults hit shards);
    with ``kills``, runs with a journal are SIGKILLed ``kills`` times and rerun.  Without:
    the run must end within ``within`` s, an error must say ``says``, and no shard may
    get more than ``max_requests`` GETs (the fetch hardening's checks)."""
    def scenario(s: Suite) -> Row:
        from chaos.s3proxy import S3FaultProxy

        row = Row(name, "resume" if kills else expect)
        if not _s3_ready(row):
            return row
        endpoint = _s3_endpoint()
        bucket = _s3_bucket(s, endpoint, "k" if kills else "n")
        px = S3FaultProxy(endpoint, faults=faults, seed=s.seed, max_faults_per_path=max_per_path,
                          stall_seconds=3.0, bytes_per_second=1.5e6 if kills else None, **proxy_kw).start()
        px.script(f"/{bucket}/data/manifest.json", [None] * 1000)
        try:
            d = s.tmp("s3")
            env_ = child_env(AWS_ENDPOINT_URL=px.url, **_S3_CREDS, **(env or {}))
            src = f"s3://{bucket}/data/manifest.json"
            if not kills:
                p = run(cat_cmd(src, cache_dir=os.path.join(d, "cache"), epochs=1, workers=workers), env=env_,
                        bound=BOUND)
                s.judge(row, p)
                if not p.hung and p.seconds > within:
                    row.bad_exits.append(f"took {p.seconds:.0f}s (bound {within:.0f}s)")
                if says and p.rc and says not in p.err:
                    row.bad_exits.append(f"error does not say {says!r}: {_last_line(p.err)}")
                if max_requests is not None:
                    worst = max((n for path, n in px.requests.items() if path.endswith(".tar")), default=0)
                    if worst > max_requests:
                        row.bad_exits.append(f"a shard got {worst} GETs (budget {max_requests})")
            else:
                journal = os.path.join(d, "run.db")
                cmd = cat_cmd(src, journal=journal, cache_dir=os.path.join(d, "cache"), epochs=1)
                rng = random.Random(f"{s.seed}:s3kill")
                kept: List[str] = []
                made = 0
                while True:
                    before = committed_samples(journal)
                    kill_at = rng.uniform(1.0, 5.0) if made < kills else None
                    p = run(cmd, env=env_, kill_after=kill_at, bound=BOUND, cache_dir=os.path.join(d, "cache"))
                    row.runs += 1
                    after = committed_samples(journal)
                    kept.extend(p.lines[: max(0, after - before)])
                    if p.hung:
                        row.hung += 1
                        break
                    if p.killed:
                        made += 1
                        row.faults += 1
                        continue
                    if p.rc != 0:
                        row.bad_exits.append(f"exit {p.rc}: {_last_line(p.err)}")
                    break
                row.tally.add(compare(s.ref, kept, s.data.digests))
                row.note = f"{made} kills"
            row.faults += sum(px.faults.values())
        finally:
            px.stop()
        return row
    return _labelled(name, scenario)


def s3_missing_object(s: Suite) -> Row:
    """A shard the manifest lists is not in the bucket: NoSuchKey, a clear error, no retries
    (at most one GET per reader: 2 workers and their prefetch threads)."""
    row = Row("s3: object missing from the bucket (NoSuchKey)", "error")
    if not _s3_ready(row):
        return row
    import boto3

    from chaos.s3proxy import S3FaultProxy

    endpoint = _s3_endpoint()
    bucket = _s3_bucket(s, endpoint, "m")
    shards = sorted(n for n in os.listdir(s.data.root) if n.endswith(".tar"))
    boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="chaos", aws_secret_access_key="chaos",
                 region_name="us-east-1").delete_object(Bucket=bucket, Key="data/" + shards[len(shards) // 2])
    px = S3FaultProxy(endpoint).start()
    try:
        d = s.tmp("s3missing")
        env = child_env(AWS_ENDPOINT_URL=px.url, **_S3_CREDS)
        s.judge(row, run(cat_cmd(f"s3://{bucket}/data/manifest.json", cache_dir=os.path.join(d, "cache"),
                                 epochs=1), env=env, bound=BOUND))
        row.faults = 1
        gets = px.requests.get(f"/{bucket}/data/{shards[len(shards) // 2]}", 0)
        # each reader (2 workers, their prefetch threads) asks once; none retries a permanent error
        if gets > 6:
            row.bad_exits.append(f"NoSuchKey was asked {gets} times")
    finally:
        px.stop()
    return row


def s3_rows(quick: bool) -> List[Callable[[Suite], Row]]:
    return [
        s3_net("s3: 503 SlowDown (throttling)", "slowdown=0.6"),
        s3_net("s3: body cut by a connection reset", "reset=0.6"),
        s3_net("s3: HTTP 500 InternalError", "500=0.6"),
        s3_net("s3: stalled body (read timeout)", "stall=0.3", max_per_path=1),
        s3_net("s3: mixed faults, 30%/request", "mixed:0.3", max_per_path=3),
        s3_net(f"s3: SIGKILL x{2 if quick else 6} of cat --journal (mixed faults)", "mixed:0.1", max_per_path=1,
               kills=2 if quick else 6),
        _labelled("s3: object missing from the bucket (NoSuchKey)", s3_missing_object),
        # the fetch hardening, over s3
        s3_net("s3: body trickles at 200 B/s (min rate)", "trickle=1.0", max_per_path=1,
               env={"RESUMEWDS_FETCH_MIN_RATE": "2000", "RESUMEWDS_FETCH_RATE_WINDOW": "1"},
               trickle_bytes_per_second=200.0),
        s3_net("s3: SlowDown with Retry-After 86400s", "slowdown=1.0", max_per_path=100000, expect="error",
               within=20, says="beyond what is left", max_requests=6, retry_after=86400),
        s3_net("s3: dead object: one budget for prefetch + reader", "500=1.0", max_per_path=100000,
               expect="error", workers=0, env={"RESUMEWDS_FETCH_ATTEMPTS": "4"}, max_requests=4),
    ]


# ---- mixtures -------------------------------------------------
# A two-source, two-phase curriculum (examples/curriculum.py) over a faulty http server,
# killed with SIGKILL and restarted with 0/3/1 workers: see chaos/mixcrash.py.

def mixture_kills(kills: int) -> Callable[[Suite], Row]:
    def scenario(s: Suite) -> Row:
        import collections

        from chaos.mixcrash import campaign

        row = Row(f"SIGKILL x{kills}, two-source curriculum over http (0/3/1 workers)", "resume")
        rep = campaign(s.tmp("mixture"), kills, random.Random(f"{s.seed}:mixture"))
        want, got = collections.Counter(rep.expected), collections.Counter(rep.committed)
        row.runs, row.faults = rep.runs, rep.kills + sum(rep.faults.values())
        row.tally = Tally(expected=len(rep.expected), delivered=len(rep.committed),
                          lost=sum((want - got).values()), repeated=sum((got - want).values()),
                          misordered=int(want == got and rep.committed != rep.expected))
        row.bad_exits = list(rep.errors)
        row.note = f"{rep.kills} kills, faults {rep.faults}; lines are steps (samples, phase, loss)"
        return row
    return _labelled("mixture_kills", scenario)


_matrix_without_mixtures = matrix


def matrix(quick: bool) -> List[Callable[[Suite], Row]]:  # the matrix above, with the mixture rows
    return _matrix_without_mixtures(quick) + [mixture_kills(3 if quick else 8)]


HEADER = ("fault", "runs", "faults injected", "samples expected", "delivered", "lost", "repeated",
          "corrupt delivered", "clear-error exits", "verdict")


def format_table(rows: Sequence[Row], notes: bool = True) -> str:
    cells = [HEADER]
    for r in rows:
        t = r.tally
        v = r.verdict + (f" ({r.skip})" if r.skip else "")
        if r.tally.misordered:
            v += " (order differs)"
        cells.append((r.fault, str(r.runs), str(r.faults), str(t.expected), str(t.delivered), str(t.lost),
                      str(t.repeated), str(t.corrupt), str(r.clear_errors), v))
    widths = [max(len(c[i]) for c in cells) for i in range(len(HEADER))]
    out = ["| " + " | ".join(c[i].ljust(widths[i]) for i in range(len(HEADER))) + " |" for c in cells]
    out.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    if notes:
        extra = [f"- {r.fault}: {r.note}" for r in rows if r.note]
        bad = [f"- {r.fault}: " + "; ".join(r.bad_exits[:3]) for r in rows if r.bad_exits]
        if extra:
            out += ["", "Notes:"] + extra
        if bad:
            out += ["", "Failures:"] + bad
    return "\n".join(out)


def run_matrix(seed: int, quick: bool, work: Optional[str] = None, only: Optional[Sequence[str]] = None,
               jobs: int = 3, progress: bool = True) -> List[Row]:
    """Run the matrix; return its rows (in matrix order)."""
    own = work is None
    work = work or tempfile.mkdtemp(prefix="resumewds-chaos-")
    try:
        suite = Suite(work, seed, quick)
        scenarios = matrix(quick)
        if only:
            scenarios = [sc for sc in scenarios
                         if any(o in _name_of(sc, suite) or o in getattr(sc, "__name__", "") for o in only)]
        rows: List[Optional[Row]] = [None] * len(scenarios)

        def one(i: int) -> None:
            t0 = time.monotonic()
            try:
                r = scenarios[i](suite)
            except Exception as exc:  # a harness bug is a failure, not a crash of the table
                r = Row(_name_of(scenarios[i], suite), "exact")
                r.bad_exits.append(f"harness error {type(exc).__name__}: {exc}")
            r.seconds = time.monotonic() - t0
            rows[i] = r
            if progress:
                print(f"  [{r.seconds:5.1f}s] {r.verdict:4} {r.fault}", file=sys.stderr, flush=True)

        with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as ex:
            list(ex.map(one, range(len(scenarios))))
        return [r for r in rows if r is not None]
    finally:
        reap_orphans()
        if own:
            shutil.rmtree(work, ignore_errors=True)


def _name_of(sc: Callable, suite: Suite) -> str:
    return getattr(sc, "label", None) or getattr(sc, "__name__", "?")


def _labelled(label: str, fn: Callable[[Suite], Row]) -> Callable[[Suite], Row]:
    fn.label = label  # type: ignore[attr-defined]
    return fn


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m chaos run", description=__doc__.split("\n\n")[0])
    g = p.add_mutually_exclusive_group()
    g.add_argument("--quick", action="store_true", help="The short matrix (under ~2 minutes).")
    g.add_argument("--soak", type=float, metavar="MINUTES", help="Repeat the matrix with new seeds.")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--jobs", type=int, default=3, help="Scenarios run at once.")
    p.add_argument("--only", action="append", help="Run scenarios whose name contains this (repeatable).")
    a = p.parse_args(argv)
    t0 = time.monotonic()
    rows: List[Row] = []
    if a.soak:
        seed = a.seed
        while time.monotonic() - t0 < a.soak * 60:
            rows.extend(run_matrix(seed, False, only=a.only, jobs=a.jobs))
            seed += 1
        rows = _merge(rows)
    else:
        rows = run_matrix(a.seed, a.quick, only=a.only, jobs=a.jobs)
    print(format_table(rows))
    failed = [r for r in rows if r.verdict == "FAIL"]
    mode = "quick" if a.quick else (f"soak {a.soak:g} min" if a.soak else "full")
    print(f"\nchaos run ({mode}, seed {a.seed}): {len(rows)} scenarios, "
          f"{sum(r.verdict == 'PASS' for r in rows)} pass, {len(failed)} fail, "
          f"{sum(r.verdict == 'SKIP' for r in rows)} skipped, {time.monotonic() - t0:.0f}s")
    return 1 if failed else 0


def _merge(rows: List[Row]) -> List[Row]:
    by: Dict[str, Row] = {}
    for r in rows:
        m = by.get(r.fault)
        if m is None:
            by[r.fault] = r
            continue
        m.runs += r.runs
        m.faults += r.faults
        m.tally.add(r.tally)
        m.clear_errors += r.clear_errors
        m.bad_exits += r.bad_exits
        m.hung += r.hung
        m.skip = m.skip or r.skip
    return list(by.values())


if __name__ == "__main__":
    sys.exit(main())
