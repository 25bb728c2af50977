"""ArrayFile: a manifest's binary side file, a flat little-endian array of 8-byte integers."""

from __future__ import annotations

import mmap
import os
import sys
from array import array
from typing import Any, Dict, Iterable, Literal, Optional, Sequence

import xxhash

from ..errors import SourceError

__all__ = ["ArrayFile", "view_item", "write_array_file"]

class ArrayFile:
    """A little-endian file of 8-byte integers, memory-mapped on first use per process
    (a node's processes share one copy in the page cache); pickles as its path only.
    The kinds: ``OffsetsFile`` (int64, version 2), ``DigestsFile`` (uint64, version 3).
    """

    typecode: Literal["q", "Q"] = "q"  #: the array's item type (8 bytes)
    what = "offsets"  #: what the file holds, for error messages
    empty_ok = False  #: an empty file is a valid (empty) array

    def __init__(self, path: str, size: Optional[int] = None, xxh3_64: Optional[str] = None):
        self.path = path
        self.size = size
        self.xxh3_64 = xxh3_64
        self._mm: Any = None
        self._view: Any = None

    def _map(self) -> Any:
        if self._view is None:
            if sys.byteorder != "little":  # pragma: no cover - big-endian hosts
                raise SourceError(f"{self.path}: {self.what} files are little-endian; unsupported on this host")
            try:
                with open(self.path, "rb") as f:
                    if self.empty_ok and os.fstat(f.fileno()).st_size == 0:
                        self._view = memoryview(b"").cast(self.typecode)
                        return self._view
                    self._mm = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            except (OSError, ValueError) as exc:
                raise SourceError(f"{self.path}: cannot read {self.what} file: {exc}") from exc
            if len(self._mm) % 8:
                raise SourceError(f"{self.path}: {self.what} file size {len(self._mm)} is not a multiple of 8")
            self._view = memoryview(self._mm).cast(self.typecode)
        return self._view

    def __len__(self) -> int:
        return len(self._map())

    def entries_on_disk(self) -> Optional[int]:
        """How many 8-byte items the file holds, without mapping it (None: not a local file yet)."""
        if "://" in self.path:
            return None
        try:
            return os.path.getsize(self.path) // 8
        except OSError:
            return None

    def __getstate__(self) -> Dict[str, Any]:
        return {"path": self.path, "size": self.size, "xxh3_64": self.xxh3_64, "_mm": None, "_view": None}


def write_array_file(path: str, parts: Iterable[Optional[Sequence[int]]], typecode: Literal["q", "Q"]
                     ) -> tuple[int, str]:
    """Write the ``parts`` (None: skipped), in order, to ``path`` atomically as one
    little-endian array: ``(size, xxh3_64)`` of the file."""
    tmp = f"{path}.tmp.{os.getpid()}"
    h = xxhash.xxh3_64()
    with open(tmp, "wb") as f:
        for part in parts:
            if part is None:
                continue
            a = array(typecode, (int(x) for x in part))
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


def view_item(view: Any, start: int, length: int, i: Any) -> Any:
    """Item (or slice, as a list) ``i`` of the ``length`` items of ``view`` from ``start``:
    a shard's part of a side file, indexed as a sequence of its own.

    Example:
        >>> view_item([9, 1, 2, 3, 9], 1, 3, -1), view_item([9, 1, 2, 3, 9], 1, 3, slice(0, 2))
        (3, [1, 2])
    """
    if isinstance(i, slice):
        return [view[start + j] for j in range(*i.indices(length))]
    if i < 0:
        i += length
    if not 0 <= i < length:
        raise IndexError(i)
    return view[start + i]
