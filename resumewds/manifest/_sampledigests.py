"""Per-sample checksums: the arithmetic and the manifest format (version 3).

The format: docs/DIGESTS.md, "Manifest version 3".  Here: computing digests,
the inline form, the side file (:class:`DigestsFile`, :class:`LazyDigests`)
and the manifest's hooks to write and read them (example: :mod:`resumewds.sources`).
"""

from __future__ import annotations

import mmap
import os
import sys
from array import array
from typing import Any, Dict, Iterable, Optional, Sequence

import xxhash

from ..errors import SourceError
from ._arrayfile import ArrayFile, view_item, write_array_file

__all__ = ["DigestsFile", "HEX", "LazyDigests", "decode_inline", "encode_inline", "entry_from_json",
           "entry_to_json", "file_sample_digests", "sample_digests", "side_file_from_json", "write_side_file"]

#: hex digits per sample in the inline form
HEX = 16
_HEXCHARS = frozenset("0123456789abcdefABCDEF")
_MAX_ENTRIES = ((1 << 63) - 1) // 8


def sample_digests(buf: Any, offsets: Sequence[int]) -> array:
    """xxh3_64 of each sample's range of ``buf`` (bytes, mmap, memoryview), as an ``array("Q")``."""
    mv = memoryview(buf)
    out = array("Q")
    for i in range(len(offsets) - 1):
        out.append(xxhash.xxh3_64_intdigest(mv[int(offsets[i]):int(offsets[i + 1])]))
    return out


def file_sample_digests(path: str, offsets: Sequence[int]) -> array:
    """:func:`sample_digests` of a local file (memory-mapped; ranges past its end
    hash what is there, so a truncated file fails those samples)."""
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
    """The v3 digests side file (``manifest.json.digests``): uint64 sample digests."""

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
    return write_array_file(path, (s.sample_digests for s in shards), "Q")


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
