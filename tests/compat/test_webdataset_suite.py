"""webdataset 1.0.2's own test suite, run against resumewds (``-m compat``).

``python -m pytest -m compat tests/compat -s`` runs it (about two minutes) and
prints ``passed / eligible / excluded``; without ``-m compat`` it is skipped,
so the default run stays short.  See tests/compat/harness.py and docs/COMPAT.md.
"""

from __future__ import annotations

import os
import sys

import pytest

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import harness

#: eligible tests that passed when this floor was last raised; a run below it fails
FLOOR = int(os.environ.get("RESUMEWDS_COMPAT_FLOOR", "0") or 0) or harness.recorded_floor()


@pytest.mark.compat
def test_webdataset_suite_against_resumewds(request, capsys):
    if "compat" not in (request.config.option.markexpr or ""):
        pytest.skip("webdataset's own suite: run with -m compat")
    outcomes = harness.run()
    passed, eligible, excluded, failing = harness.summary(outcomes)
    with capsys.disabled():
        print(f"\nwebdataset {harness.VERSION} suite on resumewds: passed {passed} / eligible "
              f"{eligible} / excluded {excluded}")
    assert passed >= FLOOR, f"{passed} eligible tests pass, fewer than the recorded {FLOOR}: " \
                            + ", ".join(failing[:20])
