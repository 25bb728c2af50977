"""Exact resume of the client pipelines resumewds runs: kill -9 mid-epoch, resume, compare.

Each case runs :mod:`tests.clients.resume_driver` three times: once
uninterrupted (in the test process); in a fresh process, once SIGKILLed when it holds the item of a step
in the middle of an epoch; once more, resuming by the documented mechanism
(the journal and ``commit``, or ``state_dict`` / ``load_state_dict``). The
interrupted run's steps followed by the resumed run's must be the
uninterrupted run's, item for item.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from typing import Dict

import pytest

from tests.clients.pipelines import SPEC
from tests.clients.resume_driver import RESUME, main

pytestmark = pytest.mark.clients

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TOTAL = 20
KILL_AT = 7

#: pipeline -> why its resume is not exact today
XFAIL: Dict[str, str] = {}


def _drive(name: str, urls: str, workdir: str, kill_at: int) -> subprocess.CompletedProcess:
    os.makedirs(workdir, exist_ok=True)
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, "-m", "tests.clients.resume_driver", name, urls, workdir, str(TOTAL),
                           str(kill_at)], env=env, cwd=REPO, capture_output=True, text=True, timeout=300)


def _lines(workdir: str):
    with open(os.path.join(workdir, "out.txt")) as f:
        return [line.split() for line in f.read().splitlines()]


def _cases():
    for name in RESUME:
        marks = [pytest.mark.xfail(strict=True, reason=XFAIL[name])] if name in XFAIL else []
        yield pytest.param(name, id=name, marks=marks)


@pytest.mark.parametrize("name", list(_cases()))
def test_resume_exact(corpus, name, tmp_path):
    spec = SPEC[name]
    urls = corpus.urls(spec.layout, "local")
    os.makedirs(tmp_path / "full")
    main(name, urls, str(tmp_path / "full"), TOTAL, -1)  # the uninterrupted run, in this process
    reference = _lines(str(tmp_path / "full"))
    assert len(reference) == TOTAL
    cut = str(tmp_path / "cut")
    killed = _drive(name, urls, cut, KILL_AT)
    assert killed.returncode == -signal.SIGKILL, f"rc={killed.returncode}: {killed.stderr[-2000:]}"
    assert [int(s) for s, _ in _lines(cut)] == list(range(KILL_AT))
    resumed = _drive(name, urls, cut, -1)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    got = _lines(cut)
    assert [int(s) for s, _ in got] == list(range(TOTAL)), f"steps after the resume: {[s for s, _ in got]}"
    diff = [i for i, (a, b) in enumerate(zip(reference, got)) if a != b]
    assert not diff, f"{len(diff)} of {TOTAL} steps differ from the uninterrupted run, first at step {diff[0]}"
