"""The fetch core's drivers: :func:`fetch_to_file`, :func:`fetch_bytes` and :func:`fetch_range`.

Example:
    >>> import os, tempfile
    >>> d = tempfile.mkdtemp(); src = os.path.join(d, "a.bin")
    >>> with open(src, "wb") as f: _ = f.write(b"abc")
    >>> fetch_to_file(src, os.path.join(d, "a.partial")).size, fetch_bytes(src)
    (3, b'abc')
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from typing import TYPE_CHECKING, Any, Optional, Tuple

from ..errors import CacheError, FetchError, IntegrityError, RangeIgnored, ResumeWDSError, TransientFetchError
from ..events import EventKind
from ._attempt import _Attempt, _Pace
from ._partial import _read_validator, _size_of
from ._retry import FetchBudget, _retry
from ._settings import EventFn, FetchConfig, FetchResult
from ._transport import Transport, _run_attempt, transport_for

if TYPE_CHECKING:
    from ._http import Session


def _gopen_log(url: str, what: str) -> None:
    print(f"[gopen] {url} {what}", file=sys.stderr, flush=True)


def fetch_to_file(url: str, partial_path: str, *, expected_size: Optional[int] = None,
                  config: Optional[FetchConfig] = None, on_event: Optional[EventFn] = None,
                  session: Optional[Session] = None, budget: Optional[FetchBudget] = None,
                  max_bytes: Optional[int] = None) -> FetchResult:
    """Download ``url`` (http(s)://, s3://, file://, a path, ``pipe:CMD``) into ``partial_path``.

    Args:
        partial_path: destination; bytes already in it are kept when the server
            proves (If-Range, the 206's validator, kept in ``partial_path + ".etag"``)
            that they are of the same file.
        expected_size: size the finished file must reach, if known.
        on_event: ``on_event(kind, url, **detail)``: ``fetch_start``, ``fetch_done``, ``retry``.
        session: the :class:`~resumewds.fetch._http.Session` to use (http(s); made if None).
        budget: the attempts and deadline to draw from, shared by everyone
            fetching the shard for the same read (a fresh one if None).
        max_bytes: refuse (permanently) a source larger than this.

    Returns:
        A :class:`FetchResult` with the file's xxh3_64 (written, not fsynced).

    Raises:
        TransientFetchError: still failing when the budget is spent.
        PermanentFetchError: what retrying will not fix (4xx, a redirect loop,
            an HTML page for a shard of unknown size, more than ``max_bytes``).
        CacheError: ``partial_path`` cannot be written.

    Example:
        >>> fetch_to_file("/data/a.tar", "/tmp/a.partial").size  # doctest: +SKIP
        10240
    """
    cfg = config or FetchConfig.from_env()
    return _download(transport_for(url), url, partial_path, expected_size=expected_size, config=cfg,
                     on_event=on_event, session=session, budget=budget, max_bytes=max_bytes)


def _download(transport: Transport, url: str, partial_path: str, *, expected_size: Optional[int],
              config: FetchConfig, on_event: Optional[EventFn], session: Optional[Session],
              budget: Optional[FetchBudget], max_bytes: Optional[int]) -> FetchResult:
    """:func:`fetch_to_file` through ``transport`` (the one driver of every scheme)."""
    cfg = config
    transport.check(url)
    budget = budget or FetchBudget(cfg)
    t0 = time.monotonic()
    validator = _read_validator(partial_path) if transport.resumable else None
    budget.saw(validator)  # the version the partial began with: another one now means the object changed
    resumed_from = _size_of(partial_path) if validator else 0
    if on_event is not None:
        on_event(EventKind.FETCH_START, url, resumed_from=resumed_from)
    if cfg.log_opens:
        _gopen_log(url, "open" + (f" from byte {resumed_from}" if resumed_from else ""))
    state = _Attempt(url, partial_path, expected_size, cfg, session, budget, max_bytes)
    own_session = session is None
    try:
        _retry(cfg, url, on_event, budget, _run_attempt, state, transport)
    except BaseException as exc:
        if cfg.log_opens:
            _gopen_log(url, f"failed after {state.received} bytes: {exc}")
        raise
    finally:
        if own_session and state.session is not None:
            state.session.close()
    size = _size_of(partial_path)
    kept = max(0, size - state.received)
    seconds = time.monotonic() - t0
    if on_event is not None:
        on_event(EventKind.FETCH_DONE, url, bytes=state.received, seconds=seconds, resumed_from=kept)
    if cfg.log_opens:
        _gopen_log(url, f"closed: {state.received} bytes in {seconds:.2f}s")
    return FetchResult(url=url, path=partial_path, size=size, bytes=state.received, resumed_from=kept,
                       seconds=seconds, attempts=state.attempts, xxh3_64=state.digest())


def fetch_bytes(url: str, config: Optional[FetchConfig] = None, *, on_event: Optional[EventFn] = None,
                session: Optional[Session] = None, max_bytes: Optional[int] = None) -> bytes:
    """Fetch a small object (e.g. a remote manifest.json) into memory: :func:`fetch_to_file`
    through a temporary file (its arguments, its errors).

    Example:
        >>> fetch_bytes("http://127.0.0.1:8000/manifest.json")  # doctest: +SKIP
        b'{"format": ...'
    """
    with tempfile.TemporaryDirectory(prefix="resumewds-") as d:
        path = os.path.join(d, "object.partial")
        try:
            fetch_to_file(url, path, config=config, on_event=on_event, session=session, max_bytes=max_bytes)
            with open(path, "rb") as f:
                return f.read()
        except CacheError as exc:
            raise CacheError(f"{url}: cannot buffer the download in {d}: {exc}") from exc
        except FetchError:
            raise  # an OSError too (webdataset's type for fetch failures), but not a local one
        except OSError as exc:
            raise CacheError(f"{url}: cannot read back the download from {d}: {exc}") from exc


class RangeSink:
    """Where :func:`fetch_range`'s bytes go: :meth:`write` takes them as they arrive;
    :meth:`wanted` says which to ask for next (a retry asks only for those).

    This one keeps every byte and reports each chunk as progress; a verifying
    sink (:class:`resumewds.cache.SampleSink`) keeps only what matches its digests.

    Example:
        >>> s = RangeSink(10); s.write(10, b"abc"); s.at, s.data()
        (13, b'abc')
    """

    def __init__(self, start: int, budget: Optional[FetchBudget] = None):
        self.at = start
        self.budget = budget
        self._parts: list = []

    def write(self, offset: int, chunk: bytes) -> None:
        """Take ``chunk``, the bytes at ``offset`` (which is :attr:`at`)."""
        self._parts.append(bytes(chunk))
        self.at = offset + len(chunk)
        if self.budget is not None:
            self.budget.progress()

    def wanted(self, end: int) -> Optional[Tuple[int, int]]:
        """The next bytes to ask for, ``(start, stop)`` within ``end``, or None: all in."""
        return (self.at, end) if self.at < end else None

    def restart(self) -> None:
        """A new request starts (a verifying sink drops what it held back)."""

    def end(self) -> None:
        """The range's bytes are all in (a verifying sink checks what is left)."""

    def data(self) -> bytes:
        """Every byte taken, in order."""
        return b"".join(self._parts)


def fetch_range(url: str, start: int, end: int, *, config: Optional[FetchConfig] = None,
                budget: Optional[FetchBudget] = None, session: Optional[Session] = None,
                on_event: Optional[EventFn] = None, sink: Optional[RangeSink] = None) -> bytes:
    """Bytes ``[start, end)`` of ``url`` (http(s) ``Range``, s3 ranged GetObject), retried.

    Every request draws from ``budget``, the shard's one budget.  A response must
    be a 206 of exactly the range asked; a short body is retried from where it stopped.

    Args:
        config, budget, session, on_event: as for :func:`fetch_to_file`.
        sink: where the bytes go (default: a :class:`RangeSink` that keeps them
            all, returned); a retry asks for what ``sink.wanted`` says.

    Returns:
        The bytes (``b""`` when a ``sink`` took them).

    Raises:
        RangeIgnored: a 200, a 416 or another range: read the object whole instead.
        TransientFetchError / PermanentFetchError: as :func:`fetch_to_file`.
        IntegrityError: what the sink raises for bytes that stay wrong.

    Example:
        >>> fetch_range("http://127.0.0.1:8000/a.tar", 0, 512)[:5]   # doctest: +SKIP
        b'./a.t'
    """
    cfg = config or FetchConfig.from_env()
    transport = transport_for(url)
    if not transport.ranged:
        raise RangeIgnored(f"{url}: {transport.name} sources are not read by range", url)
    budget = budget or FetchBudget(cfg)
    out = sink if sink is not None else RangeSink(start, budget)
    own = session is None and transport.name == "http"
    if own:
        from ._http import new_session

        session = new_session()

    def attempt() -> None:
        while True:  # (a verifying sink may ask again for samples that arrived corrupt)
            out.restart()
            want = out.wanted(end)
            if want is None:
                return
            one(*want)

    def one(at: int, stop: int) -> None:
        pace = _Pace(url, cfg, budget, what=f"range {at}-{stop - 1}")
        closer: Any = None
        try:
            chunks, validator, closer = transport.open_range(url, at, stop, session, cfg, pace)
            budget.saw(validator)
            n = at
            for chunk in chunks:
                if n + len(chunk) > stop:
                    raise RangeIgnored(f"{url}: range body longer than the {stop - at} bytes asked for", url, 206)
                pace.tick(len(chunk))
                out.write(n, chunk)
                n += len(chunk)
            if n < stop:
                raise TransientFetchError(f"{url}: short range body: got {n - at} of {stop - at} bytes "
                                          f"(range {at}-{stop - 1})", url, 206)
            out.end()
        except (ResumeWDSError, IntegrityError):
            raise
        except Exception as exc:
            if not transport.maps(exc):
                raise
            raise transport.translate(exc, url) from exc
        finally:
            if closer is not None:
                try:
                    closer.close()
                except Exception:  # pragma: no cover - closing is best effort
                    pass

    try:
        _retry(cfg, url, on_event, budget, attempt)
    finally:
        if own and session is not None:
            session.close()
    return out.data() if sink is None else b""

