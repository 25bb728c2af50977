"""An entry's two locks as a reader meets them: the pin (:class:`LocalShard`) and the download lock.

Both are ``fcntl.flock`` locks beside the entry, gone with the process that
held them.  ``.lock``: readers hold it shared, the evictor needs it
exclusive.  ``.dl``: one downloader at a time.
"""

from __future__ import annotations

import fcntl
import os
import time
from typing import TYPE_CHECKING, Any, Callable, Optional, Tuple

from ..errors import ResumeWDSError, TransientFetchError
from ..manifest import ShardInfo
from . import _layout as layout

if TYPE_CHECKING:
    from ..fetch import FetchBudget


def lock_download(dl: int, url: str, budget: FetchBudget, base: str) -> None:
    """Take the download lock ``dl`` of entry ``base``, waiting for another downloader no longer
    than the budget leaves; past it, only while that download's partial grows at ``min_rate``."""
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
            st = layout.lstat(base + ".partial")
            sp = layout.lstat(base + ".sparse") if st is None else None
            # a sparse download grows by the blocks it fills, not by its size
            size = st.st_size if st is not None else sp.st_blocks * 512 if sp is not None else -1
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
        """Release the pin (then the store evicts what its ``cache_size`` no longer holds)."""
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

    def __enter__(self) -> LocalShard:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __del__(self) -> None:
        self._release(hook=False)  # no eviction from a garbage collector's arbitrary moment

    def __repr__(self) -> str:
        return f"LocalShard({self.path!r}, pinned={self.pinned})"
