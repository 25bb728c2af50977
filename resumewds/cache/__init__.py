"""ShardStore: a verified, self-repairing, size-bounded cache of remote shards.

Local shards (plain paths, ``file://``) are read where they are and only
verified.  Remote shards (http, https, ``s3://``, ``pipe:``) are downloaded
once into ``<cache_dir>/shards/`` and handed to readers as a pinned local
file (:class:`LocalShard`).

Where things are (read in this order)::

    _layout.py   one entry on disk: its files (shard, .partial, .meta, .lock, .dl),
                 the meta format, EntryState (the entry's life, documented at the
                 enum), and the symlink-refusing file primitives
    _locks.py    the pin (LocalShard, released on close) and the download lock
                 (lock_download: waits for another downloader within the budget)
    _local.py    local shards: verified in place, the "verified" marks
    _store.py    ShardStore: acquire, classify an entry, fill / adopt / repair and
                 publish it; the per-shard fetch budgets; the fork registry
    _eviction.py LRU within cache_size: scan, evict (never a pinned entry)
    _prefetch.py Prefetcher: the background download threads (prefetch_threads:
                 4 for a shuffled window, else 2), within cache_size
    _sparse.py   sparse partial downloads (.sparse + .sparse.map): a shard with
                 sample digests filled by checked samples in any order, the
                 readers' ranges and the download's pieces, so that no byte
                 is fetched twice (claims in the map: across processes too)
    _bulk.py     the CLI's passes over a manifest: verify_all, prefetch_all

prefetch.py, _bulk.py and :mod:`resumewds.cache` call the store back only
through its public protocol (:class:`resumewds.cache._storeapi.StoreAPI`: ``ensure``,
``check_local``, ``emit``, ``count``, ``evict``, ``session``, ``close_session``,
``write_meta``); the store imports them, never the other way round.

The life of one remote entry (details at :class:`~resumewds.cache._layout.EntryState`)::

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

Budget: ``cache_size`` is a limit (see :mod:`resumewds.cache`).
When one shuffle window alone does not fit, a warning says so once, with
the numbers.

Downloads without a known checksum are checked to be complete tars (the
framer of :mod:`resumewds.tar` scans them) before they are published, so
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

import typing as _typing

from .. import _lazy
from ..config import parse_size

if _typing.TYPE_CHECKING:  # (the names as the type checker sees them)
    from ._layout import EntryState, ProgressFn
    from ._local import verify_later
    from ._locks import LocalShard
    from ._samplecheck import BadSample, SampleSink, bad_samples, check_end_bytes
    from ._store import SYNC_MODES, VERIFY_POLICIES, EventFn, ShardStore, default_cache_dir

# every name loads its module on first use (PEP 562): importing one module of this
# package (or the package) loads nothing else of it
_LAZY: _typing.Dict[str, str] = {
    "bad_samples": "_samplecheck",
    "BadSample": "_samplecheck",
    "check_end_bytes": "_samplecheck",
    "default_cache_dir": "_store",
    "EntryState": "_layout",
    "EventFn": "_store",
    "LocalShard": "_locks",
    "ProgressFn": "_layout",
    "SampleSink": "_samplecheck",
    "ShardStore": "_store",
    "SYNC_MODES": "_store",
    "verify_later": "_local",
    "VERIFY_POLICIES": "_store",
}

__all__ = ["bad_samples", "BadSample", "check_end_bytes", "check_tar_format", "default_cache_dir",
           "default_cache_size", "download", "EntryState", "EventFn", "FileCache", "get_filetype",
           "islocal", "LocalShard", "LRUCleanup", "magic_filetype", "obsolete", "parse_size",
           "pipe_cleaner", "ProgressFn", "reraise_exception", "SampleSink", "ShardStore", "StreamingOpen",
           "SYNC_MODES", "url_to_cache_name", "verbose_cache", "verify_later", "VERIFY_POLICIES"]

# webdataset's ``cache`` module names (its streaming FileCache, StreamingOpen, LRUCleanup...) are the
# WebDataset wing's, forwarded here by the package's face (resumewds/__init__.py, _lazy.forward):
# the engine never uses them (it has the ShardStore above) and names no wing module.
__getattr__, __dir__ = _lazy.attach(__name__, _LAZY)
