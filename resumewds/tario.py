"""A fast, strict tar framer and WebDataset's sample grouping.

Why not :mod:`tarfile`: it is slow for many small members (about 9k samples/s
here), and its stream mode stops quietly at a bad header, which turns a
corrupt shard into a silently short one.  This reader:

* checks every header checksum (unsigned and signed sums, as POSIX allows);
* understands ustar (name + prefix), GNU long names (``L``/``K``) and pax
  extended headers (``x``: ``path`` and ``size``; ``g`` is skipped);
* requires the end-of-archive marker (a zero block) before the end of the
  data, so a shard cut at a member boundary is an error, not a short shard;
* never returns a partial member or sample: problems raise
  :class:`~resumewds.errors.ShardFormatError` with the shard and byte offset.

Grouping follows WebDataset exactly: the key is the path up to the first dot
of the basename (directory included), the extension is the rest, lowercased;
only consecutive members with the same key form a sample; non-regular entries,
names without an extension and top-level ``__*__`` files are skipped; a
repeated extension in one sample is an error.

Two ways in:

* :func:`scan_file` walks a whole local shard once (memory-mapped), and
  returns its size, xxh3_64 and the byte range of every sample: the index.
* :func:`read_sample` reads one sample given its byte range, with one
  ``pread``; this is how the loader seeks.

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
import re
import struct
from dataclasses import dataclass
from typing import Any, Dict, Generator, Iterator, List, Optional, Sequence, Tuple, Union

import xxhash

from .decompress import decompressed, kind_of_bytes
from .errors import ShardFormatError

BLOCK = 512
_ZERO = bytes(BLOCK)
_KEY_RE = re.compile(r"^((?:.*/|)[^.]+)[.]([^/]*)$")
_META_RE = re.compile(r"__[^/]*__($|/)")
_SIGNED = struct.Struct("148b8x356b")
_REGULAR = (b"0", b"\0", b"7")
_GZIP_MAGIC = b"\x1f\x8b"

Buffer = Union[bytes, bytearray, memoryview, mmap.mmap]


@dataclass
class Member:
    """One regular file in a tar archive.

    Attributes:
        name: full path inside the archive (after pax / GNU long names).
        header: offset of the member's first header block (extended headers
            included), relative to the buffer the member was parsed from.
        data: offset of the member's data.
        size: data size in bytes.
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
    """The data size of the tar entry whose header block is ``blk``: the one
    validated place every size the framer uses comes from.

    The size is the pax ``size`` record when there is one, else the header's
    size field (octal or GNU base-256).  It must be a non-negative integer
    whose padded data fits in the ``avail`` bytes that follow the header, so
    a caller can advance by it without ever going backwards or past the end.

    Args:
        blk: the 512-byte header (checksum already checked).
        pax: the pending pax records for this entry (may be empty).
        shard: name for error messages.
        off: absolute offset of the header, for error messages.
        avail: bytes available after the header block.

    Returns:
        The size in bytes (``padded(size) <= avail``).

    Raises:
        ShardFormatError: the size is not an integer, negative, or larger
            than what follows.

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

    Args:
        buf: the bytes (a whole archive, or one sample's range).
        shard: name used in error messages.
        start: offset of the first header in ``buf``.
        end: offset to stop at (default: end of ``buf``).
        base: added to offsets in error messages (the range's offset in the
            shard) so that errors name the absolute byte.
        archive_end: require an end-of-archive zero block before ``end``
            (True for a whole archive; False for a sample range, which must
            end exactly at a member boundary).

    Raises:
        ShardFormatError: bad checksum, truncated header or member, missing
            end-of-archive marker, malformed extended header, a size that
            is not a non-negative integer fitting in the data (every size
            comes from :func:`entry_size`).

    Returns:
        (as the generator's return value) the offset of the end-of-archive
        marker when ``archive_end`` is True, else None.
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
    """Index an archive held in ``buf``: (offsets, keys, end_of_data).

    Raises:
        ShardFormatError: on any malformation.
    """
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
    # The end-of-archive marker's offset closes the last sample's range (past
    # any trailing skipped entries): iter_members returns it, found by the
    # same validated walk that framed every member.
    end = eoa[0] if eoa and eoa[0] is not None else last_end
    if not starts:
        return [end], keys, end
    return starts + [end], keys, end


def scan_file(path: str, shard: Optional[str] = None) -> ShardIndex:
    """Index a local shard: size, xxh3_64 and each sample's byte range.

    Args:
        path: local file.
        shard: name for error messages (default: ``path``).

    Returns:
        A :class:`ShardIndex`.

    Raises:
        ShardFormatError: the file is not a well-formed tar archive.
        OSError: the file cannot be read.

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


_NUL = b"\0"
_USTAR = b"ustar\x00"


# name, size, chksum, typeflag, magic and the first prefix byte of a ustar
# header, in one unpack
_HDR = struct.Struct("100s24x12s12x8sB100x6s82xB166x")
_FIELD_END = (0, 32)  # NUL, space
_SP = b" "


def parse_sample(buf: Buffer, shard: str, base: int = 0, start: int = 0,
                 end: Optional[int] = None, verified: bool = False) -> Dict[str, Any]:
    """Parse one sample's byte range ``buf[start:end]`` (``base`` = its offset in the shard).

    Plain ustar/GNU members take a fast path; anything else (pax or GNU
    long-name headers, skipped entries, a checksum that needs the signed
    sum) goes through :func:`iter_members`, which handles every case.

    ``verified=True`` says the bytes already matched an xxh3_64 digest (the
    shard's or the sample's, from a manifest whose offsets our scanner wrote
    after it checked every header): the fast path then skips recomputing
    the header checksums (a third of its time), which cannot fail on those
    bytes.  Every structural check (types, sizes inside the range, one key
    per sample, no stray bytes) still runs.

    Returns:
        ``{"__key__": key, ext: bytes, ...}`` (``__url__`` is added by the
        caller).

    Raises:
        ShardFormatError: malformed headers, or the range does not hold
            exactly one sample (a stale manifest).
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
        # the octal branch of entry_size, inlined (base-256 and pax sizes
        # take the slow path, which calls entry_size itself)
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
        # _KEY_RE without the regex: the key ends at the first dot of the
        # basename; the rare rest (no dot, a dot first, a name that starts
        # with "_", which may be a "__" entry) goes through _KEY_RE
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
    """What :func:`parse_sample_as` expects of the next samples: ``sample``'s
    members in order, each as ``(ext, b"." + ext)``.

    Example:
        >>> member_pattern({"cls": b"1", "jpg": b"...", "__key__": "k"})
        (('cls', b'.cls'), ('jpg', b'.jpg'))
    """
    return tuple((e, ("." + e).encode("utf-8", "surrogateescape")) for e in sample if e != "__key__")


#: misses after which a shard's samples are no longer tried against a pattern
PATTERN_MISSES = 16


def learn_pattern(patterns: Dict[Any, Members], misses: Dict[Any, int], key: Any,
                  sample: Dict[str, Any], previous: Optional[Members]) -> None:
    """What to try next for shard ``key`` once :func:`parse_sample` framed
    ``sample``: its pattern (``previous`` is None the first time, or the
    pattern that missed), or ``()`` once the shard missed
    :data:`PATTERN_MISSES` times (its patterns keep changing: no more tries).

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

    Almost every shard holds samples of one pattern (each a ``.cls``, a
    ``.jpg``, a ``.txt``, in that order).  Knowing it, a member's header
    is checked with two ``startswith`` (the key and the extension, then a
    NUL) instead of decoding and splitting its name: the same sample for
    half the cost of the general path.  Every member is still checked in
    full otherwise (a regular file, no ustar prefix, the usual 11-digit
    size field, inside the range; the range ends with the last member).
    Anything else (another pattern, a name that needs the general rules,
    pax or GNU headers, an unusual size field) returns None, never a
    different sample.  For verified bytes only: header checksums are not
    recomputed, as in :func:`parse_sample` with ``verified=True``.

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
    """``pread`` of ``[start, end)``, checked against the file's real size
    first: the range comes from a manifest, and ``os.pread`` allocates the
    whole length before reading (a bad offset of 10^12 was a MemoryError,
    2^64 an OverflowError)."""
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
        ShardFormatError: a range that is backwards or past the end of the
            file (the manifest does not match it), or a malformed sample.
    """
    return parse_sample(_pread_range(fd, start, end, shard), shard, base=start, verified=verified)


def read_samples(fd: int, offsets: Sequence[int], first: int, last: int, shard: str,
                 verified: bool = False) -> List[Dict[str, Any]]:
    """Read samples ``first..last`` (inclusive, contiguous) with one ``pread``.

    Raises:
        ShardFormatError: as :func:`read_sample`.
    """
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


def iter_samples_bytes(data: Buffer, shard: str) -> Iterator[Dict[str, Any]]:
    """Stream the samples of a whole archive held in memory (or an mmap).

    The archive is validated as it goes; a malformation raises before any
    sample of the bad region is yielded (a sample is yielded only once the
    next sample, or the end-of-archive marker, proves it complete).
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


def sample_digest(sample: Dict[str, Any]) -> str:
    """The ``resumewds cat`` digest: xxh3_64 of member bytes in extension order.

    Only raw members count (keys not starting with ``__``); they are
    concatenated in ascending order of extension name.

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
