"""Consecutive samples are read with one pread: same samples, same skips."""

from __future__ import annotations

import dataclasses
import os

import pytest

import resumewds as rw
import resumewds.dataset as D
from conftest import tar_bytes
from resumewds import tario
from resumewds.manifest import Manifest

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
