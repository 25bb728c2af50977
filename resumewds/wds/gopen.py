"""webdataset's ``gopen``: open a local path, ``file:`` URL, ``pipe:`` command,
``http(s)://`` or ``s3://`` URL, or ``"-"`` as a binary stream.

The opener of the streaming stages and of user code (the plan's reads seek in the verified cache),
with webdataset 1.0.2's semantics; differences: docs/COMPAT.md.

Example:
    >>> import os, tempfile
    >>> p = os.path.join(tempfile.mkdtemp(), "x.bin")
    >>> with gopen(p, "wb") as f:
    ...     _ = f.write(b"hello")
    >>> with gopen("file://" + p) as f:
    ...     f.read()
    b'hello'
"""

from __future__ import annotations

# The fetch package (tenacity, ~0.1 s) is imported on first use: `import resumewds` loads this module.
import io
import os
import re
import subprocess
import sys
from subprocess import PIPE
from typing import IO, Any, Callable, Dict, List, Optional, Sequence, cast
from urllib.parse import urlparse
from urllib.request import url2pathname

from .. import config
from ..sources import check_source_allowed, rewrite_url
from . import utils  # noqa: F401  (webdataset's gopen.utils)

__all__ = ["PIPE", "Pipe", "gopen", "gopen_ais", "gopen_curl", "gopen_error", "gopen_file", "gopen_gsutil",
           "gopen_hf", "gopen_htgs", "gopen_pipe", "gopen_remote", "gopen_schemes", "info", "reader",
           "rewrite_url", "set_options"]


#: webdataset's ``gopen.info``: extra context shown in a pipe's exit-status error (yours to fill)
info: Dict[str, Any] = {}


class Pipe(io.RawIOBase):
    """A command's stdout (mode ``"r..."``) or stdin (``"w..."``) as a stream: webdataset's ``Pipe``.

    An exit status other than 0, those in ``ignore_status`` and SIGPIPE raises ``OSError`` at end of
    stream or on close, unless ``ignore_errors``.
    """

    def __init__(self, *args: Any, mode: Optional[str] = None, timeout: float = 7200.0,
                 ignore_errors: bool = False, ignore_status: Sequence[int] = (), **kw: Any):
        super().__init__()
        if not mode or mode[0] not in "rw":
            raise ValueError(f"Pipe {args}: unknown mode {mode!r} (use 'rb' or 'wb')")
        self.mode, self.timeout, self.ignore_errors = mode, timeout, ignore_errors
        self.ignore_status = [0] + list(ignore_status)
        self.args = (args, kw)
        self.status: Optional[int] = None
        popen: Any = subprocess.Popen  # (Popen's overloads do not take *args)
        if mode[0] == "r":
            self.proc = popen(*args, stdout=subprocess.PIPE, **kw)
            self.stream = cast(IO[bytes], self.proc.stdout)
        else:
            self.proc = popen(*args, stdin=subprocess.PIPE, **kw)
            self.stream = cast(IO[bytes], self.proc.stdin)

    def __str__(self) -> str:
        return f"<Pipe {self.args}>"

    def check_status(self) -> None:
        """Check the exit status if the command has ended."""
        if self.proc.poll() is not None:
            self.wait_for_child()

    def wait_for_child(self) -> None:
        """Wait for the command; an exit status not ignored raises ``OSError``."""
        if self.status is not None:
            return
        self.status = self.proc.wait(self.timeout)
        if config.value("log_opens") or int(os.environ.get("GOPEN_VERBOSE", 0) or 0):
            print(f"pipe exit [{self.status} {os.getpid()}:{self.proc.pid}] {self.args} {info}", file=sys.stderr)
        # -13: killed by SIGPIPE (a reader that stopped early)
        if self.status not in self.ignore_status and self.status != -13 and not self.ignore_errors:
            cmd = self.args[0][0] if self.args[0] else self.args
            raise OSError(f"pipe:{cmd if isinstance(cmd, str) else ' '.join(map(str, cmd))}: "
                          f"exit status {self.status}{' ' + str(info) if info else ''}")

    def readable(self) -> bool:
        return self.mode.startswith("r")

    def writable(self) -> bool:
        return not self.mode.startswith("r")

    def readinto(self, b: Any) -> int:
        n = self.stream.readinto(b)  # type: ignore[attr-defined]
        if not n:
            self.wait_for_child()
        return int(n or 0)

    def write(self, b: Any) -> int:
        return self.stream.write(b)

    def close(self) -> None:
        if self.closed:
            return
        try:
            self.stream.close()
            if not self.readable():
                self.wait_for_child()
            else:
                self.proc.wait()
        finally:
            super().close()


def set_options(obj: Any, timeout: Optional[float] = None, ignore_errors: Optional[bool] = None,
                ignore_status: Optional[Sequence[int]] = None, handler: Any = None) -> bool:
    """Change a :class:`Pipe`'s options after ``gopen`` (webdataset's); False for any other stream."""
    if not isinstance(obj, Pipe):
        return False
    if timeout is not None:
        obj.timeout = timeout
    if ignore_errors is not None:
        obj.ignore_errors = ignore_errors
    if ignore_status is not None:
        obj.ignore_status = list(ignore_status)
    if handler is not None:
        obj.handler = handler  # type: ignore[attr-defined]
    return True


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
            from ..fetch import client_for, parse_s3_url  # lazy: fetch (tenacity) on first open

            bucket, key = parse_s3_url(self.url)
            try:
                return client_for(self.url, cfg).get_object(Bucket=bucket, Key=key)["Body"]
            except Exception as exc:
                from ..fetch import translate_s3_error  # lazy: fetch (tenacity) on first open

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

    ``**kw`` is accepted for webdataset compatibility and ignored.

    Raises:
        ValueError: an unknown mode, or writing to a remote URL.
        EnforcedSecurityError: a local or ``pipe:`` source while ``enforce_security`` is on.

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
    """Open ``pipe:CMD``: CMD's stdout (``"rb"``) or stdin (``"wb"``), in a shell."""
    cmd = url[5:] if url.startswith("pipe:") else url
    pipe = Pipe(cmd, mode=mode, shell=True, ignore_status=[141])  # 141: SIGPIPE after an early close
    return io.BufferedReader(pipe) if mode == "rb" else pipe


def _command(args: List[str], mode: str, bufsize: int, read_ok: List[int], write: Optional[List[str]],
             write_ok: List[int]) -> Pipe:
    if mode[0] == "r":
        return Pipe(args, mode=mode, bufsize=bufsize, ignore_status=read_ok)
    if mode[0] == "w" and write is not None:
        return Pipe(write, mode=mode, bufsize=bufsize, ignore_status=write_ok)
    raise ValueError(f"{mode}: {'cannot write' if mode[0] == 'w' else 'unknown mode'}")


def gopen_curl(url: str, mode: str = "rb", bufsize: int = 8192) -> Pipe:
    """Read a URL with ``curl`` (with retries), or write it with ``curl -X PUT`` (webdataset's)."""
    return _command(["curl", "--connect-timeout", "30", "--retry", "30", "--retry-delay", "2", "-f", "-s", "-L",
                     url], mode, bufsize, [141, 23], ["curl", "-f", "-s", "-X", "PUT", "-L", "-T", "-", url],
                    [141, 26])


def gopen_htgs(url: str, mode: str = "rb", bufsize: int = 8192) -> Pipe:
    """Read an ``htgs://`` URL (``gs://`` over http) with ``curl``; it cannot be written."""
    return _command(["curl", "-s", "-L", re.sub(r"(?i)^htgs://", "gs://", url)], mode, bufsize, [141, 23],
                    None, [])


def gopen_hf(url: str, mode: str = "rb", bufsize: int = 8192) -> Pipe:
    """Read an ``hf://`` URL with ``curl`` and your token (needs ``huggingface_hub``)."""
    if mode[0] != "r":
        return _command([], mode, bufsize, [], None, [])
    from huggingface_hub import HfFileSystem, get_token, hf_hub_url  # an optional dependency, as in webdataset

    path: Any = HfFileSystem().resolve_path(url)
    http_url = hf_hub_url(repo_id=path.repo_id, filename=path.path_in_repo, repo_type=path.repo_type,
                          revision=path.revision)
    return _command(["curl", "--connect-timeout", "30", "--retry", "30", "--retry-delay", "2", "-f", "-s", "-L",
                     "-H", f"Authorization:Bearer {get_token()}", http_url], mode, bufsize, [141, 23], None, [])


def gopen_gsutil(url: str, mode: str = "rb", bufsize: int = 8192) -> Pipe:
    """Read (``gsutil cat``) or write (``gsutil cp -``) a ``gs://`` URL."""
    return _command(["gsutil", "cat", url], mode, bufsize, [141, 23], ["gsutil", "cp", "-", url], [141, 26])


def gopen_ais(url: str, mode: str = "rb", bufsize: int = 8192) -> Pipe:
    """Read (``ais get``) or write (``ais put``) an AIStore URL."""
    return _command(["ais", "get", url, "-"], mode, bufsize, [141, 23], ["ais", "put", "-", url], [141, 26])


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
    from ..fetch import scheme_hint  # lazy: fetch (tenacity) on first open

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
    "ais": gopen_ais,
    "sftp": gopen_curl,
    "ftps": gopen_curl,
    "scp": gopen_curl,
    "gs": gopen_gsutil,
    "htgs": gopen_htgs,
    "hf": gopen_hf,
}


def reader(url: str, **kw: Any) -> Any:
    """``gopen(url, "rb", **kw)``."""
    return gopen(url, "rb", **kw)
