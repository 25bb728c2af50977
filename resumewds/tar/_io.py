"""One sample read by its byte range: the loader's seek-and-parse path.

One ``pread`` per sample (:func:`read_sample`) or per run of samples
(:func:`read_samples`); every range must hold exactly one whole sample, or
:class:`~resumewds.errors.ShardFormatError` names the shard and byte.

Example:
    >>> idx = scan_file("data/shard-000000.tar")
    >>> fd = os.open("data/shard-000000.tar", os.O_RDONLY)
    >>> read_sample(fd, idx.offsets[0], idx.offsets[1], "shard-000000.tar")["__key__"]
    's000000_000000'
    >>> os.close(fd)
"""

from __future__ import annotations

import os
import struct
from typing import Any, Dict, List, Optional, Sequence, Tuple

import xxhash

from ..errors import ShardFormatError
from ._frame import _KEY_RE, _OCTAL_DIGITS, BLOCK, Buffer, Member, _group, entry_size, iter_members, split_key
from ._frame import _META_RE as _META_RE  # re-exported: writer.py mirrors the grouping with it
from ._scan import ShardIndex, iter_samples_bytes, iter_samples_file, scan_buffer, scan_file

__all__ = [
    # one sample's byte range (defined here)
    "CHECKED_PREAD", "Members", "PATTERN_MISSES", "learn_pattern", "member_pattern", "parse_sample",
    "parse_sample_as", "read_sample", "read_samples", "sample_digest",
    # from the framer and the scanner
    "BLOCK", "Buffer", "Member", "ShardIndex", "entry_size", "iter_members", "iter_samples_bytes",
    "iter_samples_file", "scan_buffer", "scan_file", "split_key",
]

_NUL = b"\0"
_USTAR = b"ustar\x00"


# name, size, chksum, typeflag, magic and the first prefix byte of a ustar header
_HDR = struct.Struct("100s24x12s12x8sB100x6s82xB166x")
_FIELD_END = (0, 32)  # NUL, space
_SP = b" "


def parse_sample(buf: Buffer, shard: str, base: int = 0, start: int = 0,
                 end: Optional[int] = None, verified: bool = False) -> Dict[str, Any]:
    """Parse one sample's byte range ``buf[start:end]`` (``base`` = its offset in the shard).

    Plain ustar/GNU members take a fast path; anything else goes through
    :func:`iter_members`.  ``verified=True`` (the bytes matched an xxh3_64
    digest) skips recomputing header checksums; every structural check runs.

    Returns ``{"__key__": key, ext: bytes, ...}``; ShardFormatError when the
    range does not hold exactly one well-formed sample (a stale manifest).
    """
    n = len(buf) if end is None else end
    if start < 0 or n > len(buf) or start > n:
        raise ShardFormatError(shard, base, f"sample range [{start}, {n}) lies outside the "
                               f"{len(buf)} bytes read (manifest does not match the shard)")
    if type(buf) is not bytes:  # mmap, memoryview...: the range copied once, then the bytes path
        return parse_sample(bytes(buf[start:n]), shard, base, 0, n - start, verified)
    off = start
    key: Optional[str] = None
    sample: Dict[str, Any] = {}
    unpack = _HDR.unpack_from
    match = _KEY_RE.match
    while off < n:
        if off + BLOCK > n:
            break
        rawname, rawsize, chk, flag, magic, prefix0 = unpack(buf, off)
        # one unpack for the fields the fast path needs (no slice of the block)
        if (flag != 48 and flag != 0) or (prefix0 != 0 and magic == _USTAR):
            return _parse_sample_slow(buf, shard, base, start, n)
        if not verified:
            try:
                stored = int(chk.split(_NUL, 1)[0].strip() or b"0", 8)
            except ValueError:
                return _parse_sample_slow(buf, shard, base, start, n)
            # headers are mostly NUL padding: the block's sum with its NULs deleted (one
            # C-level translate), minus the checksum field, plus 8 spaces (256) is exact
            if stored != sum(buf[off:off + BLOCK].translate(None, _NUL)) - sum(chk) + 256:
                return _parse_sample_slow(buf, shard, base, start, n)
        # the octal branch of entry_size, inlined (base-256 takes the slow path)
        if rawsize[0] & 0x80:
            return _parse_sample_slow(buf, shard, base, start, n)
        digits = rawsize[:11]
        if rawsize[11] in _FIELD_END and digits.isdigit():  # the usual field: 11 digits, a NUL or space
            try:
                size = int(digits, 8)
            except ValueError:  # an 8 or a 9
                return _parse_sample_slow(buf, shard, base, start, n)
        else:
            s = rawsize.split(_NUL, 1)[0].strip(_SP)
            if s.translate(None, _OCTAL_DIGITS):
                return _parse_sample_slow(buf, shard, base, start, n)
            size = int(s, 8) if s else 0
        data = off + BLOCK
        nxt = data + ((size + 511) & -512)  # BLOCK-aligned
        if nxt > n:
            return _parse_sample_slow(buf, shard, base, start, n)
        name = rawname.split(_NUL, 1)[0].decode("utf-8", "surrogateescape")
        # _KEY_RE without the regex; the rare rest (no dot, a dot or "_" first) goes through it
        slash = name.rfind("/")
        dot = name.find(".", slash + 1)
        if dot > slash + 1 and name[0] != "_":
            k, ext = name[:dot], name[dot + 1:].lower()
        else:
            if name.startswith("__"):
                return _parse_sample_slow(buf, shard, base, start, n)
            m = match(name)
            if m is None:
                return _parse_sample_slow(buf, shard, base, start, n)
            k, ext = m.groups()
            ext = ext.lower()
        if key is None:
            key = k
        elif k != key or ext in sample:
            return _parse_sample_slow(buf, shard, base, start, n)
        sample[ext] = buf[data:data + size]
        off = nxt
    if key is None or off != n:
        return _parse_sample_slow(buf, shard, base, start, n)
    sample["__key__"] = key
    return sample


Members = Tuple[Tuple[str, bytes], ...]


def member_pattern(sample: Dict[str, Any]) -> Members:
    """What :func:`parse_sample_as` expects of the next samples: ``sample``'s members as ``(ext, b"." + ext)``.

    Example:
        >>> member_pattern({"cls": b"1", "jpg": b"...", "__key__": "k"})
        (('cls', b'.cls'), ('jpg', b'.jpg'))
    """
    return tuple((e, ("." + e).encode("utf-8", "surrogateescape")) for e in sample if e != "__key__")


#: misses after which a shard's samples are no longer tried against a pattern
PATTERN_MISSES = 16


def learn_pattern(patterns: Dict[Any, Members], misses: Dict[Any, int], key: Any,
                  sample: Dict[str, Any], previous: Optional[Members]) -> None:
    """What to try next for shard ``key`` once :func:`parse_sample` framed ``sample``
    (``previous``: None, or the pattern that missed): its pattern, or ``()`` after
    :data:`PATTERN_MISSES` misses.

    Example:
        >>> pats, misses = {}, {}
        >>> learn_pattern(pats, misses, 0, {"cls": b"1", "__key__": "k"}, None); pats[0]
        (('cls', b'.cls'),)
    """
    if previous is None:
        patterns[key] = member_pattern(sample)
    elif previous:
        miss = misses[key] = misses.get(key, 0) + 1
        patterns[key] = member_pattern(sample) if miss <= PATTERN_MISSES else ()


def parse_sample_as(buf: bytes, members: Members, start: int = 0,
                    end: Optional[int] = None) -> Optional[Dict[str, Any]]:
    """:func:`parse_sample` of verified bytes ``buf[start:end]`` whose members are
    ``members`` (:func:`member_pattern` of an earlier sample of the shard),
    or None when they are not: the caller then takes :func:`parse_sample`.

    Knowing the pattern, a header's name is checked with two ``startswith``
    instead of decoded and split (half the cost); everything else about each
    member is still checked.  Anything unusual returns None, never a
    different sample.  Verified bytes only (checksums are not recomputed).

    Example:
        >>> import io, tarfile
        >>> f = io.BytesIO()
        >>> with tarfile.open(fileobj=f, mode="w", format=tarfile.USTAR_FORMAT) as tf:
        ...     for name, data in (("k.cls", b"1"), ("k.jpg", b"xy")):
        ...         ti = tarfile.TarInfo(name); ti.size = len(data); tf.addfile(ti, io.BytesIO(data))
        >>> buf = f.getvalue()[:2048]
        >>> parse_sample_as(buf, member_pattern(parse_sample(buf, "s.tar", verified=True)))
        {'cls': b'1', 'jpg': b'xy', '__key__': 'k'}
    """
    n = len(buf) if end is None else end
    if type(buf) is not bytes or not 0 <= start <= n - BLOCK or n > len(buf):
        return None
    name = buf[start:start + 100]
    z = name.find(0)
    if z >= 0:
        name = name[:z]
    slash = name.rfind(b"/")
    dot = name.find(b".", slash + 1)
    if dot <= slash + 1 or name[0] == 95:  # no dot, a dot first, or "_" first: the general rules
        return None
    keyb = name[:dot]
    k = len(keyb)
    starts = buf.startswith
    sample: Dict[str, Any] = {}
    off = start
    for ext, suffix in members:
        if off + BLOCK > n:
            return None
        e = k + len(suffix)  # the name's length: the key, the suffix, then a NUL (or the field's end)
        if e > 100 or not starts(keyb, off) or not starts(suffix, off + k) or (e < 100 and buf[off + e]):
            return None
        flag = buf[off + 156]
        if (flag != 48 and flag != 0) or (buf[off + 345] and buf[off + 257:off + 263] == _USTAR):
            return None
        digits = buf[off + 124:off + 135]  # the usual field: 11 digits, then a NUL or a space
        if buf[off + 135] not in _FIELD_END or not digits.isdigit():  # (base-256 fails isdigit)
            return None
        try:
            size = int(digits, 8)
        except ValueError:  # an 8 or a 9
            return None
        data = off + BLOCK
        off = data + ((size + 511) & -512)  # past n: refused below (a block read, the end)
        sample[ext] = buf[data:data + size]
    if off != n:
        return None
    sample["__key__"] = keyb.decode("utf-8", "surrogateescape")
    return sample


def _parse_sample_slow(buf: Buffer, shard: str, base: int, start: int, end: int) -> Dict[str, Any]:
    groups = list(_group(iter_members(buf, shard, start=start, end=end, base=base - start,
                                      archive_end=False), shard, base - start))
    if len(groups) != 1:
        raise ShardFormatError(shard, base, f"byte range [{base}, {base + end - start}) holds "
                               f"{len(groups)} samples, expected 1 (manifest does not match the shard)")
    key, members = groups[0]
    sample: Dict[str, Any] = {"__key__": key}
    for ext, m in members:
        sample[ext] = bytes(buf[m.data:m.data + m.size])
    return sample


CHECKED_PREAD = 64 << 20  # ranges above this are checked against the file size before pread


def _pread_range(fd: int, start: int, end: int, shard: str) -> bytes:
    """``pread`` of ``[start, end)``, checked against the file's size first (``os.pread``
    allocates the whole length: a bad manifest offset would be a MemoryError)."""
    if not (0 <= start <= end):
        raise ShardFormatError(shard, max(0, start), f"bad sample range [{start}, {end}) "
                               "(manifest does not match the shard)")
    if end - start > CHECKED_PREAD:  # a small range costs no fstat: a short read is caught below
        size = os.fstat(fd).st_size
        if end > size:
            raise ShardFormatError(shard, size, f"file ends at byte {size} but the "
                                   f"manifest says sample data reaches byte {end}")
    buf = os.pread(fd, end - start, start)
    if len(buf) != end - start:
        raise ShardFormatError(shard, start + len(buf), f"file ends at byte {start + len(buf)} but the "
                               f"manifest says sample data reaches byte {end}")
    return buf


def read_sample(fd: int, start: int, end: int, shard: str, verified: bool = False) -> Dict[str, Any]:
    """Read and parse the sample at byte range ``[start, end)`` of an open file
    (``verified``: the file matched its digest, see :func:`parse_sample`).

    Raises:
        ShardFormatError: a range backwards or past the end, or a malformed sample.
    """
    return parse_sample(_pread_range(fd, start, end, shard), shard, base=start, verified=verified)


def read_samples(fd: int, offsets: Sequence[int], first: int, last: int, shard: str,
                 verified: bool = False) -> List[Dict[str, Any]]:
    """Read samples ``first..last`` (inclusive, contiguous) with one ``pread`` (errors: :func:`read_sample`)."""
    lo, hi = int(offsets[first]), int(offsets[last + 1])
    buf = _pread_range(fd, lo, hi, shard)
    out = []
    patterns: Dict[int, Members] = {}  # verified bytes: the run's member pattern (parse_sample_as)
    misses: Dict[int, int] = {}
    for j in range(first, last + 1):
        a, b = int(offsets[j]) - lo, int(offsets[j + 1]) - lo
        pat = patterns.get(0) if verified else ()
        sample = parse_sample_as(buf, pat, a, b) if pat else None
        if sample is None:
            sample = parse_sample(buf, shard, base=lo + a, start=a, end=b, verified=verified)
            if pat != ():
                learn_pattern(patterns, misses, 0, sample, pat)
        out.append(sample)
    return out


def sample_digest(sample: Dict[str, Any]) -> str:
    """The ``resumewds cat`` digest: xxh3_64 of member bytes in extension order.

    Only raw members count (keys not starting with ``__``).

    Example:
        >>> sample_digest({"__key__": "a", "txt": b"hi", "cls": b"1"}) == \\
        ...     xxhash.xxh3_64_hexdigest(b"1hi")
        True
    """
    h = xxhash.xxh3_64()
    for ext in sorted(k for k in sample if not k.startswith("__")):
        v = sample[ext]
        h.update(v if isinstance(v, (bytes, bytearray, memoryview)) else str(v).encode())
    return h.hexdigest()
