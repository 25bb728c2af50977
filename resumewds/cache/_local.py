"""Local shards (plain paths, ``file://``): verified in place, never copied into the cache.

Under ``verify="once"`` a success is remembered in memory and as an empty
mark ``<cache_dir>/verified/<key>``; the key covers the file's path, size,
mtime, device, inode, ctime, checksum and index, so a changed file is hashed
again.  A reader opens a shard with sample digests unhashed
(:func:`open_sampled`) and checks each sample as it reads it; the whole-file
check then runs in the background (:func:`verify_later`) only to set the mark.
"""

from __future__ import annotations

import fcntl
import logging
import os
import queue
import threading
import time
from typing import Any, Callable, Dict, Optional, Set, Tuple

import xxhash

from ..errors import ChecksumMismatch, PermanentFetchError, ShardNotFoundError
from ..events import EventKind as K
from ..fetch import local_path
from ..manifest import ShardInfo
from ._layout import HASH_CHUNK, NOFOLLOW, ProgressFn
from ._samplecheck import check_copy, check_end, index_key

log = logging.getLogger("resumewds")


def check_local(shard: ShardInfo, policy: str, progress: Optional[ProgressFn], cache_dir: str,
                verified: Set[str], emit: Callable[..., Any]) -> str:
    """Verify the local shard in place under the verify ``policy``; its path.

    Args:
        cache_dir: the store's directory (its ``verified/`` marks).
        verified: the keys verified by this process (added to).

    Raises:
        ShardNotFoundError / PermanentFetchError: it cannot be read.
        ChecksumMismatch: its size, checksum or a sample digest is wrong.
        ShardFormatError: the manifest lists fewer samples than it holds.
    """
    path, st = _stat_sized(shard, emit)
    if shard.xxh3_64 is None or policy == "never":
        return path
    key = _mark_key(path, st, shard)
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


def _stat_sized(shard: ShardInfo, emit: Callable[..., Any]) -> Tuple[str, os.stat_result]:
    """The shard's path and ``stat``, its size checked against the manifest's."""
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
    return path, st


def _mark_key(path: str, st: os.stat_result, shard: ShardInfo) -> str:
    """The key of the shard's "verified" mark (see the module docstring)."""
    assert shard.xxh3_64 is not None
    return xxhash.xxh3_64(f"{os.path.realpath(path)}\0{st.st_size}\0{st.st_mtime_ns}\0{st.st_dev}\0{st.st_ino}\0"
                          f"{st.st_ctime_ns}\0{shard.xxh3_64.lower()}{index_key(shard)}".encode()
                          ).hexdigest()  # utime cannot fake dev, inode or ctime


def sampled(shard: ShardInfo, policy: str) -> bool:
    """Whether a reader checks the local shard's samples one by one instead of hashing it whole first."""
    return (policy in ("once", "always") and shard.sample_digests is not None and shard.offsets is not None
            and shard.xxh3_64 is not None and not getattr(shard, "salvaged", False))


def open_sampled(shard: ShardInfo, policy: str, cache_dir: str, verified: Set[str],
                 emit: Callable[..., Any]) -> Tuple[str, Optional[str]]:
    """Open a local shard for a reader without hashing it whole: its path, and its mark's key
    when its samples must be checked one by one (None: verified whole, ``verify="once"``).

    Raises:
        ShardNotFoundError / PermanentFetchError: it cannot be read.
        ChecksumMismatch: its size is wrong.
        ShardFormatError: the manifest lists fewer samples than it holds.
    """
    path, st = _stat_sized(shard, emit)
    key = _mark_key(path, st, shard)
    if policy == "once" and (key in verified or os.path.exists(os.path.join(cache_dir, "verified", key))):
        verified.add(key)
        return path, None
    try:
        check_end(path, shard)
    except OSError as exc:
        raise PermanentFetchError(f"{path}: cannot read: {exc.strerror or exc}", shard.url) from exc
    except Exception as exc:
        emit(K.VERIFY_FAIL, shard.url, expected="end-of-archive", actual="more samples")
        raise exc
    return path, key


#: seconds the background checks of a process wait before the first one starts: the
#: first samples' reads of a cold disk come first (what is delivered never depends on it)
CHECK_DELAY = 1.0


class _Checks:
    """This process's background thread that hashes local shards whole to set their marks."""

    q: Optional[queue.SimpleQueue[Tuple[ShardInfo, str, Set[str]]]] = None
    pid = 0
    queued: Set[Tuple[str, str]] = set()  # (cache_dir, key)
    pending = 0  # checks queued or running in this process


_LOCKS: Dict[int, threading.Condition] = {}


def _lock() -> threading.Condition:
    """This process's lock of the checks (a forked child's own: never one its parent's threads held)."""
    return _LOCKS.setdefault(os.getpid(), threading.Condition())


def verify_later(shard: ShardInfo, key: str, cache_dir: str, verified: Set[str]) -> None:
    """Hash the local ``shard`` whole in the background and, if it matches, set its "verified" mark.

    A failure is logged at debug level and leaves no mark (the reader goes on
    checking samples one by one).  Processes take turns on one file (an
    ``flock`` on ``<cache_dir>/verify.lock``): the second finds the mark.

    Example:
        >>> verify_later(shard, key, cache_dir, store_verified)          # doctest: +SKIP
    """
    with _lock():
        if _Checks.q is None or _Checks.pid != os.getpid():  # a forked worker starts its own
            _Checks.q, _Checks.pid, _Checks.queued, _Checks.pending = queue.SimpleQueue(), os.getpid(), set(), 0
            threading.Thread(target=_check_loop, args=(_Checks.q,), name="resumewds-verify", daemon=True).start()
        if (cache_dir, key) in _Checks.queued:
            return
        _Checks.queued.add((cache_dir, key))
        _Checks.pending += 1
        _Checks.q.put((shard, cache_dir, verified))


def wait_checks(timeout: Optional[float] = None) -> bool:
    """Wait until this process's background checks have ended; False if ``timeout`` passed first."""
    with _lock():
        return _lock().wait_for(lambda: _Checks.pending == 0 or _Checks.pid != os.getpid(), timeout)


def _check_loop(q: queue.SimpleQueue[Tuple[ShardInfo, str, Set[str]]]) -> None:
    try:  # Linux: a thread's own nice value; the reads the samples wait for come first
        os.setpriority(os.PRIO_PROCESS, threading.get_native_id(), 10)
    except (AttributeError, OSError):
        pass
    time.sleep(CHECK_DELAY)
    while True:
        shard, cache_dir, verified = q.get()
        try:
            os.makedirs(cache_dir, mode=0o700, exist_ok=True)
            fd = os.open(os.path.join(cache_dir, "verify.lock"), os.O_RDWR | os.O_CREAT | NOFOLLOW, 0o600)
        except OSError:
            fd = -1
        try:
            if fd >= 0:
                fcntl.flock(fd, fcntl.LOCK_EX)
            check_local(shard, "once", None, cache_dir, verified, _quiet)
        except Exception as exc:  # the samples are checked one by one: nothing else depends on it
            log.debug("background check of %s: %s", shard.url, exc)
        finally:
            if fd >= 0:
                os.close(fd)
            with _lock():
                _Checks.pending -= 1
                _lock().notify_all()


def _quiet(kind: str, url: str = "", **detail: Any) -> None:
    """The background check's events go nowhere (the reads report each sample)."""
