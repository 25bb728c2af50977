"""Tests for resumewds.tar: .tar.gz / .tgz / .tar.zst shards, decompressed once into the cache."""

from __future__ import annotations

import gzip
import os
import tarfile

import pytest
import webdataset as real_wds
import xxhash

import resumewds as rw
from resumewds.errors import ChecksumMismatch, ShardFormatError
from resumewds.tar import _compressed as compressed
from resumewds.tar import _io as tario

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


# ---- damaged compressed shards: read up to the damage as webdataset 1.0.2 does -----------
def _damaged_cases(tmp_path, n_cut=150, n_flip=40):
    """A .tgz with random payloads (several of tarfile's 10240-byte input chunks), and damaged
    copies: cut at ``n_cut`` points (inside tar headers, inside members' data, in padding), and
    ``n_flip`` 8-byte runs XORed (corrupt deflate blocks, most caught by zlib, some not)."""
    from resumewds.synth import write_shards

    (p,) = write_shards(str(tmp_path / "dmg"), shards=1, samples=40, size_range=(10, 3000))
    gz = gzip.compress(open(p, "rb").read(), mtime=0)
    out = []
    for c in range(20, len(gz), len(gz) // n_cut):
        out.append(("cut", c, gz[:c]))
    for c in range(30, len(gz) - 20, len(gz) // n_flip):
        b = bytearray(gz)
        b[c:c + 8] = bytes(x ^ 0x5A for x in b[c:c + 8])
        out.append(("flip", c, bytes(b)))
    files = []
    for kind, c, data in out:
        f = tmp_path / f"{kind}{c}.tgz"
        f.write_bytes(data)
        files.append((kind, str(f)))
    return p, files


def _webdataset_reads(path, stop):
    """The real webdataset's samples (without __url__) and handler calls for one shard."""
    calls = []

    def handler(exn):
        calls.append(exn)
        return not stop

    ds = real_wds.DataPipeline(real_wds.SimpleShardList([path]), real_wds.tarfile_to_samples(handler=handler))
    return [{k: v for k, v in s.items() if k != "__url__"} for s in ds], calls


def _salvaged_reads(path, store):
    """Ours: salvage the shard, then read its samples by offset from the cache's prefix copy."""
    from resumewds.manifest._manifest import ShardInfo

    sv = compressed.salvage_compressed(path)
    s = ShardInfo(url=path)
    n = sv.apply(s)
    if n == 0:
        return [], sv
    with store.acquire(s) as view:
        fd = os.open(view.path, os.O_RDONLY)
        try:
            return [dict(x) for x in tario.read_samples(fd, s.offsets, 0, n - 1, path)], sv
        finally:
            os.close(fd)


def test_damaged_tgz_yields_what_webdataset_yields(tmp_path, cache_dir):
    from resumewds.cache import ShardStore

    _, files = _damaged_cases(tmp_path)
    store = ShardStore(cache_dir=cache_dir)
    seen = set()
    for kind, f in files:
        for stop in (True, False):
            theirs, calls = _webdataset_reads(f, stop)
            ours, sv = _salvaged_reads(f, store)
            assert ours == theirs, (f, stop)
            assert sv.raised == bool(calls), (f, stop, sv.error, calls)
            assert os.path.basename(f) in str(sv.error)
            last_whole = bool(ours) and set(ours[-1]) == {"__key__", "bin", "cls", "txt"}
            seen.add((kind, sv.raised, "zlib" if "invalid compressed" in str(sv.error) else "end", last_whole))
    # the damage kinds the brief names all occurred: a cut mid-stream (raises), a cut inside a
    # tar header (webdataset ends the shard quietly), a cut inside a sample (its members before
    # the cut are yielded), a corrupt deflate block zlib reports, one it does not
    assert ("cut", True, "end", True) in seen and any(k == "cut" and not raised for k, raised, _, _ in seen)
    assert any(k == "cut" and not whole for k, _, _, whole in seen)
    assert ("flip", True, "zlib", True) in seen or ("flip", True, "zlib", False) in seen
    assert any(k == "flip" and not raised for k, raised, _, _ in seen)


def test_salvage_is_stable_and_never_cached_as_complete(shards, tmp_path, cache_dir):
    import json
    import subprocess
    import sys

    from resumewds.cache import ShardStore
    from resumewds.manifest._manifest import ShardInfo

    gz = gzip.compress(open(shards[0], "rb").read(), mtime=0)
    cut = tmp_path / "cut.tgz"
    cut.write_bytes(gz[:len(gz) * 2 // 3])
    a, b = compressed.salvage_compressed(str(cut)), compressed.salvage_compressed(str(cut))
    assert a.index == b.index and 0 < a.index.samples < 37
    # another process frames the same positions (what a resumed run rebuilds its plan from)
    code = ("import sys; from resumewds.tar import _compressed as compressed; "
            "print(compressed.salvage_compressed(sys.argv[1]).index.offsets)")
    other = subprocess.run([sys.executable, "-c", code, str(cut)], capture_output=True, text=True, check=True)
    assert other.stdout.strip() == str(a.index.offsets)
    # the samples are the leading samples of the intact shard (fields equal)
    full = _rows(rw.WebDataset(shards[:1]))
    ours, _ = _salvaged_reads(str(cut), ShardStore(cache_dir=cache_dir))
    whole = [r for r in ours if set(r) == {"__key__", "bin", "cls", "txt"}]
    assert [(r["__key__"], r["txt"], r["cls"], r["bin"]) for r in whole] == full[:len(whole)]
    # the cache holds it as an incomplete copy only, never under the complete copy's name
    d = os.path.join(cache_dir, "decompressed")
    names = sorted(os.listdir(d))
    (prefix,) = [n for n in names if n.endswith(".prefix.tar")]
    assert not [n for n in names if n.endswith(".tar") and not n.endswith(".prefix.tar")]
    meta = json.load(open(os.path.join(d, prefix + ".meta")))
    assert meta["complete"] is False and meta["size"] == a.index.offsets[-1] and meta["good"] == a.good
    # a later run that does not salvage it does not trust the prefix: the damage is an error
    with pytest.raises(ShardFormatError, match="cut.tgz"):
        list(rw.WebDataset([str(cut)]))
    plain = ShardInfo(url=str(cut), size=a.index.size, xxh3_64=a.index.xxh3_64)
    with pytest.raises(ShardFormatError, match="gzip"):
        ShardStore(cache_dir=cache_dir).acquire(plain)
    # a damaged prefix copy is made again, the same
    with open(os.path.join(d, prefix), "r+b") as f:
        f.truncate(100)
    assert _salvaged_reads(str(cut), ShardStore(cache_dir=cache_dir))[0] == ours


def test_checksummed_damaged_tgz_is_not_delivered_partially(shards, tmp_path):
    gz = _gz(shards[0], str(tmp_path / "a.tgz"))
    m = rw.build_manifest([gz, shards[1]], str(tmp_path / "manifest.json"))
    raw = open(gz, "rb").read()
    open(gz, "wb").write(raw[:len(raw) // 2])  # cut short after the manifest was written
    with pytest.raises(ChecksumMismatch):
        list(rw.WebDataset(str(tmp_path / "manifest.json")))
    # on_error="skip" and a webdataset handler skip the shard whole (no prefix of it)
    keys = [s["__key__"] for s in rw.WebDataset(str(tmp_path / "manifest.json"), on_error="skip")]
    assert keys == [s["__key__"] for s in rw.WebDataset(shards[1:2])] and m.shards[0].samples == 37
    keys = [s["__key__"] for s in rw.WebDataset(str(tmp_path / "manifest.json"),
                                                handler=rw.handlers.ignore_and_continue)]
    assert keys == [s["__key__"] for s in rw.WebDataset(shards[1:2])]


def test_damaged_zstd_keeps_the_samples_before_the_damage(tmp_path, cache_dir):
    from resumewds.cache import ShardStore
    from resumewds.synth import write_shards

    # zstd emits a block (up to 128 KiB decoded) only once it is whole: a shard of several blocks
    (p0,) = write_shards(str(tmp_path / "z"), shards=1, samples=37, size_range=(4000, 12000))
    zst = _zst(p0, str(tmp_path / "a.tar.zst"))
    data = open(zst, "rb").read()
    full = _rows(rw.WebDataset([p0]))
    store = ShardStore(cache_dir=cache_dir)
    for name, bad in (("cut2", data[:len(data) // 2]), ("cut3", data[:len(data) * 3 // 4]),
                      ("junk", data[:len(data) // 2] + b"\x28\xb5\x2f\xfd" + bytes(range(256)) * 4)):
        p = tmp_path / f"{name}.tar.zst"
        p.write_bytes(bad)
        ours, sv = _salvaged_reads(str(p), store)
        assert sv.raised and 0 < len(ours) < 37 and str(p) in str(sv.error)
        whole = [(r["__key__"], r["txt"], r["cls"], r["bin"]) for r in ours
                 if set(r) == {"__key__", "bin", "cls", "txt"}]
        assert whole == full[:len(whole)] and len(whole) >= len(ours) - 1
        assert _salvaged_reads(str(p), store)[0] == ours  # the same every time


def test_intact_or_uncompressed_files_are_not_salvaged(shards, tmp_path):
    assert compressed.salvage_compressed(shards[0]) is None
    gz = _gz(shards[0], str(tmp_path / "a.tgz"))
    sv = compressed.salvage_compressed(gz)  # an intact file frames whole: every sample, no error
    assert sv.index.offsets == tario.scan_file(shards[0]).offsets[:-1] + [sv.index.offsets[-1]]
    assert sv.index.samples == 37 and not sv.raised


def test_webdataset_handler_path_reads_a_damaged_tgz_like_webdataset(shards, tmp_path):
    gz = gzip.compress(open(shards[0], "rb").read(), mtime=0)
    cut = tmp_path / "cut.tgz"
    cut.write_bytes(gz[:len(gz) * 2 // 3])
    urls = [str(cut), shards[1]]
    theirs = [s["__key__"] for s in real_wds.WebDataset(urls, shardshuffle=False,
                                                        handler=real_wds.ignore_and_continue)]
    ours = [s["__key__"] for s in rw.WebDataset(urls, handler=rw.handlers.ignore_and_continue)]
    assert ours == theirs and len(theirs) > 37


@pytest.mark.parametrize("w1,w2", [(0, 0), (2, 0)])
def test_resume_in_a_run_over_a_damaged_tgz_equals_the_uninterrupted_run(shards, tmp_path, w1, w2):
    gz = gzip.compress(open(shards[0], "rb").read(), mtime=0)
    cut = tmp_path / "cut.tgz"
    cut.write_bytes(gz[:len(gz) * 2 // 3])
    urls = [str(cut)] + shards[1:3]

    def make(workers):
        ds = (rw.WebDataset(urls, shardshuffle=True, seed=2, handler=rw.handlers.ignore_and_continue)
              .shuffle(20).to_tuple("__key__"))
        return rw.WebLoader(ds, batch_size=None, num_workers=workers).batched(6)

    ref = [tuple(b[0]) for b in make(w1)]  # (2 workers: webdataset's rotation of their filtered streams)
    assert len({k for b in ref for k in b if k.startswith("s000000_")}) > 0  # the salvaged samples
    a = make(w1)
    it = iter(a)
    got = [tuple(next(it)[0]) for _ in range(5)]
    state = a.state_dict()
    del it
    b = make(w2)
    b.load_state_dict(state)
    got += [tuple(x[0]) for x in b]
    assert got == ref


@pytest.mark.parametrize("fmt", [tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])
def test_damaged_tgz_with_long_names_dirs_and_meta_members_like_webdataset(tmp_path, cache_dir, fmt):
    """tarfile's own .tgz (its gzip header names the file), long names (GNU ././@LongLink / pax
    headers), a directory and a __meta__ member: cut at 40 points and one corrupt run."""
    import io
    import random

    from resumewds.cache import ShardStore

    rng = random.Random(1)
    p = str(tmp_path / "long.tgz")
    with tarfile.open(p, "w:gz", format=fmt) as tf:
        ti = tarfile.TarInfo("dir")
        ti.type = tarfile.DIRTYPE
        tf.addfile(ti)
        meta = tarfile.TarInfo("__meta__")
        meta.size = 700
        tf.addfile(meta, io.BytesIO(b"m" * 700))
        for i in range(30):
            base = ("d" * 120 + "/") if i % 3 == 0 else ""
            for ext in ("txt", "bin"):
                data = rng.randbytes(rng.randint(10, 4000)) if ext == "bin" else f"t{i}".encode()
                ti = tarfile.TarInfo(f"{base}k{i:03d}.{ext}")
                ti.size = len(data)
                tf.addfile(ti, io.BytesIO(data))
    gz = open(p, "rb").read()
    h = len(gz) // 2
    damaged = [gz[:c] for c in range(15, len(gz), len(gz) // 40)]
    damaged.append(gz[:h] + bytes(x ^ 0x33 for x in gz[h:h + 16]) + gz[h + 16:])
    store = ShardStore(cache_dir=cache_dir)
    for i, data in enumerate(damaged):
        f = tmp_path / f"d{i}.tgz"
        f.write_bytes(data)
        for stop in (True, False):
            theirs, calls = _webdataset_reads(str(f), stop)
            ours, sv = _salvaged_reads(str(f), store)
            assert ours == theirs and sv.raised == bool(calls), (i, stop)


# ---- cache_size counts and evicts decompressed copies like any entry ----
def _copies(cache_dir):
    d = os.path.join(cache_dir, "decompressed")
    return {f: os.path.getsize(os.path.join(d, f)) for f in os.listdir(d) if f.endswith(".tar")}


def test_cache_size_counts_and_evicts_decompressed_copies(shards, tmp_path, cache_dir):
    gzs = [_gz(s, str(tmp_path / f"s{i}.tgz")) for i, s in enumerate(shards)]
    rw.build_manifest(gzs, str(tmp_path / "manifest.json"))
    want = [r["__key__"] for r in rw.WebDataset(str(tmp_path / "manifest.json"), cache_dir=str(tmp_path / "c0"))]
    one = os.path.getsize(shards[0])
    budget = int(2.5 * one)  # room for two copies, not for five
    c1 = str(tmp_path / "c1")
    ds = rw.WebDataset(str(tmp_path / "manifest.json"), cache_dir=c1, cache_size=budget)
    got = []
    for r in ds:
        got.append(r["__key__"])
        assert ds.store.cached_bytes() <= budget + one  # the copy being read may be the excess
        assert sum(_copies(c1).values()) == ds.store.cached_bytes()  # the store counts the copies
    ds.close()
    assert got == want  # the same samples, in the same order
    assert ds.store.cached_bytes() <= budget
    assert 1 <= len(_copies(c1)) <= 2


def test_a_copy_in_use_is_not_evicted(shards, tmp_path, cache_dir):
    from resumewds.cache import ShardStore

    gz = _gz(shards[0], str(tmp_path / "a.tgz"))
    m = rw.build_manifest([gz], str(tmp_path / "manifest.json"))
    st = ShardStore(cache_dir=str(tmp_path / "c"), cache_size=1)  # nothing fits
    view = st.acquire(m.shards[0])
    path = view.path
    assert path.endswith(".tar") and os.path.exists(path)
    st.make_room(10 ** 9)  # would evict everything not in use
    assert os.path.exists(path)  # a reader holds it
    view.close()
    st.make_room(10 ** 9)
    assert not os.path.exists(path) and _copies(str(tmp_path / "c")) == {}
