"""Per-sample checksums: the public face, and the passes over a whole manifest.

Each sample's byte range ``[offsets[i], offsets[i+1])`` gets an xxh3_64
digest (seed 0) of exactly those bytes, so one sample can be verified, and
repaired, alone; compressed shards get none.  The format: docs/DIGESTS.md.
Here: the public names (re-exported from :mod:`resumewds.manifest` and
:mod:`resumewds.cache`) and the passes over a whole manifest.

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
        if s.sample_digests is None and s.indexed and not s.url.lower().endswith(COMPRESSED_SUFFIXES):
            s.sample_digests = file_sample_digests(store.ensure(s), s.offsets)
    return manifest


def check_results(store: Any, results: List[Any], echo: Any) -> List[Any]:
    """``resumewds verify``'s sample check: ``echo`` one ``BAD SAMPLE ...`` line per
    failing sample of each local shard that failed its whole-file check (or had
    none, in which case failing samples fail the shard).

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
    """An ``on_event`` for :class:`~resumewds.cache.ShardStore` that ``echo``-s each sample
    re-fetched by range after failing its digest (``resumewds verify`` of remote shards)."""
    def on_event(kind: str, url: str, **d: Any) -> None:
        if kind == EventKind.RANGE_REPAIR:
            echo(f"BAD SAMPLE {url}: sample {d['sample']} (key {d['key']}, bytes {d['start']}-{d['end']}) "
                 f"in the cached copy: re-fetching its byte range")
        elif kind == EventKind.RANGE_REPAIR_DONE:
            echo(f"repaired {url}: {d['samples']} samples, {d['bytes']} bytes fetched in {d['ranges']} ranges")

    return on_event
