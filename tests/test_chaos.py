"""``python -m chaos run``'s verdicts, asserted: rows of a few seconds each in the default
run, the longer rows under ``-m slow`` (which CI runs).

By hand: ``python -m chaos run --quick`` (the whole matrix), or ``--soak MINUTES``.
Rows that need tmpfs mounts SKIP (with the reason) when mounting is not
possible; a SKIP is accepted here, a FAIL never is.
"""

from __future__ import annotations

import pytest

from chaos.run import Row, format_table, matrix, run_matrix, select

# scenario names (or function names) that run here; all others run in `python -m chaos run`
SUBSET = [
    "reset mid-body", "HTTP 503", "HTTP 429", "truncated, no Content-Length", "flipped byte in member data",
    "flipped byte in a tar header", "stall past", "mixed transport", "readonly_cache",
    "tmpfs_full", "fuzz_rows", "manifest with a wrong checksum", "missing shard", "journal deleted",
    # a Retry-After beyond the deadline, a flipped byte repaired by range
    "Retry-After 86400s", "flipped byte repaired by range",
]
# the longer rows (8 s or more each, run alone): hostile tar sizes, /dev/full, two runs on one journal,
# a trickling body, a worker killed, a reboot, stale partials, damaged journals and caches, a full journal
# directory
SLOW = ["journal_two_writers", "crafted_tar_sizes", "stdout_full", "journal_started_together", "body trickles",
        "kill_worker", "reboot", "stale_partials", "journal truncated to half", "journal pages", "journal_dir_full",
        "cache_damage_during"]


@pytest.fixture(scope="module", params=[pytest.param("subset", id="subset"),
                                        pytest.param("slow", id="slow", marks=pytest.mark.slow)])
def rows(request, tmp_path_factory):
    """The rows of the default run, or the longer ones (``-m slow``)."""
    only = SUBSET if request.param == "subset" else SLOW
    rs = run_matrix(seed=0, quick=True, work=str(tmp_path_factory.mktemp("chaos")), only=only, jobs=3,
                    progress=False)
    print("\n" + format_table(rs))
    return rs


def test_subset_ran(rows, request):
    names = SUBSET if request.node.callspec.params["rows"] == "subset" else SLOW
    assert len(rows) == len(select(matrix(True), names)) >= len(names)


def test_no_failures(rows):
    bad = [r for r in rows if r.verdict == "FAIL"]
    assert not bad, format_table(bad)


def test_no_sample_lost_repeated_or_corrupt(rows):
    for r in rows:
        t = r.tally
        assert (t.lost, t.repeated, t.corrupt, t.misordered) == (0, 0, 0, 0), r.fault


def test_errors_are_clear_and_bounded(rows):
    for r in rows:
        assert r.hung == 0, r.fault
        if r.expect == "error" and r.verdict != "SKIP":
            assert r.clear_errors >= 1 and not r.bad_exits, (r.fault, r.bad_exits)


def test_network_faults_were_injected(rows):
    net = [r for r in rows if r.fault.startswith(("reset", "HTTP", "truncated", "flipped", "stall", "mixed",
                                                  "body"))]
    assert net and all(r.faults > 0 for r in net)


def test_row_verdicts():
    r = Row("x", "exact")
    assert r.verdict == "PASS"
    r.tally.lost = 1
    assert r.verdict == "FAIL"
    r.skip = "no mount"
    assert r.verdict == "SKIP"
