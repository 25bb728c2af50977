"""Indexing shards: where each sample of each shard starts, before any plan can be made.

:func:`index_manifest` scans the shards of a manifest that has no offsets yet
(fetching remote ones into the verified cache first); :func:`build_manifest`
does it for any source and writes a manifest.json; :func:`index_skipping` is
indexing under a ``handler=`` (webdataset's), where a shard that cannot be
fetched or indexed is skipped, or keeps the samples before its damage
(:func:`salvage_shard`, :func:`framed_prefix`), as webdataset's stream reader would.
"""

from __future__ import annotations

import logging
import mmap
import os
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Any, Callable, Dict, Iterator, List, Optional, Tuple

import xxhash

from ..cache import ShardStore
from ..errors import CacheError, ChecksumMismatch, FetchError, IntegrityError, ShardFormatError, naming
from ..events import EventKind
from ..manifest import Manifest
from ..tar import _io as tario
from ..tar import kind_of
from ._digests import add_sample_digests
from ._resolve import Source, resolve_sources

__all__ = ["build_manifest", "framed_prefix", "index_manifest", "index_skipping", "salvage_shard"]

log = logging.getLogger("resumewds")


def index_manifest(manifest: Manifest, store: Any = None,
                   progress: Optional[Callable[[int], None]] = None,
                   on_event: Optional[Callable[..., None]] = None) -> Manifest:
    """Index every shard of ``manifest`` that is not indexed yet (in place; remote
    shards fetched into ``store`` first).  A shard whose manifest checksum or
    size disagrees with its bytes raises ChecksumMismatch.

    Args:
        progress: called with 1 after each shard.
    """
    todo = [s for s in manifest.shards if not s.indexed]
    if not todo:
        return manifest
    if store is None:
        store = ShardStore(on_event=on_event)
    for s, (idx, t0) in zip(todo, _scanned(store, todo)):
        if s.size is not None and s.size != idx.size:
            raise ChecksumMismatch(s.url, str(s.size), str(idx.size), what="size")
        if s.xxh3_64 is not None and s.xxh3_64 != idx.xxh3_64:
            raise ChecksumMismatch(s.url, s.xxh3_64, idx.xxh3_64)
        if s.samples is not None and s.samples != idx.samples:
            raise ShardFormatError(f"{s.url}: {getattr(s.index, 'source', 'the manifest')} says it holds "
                                   f"{s.samples} samples, it holds {idx.samples}", shard=s.url, offset=None,
                                   problem="sample count")
        s.index = None  # indexed now: its offsets come from the scan
        s.size, s.xxh3_64, s.samples, s.offsets = idx.size, idx.xxh3_64, idx.samples, idx.offsets
        log.debug("indexed %s: %d samples, %d bytes in %.3fs", s.url, idx.samples, idx.size,
                  time.perf_counter() - t0)
        if progress:
            progress(1)
    manifest._starts = None
    return manifest


#: shards fetched and scanned at once by :func:`index_manifest` (each over its own connection)
INDEX_THREADS = 8


def _scan_one(store: Any, shard: Any) -> Tuple[Any, float]:
    path = store.ensure(shard)
    t0 = time.perf_counter()
    return tario.scan_file(path, shard.url), t0


def _scanned(store: Any, todo: List[Any]) -> Iterator[Tuple[Any, float]]:
    """Each shard's scan, in order, up to :data:`INDEX_THREADS` at once (with a
    ``cache_size`` budget one by one: a fetch could evict a shard not scanned yet)."""
    if len(todo) == 1 or INDEX_THREADS <= 1 or getattr(store, "cache_size", None) is not None:
        for s in todo:
            yield _scan_one(store, s)
        return
    pool = ThreadPoolExecutor(min(INDEX_THREADS, len(todo)), thread_name_prefix="resumewds-index")
    try:
        futures = [pool.submit(_scan_one, store, s) for s in todo]
        for fut in futures:
            yield fut.result()
    finally:
        pool.shutdown(wait=False, cancel_futures=True)  # a fetch under way ends on its own


def index_skipping(m: Manifest, store: Any, handler: Callable[[BaseException], Any],
                   on_event: Optional[Callable[..., None]] = None) -> Dict[str, str]:
    """Index ``m`` shard by shard under ``handler`` (webdataset's ``handler=``): a shard that
    cannot be fetched or indexed goes to the handler and, unless it re-raises, is skipped
    (or :func:`salvage_shard`-d).  Returns ``{url: error}`` of the shards skipped."""
    skipped: Dict[str, str] = {}
    for s in m.shards:
        if s.indexed:
            continue
        try:
            index_manifest(Manifest([s]), store, on_event=on_event)
        except (FetchError, IntegrityError, ShardFormatError, CacheError) as exc:
            stop = handler(exc) is False
            kept = salvage_shard(s, store, exc, stop)  # the samples before the damage, as webdataset
            skipped[s.url] = str(exc)
            if on_event is not None:
                on_event(EventKind.SKIP, s.url, error=str(exc), samples_kept=kept)
            log.warning("skipping shard %s%s", naming(s.url, exc),
                        f" (kept its first {kept} samples)" if kept else "")
    m._starts = None
    return skipped


def build_manifest(urls: Source, output: Optional[str] = None, *, store: Any = None,
                   progress: Optional[Callable[[int], None]] = None, offsets: str = "auto",
                   digests: bool = False) -> Manifest:
    """Index shards and (optionally) write a manifest.json.

    Args:
        urls: paths, patterns, URLs (anything :class:`resumewds.WebDataset` accepts).
        output: where to write the manifest (urls relative to it), or None.
        store: shard cache for remote shards (default: a new ShardStore).
        progress: called with 1 after each shard is indexed.
        offsets: as for :meth:`resumewds.manifest.Manifest.save` (``"auto"``:
            inline up to 10,000 samples, else an index file per shard).
        digests: also record each sample's xxh3_64 (manifest version 3).

    Returns:
        The indexed :class:`~resumewds.manifest.Manifest`.

    Example:
        >>> m = build_manifest("data/shard-{000000..000031}.tar", "data/manifest.json")  # doctest: +SKIP
        >>> m.total_samples                                                            # doctest: +SKIP
        32000
    """
    m = resolve_sources(urls)
    index_manifest(m, store, progress=progress)
    if digests:
        add_sample_digests(m, store)
    if output is not None:
        m.save(output, offsets=offsets)
    return m


def framed_prefix(path: str, shard: Optional[str] = None) -> Optional[Any]:
    """The samples of a damaged plain tar that lie wholly before the damage, as a
    :class:`resumewds.tar._io.ShardIndex` (None if the file is a compressed shard,
    cannot be read, or has no such sample).

    A sample is kept when a member of the *next* sample was framed whole before
    the damage (docs/COMPAT.md, "A damaged shard"); ``size`` and ``xxh3_64``
    are the damaged file's.

    Example:
        >>> import io, tarfile, tempfile
        >>> buf = io.BytesIO()
        >>> with tarfile.open(fileobj=buf, mode="w") as t:
        ...     for k in ("a", "b", "c"):
        ...         ti = tarfile.TarInfo(k + ".txt"); ti.size = 600
        ...         t.addfile(ti, io.BytesIO(b"x" * 600))
        >>> f = tempfile.NamedTemporaryFile(suffix=".tar", delete=False)
        >>> _ = f.write(buf.getvalue()[:4000]); f.close()   # cut inside "c"'s data
        >>> idx = framed_prefix(f.name)
        >>> idx.keys, idx.offsets                           # "b" is not closed by a whole member
        (['a'], [0, 1536])
    """
    name = shard or path
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size < tario.BLOCK or f.read(2) == b"\x1f\x8b":
                return None
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
                groups: List[Tuple[str, List[Any]]] = []
                try:
                    for key, members in tario._group(tario.iter_members(mm, name), name):
                        groups.append((key, members))
                except ShardFormatError:
                    pass
                else:
                    return None  # not damaged after all: the normal index applies
                digest = xxhash.xxh3_64_hexdigest(mm)
    except OSError:
        return None
    if not groups:
        return None
    offsets = [members[0][1].header for _, members in groups] + [groups[-1][1][-1][1].end]
    return tario.ShardIndex(size=size, xxh3_64=digest, offsets=offsets, keys=[k for k, _ in groups])


_STOP_SPAN = 1 << 40


def salvage_shard(shard: Any, store: Any, exc: BaseException, stop: bool = False) -> int:
    """Under a handler that skipped ``shard`` at indexing (``exc``), keep the samples before the damage.

    Only for a shard with no checksum or size in the manifest and a
    :class:`~resumewds.errors.ShardFormatError`: its :func:`framed_prefix` (or
    :func:`resumewds.tar.salvage_compressed`'s) becomes the shard's index.

    ``stop``: the handler returned False: the shard gets one more, unreadable,
    position after the kept samples, where the iteration stops every run.

    Returns:
        How many samples were kept (0: none, the shard is skipped whole).
    """
    kept = _salvage(shard, store, exc)
    if stop:
        start = int(shard.offsets[-1]) if kept else 0
        if not kept:
            shard.offsets = [0]
        shard.offsets = list(shard.offsets) + [start + _STOP_SPAN]
        shard.samples = kept + 1
        shard.stop_reason = str(exc)  # what the reader reports when it is reached (ShardReader.fail)
    elif not kept:
        shard.samples, shard.offsets = 0, [0]
    return kept


def _salvage(shard: Any, store: Any, exc: BaseException) -> int:
    if not isinstance(exc, ShardFormatError) or shard.xxh3_64 is not None or shard.size is not None:
        return 0
    raw = False
    try:
        path = store.ensure(shard)
    except ShardFormatError:
        # the cache keeps an unchecksummed download only if it is a complete tar (an error
        # page must not become the shard): fetch the damaged bytes as they are, to index them
        try:
            path, raw = store.ensure(shard, tar=False), True
        except Exception:
            return 0
    except Exception:
        return 0
    kind = kind_of(path)
    if kind is None:
        idx = framed_prefix(path, shard.url)
    else:
        # decoded and framed as webdataset's stream reader does (compressed.salvage_compressed);
        # the index is that of the compressed file, and open_view serves the prefix copy
        from ..tar import salvage_compressed  # lazy: compressed shards only

        sv = salvage_compressed(path, shard.url)
        idx = None
        if sv is not None and sv.index.samples:
            idx = sv.index
            sv.apply(shard)
    if idx is None or not idx.offsets or idx.samples == 0:
        if raw:  # nothing to keep: do not leave the damaged download in the cache
            for p in (path, path + ".meta"):
                try:
                    os.unlink(p)
                except OSError:
                    pass
        return 0
    shard.size, shard.xxh3_64, shard.samples, shard.offsets = idx.size, idx.xxh3_64, idx.samples, idx.offsets
    shard.salvaged = True  # its index is the prefix before the damage: the shard goes on past its last offset
    return int(idx.samples)
