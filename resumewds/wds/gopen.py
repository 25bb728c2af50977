"""webdataset's ``gopen``: open a local path, ``file:`` URL, ``pipe:`` command,
``http(s)://`` or ``s3://`` URL, or ``"-"`` as a binary stream.

This is the opener of the streaming stages (``tarfile_to_samples`` outside
the plan, ``url_opener``) and of user code that calls ``wds.gopen``.  The
plan's reads do not use it: they seek in the verified cache, which fetches
with :mod:`resumewds.fetch` (retries, deadlines, checksums).

Semantics are webdataset 1.0.2's:

* ``mode`` is ``"rb"`` or ``"wb"``; ``"-"`` is stdin / stdout.
* ``GOPEN_REWRITE="prefix1=replacement1;prefix2=replacement2"`` (or ours,
  ``RESUMEWDS_GOPEN_REWRITE``) rewrites the start of a URL first (the
  prefixes are regular expressions, as in webdataset); the first rule that
  changes the URL wins.
* With :data:`resumewds.urls.enforce_security` set, local files,
  ``file:`` URLs, ``pipe:`` commands and ``GOPEN_REWRITE`` are refused with
  :class:`resumewds.urls.EnforcedSecurityError` (a ``ValueError``) and
  webdataset's messages; remote URLs and ``"-"`` still open.
* ``pipe:CMD`` runs CMD in a shell; a non-zero exit status (other than
  141, SIGPIPE after an early close) is an ``OSError`` at end of stream.

Difference: a remote URL is opened lazily, on the first read (webdataset
starts ``curl`` at once and reports its errors on read too); writing to a
remote URL is not supported (``ValueError``).

Example:
    >>> import os, tempfile
    >>> p = os.path.join(tempfile.mkdtemp(), "x.bin")
    >>> with gopen(p, "wb") as f:
    ...     _ = f.write(b"hello")
    >>> with gopen("file://" + p) as f:
    ...     f.read()
    b'hello'
    >>> gopen("pipe:printf hi").read()
    b'hi'
"""

from __future__ import annotations

# The fetch package (tenacity, ~0.1 s) is imported on first use: `import resumewds` loads this module.
import io
import subprocess
import sys
from typing import IO, Any, Callable, Dict, cast
from urllib.parse import urlparse
from urllib.request import url2pathname

from .. import config
from ..urls import check_source_allowed, rewrite_url

__all__ = ["Pipe", "gopen", "gopen_schemes", "reader", "rewrite_url"]


class Pipe(io.RawIOBase):
    """A shell command's stdout (mode ``"rb"``) or stdin (``"wb"``) as a stream.

    A non-zero exit status not in ``ignore_status`` raises ``OSError`` at
    end of stream (reading) or on close.
    """

    def __init__(self, cmd: str, mode: str = "rb", ignore_status: tuple = (141,)):
        super().__init__()
        self.cmd, self.mode, self.ignore_status = cmd, mode, tuple(ignore_status)
        if mode.startswith("r"):
            self.proc = subprocess.Popen(cmd, shell=True, stdout=subprocess.PIPE)
            self.stream = cast(IO[bytes], self.proc.stdout)
        else:
            self.proc = subprocess.Popen(cmd, shell=True, stdin=subprocess.PIPE)
            self.stream = cast(IO[bytes], self.proc.stdin)
        self._checked = False

    def _check(self) -> None:
        if self._checked:
            return
        self._checked = True
        rc = self.proc.wait()
        if rc != 0 and rc not in self.ignore_status and rc != -13:  # -13: killed by SIGPIPE
            raise OSError(f"pipe:{self.cmd}: exit status {rc}")

    def readable(self) -> bool:
        return self.mode.startswith("r")

    def writable(self) -> bool:
        return not self.mode.startswith("r")

    def readinto(self, b: Any) -> int:
        n = self.stream.readinto(b)  # type: ignore[attr-defined]
        if not n:
            self._check()
        return int(n or 0)

    def write(self, b: Any) -> int:
        return self.stream.write(b)

    def close(self) -> None:
        if self.closed:
            return
        try:
            self.stream.close()
            if not self.readable():
                self._check()
            else:
                self.proc.wait()
        finally:
            super().close()


class _LazyRemote(io.RawIOBase):
    """An http(s):// or s3:// body, requested on the first read."""

    def __init__(self, url: str):
        super().__init__()
        self.url = url
        self._body: Any = None

    def readable(self) -> bool:
        return True

    def _open(self) -> Any:
        from ..fetch import FetchConfig  # lazy: fetch (tenacity) on first open

        cfg = FetchConfig.from_env()
        if self.url.startswith("s3://"):
            from ..fetch.s3 import client_for, parse_s3_url  # lazy: fetch (tenacity) on first open

            bucket, key = parse_s3_url(self.url)
            try:
                return client_for(self.url, cfg).get_object(Bucket=bucket, Key=key)["Body"]
            except Exception as exc:
                from ..fetch.s3 import translate_s3_error  # lazy: fetch (tenacity) on first open

                raise translate_s3_error(exc, self.url) from None
        from ..fetch import new_session  # lazy: fetch (tenacity) on first open

        r = new_session().get(self.url, {}, (cfg.connect_timeout, cfg.read_timeout))
        if r.status_code >= 400:
            r.close()
            raise FileNotFoundError(f"{self.url}: HTTP {r.status_code}")
        return r.raw

    def readinto(self, b: Any) -> int:
        if self._body is None:
            self._body = self._open()
        data = self._body.read(len(b))
        n = len(data)
        b[:n] = data
        return n

    def close(self) -> None:
        if self._body is not None and hasattr(self._body, "close"):
            self._body.close()
        super().close()


def gopen(url: str, mode: str = "rb", bufsize: int = 8192, **kw: Any) -> Any:
    """Open ``url`` for reading (``"rb"``) or writing (``"wb"``): webdataset's ``gopen``.

    Args:
        url: a local path, ``file:`` URL, ``pipe:CMD``, ``http(s)://`` or
            ``s3://`` URL, or ``"-"`` (stdin / stdout).
        mode: ``"rb"`` or ``"wb"``.
        bufsize: buffer size of the returned stream (local files use the
            default buffering, as webdataset does).
        **kw: accepted for webdataset compatibility and ignored.

    Returns:
        A binary file-like object.

    Raises:
        ValueError: an unknown mode, or writing to a remote URL.
        EnforcedSecurityError: a local or ``pipe:`` source while
            ``resumewds.utils.enforce_security`` is on.

    Example:
        >>> gopen("pipe:echo hello").read()
        b'hello\\n'
    """
    if mode not in ("rb", "wb"):
        raise ValueError(f"gopen: {url}: unknown mode {mode!r} (use 'rb' or 'wb')")
    if url == "-":
        return sys.stdin.buffer if mode == "rb" else sys.stdout.buffer
    url = rewrite_url(url)
    check_source_allowed(url)
    if config.value("log_opens"):
        print(f"[gopen] {url} open ({mode})", file=sys.stderr, flush=True)
    pr = urlparse(url)
    scheme = "pipe" if url.startswith("pipe:") else pr.scheme
    if scheme == "" or len(scheme) == 1:  # a path (or a Windows drive letter)
        return open(url, mode)
    handler = gopen_schemes.get(scheme, gopen_schemes["__default__"])
    return handler(url, mode, bufsize, **kw)


def gopen_pipe(url: str, mode: str = "rb", bufsize: int = 8192, **kw: Any) -> Any:
    """Open ``pipe:CMD``: CMD's stdout (``"rb"``) or stdin (``"wb"``)."""
    cmd = url[5:] if url.startswith("pipe:") else url
    return io.BufferedReader(Pipe(cmd, mode)) if mode == "rb" else Pipe(cmd, mode)


def gopen_file(url: str, mode: str = "rb", bufsize: int = 8192, **kw: Any) -> Any:
    """Open a ``file:`` URL."""
    return open(url2pathname(urlparse(url).path), mode)


def gopen_remote(url: str, mode: str = "rb", bufsize: int = 8192, **kw: Any) -> Any:
    """Open an ``http(s)://`` or ``s3://`` URL for reading (on its first read)."""
    if mode != "rb":
        raise ValueError(f"gopen: {url}: writing to {urlparse(url).scheme}:// URLs is not supported by resumewds")
    return io.BufferedReader(_LazyRemote(url), buffer_size=max(int(bufsize), 8192))


def gopen_error(url: str, mode: str = "rb", bufsize: int = 8192, **kw: Any) -> Any:
    """The ``__default__`` handler: an unknown scheme is a ``ValueError``."""
    from ..fetch.s3 import scheme_hint  # lazy: fetch (tenacity) on first open

    scheme = urlparse(url).scheme
    raise ValueError(f"gopen: {url}: unsupported URL scheme {scheme!r} "
                     "(use a local path, file:, pipe:, http(s):// or s3://)" + scheme_hint(scheme))


#: webdataset's dispatch table: scheme -> ``handler(url, mode, bufsize, **kw)``; add a scheme
#: here to open it with ``gopen`` (``"__default__"`` handles the unknown ones)
gopen_schemes: Dict[str, Callable[..., Any]] = {
    "__default__": gopen_error,
    "pipe": gopen_pipe,
    "file": gopen_file,
    "http": gopen_remote,
    "https": gopen_remote,
    "s3": gopen_remote,
}


def reader(url: str, **kw: Any) -> Any:
    """``gopen(url, "rb", **kw)``."""
    return gopen(url, "rb", **kw)
