"""Compressed shards (``.tar.gz`` / ``.tgz``, and ``.tar.zst`` with ``zstandard``).

Random access needs an uncompressed tar, so a compressed shard is
decompressed once and then read by seeking, like any other shard:

* The manifest describes the compressed file (``size`` and ``xxh3_64`` are
  the compressed bytes', which the cache fetches and verifies as usual) and
  the *uncompressed* stream's sample offsets (``offsets``).  Indexing
  (:func:`scan_compressed`, called by :func:`resumewds.tario.scan_file`)
  hashes the compressed file and scans a decompressed copy.
* Reading: :meth:`resumewds.cache.ShardStore.acquire` hands the verified
  compressed file to :func:`open_view`, which returns the decompressed copy
  under ``<cache_dir>/decompressed/<xxh3 of the compressed file>.tar``,
  made once (under a lock, written to a temporary name, synced, renamed)
  and shared by every process; a copy whose size no longer matches its
  ``.meta`` is made again.

Compression is recognised by the file's magic bytes, not its name.
Decompressed copies are not counted against ``cache_size`` and are not
evicted by the cache (remove ``<cache_dir>/decompressed`` to reclaim them).

Example:
    >>> kind_of_bytes(b"\\x1f\\x8b\\x08\\x00"), kind_of_bytes(b"ustar")
    ('gzip', None)
"""

from __future__ import annotations

import fcntl
import json
import mmap
import os
import tempfile
from typing import Any, Optional, Tuple

import xxhash

from .errors import CacheError, ShardFormatError

__all__ = ["decompress_file", "kind_of", "kind_of_bytes", "open_view", "scan_compressed"]

_MAGIC = {b"\x1f\x8b": "gzip", b"\x28\xb5\x2f\xfd": "zstd"}
_CHUNK = 1 << 20


def kind_of_bytes(head: bytes) -> Optional[str]:
    """``"gzip"``, ``"zstd"`` or None for the first bytes of a file."""
    for magic, kind in _MAGIC.items():
        if head[:len(magic)] == magic:
            return kind
    return None


def kind_of(path: str) -> Optional[str]:
    """The compression of a local file (by magic bytes), or None."""
    try:
        with open(path, "rb") as f:
            return kind_of_bytes(f.read(4))
    except OSError:
        return None


def _reader(kind: str, f: Any, shard: str) -> Any:
    if kind == "gzip":
        import gzip

        return gzip.GzipFile(fileobj=f, mode="rb")
    try:
        import zstandard
    except ImportError:
        raise ShardFormatError(shard, 0, "zstd-compressed shard: install the 'zstandard' package "
                               "(pip install resumewds[formats]) to read it") from None
    return zstandard.ZstdDecompressor().stream_reader(f, read_across_frames=True)


def decompress_file(src: str, dst: Any, kind: str, shard: Optional[str] = None) -> Tuple[int, str, int, str]:
    """Decompress ``src`` into the open binary file ``dst``.

    Returns:
        ``(compressed size, compressed xxh3_64, uncompressed size, uncompressed xxh3_64)``.

    Raises:
        ShardFormatError: the compressed data is corrupt or truncated.
    """
    name = shard or src
    hin, hout = xxhash.xxh3_64(), xxhash.xxh3_64()
    nin = nout = 0

    class _Hashing:
        def __init__(self, f: Any):
            self.f = f

        def read(self, n: int = -1) -> bytes:
            nonlocal nin
            b = self.f.read(n)
            hin.update(b)
            nin += len(b)
            return b

        def readinto(self, buf: Any) -> int:
            b = self.read(len(buf))
            buf[:len(b)] = b
            return len(b)

    with open(src, "rb") as raw:
        try:
            r = _reader(kind, _Hashing(raw), name)
            while True:
                b = r.read(_CHUNK)
                if not b:
                    break
                hout.update(b)
                nout += len(b)
                dst.write(b)
            rest = raw.read()  # bytes after the compressed stream (none for a well-formed file)
            hin.update(rest)
            nin += len(rest)
        except ShardFormatError:
            raise
        except (OSError, EOFError, ValueError) as exc:
            raise ShardFormatError(name, nin, f"corrupt {kind} data: {exc}") from exc
        except Exception as exc:  # zstandard.ZstdError
            raise ShardFormatError(name, nin, f"corrupt {kind} data: {exc}") from exc
    return nin, hin.hexdigest(), nout, hout.hexdigest()


def scan_compressed(path: str, shard: Optional[str] = None, kind: Optional[str] = None) -> Any:
    """Index a compressed shard: the compressed file's size and xxh3_64, the tar's offsets.

    Returns:
        A :class:`resumewds.tario.ShardIndex`.
    """
    from . import tario

    name = shard or path
    kind = kind or kind_of(path)
    if kind is None:
        return tario.scan_file(path, shard)
    with tempfile.TemporaryFile() as tmp:
        size, digest, usize, _ = decompress_file(path, tmp, kind, name)
        tmp.flush()
        if usize == 0:
            raise ShardFormatError(name, 0, f"{kind} data decompresses to nothing (not a tar archive)")
        with mmap.mmap(tmp.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            try:
                offsets, keys, _ = tario.scan_buffer(mm, name)
            except ShardFormatError as exc:  # say where the offset is: in the decompressed stream
                where = exc.offset if exc.offset is not None else 0
                raise ShardFormatError(name, where, f"{kind}-compressed, but the decompressed data is not a "
                                       f"well-formed tar archive (at byte {where} of it: {exc.problem})") from exc
    return tario.ShardIndex(size=size, xxh3_64=digest, offsets=offsets, keys=keys)


class _View:
    """The decompressed copy of a leased compressed shard (closing it releases the lease)."""

    def __init__(self, path: str, lease: Any):
        self.path = path
        self.lease = lease
        self.shard = getattr(lease, "shard", None)
        self.cached = True

    @property
    def pinned(self) -> bool:
        return bool(getattr(self.lease, "pinned", False))

    def close(self) -> None:
        self.lease.close()

    def __enter__(self) -> _View:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"DecompressedShard({self.path!r}, of={self.lease!r})"


def _copy_ok(dst: str) -> bool:
    try:
        with open(dst + ".meta") as f:
            meta = json.load(f)
        return os.path.getsize(dst) == int(meta["size"])
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
        d = os.path.join(store.cache_dir, "decompressed")
        os.makedirs(d, exist_ok=True)
        dst = os.path.join(d, f"{key}-{st.st_size}.tar")
        if _copy_ok(dst):
            return _View(dst, lease)
        lock = os.open(dst + ".lock", os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o666)
    except OSError as exc:
        lease.close()
        raise CacheError(f"{url}: cannot prepare the decompressed copy: {exc.strerror or exc}") from exc
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not _copy_ok(dst):  # another process may have made it meanwhile
            tmp = f"{dst}.partial.{os.getpid()}"
            try:
                with open(tmp, "wb") as out:
                    try:
                        size, cdigest, usize, udigest = decompress_file(src, out, kind, url)
                    except ShardFormatError:
                        if not getattr(shard, "salvaged", False):
                            raise
                        # a damaged shard a handler kept the samples of (tariterators.salvage_shard)
                        from .tariterators import decompress_prefix

                        out.seek(0)
                        out.truncate()
                        size, cdigest, usize, udigest = decompress_prefix(src, out, kind)
                    out.flush()
                    os.fsync(out.fileno())
                if digest and cdigest != digest.lower():
                    raise CacheError(f"{url}: compressed file changed while it was decompressed")
                with open(dst + ".meta.tmp", "w") as f:
                    json.dump({"url": url, "kind": kind, "compressed_size": size,
                               "compressed_xxh3_64": cdigest, "size": usize, "xxh3_64": udigest}, f)
                os.replace(dst + ".meta.tmp", dst + ".meta")
                os.replace(tmp, dst)
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
        return _View(dst, lease)
    except BaseException:
        lease.close()
        raise
    finally:
        os.close(lock)
