"""StoreAPI: what a :class:`~resumewds.cache.ShardStore` offers the code it calls back.

The store drives its prefetch threads (:mod:`resumewds.cache`), the
CLI's bulk passes (:mod:`resumewds.cache`) and the ranged repair of a
corrupt copy (:mod:`resumewds.cache`); each of them needs a few things of
the store back (acquire a shard unpinned, record an event, make room, the
thread's HTTP session...).  They take the store as a parameter typed by this
Protocol and never import the store, so the imports run one way: the store
imports them, they import this module.

It lives outside :mod:`resumewds.cache` because :mod:`resumewds.cache`,
which the store imports, needs it too (importing ``resumewds.cache.<x>``
from there would import the store first).
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Protocol, Set

from ..fetch import FetchConfig
from ..manifest import ShardInfo

__all__ = ["StoreAPI"]


class StoreAPI(Protocol):
    """The public protocol of :class:`~resumewds.cache.ShardStore` used by its helpers.

    Attributes:
        fetch: the retry/timeout policy of the store's downloads.
        cache_size: the byte budget, or None (unlimited).
        prefetch_threads: shards prefetched at once, or None (chosen by the prefetcher).
    """

    fetch: FetchConfig
    cache_size: Optional[int]
    prefetch_threads: Optional[int]

    def entry_path(self, url: str) -> str:
        """Where the cached copy of ``url`` lives (whether or not it exists)."""
        ...

    def ensure(self, shard: ShardInfo, tar: bool = True, *, policy: Optional[str] = None,
               progress: Optional[Callable[[int], None]] = None, reader: bool = True) -> str:
        """A verified local file for ``shard``, unpinned: its path."""
        ...

    def check_local(self, shard: ShardInfo, policy: str = "always",
                    progress: Optional[Callable[[int], None]] = None) -> str:
        """Verify the local shard ``shard`` in place under ``policy``: its path."""
        ...

    def emit(self, kind: str, url: str, **detail: Any) -> None:
        """Record an event (counters, ``RESUMEWDS_VERBOSE_CACHE``, ``on_event``)."""
        ...

    def count(self, name: str) -> None:
        """Add one to the counter ``name`` (no event)."""
        ...

    def evict(self, reserve: int = 0, keep: Optional[Set[str]] = None,
              reserved: Optional[Set[str]] = None) -> int:
        """Evict entries not in use until the cache plus ``reserve`` fits ``cache_size``: bytes left."""
        ...

    def session(self) -> Any:
        """This thread's HTTP session."""
        ...

    def ensure_dirs(self) -> None:
        """Create the cache's directories if they are missing (``CacheError`` if it cannot)."""
        ...

    def in_background(self) -> None:
        """The calling thread downloads in the background: its events say so (``prefetch``)."""
        ...

    def close_session(self) -> None:
        """Close this thread's HTTP session."""
        ...

    def write_meta(self, base: str, url: str, xxh3_64: Optional[str], synced: bool) -> None:
        """Publish the meta that makes the file ``base`` the verified entry of ``url``."""
        ...
