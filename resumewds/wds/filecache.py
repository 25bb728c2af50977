"""webdataset's ``cache`` module API: ``FileCache``, ``StreamingOpen``, ``LRUCleanup`` and helpers.

webdataset 1.0.2's stream openers for a pipeline of your own, reached as
``resumewds.cache.<name>`` (``resumewds.cache`` itself is the engine's verified shard cache).
"""

from __future__ import annotations

import io
import os
import re
import subprocess
import sys
import time
import urllib.parse
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional
from urllib.parse import urlparse

from .. import config
from . import gopen
from .handlers import reraise_exception
from .utils import obsolete

__all__ = ["CacheNameError", "FileCache", "LRUCleanup", "StreamingOpen", "check_tar_format", "default_cache_dir",
           "default_cache_size", "download", "get_filetype", "gopen", "islocal", "magic_filetype", "obsolete",
           "pipe_cleaner", "reraise_exception", "url_to_cache_name", "verbose_cache"]

default_cache_dir: str = config.value("cache_dir") or "./_cache"
default_cache_size: float = float(config.value("cache_size") or 1e18)
verbose_cache: int = int(bool(config.value("verbose_cache")))


class CacheNameError(TypeError, AssertionError):
    """A non-string url of :func:`url_to_cache_name`: a ``TypeError``, and webdataset's ``AssertionError``."""


def islocal(url: str) -> bool:
    """Whether ``url`` names a local file (no scheme, or ``file:``)."""
    return urlparse(url).scheme in ["", "file"]


def get_filetype(fname: str) -> str:
    """The ``file`` command's description of ``fname`` (``OSError``: no ``file`` command)."""
    if not os.path.exists(fname):
        raise FileNotFoundError(fname)
    try:
        subprocess.run(["file", "."], stdout=subprocess.DEVNULL, check=True)
    except (subprocess.SubprocessError, FileNotFoundError):
        raise OSError("UNIX/Linux file command not available") from None
    return subprocess.run(["file", fname], stdout=subprocess.PIPE, text=True, check=True).stdout


def magic_filetype(fname: str) -> str:
    """``"<fname>: gzip compressed data"``, ``"...: POSIX tar archive"`` or ``"...: data"``."""
    with open(fname, "rb") as f:
        header = f.read(512)
    if len(header) >= 2 and header[0:2] == b"\x1f\x8b":
        return f"{fname}: gzip compressed data"
    if len(header) > 261 and header[257:262] == b"ustar":
        return f"{fname}: POSIX tar archive"
    return f"{fname}: data"


def check_tar_format(fname: str) -> bool:
    """Whether ``fname`` looks like a tar archive (or a gzip of one)."""
    if not os.path.exists(fname):
        raise FileNotFoundError(fname)
    ftype = magic_filetype(fname).lower()
    return "tar archive" in ftype or "gzip compressed" in ftype


@obsolete
def pipe_cleaner(spec: str) -> str:
    """The URL inside a ``pipe:`` command (obsolete in webdataset: raises unless ``ALLOW_OBSOLETE=1``)."""
    if spec.startswith("pipe:"):
        for word in spec[5:].split(" "):
            if re.match(r"^(https?|hdfs|gs|ais|s3):", word):
                return word
    return spec


def url_to_cache_name(url: str, ndir: int = 0) -> str:
    """The cache file name of ``url``: its last ``ndir + 1`` path components, else the quoted url."""
    if not isinstance(url, str):
        raise CacheNameError(f"url_to_cache_name needs a string, got {type(url).__name__}")
    parsed = urlparse(url)
    if parsed.scheme in [None, "", "file", "http", "https", "ftp", "ftps", "gs", "s3", "ais"]:
        return "/".join(parsed.path.lstrip("/").split("/")[-1 - ndir:])
    return urllib.parse.quote(url, safe="_+{}*,-")[-128:]


class LRUCleanup:
    """Delete the least recently used files of ``cache_dir`` until it holds at most ``cache_size`` bytes."""

    def __init__(self, cache_dir: Optional[str] = None, cache_size: int = int(1e12),
                 keyfn: Callable[[str], float] = os.path.getctime, verbose: bool = False,
                 interval: Optional[float] = 30):
        self.cache_dir, self.cache_size, self.keyfn = cache_dir, cache_size, keyfn
        self.verbose, self.interval = verbose, interval
        self.last_run = 0.0

    def set_cache_dir(self, cache_dir: str) -> None:
        """Clean ``cache_dir`` from now on."""
        self.cache_dir = cache_dir

    def cleanup(self) -> None:
        """One cleanup pass (nothing if one ran less than ``interval`` s ago)."""
        if self.cache_dir is None or not os.path.exists(self.cache_dir):
            return
        if self.interval is not None and time.time() - self.last_run < self.interval:
            return
        try:
            files: List[str] = []
            for dirpath, _, filenames in os.walk(self.cache_dir):
                files.extend(os.path.join(dirpath, f) for f in filenames)
            total = sum(os.path.getsize(f) for f in files)
            if total <= self.cache_size:
                return
            files.sort(key=self.keyfn, reverse=True)
            while files and total > self.cache_size:
                fname = files.pop()
                total -= os.path.getsize(fname)
                if self.verbose:
                    print(f"# deleting {fname}", file=sys.stderr)
                os.remove(fname)
        except OSError:
            pass
        self.last_run = time.time()


def download(url: str, dest: str, chunk_size: int = 1024 ** 2, verbose: bool = False) -> None:
    """Copy ``url`` to ``dest`` (written under a temporary name, then renamed)."""
    temp = dest + f".temp{os.getpid()}"
    with gopen.gopen(url) as stream, open(temp, "wb") as f:
        while True:
            data = stream.read(chunk_size)
            if not data:
                break
            f.write(data)
    os.rename(temp, dest)


class StreamingOpen:
    """A stage: each url as ``{"url", "stream"}`` (plus ``local_path`` for a local file)."""

    def __init__(self, verbose: bool = False, handler: Callable[[BaseException], bool] = reraise_exception):
        self.verbose, self.handler = verbose, handler

    def __call__(self, urls: Iterable[Any]) -> Iterator[Dict[str, Any]]:
        for url in urls:
            if isinstance(url, dict):
                url = url["url"]
            parsed = urlparse(url)
            try:
                if parsed.scheme in ["", "file"]:
                    yield dict(url=url, stream=open(parsed.path, "rb"), local_path=parsed.path)
                else:
                    yield dict(url=url, stream=gopen.gopen(url))
            except Exception as exn:
                if self.handler(exn):
                    continue
                break


class FileCache:
    """A stage: each url downloaded into ``cache_dir`` (once) and opened from there (retried while ``handler`` says)."""

    def __init__(self, cache_dir: Optional[str] = None, *, url_to_name: Callable[[str], str] = url_to_cache_name,
                 verbose: bool = False, validator: Optional[Callable[[str], bool]] = check_tar_format,
                 handler: Callable[[BaseException], bool] = reraise_exception, cache_size: int = -1,
                 cache_cleanup_interval: int = 30):
        self.url_to_name, self.validator, self.handler = url_to_name, validator, handler
        self.cache_dir = default_cache_dir if cache_dir is None else cache_dir
        self.verbose = verbose
        self.cleaner = LRUCleanup(self.cache_dir, cache_size, verbose=verbose,
                                  interval=cache_cleanup_interval) if cache_size > 0 else None

    def get_file(self, url: str) -> str:
        """The local path of ``url``'s copy (downloaded now if missing; refused by ``validator``: deleted)."""
        if islocal(url):
            return urlparse(url).path
        cache_name = self.url_to_name(url)
        if "/" in cache_name:
            raise ValueError(f"bad cache name {cache_name} for {url}")
        os.makedirs(os.path.join(self.cache_dir, os.path.dirname(cache_name)), exist_ok=True)
        dest = os.path.join(self.cache_dir, cache_name)
        if not os.path.exists(dest):
            if self.verbose:
                print(f"# downloading {url} to {dest}", file=sys.stderr)
            if self.cleaner is not None:
                self.cleaner.cleanup()
            download(url, dest, verbose=self.verbose)
            if self.validator and not self.validator(dest):
                ftype = magic_filetype(dest)
                with open(dest, "rb") as f:
                    data = f.read(200)
                os.remove(dest)
                raise ValueError(f"{dest} ({url}) is not a tar archive, but a {ftype}, contains {data!r}")
        return dest

    def __call__(self, urls: Iterable[Any]) -> Iterator[Dict[str, Any]]:
        for url in urls:
            if isinstance(url, dict):
                url = url["url"]
            delay = 1.0
            for _ in range(10):
                try:
                    dest = self.get_file(url)
                    stream: io.IOBase = open(dest, "rb")
                except Exception as exn:
                    if self.handler(exn):
                        time.sleep(delay)
                        delay *= 1.5
                        continue
                    break
                yield dict(url=url, stream=stream, local_path=dest)
                break
