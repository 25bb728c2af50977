"""A sparse download's pieces: a shard's gaps fetched over several ranged connections at once.

:func:`resumewds.cache.sparse.download` fills a sparse partial with the bytes
no record covers.  Over a per-connection rate limit (object stores, CDNs) one
connection per shard would make it slower than a streamed download plus the
ranged reads' own connections, so the gaps are split into pieces of at most
:data:`PIECE` bytes (the caller's ``next_piece`` picks and claims each one,
in order) fetched by up to :data:`PIECE_CONNECTIONS` threads per shard and
:data:`DOWNLOAD_CONNECTIONS` requests at once in the process; none while the
reader's first step is read (``store.ranged_first``, at most
:data:`FIRST_STEP_WAIT` seconds: downloading then makes the first batch
slower; :data:`FIRST_STEP_CONNECTIONS`).  Each piece
follows the sparse partial's rules: its bytes are written with ``pwrite``
where they belong, *then* its record is appended to the map (every
:data:`RECORD_EVERY` bytes and at its end); a piece's claim is given back
when its request ends, so a gap left by a failed request is picked again.
A server that mishandles ``Range`` stops every piece (the caller streams the
shard instead); another failure stops them and is raised once they ended.

Example:
    >>> rec = record(0, 512, 7, 9); len(rec)
    40
"""

from __future__ import annotations

import os
import struct
import threading
import time
from typing import Any, Callable, List, Optional, Tuple

import xxhash

from ..repair import RangeIgnored, fetch_range
from .layout import cache_error
from .prefetch import THREAD_NAME as PREFETCH_THREAD

__all__ = ["DOWNLOAD_CONNECTIONS", "FIRST_STEP_CONNECTIONS", "FIRST_STEP_WAIT", "PIECE", "PIECE_CONNECTIONS",
           "RECORD_EVERY", "PiecesResult", "Writer", "after_first_step", "fetch_pieces", "record"]

#: a sparse download's pieces: at most this many bytes per request
PIECE = 4 << 20
#: ... fetched over at most this many connections at once per shard
PIECE_CONNECTIONS = 4
#: ... and at most this many piece requests at once in the process (all shards' downloads)
DOWNLOAD_CONNECTIONS = 12
#: connections per shard while the reader's first step is read (``store.ranged_first``):
#: 0, the download waits for it (at most :data:`FIRST_STEP_WAIT` seconds): a download at
#: the same time makes the first batch slower (bench/bench_firstbatch.py), 1: one, more: as after
FIRST_STEP_CONNECTIONS = 0
#: ... the longest a sparse download waits for the reader's first step
FIRST_STEP_WAIT = 2.0
#: the download appends a record at least every this many bytes (what another process sees)
RECORD_EVERY = 1 << 20

_REC = struct.Struct("<QQQQQ")  # start, end, xxh3 of the bytes, shard tag, xxh3 of the first 32 bytes


def record(a: int, b: int, dig: int, tag: int) -> bytes:
    """The map's record of bytes ``[a, b)`` whose xxh3_64 is ``dig``, of the shard ``tag``."""
    head = struct.pack("<QQQQ", a, b, dig, tag)
    return head + struct.pack("<Q", xxhash.xxh3_64_intdigest(head))


class _Slots:
    """The process's piece requests at once (:data:`DOWNLOAD_CONNECTIONS`, read at each take)."""

    def __init__(self) -> None:
        self.cond = threading.Condition()
        self.used = 0

    def take(self, wait: bool) -> bool:
        with self.cond:
            while self.used >= max(1, DOWNLOAD_CONNECTIONS):
                if not wait:
                    return False
                self.cond.wait(0.05)
            self.used += 1
            return True

    def give(self) -> None:
        with self.cond:
            self.used -= 1
            self.cond.notify()


_SLOTS = _Slots()


def _after_fork() -> None:
    global _SLOTS
    _SLOTS = _Slots()  # the parent's requests do not cross a fork


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_after_fork)


class Writer:
    """One piece's sink: bytes written where they belong (and made visible to
    this process's readers at once), recorded every :data:`RECORD_EVERY` bytes
    and at the end of the piece."""

    def __init__(self, st: Any, fd: int, token: int, a: int):
        self.st, self.fd, self.token = st, fd, token
        self.rec_at = self.pos = self.start = a
        self.hasher = xxhash.xxh3_64()
        self.received = 0
        self.t0 = time.monotonic()

    def __call__(self, at: int, chunk: bytes) -> None:
        st = self.st
        self.received += len(chunk)
        if at != self.pos:  # (a retry resumes where the last one stopped: never)
            self.flush()
            self.rec_at = self.pos = at
        try:
            os.pwrite(self.fd, chunk, at)
        except OSError as exc:
            raise cache_error(exc, st.path, "write the download") from exc
        self.hasher.update(chunk)
        self.pos = at + len(chunk)
        elapsed = time.monotonic() - self.t0
        with st.cond:
            st.have.add(at, self.pos)
            c = st.claims.get(self.token)
            if c is not None:
                c[0] = self.pos
            if elapsed > 0.005:
                st.dl_rate = (self.pos - self.start) / elapsed
            st.cond.notify_all()
        if self.pos - self.rec_at >= RECORD_EVERY:
            self.flush()

    def flush(self) -> None:
        """Record the bytes written since the last record (after them: they are in the file)."""
        if self.pos > self.rec_at:
            rec = record(self.rec_at, self.pos, self.hasher.intdigest(), self.st.tag)
            try:
                mfd = os.open(self.st.map, os.O_WRONLY | os.O_APPEND | getattr(os, "O_NOFOLLOW", 0))
                try:
                    os.write(mfd, rec)  # one write of 40 bytes, appended whole
                finally:
                    os.close(mfd)
            except OSError as exc:
                raise cache_error(exc, self.st.map, "record the download") from exc
        self.rec_at = self.pos
        self.hasher.reset()


class PiecesResult:
    """What :func:`fetch_pieces` did: ``received`` bytes in ``requests`` requests;
    ``no_range``: the server mishandled ``Range`` (stream the shard instead)."""

    def __init__(self) -> None:
        self.received = 0
        self.requests = 0
        self.no_range = False
        self.error: Optional[BaseException] = None
        self.lock = threading.Lock()


def after_first_step(store: Any) -> None:
    """With :data:`FIRST_STEP_CONNECTIONS` 0, a prefetch thread's download waits
    (at most :data:`FIRST_STEP_WAIT` seconds, and not once the prefetch stops)
    while the store's reader reads its first step (``store.ranged_first``): it
    fetches nothing before it (its partial is open: the first step's ranges
    are kept there).  A reader's own download (the reader needs the shard
    whole now) never waits."""
    if threading.current_thread().name != PREFETCH_THREAD:
        return
    pf = getattr(store, "_prefetch", None)
    t0 = time.monotonic()
    while (FIRST_STEP_CONNECTIONS <= 0 and getattr(store, "ranged_first", False)
           and time.monotonic() - t0 < FIRST_STEP_WAIT and not getattr(pf, "stopping", False)):
        time.sleep(0.005)


def fetch_pieces(st: Any, fd: int, url: str, store: Any, budget: Any,
                 next_piece: Callable[[], Optional[Tuple[int, int, int]]],
                 complete: Callable[[], bool]) -> PiecesResult:
    """Fetch pieces until ``complete()``: ``next_piece()`` (called under ``st.cond``)
    picks the next one and claims it for the download, ``(start, end, token)``,
    or None when every gap is present or claimed.  The calling thread fetches
    pieces too, and waits for the others before it returns.

    Example:
        >>> res = fetch_pieces(st, fd, url, store, budget, pick, done)   # doctest: +SKIP
        >>> res.no_range, res.requests                                      # doctest: +SKIP
        (False, 8)
    """
    res = PiecesResult()
    after_first_step(store)  # the reader's first batch comes first
    stop = threading.Event()
    helpers: List[threading.Thread] = []
    spawned: List[Callable[[], None]] = []  # the main thread's spawn(), once a piece of its own is claimed

    def one(helper: bool) -> bool:
        """Fetch one piece: True when one was fetched (or is worth waiting for)."""
        if not _SLOTS.take(wait=not helper):
            return False
        try:
            with st.cond:
                st.refresh()
                nxt = next_piece()
                if nxt is None:
                    if helper or not st.have.missing(0, st.size) or stop.is_set():
                        return False
                    st.cond.wait(0.05)  # only claims in flight: their bytes, or their gaps back
                    return True
            a, b, token = nxt
            if not helper and (FIRST_STEP_CONNECTIONS > 1 or not getattr(store, "ranged_first", False)):
                spawned[0]()  # more pieces may follow: up to PIECE_CONNECTIONS at once (after the first step)
            st.announce(a, b, False)  # other processes' readers wait for it rather than fetch it
            w = Writer(st, fd, token, a)
            try:
                fetch_range(url, a, b, config=store.fetch, budget=budget, session=store.range_session(),
                            sink=w)
                with res.lock:
                    res.requests += 1
            finally:
                with res.lock:
                    res.received += w.received
                try:
                    w.flush()
                finally:
                    with st.cond:
                        st.release(token)
                    st.announce(a, b, True)
            return True
        finally:
            _SLOTS.give()

    def loop(helper: bool) -> None:
        try:
            while not stop.is_set() and not complete():
                if not one(helper) and helper:
                    return
        except RangeIgnored as exc:
            with res.lock:
                if exc.status is None:  # no attempt left (the reader's ranges hold them): not the server's doing
                    res.error = res.error or budget.exhausted_error(url)
                else:
                    res.no_range = True  # a 200, a 416, another range
            stop.set()
        except BaseException as exc:  # raised by the caller once every piece ended
            with res.lock:
                res.error = res.error or exc
            stop.set()
        finally:
            if helper:
                store.close_session()  # this thread's pooled connections

    def spawn() -> None:
        helpers[:] = [t for t in helpers if t.is_alive()]
        while len(helpers) < max(0, PIECE_CONNECTIONS - 1) and not stop.is_set():
            t = threading.Thread(target=loop, args=(True,), name="resumewds-piece", daemon=True)
            t.start()
            helpers.append(t)

    spawned.append(spawn)
    try:
        loop(False)
    finally:
        stop.set()
        for t in helpers:
            t.join()
    return res
