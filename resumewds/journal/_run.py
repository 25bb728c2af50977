"""A whole run: every rank's file together, and where the run resumes.

:func:`open_run` opens every rank file of a run read-only (a missing rank 0
with any trace of the run left is an error, never a fresh start);
:func:`resolve_resume` finds the newest step every rank of its layout
committed alike.
"""

from __future__ import annotations

import os
from typing import Any, Dict, List, Optional, Tuple

from ..errors import JournalError, JournalIncompleteCommit
from ._core import Journal
from ._lock import deleted_error, recorded_run_id
from ._paths import rank_files, rank_journal_path
from ._schema import commit_row, never_initialised


def open_run(path: str) -> Dict[int, Journal]:
    """Read-only journals of every rank file that exists, by rank ({} when
    none).  A missing rank 0 with any trace of the run left is a JournalError."""
    files = rank_files(path)
    if not os.path.exists(path):
        if recorded_run_id(path):
            raise deleted_error(path)
        if len(files) > 1:
            raise JournalError(f"{path}: rank 0 journal is missing but rank files exist "
                               f"({', '.join(p for _, p in files[1:])})")
        return {}
    journals: Dict[int, Journal] = {}
    try:
        for r, p in files:
            if os.path.exists(p):
                if never_initialised(p):
                    continue  # created, then the disk filled before the schema: nothing committed
                journals[r] = Journal(path, rank=r, readonly=True)
    except BaseException:
        for j in journals.values():
            j.close()
        raise
    return journals


def close_all(journals: Dict[int, Journal]) -> None:
    for j in journals.values():
        j.close()


def _check_step(journals: Dict[int, Journal], step: int, ref: Dict[str, Any]
                ) -> Tuple[List[int], List[int], int]:
    """(missing ranks, disagreeing ranks, world size) of ``step`` against rank 0's ``ref``."""
    world = int(ref["world_size"])
    missing: List[int] = []
    disagree: List[int] = []
    for r in range(1, world):
        j = journals.get(r)
        c = j.commit_at(step) if j is not None else None
        if c is None:
            missing.append(r)
        elif (c["epoch"], c["position"], c["world_size"]) != (ref["epoch"], ref["position"], world):
            disagree.append(r)
    return missing, disagree, world


_MAX_SKIPPED_REPORTED = 20


def resolve_resume(path: str, step: Optional[int] = None) -> Optional[Dict[str, Any]]:
    """Where a run should resume: a step every rank of its layout committed.

    A step S committed under world size W is complete when ranks 0..W-1 all
    have it with the same ``(epoch, position, world_size)``.

    Args:
        path: the run's journal path (rank 0's file).
        step: a specific step (the model checkpoint's), or None for the latest
            complete step.

    Returns:
        None when the run has no journal at all, or no commit yet (start from
        the beginning); otherwise ``{"step", "epoch", "position",
        "world_size", "batch_size", "ts", "samples_total" (rank 0's),
        "samples_total_per_rank" ([rank 0, ..., rank W-1]), "run_id", "place" (rank 0's),
        "skipped_incomplete": [{"step", "missing_ranks", "disagreeing_ranks"},
        ...] (newer steps passed over, newest first, at most 20),
        "skipped_incomplete_count"}``.

    Raises:
        JournalError: rank 0's journal is missing while its lock file or other
            rank files remain, or a file is unreadable.
        JournalIncompleteCommit: ``step`` is not complete (the message names
            the ranks that lack it or disagree), or commits exist but none is
            complete.
    """
    journals = open_run(path)
    try:
        return resolve_in(journals, path, step)
    finally:
        close_all(journals)


def resolve_in(journals: Dict[int, Journal], path: str, step: Optional[int] = None
               ) -> Optional[Dict[str, Any]]:
    """:func:`resolve_resume` over the run's journals already open (:func:`open_run`)."""
    if not journals:
        return None
    j0 = journals[0]
    skipped: List[Dict[str, Any]] = []
    n_skipped = 0
    if step is not None:
        ref = j0.commit_at(step)
        if ref is None:
            raise JournalIncompleteCommit(f"{path}: step {step} was never committed by rank 0")
        missing, disagree, world = _check_step(journals, step, ref)
        if missing or disagree:
            raise JournalIncompleteCommit(_incomplete_msg(path, step, world, missing, disagree, journals))
        return _resume_dict(journals, ref, world, [], 0, j0.run_id)
    cur = j0.conn.execute("SELECT * FROM commits ORDER BY step DESC")
    any_commit = False
    for row in cur:
        any_commit = True
        ref = commit_row(row)
        assert ref is not None
        missing, disagree, world = _check_step(journals, ref["step"], ref)
        if not missing and not disagree:
            return _resume_dict(journals, ref, world, skipped, n_skipped, j0.run_id)
        n_skipped += 1
        if len(skipped) < _MAX_SKIPPED_REPORTED:
            skipped.append({"step": ref["step"], "missing_ranks": missing, "disagreeing_ranks": disagree})
    if not any_commit:
        if any(j.latest_commit() is not None for r, j in journals.items() if r):
            raise JournalIncompleteCommit(f"{path}: other ranks committed steps but rank 0 "
                                          f"has none")
        return None
    first = skipped[0] if skipped else {}
    raise JournalIncompleteCommit(
        f"{path}: no step is complete across ranks ({n_skipped} steps checked; newest "
        f"{first.get('step')} missing ranks {first.get('missing_ranks')}, disagreeing "
        f"ranks {first.get('disagreeing_ranks')})")


def _incomplete_msg(path: str, step: int, world: int, missing: List[int], disagree: List[int],
                    journals: Dict[int, Journal]) -> str:
    parts = []
    if missing:
        parts.append("missing on rank(s) " + ", ".join(
            f"{r}" + ("" if r in journals else f" (no file {rank_journal_path(path, r)})")
            for r in missing))
    if disagree:
        parts.append("rank(s) " + ", ".join(map(str, disagree))
                     + " committed it with a different epoch/position/world size")
    return f"{path}: step {step} (world size {world}) is incomplete: " + "; ".join(parts)


def _resume_dict(journals: Dict[int, Journal], ref: Dict[str, Any], world: int,
                 skipped: List[Dict[str, Any]], n_skipped: int, run_id: Optional[str]) -> Dict[str, Any]:
    totals = [ref["samples_total"]]
    for r in range(1, world):
        c = journals[r].commit_at(ref["step"])
        assert c is not None  # _check_step found every rank's commit
        totals.append(c["samples_total"])
    return {"step": ref["step"], "epoch": ref["epoch"], "position": ref["position"],
            "world_size": world, "batch_size": ref["batch_size"], "ts": ref["ts"],
            "samples_total": totals[0], "samples_total_per_rank": totals, "run_id": run_id,
            "skipped_incomplete": skipped, "skipped_incomplete_count": n_skipped, "place": ref.get("place")}


