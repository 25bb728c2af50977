"""How many whole-shard downloads prefetch runs at once (ShardStore.prefetch_threads).

The default (None) is 4 for a shuffled window of several shards (all read
at once) and 2 for an order that reads one shard after the other; an
explicit number is used as given.  A real FaultServer on 127.0.0.1, slow
enough that no download ends before all have started; the downloads at
once are the downloaders ``prefetch()`` starts, and the paths they ask the
server for (the first shards of the wish list, in its order).
"""

from __future__ import annotations

import os
import threading
import time

import pytest

from chaos.faultserver import FaultServer
from http_fixtures import fast_config, make_tar, shard_for
from resumewds.cache import ShardStore
from resumewds.cache._prefetch import PREFETCH_THREADS, THREAD_NAME, WINDOW_PREFETCH_THREADS

SHARDS = 6


@pytest.mark.parametrize("threads,window,expected", [
    (None, SHARDS, WINDOW_PREFETCH_THREADS),  # a shuffled window: 4
    (None, 1, PREFETCH_THREADS),              # one shard after the other: 2
    (None, 0, PREFETCH_THREADS),              # no window given (mixtures)
    (3, SHARDS, 3),                           # explicit: as given
    (1, 1, 1),
])
def test_downloads_at_once(tmp_path, threads, window, expected):
    assert (PREFETCH_THREADS, WINDOW_PREFETCH_THREADS) == (2, 4)
    root = tmp_path / "srv"
    root.mkdir()
    blobs = [make_tar(str(root / f"{i}.tar"), samples=16, payload=4000, seed=i) for i in range(SHARDS)]
    st = ShardStore(cache_dir=str(tmp_path / "cache"), fetch=fast_config(), prefetch_threads=threads)
    try:
        # 92 KB a shard at 16 KB/s: each download takes ~6 s, all start at once
        with FaultServer(str(root), bytes_per_second=16_000) as srv:
            shards = [shard_for(srv.url + f"{i}.tar", b) for i, b in enumerate(blobs)]
            before = set(threading.enumerate())
            st.prefetch(shards, depth=SHARDS, window=window)
            # prefetch() starts its downloaders before it returns: one per download at once
            assert len([t for t in threading.enumerate() if t.name == THREAD_NAME and t not in before]) == expected
            t0 = time.monotonic()  # each of them asks the server (an event to wait for, asserts no duration)
            while len(srv.requests) < expected:
                assert time.monotonic() - t0 < 60, dict(srv.requests)
                time.sleep(0.01)
            started = sorted(srv.requests)
            assert started == [f"/{i}.tar" for i in range(expected)]  # in wish-list order
            assert not any(os.path.exists(st.entry_path(s.url) + ".meta") for s in shards)
    finally:
        st.close()


def test_more_threads_keep_within_cache_size(tmp_path):
    """Four downloads at once with a budget of two shards: only two start (each
    reserves its size first), and the cache never holds more than the budget."""
    root = tmp_path / "srv"
    root.mkdir()
    blobs = [make_tar(str(root / f"{i}.tar"), samples=16, payload=4000, seed=i) for i in range(SHARDS)]
    size = max(len(b) for b in blobs)
    budget = 2 * size + size // 2
    st = ShardStore(cache_dir=str(tmp_path / "cache"), cache_size=budget, fetch=fast_config())
    try:
        # 92 KB a shard at 32 KB/s: ~3 s each, none ends while we look (1 s)
        with FaultServer(str(root), bytes_per_second=32_000) as srv:
            shards = [shard_for(srv.url + f"{i}.tar", b) for i, b in enumerate(blobs)]
            st.prefetch(shards, depth=SHARDS, window=SHARDS)
            peak = 0
            t0 = time.monotonic()
            while time.monotonic() - t0 < 1.0:
                peak = max(peak, st.cached_bytes())
                time.sleep(0.005)
            assert len(srv.requests) == 2, dict(srv.requests)
            assert st.counters["prefetch_over_budget"] >= 1
            assert peak <= budget
    finally:
        st.close()
