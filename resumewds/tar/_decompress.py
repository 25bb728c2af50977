"""Compressed shard codecs: gzip and zstd by magic bytes, and whole-file decompression.

zstd needs the optional ``zstandard`` package, imported at the first zstd shard.

Example:
    >>> kind_of_bytes(b"\\x1f\\x8b\\x08\\x00"), kind_of_bytes(b"ustar")
    ('gzip', None)
"""

from __future__ import annotations

import contextlib
import mmap
import tempfile
from typing import Any, Iterator, Optional, Tuple

import xxhash

from ..errors import ShardFormatError

__all__ = ["COMPRESSED_SUFFIXES", "decompress_file", "decompressed", "kind_of", "kind_of_bytes"]

#: names of compressed shards: their ``size`` in a manifest is the compressed
#: file's, their offsets are positions in the decompressed tar
COMPRESSED_SUFFIXES = (".tar.gz", ".tgz", ".tar.zst", ".tzst", ".tar.zstd")

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


def zstandard_module(shard: str) -> Any:
    """The optional ``zstandard`` package (the [formats] extra), or a ShardFormatError naming the fix."""
    try:
        import zstandard
    except ImportError:
        raise ShardFormatError(shard, 0, "zstd-compressed shard: install the 'zstandard' package "
                               "(pip install resumewds[formats]) to read it") from None
    return zstandard


def _reader(kind: str, f: Any, shard: str) -> Any:
    if kind == "gzip":
        import gzip  # lazy: only gzip shards need it

        return gzip.GzipFile(fileobj=f, mode="rb")
    return zstandard_module(shard).ZstdDecompressor().stream_reader(f, read_across_frames=True)


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


@contextlib.contextmanager
def decompressed(path: str, kind: str, shard: str) -> Iterator[Tuple[int, str, Any]]:
    """The decompressed stream of a compressed file, in a temporary file mapped read-only.

    Yields:
        ``(compressed size, compressed xxh3_64, the decompressed bytes)``.

    Raises:
        ShardFormatError: the compressed data is corrupt, truncated or decompresses to nothing.
    """
    with tempfile.TemporaryFile() as tmp:
        size, digest, usize, _ = decompress_file(path, tmp, kind, shard)
        tmp.flush()
        if usize == 0:
            raise ShardFormatError(shard, 0, f"{kind} data decompresses to nothing (not a tar archive)")
        with mmap.mmap(tmp.fileno(), 0, access=mmap.ACCESS_READ) as mm:
            yield size, digest, mm
