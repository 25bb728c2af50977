"""ShardStore: a verified, self-repairing, size-bounded cache of remote shards.

Local shards (plain paths, ``file://``) are read where they are and only
verified.  Remote shards (http, https, ``s3://``, ``pipe:``) are downloaded
once into ``<cache_dir>/shards/`` and handed to readers as a pinned local
file (:class:`LocalShard`).

Where things are (read in this order)::

    layout.py    one entry on disk: its files (shard, .partial, .meta, .lock, .dl),
                 the meta format, EntryState (the entry's life, documented at the
                 enum), and the symlink-refusing file primitives
    locks.py     the pin (LocalShard, released on close) and the download lock
                 (lock_download: waits for another downloader within the budget)
    local.py     local shards: verified in place, the "verified" marks
    store.py     ShardStore: acquire, classify an entry, fill / adopt / repair and
                 publish it; the per-shard fetch budgets; the fork registry
    eviction.py  LRU within cache_size: scan, evict (never a pinned entry)
    prefetch.py  Prefetcher: the background download threads (prefetch_threads:
                 4 for a shuffled window, else 2), within cache_size
    sparse.py    sparse partial downloads (.sparse + .sparse.map): a shard with
                 sample digests filled by checked samples in any order, the
                 readers' ranges and the download's pieces, so that no byte
                 is fetched twice (claims in the map: across processes too)
    bulk.py      the CLI's passes over a manifest: verify_all, prefetch_all

prefetch.py, bulk.py and :mod:`resumewds.repair` call the store back only
through its public protocol (:class:`resumewds.storeapi.StoreAPI`: ``ensure``,
``check_local``, ``emit``, ``count``, ``evict``, ``session``, ``close_session``,
``write_meta``); the store imports them, never the other way round.

The life of one remote entry (details at :class:`~resumewds.cache.layout.EntryState`)::

    absent --download (.partial, hashed as written)--> partial
    absent --(sample digests) readers' ranges and the download's pieces, each
             sample checked as it arrives (.sparse, .sparse.map; the whole
             file hashed in order once complete)--> partial
    partial --check size / xxh3_64 (or: a complete tar), os.replace, .meta--> verified
    verified --a reader holds .lock shared--> pinned --released--> verified
    verified --LRU over cache_size, not pinned--> evicted (absent)
    corrupt --ranged repair of the bad samples, else fetched again--> repaired (verified)

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

Budget: ``cache_size`` is a limit (see :mod:`resumewds.cache.eviction`).
When one shuffle window alone does not fit, a warning says so once, with
the numbers.

Downloads without a known checksum are checked to be complete tars (the
framer of :mod:`resumewds.tario` scans them) before they are published, so
one bad response (an error page) is never kept as the shard; a corrupt
download is a failed attempt of the shard's fetch budget
(:class:`resumewds.fetch.FetchBudget`), shared by the prefetch thread and
the reader.

Events (``on_event``) are :class:`resumewds.events.EventKind` members.

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

import importlib as _importlib
import typing as _typing

from ..config import parse_size
from .layout import EntryState, ProgressFn
from .store import SYNC_MODES, VERIFY_POLICIES, EventFn, LocalShard, ShardStore, default_cache_dir

__all__ = ["EntryState", "EventFn", "FileCache", "LRUCleanup", "LocalShard", "ProgressFn", "SYNC_MODES", "ShardStore",
           "StreamingOpen", "VERIFY_POLICIES", "check_tar_format", "default_cache_dir", "default_cache_size",
           "download", "get_filetype", "islocal", "magic_filetype", "obsolete", "parse_size", "pipe_cleaner",
           "reraise_exception", "url_to_cache_name", "verbose_cache"]

# webdataset's ``cache`` module names (its streaming FileCache, StreamingOpen, LRUCleanup...): the
# WebDataset wing's (resumewds.wds.filecache), found here by webdataset's module name on first use.
# The engine never uses them (it has the ShardStore above), so it imports no wing module.
_WDS_NAMES = ("FileCache", "LRUCleanup", "StreamingOpen", "check_tar_format", "default_cache_size", "download",
              "get_filetype", "gopen", "islocal", "magic_filetype", "obsolete", "pipe_cleaner", "reraise_exception",
              "url_to_cache_name", "verbose_cache")


def __getattr__(name: str) -> _typing.Any:
    if name in _WDS_NAMES:
        return getattr(_importlib.import_module("resumewds.wds.filecache"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> _typing.List[str]:
    return sorted(set(globals()) | set(_WDS_NAMES))
