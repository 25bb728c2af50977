"""tario.parse_sample's fast path (struct header unpack, key split without the
regex) frames every sample exactly as the general framer does (issue 17 item 2)."""

from __future__ import annotations

import io
import tarfile

import pytest

from resumewds import tario
from resumewds.errors import ShardFormatError

NAMES = [
    ["k.jpg", "k.cls", "k.txt"],
    ["dir/k.JPG", "dir/k.Cls"],                 # a directory; extensions lower-cased
    ["a.b/c.d.e", "a.b/c.f"],                   # a dot in the directory, a dotted extension
    ["a/.b", "a/.c"],                           # basename starting with a dot: _KEY_RE's reading
    ["p\nq/r.s", "p\nq/r.t"],                   # a newline in the directory
    ["k.", "k.x"],                              # an empty extension
    ["x/y/z.tar.gz", "x/y/z.json"],
    ["_k.jpg", "_k.cls"],                       # a key starting with "_" (not a "__" entry)
    ["d/_k.jpg", "d/_k.cls"],
]


def _tar(names, payload=b"x" * 3000, fmt=tarfile.USTAR_FORMAT):
    bio = io.BytesIO()
    with tarfile.open(fileobj=bio, mode="w", format=fmt) as tf:
        for i, n in enumerate(names):
            data = payload + bytes([i])
            ti = tarfile.TarInfo(n)
            ti.size = len(data)
            tf.addfile(ti, io.BytesIO(data))
    return bio.getvalue()


def _general(buf, end):
    groups = list(tario._group(tario.iter_members(buf, "t", end=end, archive_end=False), "t"))
    assert len(groups) == 1
    key, members = groups[0]
    out = {"__key__": key}
    for ext, m in members:
        out[ext] = bytes(buf[m.data:m.data + m.size])
    return out


@pytest.mark.parametrize("names", NAMES)
@pytest.mark.parametrize("fmt", [tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])
def test_fast_path_frames_as_the_general_framer(names, fmt):
    buf = _tar(names, fmt=fmt)
    end = len(buf)  # without the end-of-archive blocks (below)
    while end > 0 and buf[end - 512:end] == bytes(512):
        end -= 512
    got = tario.parse_sample(buf, "t", 0, 0, end)
    assert got == _general(buf, end)
    assert tario.parse_sample(buf, "t", 0, 0, end, verified=True) == got
    assert all(type(v) is bytes for k, v in got.items() if k != "__key__")
    # a non-bytes buffer (memoryview) takes the copying path, same result
    assert tario.parse_sample(memoryview(buf), "t", 0, 0, end) == got


def test_fast_path_still_checks_the_header_checksum():
    buf = bytearray(_tar(["k.jpg", "k.cls"]))
    buf[120] ^= 0x01  # a byte of the gid field: the checksum no longer matches
    end = len(buf)
    while buf[end - 512:end] == bytes(512):
        end -= 512
    with pytest.raises(ShardFormatError):
        tario.parse_sample(bytes(buf), "t", 0, 0, end)


def _with_size_field(buf: bytes, field: bytes) -> bytes:
    """``buf`` with its first header's size field replaced (checksum recomputed)."""
    b = bytearray(buf)
    b[124:136] = field
    b[148:156] = b" " * 8
    b[148:156] = b"%06o\0 " % sum(b[:512])
    return bytes(b)


@pytest.mark.parametrize("field, ok", [
    (b"00000000005\0", True), (b"00000000005 ", True), (b"     000005\0", True),
    (b"5\0\0\0\0\0\0\0\0\0\0\0", True), (b"00000000009\0", False), (b"+0000000005\0", False),
    (b"0000_000005\0", False), (b"00000000 05\0", False),
])
@pytest.mark.parametrize("verified", [False, True])
def test_size_fields_read_as_the_general_framer_reads_them(field, ok, verified):
    buf = _with_size_field(_tar(["k.a", "k.b"], payload=b"abcd"), field)  # 5 bytes: "abcd" + index
    end = len(buf)
    while end > 0 and buf[end - 512:end] == bytes(512):
        end -= 512
    if ok:
        assert tario.parse_sample(buf, "t", 0, 0, end, verified=verified) == _general(buf, end)
    else:
        with pytest.raises(ShardFormatError):
            _general(buf, end)
        with pytest.raises(ShardFormatError):
            tario.parse_sample(buf, "t", 0, 0, end, verified=verified)
