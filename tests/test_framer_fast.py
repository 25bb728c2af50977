"""tario.parse_sample's fast path (struct header unpack, key split without the
regex) frames every sample exactly as the general framer does."""

from __future__ import annotations

import io
import os
import tarfile

import pytest

from resumewds.errors import ShardFormatError
from resumewds.tar import _io as tario

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


# ---- tario.parse_sample_as: a shard's member pattern, known ----

def _sample(names, payload=b"x" * 3000, fmt=tarfile.USTAR_FORMAT, kinds=None):
    """One sample's bytes (no end-of-archive blocks), as a shard holds it."""
    bio = io.BytesIO()
    with tarfile.open(fileobj=bio, mode="w", format=fmt, encoding="utf-8", errors="surrogateescape") as tf:
        for i, n in enumerate(names):
            ti = tarfile.TarInfo(n)
            if kinds and kinds[i] != tarfile.REGTYPE:
                ti.type = kinds[i]
                tf.addfile(ti)
                continue
            data = payload[:len(payload) - i] + bytes([i])
            ti.size = len(data)
            tf.addfile(ti, io.BytesIO(data))
    buf = bio.getvalue()
    end = len(buf)
    while end > 0 and buf[end - 512:end] == bytes(512):
        end -= 512
    return buf[:end]


def _corpus():
    out = []
    for names in NAMES:
        for fmt in (tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT):
            out.append(_sample(names, fmt=fmt))
    long_dir = "d" * 120 + "/k"  # a ustar prefix field (USTAR), a long-name header (GNU, PAX)
    exactly_100 = "k" * 96 + ".jpg"  # a name that fills the field: no NUL after it
    more = [
        ["k.cls", "k.jpg", "k.txt"], ["k.jpg", "k.cls", "k.txt"],  # another order
        ["kk.cls", "kk.jpg", "kk.txt"], ["k.cls", "k.jpg"], ["k.cls", "k.jpg", "k.txt", "k.json"],
        ["k.cls", "j.jpg", "k.txt"],                 # two keys: more than one sample
        ["k.cls", "k.jpg", "k.jpg"],                 # a repeated member
        ["k.cls", "k.jpgx", "k.txt"], ["k.cls", "k.jp", "k.txt"], ["k.CLS", "k.JPG", "k.TXT"],
        [long_dir + ".cls", long_dir + ".jpg"], [exactly_100, "k" * 96 + ".cls"],
        ["d\u00e9j\u00e0/k.cls", "d\u00e9j\u00e0/k.jpg"], ["d\udcff/k.cls", "d\udcff/k.jpg"],
        [".cls", ".jpg"], ["k", "k.jpg"], ["_k.cls", "_k.jpg"], ["__k.cls", "__k.jpg"],
        ["k.cls", "k.dir", "k.txt"], ["k.cls", "k.lnk", "k.txt"],  # regular here, not below
    ]
    for names in more:
        for fmt in (tarfile.USTAR_FORMAT, tarfile.PAX_FORMAT):
            try:
                out.append(_sample(names, fmt=fmt))
            except ValueError:  # a name USTAR cannot hold
                pass
    for payload in (b"", b"y" * 511, b"y" * 512, b"y" * 513):  # sizes at block boundaries
        out.append(_sample(["k.cls", "k.jpg", "k.txt"], payload=payload))
    out.append(_sample(["k.cls", "k.dir", "k.txt"], kinds=[tarfile.REGTYPE, tarfile.DIRTYPE, tarfile.REGTYPE]))
    out.append(_sample(["k.cls", "k.lnk", "k.txt"], kinds=[tarfile.REGTYPE, tarfile.SYMTYPE, tarfile.REGTYPE]))
    base = _sample(["k.cls", "k.jpg", "k.txt"])
    out.append(base + bytes(512))  # a stray block after the last member
    out.append(base[:-512])  # cut short
    return out


def _truth(buf):
    try:
        return tario.parse_sample(buf, "t", 0, 0, len(buf), verified=True)
    except ShardFormatError:
        return None


def test_parse_as_gives_parse_samples_result_or_none_for_every_pattern_and_sample():
    corpus = _corpus()
    patterns = {tario.member_pattern(t) for t in map(_truth, corpus) if t is not None}
    patterns |= {(("cls", b".cls"),), (("jpg", b".jpg"), ("cls", b".cls")), ()}
    hits = 0
    pre, post = _sample(["p.x"]), _sample(["q.y"])  # a sample inside a run's buffer
    for buf in corpus:
        want = _truth(buf)
        for pat in patterns:
            got = tario.parse_sample_as(buf, pat)
            assert tario.parse_sample_as(pre + buf + post, pat, len(pre), len(pre) + len(buf)) == got
            if got is not None:
                hits += 1
                assert want is not None and got == want, (buf[:100], pat)
                assert list(got) == list(want) and all(type(v) is bytes for k, v in got.items() if k != "__key__")
    assert hits > 20  # the path is taken, not only refused


def test_parse_as_takes_the_usual_sample_with_its_own_pattern():
    for names in (["k.cls", "k.jpg", "k.txt"], ["a/b.c/000123.seg.png", "a/b.c/000123.json"]):
        for fmt in (tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT):
            buf = _sample(names, fmt=fmt)
            want = _truth(buf)
            assert tario.parse_sample_as(buf, tario.member_pattern(want)) == want
    # a memoryview or a bytearray is not taken (parse_sample copies those first)
    buf = _sample(["k.cls", "k.jpg"])
    pat = tario.member_pattern(_truth(buf))
    assert tario.parse_sample_as(memoryview(buf), pat) is None  # type: ignore[arg-type]
    assert tario.parse_sample_as(bytearray(buf), pat) is None  # type: ignore[arg-type]


@pytest.mark.parametrize("field", [
    b"00000000005\0", b"00000000005 ", b"     000005\0", b"5\0\0\0\0\0\0\0\0\0\0\0",
    b"00000000009\0", b"+0000000005\0", b"0000_000005\0", b"00000000 05\0", b"\x80" + bytes(10) + b"\x05",
    b"00000000005X", b"000000000051",
])
def test_parse_as_reads_size_fields_as_parse_sample_or_refuses(field):
    clean = _sample(["k.a", "k.b"], payload=b"abcd")
    pat = tario.member_pattern(_truth(clean))
    buf = _with_size_field(clean, field)
    got, want = tario.parse_sample_as(buf, pat), _truth(buf)
    assert got is None or got == want
    if field in (b"00000000005\0", b"00000000005 "):
        assert got == want is not None  # the usual field: taken


def test_runs_are_framed_by_their_member_pattern_with_the_same_samples(tmp_path, monkeypatch):
    """``read_samples`` (one pread per run) takes the run's member pattern for
    verified bytes: the same samples as ``parse_sample`` gives, a change of
    pattern in the middle of the run included."""
    members = []
    for i in range(12):
        members += [(f"k{i:02d}.cls", b"%d" % i), (f"k{i:02d}.jpg", bytes([i]) * (300 * i))]
        if 4 <= i < 7:
            members.append((f"k{i:02d}.txt", b"t" * i))  # another pattern for three samples
    bio = io.BytesIO()
    with tarfile.open(fileobj=bio, mode="w", format=tarfile.USTAR_FORMAT) as tf:
        for name, data in members:
            ti = tarfile.TarInfo(name)
            ti.size = len(data)
            tf.addfile(ti, io.BytesIO(data))
    raw = bio.getvalue()
    path = tmp_path / "s.tar"
    path.write_bytes(raw)
    import resumewds as rw

    offsets = rw.build_manifest([str(path)]).shards[0].offsets
    calls = {"as": 0}
    real_as = tario.parse_sample_as

    def parse_as(*a, **kw):
        got = real_as(*a, **kw)
        calls["as"] += got is not None
        return got

    monkeypatch.setattr(tario, "parse_sample_as", parse_as)
    fd = os.open(path, os.O_RDONLY)
    try:
        got = tario.read_samples(fd, offsets, 0, 11, "s.tar", verified=True)
        plain = tario.read_samples(fd, offsets, 0, 11, "s.tar", verified=False)  # no patterns
    finally:
        os.close(fd)
    assert calls["as"] == 12 - 1 - 2  # all but the first, the first of the other pattern, and the one after it
    assert got == plain == [_truth(raw[offsets[j]:offsets[j + 1]]) for j in range(12)]
