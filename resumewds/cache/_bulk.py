"""The CLI's passes over a whole manifest: ``resumewds verify`` and ``resumewds prefetch``.

Both go through the store's ordinary acquire path and report one
``(shard, ok, error)`` per shard, in input order, instead of stopping at the
first failure.
"""

from __future__ import annotations

import concurrent.futures
import os
import threading
from typing import List, Optional, Sequence, Tuple

from ..errors import ResumeWDSError
from ..events import EventKind
from ..fetch import is_remote_url
from ..manifest import ShardInfo
from . import _layout as layout
from ._layout import ProgressFn, not_a_complete_tar
from ._storeapi import StoreAPI

Outcome = Tuple[ShardInfo, bool, Optional[BaseException]]


def verify_all(store: StoreAPI, shards: Sequence[ShardInfo],
               progress: Optional[ProgressFn] = None) -> List[Outcome]:
    """Hash every shard now (policy "always"); remote ones are fetched or repaired when missing or corrupt.

    Example:
        >>> from resumewds import load_manifest
        >>> from resumewds.cache import ShardStore
        >>> [ok for _, ok, _ in verify_all(ShardStore(), load_manifest("data/manifest.json").shards)]
        [True, True, True, True]
    """
    out: List[Outcome] = []
    for s in shards:
        try:
            if is_remote_url(s.url):
                path = store.ensure(s, policy="always", progress=progress)
                if s.xxh3_64 is None:
                    # nothing to compare with: the cached copy must at least be a
                    # complete tar (one stored by an older version may be an error page)
                    bad = not_a_complete_tar(path, s.url, what="cached copy of")
                    if bad is not None:
                        store.emit(EventKind.VERIFY_FAIL, s.url, expected="a complete tar", actual=str(bad))
                        layout.remove(path + ".meta")
                        layout.remove(path)
                        store.ensure(s, policy="always", progress=progress)  # fetched again
            else:
                store.check_local(s, "always", progress)
            out.append((s, True, None))
        except ResumeWDSError as exc:
            out.append((s, False, exc))
    return out


def prefetch_all(store: StoreAPI, shards: Sequence[ShardInfo], progress: Optional[ProgressFn] = None,
                 parallel: int = 2) -> List[Outcome]:
    """Download every remote shard into the cache (local shards: reported ok).

    Args:
        progress: called with each shard's size once it is in the cache.
        parallel: shards in flight at once (threads, each with its own HTTP session).

    Example:
        >>> from resumewds import load_manifest
        >>> from resumewds.cache import ShardStore
        >>> len(prefetch_all(ShardStore(), load_manifest("data/manifest.json").shards))  # local: nothing to do
        4
    """
    report_lock = threading.Lock()

    def one(s: ShardInfo) -> Outcome:
        try:
            if is_remote_url(s.url):
                path = store.ensure(s)
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
