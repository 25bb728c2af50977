"""Consecutive samples are read with one pread: same samples, same skips."""

from __future__ import annotations

import dataclasses
import os

import pytest

import resumewds as rw
import resumewds.read._dataset as D
from conftest import tar_bytes
from resumewds.manifest._manifest import Manifest
from resumewds.tar import _io as tario

pytestmark = pytest.mark.usefixtures("cache_dir")


def _shards(tmp_path, n=3, per=20):
    paths = []
    for s in range(n):
        members = []
        for i in range(per):
            members += [(f"s{s}k{i:03d}.txt", f"{s}-{i}".encode() * (i + 1)),
                        (f"s{s}k{i:03d}.bin", os.urandom(100 + 37 * i))]
        p = tmp_path / f"shard-{s}.tar"
        p.write_bytes(tar_bytes(members))
        paths.append(str(p))
    return paths


def _truth(paths):
    return [dict(s, __url__=p) for p in paths for s in tario.iter_samples_file(p, p)]


def _plain(samples):
    keep = ("__key__", "__url__", "txt", "bin")
    return [{k: bytes(v) if isinstance(v, (bytes, memoryview)) else v for k, v in s.items() if k in keep}
            for s in samples]


@pytest.mark.parametrize("batch_size", [None, 7])
def test_runs_deliver_exactly_the_shards_samples(tmp_path, monkeypatch, batch_size):
    paths = _shards(tmp_path)
    preads = []
    real = os.pread
    monkeypatch.setattr(os, "pread", lambda fd, n, off: (preads.append(n), real(fd, n, off))[1])
    ds = rw.WebDataset(paths)
    got = [s for b in rw.WebLoader(ds, batch_size=batch_size, collate_fn=lambda x: x, num_workers=0)
           for s in (b if batch_size else [b])]
    assert _plain(got) == _plain(_truth(paths))
    assert len(preads) < len(got) / 3  # runs, not one pread per sample
    # a run never reads more than _RUN_BYTES (beyond its first sample)
    monkeypatch.setattr(D, "_RUN_BYTES", 2000)
    preads.clear()
    again = list(rw.WebDataset(paths))
    assert _plain(again) == _plain(got) and max(preads) <= 2000 + max(
        b - a for p in paths for a, b in zip(tario.scan_file(p).offsets, tario.scan_file(p).offsets[1:]))


def test_a_bad_sample_inside_a_run_skips_as_one_by_one_reads_do(tmp_path, monkeypatch):
    paths = _shards(tmp_path)
    manifest = rw.build_manifest(paths)
    # no checksum for shard 1 (so it is not rejected whole), and a broken
    # header checksum at its sample 5: samples 0-4 are delivered, the rest skipped
    manifest = Manifest([dataclasses.replace(s, xxh3_64=None) if i == 1 else s
                         for i, s in enumerate(manifest.shards)])
    bad = manifest.shards[1].offsets[5]
    with open(paths[1], "r+b") as f:
        f.seek(bad + 148)
        f.write(b"9999999\0")

    def deliver():
        ds = rw.WebDataset(manifest, on_error="skip")
        return [s["__key__"] for s in rw.WebLoader(ds, batch_size=None, num_workers=0)]

    batched = deliver()
    monkeypatch.setattr(D, "_RUN_BYTES", 0)  # every read a single sample
    single = deliver()
    assert batched == single
    truth = [s["__key__"] for s in _truth([paths[0]])] + [f"s1k{i:03d}" for i in range(5)] + \
        [s["__key__"] for s in _truth([paths[2]])]
    assert batched == truth


class _NeverKept(dict):
    """A ``ShardReader.fast`` that keeps nothing: every read takes the whole path."""

    def __setitem__(self, key, value):
        pass


def _without_fast_reads(monkeypatch):
    from resumewds.read import _ranged as reading

    real = reading.ShardReader.__init__

    def init(self, *a, **kw):
        real(self, *a, **kw)
        self.fast = _NeverKept()

    monkeypatch.setattr(reading.ShardReader, "__init__", init)


@pytest.mark.parametrize("on_error", ["raise", "skip"])
def test_reads_of_open_shards_match_read_and_its_errors(tmp_path, monkeypatch, on_error):
    """The loader reads samples of open shards itself (``ShardReader.fast``):
    the same samples as the whole path gives, and when a shard is cut short
    under its open file, the same error (or skip) for that shard."""
    paths = _shards(tmp_path, n=2, per=30)
    manifest = rw.build_manifest(paths)
    calls = {"read_sample": 0, "parse": 0, "as": 0}
    real_one, real_parse, real_as = tario.read_sample, tario.parse_sample, tario.parse_sample_as

    def one(*a, **kw):
        calls["read_sample"] += 1
        return real_one(*a, **kw)

    def parse(*a, **kw):
        calls["parse"] += 1
        return real_parse(*a, **kw)

    def parse_as(*a, **kw):
        got = real_as(*a, **kw)
        calls["as"] += got is not None
        return got

    monkeypatch.setattr(tario, "read_sample", one)
    monkeypatch.setattr(tario, "parse_sample", parse)
    monkeypatch.setattr(tario, "parse_sample_as", parse_as)

    def deliver(cut):
        keys, err = [], None
        ds = rw.WebDataset(manifest, shuffle=True, seed=3, on_error=on_error)
        try:
            for i, batch in enumerate(rw.WebLoader(ds, batch_size=4, collate_fn=lambda x: x, num_workers=0)):
                keys += [(s["__key__"], s["__url__"], s["txt"]) for s in batch]
                if i == 2 and cut:
                    os.truncate(paths[1], 100)  # every sample of shard 1 now lies past its end
        except rw.ResumeWDSError as exc:
            err = exc
        return keys, err

    whole, _ = deliver(False)
    assert sorted(k for k, _, _ in whole) == sorted(s["__key__"] for s in _truth(paths))
    # the loader's own reads: all but a few; by the shards' member pattern: all but one per shard
    assert calls["read_sample"] <= 4 and calls["parse"] + calls["as"] == len(whole)
    assert calls["as"] >= len(whole) - 2 * len(paths)
    data = {p: open(p, "rb").read() for p in paths}
    fast = deliver(True)
    for p, b in data.items():
        open(p, "wb").write(b)
    _without_fast_reads(monkeypatch)
    calls["read_sample"] = 0
    slow = deliver(True)
    assert calls["read_sample"] > 4  # every sample the whole way this time
    assert fast[0] == slow[0] and len(fast[0]) < len(whole)
    assert type(fast[1]) is type(slow[1]) and str(fast[1]) == str(slow[1])
    if on_error == "raise":
        assert isinstance(fast[1], rw.ShardFormatError) and "shard-1.tar" in str(fast[1])
    else:
        assert fast[1] is None
        assert {k for k, u, _ in fast[0][12:] if u.endswith("shard-1.tar")} == set()  # skipped once cut


def test_member_patterns_give_the_same_samples_and_stop_on_mixed_shards(tmp_path, monkeypatch):
    """Verified shards are framed by their member pattern (``tario.parse_sample_as``):
    the delivered sequence equals the one framed by ``parse_sample`` alone; a
    shard whose samples keep changing pattern stops being tried after 16
    misses, and a shard with upper-case extensions (never a match) too."""
    paths = _shards(tmp_path, n=2, per=30)
    mixed = []
    for i in range(60):  # three patterns in turn: every sample a miss
        ms = [(f"m{i:03d}.txt", b"t" * i), (f"m{i:03d}.bin", os.urandom(50))]
        if i % 3 == 1:
            ms.append((f"m{i:03d}.json", b"{}"))
        elif i % 3 == 2:
            ms.reverse()
        mixed += ms
    upper = [(f"u{i:03d}.TXT", b"u" * i) for i in range(40)]
    for name, members in (("mixed.tar", mixed), ("upper.tar", upper)):
        (tmp_path / name).write_bytes(tar_bytes(members))
        paths.append(str(tmp_path / name))
    manifest = rw.build_manifest(paths)
    calls = {"as": 0, "hit": 0}
    real_as = tario.parse_sample_as

    def parse_as(*a, **kw):
        got = real_as(*a, **kw)
        calls["as"] += 1
        calls["hit"] += got is not None
        return got

    monkeypatch.setattr(tario, "parse_sample_as", parse_as)

    def deliver():
        ds = rw.WebDataset(manifest, shuffle=True, seed=5)
        return [dict(s) for b in rw.WebLoader(ds, batch_size=7, collate_fn=lambda x: x) for s in b]

    got = deliver()
    assert calls["hit"] >= 2 * (30 - 2)  # the uniform shards: all but their first reads
    assert calls["as"] - calls["hit"] <= 2 * (16 + 1)  # the other two: 16 misses each, then no more tries
    monkeypatch.setattr(tario, "member_pattern", lambda sample: ())  # patterns off: parse_sample only
    calls["as"] = 0
    want = deliver()
    assert calls["as"] == 0
    assert got == want and len(got) == 2 * 30 + 60 + 40
    assert _plain(got) == _plain(sorted(_truth(paths), key=lambda s: [x["__key__"] for x in want].index(s["__key__"])))
