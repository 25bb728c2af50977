"""Ctrl-C (SIGINT) stops ``resumewds cat`` at any moment, start-up included, with
``Aborted!`` and status 130; nothing the journal holds is lost.

torch's start-up imports numpy from C and clears any error raised meanwhile: a
Ctrl-C in that moment used to vanish, and the run went on to its end with
status 0.  Real subprocesses, real signals, a real SQLite journal.  Each run
would take several seconds more than the moment it is interrupted at (its
output is checked to have stopped short), so no case passes because the run
was over before the signal came.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from typing import List, Tuple

import pytest

from conftest import PY, subprocess_env

EPOCHS = 400  # 200 samples per epoch: 80,000 lines, several seconds of printing


def _default_sigint() -> None:
    # as a terminal starts a command: with SIGINT's default action (a test runner
    # started in the background ignores SIGINT, and its children would inherit that)
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def _start(args: List[str], importtime: bool = False) -> subprocess.Popen:
    cmd = [PY, *(["-X", "importtime"] if importtime else []), "-m", "resumewds", "cat", *args]
    return subprocess.Popen(cmd, env=subprocess_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            preexec_fn=_default_sigint)


def _interrupt(p: subprocess.Popen) -> None:
    assert p.poll() is None, "the run ended before it was interrupted: nothing was tested"
    p.send_signal(signal.SIGINT)


def _finish(p: subprocess.Popen) -> Tuple[int, List[str], str]:
    out, err = p.communicate(timeout=300)
    return p.returncode, out.splitlines(), err


def _stopped_by_the_interrupt(rc: int, lines: List[str], err: str) -> str:
    """Check that the run ended by the interrupt (status 130 in a shell), well before its end;
    returns who handled it: "main" (``Aborted!``), "python" (before ``main`` started)."""
    assert len(lines) < EPOCHS * 200, "the run went on to its end"
    tail = [x for x in err.splitlines() if x.strip() and not x.startswith("import time:")]
    last = tail[-1] if tail else ""
    # 130: resumewds.cli.main's exit; -SIGINT: killed by the signal (a shell says 130 as well): before
    # Python started, or Python's own exit after a KeyboardInterrupt escaped code that it ran for torch
    assert rc in (130, -signal.SIGINT) or (rc == 1 and last == "KeyboardInterrupt"), (rc, err[-2000:])
    if last == "Aborted!":
        return "main"
    # before resumewds.cli.main started (while Python imported it): Python's own KeyboardInterrupt
    assert rc != 130 and last in ("", "KeyboardInterrupt"), (rc, err[-2000:])
    return "python"


@pytest.fixture
def data(make_shards):
    return make_shards(shards=4, samples=50)


def test_ctrl_c_while_torch_imports_numpy_stops_the_run(data, tmp_path):
    """The moment the start-up used to swallow: numpy's import inside torch's
    (``-X importtime`` reports each module as it is imported; the signal goes
    at numpy's first)."""
    journal = str(tmp_path / "run.db")
    p = _start([*data, "--epochs", str(EPOCHS), "--journal", journal], importtime=True)
    sent = False
    try:
        for line in p.stderr:
            if line.rstrip().endswith("numpy.version"):
                _interrupt(p)
                sent = True
                break
        assert sent, "numpy was never imported: the case is not tested"
        rc, lines, err = _finish(p)
    finally:
        p.kill()
    assert _stopped_by_the_interrupt(rc, lines, err) == "main"
    # the journal is not held or damaged: status reads it, a rerun starts
    st = subprocess.run([PY, "-m", "resumewds", "status", "--json", journal], env=subprocess_env(),
                        capture_output=True, text=True, timeout=120)
    assert st.returncode == 0 or "no journal here" in st.stderr, st.stderr


def test_a_ctrl_c_during_the_import_of_torch_stops_the_command_right_after_it():
    """Raised inside a callback of torch's C++ start-up, a ``KeyboardInterrupt``
    aborts the process (``terminate called after throwing an instance of
    'pybind11::error_already_set'``, status -6): within :meth:`_Interrupt.deferred`
    the signal is remembered, the block runs to its end, and the interrupt is
    raised right after it."""
    from resumewds.cli._main import _Interrupt

    previous = signal.signal(signal.SIGINT, _Interrupt.handler)
    _Interrupt.seen = False
    steps = 0
    try:
        with pytest.raises(KeyboardInterrupt):
            with _Interrupt.deferred():
                os.kill(os.getpid(), signal.SIGINT)
                for _ in range(10_000):  # Python code runs: the handler ran in here
                    steps += 1
        assert steps == 10_000 and _Interrupt.seen and not _Interrupt.deferring
        with pytest.raises(KeyboardInterrupt):  # outside the block, at once
            os.kill(os.getpid(), signal.SIGINT)
            for _ in range(10_000):
                steps += 1
        assert steps < 20_000
    finally:
        signal.signal(signal.SIGINT, previous)
        _Interrupt.seen = False


def _startup_seconds(data) -> float:
    t0 = time.monotonic()
    res = subprocess.run([PY, "-m", "resumewds", "cat", data[0], "--limit", "1"], env=subprocess_env(),
                         capture_output=True, text=True, timeout=300)
    assert res.returncode == 0, res.stderr
    return time.monotonic() - t0


@pytest.mark.slow
def test_ctrl_c_at_any_moment_of_the_start_up_stops_the_run(data, tmp_path):
    """13 moments spread over the start-up as measured here (a loaded machine
    starts slower), each a run of its own with a journal; then one mid-run,
    whose committed lines a rerun continues after exactly."""
    startup = _startup_seconds(data)
    outcomes = []
    for i in range(13):
        delay = startup * i / 12
        journal = str(tmp_path / f"run{i}.db")
        p = _start([*data, "--epochs", str(EPOCHS), "--journal", journal])
        try:
            time.sleep(delay)
            _interrupt(p)
            rc, lines, err = _finish(p)
        finally:
            p.kill()
        outcomes.append((round(delay, 2), rc, _stopped_by_the_interrupt(rc, lines, err)))
    assert [o for o in outcomes if o[2] == "main"], outcomes  # main() owned most of them

    # mid-run: what was committed stays, and a rerun continues right after it
    journal = str(tmp_path / "mid.db")
    args = [*data, "--journal", journal, "--commit-every", "25"]
    ref = subprocess.run([PY, "-m", "resumewds", "cat", *data, "--epochs", "2"], env=subprocess_env(),
                         capture_output=True, text=True, timeout=300).stdout.splitlines()
    p = _start([*args, "--epochs", str(EPOCHS)])
    try:
        head = [p.stdout.readline().rstrip("\n") for _ in range(130)]
        _interrupt(p)
        rc, rest, err = _finish(p)
    finally:
        p.kill()
    assert rc == 130 and err.splitlines()[-1] == "Aborted!", err[-2000:]
    st = json.loads(subprocess.run([PY, "-m", "resumewds", "status", "--json", journal], env=subprocess_env(),
                                   capture_output=True, text=True, timeout=120).stdout)
    committed = st["latest"]["step"]  # cat commits the count of lines printed, after printing them
    assert 125 <= committed <= len(head) + len(rest)
    again = subprocess.run([PY, "-m", "resumewds", "cat", *args, "--epochs", str(EPOCHS), "--limit", "400"],
                           env=subprocess_env(), capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr
    assert (head + rest)[:committed] + again.stdout.splitlines() == ref[:400]
