"""The store: a verified local file for each shard (fill, verify, repair, publish).

:class:`ShardStore` hands readers a :class:`~resumewds.cache._locks.LocalShard`:
local shards verified in place, remote entries looked at under their pin
lock and filled, repaired or adopted under their download lock.  Prefetch,
bulk and repair see only its protocol, :class:`resumewds.cache._storeapi.StoreAPI`.

A reader never upgrades its pin: an upgrade waits for every other reader's
pin, and a reader that pins a shard and then idles would block it forever.
"""

from __future__ import annotations

import collections
import fcntl
import os
import stat
import sys
import threading
import time
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Sequence, Set, Tuple, Union

from .. import config as _config
from ..errors import (
    CacheError,
    ChecksumMismatch,
    CorruptSample,
    PermanentFetchError,
    ResumeWDSError,
    TransientFetchError,
    UnsafeSourceError,
)
from ..events import EventKind as K
from ..fetch import FetchConfig, boot_id, is_local_url, is_remote_url
from ..manifest import ShardInfo
from ..redact import redact_url
from ..tar import kind_of
from . import _eviction as eviction
from . import _layout as layout
from . import _local as local
from ._layout import EntryState, ProgressFn, cache_error, not_a_complete_tar
from ._locks import LocalShard, lock_download
from ._samplecheck import check_copy

if TYPE_CHECKING:
    from ..fetch import FetchBudget
    from ._prefetch import Prefetcher

EventFn = Callable[..., None]

VERIFY_POLICIES = ("once", "always", "never")
SYNC_MODES = ("auto", "fsync", "boot")
#: the kinds ``RESUMEWDS_VERBOSE_CACHE`` prints
VERBOSE_KINDS = (K.CACHE_MISS, K.FETCH_DONE, K.REPAIR, K.VERIFY_FAIL, K.EVICT)


def _from_manifest(shard: ShardInfo) -> str:
    """`` (index from <manifest>)`` when the shard's index came from a manifest, else ""."""
    where = getattr(shard, "index_source", None)
    return f" (index from {where})" if where else ""


def default_cache_dir() -> str:
    """``$RESUMEWDS_CACHE_DIR``, else ``$WDS_CACHE``, else ``$XDG_CACHE_HOME/resumewds``,
    else ``~/.cache/resumewds`` (see :func:`resumewds.config.cache_dir`)."""
    return _config.cache_dir()


class _Runtime:
    """A store's state that belongs to one process: what threads and forks must not share."""

    def __init__(self, store: ShardStore):
        self.pid = os.getpid()
        self.tl = threading.local()
        self.mu = threading.Lock()
        self.prefetch: Optional[Prefetcher] = None  # made by the first remote shard's download
        self.dirs_ready = False
        self.budgets: Dict[str, FetchBudget] = {}
        self.validators: Dict[str, Any] = {}  # url -> (first validator seen, (old, new) once it changed)


class ShardStore:
    """Give readers a verified local file for each shard.

    Args:
        cache_dir: where remote shards are kept (see :func:`default_cache_dir`).
        cache_size: byte budget (int or "20GB"); default ``$RESUMEWDS_CACHE_SIZE``
            (or ``$WDS_CACHE_SIZE``), else unlimited.  Only shards being read may exceed it.
        verify: "once", "always" or "never"; sync: "auto" (default, or
            ``$RESUMEWDS_CACHE_SYNC``), "fsync" or "boot" (see :mod:`resumewds.cache`).
        fetch: retry/timeout policy; default ``FetchConfig.from_env()``.
        on_event: ``on_event(kind, url, **detail)``, kind an :class:`~resumewds.events.EventKind`.
        max_repairs: an extra cap on how many failed verifications of one shard are
            fetched again before ChecksumMismatch; None: only the fetch budget decides.
        prefetch_threads: shards :meth:`prefetch` downloads at once; None: 4 for a
            shuffled window of several shards, else 2.

    Attributes:
        counters: events seen by kind, plus ``bytes_fetched`` and ``bytes_evicted``.

    Example:
        >>> from resumewds import load_manifest
        >>> store = ShardStore(cache_size="1GB")
        >>> shard = load_manifest("data/manifest.json").shards[0]
        >>> with store.acquire(shard) as ls:
        ...     ls.path.endswith("shard-000000.tar"), ls.cached
        (True, False)
        >>> store.cache_size, store.counters["verify_ok"]
        (1000000000, 1)
    """

    def __init__(self, cache_dir: Optional[str] = None, cache_size: Union[int, str, None] = None,
                 verify: str = "once", fetch: Optional[FetchConfig] = None,
                 on_event: Optional[EventFn] = None, max_repairs: Optional[int] = None,
                 sync: Optional[str] = None, prefetch_threads: Optional[int] = None):
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
        if prefetch_threads is not None and prefetch_threads < 1:
            raise ValueError(f"prefetch_threads must be >= 1, got {prefetch_threads}")
        self.prefetch_threads: Optional[int] = None if prefetch_threads is None else int(prefetch_threads)
        self.counters: Dict[str, int] = collections.Counter()
        self._verified_local: Set[str] = set()
        self._rt: Optional[_Runtime] = None

    # ---- runtime state: this process's own (threads, locks, connections) ------------------
    def _runtime(self) -> _Runtime:
        """This process's threads, locks, sessions and budgets: made again in a forked child or after an unpickle."""
        rt = self._rt
        if rt is None or rt.pid != os.getpid():
            rt = self._rt = _Runtime(self)
        return rt

    @property
    def _tl(self) -> threading.local:
        return self._runtime().tl

    @property
    def _mu(self) -> Any:
        return self._runtime().mu

    @property
    def _prefetch(self) -> Prefetcher:
        rt = self._runtime()
        if rt.prefetch is None:
            from ._prefetch import Prefetcher  # lazy: background downloads, for remote shards only

            with rt.mu:
                if rt.prefetch is None:
                    rt.prefetch = Prefetcher(self)
        return rt.prefetch

    @property
    def _budgets(self) -> Dict[str, FetchBudget]:
        return self._runtime().budgets

    def __getstate__(self) -> Dict[str, Any]:
        d = dict(self.__dict__)
        d["_rt"] = None
        d["counters"] = collections.Counter()
        return d

    # ---- events -----------------------------------------------------------------------------
    def emit(self, kind: str, url: str, **detail: Any) -> None:
        """Count an event, print it under ``RESUMEWDS_VERBOSE_CACHE``, pass it to ``on_event``."""
        if getattr(self._tl, "prefetching", False):
            detail = dict(detail, prefetch=True)  # a background download's (stats tells them apart)
        key = str(kind)  # counters are keyed by the plain string
        with self._mu:
            self.counters[key] += 1
            if key == K.FETCH_DONE:
                self.counters["bytes_fetched"] += int(detail.get("bytes", 0))
            elif key == K.EVICT:
                self.counters["bytes_evicted"] += int(detail.get("bytes", 0))
        if self.verbose_cache and key in VERBOSE_KINDS:
            print(f"[cache] {key} {redact_url(url) if url else detail.get('path', '')}"
                  + (f" ({detail['bytes']} bytes)" if "bytes" in detail else ""), file=sys.stderr, flush=True)
        if self.on_event is not None:
            self.on_event(kind, url, **detail)

    def count(self, name: str) -> None:
        """Add one to ``counters[name]`` (no event)."""
        with self._mu:
            self.counters[name] += 1

    # ---- the fetch budget of one read of one shard ------------------------------------------
    def budget_for(self, url: str) -> FetchBudget:
        """The budget this read of ``url`` draws from: this process's prefetch's (or a concurrent
        reader's) if it is live or failed recently, else a fresh one."""
        with self._mu:
            b = self._budgets.get(url)
            now = time.monotonic()
            if b is None or (b.done_at is not None and now - b.done_at > self.fetch.deadline):
                b = self._budgets[url] = self._fresh_budget(url)
            return b

    def _fresh_budget(self, url: str) -> FetchBudget:
        """A new budget for ``url`` that remembers the validators this process saw of it."""
        from ..fetch import FetchBudget  # lazy: the retry machinery, for remote shards only

        b = FetchBudget(self.fetch)
        b.validator, b.changed = self._runtime().validators.get(url, (None, None))
        return b

    def budget_done(self, url: str, budget: FetchBudget, ok: bool, reader: bool) -> None:
        """A success, or a failure a reader saw, ends the budget; a prefetch's failure keeps it for the reader."""
        with self._mu:
            if budget.validator is not None:
                self._runtime().validators[url] = (budget.validator, budget.changed)
            if ok or reader:
                if self._budgets.get(url) is budget:
                    del self._budgets[url]
            else:
                budget.done_at = time.monotonic()

    def session(self) -> Any:
        """This thread's HTTP session (a :class:`~resumewds.fetch.Session`, made on first use)."""
        s = getattr(self._tl, "session", None)
        if s is None:
            from ..fetch import new_session  # lazy: the http client's modules, with the first remote shard

            s = self._tl.session = new_session()
        return s

    def in_background(self) -> None:
        """The calling thread is a prefetch thread: its events carry ``prefetch=True``."""
        self._tl.prefetching = True

    def close_session(self) -> None:
        """Close this thread's HTTP session (its pooled connections)."""
        s = getattr(self._tl, "session", None)
        if s is not None:
            s.close()
            self._tl.session = None

    # ---- the entries ------------------------------------------------------------------------
    @property
    def shards_dir(self) -> str:
        return os.path.join(self.cache_dir, "shards")

    def entry_path(self, url: str) -> str:
        """Where the cached copy of ``url`` lives (whether or not it exists)."""
        return layout.entry_path(self.shards_dir, url)

    def ensure_dirs(self) -> None:
        """Create the cache directory and its ``shards/`` (mode 0700) once per store; a CacheError if unusable."""
        rt = self._runtime()
        if rt.dirs_ready:
            return
        for d in (self.cache_dir, self.shards_dir):
            try:
                os.makedirs(d, mode=0o700, exist_ok=True)  # private: shards of signed URLs
            except OSError as exc:
                raise cache_error(exc, self.cache_dir, "create the cache directory") from exc
        try:
            st = os.lstat(self.shards_dir)
        except OSError as exc:
            raise cache_error(exc, self.shards_dir, "stat") from exc
        if stat.S_ISLNK(st.st_mode):
            raise CacheError(f"{self.shards_dir}: is a symlink; refusing to use it as the shard cache")
        if not os.access(self.shards_dir, os.W_OK | os.X_OK):
            raise CacheError(f"{self.shards_dir}: cache directory is not writable (read-only?)")
        rt.dirs_ready = True

    _ensure_dirs = ensure_dirs

    def _make_durable(self, path: str) -> bool:
        """fsync ``path`` if this store syncs; True if it did (see ``sync``)."""
        if self.sync != "fsync":
            return False
        layout.fsync_file(path)
        return True

    def _hash(self, path: str, progress: Optional[ProgressFn] = None) -> Tuple[int, str]:
        return layout.hash_file(path, progress)

    def _read_meta(self, base: str) -> Optional[Dict[str, Any]]:
        return layout.read_meta(base)

    def write_meta(self, base: str, url: str, xxh3_64: Optional[str], synced: bool) -> None:
        """Publish the meta that makes the file ``base`` the verified entry of ``url``."""
        layout.write_meta(base, url, xxh3_64, synced)

    _write_meta = write_meta  # the name it had before it was public

    # ---- public API -------------------------------------------------------------------------
    def acquire(self, shard: ShardInfo) -> LocalShard:
        """A verified local file for ``shard``, pinned until closed (a context manager).

        Raises:
            PermanentFetchError / TransientFetchError: it could not be fetched.
            ChecksumMismatch: a local file is corrupt, or downloads stayed corrupt
                until the fetch budget was spent.
            ShardFormatError: a shard with no known checksum kept arriving as
                something that is not a complete tar.
            CacheError: the cache directory is unusable.
        """
        lease = self._acquire(shard, pin=True)
        if kind_of(lease.path) is None:
            return lease  # a plain tar
        from ..tar import open_view  # lazy: compressed shards only

        return open_view(self, lease)  # .tar.gz/.tar.zst: its decompressed copy

    def ensure(self, shard: ShardInfo, tar: bool = True, *, policy: Optional[str] = None,
               progress: Optional[ProgressFn] = None, reader: bool = True) -> str:
        """Like :meth:`acquire` but unpinned; returns the path.

        Args:
            tar: a tar shard (checked to be a complete tar when its checksum is
                unknown); False for other files (an offsets file).
            policy: the verify policy of this call; None: the store's ``verify``.
            progress: called with the number of bytes hashed or fetched.
            reader: False for a prefetch: its failure is kept for the reader to meet.
        """
        ls = self._acquire(shard, pin=False, policy=policy, progress=progress, tar=tar, reader=reader)
        return ls.path

    def check_local(self, shard: ShardInfo, policy: str = "always", progress: Optional[ProgressFn] = None) -> str:
        """Verify the local shard in place under ``policy``; returns its path.

        Raises:
            ShardNotFoundError / PermanentFetchError: it cannot be read.
            ChecksumMismatch: its size, checksum or a sample digest is wrong.
            ShardFormatError: the manifest lists fewer samples than it holds.
        """
        return self._check_local(shard, policy, progress)

    def _acquire(self, shard: ShardInfo, pin: bool, policy: Optional[str] = None,
                 progress: Optional[ProgressFn] = None, tar: bool = True, reader: bool = True) -> LocalShard:
        policy = policy or self.verify
        if not is_remote_url(shard.url):
            if not is_local_url(shard.url):
                raise PermanentFetchError(f"{shard.url}: unsupported URL scheme", shard.url)
            return LocalShard(self._check_local(shard, policy, progress), shard)
        if shard.url.startswith("pipe:") and not shard.trusted:
            raise UnsafeSourceError(f"{shard.url}: refusing to run a pipe: command from an untrusted manifest")
        budget = self.budget_for(shard.url)
        ok = False
        try:
            ls = self._acquire_remote(shard, pin, policy, progress, budget, tar)
            ok = True
            return ls
        finally:
            self.budget_done(shard.url, budget, ok, reader)

    def acquire_sampled(self, shard: ShardInfo) -> Tuple[LocalShard, Optional[str]]:
        """Like :meth:`acquire`, for a reader: a local shard with sample digests is opened unhashed.

        The second item is then its mark's key: the reader checks each sample until
        :meth:`verified_key` says the background check verified the file whole
        (None: read it as :meth:`acquire` gives it).

        Example:
            >>> lease, key = store.acquire_sampled(shard)              # doctest: +SKIP
        """
        if is_remote_url(shard.url) or not is_local_url(shard.url) or not local.sampled(shard, self.verify):
            return self.acquire(shard), None
        path, key = local.open_sampled(shard, self.verify, self.cache_dir, self._verified_local, self.emit)
        if key is not None and self.verify == "once":
            local.verify_later(shard, key, self.cache_dir, self._verified_local)
        return LocalShard(path, shard), key

    def verified_key(self, key: str) -> bool:
        """Whether this process verified the local file of mark ``key`` whole (:meth:`acquire_sampled`)."""
        return key in self._verified_local

    # ---- local shards (resumewds.cache) ----------------------------------------------
    def _check_local(self, shard: ShardInfo, policy: str, progress: Optional[ProgressFn]) -> str:
        return local.check_local(shard, policy, progress, self.cache_dir, self._verified_local, self.emit)

    # ---- remote shards ----------------------------------------------------------------------
    def _check_entry(self, shard: ShardInfo, base: str, policy: str, progress: Optional[ProgressFn],
                     known_bad: Optional[Tuple[int, int]] = None) -> Tuple[EntryState, Optional[Tuple[int, int]]]:
        """Classify the cached entry: ``(EntryState, (size, mtime_ns) or None)``; safe under a shared lock."""
        st = layout.lstat(base)
        if st is None:
            return EntryState.ABSENT, None
        skey = (st.st_size, st.st_mtime_ns)
        if known_bad == skey:
            return EntryState.CORRUPT, skey
        meta = self._read_meta(base)
        if meta is None or not layout.names(meta, shard.url):
            return EntryState.UNTRUSTED, skey
        if shard.size is not None and st.st_size != shard.size:
            self.emit(K.VERIFY_FAIL, shard.url, expected=str(shard.size), actual=str(st.st_size))
            return EntryState.CORRUPT, skey
        expected = (shard.xxh3_64 or meta.get("xxh3_64") or "").lower() or None
        # written without fsync in an earlier boot: the crash that ended that
        # boot may have eaten bytes, whatever the policy says
        stale = meta.get("synced", True) is not True and meta.get("boot") != boot_id()
        # another file, or rewritten in place, since the meta was written (None: an older meta)
        moved = None if policy == "never" and not stale else layout.moved(st, meta)
        if (stale or moved) and expected is None:
            return EntryState.UNTRUSTED, skey  # nothing to check it against: fetch it again
        if policy == "never" and not stale:
            return EntryState.VERIFIED, skey
        changed = (stale or moved is not False or (st.st_size, st.st_mtime_ns) != (meta["size"], meta["mtime_ns"])
                   or (shard.xxh3_64 is not None and (meta.get("xxh3_64") or "").lower() != expected))
        if expected is None or not (changed or policy == "always"):
            return EntryState.VERIFIED, skey
        try:
            _, actual = self._hash(base, progress)
        except CacheError as exc:
            if isinstance(exc.__cause__, FileNotFoundError):
                # removed meanwhile by another process repairing it (repairs
                # hold the download lock, not our pin): look again under the
                # download lock, where the repair is finished
                return EntryState.ABSENT, None
            raise
        if actual != expected:
            self.emit(K.VERIFY_FAIL, shard.url, expected=expected, actual=actual)
            return EntryState.CORRUPT, skey
        check_copy(base, shard, self.emit)  # the manifest's samples: where they end, their digests
        self.emit(K.VERIFY_OK, shard.url)
        if changed:
            # read back from disk after a reboot: those bytes are durable now
            self.write_meta(base, shard.url, expected, synced=stale or meta.get("synced", True) is True)
        return EntryState.VERIFIED, skey

    def _acquire_remote(self, shard: ShardInfo, pin: bool, policy: str, progress: Optional[ProgressFn],
                        budget: FetchBudget, tar: bool) -> LocalShard:
        self._ensure_dirs()
        base = self.entry_path(shard.url)
        # the pin lock, shared (see the module docstring); the download lock only to fill
        fd = layout.open_file(base + ".lock", os.O_RDWR | os.O_CREAT, "open lock file")
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
            before = layout.signature(base)
            state, skey = self._check_entry(shard, base, policy, progress)
            if state is EntryState.VERIFIED:
                self.emit(K.CACHE_HIT, shard.url)
            else:
                dl = layout.open_file(base + ".dl", os.O_RDWR | os.O_CREAT, "open download lock")
                try:
                    lock_download(dl, shard.url, budget, base)
                    # another process may have filled (or repaired) it meanwhile
                    if layout.signature(base) != before:
                        state, skey = self._check_entry(shard, base, policy, progress)
                    if state is EntryState.VERIFIED:
                        self.emit(K.CACHE_HIT, shard.url)
                    else:
                        self._fill(shard, base, policy, progress, skey if state is EntryState.CORRUPT else None,
                                   budget, tar)
                finally:
                    os.close(dl)  # drops the download lock
            layout.touch(base)
            if pin:
                self._prefetch.read_now(base)  # read now: no longer kept for later
                return LocalShard(base, shard, fd, cached=True,
                                  on_release=self._evict_on_release if self.cache_size is not None else None)
            os.close(fd)
            return LocalShard(base, shard, None, cached=True)
        except BaseException:
            os.close(fd)
            raise

    def _fill(self, shard: ShardInfo, base: str, policy: str, progress: Optional[ProgressFn],
              known_bad: Optional[Tuple[int, int]], budget: Optional[FetchBudget] = None,
              tar: bool = True) -> None:
        """Under the download lock: make ``base`` a verified entry.

        The entry there is kept, adopted (a known checksum proves it) or repaired;
        otherwise the shard is downloaded, checked and published, asked again after
        a corrupt download while the budget allows.
        """
        from ..fetch import FetchBudget  # lazy: the download path, for remote shards only
        from ..fetch._errormap import _SinkError  # lazy: (the same)
        from ..fetch._partial import _write_validator  # lazy: (the same)
        from . import _sparse as sparse  # lazy: (the same)

        budget = budget or FetchBudget(self.fetch)
        sparse.drop_stale(base)  # a map left by a kill after its sparse file was published
        repaired = self._keep_entry(shard, base, policy, progress, known_bad, budget)
        if repaired is None:
            return
        self.emit(K.CACHE_MISS, shard.url)
        streamed = base + ".partial"
        limit = self.fetch.attempts if self.max_repairs is None else self.max_repairs + 1
        repairs = repaired
        while True:
            res, budget = self._download(shard, base, streamed, budget)
            partial = res.path
            synced = self._make_durable(partial)
            if progress is not None:
                progress(res.size)
            actual, failure = self._judge(shard, res, budget, tar)
            if failure is None:
                break
            if partial == streamed:
                layout.remove(partial)
                layout.remove(partial + ".etag")
            else:
                sparse.discard(base)
                sparse.stream_instead(shard.url)  # checked samples that still make a wrong file: a whole GET next
            if budget.changed is not None:
                # the version first seen stays in the sidecar, without a partial: the next reader
                # of the shard (another process) learns that the object changed (see _download)
                try:
                    _write_validator(streamed, budget.validator)
                except _SinkError:
                    pass  # only that reader's word "changed" is lost
            repairs += 1
            budget.fault(failure)
            # a corrupt download is a fault without progress: the server is asked again,
            # ``attempts`` times in all (``max_repairs`` + 1 with a cap of the store's own),
            # unless the object changed on the server (its old bytes are not served any more)
            if repairs >= limit or budget.remaining() <= 0 or budget.changed is not None:
                raise failure
            self.emit(K.REPAIR, shard.url, attempt=repairs)
        self._publish(shard, base, partial, streamed, actual, synced)

    def _keep_entry(self, shard: ShardInfo, base: str, policy: str, progress: Optional[ProgressFn],
                    known_bad: Optional[Tuple[int, int]], budget: FetchBudget) -> Optional[int]:
        """None when the entry is kept (verified, adopted or repaired in place); else it is removed
        and the repairs spent on it are returned (0 or 1)."""
        url = shard.url
        state, _ = self._check_entry(shard, base, policy, progress, known_bad)
        if state is EntryState.VERIFIED:
            self.emit(K.CACHE_HIT, url)
            return None
        if state is EntryState.UNTRUSTED:
            # killed between publish and meta: adopt it if a known checksum proves it
            if shard.xxh3_64 is not None:
                size, actual = self._hash(base, progress)
                if actual == shard.xxh3_64.lower() and (shard.size is None or size == shard.size):
                    self.emit(K.VERIFY_OK, url)
                    self.write_meta(base, url, actual, synced=self._make_durable(base))
                    self.emit(K.CACHE_HIT, url)
                    return None
            layout.remove(base)
            return 0
        if state is not EntryState.CORRUPT:
            return 0
        from ._repair import repair_entry  # lazy: a remote entry's repair, never a local read's

        if (self.max_repairs is None or self.max_repairs >= 1) and \
                repair_entry(self, shard, base, budget):  # re-fetch only the samples that fail
            self.emit(K.CACHE_HIT, url)
            return None
        layout.remove(base + ".meta")
        layout.remove(base)
        if self.max_repairs is not None and self.max_repairs < 1:
            raise ChecksumMismatch(f"cached copy of {url} ({base})", shard.xxh3_64 or str(shard.size),
                                   "a corrupt cached copy")
        self.emit(K.REPAIR, url, attempt=1)
        return 1

    def _download(self, shard: ShardInfo, base: str, streamed: str, budget: FetchBudget) -> Tuple[Any, FetchBudget]:
        """One download: a sparse partial filled sample by sample, or streamed whole to ``streamed``
        (no Range, ranges corrupt, or a stream started already); the result and the budget next drawn from."""
        from ..fetch import FetchBudget, fetch_to_file  # lazy: the download path, for remote shards only
        from ..fetch._partial import _read_validator  # lazy: (the same)
        from . import _sparse as sparse  # lazy: (the same)

        if layout.lstat(streamed) is None:
            budget.saw(_read_validator(streamed))  # what an earlier read of it saw first, if it changed since
            layout.remove(streamed + ".etag")
        # the download is about to add up to shard.size bytes: make room first
        self.evict(reserve=shard.size or 0)
        res = None
        if sparse.eligible(self, shard) and layout.lstat(streamed) is None:
            try:
                res = sparse.fill(self, shard, base, budget)  # (None: streamed instead)
            except TransientFetchError as exc:
                if not (isinstance(budget.last_error, CorruptSample) or exc.status == 206):
                    raise  # (a server that does not answer, or stalls: a whole GET would meet it too)
                # its ranges keep arriving corrupt or cut short: a whole GET (resumed where a
                # cut leaves it), with attempts of its own
                sparse.stream_instead(shard.url)
                self.emit(K.RETRY, shard.url, attempt=0, error=str(exc), wait=0.0)
                old, budget = budget, FetchBudget(self.fetch)
                budget.validator, budget.changed = old.validator, old.changed
        if res is None:
            # hashed from the bytes as they were written: no read-back
            res = fetch_to_file(shard.url, streamed, expected_size=shard.size, config=self.fetch,
                                on_event=self.emit, session=self.session(), budget=budget)
        return res, budget

    def _judge(self, shard: ShardInfo, res: Any, budget: FetchBudget, tar: bool
               ) -> Tuple[str, Optional[ResumeWDSError]]:
        """A finished download against the manifest: ``(xxh3_64, None)`` when it holds (bad samples
        repaired first), else ``(xxh3_64, the error)`` after a ``verify_fail`` event."""
        url = shard.url
        bad: Optional[Tuple[str, str, str]] = None
        failure: Optional[ResumeWDSError] = None
        actual = res.xxh3_64
        if shard.size is not None and res.size != shard.size:
            bad = (str(shard.size), str(res.size), "size")
        elif shard.xxh3_64 is not None and actual != shard.xxh3_64.lower():
            bad = (shard.xxh3_64, actual, "xxh3_64")
            from ._repair import repair_download  # lazy: a remote download's repair, never a local read's

            fixed = repair_download(self, shard, res.path, budget)
            if fixed is not None:
                actual, bad = fixed, None
        elif shard.xxh3_64 is None and tar:
            # nothing to check it against: at least it must be a complete
            # tar, or one bad response (an error page) would be kept for good
            failure = not_a_complete_tar(res.path, url)
            if failure is not None:
                bad = ("a complete tar", str(failure), "format")
        if bad is None:
            return actual, None
        self.emit(K.VERIFY_FAIL, url, expected=bad[0], actual=bad[1])
        if failure is None and budget.changed is not None:
            failure = ChecksumMismatch(f"{url}: the object changed on the server while it was read, and "
                                       f"its bytes no longer match the manifest{_from_manifest(shard)}: "
                                       f"{bad[2]} {bad[1]}, expected {bad[0]}{budget.changed_note()}",
                                       url=url, expected=bad[0], actual=bad[1], what=bad[2])
        elif failure is None:
            failure = ChecksumMismatch(f"download of {url}{_from_manifest(shard)}", bad[0], bad[1], what=bad[2])
        return actual, failure

    def _publish(self, shard: ShardInfo, base: str, partial: str, streamed: str, actual: str, synced: bool) -> None:
        """A download that holds becomes the entry: its samples checked, renamed, its meta written."""
        from . import _sparse as sparse  # lazy: sparse partials fill remote shards only

        url = shard.url
        if shard.xxh3_64 is not None:
            try:
                check_copy(partial, shard, self.emit, discard=True)
            except ResumeWDSError:
                if partial != streamed:
                    sparse.discard(base)
                raise
            self.emit(K.VERIFY_OK, url)
        if partial != streamed:
            sparse.publish(base)  # no ranged write lands in the published entry
        else:
            try:
                os.replace(partial, base)
            except OSError as exc:
                raise cache_error(exc, self.shards_dir, "publish the download") from exc
            layout.remove(partial + ".etag")
        self.write_meta(base, url, actual, synced=synced)
        # With sync="fsync" the data was fsynced before the rename; the directory is not:
        # after a power cut the newest entries may be missing and are fetched again.
        self.evict()

    # ---- eviction (resumewds.cache) ------------------------------------------------
    def cached_bytes(self) -> int:
        """Bytes in the cache (entries, partial downloads and decompressed copies)."""
        return eviction.cached_bytes(self.shards_dir)

    @property
    def copies_dir(self) -> str:
        """Where decompressed copies of compressed shards live (counted in ``cache_size``)."""
        return eviction.copies_dir(self.shards_dir)

    def make_room(self, nbytes: int) -> None:
        """Evict what is not in use until ``nbytes`` more fit in ``cache_size`` (no-op without one)."""
        self.evict(reserve=max(0, int(nbytes)))

    def evict(self, reserve: int = 0, keep: Optional[Set[str]] = None,
               reserved: Optional[Set[str]] = None) -> int:
        """Evict least recently used entries until the cache plus ``reserve`` fits ``cache_size``."""
        return eviction.evict(self.shards_dir, self.cache_size, self.emit, reserve, keep, reserved)

    _evict = evict  # the name it had before it was public

    def _evict_on_release(self) -> None:
        """A pin was released: what is not in use may go, except what prefetch fetched for later."""
        pf = self._runtime().prefetch
        self.evict(keep=pf.kept() if pf is not None else None)

    # ---- prefetch (resumewds.cache) ------------------------------------------------
    def prefetch(self, shards: Sequence[ShardInfo], depth: int = 2, window: int = 0) -> None:
        """Download the next ``depth`` remote shards in background threads.

        Replaces any earlier wish list.  With a ``cache_size``, a shard is prefetched
        only when it fits (after evicting entries not in use).  Errors show up when
        the shard is acquired (the prefetch spent its fetch budget).

        Args:
            shards: the upcoming shards, in the order they will be read.
            depth: how many of them to fetch ahead.
            window: how many of the first ``shards`` are one shuffle window; if they
                add up to more than ``cache_size``, a warning says so, once.
        """
        if self._runtime().prefetch is None and (not window or self.cache_size is None) \
                and not any(is_remote_url(s.url) for s in shards):
            return  # nothing to download, no wish list to replace (local shards are read in place)
        self._prefetch.schedule(shards, depth, window)

    def close(self) -> None:
        """Stop the prefetch threads and drop this thread's HTTP session."""
        pf = self._runtime().prefetch
        if pf is not None:
            pf.stop()
        if self.cache_size is not None:
            try:
                self.evict()  # nothing is wanted for later any more
            except ResumeWDSError:
                pass
        self.close_session()

    def __enter__(self) -> ShardStore:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    # ---- the CLI's bulk passes (resumewds.cache) ---------------------------------------
    def verify_all(self, shards: Sequence[ShardInfo],
                   progress: Optional[ProgressFn] = None) -> List[Tuple[ShardInfo, bool, Optional[BaseException]]]:
        """Hash every shard now (policy "always"), for ``resumewds verify``."""
        from ._bulk import verify_all  # lazy: the CLI's pass, never a data set's

        return verify_all(self, shards, progress)

    def prefetch_all(self, shards: Sequence[ShardInfo], progress: Optional[ProgressFn] = None,
                     parallel: int = 2) -> List[Tuple[ShardInfo, bool, Optional[BaseException]]]:
        """Download every remote shard into the cache, for ``resumewds prefetch``."""
        from ._bulk import prefetch_all  # lazy: the CLI's pass, never a data set's

        return prefetch_all(self, shards, progress, parallel)

