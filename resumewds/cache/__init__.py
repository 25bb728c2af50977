"""ShardStore: a verified, self-repairing, size-bounded cache of remote shards.

Local shards (plain paths, ``file://``) are verified where they are; remote
shards (http, https, ``s3://``, ``pipe:``) are downloaded once into
``<cache_dir>/shards/`` and handed to readers pinned (:class:`LocalShard`).

The modules::

    _layout.py   one entry on disk: its files, the meta, EntryState (its life), file primitives
    _locks.py    the pin (LocalShard) and the download lock
    _local.py    local shards: verified in place, the "verified" marks
    _store.py    ShardStore: acquire, fill / adopt / repair / publish an entry; fetch budgets
    _eviction.py LRU within cache_size (never a pinned entry)
    _prefetch.py Prefetcher: the background download threads, within cache_size
    _sparse.py   sparse partials: a shard with sample digests filled by checked samples
    _bulk.py     the CLI's passes: verify_all, prefetch_all

Prefetch, bulk and repair call the store back only through
:class:`resumewds.cache._storeapi.StoreAPI`.  A data file is trusted only
with a ``.meta`` written after it, so a kill at any instant leaves a
resumable ``.partial`` or an entry without meta (re-verified or fetched
again).  Locks are ``fcntl.flock`` locks: they die with their process.

Durability (``sync``): ``"fsync"`` fsyncs a download before publishing;
``"boot"`` (what ``"auto"`` means where the kernel gives a boot id) records
the boot id in the meta instead: the entry is hashed again on first use in
a later boot (only a crash that ends the boot loses unsynced bytes).

Verify policies: ``"once"`` hashes at download and again when the file's
size or mtime changed since its meta (local files: once per file, marked
under ``cache_dir/verified``); ``"always"`` at every acquire; ``"never"``
compares sizes only.  Environment: ``RESUMEWDS_CACHE_*``, ``WDS_CACHE*`` (see :mod:`resumewds.config`).

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
    from ._samplecheck import BadSample, bad_samples, check_end_bytes
    from ._sparse import SampleSink
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
    "SampleSink": "_sparse",
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
