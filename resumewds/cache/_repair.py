"""Block repair: fix a corrupt shard copy by re-fetching only its bad samples.

The samples that fail their digests, and the bytes no digest covers, are
fetched by ``Range`` (neighbours coalesced) under the shard's fetch budget,
each checked as it arrives and written in place; then the whole-shard check
runs again.  One flipped byte in a 32 MB shard costs one sample, not the
shard.  None (fetch the whole shard) when more than :data:`MAX_FRACTION`
fails, the server ignores ``Range`` or sends other bytes, or the result fails.

Example:
    >>> r = repair_file("/cache/ab12.tar", shard, config=cfg)   # doctest: +SKIP
    >>> r.ok, r.bytes_fetched, [b.index for b in r.samples]      # doctest: +SKIP
    (True, 14336, [17])
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from typing import Any, List, Optional, Tuple

import xxhash

from ..errors import FetchError, IntegrityError
from ..events import EventKind
from ..fetch import FetchBudget, fetch_range, is_remote_url
from ._samplecheck import BadSample, bad_samples
from ._sparse import SampleSink
from ._storeapi import StoreAPI

#: above this fraction of the shard failing, a whole-shard fetch is used instead
MAX_FRACTION = 0.25
#: neighbouring ranges closer than this are fetched in one request
COALESCE_GAP = 64 * 1024


@dataclass
class RangeRepair:
    """What :func:`repair_file` did: the bad samples, the ranges asked, the bytes received, the new digest."""

    ok: bool
    samples: List[BadSample] = field(default_factory=list)
    ranges: List[Tuple[int, int]] = field(default_factory=list)
    bytes_fetched: int = 0
    xxh3_64: Optional[str] = None


def coalesce(ranges: List[Tuple[int, int]], gap: int = COALESCE_GAP) -> List[Tuple[int, int]]:
    """Merge sorted ``[start, end)`` ranges that touch or are closer than ``gap``.

    Example:
        >>> coalesce([(0, 10), (12, 20), (1000, 1010)], gap=5)
        [(0, 20), (1000, 1010)]
    """
    out: List[Tuple[int, int]] = []
    for a, b in sorted(r for r in ranges if r[1] > r[0]):
        if out and a - out[-1][1] <= gap:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _hash_file(path: str) -> str:
    h = xxhash.xxh3_64()
    with open(path, "rb") as f:
        for b in iter(lambda: f.read(1 << 20), b""):
            h.update(b)
    return h.hexdigest()


def repair_file(path: str, shard: Any, *, config: Any, budget: Any = None, session: Any = None,
                on_event: Any = None, before_fetch: Any = None) -> Optional[RangeRepair]:
    """Repair the local copy ``path`` (written in place: a private copy) of the remote ``shard``, by range.

    Args:
        on_event: ``on_event(kind, url, **detail)``: ``range_repair`` per bad sample.
        before_fetch: called once the ranges are known, before any is fetched.

    Returns:
        A :class:`RangeRepair` whose file now passes, or None: fetch the whole shard.

    Raises:
        PermanentFetchError: the server refuses the shard (404...).
    """

    if (shard.sample_digests is None or shard.offsets is None or shard.size is None
            or shard.xxh3_64 is None or not is_remote_url(shard.url)):
        return None
    budget = budget or FetchBudget(config)
    size = int(shard.size)
    offsets = [int(x) for x in shard.offsets]
    if offsets[-1] > size:
        return None
    try:
        with open(path, "r+b") as f:
            if os.fstat(f.fileno()).st_size != size:
                f.truncate(size)  # a truncated (or overlong) copy: its missing samples fail below
        bads = bad_samples(path, shard)
    except OSError:
        return None
    # bytes no sample digest covers: before the first sample, and the tar trailer
    uncovered = [(0, offsets[0]), (offsets[-1], size)]
    wanted = [(b.start, b.end) for b in bads] + uncovered
    if sum(b - a for a, b in wanted) > MAX_FRACTION * size:
        return None
    ranges = coalesce(wanted)
    result = RangeRepair(ok=False, samples=bads, ranges=ranges)
    if before_fetch is not None:
        before_fetch()
    for b in bads:
        if on_event is not None:
            on_event(EventKind.RANGE_REPAIR, shard.url, sample=b.index, key=b.key, start=b.start, end=b.end)
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError:
        return None

    def put(a: int, data: Any) -> None:
        os.pwrite(fd, data, a)
        result.bytes_fetched += len(data)

    try:
        for a, z in ranges:
            # every sample of the range is checked as it arrives (and fetched again while it
            # fails, under the shard's budget); the bytes no digest covers are checked below
            sink = SampleSink(shard, a, z, budget, on_sample=lambda j, at, data: put(at, data), on_raw=put)
            try:
                fetch_range(shard.url, a, z, config=config, budget=budget, session=session, on_event=on_event,
                            sink=sink)
            except (FetchError, IntegrityError, OSError):
                # the server ignores Range, answers 416, keeps sending other bytes, or the shard's
                # budget is spent: the caller's whole-shard fetch reports what is wrong
                return None
        os.fsync(fd)
    finally:
        os.close(fd)
    result.xxh3_64 = _hash_file(path)
    result.ok = result.xxh3_64 == shard.xxh3_64.lower()
    return result if result.ok else None


# ---- the hooks the ShardStore calls when it fills an entry -----------------------------

def _run(store: StoreAPI, shard: Any, path: str, budget: Any, download: bool) -> Optional[RangeRepair]:
    def before_fetch() -> None:
        # the journal's shard states: (downloaded ->) corrupt -> downloading -> verified
        if download:
            store.emit(EventKind.VERIFY_FAIL, shard.url, expected=shard.xxh3_64, actual="a corrupt download")
        store.emit(EventKind.REPAIR, shard.url, attempt=1, ranged=True)

    r = repair_file(path, shard, config=store.fetch, budget=budget, session=store.session(),
                    on_event=store.emit, before_fetch=before_fetch)
    if r is not None:
        store.emit(EventKind.RANGE_REPAIR_DONE, shard.url, bytes=r.bytes_fetched, samples=len(r.samples),
                    ranges=len(r.ranges))
    return r


def repair_entry(store: StoreAPI, shard: Any, base: str, budget: Any) -> bool:
    """Repair the corrupt entry ``base`` by range (under its download lock); False: fetch it whole.

    Repaired in a private copy that replaces it atomically: a reader of the old
    file keeps its inode.
    """
    if shard.sample_digests is None or not shard.indexed:
        return False
    tmp = base + ".repair.tmp"  # ".tmp": not an entry to the cache's scan; a leftover is overwritten here
    try:
        shutil.copyfile(base, tmp)
        r = _run(store, shard, tmp, budget, download=False)
        if r is None:
            return False
        os.replace(tmp, base)
    except OSError:
        return False
    finally:
        try:
            os.unlink(tmp)
        except OSError:
            pass
    store.write_meta(base, shard.url, r.xxh3_64, synced=True)
    store.emit(EventKind.VERIFY_OK, shard.url)
    return True


def repair_download(store: StoreAPI, shard: Any, partial: str, budget: Any) -> Optional[str]:
    """Repair a finished download that failed its whole-shard check: its xxh3_64, or None."""
    if shard.sample_digests is None or not shard.indexed:
        return None
    r = _run(store, shard, partial, budget, download=True)
    return r.xxh3_64 if r is not None else None
