"""One cache entry on disk: its files, its meta, its state, and the safe file primitives.

Every remote shard has one entry in ``<cache_dir>/shards/``, named after the
xxh3_64 of its URL and a sanitised tail of its basename::

    <key>-<basename>               the shard (published by os.replace, never written in place)
    <key>-<basename>.partial       the download under way (resumable)
    <key>-<basename>.partial.etag  the partial's If-Range validator and boot id (fetch's sidecar); alone:
                                   the version a failed read saw first, the object changed since
    <key>-<basename>.sparse        or: a download filled by verified ranges, in any order
    <key>-<basename>.sparse.map    its records of the ranges present
    <key>-<basename>.meta          JSON, written after the shard: url, size, xxh3_64,
                                   mtime_ns, dev, ino, ctime_ns, last_used, synced, boot
    <key>-<basename>.lock          pin lock: readers LOCK_SH, the evictor LOCK_EX|LOCK_NB
    <key>-<basename>.dl            download lock: one downloader at a time

Everything here refuses symlinks in the cache directory and turns an
``OSError`` into a one-line :class:`~resumewds.errors.CacheError`.
"""

from __future__ import annotations

import errno
import json
import os
import re
import stat
import threading
import time
from enum import Enum
from typing import Any, Callable, Dict, Optional, Tuple

import xxhash

from ..errors import CacheError, ShardFormatError, os_problem
from ..fetch import boot_id
from ..manifest import shard_basename
from ..redact import cache_key_url, redact_url
from ..tar import _io as tario

ProgressFn = Callable[[int], None]

NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
HASH_CHUNK = 1 << 20
#: suffixes of an entry's side files (not counted as entries by the evictor's scan)
SIDE_SUFFIXES = (".partial", ".etag", ".meta", ".lock", ".dl", ".tmp", ".sparse", ".sparse.map")
#: a partial download's data file: streamed (``fetch``) or sparse (:mod:`resumewds.cache`)
PARTIAL_SUFFIXES = (".partial", ".sparse")
#: every file of a partial download, removed together when it is evicted
PARTIAL_FILES = (".partial", ".partial.etag", ".sparse", ".sparse.map")


class EntryState(str, Enum):
    """What a reader finds when it looks at a remote shard's entry (under its pin lock).

    The life of one entry, each step under the lock named::

        ABSENT --(.dl: fetch .partial, hashed as written; [fsync]; check;
                  os.replace; write .meta)---------------------------------> VERIFIED
        VERIFIED --(.lock shared: a reader pins it while it reads)---------> VERIFIED (pinned)
        VERIFIED --(.lock exclusive, non-blocking: the evictor, LRU over
                    cache_size, only when no reader pins it)--------------> ABSENT (evicted)
        CORRUPT  --(.dl: ranged repair of the bad samples, else remove and
                    fetch again)---------------------------------------------> VERIFIED (repaired)
        UNTRUSTED --(.dl: adopted if a known checksum proves it, else
                     removed and fetched again)-----------------------------> VERIFIED

    ABSENT may hold a ``.partial`` that the next download resumes.  A kill at
    any instant leaves a ``.partial`` or a shard without meta (UNTRUSTED).
    """

    ABSENT = "missing"       # no shard file (perhaps a .partial download)
    UNTRUSTED = "nometa"     # a shard file without a meta naming this url, or written without
    #                          fsync in an earlier boot with no checksum to check it against
    CORRUPT = "corrupt"      # size or xxh3_64 differs from the manifest's or the meta's
    VERIFIED = "ok"          # checked per the verify policy: safe to read

    def __str__(self) -> str:
        return self.value


def entry_path(shards_dir: str, url: str) -> str:
    """Where the cached copy of ``url`` lives in ``shards_dir`` (whether or not it exists).

    Example:
        >>> entry_path("/c/shards", "http://h/d/shard-0001.tar")
        '/c/shards/...-shard-0001.tar'
    """
    name = re.sub(r"[^A-Za-z0-9._-]", "_", shard_basename(url))[-100:].lstrip(".") or "shard"
    # keyed without user info and signature: a rotated presigned URL finds its entry
    return os.path.join(shards_dir, f"{xxhash.xxh3_64(cache_key_url(url).encode()).hexdigest()}-{name}")


def names(meta: Dict[str, Any], url: str) -> bool:
    """True if the entry's meta is about ``url`` (the meta holds it redacted)."""
    recorded = meta.get("url")
    return isinstance(recorded, str) and cache_key_url(recorded) == cache_key_url(url)


def cache_error(exc: OSError, where: str, doing: str) -> CacheError:
    """``CacheError("<where>: cannot <doing>: <problem>")``."""
    return CacheError(f"{where}: cannot {doing}: {os_problem(exc)}")


def lstat(path: str) -> Optional[os.stat_result]:
    """lstat that refuses symlinks and non-regular files; None if missing."""
    try:
        st = os.lstat(path)
    except FileNotFoundError:
        return None
    except OSError as exc:
        raise cache_error(exc, path, "stat") from exc
    if stat.S_ISLNK(st.st_mode):
        raise CacheError(f"{path}: is a symlink inside the cache directory; refusing to use it")
    if not stat.S_ISREG(st.st_mode):
        raise CacheError(f"{path}: is not a regular file; refusing to use it")
    return st


def open_file(path: str, flags: int, doing: str) -> int:
    """``os.open`` without following a symlink; a CacheError names the file."""
    try:
        return os.open(path, flags | NOFOLLOW, 0o600)  # private: the cache is the user's
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise CacheError(f"{path}: is a symlink inside the cache directory; refusing to use it") from exc
        raise cache_error(exc, os.path.dirname(path), f"{doing} {os.path.basename(path)}") from exc


def remove(path: str) -> None:
    """Unlink ``path``; a missing file is fine."""
    try:
        os.unlink(path)
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise cache_error(exc, path, "remove") from exc


def touch(path: str) -> None:
    """Record a use of the entry ``path``: the atime of its ``.meta`` set to now, its mtime kept.

    Not the shard's own atime: that would move the shard's ctime, which the
    meta records (:func:`moved`).
    """
    try:
        st = os.lstat(path + ".meta")
        if stat.S_ISREG(st.st_mode):
            os.utime(path + ".meta", ns=(time.time_ns(), st.st_mtime_ns), follow_symlinks=False)
    except OSError:
        pass


def last_used_ns(base: str, st: os.stat_result) -> int:
    """When the entry was last used: the newer atime of the shard file (``st``) and its meta."""
    try:
        return max(st.st_atime_ns, os.lstat(base + ".meta").st_atime_ns)
    except OSError:
        return st.st_atime_ns


def identity(st: os.stat_result) -> Dict[str, int]:
    """What the meta records besides size and mtime: what ``utime`` cannot set back."""
    return {"dev": st.st_dev, "ino": st.st_ino, "ctime_ns": st.st_ctime_ns}


def moved(st: os.stat_result, meta: Dict[str, Any]) -> Optional[bool]:
    """True if the shard file is not the one (or not as) the meta recorded: another
    inode or device (replaced), or another ctime (written in place); None for a
    meta without these fields."""
    known = [meta.get(k) for k in ("dev", "ino", "ctime_ns")]
    if not all(isinstance(v, int) for v in known):
        return None
    return known != [st.st_dev, st.st_ino, st.st_ctime_ns]


def signature(base: str) -> Optional[Tuple[int, int, int, int]]:
    """Identity of an entry and its meta: changes when anyone (re)publishes it."""
    st = lstat(base)
    mt = lstat(base + ".meta")
    if st is None:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size, mt.st_mtime_ns if mt is not None else 0)


def fsync_file(path: str) -> None:
    """fsync ``path`` (a CacheError if the disk refuses)."""
    fd = open_file(path, os.O_RDONLY, "open")
    try:
        os.fsync(fd)
    except OSError as exc:
        raise cache_error(exc, os.path.dirname(path), "fsync the download") from exc
    finally:
        os.close(fd)


def hash_file(path: str, progress: Optional[ProgressFn] = None) -> Tuple[int, str]:
    """``(size, xxh3_64 hex)`` of the cache file ``path``, read in 1 MiB chunks."""
    h = xxhash.xxh3_64()
    n = 0
    fd = open_file(path, os.O_RDONLY, "read")
    try:
        while True:
            try:
                b = os.read(fd, HASH_CHUNK)
            except OSError as exc:
                raise cache_error(exc, path, "read") from exc
            if not b:
                break
            h.update(b)
            n += len(b)
            if progress is not None:
                progress(len(b))
    finally:
        os.close(fd)
    return n, h.hexdigest()


def read_meta(base: str) -> Optional[Dict[str, Any]]:
    """The entry's meta, or None when missing or unreadable (the entry is then UNTRUSTED)."""
    path = base + ".meta"
    try:
        fd = os.open(path, os.O_RDONLY | NOFOLLOW)
    except FileNotFoundError:
        return None
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise CacheError(f"{path}: is a symlink inside the cache directory; refusing to use it") from exc
        return None
    try:
        with os.fdopen(fd, "rb") as f:
            meta = json.loads(f.read())
    except (OSError, ValueError):
        return None
    if not isinstance(meta, dict) or not isinstance(meta.get("url"), str) \
            or not isinstance(meta.get("size"), int) or not isinstance(meta.get("mtime_ns"), int):
        return None
    return meta


def write_meta(base: str, url: str, xxh: Optional[str], synced: bool) -> None:
    """Publish the meta of the shard file ``base`` (its size and mtime as they are now).

    The shard is made mode 0600 first, which moves its ctime: the meta records
    the ctime after that.
    """
    st = lstat(base)
    if st is None:
        raise CacheError(f"{base}: vanished before its meta was written")
    if stat.S_IMODE(st.st_mode) & 0o077:
        try:
            os.chmod(base, stat.S_IMODE(st.st_mode) & 0o700)
            st = lstat(base) or st
        except OSError:
            pass  # not ours (a shared cache): left as it is
    meta = {"url": redact_url(url), "size": st.st_size, "xxh3_64": xxh, "mtime_ns": st.st_mtime_ns, **identity(st),
            "last_used": time.time(), "synced": synced, "boot": boot_id()}
    _publish_meta(base, meta)


def _publish_meta(base: str, meta: Dict[str, Any]) -> None:
    tmp = f"{base}.meta.{os.getpid()}.{threading.get_ident()}.tmp"
    fd = open_file(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, "write")
    try:
        # no fsync: a meta lost to a machine crash reads as missing, and an
        # entry without meta is re-verified (or refetched), never trusted
        os.write(fd, json.dumps(meta).encode())
    except OSError as exc:
        os.close(fd)
        remove(tmp)
        raise cache_error(exc, os.path.dirname(base), "write meta") from exc
    os.close(fd)
    try:
        os.replace(tmp, base + ".meta")
    except OSError as exc:
        remove(tmp)
        raise cache_error(exc, os.path.dirname(base), "publish meta") from exc


def url_of(base: str) -> str:
    """The URL the entry's meta names, or "" (a partial has no meta yet: events then
    carry only the path, so the journal invents no shard row for a file name)."""
    try:
        meta = read_meta(base)
    except CacheError:
        meta = None
    return meta["url"] if meta else ""


def not_a_complete_tar(path: str, url: str, what: str = "download of") -> Optional[ShardFormatError]:
    """The ShardFormatError that says why ``path`` is not a complete tar, or None."""
    try:
        tario.scan_file(path, f"{what} {url}" if what else url)
    except ShardFormatError as exc:
        return exc
    except OSError as exc:
        raise cache_error(exc, path, "read back the download") from exc
    return None
