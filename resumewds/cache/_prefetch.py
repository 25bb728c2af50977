"""Prefetch: download the next shards in background threads, within ``cache_size``.

One :class:`Prefetcher` per store and process.  Its threads (named
``resumewds-prefetch``) acquire the wish list's shards unpinned through the
store, as a reader would; a failure is kept for the reader to meet at once.
With a ``cache_size``, a shard is prefetched only when it fits: its size is
reserved while it downloads, and room is made only from what was read,
never from what prefetch fetched for later (``keep``).
"""

from __future__ import annotations

import collections
import logging
import sys
import threading
from typing import Deque, Dict, List, Sequence, Set

from ..fetch import is_remote_url
from ..manifest import ShardInfo
from . import _layout as layout
from ._storeapi import StoreAPI

#: ``prefetch_threads=None``: downloads at once for an order that reads one shard after the
#: other: the shard read next must not share its bandwidth (in order and unthrottled,
#: bench/bench_fetch.py, 4 threads gave 2.4x webdataset's cold throughput against 3.0x with 2)
PREFETCH_THREADS = 2
#: ... and for a shuffled window, read all at once: over a per-connection rate limit, cold
#: throughput grows with the connections (8 shards of 32 MB: 4.2-4.4x webdataset's against
#: 2.3-3.2x with 2; bench/bench_firstbatch.py) and ranged reads fetch half as many bytes
WINDOW_PREFETCH_THREADS = 4

log = logging.getLogger("resumewds.cache")

THREAD_NAME = "resumewds-prefetch"  # (for a reader of stack dumps)


def _mb(n: int) -> str:
    return f"{n / 1e6:.1f} MB"


def first_worker() -> bool:
    """False in a DataLoader worker other than worker 0 (a warning is given once); imports no torch."""
    data = sys.modules.get("torch.utils.data")
    get = getattr(data, "get_worker_info", None)
    if get is None:
        return True
    try:
        info = get()
    except Exception:  # a torch we do not know: warn
        return True
    return info is None or getattr(info, "id", 0) == 0


class Prefetcher:
    """The wish list, the threads and the reservations of one store.

    Attributes:
        cond: guards ``queue``, ``current``, ``keep`` and ``stopping``.
        current: URLs a prefetch thread is fetching now.
        keep: entry paths fetched (or being fetched) for later: not evicted until read.
    """

    def __init__(self, store: StoreAPI):
        self.store = store
        self.cond = threading.Condition()
        self.queue: Deque[ShardInfo] = collections.deque()
        self.current: Set[str] = set()
        self.keep: Set[str] = set()
        self.threads: List[threading.Thread] = []
        self.stopping = False
        self.window_warned = False
        self._fit = threading.Lock()
        self._reserved: Dict[str, int] = {}

    def schedule(self, shards: Sequence[ShardInfo], depth: int, window: int) -> None:
        """See :meth:`resumewds.cache.ShardStore.prefetch`."""
        store = self.store
        if window and store.cache_size is not None and not self.window_warned and first_worker():
            head = list(shards[:window])
            need = sum(s.size or 0 for s in head)
            if need > store.cache_size:
                self.window_warned = True
                log.warning("cache_size %s (%d bytes) cannot hold one shuffle window: %d shards of %s "
                            "(%d bytes) are read at once; shards will be evicted and fetched again. Raise "
                            "--cache-size / RESUMEWDS_CACHE_SIZE or lower --shuffle-window",
                            _mb(store.cache_size), store.cache_size, len(head), _mb(need), need)
        wanted = [s for s in shards if is_remote_url(s.url)][: max(0, depth)]
        with self.cond:
            self.keep = {store.entry_path(s.url) for s in wanted}
            self.queue = collections.deque(
                s for s in wanted if s.url not in self.current and not self.looks_cached(s.url))
            if self.queue:
                self.stopping = False
                self.threads = [t for t in self.threads if t.is_alive()]
                while len(self.threads) < min(self.threads_for(window), len(self.queue)):
                    t = threading.Thread(target=self._loop, name=THREAD_NAME, daemon=True)
                    t.start()
                    self.threads.append(t)
            self.cond.notify_all()

    def threads_for(self, window: int) -> int:
        """Downloads at once: ``prefetch_threads``, else by whether a shuffled window is read at once."""
        n = self.store.prefetch_threads
        if n is None:
            n = WINDOW_PREFETCH_THREADS if window > 1 else PREFETCH_THREADS
        return n

    def read_now(self, base: str) -> None:
        """A reader pinned ``base``: it is no longer kept for later."""
        with self.cond:
            self.keep.discard(base)

    def kept(self) -> Set[str]:
        """A copy of the entry paths kept for later."""
        with self.cond:
            return set(self.keep)

    def stop(self) -> None:
        """Stop the threads (waiting up to 5 s for each) and forget the wish list."""
        with self.cond:
            self.stopping = True
            self.queue.clear()
            self.cond.notify_all()
            threads, self.threads = self.threads, []
        for t in threads:
            if t is not threading.current_thread():
                t.join(timeout=5)
        with self.cond:
            self.keep = set()

    def looks_cached(self, url: str) -> bool:
        """A cheap hint (one stat): the entry has been published."""
        return layout.lstat(self.store.entry_path(url) + ".meta") is not None

    def fits(self, shard: ShardInfo) -> bool:
        """Whether prefetching ``shard`` stays within ``cache_size``; if so, its size is reserved
        until :meth:`unreserve`."""
        store = self.store
        if store.cache_size is None or self.looks_cached(shard.url):
            return True
        need = shard.size or 0
        with self._fit:
            keep = self.kept()
            # make room from what was read, never from what prefetch fetched for later
            # a reserved shard counts by its full size, whatever the scan saw of it
            # (a partial download, the published entry, or nothing: published
            # between the listing and the lstat); every other entry as on disk
            reserved = sum(self._reserved.values())
            used = store.evict(reserve=need + reserved, keep=keep, reserved=set(self._reserved)) + reserved
            if used + need > store.cache_size or (not need and used >= store.cache_size):
                return False
            self._reserved[store.entry_path(shard.url)] = need
            return True

    def reserved_for(self, base: str) -> bool:
        """Whether the entry ``base`` has room reserved for its download now."""
        with self._fit:
            return base in self._reserved

    def unreserve(self, shard: ShardInfo) -> None:
        with self._fit:
            self._reserved.pop(self.store.entry_path(shard.url), None)

    def _loop(self) -> None:
        self.store.in_background()  # this thread's events are a background download's
        try:
            self._work()
        finally:
            self.store.close_session()  # this thread's pooled connections

    def _work(self) -> None:
        store = self.store
        while True:
            with self.cond:
                while not self.queue and not self.stopping:
                    self.cond.wait()
                if self.stopping:
                    return
                shard = self.queue.popleft()
                self.current.add(shard.url)
            try:
                if self.fits(shard):
                    try:
                        store.ensure(shard, reader=False)
                    finally:
                        self.unreserve(shard)
                else:
                    store.count("prefetch_over_budget")
            except Exception:
                store.count("prefetch_error")
            finally:
                with self.cond:
                    self.current.discard(shard.url)
