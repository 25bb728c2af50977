"""Turn what the user passes (paths, URLs, brace patterns, manifests) into a Manifest.

Accepted, alone or in a list: local paths and ``file://`` URLs, ``http(s)://``
and ``s3://`` URLs, ``pipe:CMD``, brace patterns, and ``manifest.json`` files
(local or remote; a remote one may not run ``pipe:`` commands or name local
files without the user's leave).
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, Any, Dict, Iterable, List, Optional, Sequence, Union

from .. import config
from ..cache import ShardStore
from ..errors import SourceError, UnsafeSourceError
from ..events import event_record, setup_logging
from ..fetch import FetchConfig, is_local_url, is_remote_object, is_remote_url
from ..manifest import (
    ArrayFile,
    LazyDigests,
    LazyOffsets,
    Manifest,
    ShardInfo,
    concat,
    load_manifest,
    parse_manifest_bytes,
)
from ._check import CHECK_LIMIT, check_local_shard, warn_duplicate_content
from ._urls import check_source_allowed, expand_braces, rewrite_url

if TYPE_CHECKING:
    from ..manifest import IndexSet, RecordBook

Source = Union[str, os.PathLike, Sequence[Union[str, os.PathLike]], Manifest]


def _normalise(url: str) -> str:
    if is_remote_url(url):
        return url
    if not is_local_url(url):
        scheme = url.split("://", 1)[0]
        from ..fetch import scheme_hint  # lazy: the s3 transport imports urllib3; local sources never do

        raise SourceError(f"{url}: unsupported URL scheme {scheme!r} "
                          "(use a local path, file://, http(s)://, s3:// or pipe:)" + scheme_hint(scheme))
    if url.startswith("file://"):
        url = url[7:]
    return os.path.abspath(os.path.expanduser(url))


def _log_manifest_event(kind: str, url: str, **detail: Any) -> None:
    """Manifest fetches log their retries like shard fetches (nothing else: not a shard)."""
    if kind != "retry":
        return
    setup_logging()
    event_record(kind, url, detail)


def _remote_manifest(url: str, fetch_config: Any, allow_remote_pipe: bool,
                     cache_dir: Optional[str] = None, allow_remote_local: Optional[bool] = None,
                     manifest_max_bytes: Union[int, str, None] = None) -> Manifest:
    from ..fetch import fetch_bytes  # lazy: the download path, for remote manifests only

    cfg = fetch_config or FetchConfig.from_env()
    raw = fetch_bytes(url, cfg, on_event=_log_manifest_event, max_bytes=config.manifest_max_bytes(manifest_max_bytes))
    m = parse_manifest_bytes(raw, url, trusted=allow_remote_pipe)
    # a remote file must not make us read (or reveal the size of) local files
    if not (allow_remote_pipe or config.allow_remote_local(allow_remote_local)):
        sides = [s.offsets.file.path for s in m.shards if isinstance(s.offsets, LazyOffsets)]
        sides += [s.sample_digests.file.path for s in m.shards if isinstance(s.sample_digests, LazyDigests)]
        sides += [iset.location for iset in _index_sets(m)]
        for local in [s.url for s in m.shards] + sides:
            if is_local_url(local):
                raise UnsafeSourceError(
                    f"{url}: manifest fetched over the network names a local file ({local}); refusing to read "
                    "local files for a remote manifest. Pass allow_remote_local=True (--allow-remote-local, "
                    "RESUMEWDS_ALLOW_REMOTE_LOCAL=1) if you trust it")
    sides_by_id: Dict[int, ArrayFile] = {id(s.offsets.file): s.offsets.file for s in m.shards
                                         if isinstance(s.offsets, LazyOffsets)}
    sides_by_id.update({id(s.sample_digests.file): s.sample_digests.file for s in m.shards
                        if isinstance(s.sample_digests, LazyDigests)})  # version 3's digests file
    if sides_by_id:
        # a version-2 manifest's offsets file comes through the verified cache
        store = ShardStore(cache_dir=cache_dir, fetch=cfg)
        for side in sides_by_id.values():
            if is_remote_object(side.path):
                side.path = store.ensure(ShardInfo(url=side.path, size=side.size, xxh3_64=side.xxh3_64), tar=False)
    return bind_indexes(m, cache_dir, cfg)  # version 4's index files come through the verified cache too


def _index_sets(m: Manifest) -> List[IndexSet]:
    """The index file sets of a version-4 manifest's shards."""
    if all(s.index is None for s in m.shards):
        return []
    from ..manifest import IndexRef  # lazy: version 4's index files

    return list({id(s.index.set): s.index.set for s in m.shards if isinstance(s.index, IndexRef)}.values())


def bind_indexes(m: Manifest, cache_dir: Optional[str] = None, fetch_config: Any = None) -> Manifest:
    """Give ``m``'s version-4 index files and counts-only shards their store (``cache_dir``)."""
    kwargs = {"cache_dir": cache_dir, "fetch": fetch_config}
    for iset in _index_sets(m):
        iset.bind(ShardStore, **kwargs)
    book: Optional[RecordBook] = None
    for s in m.shards:
        if s.offsets is None and s.counted is not None:
            from ..manifest import RecordBook  # lazy: counts-only sources

            book = book or RecordBook(ShardStore, **kwargs)
            s.index.book = book
    return m


def resolve_sources(src: Source, *, fetch_config: Any = None, allow_remote_pipe: bool = False,
                    cache_dir: Optional[str] = None, allow_remote_local: Optional[bool] = None,
                    manifest_max_bytes: Union[int, str, None] = None) -> Manifest:
    """Resolve any accepted source into one :class:`Manifest`.

    Shards from plain paths and patterns are not indexed yet (:func:`resumewds.sources.index_manifest`).

    Args:
        fetch_config: for remote manifests (default ``FetchConfig.from_env()``).
        allow_remote_pipe: trust remote manifests: their ``pipe:`` urls may
            run, and they may name local files.
        cache_dir: where a remote manifest's side files and counts-only shards'
            records are kept.
        allow_remote_local: let remote manifests name local files (absolute
            paths, ``file://``); default ``RESUMEWDS_ALLOW_REMOTE_LOCAL``.
        manifest_max_bytes: the largest remote manifest accepted (bytes or
            ``"1GiB"``); default ``RESUMEWDS_MANIFEST_MAX_BYTES``, else 256 MiB.

    Raises:
        SourceError: an empty source list, bad pattern or scheme, bad manifest,
            a directory or an unexpanded glob pattern where a shard should be.
        UnsafeSourceError: a ``pipe:`` url, or a local file, named by a
            manifest fetched over the network, without the user's leave.

    Example:
        >>> len(resolve_sources(["/d/a-{0..2}.tar"]).shards)
        3
    """
    if isinstance(src, Manifest):
        return src
    if isinstance(src, (str, os.PathLike)):
        items: Iterable = [os.fspath(src)]
    else:
        items = [os.fspath(x) for x in src]
    parts: List[Manifest] = []
    loose: List[ShardInfo] = []
    checked = 0  # local paths checked (a directory, an unexpanded glob: sourcecheck's message)

    def flush() -> None:
        if loose:
            parts.append(Manifest(list(loose)))
            loose.clear()

    for item in items:
        if not isinstance(item, str) or not item:
            raise SourceError(f"{item!r}: not a shard URL or path")
        # a pipe: command's braces are expanded as webdataset does, unless they do not pair up
        balanced = item.count("{") == item.count("}")
        urls = expand_braces(item) if not item.startswith("pipe:") or balanced else [item]
        for url in urls:
            url = rewrite_url(url)  # GOPEN_REWRITE and utils.enforce_security, as webdataset's gopen
            check_source_allowed(url)
            if url.split("?", 1)[0].endswith(".json") and not url.startswith("pipe:"):
                flush()
                if is_remote_object(url):
                    parts.append(_remote_manifest(url, fetch_config, allow_remote_pipe, cache_dir,
                                                  allow_remote_local, manifest_max_bytes))
                else:
                    parts.append(load_manifest(_normalise(url)))
            else:
                if checked < CHECK_LIMIT and is_local_url(url) and url != "-":
                    checked += 1
                    check_local_shard(url[7:] if url.startswith("file://") else url)
                loose.append(ShardInfo(url=_normalise(url)))
    flush()
    m = bind_indexes(concat(parts), cache_dir, fetch_config)
    if not m.shards:
        raise SourceError(f"{src!r}: no shards")
    warn_duplicate_content(m.shards)
    for s in m.shards:
        check_source_allowed(s.url)
        if s.url.startswith("pipe:") and not s.trusted:
            raise UnsafeSourceError(
                f"{s.url}: pipe: url comes from a manifest fetched over the network "
                f"({parts and parts[0].source}); it would run a shell command here. "
                "Pass allow_remote_pipe=True (--allow-remote-pipe) if you trust it")
    return m
