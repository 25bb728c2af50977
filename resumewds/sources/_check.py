"""Local sources that cannot be shards, refused before any work with a hint.

A directory is not a shard; a missing path with ``*``, ``?`` or ``[`` in it
is a glob no shell expanded.  The CLI and :func:`resolve_sources` say so alike.
"""

from __future__ import annotations

import glob
import logging
import os
import re
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ..errors import ResumeWDSError, SourceError
from ..fetch import is_local_url
from ._urls import expand_braces

__all__ = ["CHECK_LIMIT", "check_local_shard", "check_sources", "duplicate_content", "local_shard_problem",
           "warn_duplicate_content"]

log = logging.getLogger("resumewds")

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
    """Raise SourceError (naming ``path`` and what to pass instead) when it cannot be a shard."""
    problem = local_shard_problem(path)
    if problem is not None:
        raise SourceError(problem)


def _local_candidates(source: str) -> List[str]:
    """The local paths a source names (brace patterns expanded); [] for URLs."""
    if not is_local_url(source):
        return []
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


def duplicate_content(shards: Sequence[Any]) -> List[Tuple[str, str]]:
    """Pairs ``(first url, later url)`` of shards with the same size and
    xxh3_64: one shard under two names (shards without both are left out).

    Example:
        >>> from resumewds.manifest import ShardInfo
        >>> duplicate_content([ShardInfo(url="a.tar", size=3, xxh3_64="ab"),
        ...                    ShardInfo(url="b.tar", size=3, xxh3_64="ab"),
        ...                    ShardInfo(url="c.tar", size=3, xxh3_64="cd")])
        [('a.tar', 'b.tar')]
    """
    sums = [s.xxh3_64 for s in shards if s.xxh3_64 is not None and s.size is not None]
    if len(set(sums)) == len(sums):  # the rule, at C speed
        return []
    seen: Dict[Tuple[int, str], str] = {}
    out: List[Tuple[str, str]] = []
    for s in shards:
        if s.xxh3_64 is None or s.size is None:
            continue
        first = seen.setdefault((int(s.size), s.xxh3_64.lower()), s.url)
        if first != s.url:
            out.append((first, s.url))
    return out


def warn_duplicate_content(shards: Sequence[Any]) -> List[Tuple[str, str]]:
    """Warn once (``resumewds`` logger) when the same shard is listed under two
    names: its samples would be delivered twice per epoch.  Returns the pairs."""
    pairs = duplicate_content(shards)
    if pairs:
        a, b = pairs[0]
        more = f" (and {len(pairs) - 1} more such pair(s))" if len(pairs) > 1 else ""
        log.warning("%s and %s are the same shard (same size and xxh3_64): its samples are delivered twice "
                    "per epoch%s; list it once if that is not meant", a, b, more)
    return pairs
