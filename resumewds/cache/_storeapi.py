"""StoreAPI: what a :class:`~resumewds.cache.ShardStore` offers the code it calls back.

Prefetch, bulk and repair take the store typed by this Protocol and never
import it (the store imports them); it has its own module because they need it too.
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Protocol, Set

from ..fetch import FetchConfig
from ..manifest import ShardInfo


class StoreAPI(Protocol):
    """The public protocol of :class:`~resumewds.cache.ShardStore` used by its helpers (documented there)."""

    fetch: FetchConfig
    cache_size: Optional[int]
    prefetch_threads: Optional[int]

    def entry_path(self, url: str) -> str: ...

    def ensure(self, shard: ShardInfo, tar: bool = True, *, policy: Optional[str] = None,
               progress: Optional[Callable[[int], None]] = None, reader: bool = True) -> str: ...

    def check_local(self, shard: ShardInfo, policy: str = "always",
                    progress: Optional[Callable[[int], None]] = None) -> str: ...

    def emit(self, kind: str, url: str, **detail: Any) -> None: ...

    def count(self, name: str) -> None: ...

    def evict(self, reserve: int = 0, keep: Optional[Set[str]] = None,
              reserved: Optional[Set[str]] = None) -> int: ...

    def session(self) -> Any: ...

    def ensure_dirs(self) -> None: ...

    def in_background(self) -> None: ...

    def close_session(self) -> None: ...

    def write_meta(self, base: str, url: str, xxh3_64: Optional[str], synced: bool) -> None: ...
