"""The shard lists other tools write, read as counts-only sources.

webdataset's ``wids`` shard index and img2dataset's per-shard
``NNNNN_stats.json``: docs/DIGESTS.md, "Counts-only sources".

Example:
    >>> doc = {"__kind__": "wids-shard-index-v1", "shardlist": [{"url": "a.tar", "nsamples": 3}]}
    >>> [(e.url, e.samples) for e in wids_entries(doc, "/d/index.json", lambda u, loc: "/d/" + u)]
    [('/d/a.tar', 3)]
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from typing import Any, Callable, List, Optional

from ..errors import SourceError

__all__ = ["Entry", "WIDS_KIND", "is_stats", "is_wids", "stats_entry", "wids_entries"]

WIDS_KIND = "wids-shard-index-v1"
_MAX = (1 << 63) - 1


@dataclass
class Entry:
    """One shard as another tool's list declares it."""

    url: str
    samples: int
    size: Optional[int] = None
    md5: Optional[str] = None


def is_wids(data: Any) -> bool:
    """Whether parsed JSON is a wids shard index."""
    return isinstance(data, dict) and data.get("__kind__") == WIDS_KIND


def is_stats(data: Any, location: str) -> bool:
    """Whether parsed JSON at ``location`` is an img2dataset ``*_stats.json``."""
    return (isinstance(data, dict) and "format" not in data and "successes" in data
            and location.split("?", 1)[0].endswith("_stats.json"))


def _count(v: Any, where: str, what: str) -> int:
    if not isinstance(v, int) or isinstance(v, bool) or not 0 <= v <= _MAX:
        raise SourceError(f"{where}: {what} must be a non-negative integer, got {v!r}")
    return v


def wids_entries(data: Any, location: str, resolve: Callable[[str, str], str]) -> List[Entry]:
    """The shards of a wids shard index at ``location`` (``resolve(url, location)`` joins a
    relative url to it); SourceError: no ``shardlist``, or an entry without a url or a count."""
    shards = data.get("shardlist")
    if not isinstance(shards, list) or not shards:
        raise SourceError(f"{location}: a wids shard index needs a non-empty 'shardlist'")
    base = data.get("base")
    if base is not None and not isinstance(base, str):
        raise SourceError(f"{location}: wids 'base' must be a string")
    # relative urls join the base (a directory) or the file's own directory
    anchor = resolve(base.rstrip("/") + "/_", location) if base else location
    out = []
    for i, d in enumerate(shards):
        if not isinstance(d, dict) or not isinstance(d.get("url"), str) or not d["url"]:
            raise SourceError(f"{location}: shardlist[{i}] has no url")
        where = f"{location}: shard {d['url']}"
        md5 = d.get("md5sum")
        if md5 is not None and (not isinstance(md5, str) or len(md5) != 32
                                or md5.strip("0123456789abcdefABCDEF")):
            raise SourceError(f"{where}: 'md5sum' must be 32 hex digits, got {md5!r}")
        size = d.get("filesize")
        out.append(Entry(url=resolve(d["url"], anchor), samples=_count(d.get("nsamples"), where, "'nsamples'"),
                         size=None if size is None else _count(size, where, "'filesize'"), md5=md5))
    return out


def stats_entry(data: Any, location: str) -> Entry:
    """The shard an img2dataset ``NNNNN_stats.json`` describes: ``NNNNN.tar``
    beside it, holding ``successes`` samples.

    Example:
        >>> stats_entry({"count": 10, "successes": 8}, "/d/00003_stats.json")
        Entry(url='/d/00003.tar', samples=8, size=None, md5=None)
    """
    base, q = (location.split("?", 1) + [""])[:2]
    head = base[: -len("_stats.json")]
    url = head + ".tar" + ("?" + q if q else "")
    if not posixpath.basename(head):
        raise SourceError(f"{location}: an img2dataset stats file is named NNNNN_stats.json")
    return Entry(url=url, samples=_count(data.get("successes"), location, "'successes'"))
