"""Per-sample checksums: the arithmetic and the manifest format (version 3).

Each sample's byte range ``[offsets[i], offsets[i+1])`` gets an xxh3_64
digest (seed 0) of exactly those bytes, so a reader can verify one sample
without the rest of its shard, and a repair can re-fetch only the samples
that fail (:mod:`resumewds.repair`).

In the manifest (version 3) the digests are stored one of two ways:

* inline, as one string of 16 lower-case hex digits per sample, in sample
  order (``"sample_xxh3_64": "9f2c...0b11"``, ``16 * samples`` characters).
  Fixed width makes it compact (no per-item JSON quotes or commas: 16
  bytes per sample, an offsets entry costs about as much) and trivial to
  validate (length and alphabet);
* in a side file next to the manifest, as the v2 offsets are: a flat array
  of little-endian uint64, memory-mapped on first use; shard k's digests are
  the ``samples`` values from its ``digests_at``; the manifest records the
  file (``digests_file``) and its size and xxh3_64 (``digests_size``,
  ``digests_xxh3_64``).  ``resumewds index --offsets file`` writes both side
  files.

Compressed shards (``.tar.gz``...) get no sample digests: their ranges are
positions in the decompressed stream, which can be neither read in place
nor fetched by range.

Example:
    >>> ds = sample_digests(b"a" * 1024 + b"b" * 512, [0, 1024, 1536])
    >>> encode_inline(ds) == format(ds[0], "016x") + format(ds[1], "016x")
    True
    >>> list(decode_inline(encode_inline(ds), 2, "m.json: shard a.tar")) == list(ds)
    True
"""

from __future__ import annotations

import os
import sys
from array import array
from dataclasses import dataclass
from typing import Any, Dict, Iterable, List, Optional, Sequence

import xxhash

from . import tario
from .errors import ChecksumMismatch, IntegrityError, SourceError
from .fetch import is_remote_url, local_path
from .manifest import COMPRESSED_SUFFIXES, ArrayFile, view_item

__all__ = ["BadSample", "DigestsFile", "LazyDigests", "add_sample_digests", "bad_samples", "check_results",
           "decode_inline", "echo_range_repairs", "encode_inline", "file_sample_digests", "sample_digests"]

#: hex digits per sample in the inline form
HEX = 16
_HEXCHARS = frozenset("0123456789abcdefABCDEF")
_MAX_ENTRIES = ((1 << 63) - 1) // 8


def sample_digests(buf: Any, offsets: Sequence[int]) -> array:
    """xxh3_64 of each sample's range of ``buf`` (bytes, mmap, memoryview).

    Returns:
        ``array("Q")`` of ``len(offsets) - 1`` digests.
    """
    mv = memoryview(buf)
    out = array("Q")
    for i in range(len(offsets) - 1):
        out.append(xxhash.xxh3_64_intdigest(mv[int(offsets[i]):int(offsets[i + 1])]))
    return out


def file_sample_digests(path: str, offsets: Sequence[int]) -> array:
    """:func:`sample_digests` of a local file (memory-mapped, no copy).

    Ranges past the end of the file hash what is there (a truncated file
    then fails those samples).
    """
    import mmap

    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            return sample_digests(b"", offsets)
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            mv = memoryview(mm)
            try:
                return sample_digests(mv, offsets)
            finally:
                mv.release()


def encode_inline(digests: Iterable[int]) -> str:
    """The inline form: 16 hex digits per sample."""
    return "".join(format(int(d), "016x") for d in digests)


def decode_inline(text: Any, samples: int, where: str) -> array:
    """Parse and validate the inline form.

    Raises:
        SourceError: not a string, wrong length for ``samples``, not hex.
    """
    if not isinstance(text, str):
        raise SourceError(f"{where}: 'sample_xxh3_64' must be a string of hex digits, got "
                          f"{type(text).__name__}")
    if len(text) != HEX * samples:
        raise SourceError(f"{where}: 'sample_xxh3_64' has {len(text)} hex digits, expected "
                          f"{HEX} per sample = {HEX * samples}")
    if not _HEXCHARS.issuperset(text):
        bad = next(j for j, c in enumerate(text) if c not in _HEXCHARS)
        raise SourceError(f"{where}: 'sample_xxh3_64' is not hex (character {bad} is {text[bad]!r})")
    out = array("Q", bytes.fromhex(text))  # 16 hex digits = one big-endian uint64 (checked above: only hex)
    if sys.byteorder == "little":
        out.byteswap()
    return out


class DigestsFile(ArrayFile):
    """The v3 digests side file (``manifest.json.digests``): uint64 sample digests.

    Memory-mapped on first use per process; pickles as its path only.
    """

    typecode = "Q"
    what = "digests"
    empty_ok = True


class LazyDigests(Sequence[int]):
    """One shard's sample digests, read from a :class:`DigestsFile` when indexed."""

    __slots__ = ("file", "start", "length", "where")

    def __init__(self, file: DigestsFile, start: int, count: int, where: str = ""):
        self.file, self.start, self.length, self.where = file, start, count, where

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, i: Any) -> Any:
        view = self.file._map()
        if self.start + self.length > len(view):
            raise SourceError(f"{self.where or self.file.path}: needs digests {self.start}.."
                              f"{self.start + self.length - 1} but {self.file.path} holds {len(view)}")
        return view_item(view, self.start, self.length, i)

    def __getstate__(self) -> Any:
        return (self.file, self.start, self.length, self.where)

    def __setstate__(self, st: Any) -> None:
        self.file, self.start, self.length, self.where = st


# ---- the manifest format (hooks called from resumewds.manifest) -----------------------

def entry_to_json(shard: Any, d: Dict[str, Any], at: Optional[int]) -> None:
    """Add the shard's digests to its JSON entry: inline, or ``digests_at`` (side file)."""
    if shard.sample_digests is None:
        return
    if at is None:
        d["sample_xxh3_64"] = encode_inline(shard.sample_digests)
    else:
        d["digests_at"] = at


def write_side_file(path: str, shards: Sequence[Any]) -> tuple[int, str]:
    """Write every shard's digests (in order) to ``path`` atomically: (size, xxh3_64)."""
    tmp = f"{path}.tmp.{os.getpid()}"
    h = xxhash.xxh3_64()
    with open(tmp, "wb") as f:
        for s in shards:
            if s.sample_digests is None:
                continue
            a = array("Q", (int(x) for x in s.sample_digests))
            if sys.byteorder != "little":  # pragma: no cover
                a.byteswap()
            b = a.tobytes()
            h.update(b)
            f.write(b)
        f.flush()
        os.fsync(f.fileno())
    size = os.path.getsize(tmp)
    os.replace(tmp, path)
    return size, h.hexdigest()


def side_file_from_json(data: Dict[str, Any], location: str, resolve: Any) -> Optional[DigestsFile]:
    """The manifest's ``digests_file`` (validated), or None."""
    name = data.get("digests_file")
    if name is None:
        return None
    if not isinstance(name, str) or not name:
        raise SourceError(f"{location}: 'digests_file' must be a non-empty string")
    side = DigestsFile(resolve(name, location))
    size, xxh = data.get("digests_size"), data.get("digests_xxh3_64")
    if size is not None and (not isinstance(size, int) or isinstance(size, bool) or size < 0 or size % 8):
        raise SourceError(f"{location}: 'digests_size' must be a non-negative multiple of 8, got {size!r}")
    if xxh is not None and (not isinstance(xxh, str) or not xxh or len(xxh) > 64
                            or not _HEXCHARS.issuperset(xxh)):
        raise SourceError(f"{location}: 'digests_xxh3_64' must be a hex digest string")
    side.size, side.xxh3_64 = size, xxh
    return side


def entry_from_json(d: Dict[str, Any], where: str, samples: Optional[int], version: int,
                    side: Optional[DigestsFile]) -> Optional[Sequence[int]]:
    """A shard entry's validated digests (or None); v1/v2 entries have none."""
    inline, at = d.get("sample_xxh3_64"), d.get("digests_at")
    if version < 3 or (inline is None and at is None):
        return None
    if samples is None:
        raise SourceError(f"{where}: sample digests without 'samples'")
    if inline is not None:
        return decode_inline(inline, samples, where)
    if side is None:
        raise SourceError(f"{where}: 'digests_at' needs 'digests_file'")
    if not isinstance(at, int) or isinstance(at, bool) or not 0 <= at <= _MAX_ENTRIES:
        raise SourceError(f"{where}: 'digests_at' must be a non-negative integer, got {at!r}")
    entries = side.entries_on_disk()
    if entries is not None and at + samples > entries:
        raise SourceError(f"{where}: needs digests {at}..{at + samples - 1} but {side.path} holds {entries}")
    return LazyDigests(side, at, samples, where)


# ---- computing and checking ----------------------------------------------------------

def _digestible(shard: Any) -> bool:
    return shard.indexed and not shard.url.lower().endswith(COMPRESSED_SUFFIXES)


def add_sample_digests(manifest: Any, store: Any = None) -> Any:
    """Compute the sample digests of every indexed, uncompressed shard (in place).

    Remote shards are read from the cache (``store``), fetched if needed.

    Example:
        >>> m = build_manifest("data/shard-*.tar")   # doctest: +SKIP
        >>> add_sample_digests(m).shards[0].sample_digests[:1]   # doctest: +SKIP
        array('Q', [11427914338912307203])
    """
    if store is None:
        from .cache import ShardStore  # the default store only: the cache is not loaded for digests alone

        store = ShardStore()
    for s in manifest.shards:
        if s.sample_digests is None and _digestible(s):
            s.sample_digests = file_sample_digests(store.ensure(s), s.offsets)
    return manifest


@dataclass
class BadSample:
    """A sample whose bytes do not match its digest.

    Attributes:
        shard: the shard's url.
        index: the sample's index in the shard.
        key: its ``__key__`` as read from the (bad) bytes, or ``"?"``.
        start, end: its byte range.
        expected, actual: hex digests.
    """

    shard: str
    index: int
    key: str
    start: int
    end: int
    expected: str
    actual: str

    def __str__(self) -> str:
        return (f"{self.shard}: sample {self.index} (key {self.key}, bytes {self.start}-{self.end}) "
                f"xxh3_64 mismatch: expected {self.expected}, got {self.actual}")


def bad_samples(path: str, shard: Any) -> List[BadSample]:
    """The samples of the local copy ``path`` that fail their digests.

    Args:
        path: the file to check (the shard itself, or its cached copy).
        shard: its :class:`~resumewds.manifest.ShardInfo` (with
            ``offsets`` and ``sample_digests``).

    Returns:
        The failing samples, in order (empty if none, or no digests).
    """
    if shard.sample_digests is None or shard.offsets is None:
        return []
    offsets = [int(x) for x in shard.offsets]
    actual = file_sample_digests(path, offsets)
    out: List[BadSample] = []
    for i, (want, got) in enumerate(zip(shard.sample_digests, actual)):
        if int(want) != got:
            out.append(BadSample(shard.url, i, _key_of(path, offsets[i], offsets[i + 1], shard.url),
                                 offsets[i], offsets[i + 1], format(int(want), "016x"), format(got, "016x")))
    return out


def check_samples(path: str, shard: Any, name: Optional[str] = None) -> None:
    """Raise when a sample of ``path`` fails its manifest digest (no-op without digests).

    The rule everywhere: a per-sample digest that does not match means the
    sample is damaged, even when the whole file matches its xxh3_64 (the
    manifest's two checksums disagree).  The store checks it after the
    whole-file hash (``verify="once"`` and ``"always"``, ``resumewds
    verify``); a remote shard's damaged samples are fetched again by range.

    Raises:
        ChecksumMismatch: naming the file, the first failing sample (index,
            key, byte range) and how many fail.
    """
    from .errors import ChecksumMismatch

    bads = bad_samples(path, shard)
    if not bads:
        return
    b = bads[0]
    more = f" ({len(bads)} of {shard.samples} samples fail their digests)" if len(bads) > 1 else ""
    raise ChecksumMismatch(f"{name or path}: sample {b.index} (key {b.key}, bytes {b.start}-{b.end}): xxh3_64 "
                           f"mismatch: expected {b.expected}, got {b.actual}{more}", url=shard.url,
                           expected=b.expected, actual=b.actual)


def index_key(shard: Any) -> str:
    """A fingerprint of what the manifest says of the shard's samples beyond
    its whole-file checksum (their number, the end of the last one, their
    digests; "" without offsets), for the store's "verified" marks: a copy
    checked against another index is not checked against this one.

    Example:
        >>> from resumewds.manifest import ShardInfo
        >>> index_key(ShardInfo(url="a.tar")), index_key(ShardInfo(url="a.tar", samples=1, offsets=[0, 1024]))
        ('', '\\x001\\x001024')
    """
    if shard.offsets is None:
        return ""
    key = f"\0{shard.samples}\0{int(shard.offsets[-1])}"
    d = shard.sample_digests
    if d is None:
        return key
    part = d[:] if not isinstance(d, list) else array("Q", d)
    raw = part.tobytes() if hasattr(part, "tobytes") else bytes(part)
    return key + "\0" + xxhash.xxh3_64_hexdigest(raw)


def check_end(path: str, shard: Any, name: Optional[str] = None) -> None:
    """The manifest's last offset must be the shard's end-of-archive marker.

    A manifest that lists fewer samples than the shard holds (made for a
    subset of it, or for another version of the file) would deliver only
    those samples, silently: with any manifest version it is refused when
    the shard is verified.  Compressed shards (offsets in the decompressed
    tar) are left to their own reader, and the prefix kept of a damaged shard
    under a handler (``salvaged``) ends before the damage by design.

    Raises:
        ShardFormatError: naming the file, the samples listed and where the
            shard goes on.
    """
    from .errors import ShardFormatError
    from .manifest import COMPRESSED_SUFFIXES

    if (shard.offsets is None or getattr(shard, "salvaged", False)  # a damaged shard's prefix (a handler's)
            or shard.url.lower().split("?", 1)[0].endswith(COMPRESSED_SUFFIXES)):
        return
    end = int(shard.offsets[-1])
    with open(path, "rb") as f:
        block = os.pread(f.fileno(), 512, end)
    if len(block) == 512 and block.count(0) != 512:
        raise ShardFormatError(f"{name or path}: the manifest lists {shard.samples} samples, ending at byte {end}, "
                               "but the shard goes on there (no end-of-archive marker): a manifest made for a "
                               "subset or another version of the shard? Index it again (resumewds index) to "
                               "read all of it, or write the subset as its own shard", shard=shard.url)


def check_copy(path: str, shard: Any, emit: Any, discard: bool = False) -> None:
    """What the store checks of a copy whose whole file just passed its
    xxh3_64: that the manifest's samples end at the shard's end
    (:func:`check_end`) and that every sample matches its digest
    (:func:`check_samples`).  On a failure: a ``verify_fail`` event via
    ``emit``, the file removed if ``discard`` (a download), and the error.
    Fetching a remote shard again cannot help: its whole file is the one
    indexed.

    Raises:
        ShardFormatError: the manifest lists fewer samples than the shard holds.
        ChecksumMismatch: a sample fails its digest.
    """
    from .errors import ChecksumMismatch, ShardFormatError
    from .events import EventKind
    from .fetch import is_remote_url

    if shard.offsets is None:
        return
    name = f"{shard.url} ({path})" if is_remote_url(shard.url) else path
    try:
        check_end(path, shard, name)
        if shard.sample_digests is not None:
            check_samples(path, shard, name)
    except (ChecksumMismatch, ShardFormatError) as exc:
        emit(EventKind.VERIFY_FAIL, shard.url, expected=getattr(exc, "expected", None) or "end-of-archive",
             actual=getattr(exc, "actual", None) or "more samples")
        if discard:
            try:
                os.unlink(path)
            except OSError:
                pass
        raise


def _key_of(path: str, start: int, end: int, url: str) -> str:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return "?"
    try:
        return str(tario.read_sample(fd, start, end, url).get("__key__", "?"))
    except Exception:  # the bytes are bad: the key may be unreadable too
        return "?"
    finally:
        os.close(fd)


def check_results(store: Any, results: List[Any], echo: Any) -> List[Any]:
    """``resumewds verify``'s sample check: name the samples that fail their digests.

    For each local shard that failed its whole-file check (or had none),
    hash its samples and call ``echo`` with one ``BAD SAMPLE ...`` line per
    failing sample (shard, sample index, key, byte range).  A shard without
    a whole-file checksum whose samples fail is failed.

    Returns:
        ``results`` with such shards marked failed.
    """
    out = []
    for s, ok, e in results:
        if s.sample_digests is not None and s.offsets is not None and not is_remote_url(s.url) and \
                ((not ok and isinstance(e, ChecksumMismatch)) or (ok and s.xxh3_64 is None)):
            path = local_path(s.url)
            try:
                bads = bad_samples(path, s) if os.path.isfile(path) else []
            except (OSError, ValueError):
                bads = []
            for b in bads:
                echo(f"BAD SAMPLE {b}")
            if bads and ok:
                ok, e = False, IntegrityError(f"{s.url}: {len(bads)} of {s.samples} samples fail their "
                                              f"xxh3_64 digests")
        out.append((s, ok, e))
    return out


def echo_range_repairs(echo: Any) -> Any:
    """An ``on_event`` for :class:`~resumewds.cache.ShardStore` that names, via
    ``echo``, each sample of a cached copy that failed its digest and was
    re-fetched by range (``resumewds verify`` of remote shards)."""
    def on_event(kind: str, url: str, **d: Any) -> None:
        if kind == "range_repair":
            echo(f"BAD SAMPLE {url}: sample {d['sample']} (key {d['key']}, bytes {d['start']}-{d['end']}) "
                 f"in the cached copy: re-fetching its byte range")
        elif kind == "range_repair_done":
            echo(f"repaired {url}: {d['samples']} samples, {d['bytes']} bytes fetched in {d['ranges']} ranges")

    return on_event
