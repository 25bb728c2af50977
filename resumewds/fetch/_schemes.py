"""Which kind of source a url is: the one table from a url's scheme to its transport.

The package's one answer to "is this url remote?"; it imports no fetch code,
so ``import resumewds`` and :mod:`resumewds.sources` use it at no cost.

Example:
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
    """Where a scheme's transport lives (``module.TRANSPORT``, imported on first use) and what its sources are.

    Attributes:
        remote: its sources are downloaded (into the cache) to be read.
        located: its urls name one remote object: relative names join against
            them and byte ranges of them are read (``pipe:`` is remote, not located).
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
    """True for sources downloaded through the cache (http, https, s3, pipe:); an unknown scheme is neither."""
    entry = TRANSPORTS.get(scheme_of(url))
    return entry is not None and entry.remote


def is_remote_object(url: str) -> bool:
    """True for a url naming one remote object (http, https, s3; not ``pipe:``)."""
    entry = TRANSPORTS.get(scheme_of(url))
    return entry is not None and entry.located


def is_local_url(url: str) -> bool:
    """True for a plain path or a ``file://`` url: read in place, never cached."""
    entry = TRANSPORTS.get(scheme_of(url))
    return entry is not None and not entry.remote
