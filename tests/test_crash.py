"""The crash harness (chaos/crash.py): SIGKILL real processes, rerun, compare.

A short version of ``python -m chaos.crash``: a few kills of ``resumewds cat``
(2 workers, 2 epochs, commits every 7 samples, shards over HTTP) and of
``examples/train.py``; the committed output across restarts must equal the
uninterrupted run.
"""

from __future__ import annotations

import random

import pytest

from chaos.crash import Harness, Tally, compare, format_report


@pytest.fixture(scope="module")
def harness(tmp_path_factory):
    h = Harness(str(tmp_path_factory.mktemp("crash")), seed=5, shards=5, samples=60)
    try:
        yield h
    finally:
        h.close()


def test_compare_counts_loss_repeats_corruption_and_order():
    digests = {("a.tar", "k1"): "d1", ("a.tar", "k2"): "d2", ("a.tar", "k3"): "d3"}
    ref = ["a.tar\tk1\td1", "a.tar\tk2\td2", "a.tar\tk3\td3"]
    assert compare(ref, ref, digests).ok
    t = compare(ref, [ref[0], ref[0], "a.tar\tk3\tXX"], digests)
    assert (t.lost, t.repeated, t.corrupt) == (1, 1, 1)
    assert compare(ref, ref[::-1], digests).misordered == 1


def test_cat_survives_sigkills(harness):
    rep = harness.crash_cat(3, random.Random(1), bound=90)
    print(format_report(rep))
    assert rep.kills >= 3
    assert rep.ok, format_report(rep)
    assert rep.tally.delivered == rep.tally.expected > 0


@pytest.mark.slow
def test_train_survives_sigkills(harness):
    rep = harness.crash_train(2, random.Random(2), bound=90)
    print(format_report(rep))
    assert rep.kills >= 2
    assert rep.ok, format_report(rep)
    assert rep.loss_mismatch == 0


def test_tally_add():
    t = Tally(expected=1)
    t.add(Tally(expected=2, lost=1))
    assert (t.expected, t.lost, t.ok) == (3, 1, False)


@pytest.fixture(scope="module")
def harness_v4(tmp_path_factory):
    h = Harness(str(tmp_path_factory.mktemp("crash4")), seed=6, shards=5, samples=60, offsets="index")
    try:
        yield h
    finally:
        h.close()


@pytest.mark.slow
def test_cat_survives_sigkills_on_a_v4_manifest(harness_v4):
    """The same kills over http with a version-4 manifest: each shard's index file comes
    through the cache when a process first reads the shard."""
    with open(harness_v4.data.manifest) as f:
        assert '"version":4' in f.read()
    rep = harness_v4.crash_cat(3, random.Random(3), bound=90)
    print(format_report(rep))
    assert rep.kills >= 3
    assert rep.ok, format_report(rep)
    assert rep.tally.delivered == rep.tally.expected > 0
