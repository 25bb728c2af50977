"""Which kind of source a url is: the one table from a url's scheme to its transport.

:data:`TRANSPORTS` maps each scheme (:func:`scheme_of`) to the module whose
``TRANSPORT`` reads it (:mod:`resumewds.fetch`, imported on first use) and
says what its sources are: remote (downloaded into the cache), located (one
remote object: relative names join against it, byte ranges of it are read).
:func:`is_remote_url`, :func:`is_remote_object` and :func:`is_local_url` are
the package's one answer to "is this url remote?".  Nothing here imports the
fetch package: ``import resumewds`` and the security checks
(:mod:`resumewds.sources`) use it at no cost.

Example:
    >>> scheme_of("/data/a.tar"), scheme_of("pipe:cat a.tar"), scheme_of("s3://b/a.tar")
    ('local', 'pipe', 's3')
    >>> is_remote_url("https://h/a.tar"), is_remote_url("file:///d/a.tar"), is_remote_url("gs://b/a")
    (True, False, False)
    >>> is_remote_url("pipe:cat a.tar"), is_remote_object("pipe:cat a.tar"), is_local_url("/d/a.tar")
    (True, False, True)
"""

from __future__ import annotations

import importlib
import re
import urllib.parse
from dataclasses import dataclass
from typing import Any, Dict, Optional

__all__ = ["TRANSPORTS", "TransportEntry", "is_local_url", "is_remote_object", "is_remote_url", "local_path",
           "scheme_of"]


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
    loaded: Optional[Any] = None  # the Transport, once loaded

    def load(self) -> Any:
        if self.loaded is None:
            self.loaded = importlib.import_module(self.module).TRANSPORT
        return self.loaded


#: scheme -> transport: the one table (``scheme_of`` gives the key)
TRANSPORTS: Dict[str, TransportEntry] = {
    "file": TransportEntry("resumewds.fetch._local", remote=False),
    "local": TransportEntry("resumewds.fetch._local", remote=False),  # a plain path
    "http": TransportEntry("resumewds.fetch._http", remote=True, located=True),
    "https": TransportEntry("resumewds.fetch._http", remote=True, located=True),
    "pipe": TransportEntry("resumewds.fetch._pipe", remote=True),
    "s3": TransportEntry("resumewds.fetch._s3", remote=True, located=True),  # boto3: the optional extra, on first use
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
