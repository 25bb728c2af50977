"""webdataset's tenbin format (``.ten`` members): a list of numpy arrays in one buffer.

The buffer is a series of chunks ``b"~TenBin~" | length (int64) | bytes``
padded to a multiple of 64 bytes; each array is a header chunk (dtype code,
8-byte info string, ndim, dims, as int64) followed by a data chunk.
Little-endian, as webdataset writes it on the usual hosts.

Example:
    >>> import numpy as np
    >>> [a.tolist() for a in decode_buffer(encode_buffer([np.arange(3, dtype="int16")]))]
    [[0, 1, 2]]
"""

from __future__ import annotations

import struct
from typing import Any, List, Optional, Sequence, Union

__all__ = ["decode_buffer", "encode_buffer"]

MAGIC = b"~TenBin~"
_CODES = {"float16": "f2", "float32": "f4", "float64": "f8", "int8": "i1", "int16": "i2",
          "int32": "i4", "int64": "i8", "uint8": "u1", "uint16": "u2", "uint32": "u4", "uint64": "u8"}
_TYPES = {v: k for k, v in _CODES.items()}


def _str64(s: str) -> int:
    return struct.unpack("<q", s.encode("ascii").ljust(8, b"\0")[:8])[0]


def _unstr64(i: int) -> str:
    return struct.pack("<q", int(i)).decode("ascii").strip("\0")


def encode_buffer(arrays: List[Any], infos: Optional[Sequence[str]] = None) -> bytes:
    """Encode a list of numpy arrays.

    Raises:
        ValueError: not a list, an unsupported dtype, or 10+ dimensions.
    """
    import numpy as np

    if not isinstance(arrays, list):
        raise ValueError("requires list")
    infos = list(infos) if infos else [""]
    out = bytearray()
    for i, a in enumerate(arrays):
        a = np.asarray(a)
        code = _CODES.get(a.dtype.name)
        if code is None:
            raise ValueError(f"unsupported array type {a.dtype.name}")
        if a.ndim >= 10:
            raise ValueError("too many dimensions")
        header = np.array([_str64(code), _str64(infos[i % len(infos)]), a.ndim, *a.shape], dtype="<i8")
        for chunk in (header.tobytes(), np.ascontiguousarray(a).tobytes()):
            out += MAGIC + struct.pack("<q", len(chunk)) + chunk + bytes(-len(chunk) % 64)
    return bytes(out)


def decode_buffer(buf: Union[bytes, bytearray, memoryview], infos: Any = False) -> Any:
    """Decode a buffer into a list of numpy arrays (``infos=True``: ``(arrays, infos)``).

    Raises:
        ValueError: bad magic bytes or an unsupported dtype.
    """
    import numpy as np

    buf = bytes(buf)
    chunks = []
    off, total = 0, len(buf)
    while off < total:
        if buf[off:off + 8] != MAGIC:
            raise ValueError("magic bytes mismatch")
        (n,) = struct.unpack("<q", buf[off + 8:off + 16])
        off += 16
        chunks.append(buf[off:off + n])
        off += n + (-n % 64)
    arrays, names = [], []
    for header, data in zip(chunks[::2], chunks[1::2]):
        h = np.frombuffer(header, dtype="<i8")
        code = _unstr64(h[0])
        if code not in _TYPES:
            raise ValueError(f"unsupported array type {code!r}")
        shape = tuple(int(x) for x in h[3:3 + int(h[2])])
        count = 1
        for s in shape:
            count *= s
        arrays.append(np.frombuffer(data, dtype=_TYPES[code], count=count).reshape(shape))
        names.append(_unstr64(h[1]))
    return (arrays, names) if infos is True else arrays
