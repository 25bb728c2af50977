"""Preemption: a real SIGTERM to a real process stops it at
a step boundary, it commits what it delivered, exits 143, and the rerun
continues with exactly the uninterrupted sequence."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest

import resumewds as rw

# not from conftest: a spawned DataLoader worker imports this module, and there
# ``conftest`` is the repository root's
REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")


def _env(cache_dir: str) -> dict:
    env = dict(os.environ)
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "RESUMEWDS_VERBOSE"):
        env.pop(var, None)
    env.update(PYTHONPATH=REPO + os.pathsep + env.get("PYTHONPATH", ""), RESUMEWDS_CACHE_DIR=cache_dir,
               OMP_NUM_THREADS="1")
    return env


@pytest.mark.parametrize("workers,group", [  # the group case by default; the others under -m slow
    pytest.param(0, False, marks=pytest.mark.slow), pytest.param(2, False, marks=pytest.mark.slow), (2, True)])
def test_cat_journal_sigterm_commits_what_it_printed_and_exits_143(make_shards, tmp_path, cache_dir,
                                                                   workers, group):
    paths = make_shards(shards=10, samples=300, size_range=(10, 20))
    manifest = str(tmp_path / "m.json")
    rw.build_manifest(paths, manifest)
    base = [sys.executable, "-m", "resumewds", "cat", manifest, "--seed", "3", "--shuffle",
            "--epochs", "2", "--workers", str(workers), "--chunk", "16"]
    ref = subprocess.run(base, env=_env(cache_dir), capture_output=True, text=True, timeout=120)
    assert ref.returncode == 0, ref.stderr
    ref_lines = ref.stdout.splitlines()
    assert len(ref_lines) == 6000
    journal = str(tmp_path / "run.db")
    cmd = base + ["--journal", journal, "--commit-every", "100000"]  # only the SIGTERM commits
    p = subprocess.Popen(cmd, env=_env(cache_dir), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True, start_new_session=True)
    head = [p.stdout.readline() for _ in range(500)]  # mid-run: SIGTERM at any moment is exact
    if group:  # as Slurm does: the workers get it too, and must outlive it
        os.killpg(p.pid, signal.SIGTERM)
    else:
        p.send_signal(signal.SIGTERM)
    rest = p.stdout.read()
    err = p.stderr.read()
    assert p.wait(timeout=60) == 143, err
    printed = [x.rstrip("\n") for x in head] + rest.splitlines()
    assert 500 <= len(printed) < 6000
    msg = err.strip().splitlines()
    assert len(msg) == 1 and "stopped by signal 15" in msg[0] and journal in msg[0], err
    assert "Traceback" not in err
    # the rerun continues at the next line: nothing lost, nothing twice
    again = subprocess.run(cmd, env=_env(cache_dir), capture_output=True, text=True, timeout=120)
    assert again.returncode == 0, again.stderr
    assert printed + again.stdout.splitlines() == ref_lines


def _train(work: str, cache_dir: str, *extra: str) -> subprocess.Popen:
    cmd = [sys.executable, os.path.join(REPO, "examples", "train.py"), "--work", work,
           "--shards", "4", "--samples", "24", "--epochs", "2", "--batch-size", "8",
           "--workers", "2", "--commit-every", "100", *extra]
    return subprocess.Popen(cmd, env=_env(cache_dir), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def _steps(text: str):
    return [line for line in text.splitlines() if line.startswith("step ")]


@pytest.mark.slow
def test_train_example_sigterm_checkpoints_commits_and_resumes_exactly(tmp_path, cache_dir):
    ref = _train(str(tmp_path / "ref"), cache_dir)
    out, err = ref.communicate(timeout=300)
    assert ref.returncode == 0, err
    ref_steps = _steps(out)
    assert len(ref_steps) == 24

    work = str(tmp_path / "run")
    p = _train(work, cache_dir, "--step-delay", "0.3")
    lines = []
    while len(lines) < 5:
        line = p.stdout.readline()
        assert line, p.stderr.read()
        lines.append(line)
    p.send_signal(signal.SIGTERM)
    out, err = p.communicate(timeout=120)
    assert p.returncode == 143, err
    first = "".join(lines) + out
    assert "preempted at step" in first and "Traceback" not in err
    p2 = _train(work, cache_dir)
    out2, err2 = p2.communicate(timeout=300)
    assert p2.returncode == 0, err2
    assert out2.startswith("resume step ")
    # committed at the step it stopped: not one step replayed, none lost
    assert _steps(first) + _steps(out2) == ref_steps


def test_request_stop_ends_iteration_at_a_step_boundary(make_shards):
    paths = make_shards(shards=2, samples=20)
    loader = rw.WebLoader(rw.WebDataset(paths), batch_size=4, num_workers=2,
                          collate_fn=lambda s: [x["__key__"] for x in s])
    got = []
    for batch in loader:
        got.append(batch)
        if len(got) == 3:
            loader.request_stop()
    assert len(got) == 3 and loader.preempted and loader.position == 12
    state = loader.state_dict()
    loader.clear_stop()
    rest = list(loader)
    assert len(rest) == 7
    fresh = rw.WebLoader(rw.WebDataset(paths), batch_size=4, num_workers=2,  # webdataset's split, uninterrupted
                         collate_fn=lambda s: [x["__key__"] for x in s])
    assert got + rest == list(fresh)
    assert state["position"] == 12


_LIVE = """
import sys, resumewds as rw
loader = rw.WebLoader(rw.WebDataset(sys.argv[1:]), batch_size=2, num_workers=2, preempt=True)
it = iter(loader)
next(it)
print("bye", flush=True)
"""


def test_exit_with_a_live_iterator_does_not_hang(make_shards, cache_dir):
    """Workers outlive SIGTERM only until the loader stops them: multiprocessing's
    exit handler (SIGTERM, then join) must still end them."""
    paths = make_shards(shards=2, samples=200)
    p = subprocess.run([sys.executable, "-c", _LIVE, *paths], env=_env(cache_dir), capture_output=True,
                       text=True, timeout=60)
    assert p.returncode == 0 and p.stdout == "bye\n", p.stderr
    assert "Traceback" not in p.stderr and "killed by signal" not in p.stderr, p.stderr


def _term_myself(worker_id: int) -> None:
    # runs in the worker after torch's own start-up (which installs torch's
    # SIGTERM handler) and before the loader's first step there: where a
    # scheduler's signal to the whole process group can land
    os.kill(os.getpid(), signal.SIGTERM)


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_workers_outlive_a_sigterm_that_lands_while_they_start(make_shards, method):
    """A preemption signal that reaches a worker before it installed its
    handlers waits for them (blocked from the fork on): the worker outlives it
    and the epoch is whole, instead of "worker exited unexpectedly"."""
    if method not in __import__("multiprocessing").get_all_start_methods():
        pytest.skip(f"no {method} start method here")
    paths = make_shards(shards=4, samples=20)
    fresh = rw.WebLoader(rw.WebDataset(paths), batch_size=4, num_workers=2,
                         collate_fn=lambda s: [x["__key__"] for x in s])
    ref = list(fresh)
    loader = rw.WebLoader(rw.WebDataset(paths), batch_size=4, num_workers=2, preempt=True,
                          worker_init_fn=_term_myself, multiprocessing_context=method,
                          collate_fn=_keys)
    try:
        got = list(loader)
    finally:
        loader.close()
    assert not loader.preempted  # the main process got no signal
    assert got == ref


def _keys(samples):
    return [x["__key__"] for x in samples]


def test_a_signal_to_the_main_process_while_workers_start_is_delivered_after():
    from resumewds.run._preemption import _blocked_for_start

    got = []
    old = signal.signal(signal.SIGUSR1, lambda signum, frame: got.append(signum))
    mask = signal.pthread_sigmask(signal.SIG_BLOCK, [])
    try:
        with _blocked_for_start([signal.SIGUSR1], "fork"):
            # to this thread: a signal to the process may be taken by another thread (the
            # suite's earlier tests leave some), whose mask is not this one
            signal.pthread_kill(threading.get_ident(), signal.SIGUSR1)
            time.sleep(0.05)
            assert got == []  # pending while the workers fork
        assert got == [signal.SIGUSR1]  # delivered as the mask is restored
        assert signal.pthread_sigmask(signal.SIG_BLOCK, []) == mask
    finally:
        signal.signal(signal.SIGUSR1, old)
