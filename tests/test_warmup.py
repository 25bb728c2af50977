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
