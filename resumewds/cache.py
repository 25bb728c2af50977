"""ShardStore: a verified, self-repairing, size-bounded cache of remote shards.

Local shards (plain paths, ``file://``) are read where they are and only
verified.  Remote shards (http, https, ``pipe:``) are downloaded once into::

    <cache_dir>/shards/<xxh3_64(url)>-<basename>           the shard
    <cache_dir>/shards/<xxh3_64(url)>-<basename>.partial   while downloading
    <cache_dir>/shards/<xxh3_64(url)>-<basename>.partial.etag  its If-Range validator
    <cache_dir>/shards/<xxh3_64(url)>-<basename>.meta      JSON: url, size, xxh3_64,
                                                          mtime_ns, last_used, synced, boot
    <cache_dir>/shards/<xxh3_64(url)>-<basename>.lock      pin lock: readers LOCK_SH, evictor LOCK_EX|NB
    <cache_dir>/shards/<xxh3_64(url)>-<basename>.dl        download lock: one downloader at a time
    <cache_dir>/verified/<key>                             "local file verified" marks

An entry's life, with the lock held at each step::

    MISSING --(EX: fetch .partial (hashed as it is written), [fsync], verify,
               os.replace, write .meta)-----------------------------------> CACHED
    CACHED  --(SH: verify per policy; pinned while a reader holds it)------> CACHED
    CACHED  --(EX: verification failed: remove, fetch again)--------------> CACHED / error
    CACHED  --(EX, non-blocking, by the evictor: LRU over cache_size)------> MISSING

A data file is only ever trusted together with a ``.meta`` written after it,
so a process killed at any instant leaves either a resumable ``.partial`` or
an entry without meta, which is re-verified (when a checksum is known) or
fetched again.  Locks are ``fcntl.flock`` locks: they vanish with the process
that held them, so a killed process never blocks the others.

Durability (``sync``): a download is verified from the bytes as they are
written.  With ``sync="fsync"`` it is also fsynced before it is published.
With ``sync="boot"`` (the default, ``"auto"``, wherever the kernel gives a
boot id) it is not: its meta records ``synced: false`` and this boot's id.
Unsynced bytes survive anything but a kernel crash or a power cut, and those
end the boot; so an unsynced entry is trusted as verified within the boot that
wrote it, and is hashed again (whatever the verify policy) the first time it
is used in a later boot; a partial download from an earlier boot is not
resumed.  A crash can therefore never make the cache serve bytes that were
not verified, and a download does not wait for the disk.  Where there is no
boot id (not Linux), ``"auto"`` means ``"fsync"``.

Verify policies: ``"once"`` hashes at download and again whenever the file's
size or mtime changed since its meta was written (for local files: once per
(path, size, mtime), remembered in memory and under ``cache_dir/verified``);
``"always"`` hashes at every acquire; ``"never"`` only compares sizes.

Budget: ``cache_size`` is a limit.  Before a download, entries not in use
are evicted (least recently used first) to make room for it; when a reader
releases a shard, what exceeds the budget goes; prefetch only fetches a shard
that fits (and never evicts what it fetched for later); the only excess is
shards pinned by readers at that moment.  When one shuffle window alone does
not fit, a warning says so once, with the numbers.

Downloads without a known checksum are checked to be complete tars (the
framer of :mod:`resumewds.tario` scans them) before they are published, so
one bad response (an error page) is never kept as the shard; a corrupt
download is a failed attempt of the shard's fetch budget
(:class:`resumewds.fetch.FetchBudget`), shared by the prefetch thread and
the reader.

Environment (read through :mod:`resumewds.config`, which lists every
variable): ``RESUMEWDS_CACHE_DIR`` / ``WDS_CACHE`` (default
``$XDG_CACHE_HOME/resumewds`` or ``~/.cache/resumewds``),
``RESUMEWDS_CACHE_SIZE`` / ``WDS_CACHE_SIZE`` (e.g. ``20GB``),
``RESUMEWDS_CACHE_SYNC`` (``auto``, ``fsync`` or ``boot``),
``RESUMEWDS_VERBOSE_CACHE`` / ``WDS_VERBOSE_CACHE``, and the
``RESUMEWDS_FETCH_*`` variables.

Example:
    >>> parse_size("1.5GiB"), parse_size("20GB"), parse_size(512)
    (1610612736, 20000000000, 512)
"""

from __future__ import annotations

import collections
import errno
import fcntl
import json
import logging
import os
import re
import stat
import sys
import threading
import time
import weakref
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

import xxhash

from . import config as _config
from .config import parse_size
from .errors import (
    CacheError,
    ChecksumMismatch,
    PermanentFetchError,
    ResumeWDSError,
    ShardFormatError,
    TransientFetchError,
    ShardNotFoundError,
    UnsafeSourceError,
)
from .fetch import FetchBudget, FetchConfig, boot_id, fetch_to_file, is_remote_url, local_path, new_session
from .manifest import ShardInfo, shard_basename

log = logging.getLogger("resumewds.cache")

EventFn = Callable[..., None]
ProgressFn = Callable[[int], None]

VERIFY_POLICIES = ("once", "always", "never")
SYNC_MODES = ("auto", "fsync", "boot")
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_HASH_CHUNK = 1 << 20
_SIDE_SUFFIXES = (".partial", ".etag", ".meta", ".lock", ".dl", ".tmp")
_VERBOSE_KINDS = ("cache_miss", "fetch_done", "repair", "verify_fail", "evict")

def default_cache_dir() -> str:
    """``$RESUMEWDS_CACHE_DIR``, else ``$WDS_CACHE``, else ``$XDG_CACHE_HOME/resumewds``,
    else ``~/.cache/resumewds`` (see :func:`resumewds.config.cache_dir`)."""
    return _config.cache_dir()


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


def _problem(exc: OSError) -> str:
    names = {errno.ENOSPC: "no space left on device", errno.EDQUOT: "disk quota exceeded",
             errno.EROFS: "read-only file system", errno.EACCES: "permission denied (not writable?)",
             errno.EPERM: "operation not permitted", errno.ELOOP: "is a symlink, refusing to follow it",
             errno.ENOTDIR: "a path component is not a directory"}
    return names.get(exc.errno or 0, exc.strerror or str(exc))


def _cache_error(exc: OSError, where: str, doing: str) -> CacheError:
    return CacheError(f"{where}: cannot {doing}: {_problem(exc)}")


# A forked DataLoader worker inherits the store as it is: locks possibly held by
# the prefetch thread, and the parent's HTTP connections.  Give the child fresh ones.
_LIVE_STORES: "weakref.WeakSet[ShardStore]" = weakref.WeakSet()


def _after_fork_in_child() -> None:
    for store in list(_LIVE_STORES):
        store._init_runtime()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork_in_child)


def _first_worker() -> bool:
    """False in a DataLoader worker other than worker 0 (so that a warning
    every worker would give is given once).  Never imports torch."""
    data = sys.modules.get("torch.utils.data")
    get = getattr(data, "get_worker_info", None)
    if get is None:
        return True
    try:
        info = get()
    except Exception:  # noqa: BLE001 (a torch we do not know: warn)
        return True
    return info is None or getattr(info, "id", 0) == 0


class LocalShard:
    """A shard available as a local file, pinned until :meth:`close`.

    Attributes:
        path: the file to read (with ``os.pread``).
        shard: the :class:`ShardInfo` it is for.
        cached: True when ``path`` is inside the cache.
    """

    def __init__(self, path: str, shard: ShardInfo, lock_fd: Optional[int] = None, cached: bool = False,
                 on_release: Optional[Callable[[], None]] = None):
        self.path = path
        self.shard = shard
        self.cached = cached
        self._lock_fd = lock_fd
        self._on_release = on_release

    @property
    def pinned(self) -> bool:
        return self._lock_fd is not None

    def close(self) -> None:
        """Release the pin (the entry may be evicted afterwards, and the
        store evicts what its ``cache_size`` no longer holds)."""
        self._release(hook=True)

    def _release(self, hook: bool) -> None:
        fd, self._lock_fd = self._lock_fd, None
        if fd is not None:
            try:
                os.close(fd)  # closing the descriptor drops its flock
            except OSError:
                pass
            fn, self._on_release = self._on_release, None
            if fn is not None and hook:
                try:
                    fn()  # the store evicts what its budget no longer holds
                except (ResumeWDSError, OSError):
                    pass

    def __enter__(self) -> "LocalShard":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        self._release(hook=False)  # no eviction from a garbage collector's arbitrary moment

    def __repr__(self) -> str:
        return f"LocalShard({self.path!r}, pinned={self.pinned})"


class ShardStore:
    """Give readers a verified local file for each shard.

    Args:
        cache_dir: where remote shards are kept (see :func:`default_cache_dir`).
        cache_size: byte budget (int or "20GB"); default ``$RESUMEWDS_CACHE_SIZE``
            (or ``$WDS_CACHE_SIZE``), else unlimited.  Shards being read may
            exceed it, nothing else does.
        verify: "once", "always" or "never" (see the module docstring).
        fetch: retry/timeout policy; default ``FetchConfig.from_env()``.
        on_event: ``on_event(kind, url, **detail)``; kinds ``cache_hit``,
            ``cache_miss``, ``verify_ok``, ``verify_fail``, ``repair``,
            ``evict``, ``fetch_start``, ``fetch_done``, ``retry``.
        max_repairs: an extra cap on how many failed verifications of one
            shard are fetched again before giving up with ChecksumMismatch;
            None (the default): only the fetch budget decides, as a corrupt
            download counts as a failed attempt of it.
        sync: "auto" (default, or ``$RESUMEWDS_CACHE_SYNC``), "fsync" or
            "boot": how a download is made safe against a crash of the
            machine (see the module docstring).
        prefetch_threads: shards :meth:`prefetch` downloads at once.

    Attributes:
        counters: events seen by kind, plus ``bytes_fetched`` and ``bytes_evicted``.
    """

    def __init__(self, cache_dir: Optional[str] = None, cache_size: Union[int, str, None] = None,
                 verify: str = "once", fetch: Optional[FetchConfig] = None,
                 on_event: Optional[EventFn] = None, max_repairs: Optional[int] = None,
                 sync: Optional[str] = None, prefetch_threads: int = 2):
        if verify not in VERIFY_POLICIES:
            raise ValueError(f"verify must be one of {VERIFY_POLICIES}, got {verify!r}")
        sync = _config.cache_sync(sync)
        if sync not in SYNC_MODES:
            raise ValueError(f"sync (or RESUMEWDS_CACHE_SYNC) must be one of {SYNC_MODES}, got {sync!r}")
        if sync == "boot" and boot_id() is None:
            raise ValueError('sync="boot" needs a kernel boot id (/proc/sys/kernel/random/boot_id); '
                             'use "fsync" or "auto"')
        if max_repairs is not None and max_repairs < 0:
            raise ValueError(f"max_repairs must be >= 0, got {max_repairs}")
        self.cache_dir = os.path.abspath(os.path.expanduser(_config.cache_dir(cache_dir)))
        self.cache_size: Optional[int] = _config.cache_size(cache_size)
        self.verbose_cache = _config.verbose_cache()
        self.verify = verify
        self.fetch = fetch if fetch is not None else FetchConfig.from_env()
        self.on_event = on_event
        self.max_repairs = max_repairs
        self.sync = "fsync" if sync == "fsync" or boot_id() is None else "boot"
        if prefetch_threads < 1:
            raise ValueError(f"prefetch_threads must be >= 1, got {prefetch_threads}")
        self.prefetch_threads = int(prefetch_threads)
        self.counters: Dict[str, int] = collections.Counter()
        self._verified_local: set = set()
        self._init_runtime()
        _LIVE_STORES.add(self)

    # ---- pickling -------------------------------------------------------------
    def _init_runtime(self) -> None:
        self._tl = threading.local()
        self._mu = threading.Lock()
        self._pf_cond = threading.Condition()
        self._pf_queue: collections.deque = collections.deque()
        self._pf_current: set = set()
        self._pf_keep: set = set()
        self._pf_fit = threading.Lock()
        self._pf_reserved: Dict[str, int] = {}
        self._pf_threads: List[threading.Thread] = []
        self._pf_stop = False
        self._dirs_ready = False
        self._budgets: Dict[str, FetchBudget] = {}
        self._window_warned = False

    def __getstate__(self) -> Dict[str, Any]:
        d = dict(self.__dict__)
        for k in ("_tl", "_mu", "_pf_cond", "_pf_queue", "_pf_current", "_pf_keep", "_pf_fit",
                  "_pf_reserved", "_pf_threads",
                  "_pf_stop", "_dirs_ready", "_budgets", "_window_warned"):
            d.pop(k, None)
        d["counters"] = collections.Counter()
        return d

    def __setstate__(self, d: Dict[str, Any]) -> None:
        self.__dict__.update(d)
        self._init_runtime()
        _LIVE_STORES.add(self)

    # ---- events -----------------------------------------------------------------
    def _emit(self, kind: str, url: str, **detail: Any) -> None:
        with self._mu:
            self.counters[kind] += 1
            if kind == "fetch_done":
                self.counters["bytes_fetched"] += int(detail.get("bytes", 0))
            elif kind == "evict":
                self.counters["bytes_evicted"] += int(detail.get("bytes", 0))
        if self.verbose_cache and kind in _VERBOSE_KINDS:
            print(f"[cache] {kind} {url or detail.get('path', '')}"
                  + (f" ({detail['bytes']} bytes)" if "bytes" in detail else ""), file=sys.stderr, flush=True)
        if self.on_event is not None:
            self.on_event(kind, url, **detail)

    # ---- the fetch budget of one read of one shard ------------------------------
    def _budget_for(self, url: str) -> FetchBudget:
        """The budget this read of ``url`` draws from: the one a prefetch (or
        a concurrent reader) of this process started, if it is still live or
        failed recently, else a fresh one."""
        with self._mu:
            b = self._budgets.get(url)
            now = time.monotonic()
            if b is None or (b.done_at is not None and now - b.done_at > self.fetch.deadline):
                b = self._budgets[url] = FetchBudget(self.fetch)
            return b

    def _budget_done(self, url: str, budget: FetchBudget, ok: bool, reader: bool) -> None:
        """A success, or a failure a reader has seen, ends the budget; a
        prefetch's failure keeps it for the reader to meet (at once)."""
        with self._mu:
            if ok or reader:
                if self._budgets.get(url) is budget:
                    del self._budgets[url]
            else:
                budget.done_at = time.monotonic()

    def _session(self):
        s = getattr(self._tl, "session", None)
        if s is None:
            s = self._tl.session = new_session()
        return s

    # ---- paths and safe file primitives ------------------------------------------
    @property
    def shards_dir(self) -> str:
        return os.path.join(self.cache_dir, "shards")

    def entry_path(self, url: str) -> str:
        """Where the cached copy of ``url`` lives (whether or not it exists)."""
        name = re.sub(r"[^A-Za-z0-9._-]", "_", shard_basename(url))[-100:].lstrip(".") or "shard"
        return os.path.join(self.shards_dir, f"{xxhash.xxh3_64(url.encode()).hexdigest()}-{name}")

    def _ensure_dirs(self) -> None:
        if self._dirs_ready:
            return
        for d in (self.cache_dir, self.shards_dir):
            try:
                os.makedirs(d, exist_ok=True)
            except OSError as exc:
                raise _cache_error(exc, self.cache_dir, "create the cache directory") from exc
        try:
            st = os.lstat(self.shards_dir)
        except OSError as exc:
            raise _cache_error(exc, self.shards_dir, "stat") from exc
        if stat.S_ISLNK(st.st_mode):
            raise CacheError(f"{self.shards_dir}: is a symlink; refusing to use it as the shard cache")
        if not os.access(self.shards_dir, os.W_OK | os.X_OK):
            raise CacheError(f"{self.shards_dir}: cache directory is not writable (read-only?)")
        self._dirs_ready = True

    @staticmethod
    def _lstat(path: str) -> Optional[os.stat_result]:
        """lstat that refuses symlinks; None if missing."""
        try:
            st = os.lstat(path)
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise _cache_error(exc, path, "stat") from exc
        if stat.S_ISLNK(st.st_mode):
            raise CacheError(f"{path}: is a symlink inside the cache directory; refusing to use it")
        if not stat.S_ISREG(st.st_mode):
            raise CacheError(f"{path}: is not a regular file; refusing to use it")
        return st

    @staticmethod
    def _open(path: str, flags: int, doing: str) -> int:
        try:
            return os.open(path, flags | _NOFOLLOW, 0o666)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise CacheError(f"{path}: is a symlink inside the cache directory; refusing to use it") from exc
            raise _cache_error(exc, os.path.dirname(path), f"{doing} {os.path.basename(path)}") from exc

    @staticmethod
    def _remove(path: str) -> None:
        try:
            os.unlink(path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            raise _cache_error(exc, path, "remove") from exc

    def _signature(self, base: str) -> Optional[Tuple[int, int, int, int]]:
        """Identity of an entry and its meta: changes when anyone (re)publishes it."""
        st = self._lstat(base)
        mt = self._lstat(base + ".meta")
        if st is None:
            return None
        return (st.st_ino, st.st_mtime_ns, st.st_size, mt.st_mtime_ns if mt is not None else 0)

    def _make_durable(self, path: str) -> bool:
        """fsync ``path`` if this store syncs; True if it did (see ``sync``)."""
        if self.sync != "fsync":
            return False
        fd = self._open(path, os.O_RDONLY, "open")
        try:
            os.fsync(fd)
        except OSError as exc:
            raise _cache_error(exc, os.path.dirname(path), "fsync the download") from exc
        finally:
            os.close(fd)
        return True

    def _lock_fd(self, base: str) -> int:
        return self._open(base + ".lock", os.O_RDWR | os.O_CREAT, "open lock file")

    def _hash(self, path: str, progress: Optional[ProgressFn] = None) -> Tuple[int, str]:
        h = xxhash.xxh3_64()
        n = 0
        fd = self._open(path, os.O_RDONLY, "read")
        try:
            while True:
                try:
                    b = os.read(fd, _HASH_CHUNK)
                except OSError as exc:
                    raise _cache_error(exc, path, "read") from exc
                if not b:
                    break
                h.update(b)
                n += len(b)
                if progress is not None:
                    progress(len(b))
        finally:
            os.close(fd)
        return n, h.hexdigest()

    def _read_meta(self, base: str) -> Optional[Dict[str, Any]]:
        path = base + ".meta"
        try:
            fd = os.open(path, os.O_RDONLY | _NOFOLLOW)
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

    def _write_meta(self, base: str, url: str, xxh: Optional[str], synced: bool) -> None:
        st = self._lstat(base)
        if st is None:
            raise CacheError(f"{base}: vanished before its meta was written")
        meta = {"url": url, "size": st.st_size, "xxh3_64": xxh, "mtime_ns": st.st_mtime_ns,
                "last_used": time.time(), "synced": synced, "boot": boot_id()}
        tmp = f"{base}.meta.{os.getpid()}.{threading.get_ident()}.tmp"
        fd = self._open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, "write")
        try:
            # no fsync: a meta lost to a machine crash reads as missing, and an
            # entry without meta is re-verified (or refetched), never trusted
            os.write(fd, json.dumps(meta).encode())
        except OSError as exc:
            os.close(fd)
            self._remove(tmp)
            raise _cache_error(exc, os.path.dirname(base), "write meta") from exc
        os.close(fd)
        try:
            os.replace(tmp, base + ".meta")
        except OSError as exc:
            self._remove(tmp)
            raise _cache_error(exc, os.path.dirname(base), "publish meta") from exc

    @staticmethod
    def _touch(path: str) -> None:
        """Record a use: set atime to now, keep mtime (meta compares it)."""
        try:
            st = os.lstat(path)
            os.utime(path, ns=(time.time_ns(), st.st_mtime_ns), follow_symlinks=False)
        except OSError:
            pass

    # ---- public API ---------------------------------------------------------------
    def acquire(self, shard: ShardInfo) -> LocalShard:
        """A verified local file for ``shard``, pinned until closed.

        Use as a context manager: ``with store.acquire(shard) as ls: os.pread(...)``.

        Raises:
            PermanentFetchError / TransientFetchError: it could not be fetched.
            ChecksumMismatch: a local file is corrupt, or downloads stayed corrupt
                until the fetch budget was spent.
            ShardFormatError: a shard with no known checksum kept arriving as
                something that is not a complete tar.
            CacheError: the cache directory is unusable.
        """
        from .compressed import open_view  # .tar.gz/.tar.zst: its decompressed copy (H4b, issue 13)

        return open_view(self, self._acquire(shard, pin=True))

    def ensure(self, shard: ShardInfo, tar: bool = True) -> str:
        """Like :meth:`acquire` but unpinned; returns the path.

        Args:
            shard: what to fetch.
            tar: the object is a tar shard (checked to be a complete tar
                before it is published when its checksum is unknown); False
                for other files (a manifest's offsets file).
        """
        ls = self._acquire(shard, pin=False, tar=tar)
        return ls.path

    def _acquire(self, shard: ShardInfo, pin: bool, policy: Optional[str] = None,
                 progress: Optional[ProgressFn] = None, tar: bool = True, reader: bool = True) -> LocalShard:
        policy = policy or self.verify
        if not is_remote_url(shard.url):
            if "://" in shard.url and not shard.url.startswith("file://"):
                raise PermanentFetchError(f"{shard.url}: unsupported URL scheme", shard.url)
            return LocalShard(self._check_local(shard, policy, progress), shard)
        if shard.url.startswith("pipe:") and not shard.trusted:
            raise UnsafeSourceError(f"{shard.url}: refusing to run a pipe: command from an untrusted manifest")
        budget = self._budget_for(shard.url)
        ok = False
        try:
            ls = self._acquire_remote(shard, pin, policy, progress, budget, tar)
            ok = True
            return ls
        finally:
            self._budget_done(shard.url, budget, ok, reader)

    # ---- local shards -----------------------------------------------------------------
    def _check_local(self, shard: ShardInfo, policy: str, progress: Optional[ProgressFn]) -> str:
        path = local_path(shard.url)
        try:
            st = os.stat(path)
        except FileNotFoundError as exc:
            raise ShardNotFoundError(f"{path}: no such file", shard.url) from exc
        except OSError as exc:
            raise PermanentFetchError(f"{path}: cannot read: {exc.strerror or exc}", shard.url) from exc
        if shard.size is not None and st.st_size != shard.size:
            self._emit("verify_fail", shard.url, expected=str(shard.size), actual=str(st.st_size))
            raise ChecksumMismatch(path, str(shard.size), str(st.st_size), what="size")
        if shard.xxh3_64 is None or policy == "never":
            return path
        key = xxhash.xxh3_64(f"{os.path.realpath(path)}\0{st.st_size}\0{st.st_mtime_ns}\0"
                             f"{shard.xxh3_64.lower()}".encode()).hexdigest()
        marker = os.path.join(self.cache_dir, "verified", key)
        if policy == "once" and (key in self._verified_local or os.path.exists(marker)):
            self._verified_local.add(key)
            return path
        try:
            with open(path, "rb") as f:
                h = xxhash.xxh3_64()
                while True:
                    b = f.read(_HASH_CHUNK)
                    if not b:
                        break
                    h.update(b)
                    if progress is not None:
                        progress(len(b))
        except OSError as exc:
            raise PermanentFetchError(f"{path}: cannot read: {exc.strerror or exc}", shard.url) from exc
        actual = h.hexdigest()
        if actual != shard.xxh3_64.lower():
            self._emit("verify_fail", shard.url, expected=shard.xxh3_64, actual=actual)
            raise ChecksumMismatch(path, shard.xxh3_64, actual)
        self._emit("verify_ok", shard.url)
        self._verified_local.add(key)
        try:  # best effort: a read-only cache dir falls back to memory
            os.makedirs(os.path.dirname(marker), exist_ok=True)
            os.close(os.open(marker, os.O_WRONLY | os.O_CREAT | _NOFOLLOW, 0o666))
        except OSError:
            pass
        return path

    # ---- remote shards ------------------------------------------------------------------
    def _check_entry(self, shard: ShardInfo, base: str, policy: str, progress: Optional[ProgressFn],
                     known_bad: Optional[Tuple[int, int]] = None) -> Tuple[str, Optional[Tuple[int, int]]]:
        """Classify the cached entry: ("ok"|"missing"|"nometa"|"corrupt", stat key).

        Read-only: safe under a shared lock.
        """
        st = self._lstat(base)
        if st is None:
            return "missing", None
        skey = (st.st_size, st.st_mtime_ns)
        if known_bad == skey:
            return "corrupt", skey
        meta = self._read_meta(base)
        if meta is None or meta.get("url") != shard.url:
            return "nometa", skey
        if shard.size is not None and st.st_size != shard.size:
            self._emit("verify_fail", shard.url, expected=str(shard.size), actual=str(st.st_size))
            return "corrupt", skey
        expected = (shard.xxh3_64 or meta.get("xxh3_64") or "").lower() or None
        # written without fsync in an earlier boot: the crash that ended that
        # boot may have eaten bytes, whatever the policy says
        stale = meta.get("synced", True) is not True and meta.get("boot") != boot_id()
        if stale and expected is None:
            return "nometa", skey  # nothing to check it against: fetch it again
        if policy == "never" and not stale:
            return "ok", skey
        changed = (stale or st.st_size != meta["size"] or st.st_mtime_ns != meta["mtime_ns"]
                   or (shard.xxh3_64 is not None and (meta.get("xxh3_64") or "").lower() != expected))
        if expected is None or not (changed or policy == "always"):
            return "ok", skey
        try:
            _, actual = self._hash(base, progress)
        except CacheError as exc:
            if isinstance(exc.__cause__, FileNotFoundError):
                # removed meanwhile by another process repairing it (repairs
                # hold the download lock, not our pin): look again under the
                # download lock, where the repair is finished
                return "missing", None
            raise
        if actual != expected:
            self._emit("verify_fail", shard.url, expected=expected, actual=actual)
            return "corrupt", skey
        self._emit("verify_ok", shard.url)
        if changed:
            # read back from disk after a reboot: those bytes are durable now
            self._write_meta(base, shard.url, expected, synced=stale or meta.get("synced", True) is True)
        return "ok", skey

    def _acquire_remote(self, shard: ShardInfo, pin: bool, policy: str, progress: Optional[ProgressFn],
                        budget: FetchBudget, tar: bool) -> LocalShard:
        self._ensure_dirs()
        base = self.entry_path(shard.url)
        # Two locks per entry.  ``.lock`` pins: readers hold it shared for as
        # long as they read, the evictor needs it exclusive.  ``.dl`` admits
        # one downloader at a time.  A reader never upgrades its pin (an
        # upgrade waits for every other reader's pin, and a reader that pins
        # a shard and then idles would block it forever).
        fd = self._lock_fd(base)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
            before = self._signature(base)
            state, skey = self._check_entry(shard, base, policy, progress)
            if state == "ok":
                self._emit("cache_hit", shard.url)
            else:
                dl = self._open(base + ".dl", os.O_RDWR | os.O_CREAT, "open download lock")
                try:
                    self._lock_download(dl, shard.url, budget, base)
                    # another process may have filled (or repaired) it meanwhile
                    if self._signature(base) != before:
                        state, skey = self._check_entry(shard, base, policy, progress)
                    if state == "ok":
                        self._emit("cache_hit", shard.url)
                    else:
                        self._fill(shard, base, policy, progress, skey if state == "corrupt" else None,
                                   budget, tar)
                finally:
                    os.close(dl)  # drops the download lock
            self._touch(base)
            if pin:
                with self._pf_cond:
                    self._pf_keep.discard(base)  # read now: no longer kept for later
                return LocalShard(base, shard, fd, cached=True,
                                  on_release=self._evict_on_release if self.cache_size is not None else None)
            os.close(fd)
            return LocalShard(base, shard, None, cached=True)
        except BaseException:
            os.close(fd)
            raise

    def _lock_download(self, dl: int, url: str, budget: FetchBudget, base: str) -> None:
        """Take the download lock, waiting for another downloader (a prefetch
        thread, another process) no longer than what is left of the budget;
        past it, only while that download is seen to progress at the minimum
        rate (its ``.partial`` grows), as a download of our own would be let
        finish."""
        try:
            fcntl.flock(dl, fcntl.LOCK_EX | fcntl.LOCK_NB)
            return
        except BlockingIOError:
            pass
        cfg = budget.config
        t0 = time.monotonic()
        pause = 0.005
        mark: Optional[Tuple[float, int]] = None
        while True:
            left = budget.remaining()
            if left <= 0:
                now = time.monotonic()
                st = self._lstat(base + ".partial")
                size = st.st_size if st is not None else -1
                if mark is None and cfg.min_rate and size >= 0:
                    mark = (now, size)  # the other download is under way: is it progressing?
                elif mark is None or now - mark[0] >= cfg.rate_window:
                    if mark is None or size < 0 or size - mark[1] < cfg.min_rate * (now - mark[0]):
                        raise TransientFetchError(
                            f"{url}: waited {now - t0:.1f}s for another download of this shard (a prefetch thread "
                            f"or another process) and reached the fetch deadline of {cfg.deadline:g}s "
                            f"(RESUMEWDS_FETCH_DEADLINE)", url)
                    mark = (now, size)
                left = cfg.rate_window
            time.sleep(min(pause, left))
            pause = min(pause * 2, 0.1)
            try:
                fcntl.flock(dl, fcntl.LOCK_EX | fcntl.LOCK_NB)
                return
            except BlockingIOError:
                continue

    def _fill(self, shard: ShardInfo, base: str, policy: str, progress: Optional[ProgressFn],
              known_bad: Optional[Tuple[int, int]], budget: Optional[FetchBudget] = None,
              tar: bool = True) -> None:
        """Under the exclusive lock: make ``base`` a verified entry."""
        budget = budget or FetchBudget(self.fetch)
        url = shard.url
        repairs = 0
        state, skey = self._check_entry(shard, base, policy, progress, known_bad)
        if state == "ok":
            self._emit("cache_hit", url)
            return
        if state == "nometa":
            # killed between publish and meta: adopt it if a known checksum proves it
            if shard.xxh3_64 is not None:
                size, actual = self._hash(base, progress)
                if actual == shard.xxh3_64.lower() and (shard.size is None or size == shard.size):
                    self._emit("verify_ok", url)
                    self._write_meta(base, url, actual, synced=self._make_durable(base))
                    self._emit("cache_hit", url)
                    return
            self._remove(base)
        elif state == "corrupt":
            repairs += 1
            from .repair import repair_entry  # issue 15: re-fetch only the samples that fail

            if (self.max_repairs is None or repairs <= self.max_repairs) and \
                    repair_entry(self, shard, base, budget):
                self._emit("cache_hit", url)
                return
            self._remove(base + ".meta")
            self._remove(base)
            if self.max_repairs is not None and repairs > self.max_repairs:
                raise ChecksumMismatch(f"cached copy of {url} ({base})", shard.xxh3_64 or str(shard.size),
                                       "a corrupt cached copy")
            self._emit("repair", url, attempt=repairs)
        self._emit("cache_miss", url)
        partial = base + ".partial"
        while True:
            if self._lstat(partial) is None:
                self._remove(partial + ".etag")
            # the download is about to add up to shard.size bytes: make room first
            self._evict(reserve=shard.size or 0)
            # hashed from the bytes as they were written: no read-back
            res = fetch_to_file(url, partial, expected_size=shard.size, config=self.fetch,
                                on_event=self._emit, session=self._session(), budget=budget)
            synced = self._make_durable(partial)
            if progress is not None:
                progress(res.size)
            bad: Optional[Tuple[str, str, str]] = None
            failure: Optional[ResumeWDSError] = None
            actual = res.xxh3_64
            if shard.size is not None and res.size != shard.size:
                bad = (str(shard.size), str(res.size), "size")
            elif shard.xxh3_64 is not None and actual != shard.xxh3_64.lower():
                bad = (shard.xxh3_64, actual, "xxh3_64")
                from .repair import repair_download  # issue 15: re-fetch only the samples that fail

                fixed = repair_download(self, shard, partial, budget)
                if fixed is not None:
                    actual, bad = fixed, None
            elif shard.xxh3_64 is None and tar:
                # nothing to check it against: at least it must be a complete
                # tar, or one bad response (an error page) would be kept for good
                failure = self._not_a_complete_tar(partial, url)
                if failure is not None:
                    bad = ("a complete tar", str(failure), "format")
            if bad is None:
                break
            self._emit("verify_fail", url, expected=bad[0], actual=bad[1])
            self._remove(partial)
            self._remove(partial + ".etag")
            repairs += 1
            if failure is None:
                failure = ChecksumMismatch(f"download of {url}", bad[0], bad[1], what=bad[2])
            budget.last_error = failure
            # a corrupt download was a failed attempt of the same budget
            if budget.exhausted or (self.max_repairs is not None and repairs > self.max_repairs):
                raise failure
            self._emit("repair", url, attempt=repairs)
        if shard.xxh3_64 is not None:
            self._emit("verify_ok", url)
        try:
            os.replace(partial, base)
        except OSError as exc:
            raise _cache_error(exc, self.shards_dir, "publish the download") from exc
        self._remove(partial + ".etag")
        self._write_meta(base, url, actual, synced=synced)
        # With sync="fsync" the data was fsynced before the rename; the
        # directory is not: after a power cut the newest entries may be
        # missing and are fetched again.
        self._evict()

    @staticmethod
    def _not_a_complete_tar(path: str, url: str, what: str = "download of") -> Optional[ShardFormatError]:
        from . import tario  # local: the framer is only needed for unchecksummed shards

        try:
            tario.scan_file(path, f"{what} {url}" if what else url)
        except ShardFormatError as exc:
            return exc
        except OSError as exc:
            raise _cache_error(exc, path, "read back the download") from exc
        return None

    # ---- eviction --------------------------------------------------------------------------
    def cached_bytes(self) -> int:
        """Bytes in the cache (entries and partial downloads)."""
        return sum(size for _, size, _, _ in self._scan())

    def _scan(self) -> List[Tuple[str, int, int, bool]]:
        """``(base, size, last_used_ns, is_partial)`` for entries and partials."""
        out = []
        try:
            names = os.listdir(self.shards_dir)
        except FileNotFoundError:
            return out
        except OSError as exc:
            raise _cache_error(exc, self.shards_dir, "list") from exc
        for name in names:
            partial = name.endswith(".partial")
            if not partial and name.endswith(_SIDE_SUFFIXES):
                continue
            path = os.path.join(self.shards_dir, name)
            try:
                st = os.lstat(path)
            except OSError:
                continue
            if not stat.S_ISREG(st.st_mode):
                continue
            base = path[: -len(".partial")] if partial else path
            out.append((base, st.st_size, max(st.st_atime_ns, st.st_mtime_ns) if partial else st.st_atime_ns,
                        partial))
        return out

    def _evict(self, reserve: int = 0, keep: Optional[set] = None) -> int:
        """Evict least recently used entries not in use (nor in ``keep``, a
        set of entry paths) until the cache plus ``reserve`` bytes fits
        ``cache_size``; return the bytes left."""
        if self.cache_size is None:
            return 0
        entries = self._scan()
        total = sum(e[1] for e in entries)
        if total + reserve <= self.cache_size:
            return total
        for base, size, _, partial in sorted(entries, key=lambda e: e[2]):
            if total + reserve <= self.cache_size:
                break
            if keep and base in keep:
                continue
            try:
                fd = os.open(base + ".lock", os.O_RDWR | os.O_CREAT | _NOFOLLOW, 0o666)
            except OSError:
                continue
            try:
                try:
                    fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                except OSError:
                    continue  # pinned by a reader or being downloaded
                # a partial download has no meta yet; its .etag sidecar may name the url
                url = self._url_of(base)
                if partial:
                    self._remove(base + ".partial")
                    self._remove(base + ".partial.etag")
                else:
                    self._remove(base + ".meta")
                    self._remove(base)
                total -= size
                self._emit("evict", url, bytes=size, path=base)
            finally:
                os.close(fd)
        return total

    def _evict_on_release(self) -> None:
        """A pin was released: what is no longer in use may go, except what
        prefetch fetched for later."""
        with self._pf_cond:
            keep = set(self._pf_keep)
        self._evict(keep=keep)

    def _url_of(self, base: str) -> str:
        try:
            meta = self._read_meta(base)
        except CacheError:
            meta = None
        # unknown (a partial download has no meta yet): events then carry only
        # the path, so the journal does not invent a shard row for a file name
        return meta["url"] if meta else ""

    # ---- prefetch --------------------------------------------------------------------------
    def prefetch(self, shards: Sequence[ShardInfo], depth: int = 2, window: int = 0) -> None:
        """Download the next ``depth`` remote shards in background threads.

        Up to ``prefetch_threads`` shards download at once, each over its own
        connection.  Replaces any earlier wish list; shards already cached or
        being downloaded are left out.  With a ``cache_size``, a shard is
        only prefetched when it fits in the budget (after evicting entries
        not in use); the reader fetches the others when it gets to them.
        Errors are swallowed here; they show up again, at once (the prefetch
        spent the shard's fetch budget), when the shard is acquired.

        Args:
            shards: the upcoming shards, in the order they will be read.
            depth: how many of them to fetch ahead.
            window: how many of the first ``shards`` are one shuffle window
                (read at the same time); if their sizes add up to more than
                ``cache_size``, a warning says so, once.
        """
        if window and self.cache_size is not None and not self._window_warned and _first_worker():
            head = list(shards[:window])
            need = sum(s.size or 0 for s in head)
            if need > self.cache_size:
                self._window_warned = True
                log.warning("cache_size %s (%d bytes) cannot hold one shuffle window: %d shards of %s "
                            "(%d bytes) are read at once; shards will be evicted and fetched again. Raise "
                            "--cache-size / RESUMEWDS_CACHE_SIZE or lower --shuffle-window",
                            _mb(self.cache_size), self.cache_size, len(head), _mb(need), need)
        wanted = [s for s in shards if is_remote_url(s.url)][: max(0, depth)]
        with self._pf_cond:
            self._pf_keep = {self.entry_path(s.url) for s in wanted}
            self._pf_queue = collections.deque(
                s for s in wanted if s.url not in self._pf_current and not self._looks_cached(s.url))
            if self._pf_queue:
                self._pf_stop = False
                self._pf_threads = [t for t in self._pf_threads if t.is_alive()]
                while len(self._pf_threads) < min(self.prefetch_threads, len(self._pf_queue)):
                    t = threading.Thread(target=self._pf_loop, name="resumewds-prefetch", daemon=True)
                    t.start()
                    self._pf_threads.append(t)
            self._pf_cond.notify_all()

    def _fits(self, shard: ShardInfo) -> bool:
        """Whether prefetching ``shard`` stays within ``cache_size``; if so,
        its size is reserved until :meth:`_unreserve` (prefetch threads
        running at once must not each count the same free space)."""
        if self.cache_size is None or self._looks_cached(shard.url):
            return True
        need = shard.size or 0
        with self._pf_fit:
            with self._pf_cond:
                keep = set(self._pf_keep)
            # make room from what was read, never from what prefetch fetched for later
            total = self._evict(reserve=need + sum(self._pf_reserved.values()), keep=keep)
            for base in self._pf_reserved:  # counted by their full size, not as partials
                for p in (base, base + ".partial"):
                    st = self._lstat(p)
                    total -= st.st_size if st is not None else 0
            used = total + sum(self._pf_reserved.values())
            if used + need > self.cache_size or (not need and used >= self.cache_size):
                return False
            self._pf_reserved[self.entry_path(shard.url)] = need
            return True

    def _unreserve(self, shard: ShardInfo) -> None:
        with self._pf_fit:
            self._pf_reserved.pop(self.entry_path(shard.url), None)

    def _looks_cached(self, url: str) -> bool:
        """A cheap hint (one stat): the entry has been published."""
        return self._lstat(self.entry_path(url) + ".meta") is not None

    def _pf_loop(self) -> None:
        try:
            self._pf_work()
        finally:
            s = getattr(self._tl, "session", None)  # this thread's pooled connections
            if s is not None:
                s.close()
                self._tl.session = None

    def _pf_work(self) -> None:
        while True:
            with self._pf_cond:
                while not self._pf_queue and not self._pf_stop:
                    self._pf_cond.wait()
                if self._pf_stop:
                    return
                shard = self._pf_queue.popleft()
                self._pf_current.add(shard.url)
            try:
                if self._fits(shard):
                    try:
                        self._acquire(shard, pin=False, reader=False)
                    finally:
                        self._unreserve(shard)
                else:
                    with self._mu:
                        self.counters["prefetch_over_budget"] += 1
            except Exception:
                with self._mu:
                    self.counters["prefetch_error"] += 1
            finally:
                with self._pf_cond:
                    self._pf_current.discard(shard.url)

    def close(self) -> None:
        """Stop the prefetch threads and drop this thread's HTTP session."""
        with self._pf_cond:
            self._pf_stop = True
            self._pf_queue.clear()
            self._pf_cond.notify_all()
            threads, self._pf_threads = self._pf_threads, []
        for t in threads:
            if t is not threading.current_thread():
                t.join(timeout=5)
        with self._pf_cond:
            self._pf_keep = set()
        if self.cache_size is not None:
            try:
                self._evict()  # nothing is wanted for later any more
            except ResumeWDSError:
                pass
        s = getattr(self._tl, "session", None)
        if s is not None:
            s.close()
            self._tl.session = None

    def __enter__(self) -> "ShardStore":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ---- CLI helpers -------------------------------------------------------------------------
    def verify_all(self, shards: Sequence[ShardInfo],
                   progress: Optional[ProgressFn] = None) -> List[Tuple[ShardInfo, bool, Optional[BaseException]]]:
        """Hash every shard now (policy "always"), for ``resumewds verify``.

        Local shards are hashed in place; remote shards are checked in the
        cache, and fetched (and repaired) when missing or corrupt.

        Args:
            shards: the manifest's shards.
            progress: called with the number of bytes hashed, as they are.

        Returns:
            ``[(shard, ok, error)]`` in input order; ``error`` is the
            ResumeWDSError (or None).
        """
        out: List[Tuple[ShardInfo, bool, Optional[BaseException]]] = []
        for s in shards:
            try:
                if is_remote_url(s.url):
                    ls = self._acquire(s, pin=False, policy="always", progress=progress)
                    if s.xxh3_64 is None:
                        # nothing to compare with: the cached copy must at least be a
                        # complete tar (one stored by an older version may be an error page)
                        bad = self._not_a_complete_tar(ls.path, s.url, what="cached copy of")
                        if bad is not None:
                            self._emit("verify_fail", s.url, expected="a complete tar", actual=str(bad))
                            self._remove(ls.path + ".meta")
                            self._remove(ls.path)
                            self._acquire(s, pin=False, policy="always", progress=progress)  # fetched again
                else:
                    self._check_local(s, "always", progress)
                out.append((s, True, None))
            except ResumeWDSError as exc:
                out.append((s, False, exc))
        return out

    def prefetch_all(self, shards: Sequence[ShardInfo], progress: Optional[ProgressFn] = None,
                     parallel: int = 2) -> List[Tuple[ShardInfo, bool, Optional[BaseException]]]:
        """Download every remote shard into the cache, for ``resumewds prefetch``.

        Local shards are skipped (reported ok).  With a ``cache_size`` smaller
        than the data set, early shards are evicted by later ones.

        Args:
            shards: the manifest's shards.
            progress: called with each shard's size once it is in the cache.
            parallel: shards in flight at once (threads; each has its own
                HTTP session).  Two keep the network busy while the other
                shard is fsynced and hashed.

        Returns:
            ``[(shard, ok, error)]`` in input order.
        """
        import concurrent.futures

        report_lock = threading.Lock()

        def one(s: ShardInfo) -> Tuple[ShardInfo, bool, Optional[BaseException]]:
            try:
                if is_remote_url(s.url):
                    path = self.ensure(s)
                    if progress is not None:
                        try:
                            size = os.path.getsize(path)
                        except OSError:
                            size = 0
                        with report_lock:
                            progress(size)
                return (s, True, None)
            except ResumeWDSError as exc:
                return (s, False, exc)

        if parallel <= 1 or len(shards) <= 1:
            return [one(s) for s in shards]
        with concurrent.futures.ThreadPoolExecutor(max_workers=parallel,
                                                   thread_name_prefix="resumewds-prefetch-all") as ex:
            return list(ex.map(one, shards))


__all__ = ["LocalShard", "SYNC_MODES", "ShardStore", "VERIFY_POLICIES", "default_cache_dir", "parse_size"]
