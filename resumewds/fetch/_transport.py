"""The transports: one :class:`Transport` per scheme, imported on first use through the registry.

To add one (say ``gs://``): a module whose ``Transport`` subclass writes
the source through ``state``'s sink in :meth:`Transport.attempt`, names its
foreign exceptions in ``catches`` with their rows in ``errors`` (in front of
:data:`~resumewds.fetch._errormap.FETCH_ERRORS`), sets ``TRANSPORT``, and a
``TransportEntry`` in :data:`resumewds.fetch._schemes.TRANSPORTS`.

Example:
    >>> transport_for("https://h/a.tar").name
    'http'
"""

from __future__ import annotations

import http.client
import subprocess
from typing import TYPE_CHECKING, Any, Iterator, Optional, Tuple

from ..errors import PermanentFetchError, RangeIgnored, ResumeWDSError
from ._errormap import FETCH_ERRORS, ErrorRule, TypeRef, _SinkError, resolve_types, translate
from ._schemes import TRANSPORTS, scheme_of

if TYPE_CHECKING:
    from ._attempt import _Attempt


#: what an attempt of the built-in transports may raise that the error map translates
DEFAULT_CATCHES: Tuple[TypeRef, ...] = (
    "urllib3.exceptions.HTTPError", http.client.HTTPException,
    OSError, subprocess.SubprocessError, _SinkError,
)


class Transport:
    """Reads one kind of source into the partial file, one attempt at a time.

    Attributes:
        resumable: a partial file with a validator sidecar is resumed from;
            else every attempt starts from zero.
        catches: the foreign exceptions an attempt may raise, translated by
            ``errors``; anything else propagates as it is (a bug).
        errors: the transport's error map (first match wins).
    """

    name: str = "?"
    resumable: bool = False
    #: it serves byte ranges (:meth:`open_range`): a shard with per-sample digests is
    #: then read by verified ranges and downloaded in sample-aligned pieces
    ranged: bool = False
    catches: Tuple[TypeRef, ...] = DEFAULT_CATCHES
    errors: Tuple[ErrorRule, ...] = FETCH_ERRORS

    def check(self, url: str) -> None:
        """Refuse (PermanentFetchError) a url this transport cannot read, before any attempt or event."""

    def attempt(self, state: _Attempt) -> None:
        """One attempt: write what is missing of ``state.url`` into ``state.path``."""
        raise NotImplementedError

    def open_range(self, url: str, start: int, end: int, session: Any, config: Any,
                   pace: Any) -> Tuple[Iterator[bytes], Optional[str], Any]:
        """Open bytes ``[start, end)`` of ``url``: ``(chunks, validator, closer)``.

        Raises:
            RangeIgnored: the source answered with something else than that range.
        """
        raise RangeIgnored(f"{url}: {self.name} sources are not read by range", url)

    def maps(self, exc: BaseException) -> bool:
        """Whether ``exc`` is one the error map translates (see ``catches``)."""
        return isinstance(exc, resolve_types(self.catches))

    def translate(self, exc: BaseException, url: str) -> ResumeWDSError:
        """``exc`` as one of ours (:func:`~resumewds.fetch._errormap.translate` by ``errors``)."""
        return translate(exc, url, self.errors)


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
    """One attempt of a whole download; what the transport catches is mapped by its table."""
    state.attempts += 1
    try:
        transport.attempt(state)
    except ResumeWDSError:
        raise
    except Exception as exc:
        if not transport.maps(exc):
            raise
        raise transport.translate(exc, state.url) from exc
