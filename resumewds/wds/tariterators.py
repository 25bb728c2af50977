"""Streaming tar stages with webdataset's names: ``tarfile_to_samples`` and its parts.

``url_opener`` -> ``tar_file_expander`` -> ``group_by_keys``, as webdataset 1.0.2 runs them, for
generic pipelines; in a :class:`resumewds.DataPipeline` ``tarfile_to_samples(handler=...)`` is
compiled into the plan instead.  Grouping is :mod:`resumewds.tar`'s (byte-compatible).
"""

from __future__ import annotations

import random
import re
import tarfile
from typing import Any, Callable, Dict, Iterable, Iterator, Optional, Tuple, Union

from ..sources import expand_braces, framed_prefix, salvage_shard
from ..tar import split_key
from . import (
    filters,  # noqa: F401  (webdataset's tariterators.filters)
    gopen,  # webdataset's tariterators.gopen is the module
)
from .handlers import reraise_exception

__all__ = ["base_plus_ext", "framed_prefix", "group_by_keys", "meta_prefix", "meta_suffix", "salvage_shard",
           "shardlist", "trace",
           "tar_file_expander", "tar_file_iterator", "tarfile_samples", "tarfile_to_samples", "url_opener",
           "valid_sample"]

ExnHandler = Callable[[BaseException], bool]
#: webdataset's module settings (``trace``: print each member :func:`group_by_keys` groups)
trace = False
meta_prefix = "__"
meta_suffix = "__"


def base_plus_ext(path: str) -> Tuple[Optional[str], Optional[str]]:
    """``(key, extension)`` of a member name, or ``(None, None)``."""
    return split_key(path)


def valid_sample(sample: Optional[Dict[str, Any]]) -> bool:
    """A non-empty dict sample with at least one member (not only dunder keys)."""
    return (sample is not None and isinstance(sample, dict) and len(sample) > 0
            and not sample.get("__bad__", False))


def open_url(url: str) -> Any:
    """A readable binary stream of ``url`` (:func:`resumewds.gopen.gopen`)."""
    return gopen.gopen(url, "rb")


def url_opener(data: Iterable[Dict[str, Any]], handler: ExnHandler = reraise_exception,
               **kw: Any) -> Iterator[Dict[str, Any]]:
    """Add a freshly opened ``stream`` to each ``{"url": ...}`` dict."""
    for sample in data:
        url = sample["url"]
        try:
            sample.update(stream=open_url(url))
            yield sample
        except Exception as exn:
            exn.args = exn.args + (url,)
            if handler(exn):
                continue
            break


def tar_file_iterator(fileobj: Any, skip_meta: Optional[str] = r"__[^/]*__($|/)",
                      handler: ExnHandler = reraise_exception,
                      select_files: Optional[Callable[[str], bool]] = None,
                      rename_files: Optional[Callable[[str], str]] = None) -> Iterator[Dict[str, Any]]:
    """Yield ``{"fname", "data"}`` for each regular member of a tar stream (gzip detected)."""
    stream = tarfile.open(fileobj=fileobj, mode="r|*")
    meta = re.compile(skip_meta) if skip_meta is not None else None
    for tarinfo in stream:
        fname = tarinfo.name
        try:
            if not tarinfo.isreg() or fname is None:
                continue
            if "/" not in fname and fname.startswith("__") and fname.endswith("__"):
                continue
            if meta is not None and meta.match(fname):
                continue
            if rename_files:
                fname = rename_files(fname)
            if select_files is not None and not select_files(fname):
                continue
            data = stream.extractfile(tarinfo).read()  # type: ignore[union-attr]
            yield {"fname": fname, "data": data}
            stream.members = []  # type: ignore[attr-defined]
        except Exception as exn:
            if exn.args:
                exn.args = (f"{exn.args[0]} @ {fileobj}",) + exn.args[1:]
            if handler(exn):
                continue
            break


def tar_file_expander(data: Iterable[Dict[str, Any]], handler: ExnHandler = reraise_exception,
                      select_files: Optional[Callable[[str], bool]] = None,
                      rename_files: Optional[Callable[[str], str]] = None,
                      eof_value: Optional[Any] = {}) -> Iterator[Dict[str, Any]]:  # noqa: B006 (webdataset's)
    """The members of every opened stream, then ``eof_value`` after each shard."""
    for source in data:
        url = source["url"]
        try:
            for sample in tar_file_iterator(source["stream"], handler=handler, select_files=select_files,
                                            rename_files=rename_files):
                sample["__url__"] = url
                if source.get("local_path") is not None:
                    sample["__local_path__"] = source["local_path"]
                yield sample
            if eof_value is not None:
                yield eof_value
        except Exception as exn:
            exn.args = exn.args + (source.get("stream"), url)
            if handler(exn):
                continue
            break
        finally:
            close = getattr(source.get("stream"), "close", None)
            if close is not None:
                close()


def group_by_keys(data: Iterable[Dict[str, Any]],
                  keys: Callable[[str], Tuple[Optional[str], Optional[str]]] = base_plus_ext, lcase: bool = True,
                  suffixes: Optional[Any] = None,
                  handler: ExnHandler = reraise_exception) -> Iterator[Dict[str, Any]]:
    """Group consecutive members with the same key into samples."""
    current: Optional[Dict[str, Any]] = None
    for filesample in data:
        try:
            if not filesample:  # end of a shard: never join samples across shards
                if valid_sample(current):
                    yield current  # type: ignore[misc]
                current = None
                continue
            fname, value = filesample["fname"], filesample["data"]
            prefix, suffix = keys(fname)
            if trace:
                print(prefix, suffix, current.keys() if isinstance(current, dict) else None)
            if prefix is None:
                continue
            if lcase:
                suffix = suffix.lower()  # type: ignore[union-attr]
            if current is None or prefix != current["__key__"]:
                if valid_sample(current):
                    yield current  # type: ignore[misc]
                current = {"__key__": prefix, "__url__": filesample["__url__"]}
                if "__local_path__" in filesample:
                    current["__local_path__"] = filesample["__local_path__"]
            if suffix in current:
                raise ValueError(f"{fname}: duplicate file name in tar file {suffix} {current.keys()}")
            if suffixes is None or suffix in suffixes:
                current[suffix] = value  # type: ignore[index]
        except Exception as exn:
            exn.args = exn.args + (filesample.get("stream"), filesample.get("url"))
            if handler(exn):
                continue
            break
    if valid_sample(current):
        yield current  # type: ignore[misc]


def shardlist(urls: Union[str, Iterable[str]], *, shuffle: bool = False) -> Iterator[Dict[str, str]]:
    """``{"url": ...}`` for each url of a brace pattern or list (webdataset's helper).

    Example:
        >>> [d["url"] for d in shardlist("a-{0..1}.tar")]
        ['a-0.tar', 'a-1.tar']
    """
    out = expand_braces(urls) if isinstance(urls, str) else list(urls)
    if shuffle:
        random.shuffle(out)
    for url in out:
        yield {"url": url}


def tarfile_samples(src: Iterable[Dict[str, Any]], handler: ExnHandler = reraise_exception,
                    select_files: Optional[Callable[[str], bool]] = None,
                    rename_files: Optional[Callable[[str], str]] = None) -> Iterator[Dict[str, Any]]:
    """Samples from a stream of ``{"url": ...}`` dicts (opened, expanded, grouped)."""
    streams = url_opener(src, handler=handler)
    files = tar_file_expander(streams, handler=handler, select_files=select_files, rename_files=rename_files)
    return group_by_keys(files, handler=handler)


class TarfileToSamples:
    """The stage ``tarfile_to_samples(handler=...)`` returns (recognised by DataPipeline)."""

    def __init__(self, handler: ExnHandler = reraise_exception,
                 select_files: Optional[Callable[[str], bool]] = None,
                 rename_files: Optional[Callable[[str], str]] = None):
        self.handler = handler
        self.select_files = select_files
        self.rename_files = rename_files

    def __call__(self, src: Iterable[Dict[str, Any]]) -> Iterator[Dict[str, Any]]:
        return tarfile_samples(src, handler=self.handler, select_files=self.select_files,
                               rename_files=self.rename_files)

    def __repr__(self) -> str:
        return f"tarfile_to_samples(handler={getattr(self.handler, '__name__', self.handler)})"


def tarfile_to_samples(handler: ExnHandler = reraise_exception,
                       select_files: Optional[Callable[[str], bool]] = None,
                       rename_files: Optional[Callable[[str], str]] = None) -> TarfileToSamples:
    """Stage: shard urls in, samples out (see the module docs).

    Example:
        >>> tarfile_to_samples()
        tarfile_to_samples(handler=reraise_exception)
    """
    return TarfileToSamples(handler, select_files, rename_files)
