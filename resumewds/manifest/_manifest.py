"""Shard descriptions and the versioned manifest format.

A manifest is a JSON file that lists a data set's shards in order, with what
is needed to verify them and to read any sample by seeking (the format:
docs/USAGE.md, "The manifest"): per shard ``url`` (relative to the manifest
when possible), ``size``, ``xxh3_64``, ``samples`` and ``offsets``.

Sample ``i``'s byte range ``[offsets[i], offsets[i+1])`` starts at its first
header block (pax/GNU long-name headers included) and ends after its last
member's padding; entries the grouping skips fall inside the next sample's
range.  ``offsets[-1]`` is the offset of the end-of-archive marker.

Version history (versions 3 and 4: docs/DIGESTS.md):
    1: first version (offsets inline).
    2: optional ``offsets_file`` (a memory-mapped flat array of little-endian
       int64) with ``offsets_at`` per shard: its first of ``samples + 1``.
    3: optional per-sample digests (``sample_xxh3_64`` or ``digests_at``).
    4: optional per-shard index files (``index_dir``, ``index_xxh3_64``) and
       counts-only shards (an optional ``md5``).
A manifest is written at the lowest version that holds it.

Example:
    >>> m = Manifest([ShardInfo(url="/d/a.tar", size=3072, xxh3_64=None,
    ...                          samples=1, offsets=[0, 2048])])
    >>> m.total_samples
    1
"""

from __future__ import annotations

import bisect
import json
import os
import posixpath
import time
import urllib.parse
from array import array
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence

import xxhash

from ..errors import SourceError
from ..fetch import is_remote_object
from ..tar._decompress import COMPRESSED_SUFFIXES
from ._arrayfile import ArrayFile, view_item, write_array_file
from ._sampledigests import entry_from_json, entry_to_json, side_file_from_json, write_side_file

FORMAT = "resumewds.manifest"
VERSION = 4
#: ``offsets="auto"`` writes the offsets inline up to this many samples (a JSON of
#: about 250 kB), and per-shard index files (version 4) above
INLINE_SAMPLES = 10_000


class OffsetsFile(ArrayFile):
    """The v2 offsets side file (``manifest.json.offsets``): int64 sample offsets."""


class LazyOffsets(Sequence[int]):
    """One shard's offsets, read from an :class:`OffsetsFile` when indexed.

    Validated on first use in each process (:func:`validate_offsets`).
    ``len()`` (also ``.length``) is the number of offsets, ``samples + 1``.
    """

    __slots__ = ("file", "start", "length", "size", "where", "_ok")

    def __init__(self, file: OffsetsFile, start: int, count: int, size: Optional[int] = None,
                 where: Optional[str] = None):
        self.file = file
        self.start = start
        self.length = count
        self.size = size
        self.where = where
        self._ok = False

    def __len__(self) -> int:
        return self.length

    def _validate(self) -> Any:
        view = self.file._map()
        where = self.where or f"{self.file.path}: offsets at {self.start}"
        if self.start + self.length > len(view):
            raise SourceError(f"{where}: needs offsets {self.start}..{self.start + self.length - 1} but "
                              f"{self.file.path} holds {len(view)}")
        validate_offsets(view[self.start:self.start + self.length].tolist(), self.length - 1, self.size, where)
        self._ok = True
        return view

    def __getitem__(self, i: Any) -> Any:
        return view_item(self.file._map() if self._ok else self._validate(), self.start, self.length, i)

    def __getstate__(self) -> Any:
        return (self.file, self.start, self.length, self.size, self.where)

    def __setstate__(self, st: Any) -> None:
        self.file, self.start, self.length = st[:3]
        self.size, self.where = (st[3], st[4]) if len(st) > 3 else (None, None)
        self._ok = False


@dataclass
class ShardInfo:
    """One shard: where it is, and (once indexed) what it holds.

    Attributes:
        url: absolute URL or local path (``pipe:`` commands included).
        size: size in bytes, or None if not known yet.
        xxh3_64: expected hex digest, or None if not known.
        samples: number of samples, or None before indexing.
        offsets: ``samples + 1`` byte offsets, or None before indexing.
        trusted: False for a ``pipe:`` URL that came from a remote manifest.
        sample_digests: ``samples`` xxh3_64 ints, one per sample's byte
            range (manifest version 3), or None.
        index_source: the manifest its size, checksum and index came from (named
            in the errors they cause), or None.
        index: the shard's index file (version 4: :class:`resumewds.manifest.IndexRef`), or what a
            counts-only source declared (:class:`~resumewds.manifest.Counted`), or None.
    """

    url: str
    size: Optional[int] = None
    xxh3_64: Optional[str] = None
    samples: Optional[int] = None
    offsets: Optional[Sequence[int]] = None
    trusted: bool = True
    sample_digests: Optional[Sequence[int]] = None
    index_source: Optional[str] = None
    index: Any = field(default=None, repr=False, compare=False)

    @property
    def name(self) -> str:
        """Basename of the URL, as printed by ``resumewds cat``."""
        return shard_basename(self.url)

    @property
    def indexed(self) -> bool:
        return self.samples is not None and self.offsets is not None

    num_samples = property(lambda self: self.samples, doc="The number of samples (``samples``).")

    compressed = property(lambda self: self.url.lower().split("?", 1)[0].endswith(COMPRESSED_SUFFIXES),
                          doc="A ``.tar.gz`` / ``.tar.zst`` shard (offsets in the decompressed tar).")
    offset_bound = property(lambda self: None if self.compressed else self.size,
                            doc="The bound of the offsets: the size, or None for a compressed shard.")
    counted = property(lambda self: _counted(self.index),
                       doc="What a counts-only source declared of it (a :class:`~resumewds.manifest.Counted`), "
                           "or None.")

    def sample_range(self, i: int) -> tuple[int, int]:
        """Byte range ``(start, end)`` of sample ``i`` in this shard (a counts-only shard is
        recorded here the first time: :class:`~resumewds.manifest.RecordBook`)."""
        if self.offsets is None and getattr(self.index, "book", None) is not None:
            self.index.book.record(self)
        if self.offsets is None:
            raise SourceError(f"{self.url}: shard is not indexed")
        return int(self.offsets[i]), int(self.offsets[i + 1])


def shard_basename(url: str) -> str:
    """The last path component of a shard URL (query strings removed).

    Example:
        >>> shard_basename("http://h/x/shard-01.tar?sig=1")
        'shard-01.tar'
        >>> shard_basename("pipe:curl -s http://h/a/b.tar")
        'b.tar'
    """
    u = url
    if u.startswith("pipe:"):
        toks = u[5:].split()
        u = toks[-1] if toks else u
    parsed = urllib.parse.urlparse(u)
    path = parsed.path if parsed.scheme in ("http", "https", "file") else u
    return posixpath.basename(path.rstrip("/")) or u


class Manifest:
    """An ordered list of shards plus prefix sums of their sample counts; ``source``: where
    the manifest came from (for messages), if anywhere.

    Example:
        >>> m = Manifest([ShardInfo("a.tar", samples=2, offsets=[0, 10, 20]),
        ...               ShardInfo("b.tar", samples=3, offsets=[0, 1, 2, 3])])
        >>> m.total_samples, m.locate(3)
        (5, (1, 1))
    """

    def __init__(self, shards: List[ShardInfo], source: Optional[str] = None):
        self.shards = shards
        self.source = source
        self._starts: Optional[array] = None
        if source is not None:
            for s in shards:
                if s.index_source is None and s.indexed:
                    s.index_source = source

    @property
    def indexed(self) -> bool:
        return all(s.indexed for s in self.shards)

    @property
    def counts(self) -> List[int]:
        return [int(s.samples or 0) for s in self.shards]

    @property
    def starts(self) -> array:
        """``starts[i]`` is the global index of shard i's first sample."""
        if self._starts is None:
            a = array("q", [0])
            t = 0
            for s in self.shards:
                if s.samples is None:
                    raise SourceError(f"{s.url}: shard is not indexed")
                t += int(s.samples)
                a.append(t)
            self._starts = a
        return self._starts

    @property
    def total_samples(self) -> int:
        return int(self.starts[-1])

    def locate(self, index: int) -> tuple[int, int]:
        """Map a manifest-order sample index to ``(shard_index, sample_in_shard)``."""
        starts = self.starts
        k = bisect.bisect_right(starts, index) - 1
        return k, index - int(starts[k])

    def digest(self) -> str:
        """A hash of what the manifest says (urls' basenames, sizes, counts), for
        refusing a resume on other data; a data set moved elsewhere still matches."""
        h = xxhash.xxh3_64()
        for s in self.shards:
            c = s.counted or s  # a counts-only shard: what its source said
            h.update(f"{s.name}\0{c.size}\0{c.xxh3_64}\0{s.samples}\n".encode())
        return h.hexdigest()

    def to_json(self, base: Optional[str] = None, offsets_file: Optional[str] = None,
                side_digest: Optional[tuple[int, str]] = None, with_digests: bool = True,
                digests_side: Optional[tuple[int, str]] = None,
                index: Optional[tuple[str, bool, List[Optional[str]]]] = None) -> Dict[str, Any]:
        """The manifest as a JSON-able dict; urls made relative to ``base``.
        The side files named (``offsets_file``, ``index``) are :meth:`save`'s."""
        out = []
        at = 0
        dat: Optional[int] = 0 if offsets_file is not None else None
        for k, s in enumerate(self.shards):
            url = s.url
            if base is not None:
                url = _relative_url(url, base)
            d: Dict[str, Any] = {"url": url, "size": s.size, "xxh3_64": s.xxh3_64, "samples": s.samples}
            if index is not None:
                if index[2][k] is not None:
                    d["index_xxh3_64"] = index[2][k]
                elif (c := s.counted) is not None and c.md5 is not None:
                    d["md5"] = c.md5
                out.append(d)
                continue
            if s.offsets is not None:
                if offsets_file is not None:
                    d["offsets_at"] = at
                    at += len(s.offsets)
                else:
                    d["offsets"] = [int(x) for x in s.offsets]
            if with_digests and s.sample_digests is not None:
                entry_to_json(s, d, dat)
                if dat is not None:
                    dat += len(s.sample_digests)
            out.append(d)
        has_digests = with_digests and any(s.sample_digests is not None for s in self.shards)
        doc: Dict[str, Any] = {
            "format": FORMAT,
            "version": 4 if index is not None else 3 if has_digests else 2 if offsets_file is not None else 1,
            "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        }
        if index is not None:
            doc["index_dir"], doc["index_digests"] = index[0], index[1]
        if offsets_file is not None:
            doc["offsets_file"] = offsets_file
            if side_digest is not None:
                doc["offsets_size"], doc["offsets_xxh3_64"] = side_digest
            if has_digests:
                doc["digests_file"] = offsets_file[:-len(".offsets")] + ".digests" \
                    if offsets_file.endswith(".offsets") else offsets_file + ".digests"
                if digests_side is not None:
                    doc["digests_size"], doc["digests_xxh3_64"] = digests_side
        doc["shards"] = out
        return doc

    def save(self, path: str, offsets: str = "inline", digests: bool = True,
             created: Optional[str] = None) -> str:
        """Write the manifest atomically to ``path`` (urls relative to it).

        Args:
            offsets: ``"inline"`` (version 1), ``"file"`` (version 2: ``<path>.offsets``), ``"index"``
                (version 4: ``<path>.index/``) or ``"auto"`` (inline up to :data:`INLINE_SAMPLES` samples).
            digests: write the shards' sample digests, if any (False: for older readers).
            created: the ``created`` time to write (default: now).

        Returns:
            The form written: ``"inline"``, ``"file"`` or ``"index"``.
        """
        if offsets == "auto":
            offsets = "inline" if sum(int(s.samples or 0) for s in self.shards) <= INLINE_SAMPLES else "index"
        if offsets not in ("inline", "file", "index"):
            raise ValueError(f"offsets must be 'inline', 'file', 'index' or 'auto', got {offsets!r}")
        base = os.path.dirname(os.path.abspath(path))
        side = side_digest = digests_side = None
        index = None
        if offsets == "index":
            from ._shardindex import write_indexes  # lazy: version 4's index files

            index = write_indexes(self.shards, path + ".index", digests)
        if offsets == "file":
            side = os.path.basename(path) + ".offsets"
            side_digest = write_array_file(os.path.join(base, side), (s.offsets for s in self.shards), "q")
        if side is not None and digests and any(s.sample_digests is not None for s in self.shards):
            digests_side = write_side_file(os.path.join(base, os.path.basename(path) + ".digests"), self.shards)
        doc = self.to_json(base=base, offsets_file=side, side_digest=side_digest, with_digests=digests,
                           digests_side=digests_side, index=index)
        if created is not None:
            doc["created"] = created
        data = json.dumps(doc, separators=(",", ":"))
        tmp = f"{path}.tmp.{os.getpid()}"
        with open(tmp, "w") as f:
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        return offsets

    @classmethod
    def from_json(cls, data: Any, location: str, trusted: bool = True, built: Any = None) -> Manifest:
        """Parse a manifest dict; relative urls resolve against ``location``.

        Args:
            trusted: whether ``pipe:`` urls in it may run.
            built: the parser's :class:`resumewds.manifest._shardindex.EntryBuilder`, if it built shards.

        Raises:
            SourceError: wrong format, newer version, or malformed entries.
        """
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            from ._foreignindex import is_stats, is_wids  # lazy: counts-only sources

            if is_wids(data) or is_stats(data, location):
                return cls.from_counts(data, location, trusted)
            raise SourceError(f"{location}: not a resumewds manifest (format field is missing or wrong)")
        version = data.get("version")
        if not isinstance(version, int) or isinstance(version, bool) or version < 1:
            raise SourceError(f"{location}: manifest 'version' must be a positive integer, got {_show(version)}")
        if version > VERSION:
            raise SourceError(f"{location}: manifest version {version!r} is newer than this resumewds "
                              f"understands (max {VERSION}); upgrade resumewds")
        shards = data.get("shards")
        if not isinstance(shards, list):
            raise SourceError(f"{location}: 'shards' must be a list")
        side: Optional[OffsetsFile] = None
        if data.get("offsets_file") is not None:
            if not isinstance(data["offsets_file"], str):
                raise SourceError(f"{location}: 'offsets_file' must be a string")
            side = OffsetsFile(resolve_url(data["offsets_file"], location),
                               _opt_int(data.get("offsets_size"), location, "'offsets_size'"),
                               _opt_hex(data.get("offsets_xxh3_64"), location, "'offsets_xxh3_64'"))
        dside = side_file_from_json(data, location, resolve_url) if version >= 3 else None
        iset = None
        if version >= 4:
            from ._shardindex import index_from_json, index_set_from_json  # lazy: version 4's index files

            iset = index_set_from_json(data, location, resolve_url)
        ready = [d for d in shards if type(d) is ShardInfo] if built is not None else []
        for d in ready if version < 4 else []:  # an index before version 4 means nothing: ignored
            d.index = d.offsets = None
        if ready and version >= 4:
            built.finish(ready, iset, location)
            iset = built.iset
        out: List[ShardInfo] = []
        resolve = built.resolve if built is not None else url_resolver(location)
        for i, d in enumerate(shards):
            if type(d) is ShardInfo:  # built as it was parsed (shardindex.EntryBuilder)
                out.append(d)
                continue
            info = _shard_from_json(d, i, location, side, trusted, resolve)
            if version >= 3 and isinstance(d, dict):
                info.sample_digests = entry_from_json(d, f"{location}: shard {d['url']}", info.samples,
                                                      version, dside)
            if version >= 4:
                index_from_json(info, d, location, iset)
            out.append(info)
        return cls(out, source=location)

    @classmethod
    def from_counts(cls, data: Any, location: str, trusted: bool = True) -> Manifest:
        """A wids shard index or an img2dataset ``*_stats.json`` (:mod:`resumewds.manifest`)
        as a counts-only manifest (:class:`resumewds.manifest.RecordBook`)."""
        from ._foreignindex import is_wids, stats_entry, wids_entries  # lazy: counts-only sources
        from ._shardindex import Counted  # lazy: (the same)

        entries = wids_entries(data, location, resolve_url) if is_wids(data) else [stats_entry(data, location)]
        what = "the wids shard index " + location if is_wids(data) else location
        return cls([ShardInfo(url=e.url, size=e.size, samples=e.samples,
                              trusted=trusted or not e.url.startswith("pipe:"),
                              index=Counted(what, size=e.size, md5=e.md5)) for e in entries], source=location)


#: the largest offset or size a manifest may hold (int64, as in the side file)
MAX_OFFSET = (1 << 63) - 1



def _tar_size_bound(url: str, size: Optional[int]) -> Optional[int]:
    """The bound for a shard's offsets: its size, unless it is a compressed shard."""
    return None if url.lower().endswith(COMPRESSED_SUFFIXES) else size


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _opt_int(v: Any, where: str, what: str) -> Optional[int]:
    if v is None:
        return None
    if not _is_int(v) or not 0 <= v <= MAX_OFFSET:
        raise SourceError(f"{where}: {what} must be a non-negative integer, got {_show(v)}")
    return v


def _opt_hex(v: Any, where: str, what: str) -> Optional[str]:
    if v is None:
        return None
    if not isinstance(v, str) or not v or len(v) > 64 or v.strip("0123456789abcdefABCDEF"):
        raise SourceError(f"{where}: {what} must be a hex digest string, got {_show(v)}")
    return v


def _show(v: Any) -> str:
    r = json.dumps(v) if isinstance(v, (str, int, float, bool, type(None))) else type(v).__name__
    return r if len(r) <= 40 else r[:37] + "..."


def validate_offsets(offsets: Sequence[int], samples: int, size: Optional[int], where: str) -> array:
    """Check one shard's inline offsets; return them as an int64 array.

    Raises:
        SourceError: not a list of ``samples + 1`` integers, negative,
            going backwards, or past the shard's size.

    Example:
        >>> list(validate_offsets([0, 1024, 2048], 2, 3072, "m.json: shard a.tar"))
        [0, 1024, 2048]
        >>> validate_offsets([0, 2048, 1024], 2, None, "m.json: shard a.tar")
        Traceback (most recent call last):
        ...
        resumewds.errors.SourceError: m.json: shard a.tar: offsets go backwards at entry 2 (1024 after 2048)
    """
    if not isinstance(offsets, list):
        raise SourceError(f"{where}: 'offsets' must be a list of integers, got {_show(offsets)}")
    if len(offsets) != samples + 1:
        raise SourceError(f"{where}: offsets has {len(offsets)} entries, expected samples+1 = {samples + 1}")
    # the common case at C speed; anything else gets the loop's message
    if set(map(type, offsets)) <= {int} and (not offsets or offsets[0] >= 0) and sorted(offsets) == offsets:
        last = offsets[-1] if offsets else 0
        if (size is None or last <= size) and last <= MAX_OFFSET:
            return array("q", offsets)
    prev = 0
    for j, v in enumerate(offsets):
        if not _is_int(v):
            raise SourceError(f"{where}: offsets[{j}] is {_show(v)}, not an integer")
        if v < 0:
            raise SourceError(f"{where}: offsets[{j}] is negative ({v})")
        if v < prev:
            raise SourceError(f"{where}: offsets go backwards at entry {j} ({v} after {prev})")
        prev = v
    if size is not None and prev > size:
        raise SourceError(f"{where}: offsets reach byte {prev}, past the shard's size ({size} bytes)")
    if prev > MAX_OFFSET:
        raise SourceError(f"{where}: offsets reach byte {prev}, beyond what any file can hold")
    return array("q", offsets)


def _shard_from_json(d: Any, i: int, location: str, side: Optional[OffsetsFile], trusted: bool,
                     resolve: Callable[[str], str]) -> ShardInfo:
    """One validated ``shards[i]`` entry."""
    if not isinstance(d, dict) or not isinstance(d.get("url"), str) or not d["url"]:
        raise SourceError(f"{location}: shard #{i} has no url")
    where = f"{location}: shard {d['url']}"
    url = resolve(d["url"])
    size = _opt_int(d.get("size"), where, "'size'")
    samples = _opt_int(d.get("samples"), where, "'samples'")
    xxh = _opt_hex(d.get("xxh3_64"), where, "'xxh3_64'")
    offsets: Optional[Sequence[int]] = d.get("offsets")
    if offsets is None and d.get("offsets_at") is not None:
        at = d["offsets_at"]
        if side is None or samples is None:
            raise SourceError(f"{where}: offsets_at needs 'offsets_file' and 'samples'")
        if not _is_int(at) or not 0 <= at <= MAX_OFFSET // 8:
            raise SourceError(f"{where}: 'offsets_at' must be a non-negative integer, got {_show(at)}")
        entries = side.entries_on_disk()
        if entries is not None and at + samples + 1 > entries:
            raise SourceError(f"{where}: needs offsets {at}..{at + samples} but {side.path} holds {entries}")
        offsets = LazyOffsets(side, at, samples + 1, size=_tar_size_bound(url, size), where=where)
    elif offsets is not None:
        if samples is None:
            raise SourceError(f"{where}: 'offsets' without 'samples'")
        offsets = validate_offsets(offsets, samples, _tar_size_bound(url, size), where)
    return ShardInfo(url=url, size=size, xxh3_64=xxh, samples=samples, offsets=offsets,
                     trusted=trusted or not url.startswith("pipe:"))


def resolve_url(url: str, location: str) -> str:
    """Resolve a manifest entry against the manifest's own location.

    Example:
        >>> resolve_url("a.tar", "http://h/d/manifest.json")
        'http://h/d/a.tar'
        >>> resolve_url("a.tar", "/data/manifest.json")
        '/data/a.tar'
        >>> resolve_url("a.tar", "s3://bucket/d/manifest.json")
        's3://bucket/d/a.tar'
        >>> resolve_url("shard #1.tar", "http://h/d/manifest.json")
        'http://h/d/shard%20%231.tar'

    A relative name is a file name: joined to an http(s) location, every
    reserved character but ``/`` is percent-encoded.
    """
    if url.startswith("pipe:") or "://" in url or os.path.isabs(url):
        return url
    if location.startswith("s3://"):  # urljoin does not join s3: join as http, bucket as host
        return "s3://" + urllib.parse.urljoin("http://" + location[5:], url)[7:]
    if is_remote_object(location):
        return urllib.parse.urljoin(location, urllib.parse.quote(url, safe="/"))
    loc = location[7:] if location.startswith("file://") else location
    return os.path.normpath(os.path.join(os.path.dirname(os.path.abspath(loc)), url))


def url_resolver(location: str) -> Callable[[str], str]:
    """:func:`resolve_url` for the many urls of one manifest (the location's part once;
    a plain relative name, no ``.`` or empty segment, joined without parsing it).

    Example:
        >>> [url_resolver("http://h/d/m.json?sig=1")(u) for u in ("a b.tar", "../x.tar")]
        ['http://h/d/a%20b.tar', 'http://h/x.tar']
    """
    head = location.split("#", 1)[0].split("?", 1)[0]
    if location.startswith("s3://") or is_remote_object(location):
        base, quote = head[:head.rindex("/") + 1], not location.startswith("s3://")
    else:
        loc = location[7:] if location.startswith("file://") else location
        base, quote = os.path.join(os.path.dirname(os.path.abspath(loc)), ""), False

    def resolve(url: str) -> str:
        if (url[:1] in ("", ".", "/") or "//" in url or "/." in url or url.endswith("/") or ":" in url
                or (quote and ("?" in url or "#" in url or "%" in url))):
            return resolve_url(url, location)
        return base + (urllib.parse.quote(url, safe="/") if quote else url)

    return resolve


def _counted(index: Any) -> Any:
    """``index`` when it is a counts-only shard's :class:`~resumewds.manifest.Counted`, else None."""
    if index is None:
        return None
    from ._shardindex import Counted  # lazy: indexes and counts-only sources

    return index if isinstance(index, Counted) else None


def _relative_url(url: str, base: str) -> str:
    if url.startswith("pipe:") or "://" in url:
        return url
    try:
        return os.path.relpath(os.path.abspath(url), base)
    except ValueError:
        return url


def parse_manifest_bytes(raw: bytes, location: str, trusted: bool = True) -> Manifest:
    """Parse manifest JSON bytes, with a clear error for bad JSON."""
    built = None
    if (b"index_xxh3_64" if isinstance(raw, (bytes, bytearray)) else "index_xxh3_64") in raw:
        from ._shardindex import EntryBuilder  # lazy: version 4's index files

        built = EntryBuilder(ShardInfo, url_resolver(location), trusted)
    try:
        data = json.loads(raw, object_hook=built)  # plain v4 entries become shards as they are parsed
    except ValueError as exc:
        raise SourceError(f"{location}: manifest is not valid JSON: {exc}") from exc
    except RecursionError:  # "[[[[..." nested past the interpreter's limit
        raise SourceError(f"{location}: manifest is not valid JSON: nested too deeply") from None
    return Manifest.from_json(data, location, trusted=trusted, built=built)


def load_manifest(path: str) -> Manifest:
    """Read a local manifest.json.

    Raises:
        SourceError: the file is missing, not JSON, or not a manifest.
    """
    p = path[7:] if path.startswith("file://") else path
    try:
        with open(p, "rb") as f:
            raw = f.read()
    except OSError as exc:
        raise SourceError(f"{path}: cannot read manifest: {exc.strerror or exc}") from exc
    return parse_manifest_bytes(raw, p)


def concat(manifests: Iterable[Manifest]) -> Manifest:
    """The shards of ``manifests``, in order, as one manifest."""
    return Manifest([s for m in manifests for s in m.shards])
