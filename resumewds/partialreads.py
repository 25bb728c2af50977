"""Samples read from a shard's partial download while it downloads, each verified.

Before :func:`resumewds.reading.prepare` fetches a step's samples by range, it
asks here: a sample whose bytes a prefetch thread of this process has already
written to the shard's partial download (``<entry>.partial``, or a sparse
partial of :mod:`resumewds.cache.sparse`) is read from there and checked
against its digest; one that the download is about to write is waited for
(streaming, the order reads shards front to back), or, in a shuffled window,
handed back with how far the download still is from it, for the caller to
wait for it or fetch it by range.  What is delivered goes to the ranged reads
(:class:`Ready`, source ``"partial"``); the functions return the samples left
to fetch by range.  Nothing unverified is ever delivered.

The distances and stall limits are :mod:`resumewds.reading`'s tuning knobs,
passed in at each call as :class:`Waits` (a change there takes effect).

Example:
    >>> w = Waits(stream_ahead=4 << 20, stream_stall=1.0, window_ahead=2 << 20)
    >>> from_partial(rr, 0, shard, [5, 6], True, w)    # both delivered  # doctest: +SKIP
    []
"""

from __future__ import annotations

import os
import time
from typing import Any, Dict, List, NamedTuple, Optional, Protocol, Tuple

from .cache import sparse
from .errors import ShardFormatError
from .manifest import ShardInfo
from .rangefetch import parse_in, verified_in

__all__ = ["Ready", "Waits", "from_partial", "wait_sparse"]


class Waits(NamedTuple):
    """How far past a partial download's end a sample is waited for, and how long.

    Example:
        >>> Waits(stream_ahead=4 << 20, stream_stall=1.0, window_ahead=0).window_ahead
        0
    """

    stream_ahead: int  #: streaming: a sample this close past the end is waited for
    stream_stall: float  #: ... until the download has not grown for this long (seconds)
    window_ahead: int  #: shuffled window: a sample this close past the end is handed back (0: off)


class Ready(Protocol):
    """Where the samples read here go: the process's ranged reads
    (:class:`resumewds.reading.RangedReads`), with the store they read."""

    store: Any

    def put(self, key: Tuple[int, int], sample: Dict[str, Any], nbytes: int, source: str) -> None:
        """Keep a verified sample until it is read."""


def from_partial(rr: Ready, si: int, shard: ShardInfo, js: List[int], stream: bool, waits: Waits,
                 near: Optional[List[Tuple[int, int]]] = None, ahead: Optional[int] = None,
                 stall: Optional[float] = None, sparse_near: Optional[List[Tuple[int, int]]] = None) -> List[int]:
    """Deliver the samples ``js`` whose bytes are in the partial download (verified);
    return the others.  ``stream``: wait for a growing download to reach samples
    that are at most ``ahead`` past its end (default ``waits.stream_ahead``),
    giving up after ``stall`` seconds without growth (default
    ``waits.stream_stall``).  ``near`` (not streaming): the samples at most
    ``waits.window_ahead`` past the end of a partial this process's prefetch is
    writing go there, with how far past the end they end, instead of into
    the result (to be waited for, or not, by the caller)."""
    assert shard.offsets is not None
    ahead = waits.stream_ahead if ahead is None else ahead
    stall = waits.stream_stall if stall is None else stall
    st = sparse.lookup(rr.store, shard) if hasattr(rr.store, "entry_path") else None
    if st is not None:
        return _from_sparse(rr, si, shard, st, js, stream, waits, sparse_near)
    path = rr.store.entry_path(shard.url) + ".partial"
    try:
        fd = os.open(path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return js
    rest: List[int] = []
    try:
        size = os.fstat(fd).st_size
        if near is not None and not (waits.window_ahead > 0 and shard.url in _downloading(rr)):
            near = None
        for j in js:
            a, b = int(shard.offsets[j]), int(shard.offsets[j + 1])
            if b > size and stream and b - size <= ahead:
                size = _wait_growth(fd, b, stall, longest=0.05 if stall >= waits.stream_stall else 0.004)
                stream = size >= b  # a download that stalled is not waited for again
            if b > size:
                if near is not None and b - size <= waits.window_ahead:
                    near.append((j, b - size))
                else:
                    rest.append(j)
                continue
            buf = os.pread(fd, b - a, a)
            if len(buf) != b - a or not verified_in(buf, a, shard, j):
                rest.append(j)  # not (yet) the right bytes: fetch them by range
                continue
            try:
                rr.put((si, j), parse_in(buf, a, shard, j), b - a, "partial")
            except ShardFormatError:
                rest.append(j)
                continue
    finally:
        os.close(fd)
    return rest


def _from_sparse(rr: Ready, si: int, shard: ShardInfo, st: sparse.SparseState, js: List[int], stream: bool,
                 waits: Waits, near: Optional[List[Tuple[int, int]]] = None) -> List[int]:
    """:func:`from_partial` for a sparse partial (:mod:`resumewds.cache.sparse`):
    the samples whose bytes are recorded there are read (each verified); one
    that this process's download is writing now (or, ``stream``, that it
    reaches within ``waits.stream_ahead``) is waited for, or with ``near`` given,
    put there with how many bytes the download still has to write before it."""
    assert shard.offsets is not None
    off = shard.offsets
    rest: List[int] = []
    waiting: List[int] = []
    with st.cond:
        present = []
        for j in js:
            a, b = int(off[j]), int(off[j + 1])
            if st.have.covers(a, b):
                present.append(j)
                continue
            d = st.download_claim(a, b)
            if d is None and stream:
                d = _stream_distance(st, a, b, waits.stream_ahead)
            if d is not None and (stream or (near is not None and waits.window_ahead > 0)):
                if stream:
                    waiting.append(j)
                else:  # waited for if within the download's request (BUSY_CHUNK) or there in time,
                    assert near is not None  # else fetched (cutting the request short)
                    near.append((j, 0 if d <= sparse.BUSY_CHUNK else d))
            else:
                rest.append(j)
    rest += _read_sparse(rr, si, shard, st, present)
    if waiting:
        rest += wait_sparse(rr, si, shard, st, waiting, waits.stream_stall, waits.stream_ahead)
    return sorted(rest)


def _stream_distance(st: sparse.SparseState, a: int, b: int, ahead: int) -> Optional[int]:
    """Bytes a download of this process has to write before reaching ``[a, b)``
    when that is at most ``ahead`` past the range it writes now."""
    for pos, end, dl in st.claims.values():
        if dl and end <= a and b - end <= ahead:
            return b - pos
    return None


def _read_sparse(rr: Ready, si: int, shard: ShardInfo, st: sparse.SparseState, js: List[int]) -> List[int]:
    """Deliver the samples ``js`` from the sparse partial, each verified; return those that fail."""
    if not js:
        return []
    assert shard.offsets is not None
    try:
        fd = os.open(st.path, os.O_RDONLY | getattr(os, "O_CLOEXEC", 0))
    except OSError:
        return js
    rest: List[int] = []
    try:
        for j in js:
            a, b = int(shard.offsets[j]), int(shard.offsets[j + 1])
            buf = os.pread(fd, b - a, a)
            if len(buf) != b - a or not verified_in(buf, a, shard, j):
                rest.append(j)  # not the right bytes (a block lost or damaged): fetch them by range
                continue
            try:
                rr.put((si, j), parse_in(buf, a, shard, j), b - a, "partial")
            except ShardFormatError:
                rest.append(j)
    finally:
        os.close(fd)
    return rest


def wait_sparse(rr: Ready, si: int, shard: ShardInfo, st: sparse.SparseState, js: List[int],
                stall: float, ahead: int) -> List[int]:
    """Wait while this process's download writes the samples ``js`` (giving
    up on one when no download is about to write it any more, or after
    ``stall`` seconds without progress; a download counts while it is at most
    ``ahead`` bytes before a sample); deliver those that arrived, return the others."""
    assert shard.offsets is not None
    off = shard.offsets
    left = list(js)
    got: List[int] = []
    given_up: List[int] = []
    with st.cond:
        last = st.have.total()
        t_last = time.monotonic()
        while left:
            keep = []
            for j in left:
                a, b = int(off[j]), int(off[j + 1])
                if st.have.covers(a, b):
                    got.append(j)
                elif st.download_claim(a, b) is None and _stream_distance(st, a, b, ahead) is None:
                    given_up.append(j)
                else:
                    keep.append(j)
            left = keep
            if not left:
                break
            now = time.monotonic()
            total = st.have.total()
            if total > last:
                last, t_last = total, now
            elif now - t_last > stall:
                break
            st.cond.wait(0.02)
    return _read_sparse(rr, si, shard, st, got) + given_up + left


def _downloading(rr: Ready) -> Any:
    """URLs a prefetch thread of this process is downloading now (a hint)."""
    pf = getattr(rr.store, "_prefetch", None)
    return getattr(pf, "current", ()) if pf is not None else ()


def _wait_growth(fd: int, need: int, stall: float, longest: float = 0.05) -> int:
    """Wait while the partial download grows towards ``need`` bytes (polling,
    at most ``longest`` seconds between two looks); its size."""
    size = os.fstat(fd).st_size
    last, t_last = size, time.monotonic()
    pause = 0.002
    while size < need:
        if os.fstat(fd).st_nlink == 0:
            break  # removed (a failed download starts again): give up on this file
        time.sleep(pause)
        pause = min(pause * 2, longest)
        size = os.fstat(fd).st_size
        now = time.monotonic()
        if size > last:
            last, t_last = size, now
        elif now - t_last > stall:
            break
    return size
