"""Rows of ``python -m chaos run`` that SIGKILL whole runs again and again.

* ``crash_cat`` / ``crash_train``: :class:`chaos.crash.Harness` kills
  ``resumewds cat --journal`` (or ``examples/train.py``) mid-download,
  mid-commit and mid-batch, and reruns it; the committed output over the
  reruns must equal the uninterrupted run.
* ``mixture_kills``: a two-source, two-phase curriculum
  (``examples/curriculum.py``) over a faulty http server, killed with SIGKILL
  and restarted with 0/3/1 workers (:mod:`chaos.mixcrash`).

Example:
    >>> crash_cycles(4, "cat").label
    'crash_cat'
"""

from __future__ import annotations

import collections
import random

from chaos.crash import Harness, Tally
from chaos.harness import BOUND, Row, Scenario, Suite, labelled
from chaos.mixcrash import campaign

__all__ = ["crash_cycles", "mixture_kills"]


def crash_cycles(kills: int, target: str) -> Scenario:
    """``kills`` SIGKILLs of ``target`` (``"cat"`` or ``"train"``), each followed by a rerun."""
    def scenario(s: Suite) -> Row:
        row = Row(f"SIGKILL x{kills}, {target} (download/commit/mid-batch, 2 workers)", "resume")
        h = Harness(s.tmp(f"crash-{target}"), seed=s.seed, shards=6, samples=80)
        try:
            rng = random.Random(f"{s.seed}:{target}")
            rep = h.crash_cat(kills, rng, bound=BOUND) if target == "cat" else h.crash_train(kills, rng, bound=BOUND)
        finally:
            h.close()
        row.runs, row.faults, row.tally, row.hung = rep.runs, rep.kills, rep.tally, rep.hung
        row.bad_exits = list(rep.errors)
        if rep.loss_mismatch:
            row.bad_exits.append(f"{rep.loss_mismatch} steps with a different loss after resume")
        row.note = f"{rep.kills_in_download} kills mid-download, {rep.kills_main_only} main-only"
        if target == "train":
            row.note += f", {rep.resumed_same_sample} resumes checked at the same sample"
        return row
    return labelled(f"crash_{target}", scenario)


def mixture_kills(kills: int) -> Scenario:
    """``kills`` SIGKILLs of a two-source curriculum over http; see :mod:`chaos.mixcrash`."""
    def scenario(s: Suite) -> Row:
        row = Row(f"SIGKILL x{kills}, two-source curriculum over http (0/3/1 workers)", "resume")
        rep = campaign(s.tmp("mixture"), kills, random.Random(f"{s.seed}:mixture"))
        want, got = collections.Counter(rep.expected), collections.Counter(rep.committed)
        row.runs, row.faults = rep.runs, rep.kills + sum(rep.faults.values())
        row.tally = Tally(expected=len(rep.expected), delivered=len(rep.committed),
                          lost=sum((want - got).values()), repeated=sum((got - want).values()),
                          misordered=int(want == got and rep.committed != rep.expected))
        row.bad_exits = list(rep.errors)
        row.note = f"{rep.kills} kills, faults {rep.faults}; lines are steps (samples, phase, loss)"
        return row
    return labelled("mixture_kills", scenario)
