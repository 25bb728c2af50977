"""Strict tar framing: headers checked, members framed, grouped into WebDataset samples.

Not :mod:`tarfile`: it is slow for small members, and its stream mode stops
quietly at a bad header (a corrupt shard read as a short one).  This framer
checks every header checksum (unsigned and signed), reads ustar, GNU long
names and pax ``path``/``size``, requires the end-of-archive marker (a shard
cut at a member boundary is an error), and never returns a partial member or
sample: :class:`~resumewds.errors.ShardFormatError` names shard and offset.

Grouping (:func:`_group`) is WebDataset's: key = path up to the first dot of
the basename, extension = the rest, lowercased; consecutive members with one
key form a sample; non-regular entries, names without an extension and
top-level ``__*__`` files are skipped; a repeated extension is an error.
"""

from __future__ import annotations

import mmap
import re
import struct
from typing import Dict, Generator, Iterator, List, NamedTuple, Optional, Tuple, Union

from ..errors import ShardFormatError

__all__ = ["BLOCK", "Buffer", "Member", "entry_size", "iter_members", "split_key"]

BLOCK = 512
_ZERO = bytes(BLOCK)
_KEY_RE = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")
_META_RE = re.compile(r"__[^/]*__($|/)")
_SIGNED = struct.Struct("148b8x356b")
_REGULAR = (b"0", b"\0", b"7")
_GZIP_MAGIC = b"\x1f\x8b"

Buffer = Union[bytes, bytearray, memoryview, mmap.mmap]


class Member(NamedTuple):
    """One regular file in a tar archive.

    Attributes:
        name: full path inside the archive (after pax / GNU long names).
        header: offset of its first header block (extended headers included).
        end: offset just past the member's padded data.
    """

    name: str
    header: int
    data: int
    size: int
    end: int


def split_key(name: str) -> Tuple[Optional[str], Optional[str]]:
    """WebDataset's key/extension split (extension not yet lowercased).

    Example:
        >>> split_key("dir/x.y/abc.seg.PNG")
        ('dir/x.y/abc', 'seg.PNG')
        >>> split_key("README")
        (None, None)
    """
    m = _KEY_RE.match(name)
    if not m:
        return None, None
    return m.group(1), m.group(2)


_OCTAL_DIGITS = b"01234567"


def _octal(field: bytes, shard: str, off: int, what: str) -> int:
    """A numeric header field: octal digits (NUL/space padded) or GNU base-256.

    Strict on purpose: ``int(..., 8)`` alone would also take a sign,
    underscores and inner spaces ("-1", "1_0"), which no tar writer emits.
    """
    if field[:1] and field[0] & 0x80:  # GNU base-256 for huge values (0x80: +, 0xff: -)
        if field[0] not in (0x80, 0xFF):
            raise ShardFormatError(shard, off, f"bad {what} field {field!r} in tar header")
        v = int.from_bytes(field[1:], "big")
        if field[0] == 0xFF:
            v -= 1 << (8 * (len(field) - 1))
        return v
    v = _plain_octal(field)
    if v < 0:
        raise ShardFormatError(shard, off, f"bad {what} field {field!r} in tar header")
    return v


def _plain_octal(field: bytes) -> int:
    """An octal field's value, or -1 when it is not octal digits (NUL/space padded)."""
    s = field.split(b"\0", 1)[0].strip(b" ")
    if s.translate(None, _OCTAL_DIGITS):
        return -1
    return int(s, 8) if s else 0


def entry_size(blk: bytes, pax: Dict[str, str], shard: str, off: int, avail: int) -> int:
    """The data size of the entry with header ``blk``: where every size the framer uses is validated.

    The pax ``size`` record, else the header's field; its padded data must
    fit in the ``avail`` bytes after the header, so a caller can advance by
    it without going backwards or past the end (else ShardFormatError).

    Example:
        >>> blk = bytearray(512); blk[124:136] = b"00000000012 "
        >>> entry_size(bytes(blk), {}, "x.tar", 0, 512)
        10
    """
    if "size" in pax:
        v = pax["size"]
        if not v.isascii() or not v.isdigit():
            raise ShardFormatError(shard, off, f"bad pax size {v[:40]!r} (not a non-negative integer)")
        size = int(v)
    else:
        size = _octal(blk[124:136], shard, off, "size")
    if size < 0:
        raise ShardFormatError(shard, off, f"negative member size {size} in tar header")
    padded = ((size + BLOCK - 1) // BLOCK) * BLOCK
    if padded > avail:
        raise ShardFormatError(shard, off, f"truncated member: needs {padded} bytes of data, "
                               f"{max(0, avail)} present")
    return size


def _not_a_tar(head: bytes, shard: str) -> ShardFormatError:
    if head[:2] == _GZIP_MAGIC:
        return ShardFormatError(shard, 0, "compressed tar (gzip) is not supported: "
                                "shards must be plain tar so samples can be read by seeking")
    return ShardFormatError(shard, 0, "not a tar archive (bad header checksum)")


def _check_header(blk: bytes, shard: str, off: int) -> None:
    try:
        stored = _octal(blk[148:156], shard, off, "checksum")
    except ShardFormatError:
        if off == 0:
            raise _not_a_tar(blk, shard) from None
        raise
    unsigned = sum(blk) - sum(blk[148:156]) + 256
    if stored == unsigned:
        return
    signed = sum(_SIGNED.unpack(blk)) + 256
    if stored == signed:
        return
    if off == 0:
        raise _not_a_tar(blk, shard)
    raise ShardFormatError(shard, off, f"bad tar header checksum (stored {stored}, computed {unsigned})")


def _pax_records(data: bytes, shard: str, off: int) -> Dict[str, str]:
    out: Dict[str, str] = {}
    pos = 0
    while pos < len(data):
        if data[pos:pos + 1] == b"\0":
            break
        sp = data.find(b" ", pos)
        if sp < 0:
            raise ShardFormatError(shard, off, "malformed pax extended header")
        try:
            length = int(data[pos:sp])
        except ValueError:
            raise ShardFormatError(shard, off, "malformed pax record length") from None
        if length <= 0 or pos + length > len(data):
            raise ShardFormatError(shard, off, "malformed pax record length")
        rec = data[sp + 1:pos + length]
        if not rec.endswith(b"\n") or b"=" not in rec:
            raise ShardFormatError(shard, off, "malformed pax record")
        k, v = rec[:-1].split(b"=", 1)
        out[k.decode("utf-8", "surrogateescape")] = v.decode("utf-8", "surrogateescape")
        pos += length
    return out


def iter_members(buf: Buffer, shard: str, *, start: int = 0, end: Optional[int] = None,
                 base: int = 0, archive_end: bool = True) -> Generator[Member, None, Optional[int]]:
    """Yield the regular-file members in ``buf[start:end]``.

    ``base`` is added to offsets in error messages (the range's offset in the
    shard).  ``archive_end``: require an end-of-archive zero block before
    ``end`` (a whole archive), else the range must end at a member boundary.
    Returns (as the generator's value) the marker's offset, or None.
    """
    n = len(buf) if end is None else end
    off = start
    long_name: Optional[str] = None
    pax: Dict[str, str] = {}
    chain_start: Optional[int] = None
    while True:
        if off >= n:
            if archive_end:
                raise ShardFormatError(shard, base + off, "missing end-of-archive marker "
                                       "(archive truncated at a member boundary?)")
            if chain_start is not None:
                raise ShardFormatError(shard, base + off, "extended header without a following member")
            return None
        if off + BLOCK > n:
            if base + off == 0 and bytes(buf[:2]) == _GZIP_MAGIC:
                raise _not_a_tar(bytes(buf[:2]), shard)
            if base + off == 0 and archive_end:
                raise ShardFormatError(shard, 0, f"not a tar archive ({n} bytes, shorter than one "
                                       f"{BLOCK}-byte tar header)")
            raise ShardFormatError(shard, base + off, f"truncated tar header ({n - off} of {BLOCK} bytes)")
        blk = bytes(buf[off:off + BLOCK])
        if blk == _ZERO:
            if not archive_end:
                raise ShardFormatError(shard, base + off, "end-of-archive marker inside a sample range "
                                       "(manifest does not match the shard?)")
            if chain_start is not None:
                raise ShardFormatError(shard, base + off, "extended header without a following member")
            return off
        _check_header(blk, shard, base + off)
        if chain_start is None:
            chain_start = off
        flag = blk[156:157]
        data = off + BLOCK
        size = entry_size(blk, pax, shard, base + off, n - data)
        nxt = data + ((size + BLOCK - 1) // BLOCK) * BLOCK
        if flag in (b"L", b"K", b"x", b"g"):
            payload = bytes(buf[data:data + size])
            if flag == b"L":
                long_name = payload.split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
            elif flag == b"x":
                pax.update(_pax_records(payload, shard, base + off))
            off = nxt
            continue
        if "path" in pax:
            name = pax["path"]
        elif long_name is not None:
            name = long_name
        else:
            name = blk[:100].split(b"\0", 1)[0].decode("utf-8", "surrogateescape")
            if blk[257:263] == b"ustar\x00":
                prefix = blk[345:500].split(b"\0", 1)[0]
                if prefix:
                    name = prefix.decode("utf-8", "surrogateescape") + "/" + name
        if flag in _REGULAR:
            yield Member(name, chain_start, data, size, nxt)
        off = nxt
        long_name = None
        pax = {}
        chain_start = None


def _group(members: Iterator[Member], shard: str, base: int = 0
           ) -> Iterator[Tuple[str, List[Tuple[str, Member]]]]:
    """Group members into (key, [(ext, member)]) exactly as WebDataset does."""
    key: Optional[str] = None
    cur: List[Tuple[str, Member]] = []
    seen: set = set()
    for m in members:
        name = m.name
        if "/" not in name and name.startswith("__") and name.endswith("__"):
            continue
        if _META_RE.match(name):
            continue
        k, ext = split_key(name)
        if k is None:
            continue
        ext = ext.lower()  # type: ignore[union-attr]
        if k != key:
            if key is not None:
                yield key, cur
            key, cur, seen = k, [], set()
        if ext in seen:
            raise ShardFormatError(shard, base + m.header,
                                   f"duplicate extension {ext!r} in sample {k!r} ({name})")
        seen.add(ext)
        cur.append((ext, m))
    if key is not None:
        yield key, cur
