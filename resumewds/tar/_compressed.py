"""Compressed shards (``.tar.gz`` / ``.tgz``, and ``.tar.zst`` with ``zstandard``).

A compressed shard is decompressed once and then read by seeking.  The
manifest's ``size``/``xxh3_64`` are the compressed file's, its ``offsets``
the uncompressed stream's.  :func:`open_view` returns the decompressed copy
``<cache_dir>/decompressed/<xxh3 of the compressed file>.tar``, made once
(under a lock, temporary name, synced, renamed) and shared by every process;
it counts against ``cache_size`` (a view holds its ``.lock`` shared).
Compression is recognised by magic bytes, not the name.

:func:`salvage_compressed` reads a truncated or corrupt shard as webdataset
1.0.2's ``tarfile`` stream mode does (same input chunks, so a corrupt
deflate block loses exactly what tarfile loses), and says whether
webdataset raises there (``raised``).  Such a shard (``salvaged = True``) is
served from a ``...-<size>.prefix.tar`` copy marked ``"complete": false``,
never taken for the complete decompression.  zstd is salvaged frame by frame.
"""

from __future__ import annotations

import fcntl
import json
import mmap
import os
import re
import tarfile
import tempfile
import time
import zlib
from dataclasses import dataclass
from typing import Any, Callable, List, Optional, Tuple

import xxhash

from ..errors import CacheError, ShardFormatError
from ..redact import redact_url
from . import _io as tario
from ._decompress import _CHUNK, decompress_file, kind_of, zstandard_module

# kind_of is resumewds.tar's: the webdataset drop-in's reader asks it here
__all__ = ["Salvage", "decompress_prefix", "kind_of", "open_view", "salvage_compressed"]

_RECORD = 20 * 512  # tarfile.RECORDSIZE: the stream reader's input chunk
_META_NAME = re.compile(r"__[^/]*__($|/)")  # webdataset's skip_meta


def _gzip_prefix(f: Any, write: Callable[[bytes], Any]) -> Tuple[int, Optional[str]]:
    """Decode gzip data as ``tarfile.open(mode="r|*")`` does; ``(bytes written, error or None)``.

    A port of tarfile's ``_StreamProxy`` / ``_Stream`` (3.10-3.13): a 512-byte
    read, then 10240-byte chunks; one member, no CRC check.  ``error`` is None
    when the data simply ends, else why tarfile raises there.
    """
    pending = [f.read(512)]
    buf = b""

    def raw() -> bytes:
        return pending.pop() if pending else f.read(_RECORD)

    def hread(n: int) -> bytes:  # tarfile._Stream.__read
        nonlocal buf
        parts, c = [buf], len(buf)
        while c < n:
            b = raw()
            if not b:
                break
            parts.append(b)
            c += len(b)
        t = b"".join(parts)
        buf = t[n:]
        return t[:n]

    if hread(2) != b"\x1f\x8b":
        return 0, "not a gzip file"
    if hread(1) != b"\x08":
        return 0, "unsupported compression method"
    flag = hread(1)
    if not flag:
        return 0, "truncated gzip header"
    hread(6)
    if flag[0] & 4:  # FEXTRA (tarfile mis-reads it; never written by gzip/tarfile/pigz): skip it
        x = hread(2)
        hread(x[0] + 256 * x[1] if len(x) == 2 else 0)
    for bit in (8, 16):  # FNAME, FCOMMENT
        if flag[0] & bit:
            while True:
                c = hread(1)
                if not c or c == b"\0":
                    break
    if flag[0] & 2:
        hread(2)
    dec = zlib.decompressobj(-zlib.MAX_WBITS)
    n = 0
    while True:
        if buf:
            chunk, buf = buf, b""
        else:
            chunk = raw()
            if not chunk:
                return n, None
        try:
            out = dec.decompress(chunk)
        except zlib.error as exc:
            return n, f"invalid compressed data ({exc})"
        if out:
            write(out)
            n += len(out)


def _zstd_prefix(f: Any, write: Callable[[bytes], Any], shard: str) -> Tuple[int, Optional[str]]:
    """Decode zstd frames in 1 MiB input chunks until the data ends or is corrupt."""
    zstandard = zstandard_module(shard)
    dctx = zstandard.ZstdDecompressor()
    dobj = dctx.decompressobj()
    n = 0
    started = False  # a frame begun but not finished when the data ends: truncated
    for chunk in iter(lambda: f.read(_CHUNK), b""):
        while chunk:
            try:
                out = dobj.decompress(chunk)
            except zstandard.ZstdError as exc:
                return n, f"invalid compressed data ({exc})"
            started = True
            if out:
                write(out)
                n += len(out)
            chunk = b""
            if dobj.eof:
                chunk, started = dobj.unused_data, False
                dobj = dctx.decompressobj()
    return n, ("truncated zstd data" if started else None)


def decompress_prefix(src: str, dst: Any, kind: str, shard: Optional[str] = None
                      ) -> Tuple[int, str, int, Optional[str]]:
    """Decompress what decodes of a possibly damaged compressed file into ``dst``.

    For gzip, exactly what webdataset 1.0.2's reader decodes before it fails.

    Returns:
        ``(compressed size, compressed xxh3_64, good bytes written, error)``;
        ``error`` is None when the data only ends early (or is whole).

    Example:
        >>> import gzip, io
        >>> p = tempfile.mktemp(); open(p, "wb").write(gzip.compress(bytes(range(256)) * 400)[:200])
        200
        >>> out = io.BytesIO(); size, _, good, error = decompress_prefix(p, out, "gzip")
        >>> size, error, good > 0 and out.getvalue() == (bytes(range(256)) * 400)[:good]
        (200, None, True)
    """
    name = shard or src
    with open(src, "rb") as raw:
        if kind == "gzip":
            good, error = _gzip_prefix(raw, dst.write)
        else:
            good, error = _zstd_prefix(raw, dst.write, name)
    size, digest = _hash_file(src)
    return size, digest, good, error


def _hash_file(path: str) -> Tuple[int, str]:
    h, n = xxhash.xxh3_64(), 0
    with open(path, "rb") as f:
        for b in iter(lambda: f.read(_CHUNK), b""):
            h.update(b)
            n += len(b)
    return n, h.hexdigest()


class _Replay:
    """The decoded prefix as tarfile's ``_Stream`` presents it: a read past it is short or raises."""

    def __init__(self, mm: Any, good: int, error: Optional[str]):
        self.mm, self.good, self.error, self.pos = mm, good, error, 0
        self.name = None

    def read(self, size: int = -1) -> bytes:
        end = self.good if size is None or size < 0 else self.pos + size
        if end > self.good:
            if self.error is not None:
                raise tarfile.ReadError("invalid compressed data")
            end = self.good
        b = bytes(self.mm[self.pos:end]) if end > self.pos else b""
        self.pos += len(b)
        return b

    def seek(self, pos: int, whence: int = 0) -> int:
        if pos < self.pos:
            raise tarfile.StreamError("seeking backwards is not allowed")
        if pos > self.good:  # _Stream.seek reads its way there: short at the end, or the error
            if self.error is not None:
                raise tarfile.ReadError("invalid compressed data")
            pos = self.good
        self.pos = pos
        return pos

    def tell(self) -> int:
        return self.pos


def _frame_prefix(mm: Any, good: int, error: Optional[str], shard: str
                  ) -> Tuple[List[int], List[str], Optional[str]]:
    """``(offsets, keys, raised)`` of the samples tarfile (as webdataset 1.0.2 drives it) delivers
    from a decoded prefix; ``raised``: the error its reader raises after them, or None."""
    members: List[Any] = []
    raised: Optional[str] = None
    try:
        tf = tarfile.TarFile(fileobj=_Replay(mm, good, error), mode="r")  # type: ignore[arg-type]
        for ti in tf:
            name = ti.name
            if not ti.isreg() or ("/" not in name and name.startswith("__") and name.endswith("__")) \
                    or _META_NAME.match(name):
                continue  # webdataset does not read these members' data
            if ti.offset_data + ti.size > good:  # its data read fails: "unexpected end of data"
                raised = error or "unexpected end of data"
                break
            end = ti.offset_data + -(-ti.size // tario.BLOCK) * tario.BLOCK
            members.append(tario.Member(name, ti.offset, ti.offset_data, ti.size, end))
    except Exception as exc:  # tarfile.ReadError and kin: where webdataset's handler is called
        raised = str(exc) or type(exc).__name__
    starts: List[int] = []
    keys: List[str] = []
    end = 0
    try:
        groups = list(tario._group(iter(members), shard))
    except ShardFormatError as exc:  # a repeated extension: webdataset's group_by_keys raises there
        raised = raised or exc.problem
        members = [m for m in members if m.header < (exc.offset or 0)]
        groups = list(tario._group(iter(members), shard))
    for key, group in groups:
        starts.append(group[0][1].header)
        keys.append(key)
        end = group[-1][1].end
    return starts + [end], keys, raised


@dataclass
class Salvage:
    """What webdataset 1.0.2 reads of a damaged compressed shard (:func:`salvage_compressed`).

    Attributes:
        index: a ShardIndex: the compressed file's ``size``/``xxh3_64``, the
            ``offsets``/``keys`` of the samples before the damage.
        good: decompressed bytes that decode before the damage.
        error: a :class:`ShardFormatError` naming the shard, what and where.
        raised: whether webdataset's reader raises after these samples.
    """

    index: Any
    good: int
    error: ShardFormatError
    raised: bool

    def apply(self, shard: Any) -> int:
        """Make ``shard`` (a ShardInfo without checksum) the salvaged prefix; returns its samples."""
        idx = self.index
        shard.size, shard.xxh3_64, shard.samples, shard.offsets = idx.size, idx.xxh3_64, idx.samples, idx.offsets
        shard.salvaged = True  # open_view then serves the prefix copy
        return int(idx.samples)


def _salvage_into(path: str, out: Any, kind: str, name: str) -> Salvage:
    size, digest, good, error = decompress_prefix(path, out, kind, name)
    out.flush()
    if good:
        with mmap.mmap(out.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            offsets, keys, raised = _frame_prefix(mm, good, error, name)
    else:
        offsets, keys, raised = [0], [], error or "empty"
    problem = error or "truncated"
    where = f"decodes to {good} bytes" if error is None else f"corrupt after {good} decoded bytes"
    exc = ShardFormatError(name, good, f"damaged {kind} data ({problem}): {where}, "
                           f"{len(keys)} samples before the damage" + (f" ({raised})" if raised else ""))
    return Salvage(tario.ShardIndex(size=size, xxh3_64=digest, offsets=offsets, keys=keys), good, exc,
                   raised is not None)


def salvage_compressed(path: str, shard: Optional[str] = None) -> Optional[Salvage]:
    """What webdataset 1.0.2 would read of a damaged ``.tar.gz`` / ``.tar.zst`` file.

    Deterministic for a given file (stable positions); None if ``path`` is not compressed.

    Example:
        >>> sv = salvage_compressed("cut.tgz")          # doctest: +SKIP
        >>> sv.index.samples, sv.raised, str(sv.error)  # doctest: +SKIP
        (3, True, 'cut.tgz: at byte 10752: damaged gzip data (truncated): ...')
    """
    kind = kind_of(path)
    if kind is None:
        return None
    with tempfile.TemporaryFile() as tmp:
        return _salvage_into(path, tmp, kind, shard or path)


class _View:
    """The decompressed copy of a leased compressed shard (closing it releases the lease)."""

    def __init__(self, path: str, lease: Any, pin: Optional[int] = None):
        self.path = path
        self.lease = lease
        self.shard = getattr(lease, "shard", None)
        self.cached = True
        self._pin = pin  # the copy's .lock, held shared: the evictor skips a copy in use

    @property
    def pinned(self) -> bool:
        return bool(getattr(self.lease, "pinned", False))

    def close(self) -> None:
        pin, self._pin = self._pin, None
        if pin is not None:
            os.close(pin)  # first the copy's pin, then the lease (whose release may evict the copy)
        self.lease.close()

    def __enter__(self) -> _View:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"DecompressedShard({self.path!r}, of={self.lease!r})"


def _copy_ok(dst: str, complete: bool = True) -> bool:
    """``dst`` is a finished copy: the complete decompression, or (``complete=False``) a salvaged prefix."""
    try:
        with open(dst + ".meta") as f:
            meta = json.load(f)
        return os.path.getsize(dst) == int(meta["size"]) and meta.get("complete", True) is complete
    except (OSError, ValueError, KeyError, TypeError):
        return False


def open_view(store: Any, lease: Any) -> Any:
    """``lease`` itself for a plain tar; for a compressed one, a view of its decompressed copy.

    Raises:
        ShardFormatError: corrupt compressed data.
        CacheError: the decompressed copy cannot be written.
    """
    src = lease.path
    kind = kind_of(src)
    if kind is None:
        return lease
    shard = getattr(lease, "shard", None)
    url = getattr(shard, "url", src)
    try:
        st = os.stat(src)
        digest = getattr(shard, "xxh3_64", None)
        key = digest.lower() if digest else xxhash.xxh3_64_hexdigest(
            f"{os.path.realpath(src)}\0{st.st_size}\0{st.st_mtime_ns}".encode())
        d = store.copies_dir
        os.makedirs(d, mode=0o700, exist_ok=True)
        salvaged = bool(getattr(shard, "salvaged", False))  # a damaged shard read up to the damage
        dst = os.path.join(d, f"{key}-{st.st_size}" + (".prefix.tar" if salvaged else ".tar"))
        lock = os.open(dst + ".lock", os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o600)
    except OSError as exc:
        lease.close()
        raise CacheError(f"{url}: cannot prepare the decompressed copy: {exc.strerror or exc}") from exc
    try:
        fcntl.flock(lock, fcntl.LOCK_SH)  # the pin: no evictor removes a copy while it is read
        if not _copy_ok(dst, not salvaged):
            # under a lock of its own: the pin's exclusive lock would wait for every reader
            maker = os.open(dst + ".mk", os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o600)
            try:
                fcntl.flock(maker, fcntl.LOCK_EX)
                if not _copy_ok(dst, not salvaged):  # another process may have made it meanwhile
                    _make_copy(store, shard, src, dst, kind, url, salvaged, digest)
            finally:
                os.close(maker)
        os.utime(dst, ns=(time.time_ns(), os.stat(dst).st_mtime_ns))  # a use, for the LRU (atime)
        return _View(dst, lease, lock)
    except BaseException:
        os.close(lock)
        lease.close()
        raise


def _make_copy(store: Any, shard: Any, src: str, dst: str, kind: str, url: str, salvaged: bool,
               digest: Optional[str]) -> None:
    """Write ``dst`` (under its exclusive lock): room made in the budget, a temporary name, synced, renamed."""
    offsets = getattr(shard, "offsets", None)
    if offsets:  # the manifest knows the decompressed stream's length
        store.make_room(int(offsets[-1]) + 1024)
    tmp = f"{dst}.partial.{os.getpid()}"
    try:
        with open(tmp, "w+b") as out:
            if salvaged:  # the samples before the damage, framed as salvage_compressed did
                sv = _salvage_into(src, out, kind, url)
                size, cdigest, usize = sv.index.size, sv.index.xxh3_64, sv.index.offsets[-1]
                out.truncate(usize)  # up to the last sample's padded end (zeros past the damage)
                udigest = None
                extra = {"complete": False, "good": sv.good, "error": str(sv.error), "raised": sv.raised}
            else:
                size, cdigest, usize, udigest = decompress_file(src, out, kind, url)
                extra = {"complete": True}
            out.flush()
            os.fsync(out.fileno())
        if digest and cdigest != digest.lower():
            raise CacheError(f"{url}: compressed file changed while it was decompressed")
        with open(dst + ".meta.tmp", "w") as f:
            json.dump({"url": redact_url(url), "kind": kind, "compressed_size": size,
                       "compressed_xxh3_64": cdigest, "size": usize, "xxh3_64": udigest, **extra}, f)
        os.replace(dst + ".meta.tmp", dst + ".meta")
        os.replace(tmp, dst)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
