"""Real multi-process runs: torchrun ranks, balanced splits, kill and elastic resume.

Every launch goes through ``python -m torch.distributed.run`` (gloo, CPU,
``OMP_NUM_THREADS=1``) on a free port, driving ``tests/dist_driver.py`` (or
``examples/train_ddp.py``), which logs every rank's batch of every step.
The checks compare those logs with the plan, which is the definition of the
global sequence: position ``i`` of epoch ``e`` is sample
``Plan.epoch(e).sample_at(i)``, and synth shards name sample ``j`` of shard
``s`` ``s{s:06d}_{j:06d}``.

Launches cost several seconds each (torch import, rendezvous), so each test
combines several checks per launch.  The kill/resume tests are marked
``slow``; ``pytest -m 'not slow'`` keeps one launch (~5 s).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import sqlite3
import subprocess
import sys
import time
from typing import Dict, List, Optional, Sequence, Tuple

import pytest

import resumewds as rw
from resumewds.journal import resolve_resume, run_journal_paths
from resumewds.journal._status import status
from resumewds.plan._plan import Layout, Plan
from resumewds.plan._world import world_from_env
from resumewds.synth import write_shards

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
DRIVER = os.path.join(REPO, "tests", "dist_driver.py")
EXAMPLE = os.path.join(REPO, "examples", "train_ddp.py")

pytestmark = [
    pytest.mark.skipif(not dist.is_available() or sys.platform == "win32",
                       reason="needs torch.distributed and POSIX signals"),
    pytest.mark.timeout(240),
]

# 5 x 37 = 185 samples: no step size used here (8, 4, 12) divides it, so every
# run ends its epochs with a short step.
SHARDS, SAMPLES = 5, 37
SEED, WINDOW = 3, 2


# ---------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------

def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def child_env(cache_dir: str) -> Dict[str, str]:
    env = dict(os.environ)
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR",
                "MASTER_PORT", "HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy",
                "ALL_PROXY", "all_proxy", "RESUMEWDS_CACHE_SIZE", "RESUMEWDS_VERBOSE"):
        env.pop(var, None)
    env.update(OMP_NUM_THREADS="1", RESUMEWDS_CACHE_DIR=cache_dir, NO_PROXY="127.0.0.1,localhost",
               PYTHONPATH=REPO + os.pathsep + env.get("PYTHONPATH", ""))
    return env


class Job:
    """One torchrun launch, its output in ``log`` (stdout and stderr)."""

    def __init__(self, nproc: int, script: str, args: Sequence[str], cache_dir: str, log: str,
                 nnodes: int = 1, node_rank: int = 0, master_port: Optional[int] = None,
                 launch: Optional[Sequence[str]] = None, env: Optional[Dict[str, str]] = None):
        self.log = log
        nodes = [f"--nnodes={nnodes}", f"--node_rank={node_rank}"] if nnodes > 1 else []
        where = list(launch) if launch is not None else \
            ["--master_addr=127.0.0.1", f"--master_port={master_port or free_port()}", *nodes]
        cmd = [sys.executable, "-m", "torch.distributed.run", f"--nproc_per_node={nproc}", *where, script, *args]
        self._out = open(log, "ab")
        # own session: the test can kill the whole tree, and nothing else
        self.proc = subprocess.Popen(cmd, stdout=self._out, stderr=subprocess.STDOUT, cwd=REPO,
                                     env={**child_env(cache_dir), **(env or {})}, start_new_session=True)

    def text(self) -> str:
        with open(self.log, errors="replace") as f:
            return f.read()

    def wait(self, timeout: float = 120) -> None:
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"torchrun timed out; output:\n{self.text()[-4000:]}") from None
        finally:
            self._out.close()
        assert rc == 0, f"torchrun exited {rc}; output:\n{self.text()[-4000:]}"

    def descendants(self) -> List[int]:
        children: Dict[int, List[int]] = {}
        for d in os.listdir("/proc"):
            if not d.isdigit():
                continue
            try:
                with open(f"/proc/{d}/stat") as f:
                    stat = f.read()
            except OSError:
                continue
            ppid = int(stat.rsplit(")", 1)[1].split()[1])
            children.setdefault(ppid, []).append(int(d))
        out, todo = [], [self.proc.pid]
        while todo:
            p = todo.pop()
            for c in children.get(p, []):
                out.append(c)
                todo.append(c)
        return out

    def kill(self) -> None:
        """SIGKILL the whole job at once, as a node failure would.

        torchrun starts every rank in a session of its own, so killing
        torchrun's process group would leave the ranks running: freeze the
        tree (SIGSTOP), then SIGKILL every process of it.
        """
        kill_all([self])


def kill_all(jobs: Sequence[Job]) -> None:
    """Freeze every process of every job (SIGSTOP), then SIGKILL them all:
    several torchrun invocations (nodes) fail at the same instant."""
    procs = [p for j in jobs for p in [j.proc.pid] + j.descendants()]
    for sig in (signal.SIGSTOP, signal.SIGKILL):
        for p in procs + [q for j in jobs for q in j.descendants() if q not in procs]:
            try:
                os.kill(p, sig)
            except ProcessLookupError:
                pass
    for j in jobs:
        j.proc.wait(30)
        j._out.close()


def wait_for(pred, timeout: float, what: str, job: Optional[Job] = None) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if pred():
            return
        if job is not None and job.proc.poll() is not None:
            raise AssertionError(f"job ended before {what}; output:\n{job.text()[-4000:]}")
        time.sleep(0.05)
    raise AssertionError(f"timed out waiting for {what}")


def read_log(out: str, tag: str) -> Dict[int, List[dict]]:
    """``{rank: [step lines]}`` of the driver's per-rank JSONL files."""
    runs: Dict[int, List[dict]] = {}
    pat = re.compile(rf"^{re.escape(tag)}\.rank(\d+)\.jsonl$")
    for name in os.listdir(out):
        m = pat.match(name)
        if m:
            with open(os.path.join(out, name)) as f:
                runs[int(m.group(1))] = [json.loads(line) for line in f if line.endswith("\n")]
    return dict(sorted(runs.items()))


def key_of(plan: Plan, epoch: int, pos: int) -> str:
    s, j = plan.epoch(epoch).sample_at(pos)
    return f"s{s:06d}_{j:06d}"


def delivered(lines: Dict[int, List[dict]], first_step: Optional[int] = None,
              last_step: Optional[int] = None, by_position: bool = False) -> List[Tuple[int, int, str]]:
    """Non-padding ``(epoch, position, key)`` in global order: by step, then
    rank slices in rank order (``by_position``: the step's samples sorted by
    position, for multi-node layouts, where a node's ranks take every
    ``nodes``-th position of a step).  Asserts every rank logged every step."""
    by_step: Dict[int, Dict[int, dict]] = {}
    for r, ls in lines.items():
        for ln in ls:
            by_step.setdefault(ln["step"], {})[r] = ln
    ranks = sorted(lines)
    seq = []
    for k in sorted(by_step):
        if (first_step is not None and k < first_step) or (last_step is not None and k > last_step):
            continue
        assert sorted(by_step[k]) == ranks, f"step {k} logged by ranks {sorted(by_step[k])}, not {ranks}"
        step = []
        for r in ranks:
            ln = by_step[k][r]
            step.extend((ln["epoch"], i, key) for i, key, pad in zip(ln["idx"], ln["keys"], ln["pads"])
                        if not pad)
        seq.extend(sorted(step) if by_position else step)
    return seq


def full_sequence(plan: Plan, total: int, epochs: int) -> List[Tuple[int, int, str]]:
    return [(e, i, key_of(plan, e, i)) for e in range(epochs) for i in range(total)]


def check_steps_contiguous(lines: Dict[int, List[dict]], first: int) -> int:
    """Every rank logged the same steps ``first, first+1, ...``; returns the count."""
    counts = set()
    for r, ls in lines.items():
        steps = [ln["step"] for ln in ls]
        assert steps == list(range(first, first + len(steps))), f"rank {r} steps {steps[:5]}..."
        counts.add(len(steps))
    assert len(counts) == 1, f"ranks logged different numbers of steps: {counts}"
    return counts.pop()


# ---------------------------------------------------------------------------
# fixtures
# ---------------------------------------------------------------------------

@pytest.fixture(scope="module")
def data(tmp_path_factory) -> str:
    """Shards plus manifest.json (relative urls, so the directory can be served)."""
    d = str(tmp_path_factory.mktemp("dist-data"))
    write_shards(d, shards=SHARDS, samples=SAMPLES, size_range=(10, 200), seed=5)
    from resumewds.cache import ShardStore

    with ShardStore(cache_dir=os.path.join(d, ".index-cache")) as store:
        rw.build_manifest(os.path.join(d, f"shard-{{000000..{SHARDS - 1:06d}}}.tar"),
                          os.path.join(d, "manifest.json"), store=store)
    return d


@pytest.fixture(scope="module")
def plan(data) -> Plan:
    return rw.WebDataset(os.path.join(data, "manifest.json"), seed=SEED, shuffle="window",
                         shuffle_window=WINDOW).plan


# ---------------------------------------------------------------------------
# in-process: where rank and world size come from
# ---------------------------------------------------------------------------

def test_world_from_env_precedence(monkeypatch, tmp_path):
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    assert world_from_env() == (0, 1)
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "2")
    assert world_from_env() == (1, 2)  # per-node launchers: one node
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert world_from_env() == (3, 4)  # global variables win over local ones
    assert world_from_env(rank=2) == (2, 4)  # each argument overrides on its own
    assert world_from_env(world_size=8) == (3, 8)
    assert world_from_env(0, 1) == (0, 1)
    with pytest.raises(ValueError, match="not in a world"):
        world_from_env(rank=4)
    monkeypatch.setenv("RANK", "x")
    with pytest.raises(ValueError, match="RANK"):
        world_from_env()
    monkeypatch.setenv("RANK", "3")
    # an initialized process group wins over the environment
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        assert world_from_env() == (0, 1)
        assert world_from_env(rank=1, world_size=2) == (1, 2)
    finally:
        dist.destroy_process_group()


# ---------------------------------------------------------------------------
# one launch: splits for keep / pad / drop, shared cache, journals
# ---------------------------------------------------------------------------

def test_two_ranks_balanced_split_shared_cache_and_journals(data, plan, tmp_path):
    """2 ranks x 2 workers over HTTP: per epoch the ranks' samples are disjoint
    and complete, every rank yields the same number of batches, padding is
    marked and counted, each step's rank slices concatenate to the global
    sequence, both ranks share one cache without downloading a shard twice,
    and the journals of both ranks agree."""
    from chaos.faultserver import FaultServer

    out, cache = str(tmp_path / "out"), str(tmp_path / "cache")
    total, batch, world, epochs = SHARDS * SAMPLES, 4, 2, 2
    # throttled, so that the ranks' (and workers') first reads of a shard overlap
    with FaultServer(data, bytes_per_second=2_000_000) as srv:
        job = Job(world, DRIVER, ["--data", srv.url + "manifest.json", "--out", out,
                                  "--journal", os.path.join(out, "{remainder}.db"),
                                  "--remainders", "keep,pad,drop", "--epochs", str(epochs),
                                  "--batch", str(batch), "--workers", "2", "--seed", str(SEED),
                                  "--window", str(WINDOW)],
                  cache, str(tmp_path / "torchrun.log"))
        job.wait()
        requests = {p: n for p, n in srv.requests.items() if p.endswith(".tar")}
        sent = dict(srv.bytes_by_path)

    # -- shared cache: every shard fetched exactly once, by one process -------
    sizes = {"/" + n: os.path.getsize(os.path.join(data, n))
             for n in os.listdir(data) if n.endswith(".tar")}
    assert requests == dict.fromkeys(sizes, 1), requests
    assert {p: sent[p] for p in sizes} == sizes

    step = batch * world
    for rem in ("keep", "pad", "drop"):
        lines = read_log(out, f"run-{rem}")
        assert sorted(lines) == [0, 1]
        n_steps = check_steps_contiguous(lines, 0)
        per_epoch = Layout(batch, world, 0, rem).num_steps(total, 0)
        assert n_steps == per_epoch * epochs
        for r in (0, 1):
            with open(os.path.join(out, f"run-{rem}.rank{r}.done")) as f:
                done = json.load(f)
            assert done["min_steps"] == done["max_steps"] == n_steps
            # padding is counted in the loader's stats as "pads"
            assert done["pads"] == done["pads_seen"] == sum(sum(ln["pads"]) for ln in lines[r])
        for e in range(epochs):
            ep_lines = {r: [ln for ln in ls if ln["epoch"] == e] for r, ls in lines.items()}
            assert len({len(v) for v in ep_lines.values()}) == 1, f"{rem}: unequal batches in epoch {e}"
            keys = [k for ls in ep_lines.values() for ln in ls
                    for k, pad in zip(ln["keys"], ln["pads"]) if not pad]
            assert len(keys) == len(set(keys)), f"{rem}: a sample went to two ranks in epoch {e}"
            kept = total if rem != "drop" else (total // step) * step
            assert set(keys) == {key_of(plan, e, i) for i in range(kept)}
            pads = [(ln["idx"][j], ln["keys"][j]) for ls in ep_lines.values() for ln in ls
                    for j, pad in enumerate(ln["pads"]) if pad]
            left = total % step
            want = {"keep": world - left if 0 < left < world else 0,
                    "pad": (step - left) % step, "drop": 0}[rem]
            assert len(pads) == want
            # padding repeats real samples from the start of the epoch
            assert all(k == key_of(plan, e, i) for i, k in pads)
        # global order: step by step, rank slices in rank order
        want_seq = [x for x in full_sequence(plan, total, epochs)
                    if rem != "drop" or x[1] < (total // step) * step]
        assert delivered(lines) == want_seq

        # -- journals: one file per rank, all read by status, commits agree ---
        jpath = os.path.join(out, f"{rem}.db")
        assert run_journal_paths(jpath) == [jpath, os.path.join(out, f"{rem}.rank1.db")]
        st = status(jpath)
        assert [(x["rank"], x["latest_step"], x["commits"]) for x in st["ranks"]] == \
            [(0, n_steps - 1, n_steps), (1, n_steps - 1, n_steps)]
        point = resolve_resume(jpath)
        assert (point["step"], point["world_size"], point["epoch"], point["position"]) == \
            (n_steps - 1, 2, epochs, 0)

    # -- `resumewds status` reads every rank's file ---------------------------
    from click.testing import CliRunner

    from resumewds.cli._main import cli

    res = CliRunner().invoke(cli, ["status", os.path.join(out, "keep.db"), "--json"])
    assert res.exit_code == 0, res.output
    assert [x["rank"] for x in json.loads(res.output)["ranks"]] == [0, 1]

    # -- a step that not every rank committed is detected ---------------------
    copy = tmp_path / "partial"
    copy.mkdir()
    for name in os.listdir(out):
        if name.startswith("keep."):  # the rank files, their WAL and lock files
            shutil.copy(os.path.join(out, name), copy)
    last = resolve_resume(str(copy / "keep.db"))["step"]
    with sqlite3.connect(copy / "keep.rank1.db") as conn:
        conn.execute("DELETE FROM commits WHERE step = ?", (last,))
    conn.close()
    with pytest.raises(rw.JournalIncompleteCommit, match=rf"step {last} .*missing on rank\(s\) 1"):
        resolve_resume(str(copy / "keep.db"), last)
    point = resolve_resume(str(copy / "keep.db"))
    assert point["step"] == last - 1
    assert point["skipped_incomplete"][0] == {"step": last, "missing_ranks": [1],
                                              "disagreeing_ranks": []}
    # ... and by the loaders of a relaunch: rank 0 resolves, both ranks refuse
    job = Job(world, DRIVER, ["--data", os.path.join(data, "manifest.json"), "--out", str(copy),
                              "--tag", "bad", "--journal", str(copy / "keep.db"),
                              "--resume-step", str(last), "--expect-error", "--batch", str(batch),
                              "--seed", str(SEED), "--window", str(WINDOW)],
              cache, str(tmp_path / "relaunch.log"))
    job.wait()
    for r in range(world):
        with open(copy / f"bad.rank{r}.error") as f:
            err = json.load(f)
        assert err["type"] == "JournalIncompleteCommit", err
        assert "missing on rank(s) 1" in err["message"]


# ---------------------------------------------------------------------------
# kill the whole job mid-epoch, resume with another world size / worker count
# ---------------------------------------------------------------------------

@pytest.mark.slow
def test_kill_and_resume_with_other_world_sizes(data, plan, tmp_path, remainder="keep"):
    """2 ranks x 2 workers, SIGKILLed mid-epoch; the journal is copied and
    resumed as 1 rank x 0 workers and as 3 ranks x 1 worker (concurrently).
    For each: the committed prefix of the killed run followed by everything
    the resumed ranks deliver, in (step, rank) order, is exactly the
    uninterrupted global sequence: nothing lost, nothing repeated.  (The
    split test covers "pad" and "drop"; "keep" is the policy whose final step
    depends most on the world size: 8 vs 4 vs 12 samples per step.)"""
    total, batch, epochs = SHARDS * SAMPLES, 4, 3
    cache = str(tmp_path / "cache")
    out = str(tmp_path / "out")
    journal = os.path.join(out, "j", "run.db")
    os.makedirs(os.path.dirname(journal))
    common = ["--data", os.path.join(data, "manifest.json"), "--remainders", remainder,
              "--epochs", str(epochs), "--batch", str(batch), "--seed", str(SEED),
              "--window", str(WINDOW)]
    job = Job(2, DRIVER, common + ["--out", out, "--tag", "a", "--journal", journal,
                                   "--workers", "2", "--step-sleep", "0.03"],
              cache, str(tmp_path / "a.log"))
    per_epoch = Layout(batch, 2, 0, remainder).num_steps(total, 0)
    kill_at = per_epoch + per_epoch // 2  # the middle of epoch 1

    def reached() -> bool:
        return any(ln["step"] >= kill_at for ln in read_log(out, "a").get(0, []))

    wait_for(reached, 90, f"step {kill_at}", job)
    job.kill()

    point = resolve_resume(journal)
    assert point is not None and point["world_size"] == 2
    s, e, p = point["step"], point["epoch"], point["position"]
    assert e == 1 and 0 < p < total, point  # killed mid-epoch
    before = delivered(read_log(out, "a"), last_step=s)
    full = full_sequence(plan, total, epochs)
    assert before == full[:e * total + p]

    jobs = {}
    for world, workers in ((1, 0), (3, 1)):
        jdir = os.path.join(out, f"j{world}")
        shutil.copytree(os.path.dirname(journal), jdir)
        jobs[world] = Job(world, DRIVER, common + ["--out", out, "--tag", f"w{world}", "--resume",
                                                   "--journal", os.path.join(jdir, "run.db"),
                                                   "--workers", str(workers)],
                          cache, str(tmp_path / f"w{world}.log"))
    for world, j in jobs.items():
        j.wait()
        lines = read_log(out, f"w{world}")
        assert sorted(lines) == list(range(world))
        n = check_steps_contiguous(lines, s + 1)
        after = delivered(lines)
        assert after == full[e * total + p:], f"world {world}: resumed sequence differs"
        # the steps of the resumed run: the rest of epoch e on the new grid, then whole epochs
        lay = Layout(batch, world, 0, remainder)
        assert n == lay.num_steps(total, p) + (epochs - e - 1) * lay.num_steps(total, 0)
        jp = os.path.join(out, f"j{world}", "run.db")
        st = status(jp)
        assert all(x["latest_step"] == s + n for x in st["ranks"] if x["rank"] < world)
        assert resolve_resume(jp)["world_size"] == world
        assert st["events_by_kind"].get("resume", 0) >= world


# ---------------------------------------------------------------------------
# torchrun's own elastic restarts: a rank killed, the workers restarted by torchrun
# ---------------------------------------------------------------------------

#: the elastic agent's own log (its restarts and rendezvous) in the job's output
AGENT_LOG = {"LOGLEVEL": "INFO"}


def elastic(port: int, host: Optional[bool] = None) -> List[str]:
    """torchrun's elastic launch: 1 to 2 nodes, 3 restarts, c10d rendezvous on 127.0.0.1
    (short timeouts: a dead node is forgotten after 2 s of missed heartbeats).  The
    driver runs with ``--elastic`` (its process group's keys prefixed per restart:
    ``dist_driver.elastic_group``)."""
    conf = "last_call_timeout=1,keep_alive_interval=1,keep_alive_max_attempt=2,join_timeout=60"
    if host is not None:
        conf += f",is_host={int(host)}"
    return ["--nnodes=1:2", "--max_restarts=3", "--rdzv_backend=c10d", f"--rdzv_endpoint=127.0.0.1:{port}",
            "--rdzv_id=elastic", f"--rdzv_conf={conf}", "--monitor_interval=0.2"]


def generations(lines: Dict[int, List[dict]]) -> Tuple[Dict[int, List[dict]], List[Tuple[int, int]]]:
    """What each rank delivered for good under elastic restarts: a generation of
    ranks (``gen``) counts up to the step the next one resumed at (later steps
    were not committed by every rank, so they are delivered again); returns
    those lines by rank, and each generation's ``(world size, first step)``."""
    gens: Dict[float, Tuple[int, int]] = {}
    for ls in lines.values():
        for ln in ls:
            w, first = gens.get(ln["gen"], (ln["world"], ln["step"]))
            gens[ln["gen"]] = (w, min(first, ln["step"]))
    order = sorted(gens)
    until = {g: gens[order[i + 1]][1] if i + 1 < len(order) else float("inf") for i, g in enumerate(order)}
    kept: Dict[int, List[dict]] = {}
    for r, ls in lines.items():
        good = [ln for ln in ls if ln["step"] < until[ln["gen"]]]
        if good:
            kept[r] = sorted(good, key=lambda ln: ln["step"])
    return kept, [gens[g] for g in order]


def union_in_order(kept: Dict[int, List[dict]]) -> List[Tuple[int, int, str]]:
    """``delivered`` over generations of different world sizes: each step's samples
    from the ranks of the generation that delivered it, by position."""
    by_step: Dict[int, List[dict]] = {}
    for ls in kept.values():
        for ln in ls:
            by_step.setdefault(ln["step"], []).append(ln)
    seq = []
    for k in sorted(by_step):
        lns = by_step[k]
        assert len({ln["gen"] for ln in lns}) == 1, f"step {k} kept from two generations"
        assert sorted(ln["rank"] for ln in lns) == list(range(lns[0]["world"])), f"step {k}: ranks missing"
        seq.extend(sorted((ln["epoch"], i, key) for ln in lns
                          for i, key, pad in zip(ln["idx"], ln["keys"], ln["pads"]) if not pad))
    return seq


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_torchrun_restarts_a_killed_rank_and_the_union_is_the_uninterrupted_run(data, plan, tmp_path):
    """``torchrun --nnodes=1:2 --max-restarts=3`` (c10d on 127.0.0.1), 2 ranks x 1 worker:
    rank 1 is SIGKILLed mid-epoch; torchrun restarts the workers, which resume from the
    journal.  What the ranks delivered, each generation up to the step the next one
    resumed at, is the uninterrupted global sequence: nothing lost, nothing twice."""
    total, batch, epochs = SHARDS * SAMPLES, 4, 2
    out = str(tmp_path / "out")
    journal = os.path.join(out, "run.db")
    os.makedirs(out)
    args = ["--data", os.path.join(data, "manifest.json"), "--epochs", str(epochs), "--batch", str(batch),
            "--seed", str(SEED), "--window", str(WINDOW), "--out", out, "--tag", "e", "--journal", journal,
            "--resume", "--workers", "1", "--step-sleep", "0.05", "--elastic"]
    job = Job(2, DRIVER, args, str(tmp_path / "cache"), str(tmp_path / "e.log"), launch=elastic(free_port()),
              env=AGENT_LOG)
    kill_at = Layout(batch, 2, 0, "keep").num_steps(total, 0) // 2  # the middle of epoch 0
    wait_for(lambda: any(ln["step"] >= kill_at for ln in read_log(out, "e").get(1, [])), 120,
             f"step {kill_at}", job)
    with open(os.path.join(out, "pid.rank1")) as f:
        os.kill(int(f.read()), signal.SIGKILL)
    job.wait(270)
    lines = read_log(out, "e")
    kept, gens = generations(lines)
    print("generations (world size, first step):", gens)
    assert len(gens) >= 2 and all(w == 2 for w, _ in gens), gens  # restarted by torchrun, same world
    first_gen = min(ln["gen"] for ln in lines[1])
    killed_at = max(ln["step"] for ln in lines[1] if ln["gen"] == first_gen)  # the killed rank's last step
    assert kill_at <= killed_at and 0 < gens[1][1] <= killed_at + 1, gens  # resumed where it was killed
    assert union_in_order(kept) == full_sequence(plan, total, epochs)
    assert status(journal)["events_by_kind"].get("resume", 0) >= 2


@pytest.mark.slow
@pytest.mark.timeout(420)
def test_torchrun_elastic_world_shrinks_after_a_node_dies(data, plan, tmp_path):
    """Two torchrun agents (nodes) of 1 rank each, ``--nnodes=1:2``: the second node is
    SIGKILLed whole mid-epoch; the first's worker fails, torchrun restarts it, and the
    rendezvous completes with 1 node: the run resumes from the journal at world size 1
    and finishes.  The union over the generations is the uninterrupted sequence."""
    total, batch, epochs = SHARDS * SAMPLES, 4, 2
    out = str(tmp_path / "out")
    journal = os.path.join(out, "run.db")
    os.makedirs(out)
    args = ["--data", os.path.join(data, "manifest.json"), "--epochs", str(epochs), "--batch", str(batch),
            "--seed", str(SEED), "--window", str(WINDOW), "--partitions", "1", "--out", out, "--tag", "w",
            "--journal", journal, "--resume", "--workers", "0", "--step-sleep", "0.05", "--elastic"]
    port = free_port()
    # node a hosts the rendezvous store (b connects to it, retrying until it is up), so that
    # the run outlives node b
    a = Job(1, DRIVER, args, str(tmp_path / "cache"), str(tmp_path / "a.log"), launch=elastic(port, host=True),
            env=AGENT_LOG)
    b = Job(1, DRIVER, args, str(tmp_path / "cache"), str(tmp_path / "b.log"), launch=elastic(port, host=False),
            env=AGENT_LOG)
    kill_at = Layout(batch, 2, 0, "keep").num_steps(total, 0) // 2

    def two_ranks_past_kill_at() -> bool:
        return any(ln["world"] == 2 and ln["step"] >= kill_at for ln in read_log(out, "w").get(1, []))

    wait_for(two_ranks_past_kill_at, 120, f"step {kill_at} at world size 2", a)
    kill_all([b])  # node b fails whole: its agent and its worker
    a.wait(270)
    kept, gens = generations(read_log(out, "w"))
    print("generations (world size, first step):", gens)
    worlds = [w for w, _ in gens]
    assert 2 in worlds and worlds[-1] == 1 and gens[-1][1] > 0, gens  # the world shrank; resumed, not restarted
    assert union_in_order(kept) == full_sequence(plan, total, epochs)


# ---------------------------------------------------------------------------
# the example: DDP training, kill, resume, same model
# ---------------------------------------------------------------------------

_STEP = re.compile(r"rank=(\d+) step=(\d+) epoch=(\d+) n=(\d+) pads=(\d+) keys=(\w+) loss=(\S+)")


def _steps(text: str) -> Dict[Tuple[int, int], Tuple[str, ...]]:
    return {(int(m[0]), int(m[1])): m[2:] for m in _STEP.findall(text)}


@pytest.mark.slow
def test_train_ddp_example_resumes_after_kill(tmp_path):
    """examples/train_ddp.py, uninterrupted vs SIGKILLed and resumed (with a
    different worker count): every step after the resume sees the same
    batches and computes the same loss, and the final weights are identical."""
    cache = str(tmp_path / "cache")
    base = ["--epochs", "2", "--ckpt-every", "3"]
    ref = Job(2, EXAMPLE, base + ["--data", str(tmp_path / "ref" / "data"),
                                  "--ckpt-dir", str(tmp_path / "ref" / "run")],
              cache, str(tmp_path / "ref.log"))
    run = ["--data", str(tmp_path / "run" / "data"), "--ckpt-dir", str(tmp_path / "run" / "run")]
    first = Job(2, EXAMPLE, base + run + ["--workers", "2", "--step-sleep", "0.03"], cache,
                str(tmp_path / "first.log"))
    wait_for(lambda: any(r == 0 and k >= 40 for r, k in _steps(first.text())), 120,
             "step 40", first)
    first.kill()
    ref.wait()
    resumed = Job(2, EXAMPLE, base + run + ["--workers", "0"], cache, str(tmp_path / "resumed.log"))
    resumed.wait()

    want = _steps(ref.text())
    got_first, got = _steps(first.text()), _steps(resumed.text())
    m = re.search(r"rank=0 resumed step=(\d+)", resumed.text())
    assert m, resumed.text()[-3000:]
    s = int(m.group(1))
    assert 0 < s < 40 and (s + 1) % 3 == 0
    # before the kill: the same run as the reference
    assert {k: v for k, v in got_first.items() if k[1] <= s} == \
        {k: v for k, v in want.items() if k[1] <= s}
    # after: the rest of the reference, step for step (batches and losses)
    assert got == {k: v for k, v in want.items() if k[1] > s}
    digests = re.findall(r"rank=\d+ done steps=(\d+) weights=(\w+)", resumed.text())
    assert len(digests) == 2 and len(set(digests)) == 1
    assert digests == re.findall(r"rank=\d+ done steps=(\d+) weights=(\w+)", ref.text())
