"""URL schemes and the transport registry: one :class:`Transport` per scheme.

:data:`TRANSPORTS` is the one table from a url's scheme to the module whose
``TRANSPORT`` reads it, and what such a source is: the one answer to "is
this url remote?" (:func:`is_remote_url`: downloaded through the cache),
"does it name a remote object?" (:func:`is_remote_object`: joined against,
read by ranges) and "is it a local file?" (:func:`is_local_url`).  A
transport module is imported the first time a url of its scheme is fetched:
``s3`` brings boto3 in only then, and ``http`` imports requests only inside
its first attempt.

To add a transport (say ``gs://``): write ``resumewds/fetch/gs.py`` with a
``Transport`` subclass whose :meth:`Transport.attempt` writes the source
through ``state``'s sink (see :mod:`resumewds.fetch.local`, the shortest;
:mod:`resumewds.fetch.s3` for a ranged resume), name the foreign exceptions
it may raise in ``catches`` and put rows for them in front of
:data:`~resumewds.fetch.errormap.FETCH_ERRORS` in ``errors``, set
``TRANSPORT = GsTransport()``, and add ``"gs": TransportEntry(
"resumewds.fetch.gs", remote=True)`` below.  Budget, retries, events, the
partial file, hashing and the gopen log come with it.

Example:
    >>> scheme_of("/data/a.tar"), scheme_of("pipe:cat a.tar"), scheme_of("s3://b/a.tar")
    ('local', 'pipe', 's3')
    >>> is_remote_url("https://h/a.tar"), is_remote_url("file:///d/a.tar"), is_remote_url("gs://b/a")
    (True, False, False)
    >>> is_remote_url("pipe:cat a.tar"), is_remote_object("pipe:cat a.tar"), is_local_url("/d/a.tar")
    (True, False, True)
    >>> transport_for("https://h/a.tar").name
    'http'
"""

from __future__ import annotations

import http.client
import importlib
import re
import subprocess
import urllib.parse
from dataclasses import dataclass
from typing import TYPE_CHECKING, Dict, Optional, Tuple

from ..errors import PermanentFetchError, ResumeWDSError
from .errormap import FETCH_ERRORS, ErrorRule, TypeRef, _SinkError, resolve_types, translate

if TYPE_CHECKING:
    from .attempt import _Attempt


def scheme_of(url: str) -> str:
    """``http``, ``https``, ``file``, ``pipe`` or ``local``; else the raw scheme.

    Example:
        >>> scheme_of("/data/a.tar"), scheme_of("pipe:cat a.tar"), scheme_of("s3://b/a.tar")
        ('local', 'pipe', 's3')
    """
    if url.startswith("pipe:"):
        return "pipe"
    m = re.match(r"^([A-Za-z][A-Za-z0-9+.-]*)://", url)
    if not m:
        return "local"
    return m.group(1).lower()


def local_path(url: str) -> str:
    """The filesystem path of a ``file://`` URL or plain path."""
    if url.startswith("file://"):
        return urllib.parse.unquote(urllib.parse.urlparse(url).path)
    return url


#: what an attempt of the built-in transports may raise that the error map translates
DEFAULT_CATCHES: Tuple[TypeRef, ...] = (
    "requests.exceptions.RequestException", "urllib3.exceptions.HTTPError", http.client.HTTPException,
    OSError, subprocess.SubprocessError, _SinkError,
)


class Transport:
    """Reads one kind of source into the partial file, one attempt at a time.

    Attributes:
        name: for messages and tests.
        resumable: a partial file with a validator sidecar is resumed from
            (the ``resumed_from`` of ``fetch_start``); else every attempt
            starts from zero.
        catches: the foreign exceptions an attempt may raise, translated by
            ``errors``; anything else propagates as it is (a bug).
        errors: the transport's error map (first match wins).
    """

    name: str = "?"
    resumable: bool = False
    catches: Tuple[TypeRef, ...] = DEFAULT_CATCHES
    errors: Tuple[ErrorRule, ...] = FETCH_ERRORS

    def check(self, url: str) -> None:
        """Refuse (:class:`~resumewds.errors.PermanentFetchError`) a url this
        transport cannot read, before any attempt or event."""

    def attempt(self, state: _Attempt) -> None:
        """One attempt: write what is missing of ``state.url`` into ``state.path``."""
        raise NotImplementedError

    def maps(self, exc: BaseException) -> bool:
        """Whether ``exc`` is one the error map translates (see ``catches``)."""
        return isinstance(exc, resolve_types(self.catches))

    def translate(self, exc: BaseException, url: str) -> ResumeWDSError:
        """``exc`` as one of ours (:func:`~resumewds.fetch.errormap.translate` by ``errors``)."""
        return translate(exc, url, self.errors)


@dataclass
class TransportEntry:
    """Where the transport of a scheme lives (``module.TRANSPORT``, imported
    on first use) and what its sources are.

    Attributes:
        module: the module whose ``TRANSPORT`` reads the scheme.
        remote: its sources must be downloaded (into the cache) to be read.
        located: its urls name one remote object (host or bucket, then a
            path): a relative name is joined against them and a byte range
            of them can be asked for; a ``pipe:`` command is remote but not
            located.
    """

    module: str
    remote: bool
    located: bool = False
    loaded: Optional[Transport] = None

    def load(self) -> Transport:
        if self.loaded is None:
            self.loaded = importlib.import_module(self.module).TRANSPORT
        return self.loaded


#: scheme -> transport: the one table (``scheme_of`` gives the key)
TRANSPORTS: Dict[str, TransportEntry] = {
    "file": TransportEntry("resumewds.fetch.local", remote=False),
    "local": TransportEntry("resumewds.fetch.local", remote=False),  # a plain path
    "http": TransportEntry("resumewds.fetch.http", remote=True, located=True),
    "https": TransportEntry("resumewds.fetch.http", remote=True, located=True),
    "pipe": TransportEntry("resumewds.fetch.pipe", remote=True),
    "s3": TransportEntry("resumewds.fetch.s3", remote=True, located=True),  # boto3: the optional extra, on first use
}


def is_remote_url(url: str) -> bool:
    """True for sources that must be downloaded: through the cache (http, https, s3, pipe:).

    An unknown scheme (``gs://``) is neither remote nor local: fetching it
    raises, with a hint of how to reach that store.
    """
    entry = TRANSPORTS.get(scheme_of(url))
    return entry is not None and entry.remote


def is_remote_object(url: str) -> bool:
    """True for a url that names one remote object (http, https, s3; not ``pipe:``):
    a manifest's relative names are joined against it, byte ranges of it are read."""
    entry = TRANSPORTS.get(scheme_of(url))
    return entry is not None and entry.located


def is_local_url(url: str) -> bool:
    """True for a plain path or a ``file://`` url: read in place, never cached."""
    entry = TRANSPORTS.get(scheme_of(url))
    return entry is not None and not entry.remote


def transport_for(url: str) -> Transport:
    """The transport that reads ``url``.

    Raises:
        PermanentFetchError: no transport for its scheme.
    """
    scheme = scheme_of(url)
    entry = TRANSPORTS.get(scheme)
    if entry is None:
        raise PermanentFetchError(f"{url}: unsupported URL scheme {scheme!r} (use http, https, s3, file, a path "
                                  "or pipe:)", url)
    return entry.load()


def _run_attempt(state: _Attempt, transport: Transport) -> None:
    """One attempt, drawn from the shared budget; what the transport catches is mapped by its table."""
    budget = state.budget
    if not budget.hold():  # waits while ranged requests of the shard hold the attempts left
        raise budget.exhausted_error(state.url)
    state.attempts += 1
    try:
        transport.attempt(state)
    except ResumeWDSError as exc:
        budget.last_error = exc
        raise
    except Exception as exc:
        if not transport.maps(exc):
            raise
        err = transport.translate(exc, state.url)
        budget.last_error = err
        raise err from exc
    finally:
        budget.spend()  # a whole download's attempt stays used, success or not
    budget.fetched = True
