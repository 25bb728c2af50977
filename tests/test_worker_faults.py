"""DataLoader workers under process-level faults, with real processes.

* The loader as PID 1 (a container entrypoint without an init): its workers'
  parent is pid 1, which is not an orphan's sign.  Run for real in a new PID
  namespace (``unshare -p -f --mount-proc``).
* A worker orphaned before ``PR_SET_PDEATHSIG`` took effect and adopted by a
  subreaper (not pid 1) still exits.
* A worker stopped with a real ``kill -STOP``: the loader ends with an error
  naming it (watchdog, or DataLoader's own ``timeout``) and the process exits
  instead of waiting for the stopped worker.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from typing import List

import pytest

import resumewds as rw
from conftest import REPO
from resumewds.run._watchdog import _proc_state

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")

# generous bounds: without the fixes these runs never end
BOUND = 120


def _env(cache_dir: str, **extra: str) -> dict:
    env = dict(os.environ)
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "RESUMEWDS_VERBOSE",
                "RESUMEWDS_WORKER_STALL"):
        env.pop(var, None)
    env.update(PYTHONPATH=REPO + os.pathsep + env.get("PYTHONPATH", ""), RESUMEWDS_CACHE_DIR=cache_dir,
               OMP_NUM_THREADS="1", **extra)
    return env


def _children(pid: int) -> List[int]:
    with open(f"/proc/{pid}/task/{pid}/children") as f:
        return [int(x) for x in f.read().split()]


def _kill_all(pids: List[int]) -> None:
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except OSError:
            pass


def _stop(pid: int) -> None:
    """SIGSTOP ``pid`` and wait until it is stopped (the signal is taken when it next runs)."""
    os.kill(pid, signal.SIGSTOP)
    deadline = time.monotonic() + BOUND
    while _proc_state(pid) != "T":
        assert time.monotonic() < deadline, f"pid {pid} never stopped"
        time.sleep(0.01)


def _unshare_pid_ns() -> List[str]:
    exe = shutil.which("unshare")
    if exe is None:
        pytest.skip("no unshare(1) here: cannot run a process as PID 1 of a new PID namespace")
    cmd = [exe, "-p", "-f", "--mount-proc"]
    probe = subprocess.run(cmd + ["sh", "-c", "echo $$"], capture_output=True, text=True, timeout=60)
    if probe.returncode != 0 or probe.stdout.strip() != "1":
        pytest.skip(f"the kernel refuses a new PID namespace here ({probe.stderr.strip() or probe.stdout.strip()})")
    return cmd


def test_loader_as_pid_1_with_workers(make_shards, tmp_path, cache_dir):
    """``resumewds cat --workers 2`` as PID 1 delivers what it delivers elsewhere."""
    ns = _unshare_pid_ns()
    paths = make_shards(shards=6, samples=60)
    manifest = str(tmp_path / "m.json")
    rw.build_manifest(paths, manifest)
    cat = [sys.executable, "-m", "resumewds", "cat", manifest, "--workers", "2", "--limit", "300",
           "--seed", "5", "--shuffle"]
    ref = subprocess.run(cat, env=_env(cache_dir), capture_output=True, text=True, timeout=BOUND)
    assert ref.returncode == 0, ref.stderr
    # the namespace's PID 1 is python itself (exec), as with a container entrypoint
    got = subprocess.run(ns + ["sh", "-c", 'test $$ = 1 && exec "$@"', "sh"] + cat, env=_env(cache_dir),
                         capture_output=True, text=True, timeout=BOUND)
    assert got.returncode == 0, got.stderr
    assert "exited unexpectedly" not in got.stderr
    assert got.stdout == ref.stdout and len(got.stdout.splitlines()) == 300


_SUBREAPER = textwrap.dedent("""
    import ctypes, os, sys
    from resumewds.run._watchdog import die_with_parent
    libc = ctypes.CDLL(None, use_errno=True)
    assert libc.prctl(36, 1, 0, 0, 0) == 0  # PR_SET_CHILD_SUBREAPER: orphans below come to us
    r, w = os.pipe()
    b = os.fork()
    if b == 0:  # B: the "main process" that starts a worker, then dies
        parent = os.getpid()
        c = os.fork()
        if c == 0:  # C: the worker; its parent dies before it calls die_with_parent
            os.close(w)
            os.read(r, 1)  # B is dead and reaped: we belong to the subreaper now
            assert os.getppid() != 1 and os.getppid() != parent
            die_with_parent(parent)
            os._exit(0)  # kept running: the orphan was not noticed
        os._exit(0)
    os.close(r)
    os.waitpid(b, 0)
    os.write(w, b"x")
    _, status = os.wait()
    print(os.waitstatus_to_exitcode(status))
""")


def test_orphan_adopted_by_a_subreaper_exits(cache_dir):
    """A worker whose parent died before prctl, adopted by a subreaper (not pid 1), exits."""
    p = subprocess.run([sys.executable, "-c", _SUBREAPER], env=_env(cache_dir), capture_output=True,
                       text=True, timeout=BOUND)
    assert p.returncode == 0, p.stderr
    assert p.stdout.strip() == "1", "the orphaned worker kept running"


def test_die_with_parent_keeps_a_worker_whose_parent_lives(cache_dir):
    code = ("import os; from resumewds.run._watchdog import die_with_parent\n"
            "die_with_parent(os.getppid()); die_with_parent(1 if os.getppid() == 1 else os.getppid())\n"
            "print('alive')")
    p = subprocess.run([sys.executable, "-c", code], env=_env(cache_dir), capture_output=True, text=True,
                       timeout=BOUND)
    assert p.returncode == 0 and p.stdout.strip() == "alive", p.stderr


def test_cat_with_a_stopped_worker_ends_with_an_error_naming_it(make_shards, tmp_path, cache_dir):
    # more output than a pipe holds: cat blocks on stdout long before worker 1 runs out of steps
    paths = make_shards(shards=8, samples=400, size_range=(10, 40))
    manifest = str(tmp_path / "m.json")
    rw.build_manifest(paths, manifest)
    p = subprocess.Popen([sys.executable, "-m", "resumewds", "cat", manifest, "--workers", "2",
                          "--chunk", "8"], env=_env(cache_dir, RESUMEWDS_WORKER_STALL="2"),
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    workers: List[int] = []
    try:
        assert p.stdout is not None and p.stderr is not None
        p.stdout.readline()  # the workers run
        workers = _children(p.pid)
        assert len(workers) == 2
        _stop(workers[1])
        out, err = p.communicate(timeout=BOUND)
        printed = 1 + len(out.splitlines())
        assert p.returncode == 1, err
        assert all(_proc_state(pid) in (None, "Z") for pid in workers)  # none left running
    finally:
        _kill_all(workers + [p.pid])
        p.wait()
    assert printed < 3200
    assert f"DataLoader worker 1 (pid {workers[1]}) is stopped" in err, err
    assert "RESUMEWDS_WORKER_STALL" in err and "Traceback" not in err


_DRIVER = textwrap.dedent("""
    import os, sys
    import resumewds as rw
    from resumewds.run import WorkerStallError
    stall, timeout, paths = float(sys.argv[1]), float(sys.argv[2]), sys.argv[3:]
    kw = {"timeout": timeout} if timeout else {}
    loader = rw.WebLoader(rw.WebDataset(paths), batch_size=4, num_workers=2, stall_timeout=stall, **kw)
    try:
        for i, batch in enumerate(loader):
            if i == 0:
                me = os.getpid()
                print(open(f"/proc/{me}/task/{me}/children").read().strip(), flush=True)
                sys.stdin.readline()  # the test stopped a worker
    except Exception as exc:
        print(type(exc).__name__, isinstance(exc, WorkerStallError), getattr(exc, "pid", None),
              getattr(exc, "worker", None), "|", exc, flush=True)
    else:
        print("finished", flush=True)
    # the interpreter's exit must not wait for the stopped worker
""")


@pytest.mark.parametrize("stall,timeout", [(2, 0), (0, 2)], ids=["watchdog", "dataloader-timeout"])
def test_api_with_a_stopped_worker_raises_and_exits(make_shards, cache_dir, stall, timeout):
    paths = make_shards(shards=5, samples=37)
    p = subprocess.Popen([sys.executable, "-c", _DRIVER, str(stall), str(timeout), *paths],
                         env=_env(cache_dir), stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                         stderr=subprocess.PIPE, text=True)
    workers: List[int] = []
    try:
        assert p.stdout is not None and p.stdin is not None
        workers = [int(x) for x in p.stdout.readline().split()]
        assert len(workers) == 2, p.stderr.read() if p.stderr else ""
        _stop(workers[1])
        p.stdin.write("go\n")
        p.stdin.flush()
        out, err = p.communicate(timeout=BOUND)
        assert all(_proc_state(pid) in (None, "Z") for pid in workers)  # none left running
    finally:
        _kill_all(workers + [p.pid])
        p.wait()
    assert p.returncode == 0, err
    assert out.startswith(f"WorkerStallError True {workers[1]} 1 | DataLoader worker 1 (pid {workers[1]})"), out
    assert "stopped" in out and "stall_timeout" in out
    if timeout:
        assert "DataLoader timed out after 2" in out


def test_stall_timeout_setting(make_shards, monkeypatch):
    """The parameter wins over RESUMEWDS_WORKER_STALL, which wins over the default; a
    re-batched chain (loaderchain) keeps it; a bad value is an error naming it."""
    from resumewds.run._watchdog import DEFAULT_STALL_SECONDS

    paths = make_shards(shards=2, samples=10)
    assert rw.WebLoader(rw.WebDataset(paths), batch_size=4).stall_timeout == DEFAULT_STALL_SECONDS == 60
    monkeypatch.setenv("RESUMEWDS_WORKER_STALL", "7")
    assert rw.WebLoader(rw.WebDataset(paths), batch_size=4).stall_timeout == 7
    base = rw.WebLoader(rw.WebDataset(paths), batch_size=4, stall_timeout=0)
    assert base.stall_timeout == 0
    monkeypatch.delenv("RESUMEWDS_WORKER_STALL")
    assert base.unbatched().shuffle(5).batched(3).loader.stall_timeout == 0
    with pytest.raises(ValueError, match="stall_timeout=-1"):
        rw.WebLoader(rw.WebDataset(paths), batch_size=4, stall_timeout=-1)
    monkeypatch.setenv("RESUMEWDS_WORKER_STALL", "soon")
    with pytest.raises(ValueError, match="RESUMEWDS_WORKER_STALL='soon'"):
        rw.WebLoader(rw.WebDataset(paths), batch_size=4)


_LIVE_ITER = textwrap.dedent("""
    import os, sys
    import resumewds as rw
    loader = rw.WebLoader(rw.WebDataset(sys.argv[1:]), batch_size=4, num_workers=2)
    it = iter(loader)
    next(it)
    me = os.getpid()
    print(open(f"/proc/{me}/task/{me}/children").read().strip(), flush=True)
    sys.stdin.readline()  # the test stopped a worker
    print("exiting", flush=True)  # with the iterator alive: exit must not wait for the stopped worker
""")


def test_exit_with_a_live_iterator_and_a_stopped_worker(make_shards, cache_dir):
    paths = make_shards(shards=5, samples=37)
    p = subprocess.Popen([sys.executable, "-c", _LIVE_ITER, *paths], env=_env(cache_dir), stdin=subprocess.PIPE,
                         stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    workers: List[int] = []
    try:
        assert p.stdout is not None and p.stdin is not None
        workers = [int(x) for x in p.stdout.readline().split()]
        assert len(workers) == 2, p.stderr.read() if p.stderr else ""
        _stop(workers[1])
        p.stdin.write("go\n")
        p.stdin.flush()
        out, err = p.communicate(timeout=BOUND)
        assert all(_proc_state(pid) in (None, "Z") for pid in workers)  # none left running
    finally:
        _kill_all(workers + [p.pid])
        p.wait()
    assert p.returncode == 0 and out.strip() == "exiting", err
    assert f"killing DataLoader worker 1 (pid {workers[1]}): it is stopped" in err
