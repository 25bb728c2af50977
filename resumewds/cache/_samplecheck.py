"""Checking a copy of a shard, and bytes on their way in, against the manifest's samples.

:func:`check_copy` checks a copy whose whole file passed its xxh3_64: its
samples end at the end-of-archive marker (:func:`check_end`) and match their
digests (:func:`check_samples`).  Bytes on their way in are checked by
:class:`~resumewds.cache._sparse.SampleSink` (remote reads only).
"""

from __future__ import annotations

import os
from array import array
from dataclasses import dataclass
from typing import Any, List, Optional

import xxhash

from ..errors import ChecksumMismatch, ShardFormatError
from ..events import EventKind
from ..fetch import is_remote_url
from ..manifest import COMPRESSED_SUFFIXES, file_sample_digests
from ..tar import _io as tario


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
    """The samples of the local copy ``path`` that fail their digests, in order (empty without digests).

    Args:
        path: the file to check (the shard itself, or its cached copy).
        shard: its :class:`~resumewds.manifest.ShardInfo` (``offsets``, ``sample_digests``).
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
    """Raise when a sample of ``path`` fails its digest (no-op without digests).

    A sample digest that does not match means a damaged sample even when the
    whole file matches its xxh3_64 (the manifest's two checksums disagree).

    Raises:
        ChecksumMismatch: naming the file, the first failing sample and how many fail.
    """
    bads = bad_samples(path, shard)
    if not bads:
        return
    b = bads[0]
    more = f" ({len(bads)} of {shard.samples} samples fail their digests)" if len(bads) > 1 else ""
    raise ChecksumMismatch(f"{name or path}: sample {b.index} (key {b.key}, bytes {b.start}-{b.end}): xxh3_64 "
                           f"mismatch: expected {b.expected}, got {b.actual}{more}", url=shard.url,
                           expected=b.expected, actual=b.actual)


def index_key(shard: Any) -> str:
    """A fingerprint of the manifest's samples of the shard (count, end, digests; "" without
    offsets), for the "verified" marks: a copy checked against another index is not checked.

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

    A manifest that lists fewer samples than the shard holds (made for a subset,
    or another version) would silently deliver only those.  Compressed shards
    and a damaged shard's salvaged prefix are left alone.

    Raises:
        ShardFormatError: naming the file, the samples listed and where the shard goes on.
    """
    if (shard.offsets is None or getattr(shard, "salvaged", False)  # a damaged shard's prefix (a handler's)
            or shard.url.lower().split("?", 1)[0].endswith(COMPRESSED_SUFFIXES)):
        return
    end = int(shard.offsets[-1])
    with open(path, "rb") as f:
        block = os.pread(f.fileno(), 512, end)
    check_end_bytes(block, shard, name or path)


def check_end_bytes(block: bytes, shard: Any, name: str) -> None:
    """:func:`check_end` of the 512 bytes after the manifest's last sample.

    Raises:
        ShardFormatError: they are not the end-of-archive marker.

    Example:
        >>> from resumewds.manifest import ShardInfo
        >>> check_end_bytes(bytes(512), ShardInfo("a.tar", samples=1, offsets=[0, 1024]), "a.tar")
    """
    assert shard.offsets is not None
    end = int(shard.offsets[-1])
    if len(block) == 512 and block.count(0) != 512:
        raise ShardFormatError(f"{name}: the manifest lists {shard.samples} samples, ending at byte {end}, "
                               "but the shard goes on there (no end-of-archive marker): a manifest made for a "
                               "subset or another version of the shard? Index it again (resumewds index) to "
                               "read all of it, or write the subset as its own shard", shard=shard.url)


def check_copy(path: str, shard: Any, emit: Any, discard: bool = False) -> None:
    """:func:`check_end` and :func:`check_samples` of a copy whose whole file passed its xxh3_64.

    On a failure: a ``verify_fail`` event, the file removed if ``discard``, the error.

    Raises:
        ShardFormatError: the manifest lists fewer samples than the shard holds.
        ChecksumMismatch: a sample fails its digest.
    """
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
