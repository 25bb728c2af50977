"""Per-shard sample indexes (manifest version 4): the file format, lazy and verified loading.

Each shard's offsets and sample digests live in ``<index_dir>/<index_xxh3_64>.idx``,
loaded when a process first needs them, checked, and kept in a bounded cache
(:class:`IndexSet`).  The file layout and what is checked on load:
docs/DIGESTS.md, "Manifest version 4".  Also here: counts-only shards
(:class:`Counted`, :class:`RecordBook`).

Example:
    >>> buf = encode([0, 1024, 2048], [7, 9], size=3072, xxh3_64="00000000000000ff")
    >>> offsets, digests = decode(buf, "a.idx", samples=2, size=3072, xxh3_64="00000000000000ff")
    >>> list(offsets), list(digests)
    ([0, 1024, 2048], [7, 9])
"""

from __future__ import annotations

import hashlib
import os
import re
import struct
import sys
import threading
from array import array
from collections import OrderedDict
from typing import Any, Dict, Iterator, Optional, Sequence, Tuple

import xxhash

from ..errors import ChecksumMismatch, ShardFormatError, SourceError
from ..redact import cache_key_url
from ..tar import scan_file
from ..tar._decompress import COMPRESSED_SUFFIXES
from ._sampledigests import file_sample_digests

__all__ = ["COMPRESSED", "Counted", "EntryBuilder", "IndexDigests", "IndexOffsets", "IndexRef", "IndexSet", "MAGIC",
           "RecordBook", "decode", "encode", "index_bytes", "index_from_json", "index_name", "index_set_from_json",
           "scan_to_index", "write_index", "write_indexes"]

MAGIC = b"RWDSIDX1"
_HEAD = struct.Struct("<8sQQQQ")
_F_DIGESTS, _F_XXH = 1, 2
#: what a process keeps of loaded indexes at most (bytes), beyond the most recent :data:`KEEP`
BUDGET = 64 << 20
#: the most recently loaded indexes are kept whatever their size (a reader's open shards)
KEEP = 128
#: names of compressed shards (no sample digests: their offsets are in the decompressed tar;
#: resumewds.manifest.COMPRESSED_SUFFIXES)
COMPRESSED = COMPRESSED_SUFFIXES

Arrays = Tuple[array, Optional[array]]


def index_bytes(samples: int, digests: bool) -> int:
    """The size of an index file of ``samples`` samples.

    Example:
        >>> index_bytes(2, True)
        80
    """
    return _HEAD.size + 8 * (samples + 1) + (8 * samples if digests else 0)


def index_name(xxh3_64: str) -> str:
    """The file name of the index whose xxh3_64 is ``xxh3_64``: ``<xxh3_64>.idx``."""
    return f"{xxh3_64}.idx"


def encode(offsets: Sequence[int], digests: Optional[Sequence[int]], size: Optional[int],
           xxh3_64: Optional[str]) -> bytes:
    """One shard's index file: ``samples + 1`` offsets, ``samples`` digests or None."""
    samples = len(offsets) - 1
    flags = (_F_DIGESTS if digests is not None else 0) | (_F_XXH if xxh3_64 is not None else 0)
    head = _HEAD.pack(MAGIC, samples, int(size or 0), int(xxh3_64, 16) if xxh3_64 is not None else 0, flags)
    offs = array("q", (int(x) for x in offsets))
    digs = array("Q", (int(x) for x in digests)) if digests is not None else array("Q")
    if sys.byteorder != "little":  # pragma: no cover - big-endian hosts
        offs.byteswap()
        digs.byteswap()
    return head + offs.tobytes() + digs.tobytes()


def header(buf: bytes, where: str) -> Tuple[int, int, Optional[str], bool]:
    """``(samples, size, xxh3_64 or None, has digests)`` of an index file's bytes (a
    SourceError: not an index file, or of a size its header does not give)."""
    if len(buf) < _HEAD.size or buf[:8] != MAGIC:
        raise SourceError(f"{where}: not a resumewds shard index (bad magic)")
    _, samples, size, xxh, flags = _HEAD.unpack_from(buf)
    digests = bool(flags & _F_DIGESTS)
    if samples > (len(buf) // 8) or len(buf) != index_bytes(samples, digests):
        raise SourceError(f"{where}: index of {samples} samples has {len(buf)} bytes, expected "
                          f"{index_bytes(samples, digests) if samples <= len(buf) // 8 else 'fewer samples'}")
    return samples, size, (format(xxh, "016x") if flags & _F_XXH else None), digests


def decode(buf: bytes, where: str, *, samples: Optional[int] = None, size: Optional[int] = None,
           xxh3_64: Optional[str] = None, bound: Optional[int] = None) -> Arrays:
    """Parse and check an index file: ``(offsets, digests or None)``.

    Args:
        samples, size, xxh3_64: what the manifest says of the shard (None: not checked).
        bound: the offsets' upper bound (None for a compressed shard).

    Raises:
        SourceError: the header disagrees with the manifest's shard, or the
            offsets go backwards or past the shard's end.
    """
    n, hsize, hxxh, has_digests = header(buf, where)
    for what, want, got in (("samples", samples, n), ("size", size, hsize), ("xxh3_64", xxh3_64, hxxh)):
        if want is not None and got is not None and str(want).lower() != str(got).lower():
            raise SourceError(f"{where}: the index is of another shard ({what} {got}, the manifest says {want}): "
                              "a stale index; run `resumewds index` again")
    start = _HEAD.size
    offs = array("q")
    offs.frombytes(buf[start:start + 8 * (n + 1)])
    digs: Optional[array] = None
    if has_digests:
        digs = array("Q")
        digs.frombytes(buf[start + 8 * (n + 1):])
    if sys.byteorder != "little":  # pragma: no cover - big-endian hosts
        offs.byteswap()
        if digs is not None:
            digs.byteswap()
    values = offs.tolist()
    if values and (values[0] < 0 or values != sorted(values) or (bound is not None and values[-1] > bound)):
        raise SourceError(f"{where}: the offsets go backwards, below 0 or past the shard's end ({bound} bytes): "
                          "a damaged index; run `resumewds index` again")
    return offs, digs


def write_index(directory: str, buf: bytes) -> str:
    """Write ``buf`` as ``<directory>/<xxh3_64>.idx`` (atomically; kept if already
    there with that size) and return its xxh3_64: the same index is one file."""
    digest = xxhash.xxh3_64_hexdigest(buf)
    path = os.path.join(directory, index_name(digest))
    try:
        if os.path.getsize(path) == len(buf):
            return digest
    except OSError:
        pass
    os.makedirs(directory, exist_ok=True)
    tmp = f"{path}.tmp.{os.getpid()}.{threading.get_ident()}"
    with open(tmp, "wb") as f:
        f.write(buf)
    os.replace(tmp, path)
    return digest


class IndexSet:
    """The index files of one manifest (a local directory or a remote prefix), loaded
    on demand, checked, and kept within ``budget`` bytes per process (the ``keep``
    most recently loaded whatever their size).  Pickles without what it loaded.
    A remote set reads its files through a store (:meth:`bind`).
    """

    def __init__(self, location: str, digests: bool = True, budget: int = BUDGET, keep: int = KEEP):
        self.location = location
        self.digests = digests
        self.budget = budget
        self.keep = keep
        self.store_args: Optional[Tuple[Any, Dict[str, Any]]] = None
        self._init_runtime()

    def bind(self, store_type: Any, **store_kwargs: Any) -> None:
        """Read remote index files through ``store_type(**store_kwargs)`` (its ``ensure``)."""
        self.store_args = (store_type, store_kwargs)
        self._store: Any = None

    def _init_runtime(self) -> None:
        self._pid = os.getpid()  # a forked child starts its own bookkeeping (its lock may be held)
        self._lock = threading.Lock()
        self._loaded: OrderedDict[int, IndexRef] = OrderedDict()
        self._bytes = 0
        self._store = None

    def __getstate__(self) -> Dict[str, Any]:
        return {k: v for k, v in self.__dict__.items() if k not in ("_pid", "_lock", "_loaded", "_bytes", "_store")}

    def __setstate__(self, st: Dict[str, Any]) -> None:
        self.__dict__.update(st)
        self._init_runtime()

    @property
    def remote(self) -> bool:
        return "://" in self.location and not self.location.startswith("file://")

    def path_of(self, ref: IndexRef) -> str:
        """Where ``ref``'s file is (a path, or a URL)."""
        name = ref.name or index_name(ref.xxh3_64)
        if self.remote:
            return self.location.rstrip("/") + "/" + name
        loc = self.location[7:] if self.location.startswith("file://") else self.location
        return os.path.join(loc, name)

    def _read(self, ref: IndexRef, where: str) -> bytes:
        path = self.path_of(ref)
        if self.remote:
            if self._store is None:
                if self.store_args is None:
                    raise SourceError(f"{where}: a remote index needs a store (IndexSet.bind)")
                store_type, kwargs = self.store_args
                self._store = store_type(**kwargs)
            size = index_bytes(int(ref.shard.samples), self.digests and not ref.shard.compressed)
            path = self._store.ensure(type(ref.shard)(url=path, size=size, xxh3_64=ref.xxh3_64), tar=False)
        try:
            with open(path, "rb") as f:
                return f.read()
        except OSError as exc:
            raise SourceError(f"{where}: cannot read the shard's index {path}: {exc.strerror or exc}; "
                              "run `resumewds index` again (or restore the manifest's index directory)") from exc

    def load(self, ref: IndexRef) -> Arrays:
        """``ref``'s offsets and digests, read and checked now (SourceError: the file is missing,
        damaged, stale or of another shard; FetchError: a remote one could not be fetched)."""
        shard = ref.shard
        where = f"{self.path_of(ref)} (index of {shard.url})"
        buf = self._read(ref, where)
        got = xxhash.xxh3_64_hexdigest(buf)
        if got != ref.xxh3_64:
            raise SourceError(f"{where}: xxh3_64 {got}, the manifest says {ref.xxh3_64}: the index is damaged "
                              "or stale; run `resumewds index` again")
        arrays = decode(buf, where, samples=shard.samples, size=shard.size, xxh3_64=shard.xxh3_64,
                        bound=shard.offset_bound)
        if (arrays[1] is not None) != (self.digests and not shard.compressed):
            raise SourceError(f"{where}: the index {'has' if arrays[1] is not None else 'lacks'} sample digests, "
                              "the manifest says otherwise: a stale index; run `resumewds index` again")
        self._keep(ref, arrays, len(buf))
        return arrays

    def _keep(self, ref: IndexRef, arrays: Arrays, nbytes: int) -> None:
        if self._pid != os.getpid():
            self._init_runtime()
        with self._lock:
            ref.arrays = arrays
            if self._loaded.pop(id(ref), None) is None:
                self._bytes += nbytes
            self._loaded[id(ref)] = ref
            while self._bytes > self.budget and len(self._loaded) > self.keep:
                _, old = self._loaded.popitem(last=False)
                if old.arrays is not None:
                    self._bytes -= _nbytes(old.arrays)
                old.arrays = None

    def loaded(self) -> int:
        """How many indexes this process holds now."""
        return len(self._loaded)


def _nbytes(arrays: Arrays) -> int:
    return _HEAD.size + sum(a.itemsize * len(a) for a in arrays if a is not None)


class IndexRef:
    """One shard's index: its file's xxh3_64 (the name, unless ``name`` is given)
    and, while loaded, its arrays.  Pickles without the arrays."""

    __slots__ = ("set", "xxh3_64", "shard", "arrays", "name")

    def __init__(self, index_set: IndexSet, xxh3_64: str, shard: Any, name: Optional[str] = None):
        self.set, self.xxh3_64, self.shard, self.name = index_set, xxh3_64, shard, name
        self.arrays: Optional[Arrays] = None

    def get(self) -> Arrays:
        a = self.arrays
        return a if a is not None else self.set.load(self)

    def __getstate__(self) -> Any:
        return (self.set, self.xxh3_64, self.shard, self.name)

    def __setstate__(self, st: Any) -> None:
        self.set, self.xxh3_64, self.shard, self.name = st
        self.arrays = None


class IndexOffsets(Sequence[int]):
    """A shard's offsets (``samples + 1``), loaded from its index on first use."""

    __slots__ = ("ref",)
    _part = 0

    def __init__(self, ref: IndexRef):
        self.ref = ref

    def __len__(self) -> int:
        return int(self.ref.shard.samples) + 1 - self._part

    def _array(self) -> array:
        a = self.ref.arrays
        arr = (a if a is not None else self.ref.set.load(self.ref))[self._part]
        assert arr is not None
        return arr

    def __getitem__(self, i: Any) -> Any:
        return self._array()[i]  # a slice is an array, as of inline offsets

    def __iter__(self) -> Iterator[int]:
        return iter(self._array())

    def __getstate__(self) -> Any:
        return self.ref

    def __setstate__(self, ref: Any) -> None:
        self.ref = ref

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.ref.set.path_of(self.ref)!r})"


class IndexDigests(IndexOffsets):
    """A shard's sample digests (``samples``), loaded from its index on first use."""

    __slots__ = ()
    _part = 1


# ---- the manifest format (hooks called from resumewds.manifest) -----------------------

_HEX16 = re.compile("[0-9a-f]{16}").fullmatch
_HEX32 = re.compile("[0-9a-f]{32}").fullmatch


def index_set_from_json(data: Dict[str, Any], location: str, resolve: Any) -> Optional[IndexSet]:
    """A version-4 manifest's ``index_dir`` (validated, resolved), or None."""
    name = data.get("index_dir")
    if name is None:
        return None
    if not isinstance(name, str) or not name:
        raise SourceError(f"{location}: 'index_dir' must be a non-empty string")
    digests = data.get("index_digests", False)
    if not isinstance(digests, bool):
        raise SourceError(f"{location}: 'index_digests' must be true or false, got {digests!r}")
    return IndexSet(resolve(name, location), digests=digests)


def index_from_json(info: Any, d: Any, location: str, iset: Optional[IndexSet]) -> None:
    """A version-4 entry's index file (lazy views of the shard's offsets and
    digests), or, for an entry with ``samples`` and no offsets, its counts-only
    record (:class:`Counted`)."""
    hx = d.get("index_xxh3_64")
    where = f"{location}: shard {d.get('url')}"
    if hx is None:
        if info.samples is not None and info.offsets is None:
            md5 = d.get("md5")
            if md5 is not None and (not isinstance(md5, str) or len(md5) != 32
                                    or md5.strip("0123456789abcdefABCDEF")):
                raise SourceError(f"{where}: 'md5' must be 32 hex digits, got {md5!r}")
            info.index = Counted(location, size=info.size, xxh3_64=info.xxh3_64, md5=md5)
        return
    if not isinstance(hx, str) or _HEX16(hx) is None:
        raise SourceError(f"{where}: 'index_xxh3_64' must be 16 lower-case hex digits, got {hx!r}")
    if iset is None or info.samples is None:
        raise SourceError(f"{where}: 'index_xxh3_64' needs 'index_dir' and 'samples'")
    if info.offsets is not None or info.sample_digests is not None:
        raise SourceError(f"{where}: offsets or sample digests both inline and in an index file")
    ref = IndexRef(iset, hx, info)
    info.index, info.offsets = ref, IndexOffsets(ref)
    if iset.digests and not info.compressed:
        info.sample_digests = IndexDigests(ref)


class EntryBuilder:
    """``json.loads``'s ``object_hook`` for a manifest: each plain, well-formed
    version-4 shard entry (only :attr:`KEYS`) becomes its shard (``make``) as it is
    parsed, so a large manifest never holds a dict per shard; anything else stays
    a dict for :meth:`resumewds.manifest.Manifest.from_json` to check and name.
    :meth:`finish` gives :attr:`iset` the manifest's index directory.
    """

    KEYS = frozenset(("url", "size", "xxh3_64", "samples", "index_xxh3_64"))

    def __init__(self, make: Any, resolve: Any, trusted: bool):
        self.make, self.resolve, self.trusted = make, resolve, trusted
        self.iset = IndexSet("")

    def __call__(self, d: Dict[str, Any]) -> Any:
        if "index_xxh3_64" not in d or not d.keys() <= self.KEYS:
            return d
        url, size, xxh, samples, hx = d.get("url"), d.get("size"), d.get("xxh3_64"), d.get("samples"), \
            d.get("index_xxh3_64")
        if (type(url) is not str or not url or type(size) is not int or type(samples) is not int
                or not 0 <= size < 1 << 63 or not 0 <= samples < 1 << 63 or type(xxh) is not str
                or type(hx) is not str or _HEX32(xxh + hx) is None):
            return d
        url = self.resolve(url)
        info = self.make(url=url, size=size, xxh3_64=xxh, samples=samples,
                         trusted=self.trusted or not url.startswith("pipe:"))
        ref = IndexRef(self.iset, hx, info)
        info.index, info.offsets = ref, IndexOffsets(ref)
        return info

    def finish(self, shards: Sequence[Any], found: Optional[IndexSet], where: str) -> None:
        """Give :attr:`iset` the manifest's index directory and digests (``found``),
        and the built ``shards`` their digests' views.

        Raises:
            SourceError: shards with an index file but no ``index_dir``.
        """
        if found is None:
            raise SourceError(f"{where}: 'index_xxh3_64' needs 'index_dir' and 'samples'")
        self.iset.location, self.iset.digests = found.location, found.digests
        if found.digests:
            for info in shards:
                if info.index is not None and info.index.set is self.iset and not info.compressed:
                    info.sample_digests = IndexDigests(info.index)


def write_indexes(shards: Sequence[Any], directory: str, digests: bool = True) -> Tuple[str, bool, list]:
    """Write each indexed shard's index file into ``directory`` (version 4), with
    sample digests when ``digests`` and every plain-tar shard has them.

    Returns:
        ``(the directory's name, digests written, each shard's index xxh3_64 or None)``.
    """
    with_digests = digests and all(s.sample_digests is not None for s in shards
                                   if s.offsets is not None and not s.compressed)
    names: list = []
    for s in shards:
        if s.offsets is None:
            names.append(None)
            continue
        ref = s.index if isinstance(s.index, IndexRef) else None
        if (ref is not None and ref.name is None and ref.set.digests == with_digests and not ref.set.remote
                and os.path.abspath(ref.set.location) == os.path.abspath(directory)
                and os.path.exists(ref.set.path_of(ref))):
            names.append(ref.xxh3_64)  # already there
            continue
        dig = s.sample_digests if with_digests and not s.compressed else None
        names.append(write_index(directory, encode(s.offsets, dig, s.size, s.xxh3_64)))
    return os.path.basename(directory), with_digests, names


# ---- shards known by their counts only (a wids index, img2dataset's stats) --------------

class Counted:
    """What a counts-only source declared of a shard (its ``ShardInfo.index`` until
    its :class:`RecordBook` records it): size and checksums (None: not declared)."""

    __slots__ = ("book", "size", "xxh3_64", "md5", "source")

    def __init__(self, source: str, size: Optional[int] = None, xxh3_64: Optional[str] = None,
                 md5: Optional[str] = None, book: Optional[RecordBook] = None):
        self.source, self.size, self.xxh3_64, self.md5, self.book = source, size, xxh3_64, md5, book

    def __getstate__(self) -> Any:
        return (self.source, self.size, self.xxh3_64, self.md5, self.book)

    def __setstate__(self, st: Any) -> None:
        self.source, self.size, self.xxh3_64, self.md5, self.book = st


class RecordBook:
    """The records of counts-only shards: ``<cache_dir>/records/<key>.idx`` (an
    index file named by the shard's URL), written when a shard is first opened
    (its scan checked against what the source declared) and checked against
    every later copy of it (docs/DIGESTS.md, "Counts-only sources").

    Args:
        store_type, store_kwargs: the store that gives a shard's local copy.
    """

    def __init__(self, store_type: Any, **store_kwargs: Any):
        self.store_args = (store_type, store_kwargs)
        self._init_runtime()

    def _init_runtime(self) -> None:
        self._pid = os.getpid()
        self._lock = threading.Lock()
        self._store: Any = None
        self._set: Optional[IndexSet] = None

    def __getstate__(self) -> Dict[str, Any]:
        return {"store_args": self.store_args}

    def __setstate__(self, st: Dict[str, Any]) -> None:
        self.store_args = st["store_args"]
        self._init_runtime()

    def _ready(self) -> Tuple[Any, IndexSet]:
        if self._store is None or self._set is None:
            store_type, kwargs = self.store_args
            self._store = store_type(**kwargs)
            self._set = IndexSet(os.path.join(self._store.cache_dir, "records"))
        return self._store, self._set

    def record(self, shard: Any) -> None:
        """Give the counts-only ``shard`` its offsets, digests and xxh3_64 from its
        local copy, recorded or checked against its record.

        Raises:
            ShardFormatError: the copy does not hold the samples the source declared.
            ChecksumMismatch: its size or md5 is not the declared one, or it is not
                the shard recorded at its first download.
            FetchError: it could not be fetched.
        """
        if self._pid != os.getpid():  # a forked child: its own lock and store
            self._init_runtime()
        with self._lock:
            if shard.offsets is not None:
                return
            store, iset = self._ready()
            path = store.ensure(shard)
            name = xxhash.xxh3_64_hexdigest(cache_key_url(shard.url).encode()) + ".idx"
            rec_path = os.path.join(iset.location, name)
            where = f"{rec_path} (record of {shard.url})"
            buf = _recorded(rec_path, where, int(shard.samples))
            if buf is not None:
                _, size, xxh, _ = header(buf, where)
                got_size, got = _hash_file(path)
                if (got_size, got) != (size, xxh):
                    raise ChecksumMismatch(
                        f"{shard.url}: not the shard recorded at its first download ({rec_path}): size "
                        f"{got_size}, xxh3_64 {got}; recorded {size}, {xxh} (the data set changed: if that "
                        "is meant, remove the record)", url=shard.url, expected=xxh, actual=got)
            else:
                buf = _scan_record(shard, path)
                size, xxh = header(buf, where)[1:3]
                os.makedirs(iset.location, mode=0o700, exist_ok=True)
                tmp = f"{rec_path}.tmp.{os.getpid()}.{threading.get_ident()}"
                with open(tmp, "wb") as f:
                    f.write(buf)
                os.replace(tmp, rec_path)
            shard.size, shard.xxh3_64 = size, xxh
            arrays = decode(buf, where, samples=shard.samples, size=size, xxh3_64=xxh, bound=shard.offset_bound)
            ref = IndexRef(iset, xxhash.xxh3_64_hexdigest(buf), shard, name=name)
            iset._keep(ref, arrays, len(buf))
            shard.sample_digests = IndexDigests(ref) if arrays[1] is not None else None
            shard.offsets = IndexOffsets(ref)


def _recorded(path: str, where: str, samples: int) -> Optional[bytes]:
    """The record at ``path`` if usable for ``samples`` samples, else None (recorded again)."""
    try:
        with open(path, "rb") as f:
            buf = f.read()
        if header(buf, where)[0] == samples:
            return buf
    except (OSError, SourceError):
        pass
    return None


def _hash_file(path: str) -> Tuple[int, str]:
    h = xxhash.xxh3_64()
    n = 0
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
            n += len(chunk)
    return n, h.hexdigest()


def _scan_record(shard: Any, path: str) -> bytes:
    """A counts-only shard's first record, from its copy at ``path``, checked."""
    counted: Counted = shard.index
    return scan_to_index(path, shard.url, samples=shard.samples, size=counted.size, xxh3_64=counted.xxh3_64,
                         md5=counted.md5, source=counted.source, digests=True)[0]


def scan_to_index(path: str, url: str, *, samples: Optional[int] = None, size: Optional[int] = None,
                  xxh3_64: Optional[str] = None, md5: Optional[str] = None, source: str = "the manifest",
                  digests: bool = True) -> Tuple[bytes, Any]:
    """Scan the local copy ``path`` of shard ``url`` into its index file's bytes,
    checking what a source declared of it.

    Args:
        samples, size, xxh3_64, md5: what the source declared (None: nothing).
        digests: put each sample's xxh3_64 in (not for compressed shards).

    Returns:
        ``(index bytes, the scan: a resumewds.tar._io.ShardIndex)``.

    Raises:
        ShardFormatError: not a tar, or not the declared number of samples.
        ChecksumMismatch: not the declared size, xxh3_64 or md5.
    """
    idx = scan_file(path, url)
    if samples is not None and idx.samples != samples:
        raise ShardFormatError(f"{url}: {source} says it holds {samples} samples, it holds "
                               f"{idx.samples}; fix the source (or index the shards: resumewds index)",
                               shard=url, offset=None, problem="sample count")
    if size is not None and size != idx.size:
        raise ChecksumMismatch(f"{url}: size {idx.size}, {source} says {size}",
                               url=url, expected=str(size), actual=str(idx.size), what="size")
    if xxh3_64 is not None and xxh3_64 != idx.xxh3_64:
        raise ChecksumMismatch(f"{url}: xxh3_64 {idx.xxh3_64}, {source} says {xxh3_64}",
                               url=url, expected=xxh3_64, actual=idx.xxh3_64)
    if md5 is not None:
        h = hashlib.md5()
        with open(path, "rb") as f:
            for chunk in iter(lambda: f.read(1 << 20), b""):
                h.update(chunk)
        if h.hexdigest() != md5.lower():
            raise ChecksumMismatch(f"{url}: md5 {h.hexdigest()}, {source} says {md5}",
                                   url=url, expected=md5, actual=h.hexdigest(), what="md5")
    compressed = url.lower().split("?", 1)[0].endswith(COMPRESSED)
    sample_digests = file_sample_digests(path, idx.offsets) if digests and not compressed else None
    return encode(idx.offsets, sample_digests, idx.size, idx.xxh3_64), idx
