"""Tests for resumewds.tar: grouping identical to WebDataset's, every tar
dialect we meet in the wild, strict errors, and a hypothesis fuzz."""

from __future__ import annotations

import gzip
import os
import random
import subprocess
import sys
import tarfile
from typing import Any, Dict, List, Tuple

import pytest
import webdataset as wds
import xxhash
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from conftest import tar_bytes
from resumewds import sample_digest, scan_file
from resumewds.errors import ShardFormatError
from resumewds.tar import split_key
from resumewds.tar._frame import BLOCK, iter_members
from resumewds.tar._io import parse_sample, read_sample, read_samples
from resumewds.tar._scan import iter_samples_bytes, iter_samples_file, scan_buffer

pytestmark = pytest.mark.usefixtures("cache_dir")

Flat = List[Tuple[str, Dict[str, bytes]]]


def flat(samples) -> Flat:
    """(key, {ext: bytes}) for each sample, raw members only."""
    return [(s["__key__"], {k: bytes(v) for k, v in s.items() if not k.startswith("__")})
            for s in samples]


def via_webdataset(path: str) -> Flat:
    return flat(wds.WebDataset(path, shardshuffle=False, empty_check=False))


def via_ranges(path: str) -> Flat:
    idx = scan_file(path)
    out = []
    fd = os.open(path, os.O_RDONLY)
    try:
        for i in range(idx.samples):
            s = read_sample(fd, idx.offsets[i], idx.offsets[i + 1], path)
            assert s["__key__"] == idx.keys[i]
            out.append(s)
        if idx.samples:
            assert flat(read_samples(fd, idx.offsets, 0, idx.samples - 1, path)) == flat(out)
    finally:
        os.close(fd)
    return flat(out)


def assert_like_webdataset(path: str, min_samples: int = 1) -> Flat:
    expected = via_webdataset(path)
    assert len(expected) >= min_samples
    streamed = list(iter_samples_file(path))
    assert all(s["__url__"] == path for s in streamed)
    assert flat(streamed) == expected
    assert via_ranges(path) == expected
    idx = scan_file(path)
    with open(path, "rb") as f:
        raw = f.read()
    assert idx.size == len(raw)
    assert idx.xxh3_64 == xxhash.xxh3_64_hexdigest(raw)
    assert idx.keys == [k for k, _ in expected]
    assert idx.offsets == sorted(idx.offsets) and idx.offsets[-1] <= len(raw)
    return expected


# A mix of everything the grouping must get right, in archive order.
LONG_DIR = "/".join(["d%02d.sub" % i for i in range(12)])  # > 100 chars, has dots
MIXED: List[Tuple] = [
    ("top", None),                                # directory
    ("top/a.txt", b"a-txt"),
    ("top/a.CLS", b"1"),                          # extension lowercased
    ("top/link.txt", None, tarfile.SYMTYPE),      # non-regular: skipped
    ("top/a.seg.PNG", b"png-bytes"),              # multi-dot extension
    ("__meta__", b"skipped top-level meta"),      # top-level __*__ file
    ("top/b.txt", b""),                           # empty member
    ("README", b"no extension: skipped"),
    ("top/b.json", b"{}"),
    ("x.y/c.d/key.txt", b"dots in dirs"),
    (LONG_DIR + "/deep.txt", b"deep"),
    (LONG_DIR + "/deep.cls", b"7"),
    ("top/a.npy", b"same key again, not consecutive: a new sample"),
    ("k" * 120 + ".txt", b"long basename"),
    ("__skip__/z.txt", b"under a meta dir: skipped"),
]
MIXED_USTAR = [m for m in MIXED if not m[0].startswith("k" * 120)]  # ustar cannot hold it


@pytest.mark.parametrize("fmt,members", [
    (tarfile.USTAR_FORMAT, MIXED_USTAR),
    (tarfile.GNU_FORMAT, MIXED),
    (tarfile.PAX_FORMAT, MIXED),
], ids=["ustar", "gnu", "pax"])
def test_python_tarfile_formats_group_like_webdataset(tmp_path, fmt, members):
    path = str(tmp_path / "x.tar")
    with open(path, "wb") as f:
        f.write(tar_bytes(members, fmt))
    got = assert_like_webdataset(path, min_samples=5)
    keys = [k for k, _ in got]
    assert keys[:2] == ["top/a", "top/b"]
    assert got[0][1] == {"txt": b"a-txt", "cls": b"1", "seg.png": b"png-bytes"}
    assert "x.y/c.d/key" in keys and LONG_DIR + "/deep" in keys
    assert keys.count("top/a") == 2
    assert not any(k.startswith(("__meta__", "README", "__skip__")) for k in keys)


def test_each_long_name_mechanism_is_exercised(tmp_path):
    """ustar prefix, GNU 'L' long names and pax 'x' path records all occur."""
    name = LONG_DIR + "/deep.txt"
    ustar = tar_bytes([(name, b"x")], tarfile.USTAR_FORMAT)
    assert ustar[345:345 + 5] != bytes(5)  # prefix field used
    gnu = tar_bytes([("k" * 120 + ".txt", b"x")], tarfile.GNU_FORMAT)
    assert gnu[156:157] == b"L"
    pax = tar_bytes([("k" * 120 + ".txt", b"x")], tarfile.PAX_FORMAT)
    assert pax[156:157] == b"x"
    for data, expect in [(ustar, name), (gnu, "k" * 120 + ".txt"), (pax, "k" * 120 + ".txt")]:
        assert [m.name for m in iter_members(data, "mem")] == [expect]


def test_pax_non_ascii_names_and_size(tmp_path):
    members = [("ünï/ça.txt", b"x" * 700), ("ünï/ça.cls", b"3")]
    path = str(tmp_path / "u.tar")
    with open(path, "wb") as f:
        f.write(tar_bytes(members, tarfile.PAX_FORMAT))
    got = assert_like_webdataset(path)
    assert got == [("ünï/ça", {"txt": b"x" * 700, "cls": b"3"})]


def _write_tree(root, files: List[Tuple[str, bytes]]) -> None:
    for name, data in files:
        p = root / name
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_bytes(data)


@pytest.mark.parametrize("fmt", ["gnu", "posix", "ustar"])
def test_gnu_tar_formats_group_like_webdataset(tmp_path, fmt):
    src = tmp_path / "src"
    long_dir = "/".join(["dir%02d" % i for i in range(15)])  # 89 chars: splittable for ustar
    rng = random.Random(fmt)
    files = []
    for i in range(6):
        for ext in ("cls", "jpg", "TXT"):
            files.append((f"part{i % 2}/s{i:03d}.{ext}", rng.randbytes(rng.randint(0, 1500))))
    files.append((long_dir + "/" + "n" * 40 + ".bin", b"long"))
    files.append((long_dir + "/" + "n" * 40 + ".cls", b"2"))
    _write_tree(src, files)
    (src / "emptydir").mkdir()
    os.symlink("part0", src / "alink")
    out = str(tmp_path / f"{fmt}.tar")
    subprocess.run(["/usr/bin/tar", f"--format={fmt}", "--sort=name", "-cf", out, "-C", str(src),
                    "alink", "dir00", "emptydir", "part0", "part1"], check=True)
    with tarfile.open(out) as tf:
        types = {ti.type for ti in tf}
    assert tarfile.DIRTYPE in types and tarfile.SYMTYPE in types  # non-regular entries present
    got = assert_like_webdataset(out, min_samples=7)
    assert got[0][0] == long_dir + "/" + "n" * 40
    assert set(got[1][1]) == {"cls", "jpg", "txt"}


def test_webdataset_writers_group_like_webdataset(tmp_path):
    rng = random.Random(1)
    samples = [{"__key__": f"k{i:04d}", "bin": rng.randbytes(rng.randint(0, 900)),
                "cls": str(i % 3).encode(), "txt": f"t{i}".encode()} for i in range(23)]
    one = str(tmp_path / "tw.tar")
    with wds.TarWriter(one, mtime=0) as w:
        for s in samples:
            w.write(s)
    got = assert_like_webdataset(one, min_samples=23)
    assert got == flat(samples)
    pattern = str(tmp_path / "sw-%03d.tar")
    with wds.ShardWriter(pattern, maxcount=10, verbose=0, mtime=0) as w:
        for s in samples:
            w.write(s)
    paths = sorted(str(p) for p in tmp_path.glob("sw-*.tar"))
    assert len(paths) == 3
    allgot: Flat = []
    for p in paths:
        allgot += assert_like_webdataset(p)
    assert allgot == flat(samples)


def test_synth_shards_group_like_webdataset(shards):
    for p in shards[:2]:
        assert len(assert_like_webdataset(p)) == 37


def test_split_key_like_webdataset():
    from webdataset.tariterators import base_plus_ext

    for name in ["a.txt", "dir/x.y/abc.seg.PNG", "README", ".hidden", "d/.x", "a.", "x/y",
                 "./a.b.c", "a/b.c/d", "weird..ext"]:
        assert split_key(name) == base_plus_ext(name), name


def test_consecutive_only_and_duplicate_extension(tmp_path):
    data = tar_bytes([("a.txt", b"1"), ("b.txt", b"2"), ("a.cls", b"3")])
    assert [s["__key__"] for s in iter_samples_bytes(data, "m")] == ["a", "b", "a"]
    for dup in ([("a.txt", b"1"), ("a.txt", b"2")], [("a.txt", b"1"), ("a.TXT", b"2")]):
        data = tar_bytes([("z.txt", b"ok")] + dup)
        with pytest.raises(ShardFormatError) as ei:
            list(iter_samples_bytes(data, "dup.tar"))
        assert ei.value.shard == "dup.tar"
        assert ei.value.offset == 4 * BLOCK  # header of the second a.txt
        assert "duplicate extension 'txt'" in str(ei.value)
        with pytest.raises(ShardFormatError):
            scan_buffer(data, "dup.tar")


def test_sample_range_of_a_duplicate_is_refused():
    data = tar_bytes([("a.txt", b"1"), ("a.txt", b"2")])
    with pytest.raises(ShardFormatError):
        parse_sample(data, "m", start=0, end=4 * BLOCK)


def test_sample_digest_contract():
    s = {"__key__": "k", "__url__": "u", "txt": b"hi", "cls": b"1", "a.b": b"Z", "__pad__": True}
    assert sample_digest(s) == xxhash.xxh3_64_hexdigest(b"Z" + b"1" + b"hi")
    assert sample_digest({"__key__": "k"}) == xxhash.xxh3_64_hexdigest(b"")
    assert sample_digest({"txt": "hi", "cls": 1}) == xxhash.xxh3_64_hexdigest(b"1hi")
    assert sample_digest({"cls": bytearray(b"1"), "txt": memoryview(b"hi")}) == \
        xxhash.xxh3_64_hexdigest(b"1hi")
    assert len(sample_digest(s)) == 16


# ---------------------------------------------------------------------------
# Malformed input
# ---------------------------------------------------------------------------

GOOD = tar_bytes([(f"s{i}.{ext}", bytes([i]) * (100 * i + 3)) for i in range(4)
                  for ext in ("txt", "cls", "bin")])
GOOD_SAMPLES = flat(iter_samples_bytes(GOOD, "good"))


def member_headers(data: bytes) -> List[int]:
    return [m.header for m in iter_members(data, "x")]


def errors_of(path: str) -> List[ShardFormatError]:
    """The error from each way of reading a whole file (all must raise)."""
    errs = []
    for fn in (lambda: scan_file(path), lambda: list(iter_samples_file(path))):
        with pytest.raises(ShardFormatError) as ei:
            fn()
        errs.append(ei.value)
    return errs


def check_error(path: str, offset: int, words: str) -> None:
    for e in errors_of(path):
        assert e.shard == path
        assert e.offset == offset, (e.offset, str(e))
        assert str(e).startswith(f"{path}: at byte {offset}: ")
        assert words in e.problem, str(e)


def write(tmp_path, name: str, data: bytes) -> str:
    p = str(tmp_path / name)
    with open(p, "wb") as f:
        f.write(data)
    return p


def test_not_a_tar(tmp_path):
    check_error(write(tmp_path, "empty.tar", b""), 0, "empty file")
    rnd = random.Random(0).randbytes(4096)
    for e in errors_of(write(tmp_path, "rand.tar", rnd)):
        assert e.offset == 0
    check_error(write(tmp_path, "zeros.tar", b"0" * 1024), 0, "not a tar archive")
    # BUG (see test_gzip_is_named): a non-octal checksum field at byte 0 gives
    # "bad checksum field" instead of "not a tar archive".
    check_error(write(tmp_path, "text.tar", b"hello world\n" * 100), 0, "not a tar archive")


def test_gzip_is_named(tmp_path):
    """A .tar.gz must be reported as compressed, not as a generic bad header.

    BUG: _check_header parses the checksum field first; on gzip bytes that
    field is not octal, so _octal raises "bad checksum field" and the gzip
    branch is unreachable.  Fix in report.
    """
    big = tar_bytes([("a.bin", random.Random(3).randbytes(5000))])
    for i, tar in enumerate([GOOD, big]):  # compresses to < 512 bytes, and to > 512 bytes
        gz = gzip.compress(tar, mtime=0)
        assert (len(gz) < BLOCK) == (i == 0)
        p = write(tmp_path, f"x{i}.tar.gz", gz)
        # scan_file indexes a compressed shard (compressed size and
        # checksum, offsets of the tar stream); the in-place readers name it
        idx = scan_file(p)
        assert idx.size == len(gz) and idx.offsets == scan_buffer(tar, "t")[0]
        with pytest.raises(ShardFormatError, match="gzip"):
            list(iter_samples_file(p))


def test_truncated_header(tmp_path):
    h = member_headers(GOOD)[4]
    check_error(write(tmp_path, "t.tar", GOOD[:h + 100]), h, "truncated tar header")


def test_truncated_member(tmp_path):
    m = list(iter_members(GOOD, "x"))[5]
    check_error(write(tmp_path, "t.tar", GOOD[:m.data + 10]), m.header, "truncated member")


def test_bad_header_checksum(tmp_path):
    h = member_headers(GOOD)[3]
    bad = bytearray(GOOD)
    bad[h + 1] ^= 0x20  # inside the name
    check_error(write(tmp_path, "c.tar", bytes(bad)), h, "checksum")
    bad = bytearray(GOOD)
    bad[h + 150] = ord("9")  # checksum field not octal
    check_error(write(tmp_path, "c2.tar", bytes(bad)), h, "checksum")


def test_missing_end_of_archive(tmp_path):
    m = list(iter_members(GOOD, "x"))
    end = m[-1].end
    assert GOOD[end:end + BLOCK] == bytes(BLOCK)
    check_error(write(tmp_path, "eof.tar", GOOD[:end]), end, "end-of-archive")
    # cut at a sample boundary too
    check_error(write(tmp_path, "eof2.tar", GOOD[:m[6].header]), m[6].header, "end-of-archive")


def test_no_partial_sample_is_ever_delivered():
    """Cut the archive everywhere: what is yielded before the error is a
    prefix of the true samples, each complete."""
    for cut in range(0, len(GOOD), 97):
        got = []
        try:
            for s in iter_samples_bytes(GOOD[:cut], "cut"):
                got.append(s)
        except ShardFormatError:
            pass
        else:
            assert flat(got) == GOOD_SAMPLES, cut
        assert flat(got) == GOOD_SAMPLES[:len(got)], cut
    # the last sample is only released once the end marker proves it complete
    end = list(iter_members(GOOD, "x"))[-1].end
    got = []
    with pytest.raises(ShardFormatError):
        for s in iter_samples_bytes(GOOD[:end], "cut"):
            got.append(s)
    assert flat(got) == GOOD_SAMPLES[:-1]


def test_ranged_read_past_end_of_file(tmp_path):
    p = write(tmp_path, "short.tar", GOOD[:1500])
    fd = os.open(p, os.O_RDONLY)
    try:
        with pytest.raises(ShardFormatError) as ei:
            read_sample(fd, 1024, 4096, p)
    finally:
        os.close(fd)
    assert ei.value.shard == p and ei.value.offset == 1500
    assert "4096" in str(ei.value)


def test_range_not_holding_one_sample():
    idx_offsets, keys, _ = scan_buffer(GOOD, "g")
    with pytest.raises(ShardFormatError) as ei:  # two samples in one range
        parse_sample(GOOD[idx_offsets[0]:idx_offsets[2]], "g", base=idx_offsets[0])
    assert ei.value.offset == idx_offsets[0]
    with pytest.raises(ShardFormatError):  # range that ends inside a member
        parse_sample(GOOD[idx_offsets[1]:idx_offsets[2] - BLOCK], "g", base=idx_offsets[1])
    with pytest.raises(ShardFormatError):  # range running into the end marker
        end = idx_offsets[-1]
        parse_sample(GOOD[idx_offsets[-2]:end + BLOCK], "g", base=idx_offsets[-2])


# ---------------------------------------------------------------------------
# Fuzzing: mutations and truncations give samples or ShardFormatError only.
# ---------------------------------------------------------------------------

FUZZ_BASES = [
    tar_bytes([(f"d/s{i}.{ext}", bytes([65 + i]) * (37 * i + ext_len))
               for i in range(3) for ext_len, ext in ((1, "txt"), (600, "bin"))], fmt)
    for fmt in (tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT)
]
FUZZ_BASES.append(tar_bytes([("k" * 130 + ".txt", b"x"), ("k" * 130 + ".cls", b"1"),
                             ("dir", None), ("b.txt", b"b" * 513)], tarfile.GNU_FORMAT))
FUZZ_BASES.append(tar_bytes([("k" * 130 + ".txt", b"x"), ("k" * 130 + ".cls", b"1"),
                             ("dir", None), ("b.txt", b"b" * 513)], tarfile.PAX_FORMAT))


def fix_checksum(buf: bytearray, h: int) -> None:
    blk = buf[h:h + BLOCK]
    blk[148:156] = b" " * 8
    buf[h + 148:h + 156] = b"%06o\0 " % sum(blk)


def read_all_ways(data: bytes) -> Any:
    """Samples from streaming; when scanning succeeds, ranged reads must agree."""
    try:
        streamed = flat(iter_samples_bytes(data, "fuzz"))
    except ShardFormatError as e:
        assert e.shard == "fuzz" and 0 <= e.offset <= len(data)
        streamed = None
    try:
        offsets, keys, _ = scan_buffer(data, "fuzz")
    except ShardFormatError as e:
        assert e.shard == "fuzz" and 0 <= e.offset <= len(data)
        assert streamed is None  # scanning and streaming agree on validity
        return None
    assert streamed is not None
    assert keys == [k for k, _ in streamed]
    ranged = [parse_sample(data, "fuzz", base=offsets[i], start=offsets[i], end=offsets[i + 1])
              for i in range(len(keys))]
    assert flat(ranged) == streamed
    return streamed


@settings(max_examples=300, deadline=500, suppress_health_check=[HealthCheck.too_slow])
@given(base=st.sampled_from(range(len(FUZZ_BASES))),
       edits=st.lists(st.tuples(st.integers(0, 1 << 30), st.integers(0, 255)), max_size=4),
       cut=st.one_of(st.none(), st.integers(0, 1 << 30)))
def test_fuzz_random_bytes(base, edits, cut):
    data = bytearray(FUZZ_BASES[base])
    for pos, val in edits:
        data[pos % len(data)] = val
    if cut is not None:
        del data[cut % (len(data) + 1):]
    read_all_ways(bytes(data))


HEADER_FIELDS = [(0, 100), (124, 12), (156, 1), (257, 8), (345, 155)]


@settings(max_examples=300, deadline=500, suppress_health_check=[HealthCheck.too_slow])
@given(base=st.sampled_from(range(len(FUZZ_BASES))),
       which=st.integers(0, 1 << 20), field=st.sampled_from(HEADER_FIELDS),
       value=st.one_of(st.binary(max_size=12),
                       st.sampled_from([b"-1", b"0", b"7777777777", b"\x80" + bytes(10) + b"\x05",
                                        b"\xff" * 12, b"1000", b"L", b"x", b"g", b"5", b"7",
                                        b"__meta__", b"a.txt", b"d/s0.TXT", b"ustar\x00"])))
def test_fuzz_header_fields_with_valid_checksums(base, which, field, value):
    """Mutations that pass the checksum reach the deeper parsing paths."""
    data = bytearray(FUZZ_BASES[base])
    heads = []
    off = 0
    while off + BLOCK <= len(data) and data[off:off + BLOCK] != bytes(BLOCK):
        heads.append(off)
        size = int(data[off + 124:off + 136].split(b"\0")[0].strip() or b"0", 8)
        off += BLOCK + -(-size // BLOCK) * BLOCK
    h = heads[which % len(heads)]
    start, length = field
    data[h + start:h + start + length] = value[:length].ljust(length, b"\0")
    fix_checksum(data, h)
    read_all_ways(bytes(data))


def test_dangling_extended_header_before_end_marker(tmp_path):
    """A GNU long-name header with no member after it, then the end marker.

    BUG: iter_members returns at the end marker without checking for a
    pending extended header, so scanning accepts the archive and indexes it,
    but the last sample's range then holds the dangling header and every
    read of it fails ("extended header without a following member").
    Found by test_fuzz_header_fields_with_valid_checksums.  Fix in report.
    """
    data = bytearray(GOOD)
    last = member_headers(GOOD)[-1]
    data[last + 156] = ord("L")
    fix_checksum(data, last)
    eof = list(iter_members(GOOD, "x"))[-1].end
    check_error(write(tmp_path, "dangling.tar", bytes(data)), eof, "extended header")


# ---------------------------------------------------------------------------
# every size the framer uses comes from one validated place
# (tario.entry_size); a crafted size can neither loop nor move backwards.
# ---------------------------------------------------------------------------

from chaos.fuzz import base256, crafted_size_tar, fuzz_tar_reader, raw_header, size_attack_shards  # noqa: E402
from resumewds.tar._frame import entry_size  # noqa: E402


def test_crafted_pax_zero_then_negative_base256_size_after_last_sample(tmp_path):
    """The shard of the issue: pax size=0, then a base-256 size of -1.

    Before, the scan's trailing walk took the header's -1 (ignoring the
    pax record) and went backwards forever; now the pax record wins, as in
    tarfile, and the shard reads as its 3 samples.
    """
    data = crafted_size_tar()
    path = write(tmp_path, "crafted.tar", data)
    expected = [m.name for m in tarfile.open(path).getmembers() if m.isfile()]
    offsets, keys, end = scan_buffer(data, "crafted.tar")
    assert keys == ["s0000", "s0001", "s0002"] and len(expected) == 6
    assert offsets == sorted(offsets) and end == len(data) - 1024
    assert [k for k, _ in via_ranges(path)] == keys
    for argv in (["index", path, "-o", str(tmp_path / "m.json")], ["cat", path]):
        p = subprocess.run([sys.executable, "-m", "resumewds", *argv], capture_output=True, text=True,
                           timeout=60, env=dict(os.environ, PYTHONPATH=os.getcwd()))
        assert p.returncode == 0, p.stderr
    assert p.stdout.count("\n") == 3


@pytest.mark.parametrize("field,words", [
    (base256(-1), "negative member size"),
    (base256(-(2 ** 80)), "negative member size"),
    (base256(2 ** 80), "truncated member"),
    (b"-1", "bad size field"),
    (b"1_0", "bad size field"),
    (b"+17", "bad size field"),
    (b"\xc0" + bytes(11), "bad size field"),
])
def test_hostile_header_size_is_an_error(tmp_path, field, words):
    for where in ("after", "between", "first"):
        data = crafted_size_tar(pax_size=None, size_field=field, typeflag=b"0", where=where)
        path = write(tmp_path, f"bad-{where}.tar", data)
        errs = errors_of(path)
        assert errs and all(words in str(e) for e in errs), (where, [str(e) for e in errs])


@pytest.mark.parametrize("pax", ["-5", "x", "1_0", " 5", "0x10", str(2 ** 70)])
def test_hostile_pax_size_is_an_error(tmp_path, pax):
    data = crafted_size_tar(pax_size=pax, size_field=b"00000000000\0", typeflag=b"0")
    errs = errors_of(write(tmp_path, "pax.tar", data))
    assert errs and all("pax size" in str(e) or "truncated member" in str(e) for e in errs)


def test_fast_path_never_takes_a_signed_octal_size():
    """parse_sample's fast path used int(field, 8), which takes "-1"."""
    blk = raw_header(b"k.txt", b"-1", b"0")
    with pytest.raises(ShardFormatError, match="bad size field"):
        parse_sample(blk + bytes(BLOCK), "m", start=0, end=2 * BLOCK)
    with pytest.raises(ShardFormatError, match="negative"):
        entry_size(raw_header(b"k.txt", base256(-3)), {}, "m", 0, 10 ** 6)
    assert entry_size(raw_header(b"k.txt", base256(513)), {}, "m", 0, 1024) == 513


@settings(max_examples=150, deadline=None, suppress_health_check=list(HealthCheck))
@given(size_attack_shards())
def test_fuzz_size_attacks_end_in_data_or_format_error(data):
    try:
        offsets, keys, end = scan_buffer(data, "f")
    except ShardFormatError:
        return
    assert offsets == sorted(offsets) and 0 <= offsets[0] and offsets[-1] == end <= len(data)
    read_all_ways(data)


def test_fuzzer_includes_the_size_family():
    r = fuzz_tar_reader(cases=80, seed=3, bound=5.0)
    assert r.cases == 80 and r.failures == []


def test_verified_parse_skips_only_the_header_checksums(tmp_path):
    """``verified=True`` (the bytes matched a digest) gives the same samples and
    still refuses every structural fault; only a bad header checksum, which a
    digest-checked copy cannot have, is no longer recomputed."""
    members = [(f"s{i:03d}.{ext}", os.urandom(random.Random(i).randrange(0, 3000)))
               for i in range(20) for ext in ("jpg", "cls", "txt")]
    raw = tar_bytes(members)
    offsets, _keys, _end = scan_buffer(raw, "t.tar")
    for a, b in zip(offsets, offsets[1:]):
        assert parse_sample(raw, "t.tar", a, a, b, verified=True) == parse_sample(raw, "t.tar", a, a, b)
    a, b = offsets[3], offsets[4]
    bad = bytearray(raw)
    bad[a + 148:a + 156] = b"0000000\0"  # a wrong checksum of the sample's first header
    with pytest.raises(ShardFormatError, match="checksum"):
        parse_sample(bytes(bad), "t.tar", a, a, b)
    assert parse_sample(bytes(bad), "t.tar", a, a, b, verified=True) == parse_sample(raw, "t.tar", a, a, b)
    # structure is still checked: a size past the range, a range holding two samples
    big = bytearray(raw)
    big[a + 124:a + 136] = b"%011o\0" % (10 ** 6)
    with pytest.raises(ShardFormatError):
        parse_sample(bytes(big), "t.tar", a, a, b, verified=True)
    with pytest.raises(ShardFormatError, match="2 samples"):
        parse_sample(raw, "t.tar", a, a, offsets[5], verified=True)
    path = tmp_path / "t.tar"
    path.write_bytes(raw)
    fd = os.open(path, os.O_RDONLY)
    try:
        assert read_sample(fd, a, b, "t.tar", verified=True) == parse_sample(raw, "t.tar", a, a, b)
        assert read_samples(fd, offsets, 2, 6, "t.tar", verified=True) == read_samples(fd, offsets, 2, 6, "t.tar")
    finally:
        os.close(fd)
