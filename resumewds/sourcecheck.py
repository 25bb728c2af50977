"""Local sources that cannot be shards, refused before any work with a hint.

A directory is not a shard; a missing path with ``*``, ``?`` or ``[`` in it
is a glob no shell expanded (quoted on a command line, or passed from a
program: ``WebDataset("data/*.tar")``).  The command line and
:func:`resumewds.sources.resolve_sources` (so :class:`~resumewds.WebDataset`)
say so in the same words.
"""

from __future__ import annotations

import glob
import os
import re
from typing import List, Optional, Sequence

from .errors import ResumeWDSError, SourceError

__all__ = ["CHECK_LIMIT", "check_local_shard", "check_sources", "local_shard_problem"]

#: paths checked per source (a brace pattern of a million shards: the rest is checked when read)
CHECK_LIMIT = 1000

_GLOB_CHARS = re.compile(r"[*?\[]")


def local_shard_problem(path: str) -> Optional[str]:
    """Why the local ``path`` cannot be a shard, in one line naming it, or None.

    Example:
        >>> import tempfile
        >>> local_shard_problem(tempfile.gettempdir()).split(";")[0].endswith("is a directory, not a shard or manifest")
        True
        >>> local_shard_problem("/no/such/dir/*.tar")
        '/no/such/dir/*.tar: no such file (a glob pattern that matches nothing)'
    """
    if os.path.isdir(path):
        hint = sorted(glob.glob(os.path.join(glob.escape(path), "*.tar")))
        return (f"{path}: is a directory, not a shard or manifest; pass its shards "
                f"({os.path.join(path, '*.tar')}" + (f", {len(hint)} files" if hint else "")
                + ") or a manifest.json")
    if _GLOB_CHARS.search(path) and not os.path.exists(path):
        hits = glob.glob(path)
        if hits:
            return (f"{path}: no such file; it looks like a glob pattern that was not expanded "
                    f"(it matches {len(hits)} file(s)): leave it unquoted so the shell expands it "
                    f"(in Python, pass sorted(glob.glob(pattern))), "
                    f"or use a brace pattern like shard-{{000000..000009}}.tar")
        return f"{path}: no such file (a glob pattern that matches nothing)"
    return None


def check_local_shard(path: str) -> None:
    """Raise when the local ``path`` cannot be a shard.

    Raises:
        SourceError: naming the path and what to pass instead.
    """
    problem = local_shard_problem(path)
    if problem is not None:
        raise SourceError(problem)


def _local_candidates(source: str) -> List[str]:
    """The local paths a source names (brace patterns expanded); [] for URLs."""
    if source.startswith("pipe:") or "://" in source and not source.startswith("file://"):
        return []
    from .sources import expand_braces

    try:
        items = expand_braces(source)
    except ResumeWDSError:
        return []
    return [x[7:] if x.startswith("file://") else x for x in items]


def check_sources(sources: Sequence[str]) -> None:
    """:func:`check_local_shard` of the first :data:`CHECK_LIMIT` local paths of each source.

    Raises:
        SourceError: naming the source and what to do instead.
    """
    for src in sources:
        for i, path in enumerate(_local_candidates(src)):
            if i >= CHECK_LIMIT:
                break
            check_local_shard(path)
