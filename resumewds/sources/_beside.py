"""A ``manifest.json`` beside shards given by name: their index without reading them.

Shards named one by one come without an index; when their directory holds a
``manifest.json`` listing every one of them, indexed (for local shards: same
size, no newer), :func:`fill_from_beside` takes their index from it instead
of downloading and scanning them; otherwise it is ignored with one debug log
line.  The rules and why: docs/COMPAT.md, "Shards named one by one".

Example:
    >>> beside_url("http://h/d/shard-000001.tar?sig=x"), beside_url("pipe:cat a.tar")
    ('http://h/d/manifest.json', None)
"""

from __future__ import annotations

import dataclasses
import logging
import os
import urllib.parse
from typing import Any, Dict, List, Optional, Set, Union

from ..errors import ResumeWDSError
from ..fetch import FetchConfig, scheme_of
from ..manifest import Manifest, ShardInfo, load_manifest
from ._resolve import _remote_manifest

__all__ = ["NAME", "beside_url", "fill_from_beside"]

log = logging.getLogger("resumewds")

#: the file looked for in the shards' directory
NAME = "manifest.json"

_said: Set[str] = set()  # manifests already reported as ignored (once per process)


def beside_url(url: str) -> Optional[str]:
    """Where a manifest beside shard ``url`` would be (None: not an http(s) or local shard)."""
    scheme = scheme_of(url)
    if scheme in ("http", "https"):
        parts = urllib.parse.urlsplit(url)
        directory = parts.path.rsplit("/", 1)[0]
        return urllib.parse.urlunsplit((parts.scheme, parts.netloc, directory + "/" + NAME, "", ""))
    if scheme == "local" and url != "-":
        return os.path.join(os.path.dirname(url), NAME)
    return None


def _ignore(where: str, why: str) -> None:
    if where not in _said:
        _said.add(where)
        log.debug("%s: not used for the shards beside it: %s", where, why)


def _load(where: str, fetch_config: Any, allow_remote_pipe: bool, cache_dir: Optional[str],
          allow_remote_local: Optional[bool], manifest_max_bytes: Union[int, str, None]) -> Optional[Manifest]:
    try:
        if scheme_of(where) == "local":
            if not os.path.isfile(where):
                return None
            return load_manifest(where)
        cfg = fetch_config or FetchConfig.from_env()
        once = dataclasses.replace(cfg, attempts=1, deadline=min(float(cfg.deadline), 60.0))
        return _remote_manifest(where, once, allow_remote_pipe, cache_dir, allow_remote_local, manifest_max_bytes)
    except (ResumeWDSError, OSError, ValueError) as exc:
        _ignore(where, f"cannot read it ({exc})")
        return None


def _local_mismatch(shard: ShardInfo, entry: ShardInfo, newest: float) -> Optional[str]:
    try:
        st = os.stat(shard.url)
    except OSError as exc:
        return f"{shard.url}: {exc.strerror or exc}"
    if entry.size is not None and st.st_size != entry.size:
        return f"{shard.url} is {st.st_size} bytes, the manifest says {entry.size}"
    if st.st_mtime > newest:
        return f"{shard.url} is newer than the manifest"
    return None


def fill_from_beside(m: Manifest, *, fetch_config: Any = None, allow_remote_pipe: bool = False,
                     cache_dir: Optional[str] = None, allow_remote_local: Optional[bool] = None,
                     manifest_max_bytes: Union[int, str, None] = None) -> int:
    """Give the shards of ``m`` not indexed yet the index of the ``manifest.json`` beside them.

    ``m`` is changed in place; the other arguments are :func:`resumewds.sources.resolve_sources`'s
    (one attempt is made at an http(s) manifest).  Returns how many shards were filled in.

    Example:
        >>> fill_from_beside(Manifest([ShardInfo(url="pipe:cat a.tar")]))
        0
    """
    groups: Dict[str, List[ShardInfo]] = {}
    for s in m.shards:
        if not s.indexed:
            where = beside_url(s.url)
            if where is not None:
                groups.setdefault(where, []).append(s)
    filled = 0
    for where, shards in groups.items():
        found = _load(where, fetch_config, allow_remote_pipe, cache_dir, allow_remote_local, manifest_max_bytes)
        if found is None:
            continue
        by_url = {e.url: e for e in found.shards}
        missing = [s.url for s in shards if s.url not in by_url or not by_url[s.url].indexed]
        if missing:
            _ignore(where, f"it does not list {missing[0]}" + (f" and {len(missing) - 1} more" if len(missing) > 1
                                                                 else "") + " (indexed)")
            continue
        if scheme_of(where) == "local":
            newest = os.stat(where).st_mtime
            bad = next((why for why in (_local_mismatch(s, by_url[s.url], newest) for s in shards) if why), None)
            if bad:
                _ignore(where, bad)
                continue
        for s in shards:
            e = by_url[s.url]
            s.size, s.xxh3_64, s.samples, s.offsets = e.size, e.xxh3_64, e.samples, e.offsets
            s.sample_digests = e.sample_digests
            s.index_source = where
            filled += 1
        log.debug("%s: the index of %d shards taken from it", where, len(shards))
    if filled:
        m._starts = None
    return filled
