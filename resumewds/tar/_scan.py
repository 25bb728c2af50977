"""Whole tar archives, walked once: a shard's index, or all of its samples in order.

:func:`scan_file` gives the index a manifest records; :func:`iter_samples_bytes`
and :func:`iter_samples_file` stream every sample, validated as they go.

Example:
    >>> import io, tarfile
    >>> buf = io.BytesIO()
    >>> with tarfile.open(fileobj=buf, mode="w") as t:
    ...     for name, data in [("a.txt", b"hi"), ("a.cls", b"1")]:
    ...         ti = tarfile.TarInfo(name); ti.size = len(data)
    ...         t.addfile(ti, io.BytesIO(data))
    >>> [(s["__key__"], sorted(k for k in s if not k.startswith("__")))
    ...  for s in iter_samples_bytes(buf.getvalue(), "mem.tar")]
    [('a', ['cls', 'txt'])]
"""

from __future__ import annotations

import mmap
import os
from dataclasses import dataclass
from typing import Any, Dict, Iterator, List, Optional, Tuple

import xxhash

from ..errors import ShardFormatError
from ._decompress import decompressed, kind_of_bytes
from ._frame import Buffer, Member, _group, iter_members

__all__ = ["ShardIndex", "iter_samples_bytes", "iter_samples_file", "scan_buffer", "scan_file"]

@dataclass
class ShardIndex:
    """What :func:`scan_file` learns about one shard.

    Attributes:
        size: file size in bytes.
        xxh3_64: hex digest of the whole file.
        offsets: ``samples + 1`` ints; sample i is ``[offsets[i], offsets[i+1])``.
        keys: each sample's ``__key__``.
    """

    size: int
    xxh3_64: str
    offsets: List[int]
    keys: List[str]

    @property
    def samples(self) -> int:
        return len(self.keys)


def scan_buffer(buf: Buffer, shard: str) -> Tuple[List[int], List[str], int]:
    """Index an archive held in ``buf``: ``(offsets, keys, end_of_data)``; ShardFormatError on any malformation."""
    starts: List[int] = []
    keys: List[str] = []
    eoa: List[Optional[int]] = []

    def walk() -> Iterator[Member]:
        eoa.append((yield from iter_members(buf, shard)))

    members = walk()
    last_end = 0
    for key, group in _group(members, shard):
        starts.append(group[0][1].header)
        keys.append(key)
        last_end = group[-1][1].end
    # the end-of-archive marker closes the last sample's range (past trailing skipped entries)
    end = eoa[0] if eoa and eoa[0] is not None else last_end
    return starts + [end], keys, end


def scan_file(path: str, shard: Optional[str] = None) -> ShardIndex:
    """Index a local shard: size, xxh3_64 and each sample's byte range.

    ``shard``: the name in error messages (default: ``path``).  Raises
    ShardFormatError (not a well-formed tar) or OSError.

    Example:
        >>> idx = scan_file("data/shard-000000.tar")
        >>> idx.samples, idx.offsets[:2], idx.keys[0]
        (8, [0, 3584], 's000000_000000')
    """
    name = shard or path
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size == 0:
            raise ShardFormatError(name, 0, "empty file (not a tar archive)")
        kind = kind_of_bytes(f.read(4))
        if kind is None:
            with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
                offsets, keys, _ = scan_buffer(mm, name)
                return ShardIndex(size=size, xxh3_64=xxhash.xxh3_64_hexdigest(mm), offsets=offsets, keys=keys)
    with decompressed(path, kind, name) as (size, digest, mm):  # hashes the compressed file, scans the tar
        try:
            offsets, keys, _ = scan_buffer(mm, name)
        except ShardFormatError as exc:  # say where the offset is: in the decompressed stream
            where = exc.offset if exc.offset is not None else 0
            raise ShardFormatError(name, where, f"{kind}-compressed, but the decompressed data is not a "
                                   f"well-formed tar archive (at byte {where} of it: {exc.problem})") from exc
    return ShardIndex(size=size, xxh3_64=digest, offsets=offsets, keys=keys)


def iter_samples_bytes(data: Buffer, shard: str) -> Iterator[Dict[str, Any]]:
    """Stream the samples of a whole archive held in memory (or an mmap).

    Validated as it goes: a sample is yielded only once the next sample, or
    the end-of-archive marker, proves it complete.
    """
    for key, members in _group(iter_members(data, shard), shard):
        sample: Dict[str, Any] = {"__key__": key, "__url__": shard}
        for ext, m in members:
            sample[ext] = bytes(data[m.data:m.data + m.size])
        yield sample


def iter_samples_file(path: str, shard: Optional[str] = None) -> Iterator[Dict[str, Any]]:
    """Stream the samples of a local archive (memory-mapped)."""
    name = shard or path
    with open(path, "rb") as f:
        if os.fstat(f.fileno()).st_size == 0:
            raise ShardFormatError(name, 0, "empty file (not a tar archive)")
        with mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            yield from iter_samples_bytes(mm, name)
