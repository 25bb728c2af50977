"""Tests for resumewds.writer: webdataset's bytes, the manifest written as it goes, kill -9 safety."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import time

import numpy as np
import pytest
import webdataset as real_wds
from webdataset import writer as real_writer

import resumewds as rw
from conftest import REPO
from resumewds.manifest._manifest import load_manifest
from resumewds.tar import _io as tario
from resumewds.writer import ShardWriter, TarWriter

pytestmark = pytest.mark.usefixtures("cache_dir")


def _samples(n: int = 12):
    rng = np.random.default_rng(1)
    out = []
    for i in range(n):
        out.append({
            "__key__": f"dir/s{i:04d}" if i % 3 else f"s{i:04d}",
            "txt": f"text {i} é", "cls": i, "json": {"i": i, "l": [1, 2]},
            "npy": rng.standard_normal((2, 3)).astype("float32"),
            "png": rng.integers(0, 255, (4, 5, 3), dtype=np.uint8),
            "mp": {"a": i}, "ten": [np.arange(3, dtype=np.int32), np.ones(2)],
            "bin": bytes([i]) * (i * 37 % 700),
            "x" * 120 + ".bin": b"long name goes through a pax header",
        })
    return out


def _same_index(path: str, info) -> None:
    idx = tario.scan_file(path)
    assert (info.size, info.xxh3_64, info.samples, list(info.offsets)) == \
        (idx.size, idx.xxh3_64, idx.samples, idx.offsets)


def test_tarwriter_bytes_are_webdatasets_and_manifest_is_the_index(tmp_path):
    ours, theirs = str(tmp_path / "ours.tar"), str(tmp_path / "theirs.tar")
    man = str(tmp_path / "manifest.json")
    with TarWriter(ours, mtime=1_700_000_000, manifest=man) as w:
        sizes = [w.write(s) for s in _samples()]
    with real_writer.TarWriter(theirs, mtime=1_700_000_000) as rwr:
        real_sizes = [rwr.write(s) for s in _samples()]
    assert sizes == real_sizes
    assert open(ours, "rb").read() == open(theirs, "rb").read()
    assert not os.path.exists(ours + ".partial")
    (entry,) = load_manifest(man).shards
    assert entry.url == ours
    _same_index(ours, entry)
    _same_index(ours, w.shard_info)
    # webdataset reads our file, and we read it through the manifest with no index pass
    real = list(real_wds.WebDataset(ours, shardshuffle=False).decode())
    mine = list(rw.WebDataset(man).decode())
    assert [s["__key__"] for s in mine] == [s["__key__"] for s in real] == [s["__key__"] for s in _samples()]
    assert [s["json"] for s in mine] == [s["json"] for s in real]
    assert all(np.array_equal(a["npy"], b["npy"]) for a, b in zip(mine, real))


def test_keys_that_the_reader_groups_differently(tmp_path):
    """Dots in a key's basename and repeated keys: the manifest follows the reader's grouping."""
    p, man = str(tmp_path / "g.tar"), str(tmp_path / "m.json")
    with TarWriter(p, encoder=False, manifest=man) as w:
        w.write({"__key__": "a.b", "txt": b"1"})   # reader: key "a", ext "b.txt"
        w.write({"__key__": "a.c", "txt": b"2"})   # same reader key "a": one sample
        w.write({"__key__": "d", "txt": b"3"})
        w.write({"__key__": "d", "cls": b"4"})     # same key again: merged into "d"
        with pytest.raises(ValueError, match="twice"):
            w.write({"__key__": "d", "txt": b"5"})  # would repeat .txt in "d"
        w.write({"__key__": "e", "txt": b"6"})
    (entry,) = load_manifest(man).shards
    assert entry.samples == 3
    _same_index(p, entry)


def test_tgz_manifest_has_compressed_checksum_and_stream_offsets(tmp_path):
    p, man = str(tmp_path / "c.tgz"), str(tmp_path / "m.json")
    with TarWriter(p, manifest=man) as w:
        for s in _samples(5):
            w.write(s)
    raw = open(p, "rb").read()
    assert raw[:2] == b"\x1f\x8b"
    (entry,) = load_manifest(man).shards
    import gzip

    import xxhash

    plain = gzip.decompress(raw)
    assert entry.size == len(raw) and entry.xxh3_64 == xxhash.xxh3_64_hexdigest(raw)
    offsets, keys, end = tario.scan_buffer(plain, p)
    assert list(entry.offsets) == offsets and entry.samples == 5
    assert [s["__key__"] for s in real_wds.WebDataset(p, shardshuffle=False)] == keys


def test_shardwriter_splits_like_webdataset(tmp_path):
    kw = dict(maxcount=5, maxsize=3000, encoder=False, mtime=0, verbose=0)
    samples = [{"__key__": f"k{i:03d}", "bin": b"x" * (100 + 97 * (i % 11)), "cls": b"%d" % i}
               for i in range(50)]
    posted = []
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with ShardWriter(str(tmp_path / "a" / "s-%04d.tar"), post=posted.append, **kw) as sink:
        for s in samples:
            sink.write(s)
    with real_writer.ShardWriter(str(tmp_path / "b" / "s-%04d.tar"), **kw) as sink:
        for s in samples:
            sink.write(s)
    a = sorted(f for f in os.listdir(tmp_path / "a") if f.endswith(".tar"))
    b = sorted(os.listdir(tmp_path / "b"))
    assert a == b and len(a) > 10 and posted == [str(tmp_path / "a" / f) for f in a]
    for f in a:
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes()
    m = load_manifest(str(tmp_path / "a" / "manifest.json"))
    assert [os.path.basename(s.url) for s in m.shards] == a
    for s in m.shards:
        _same_index(s.url, s)
    got = [s["__key__"] for s in rw.WebDataset(str(tmp_path / "a" / "manifest.json"))]
    assert got == [s["__key__"] for s in samples]


def test_stream_and_pipe_outputs(tmp_path):
    buf = io.BytesIO()
    with TarWriter(buf, encoder=False, mtime=0) as w:
        w.write({"__key__": "a", "txt": b"hi"})
    assert w.shard_info.samples == 1 and w.shard_info.size == len(buf.getvalue())
    out = tmp_path / "p.tar"
    with TarWriter(f"pipe:cat > {out}", mtime=0) as w:
        w.write({"__key__": "a", "txt": "hi"})
    assert out.read_bytes() == buf.getvalue()
    with pytest.raises(ValueError):
        TarWriter(str(tmp_path / "x.tar"), encoder=False).write({"txt": b"no key"})


WRITER_SCRIPT = r"""
import sys, time
from resumewds.writer import ShardWriter
out, n = sys.argv[1], int(sys.argv[2])
with ShardWriter(out + "/shard-%05d.tar", maxcount=7, verbose=0) as sink:
    for i in range(n):
        sink.write({"__key__": "k%06d" % i, "bin": bytes([i % 256]) * (200 + i % 300), "cls": i})
        if i % 7 == 0:
            time.sleep(0.001)
print("done", flush=True)
"""


def _check_manifest(d: str) -> int:
    """Every entry describes the complete file under its name; returns the number of entries."""
    man = os.path.join(d, "manifest.json")
    if not os.path.exists(man):
        return 0
    m = load_manifest(man)
    for s in m.shards:
        _same_index(s.url, s)
    return len(m.shards)


def test_sigkill_and_rerun_never_leave_a_bad_manifest_entry(tmp_path):
    script = tmp_path / "w.py"
    script.write_text(WRITER_SCRIPT)
    env = dict(os.environ, PYTHONPATH=REPO)
    d = tmp_path / "out"
    d.mkdir()
    n = 3000
    kills = 0
    for delay in (0.35, 0.5, 0.6, 0.7, 0.8, 0.9, 1.1):
        proc = subprocess.Popen([sys.executable, str(script), str(d), str(n)], env=env,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        time.sleep(delay)
        if proc.poll() is None:
            os.kill(proc.pid, signal.SIGKILL)
            kills += 1
        proc.wait()
        _check_manifest(str(d))
    assert kills >= 3  # the writes really were interrupted
    # a run that finishes leaves every shard, complete, in the manifest
    r = subprocess.run([sys.executable, str(script), str(d), str(n)], env=env, capture_output=True,
                       text=True, timeout=300)
    assert r.returncode == 0, r.stderr
    assert _check_manifest(str(d)) == (n + 6) // 7
    keys = [s["__key__"] for s in rw.WebDataset(str(d / "manifest.json"))]
    assert keys == ["k%06d" % i for i in range(n)]
