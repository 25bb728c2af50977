"""Tests for resumewds.compressed: .tar.gz / .tgz / .tar.zst shards, decompressed once into the cache."""

from __future__ import annotations

import gzip
import os

import pytest
import webdataset as real_wds
import xxhash

import resumewds as rw
from resumewds import compressed, tario
from resumewds.errors import ChecksumMismatch, ShardFormatError

pytestmark = pytest.mark.usefixtures("cache_dir")


def _gz(src: str, dst: str) -> str:
    with open(src, "rb") as f, open(dst, "wb") as g:
        g.write(gzip.compress(f.read(), mtime=0))
    return dst


def _zst(src: str, dst: str) -> str:
    zstandard = pytest.importorskip("zstandard")
    with open(src, "rb") as f, open(dst, "wb") as g:
        g.write(zstandard.ZstdCompressor().compress(f.read()))
    return dst


def _rows(ds):
    return [(s["__key__"], s["txt"], s["cls"], s["bin"]) for s in ds]


def test_tgz_and_zst_read_like_the_plain_tar_and_like_webdataset(shards, tmp_path):
    gz = [_gz(p, str(tmp_path / (os.path.basename(p)[:-4] + (".tgz" if i % 2 else ".tar.gz"))))
          for i, p in enumerate(shards[:3])]
    zst = _zst(shards[3], str(tmp_path / "s3.tar.zst"))
    plain = _rows(rw.WebDataset(shards[:4]))
    mixed = _rows(rw.WebDataset(gz + [zst]))
    assert mixed == plain and len(plain) == 4 * 37
    theirs = [(s["__key__"], s["txt"], s["cls"], s["bin"])
              for s in real_wds.WebDataset(gz, shardshuffle=False)]
    assert theirs == plain[:3 * 37]
    # a shuffled order reads the same samples, by seeking in the decompressed copies
    shuffled = _rows(rw.WebDataset(gz + [zst], seed=3, shuffle=True))
    assert sorted(shuffled) == sorted(plain) and shuffled != plain


def test_manifest_has_compressed_checksum_and_stream_offsets(shards, tmp_path):
    gz = _gz(shards[0], str(tmp_path / "a.tgz"))
    m = rw.build_manifest([gz], str(tmp_path / "manifest.json"))
    (s,) = m.shards
    raw = open(gz, "rb").read()
    assert s.size == len(raw) and s.xxh3_64 == xxhash.xxh3_64_hexdigest(raw)
    assert list(s.offsets) == tario.scan_file(shards[0]).offsets
    # read back through the saved manifest: no index pass, same samples
    assert _rows(rw.WebDataset(str(tmp_path / "manifest.json"))) == _rows(rw.WebDataset(shards[:1]))


def test_decompressed_once_and_shared(shards, tmp_path, cache_dir):
    gz = _gz(shards[0], str(tmp_path / "a.tgz"))
    ds = rw.WebDataset([gz])
    list(ds)
    ds.close()
    d = os.path.join(cache_dir, "decompressed")
    (copy,) = [f for f in os.listdir(d) if f.endswith(".tar")]
    st = os.stat(os.path.join(d, copy))
    with open(os.path.join(d, copy), "rb") as f, open(shards[0], "rb") as g:
        assert f.read() == g.read()
    list(rw.WebDataset([gz]))  # a second reader (same cache) uses the same copy
    st2 = os.stat(os.path.join(d, copy))
    assert (st.st_ino, st.st_mtime_ns) == (st2.st_ino, st2.st_mtime_ns)
    # a damaged copy (wrong size) is made again
    with open(os.path.join(d, copy), "r+b") as f:
        f.truncate(1000)
    assert len(list(rw.WebDataset([gz]))) == 37


def test_corrupt_compressed_shard_is_a_clear_error(shards, tmp_path):
    gz = _gz(shards[0], str(tmp_path / "a.tgz"))
    m = rw.build_manifest([gz], str(tmp_path / "manifest.json"))
    raw = bytearray(open(gz, "rb").read())
    raw[len(raw) // 2] ^= 0xFF
    open(gz, "wb").write(bytes(raw))
    with pytest.raises(ChecksumMismatch):
        list(rw.WebDataset(str(tmp_path / "manifest.json")))
    with pytest.raises(ShardFormatError, match="gzip"):
        rw.build_manifest([gz])
    cut = str(tmp_path / "cut.tgz")
    open(cut, "wb").write(bytes(raw[:len(raw) // 3]))
    with pytest.raises(ShardFormatError) as ei:
        rw.build_manifest([cut])
    assert "cut.tgz" in str(ei.value)
    assert m.shards[0].samples == 37


def test_remote_tgz_through_the_verified_cache(shards, tmp_path, served):
    root, srv = served
    _gz(shards[0], os.path.join(root, "r.tgz"))
    url = srv.url + "/r.tgz"
    assert _rows(rw.WebDataset([url])) == _rows(rw.WebDataset(shards[:1]))


def test_kind_detection_by_magic(tmp_path):
    p = tmp_path / "x.tar"
    p.write_bytes(gzip.compress(b"hello"))
    assert compressed.kind_of(str(p)) == "gzip"
    assert compressed.kind_of(str(tmp_path / "missing")) is None
