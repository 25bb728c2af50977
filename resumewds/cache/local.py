"""Local shards (plain paths, ``file://``): verified in place, never copied into the cache.

A local shard is hashed where it is (whole file, then the manifest's samples:
:func:`resumewds.samplecheck.check_copy`).  Under ``verify="once"`` a success
is remembered in memory and as an empty mark file
``<cache_dir>/verified/<key>``, where the key covers the file's path, size,
mtime, device, inode and ctime (``utime`` cannot fake the last three), its
expected checksum and the manifest's index of it; a changed file, or another
index, is hashed again.
"""

from __future__ import annotations

import os
from typing import Any, Callable, Optional, Set

import xxhash

from ..errors import ChecksumMismatch, PermanentFetchError, ShardNotFoundError
from ..events import EventKind as K
from ..fetch import local_path
from ..manifest import ShardInfo
from ..samplecheck import check_copy, index_key
from .layout import HASH_CHUNK, NOFOLLOW, ProgressFn

__all__ = ["check_local"]


def check_local(shard: ShardInfo, policy: str, progress: Optional[ProgressFn], cache_dir: str,
                verified: Set[str], emit: Callable[..., Any]) -> str:
    """Verify the local shard ``shard`` in place under the verify ``policy``; its path.

    Args:
        shard: a shard whose url is a local path or ``file://`` URL.
        policy: "once", "always" or "never" (sizes only).
        progress: called with the number of bytes hashed, as they are.
        cache_dir: the store's directory (its ``verified/`` marks).
        verified: the keys verified by this process (added to).
        emit: the store's ``emit``.

    Raises:
        ShardNotFoundError / PermanentFetchError: it cannot be read.
        ChecksumMismatch: its size, checksum or a sample digest is wrong.
        ShardFormatError: the manifest lists fewer samples than it holds.
    """
    path = local_path(shard.url)
    try:
        st = os.stat(path)
    except FileNotFoundError as exc:
        raise ShardNotFoundError(f"{path}: no such file", shard.url) from exc
    except OSError as exc:
        raise PermanentFetchError(f"{path}: cannot read: {exc.strerror or exc}", shard.url) from exc
    if shard.size is not None and st.st_size != shard.size:
        emit(K.VERIFY_FAIL, shard.url, expected=str(shard.size), actual=str(st.st_size))
        raise ChecksumMismatch(path, str(shard.size), str(st.st_size), what="size")
    if shard.xxh3_64 is None or policy == "never":
        return path
    key = xxhash.xxh3_64(f"{os.path.realpath(path)}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_dev}\0{st.st_ino}\0"
                         f"{st.st_ctime_ns}\0{shard.xxh3_64.lower()}{index_key(shard)}".encode()
                         ).hexdigest()  # utime cannot fake dev, inode or ctime
    marker = os.path.join(cache_dir, "verified", key)
    if policy == "once" and (key in verified or os.path.exists(marker)):
        verified.add(key)
        return path
    try:
        with open(path, "rb") as f:
            h = xxhash.xxh3_64()
            while True:
                b = f.read(HASH_CHUNK)
                if not b:
                    break
                h.update(b)
                if progress is not None:
                    progress(len(b))
    except OSError as exc:
        raise PermanentFetchError(f"{path}: cannot read: {exc.strerror or exc}", shard.url) from exc
    actual = h.hexdigest()
    if actual != shard.xxh3_64.lower():
        emit(K.VERIFY_FAIL, shard.url, expected=shard.xxh3_64, actual=actual)
        raise ChecksumMismatch(path, shard.xxh3_64, actual)
    check_copy(path, shard, emit)  # the manifest's samples: where they end, their digests
    emit(K.VERIFY_OK, shard.url)
    verified.add(key)
    try:  # best effort: a read-only cache dir falls back to memory
        os.makedirs(os.path.dirname(marker), mode=0o700, exist_ok=True)
        os.close(os.open(marker, os.O_WRONLY | os.O_CREAT | NOFOLLOW, 0o600))
    except OSError:
        pass
    return path
