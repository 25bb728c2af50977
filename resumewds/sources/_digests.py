"""Per-sample checksums: the public face, and the passes over a whole manifest.

This module is what users import: the names of its ``__all__``, and the
operations over a manifest that go through the shard store
(:func:`add_sample_digests`) or serve ``resumewds verify``
(:func:`check_results`, :func:`echo_range_repairs`).  The code below the
manifest and the store lives in :mod:`resumewds.manifest` (the arithmetic
and the manifest format) and :mod:`resumewds.cache` (checking a copy's
samples); their public names are re-exported here.

Each sample's byte range ``[offsets[i], offsets[i+1])`` gets an xxh3_64
digest (seed 0) of exactly those bytes, so a reader can verify one sample
without the rest of its shard, and a repair can re-fetch only the samples
that fail (:mod:`resumewds.cache`).

In the manifest (version 3) the digests are stored one of two ways:

* inline, as one string of 16 lower-case hex digits per sample, in sample
  order (``"sample_xxh3_64": "9f2c...0b11"``, ``16 * samples`` characters).
  Fixed width makes it compact (no per-item JSON quotes or commas: 16
  bytes per sample, an offsets entry costs about as much) and trivial to
  validate (length and alphabet);
* in a side file next to the manifest, as the v2 offsets are: a flat array
  of little-endian uint64, memory-mapped on first use; shard k's digests are
  the ``samples`` values from its ``digests_at``; the manifest records the
  file (``digests_file``) and its size and xxh3_64 (``digests_size``,
  ``digests_xxh3_64``).  ``resumewds index --offsets file`` writes both side
  files.

Compressed shards (``.tar.gz``...) get no sample digests: their ranges are
positions in the decompressed stream, which can be neither read in place
nor fetched by range.

Example:
    >>> ds = sample_digests(b"a" * 1024 + b"b" * 512, [0, 1024, 1536])
    >>> encode_inline(ds) == format(ds[0], "016x") + format(ds[1], "016x")
    True
    >>> list(decode_inline(encode_inline(ds), 2, "m.json: shard a.tar")) == list(ds)
    True
"""

from __future__ import annotations

import os
from typing import Any, List

from ..cache import BadSample, ShardStore, bad_samples
from ..errors import ChecksumMismatch, IntegrityError
from ..events import EventKind
from ..fetch import is_remote_url, local_path
from ..manifest import (
    COMPRESSED_SUFFIXES,
    DigestsFile,
    LazyDigests,
    decode_inline,
    encode_inline,
    file_sample_digests,
    sample_digests,
)

__all__ = ["BadSample", "DigestsFile", "LazyDigests", "add_sample_digests", "bad_samples", "check_results",
           "decode_inline", "echo_range_repairs", "encode_inline", "file_sample_digests", "sample_digests"]


def _digestible(shard: Any) -> bool:
    return shard.indexed and not shard.url.lower().endswith(COMPRESSED_SUFFIXES)


def add_sample_digests(manifest: Any, store: Any = None) -> Any:
    """Compute the sample digests of every indexed, uncompressed shard (in place).

    Remote shards are read from the cache (``store``), fetched if needed.

    Example:
        >>> m = build_manifest("data/shard-*.tar")   # doctest: +SKIP
        >>> add_sample_digests(m).shards[0].sample_digests[:1]   # doctest: +SKIP
        array('Q', [11427914338912307203])
    """
    if store is None:
        store = ShardStore()
    for s in manifest.shards:
        if s.sample_digests is None and _digestible(s):
            s.sample_digests = file_sample_digests(store.ensure(s), s.offsets)
    return manifest


def check_results(store: Any, results: List[Any], echo: Any) -> List[Any]:
    """``resumewds verify``'s sample check: name the samples that fail their digests.

    For each local shard that failed its whole-file check (or had none),
    hash its samples and call ``echo`` with one ``BAD SAMPLE ...`` line per
    failing sample (shard, sample index, key, byte range).  A shard without
    a whole-file checksum whose samples fail is failed.

    Returns:
        ``results`` with such shards marked failed.
    """
    out = []
    for s, ok, e in results:
        if s.sample_digests is not None and s.offsets is not None and not is_remote_url(s.url) and \
                ((not ok and isinstance(e, ChecksumMismatch)) or (ok and s.xxh3_64 is None)):
            path = local_path(s.url)
            try:
                bads = bad_samples(path, s) if os.path.isfile(path) else []
            except (OSError, ValueError):
                bads = []
            for b in bads:
                echo(f"BAD SAMPLE {b}")
            if bads and ok:
                ok, e = False, IntegrityError(f"{s.url}: {len(bads)} of {s.samples} samples fail their "
                                              f"xxh3_64 digests")
        out.append((s, ok, e))
    return out


def echo_range_repairs(echo: Any) -> Any:
    """An ``on_event`` for :class:`~resumewds.cache.ShardStore` that names, via
    ``echo``, each sample of a cached copy that failed its digest and was
    re-fetched by range (``resumewds verify`` of remote shards)."""
    def on_event(kind: str, url: str, **d: Any) -> None:
        if kind == EventKind.RANGE_REPAIR:
            echo(f"BAD SAMPLE {url}: sample {d['sample']} (key {d['key']}, bytes {d['start']}-{d['end']}) "
                 f"in the cached copy: re-fetching its byte range")
        elif kind == EventKind.RANGE_REPAIR_DONE:
            echo(f"repaired {url}: {d['samples']} samples, {d['bytes']} bytes fetched in {d['ranges']} ranges")

    return on_event
