"""One download, start to end: :func:`fetch_to_file` and :func:`fetch_bytes`.

``fetch_to_file(url, partial)`` picks the url's transport
(:func:`~resumewds.fetch.transport.transport_for`), lets it refuse a url it
cannot read, emits ``fetch_start``, and runs attempts under the retry policy
(:func:`~resumewds.fetch.retry._retry`, drawing from the shared
:class:`~resumewds.fetch.FetchBudget`) until one succeeds; it then returns a
:class:`~resumewds.fetch.FetchResult` with the file's xxh3_64 and emits
``fetch_done``.  ``fetch_bytes`` is the same call into a temporary file.

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
from typing import TYPE_CHECKING, Any, Optional

from ..errors import CacheError, FetchError
from ..events import EventKind
from .attempt import _Attempt
from .lite import LiteSession, lite_enabled
from .partial import _read_validator, _size_of
from .retry import FetchBudget, _retry
from .settings import EventFn, FetchConfig, FetchResult
from .transport import Transport, _run_attempt, transport_for

if TYPE_CHECKING:  # requests is imported at the first http(s) fetch
    import requests


def _gopen_log(url: str, what: str) -> None:
    print(f"[gopen] {url} {what}", file=sys.stderr, flush=True)


def fetch_to_file(url: str, partial_path: str, *, expected_size: Optional[int] = None,
                  config: Optional[FetchConfig] = None, on_event: Optional[EventFn] = None,
                  session: Optional[requests.Session] = None, budget: Optional[FetchBudget] = None,
                  max_bytes: Optional[int] = None) -> FetchResult:
    """Download ``url`` into ``partial_path``, resuming what is already there.

    Args:
        url: http(s)://, s3:// (:mod:`resumewds.fetch.s3`), file://, a local path, or ``pipe:CMD``.
        partial_path: destination; bytes already in it are kept when the server
            proves (If-Range, and the validator of the 206) that they belong
            to the same file.  The validator lives in ``partial_path + ".etag"``.
        expected_size: size the finished file must reach, if known.
        config: retry and timeout policy (default :meth:`FetchConfig.from_env`).
        on_event: ``on_event(kind, url, **detail)`` for ``fetch_start``,
            ``fetch_done`` and ``retry``.
        session: a requests Session to use (one is created if None).
        budget: the attempts and deadline to draw from, shared with others
            fetching the same shard for the same read (a fresh one if None).
        max_bytes: refuse (permanently) a source larger than this.

    Returns:
        A :class:`FetchResult` (with the file's xxh3_64).  The file is
        written, not fsynced.

    Raises:
        TransientFetchError: still failing when the budget is spent.
        PermanentFetchError: a status or source that retrying will not fix
            (4xx, a redirect loop, an HTML page for a shard of unknown size,
            more than ``max_bytes``).
        CacheError: ``partial_path`` cannot be written.

    Example:
        >>> fetch_to_file("/data/a.tar", "/tmp/a.partial").size  # doctest: +SKIP
        10240
    """
    cfg = config or FetchConfig.from_env()
    return _download(transport_for(url), url, partial_path, expected_size=expected_size, config=cfg,
                     on_event=on_event, session=session, budget=budget, max_bytes=max_bytes)


def _download(transport: Transport, url: str, partial_path: str, *, expected_size: Optional[int],
              config: FetchConfig, on_event: Optional[EventFn], session: Optional[requests.Session],
              budget: Optional[FetchBudget], max_bytes: Optional[int]) -> FetchResult:
    """:func:`fetch_to_file` through ``transport`` (the one driver of every scheme)."""
    cfg = config
    transport.check(url)
    budget = budget or FetchBudget(cfg)
    t0 = time.monotonic()
    resumed_from = _size_of(partial_path) if transport.resumable and _read_validator(partial_path) else 0
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
    return _fetched(url, partial_path, state, cfg, on_event, t0)


def _fetched(url: str, partial_path: str, state: _Attempt, cfg: FetchConfig,
             on_event: Optional[EventFn], t0: float) -> FetchResult:
    """A finished download's result, its ``fetch_done`` event and gopen line (every transport)."""
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
                session: Optional[requests.Session] = None, max_bytes: Optional[int] = None) -> bytes:
    """Fetch a small object (e.g. a remote manifest.json) into memory.

    The same code as :func:`fetch_to_file` (sources, classification, retry
    budget, stall and rate limits, Range resume within the call), through a
    temporary file.

    Args:
        url: as for :func:`fetch_to_file`.
        config: default :meth:`FetchConfig.from_env`.
        on_event: receives ``retry`` (and ``fetch_start``/``fetch_done``).
        session: a requests Session to use (default: a
            :class:`~resumewds.fetch.lite.LiteSession` for http(s), so that
            a manifest does not wait for requests' import).
        max_bytes: refuse (permanently) anything larger.

    Raises:
        TransientFetchError, PermanentFetchError: as for :func:`fetch_to_file`.

    Example:
        >>> fetch_bytes("http://127.0.0.1:8000/manifest.json")  # doctest: +SKIP
        b'{"format": ...'
    """
    lite: Optional[LiteSession] = None
    use: Any = session
    if session is None and url.lower().startswith(("http://", "https://")) and lite_enabled():
        use = lite = LiteSession()  # a small object: no requests import (resumewds.fetch.lite)
    with tempfile.TemporaryDirectory(prefix="resumewds-") as d:
        path = os.path.join(d, "object.partial")
        try:
            fetch_to_file(url, path, config=config, on_event=on_event, session=use, max_bytes=max_bytes)
            with open(path, "rb") as f:
                return f.read()
        except CacheError as exc:
            raise CacheError(f"{url}: cannot buffer the download in {d}: {exc}") from exc
        except FetchError:
            raise  # an OSError too (webdataset's type for fetch failures), but not a local one
        except OSError as exc:
            raise CacheError(f"{url}: cannot read back the download from {d}: {exc}") from exc
        finally:
            if lite is not None:
                lite.close()

