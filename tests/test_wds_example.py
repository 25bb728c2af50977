"""examples/wds_train.py (webdataset's training pattern, only the import changed) killed
with SIGKILL and rerun continues with exactly the uninterrupted run's batches."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from conftest import REPO, subprocess_env

EXAMPLE = os.path.join(REPO, "examples", "wds_train.py")


def _steps(text: str) -> dict:
    return {int(line.split()[1]): line for line in text.splitlines() if line.startswith("step ")}


@pytest.mark.slow
def test_webdataset_training_example_resumes_exactly_after_sigkill(tmp_path):
    env = subprocess_env()
    env.pop("RESUMEWDS_CACHE_DIR", None)
    common = ["--epochs", "2", "--batches", "5", "--batch-size", "12"]
    ref = subprocess.run([sys.executable, EXAMPLE, "--work", str(tmp_path / "a"), "--make-data"] + common,
                         capture_output=True, text=True, env=env, timeout=300, check=True).stdout
    want = _steps(ref)
    assert sorted(want) == list(range(10)) and ref.rstrip().endswith("done")

    work = str(tmp_path / "b")
    p = subprocess.Popen([sys.executable, EXAMPLE, "--work", work, "--make-data", "--step-delay", "0.4"]
                         + common, stdout=subprocess.PIPE, text=True, env=env)
    first = []
    deadline = time.time() + 240
    while time.time() < deadline:
        line = p.stdout.readline()
        first.append(line)
        if line.startswith("step 3 "):
            break
    time.sleep(0.2)
    os.kill(p.pid, signal.SIGKILL)
    p.wait()
    rest = p.stdout.read()
    first_text = "".join(first) + rest
    assert "step 3 " in first_text and "done" not in first_text
    second = subprocess.run([sys.executable, EXAMPLE, "--work", work, "--workers", "0"] + common,
                            capture_output=True, text=True, env=env, timeout=300, check=True).stdout
    assert second.startswith("resume step ")
    got = _steps(first_text)
    again = _steps(second)
    resumed_at = int(second.split()[2])
    assert 3 <= resumed_at <= 5 and min(again) == resumed_at
    got.update(again)  # a step run before the kill but after the checkpoint is trained again
    assert got == want
