"""Where the files of a run are: one journal per rank, next to rank 0's."""

from __future__ import annotations

import os
import re
from typing import List, Tuple


def rank_journal_path(path: str, rank: int) -> str:
    """The journal file of ``rank``: ``path`` itself for rank 0, else ``<stem>.rank<r><suffix>``.

    Example:
        >>> rank_journal_path("/x/run.db", 0), rank_journal_path("/x/run.db", 1)
        ('/x/run.db', '/x/run.rank1.db')
    """
    if not isinstance(rank, int) or rank < 0:
        raise ValueError(f"rank must be a non-negative int, got {rank!r}")
    if rank == 0:
        return path
    stem, suffix = os.path.splitext(path)
    return f"{stem}.rank{rank}{suffix}"


def rank_files(path: str) -> List[Tuple[int, str]]:
    """``(0, path)`` plus ``(r, file)`` for every existing rank file, by rank."""
    d = os.path.dirname(path) or "."
    stem, suffix = os.path.splitext(os.path.basename(path))
    pat = re.compile(rf"^{re.escape(stem)}\.rank([1-9][0-9]*){re.escape(suffix)}$")
    found: List[Tuple[int, str]] = []
    try:
        names = os.listdir(d)
    except OSError:
        names = []
    for n in names:
        m = pat.match(n)
        if m:
            found.append((int(m.group(1)), os.path.join(os.path.dirname(path), n)))
    return [(0, path), *sorted(found)]


def run_journal_paths(path: str) -> List[str]:
    """``path`` (rank 0, existing or not), then the run's existing rank files.

    Example:
        >>> run_journal_paths("no/such/dir/run.db")
        ['no/such/dir/run.db']
    """
    return [p for _, p in rank_files(path)]


def uri_path(path: str) -> str:
    """``path`` made absolute for a ``file:`` URI ("?" and "#" would end its path part)."""
    return os.path.abspath(path).replace("%", "%25").replace("?", "%3f").replace("#", "%23")
