"""Eviction: keep the cache within ``cache_size``, least recently used first.

Room is made before a download (``reserve``) and when a reader releases a
shard; only shards pinned by readers may exceed the budget.  An entry is
evicted only with its ``.lock`` taken exclusive and non-blocking (not pinned,
not downloading).  "Recently used": the newer atime of the shard and its
``.meta`` (:func:`resumewds.cache._layout.touch`).  Decompressed copies
(``<cache_dir>/decompressed``) count like any other entry.
"""

from __future__ import annotations

import fcntl
import json
import os
import stat
from typing import Any, Callable, List, Optional, Set, Tuple

from ..events import EventKind
from . import _layout as layout
from ._layout import NOFOLLOW, PARTIAL_FILES, PARTIAL_SUFFIXES, SIDE_SUFFIXES, cache_error

EmitFn = Callable[..., Any]

#: The folder of decompressed copies, beside ``shards/`` in a cache directory.
DECOMPRESSED_DIR = "decompressed"


def copies_dir(shards_dir: str) -> str:
    """The decompressed copies' folder of the cache whose entries are in ``shards_dir``."""
    return os.path.join(os.path.dirname(shards_dir), DECOMPRESSED_DIR)


def _listdir(d: str) -> List[str]:
    try:
        return os.listdir(d)
    except FileNotFoundError:
        return []
    except OSError as exc:
        raise cache_error(exc, d, "list") from exc


def scan_copies(copies: str) -> List[Tuple[str, int, int, bool]]:
    """``(path, size, last_used_ns, False)`` for the finished decompressed copies in ``copies``."""
    out: List[Tuple[str, int, int, bool]] = []
    for name in _listdir(copies):
        if not name.endswith(".tar"):
            continue  # its .meta / .lock, or a copy being written (.partial.<pid>)
        path = os.path.join(copies, name)
        try:
            st = os.lstat(path)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode):
            out.append((path, st.st_size, max(st.st_atime_ns, st.st_mtime_ns), False))
    return out


def scan(shards_dir: str) -> List[Tuple[str, int, int, bool]]:
    """``(base, size, last_used_ns, is_partial)`` for the entries and partial downloads."""
    out: List[Tuple[str, int, int, bool]] = []
    seen: Set[str] = set()
    for name in _listdir(shards_dir):
        tail = next((t for t in PARTIAL_SUFFIXES if name.endswith(t)), None)
        partial = tail is not None
        if not partial and name.endswith(SIDE_SUFFIXES):
            continue
        path = os.path.join(shards_dir, name)
        base = path[: -len(tail)] if tail is not None else path
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            if not partial:
                continue
            # published (renamed to its entry) after the listing: in neither name
            # unless looked up again, and the cache would look a shard smaller
            try:
                st, path, partial = os.lstat(base), base, False
            except OSError:
                continue
        except OSError:
            continue
        if not stat.S_ISREG(st.st_mode) or base in seen:
            continue
        seen.add(base)
        out.append((base, st.st_size, max(st.st_atime_ns, st.st_mtime_ns) if partial
                    else layout.last_used_ns(base, st), partial))
    return out


def cached_bytes(shards_dir: str) -> int:
    """Bytes in the cache (entries, partial downloads and decompressed copies)."""
    return sum(size for _, size, _, _ in scan(shards_dir) + scan_copies(copies_dir(shards_dir)))


def evict(shards_dir: str, cache_size: Optional[int], emit: EmitFn, reserve: int = 0,
          keep: Optional[Set[str]] = None, reserved: Optional[Set[str]] = None) -> int:
    """Evict least recently used entries not in use (nor in ``keep``) until the cache plus
    ``reserve`` fits ``cache_size``; the bytes left.

    ``reserved``: entries the caller counts in ``reserve`` (downloads under
    way): left out of the total and never evicted.  Each eviction is
    ``emit("evict", url, bytes=, path=)`` (``url`` "" for a partial).
    """
    if cache_size is None:
        return 0
    entries = scan(shards_dir)
    if reserved:
        entries = [e for e in entries if e[0] not in reserved]
    copies = scan_copies(copies_dir(shards_dir))
    is_copy = {e[0] for e in copies}
    entries += copies
    total = sum(e[1] for e in entries)
    if total + reserve <= cache_size:
        return total
    for base, size, _, partial in sorted(entries, key=lambda e: e[2]):
        if total + reserve <= cache_size:
            break
        if keep and base in keep:
            continue
        try:
            fd = os.open(base + ".lock", os.O_RDWR | os.O_CREAT | NOFOLLOW, 0o600)
        except OSError:
            continue
        try:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except OSError:
                continue  # pinned by a reader or being downloaded
            if base in is_copy:
                url = _copy_url(base)
                layout.remove(base + ".meta")
                layout.remove(base)
            elif partial:
                # a partial download (streamed or sparse) has no meta yet
                url = layout.url_of(base)
                for side in PARTIAL_FILES:
                    layout.remove(base + side)
            else:
                url = layout.url_of(base)
                layout.remove(base + ".meta")
                layout.remove(base)
            total -= size
            emit(EventKind.EVICT, url, bytes=size, path=base)
        finally:
            os.close(fd)
    return total


def _copy_url(path: str) -> str:
    """The url a decompressed copy's meta names ("" if unreadable)."""
    try:
        with open(path + ".meta") as f:
            return str(json.load(f).get("url", ""))
    except (OSError, ValueError, AttributeError):
        return ""
