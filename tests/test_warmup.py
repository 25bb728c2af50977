"""Imports started early: with RESUMEWDS_FETCH_LITE=0 a data set over http(s) imports
requests on a background thread while it is being set up (by default its manifest and
first ranged reads need no requests: resumewds.fetch.lite), and a fork waits for such an
import to end (a child forked in the middle of it would find a module lock held by a
thread it does not have)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _run(code: str, tmp_path=None, **env_vars: str) -> str:
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + (str(tmp_path) if tmp_path else "")
               + os.pathsep + os.environ.get("PYTHONPATH", ""), **env_vars)
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip()


CONSTRUCT = """
        import sys
        import resumewds as rw
        from resumewds import warmup
        local = rw.WebDataset("/nowhere/a-{0..3}.tar")
        before = "requests" in sys.modules
        ds = rw.WebDataset("http://127.0.0.1:9/manifest.json")   # nothing is fetched here
        warmup.wait()
        print(before, "requests" in sys.modules)
    """


# RESUMEWDS_FETCH_ATTEMPTS=1: the manifest's background fetch (nobody listens) gives up at once
def test_an_http_data_set_imports_requests_while_it_is_set_up_when_lite_is_off():
    assert _run(CONSTRUCT, RESUMEWDS_FETCH_LITE="0", RESUMEWDS_FETCH_ATTEMPTS="1") == "False True"


def test_an_http_data_set_does_not_import_requests_to_be_set_up():
    assert _run(CONSTRUCT, RESUMEWDS_FETCH_LITE="1", RESUMEWDS_FETCH_ATTEMPTS="1") == "False False"


def test_a_fork_waits_for_a_background_import(tmp_path):
    (tmp_path / "slowmod.py").write_text("import time\ntime.sleep(1.0)\nDONE = True\n")
    got = _run("""
        import os, sys
        from resumewds import warmup
        warmup.import_in_background("slowmod")
        pid = os.fork()
        if pid == 0:  # the child: the import ended before the fork
            m = sys.modules.get("slowmod")
            os._exit(0 if getattr(m, "DONE", False) else 3)
        _, status = os.waitpid(pid, 0)
        print(os.waitstatus_to_exitcode(status))
    """, tmp_path)
    assert got == "0"


FORK = """
        import gc, os, sys
        import resumewds as rw
        from resumewds import warmup
        if sys.argv[1:] == ["user"]:
            gc.freeze()  # the caller's own frozen objects
        before = gc.get_freeze_count()
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:
            os.write(w, str(gc.get_freeze_count()).encode())
            os._exit(0)
        os.waitpid(pid, 0)
        child = int(os.read(r, 64))
        print(before > 0, child > 0, gc.get_freeze_count() == before)
    """


def _fork(*args: str, **env: str) -> str:
    env_all = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""), **env)
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(FORK), *args], env=env_all, capture_output=True,
                         text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout.strip()


def test_a_fork_freezes_the_heap_for_the_child_and_the_parent_collects_as_before():
    # the child starts with every inherited object frozen; the parent's are unfrozen again
    assert _fork() == "False True True"


def test_a_fork_leaves_the_collector_alone_when_told_or_when_objects_are_frozen_already():
    assert _fork(RESUMEWDS_FORK_FREEZE="0") == "False False True"
    assert _fork("user") == "True True True"  # the caller's freeze stays as it was, in the parent too


def test_a_dataloader_worker_starts_with_the_heap_it_inherited_frozen(tmp_path):
    """Frozen from the fork on: torch's worker start-up, before any code of ours
    runs there (``worker_init_fn`` runs before the data set's first sample),
    never walks the parent's objects."""
    from resumewds import synth

    synth.write_shards(str(tmp_path), shards=2, samples=8, size_range=(100, 200), seed=1)
    code = f"""
        import gc, os
        import torch.utils.data as tud
        import resumewds as rw
        def init(i):
            with open(os.path.join({str(tmp_path)!r}, f"w{{i}}"), "w") as f:
                f.write(str(gc.get_freeze_count() > 0))
        ds = rw.WebDataset({str(tmp_path / "shard-{000000..000001}.tar")!r})
        n = len(list(tud.DataLoader(ds, batch_size=None, num_workers=2, worker_init_fn=init)))
        print(n, gc.get_freeze_count())
    """
    assert _run(code) == "16 0"  # the parent's objects are unfrozen again
    assert [(tmp_path / f"w{i}").read_text() for i in (0, 1)] == ["True", "True"]
    assert _run(code, RESUMEWDS_FORK_FREEZE="0") == "16 0"
    assert [(tmp_path / f"w{i}").read_text() for i in (0, 1)] == ["False", "False"]
