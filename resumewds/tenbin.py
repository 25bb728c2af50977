"""webdataset's tenbin format (``.ten`` members): a list of numpy arrays in one buffer.

Chunks ``b"~TenBin~" | length (int64) | bytes`` padded to 64 bytes; each
array is a header chunk (dtype code, 8-byte info, ndim, dims) and a data
chunk, little-endian.  The functions are webdataset 1.0.2's, with two fixes:
``uint32`` works, and :func:`check_infos` / :func:`check_acceptable_input_type`
check what their names say.

Example:
    >>> import numpy as np
    >>> [a.tolist() for a in decode_buffer(encode_buffer([np.arange(3, dtype="int16")]))]
    [[0, 1, 2]]
"""

from __future__ import annotations

import struct
import sys
from typing import Any, BinaryIO, Dict, List, Optional, Sequence, Union

__all__ = ["bytedata", "bytelen", "check_acceptable_input_type", "check_infos", "decode_buffer", "decode_chunks",
           "decode_header", "decode_list", "encode_buffer", "encode_chunks", "encode_header", "encode_list", "load",
           "long_to_short", "magic", "magic_bytes", "magic_str", "read", "read_chunk", "roundup", "save",
           "short_to_long", "str64", "unstr64", "write", "write_chunk"]

#: numpy dtype names and their two-letter codes in a header
long_to_short: Dict[str, str] = {"float16": "f2", "float32": "f4", "float64": "f8", "int8": "i1", "int16": "i2",
                                 "int32": "i4", "int64": "i8", "uint8": "u1", "uint16": "u2", "uint32": "u4",
                                 "uint64": "u8"}
short_to_long: Dict[str, str] = {v: k for k, v in long_to_short.items()}


def bytelen(a: Any) -> int:
    """The size in bytes of an array or a bytes-like object (ValueError: neither)."""
    if hasattr(a, "nbytes"):
        return int(a.nbytes)
    if isinstance(a, (bytearray, bytes)):
        return len(a)
    raise ValueError(a, "cannot determine nbytes")


def bytedata(a: Any) -> Any:
    """The bytes of an array (its buffer) or of a bytes-like object (ValueError: neither)."""
    if isinstance(a, (bytearray, bytes, memoryview)):
        return a
    if hasattr(a, "data"):
        return a.data
    raise ValueError(a, "cannot return bytedata")


def check_acceptable_input_type(data: Sequence[Any], allow64: bool) -> None:
    """Check that every array has a tenbin type and is not 64-bit unless ``allow64`` (else ValueError)."""
    for a in data:
        if a.dtype.name not in long_to_short:
            raise ValueError(f"unsupported array type {a.dtype.name}")
        if not allow64 and a.dtype.name in ("float64", "int64", "uint64"):
            raise ValueError("64 bit datatypes not allowed unless explicitly enabled")


def str64(s: str) -> int:
    """An ASCII string of up to 8 characters as an int64 (little-endian).

    Example:
        >>> unstr64(str64("f4"))
        'f4'
    """
    return struct.unpack("<q", s.encode("ascii").ljust(8, b"\0")[:8])[0]


def unstr64(i: int) -> str:
    """The string of :func:`str64`."""
    return struct.pack("<q", int(i)).decode("ascii").strip("\0")


def check_infos(data: Any, infos: Sequence[str], required_infos: Any = None) -> Any:
    """``data``; with ``required_infos=True``, ``(data, infos)``; with a list of infos,
    ``data`` after checking each against the actual one (ValueError if one differs)."""
    if required_infos is False or required_infos is None:
        return data
    if required_infos is True:
        return data, infos
    if not isinstance(required_infos, (tuple, list)):
        raise ValueError("required_infos must be tuple or list")
    for required, actual in zip(required_infos, infos):
        if required != actual:
            raise ValueError(f"actual info {actual} doesn't match required info {required}")
    return data


def encode_header(a: Any, info: str = "") -> Any:
    """The header chunk of an array (dtype code, ``info``, ndim, dims, as int64).

    ValueError for 10+ dimensions, a non-contiguous size, or an unsupported type.
    """
    import numpy as np

    if a.ndim >= 10:
        raise ValueError("too many dimensions")
    if a.nbytes != int(np.prod(a.shape)) * a.itemsize:
        raise ValueError("mismatch between size and shape")
    if a.dtype.name not in long_to_short:
        raise ValueError(f"unsupported array type {a.dtype.name}")
    header = [str64(long_to_short[a.dtype.name]), str64(info), len(a.shape)] + list(a.shape)
    return bytedata(np.array(header, dtype="<i8"))


def decode_header(h: Any) -> Any:
    """``(shape, dtype, info)`` of a header chunk (ValueError: an unsupported type code)."""
    import numpy as np

    hv = np.frombuffer(h, dtype="<i8")
    code = unstr64(hv[0])
    if code not in short_to_long:
        raise ValueError(f"unsupported array type {code!r}")
    return tuple(int(x) for x in hv[3:3 + int(hv[2])]), np.dtype(short_to_long[code]).newbyteorder("<"), \
        unstr64(hv[1])


def encode_list(arrays: Sequence[Any], infos: Optional[Sequence[str]] = None) -> List[Any]:
    """Header and data chunks of each array (``infos``: one per array; default ``""``)."""
    import numpy as np

    if infos is None:
        infos = [""]
    elif len(arrays) != len(infos):
        raise ValueError(f"length of list {arrays} must match length of infos {infos}")
    out: List[Any] = []
    for i, a in enumerate(arrays):
        a = np.ascontiguousarray(np.asarray(a), dtype=np.asarray(a).dtype.newbyteorder("<"))
        out += [encode_header(a, infos[i % len(infos)]), bytedata(a)]
    return out


def decode_list(chunks: Sequence[Any], infos: Any = False) -> Any:
    """The arrays of header and data chunks (see :func:`check_infos` for ``infos``)."""
    import numpy as np

    result, names = [], []
    for header, data in zip(chunks[::2], chunks[1::2]):
        shape, dtype, info = decode_header(header)
        count = 1
        for s in shape:
            count *= s
        result.append(np.frombuffer(data, dtype=dtype, count=count).reshape(shape))
        names.append(info)
    return check_infos(result, names, infos)


magic_str = "~TenBin~"
magic = str64(magic_str)
magic_bytes = unstr64(magic).encode("ascii")


def roundup(n: int, k: int = 64) -> int:
    """``n`` rounded up to a multiple of ``k``.

    Example:
        >>> roundup(65)
        128
    """
    return k * ((n + k - 1) // k)


def encode_chunks(chunks: Sequence[Any]) -> bytearray:
    """The chunks in one buffer (magic, length, bytes padded to 64)."""
    out = bytearray(sum(16 + roundup(bytelen(b)) for b in chunks))
    offset = 0
    for b in chunks:
        n = bytelen(b)
        out[offset:offset + 8] = magic_bytes
        out[offset + 8:offset + 16] = struct.pack("<q", n)
        out[offset + 16:offset + 16 + n] = bytes(b) if not isinstance(b, (bytes, bytearray)) else b
        offset += 16 + roundup(n)
    return out


def decode_chunks(buf: Union[bytes, bytearray, memoryview]) -> List[Any]:
    """The chunks of a buffer (ValueError: bad magic bytes)."""
    buf = bytes(buf)
    result = []
    offset, total = 0, len(buf)
    while offset < total:
        if buf[offset:offset + 8] != magic_bytes:
            raise ValueError("magic bytes mismatch")
        (n,) = struct.unpack("<q", buf[offset + 8:offset + 16])
        offset += 16
        result.append(buf[offset:offset + n])
        offset += roundup(n)
    return result


def encode_buffer(arrays: List[Any], infos: Optional[Sequence[str]] = None) -> bytes:
    """Encode a list of numpy arrays into one buffer (ValueError: not a list, or an array tenbin cannot hold)."""
    if not isinstance(arrays, list):
        raise ValueError("requires list")
    if infos is not None and len(infos) != len(arrays):
        infos = [infos[i % len(infos)] for i in range(len(arrays))]
    return bytes(encode_chunks(encode_list(arrays, infos=infos)))


def decode_buffer(buf: Union[bytes, bytearray, memoryview], infos: Any = False) -> Any:
    """Decode a buffer into a list of numpy arrays (``infos=True``: ``(arrays, infos)``).

    ValueError for bad magic bytes or an unsupported dtype.
    """
    return decode_list(decode_chunks(buf), infos=infos)


def write_chunk(stream: BinaryIO, buf: Any) -> None:
    """Write one chunk to a stream."""
    n = bytelen(buf)
    stream.write(magic_bytes)
    stream.write(struct.pack("<q", n))
    stream.write(bytedata(buf))
    if roundup(n) > n:
        stream.write(b"\0" * (roundup(n) - n))


def read_chunk(stream: BinaryIO) -> Optional[bytes]:
    """Read one chunk from a stream (None at its end) (ValueError: bad magic bytes or a negative length)."""
    head = stream.read(8)
    if head == b"":
        return None
    if head != magic_bytes:
        raise ValueError("magic number does not match")
    (n,) = struct.unpack("<q", stream.read(8))
    if n < 0:
        raise ValueError("negative nbytes")
    data = stream.read(n)
    if roundup(n) > n:
        stream.read(roundup(n) - n)
    return data


def write(stream: BinaryIO, arrays: Sequence[Any], infos: Optional[Sequence[str]] = None) -> None:
    """Write arrays to a stream."""
    for chunk in encode_list(arrays, infos=infos):
        write_chunk(stream, chunk)


def read(stream: BinaryIO, n: int = sys.maxsize, infos: Any = False) -> Any:
    """Read up to ``n`` arrays from a stream (ValueError: the stream ends after a header)."""
    chunks: List[Any] = []
    for _ in range(n):
        header = read_chunk(stream)
        if header is None:
            break
        data = read_chunk(stream)
        if data is None:
            raise ValueError("premature EOF")
        chunks += [header, data]
    return decode_list(chunks, infos=infos)


def save(fname: str, *args: Any, infos: Optional[Sequence[str]] = None, nocheck: bool = False) -> None:
    """Save arrays to a ``.ten`` file (ValueError: a name without ``.ten`` (unless ``nocheck``))."""
    if not nocheck and not fname.endswith(".ten"):
        raise ValueError("file name should end in .ten")
    with open(fname, "wb") as stream:
        write(stream, args, infos=infos)


def load(fname: str, infos: Any = False, nocheck: bool = False) -> Any:
    """Load the arrays of a ``.ten`` file (ValueError: a name without ``.ten`` (unless ``nocheck``))."""
    if not nocheck and not fname.endswith(".ten"):
        raise ValueError("file name should end in .ten")
    with open(fname, "rb") as stream:
        return read(stream, infos=infos)
