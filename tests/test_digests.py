"""Per-sample digests: manifest version 3 (inline and side file), writers, index, verify."""

from __future__ import annotations

import json
import os
import pickle

import pytest
from click.testing import CliRunner

import resumewds as rw
from chaos.diskfaults import flip_byte
from resumewds.cli._main import cli
from resumewds.errors import SourceError
from resumewds.manifest._manifest import load_manifest, parse_manifest_bytes
from resumewds.sources import _digests as dg
from resumewds.synth import write_shards
from resumewds.tar import scan_file
from resumewds.writer import ShardWriter


@pytest.fixture
def data(tmp_path, monkeypatch):
    monkeypatch.setenv("RESUMEWDS_CACHE_DIR", str(tmp_path / "cache"))
    d = tmp_path / "data"
    write_shards(str(d), shards=3, samples=17, size_range=(100, 2500), seed=2)
    return d


def _expected(path):
    """Digests computed independently: hash each range read with plain file reads."""
    import xxhash

    idx = scan_file(path)
    raw = open(path, "rb").read()
    return [xxhash.xxh3_64_intdigest(raw[a:b]) for a, b in zip(idx.offsets, idx.offsets[1:])]


def _index(data, *extra):
    out = str(data / "m.json")
    res = CliRunner().invoke(cli, ["index", *sorted(str(p) for p in data.glob("*.tar")), "-o", out, *extra])
    assert res.exit_code == 0, res.output
    return out


def test_index_writes_v3_inline_by_default(data):
    out = _index(data)
    raw = json.loads(open(out).read())
    assert raw["version"] == 3
    e = raw["shards"][0]
    assert len(e["sample_xxh3_64"]) == 16 * e["samples"] and "offsets" in e
    m = load_manifest(out)
    for s in m.shards:
        assert list(s.sample_digests) == _expected(s.url)


def test_index_no_digests_keeps_old_formats(data):
    raw = json.loads(open(_index(data, "--no-digests")).read())
    assert raw["version"] == 1 and "sample_xxh3_64" not in raw["shards"][0]
    raw = json.loads(open(_index(data, "--no-digests", "--offsets", "file")).read())
    assert raw["version"] == 2 and "digests_file" not in raw


def test_side_file_equals_inline(data):
    inline = load_manifest(_index(data))
    out = _index(data, "--offsets", "file")
    raw = json.loads(open(out).read())
    assert raw["version"] == 3 and raw["digests_file"] == "m.json.digests"
    assert "sample_xxh3_64" not in raw["shards"][0] and raw["shards"][1]["digests_at"] == 17
    assert os.path.getsize(out + ".digests") == raw["digests_size"] == 8 * 3 * 17
    m = load_manifest(out)
    assert isinstance(m.shards[0].sample_digests, dg.LazyDigests)
    for a, b in zip(inline.shards, m.shards):
        assert list(a.sample_digests) == list(b.sample_digests)
    again = pickle.loads(pickle.dumps(m.shards[2]))  # workers map the file themselves
    assert list(again.sample_digests) == list(inline.shards[2].sample_digests)
    assert inline.digest() == m.digest()  # the journal's data-set check ignores the format


def test_v3_round_trip_and_older_versions_unchanged(data):
    m = rw.build_manifest(str(data / "shard-{000000..000002}.tar"), str(data / "a.json"), digests=True)
    assert json.loads((data / "a.json").read_text())["version"] == 3
    m.save(str(data / "b.json"), digests=False)
    raw = json.loads((data / "b.json").read_text())
    assert raw["version"] == 1
    b = load_manifest(str(data / "b.json"))
    assert all(s.sample_digests is None for s in b.shards)
    assert b.digest() == m.digest()
    # a v1/v2 manifest carrying the field (written by hand) does not get digests from it
    raw["shards"][0]["sample_xxh3_64"] = "zz"
    assert parse_manifest_bytes(json.dumps(raw).encode(), "x.json").shards[0].sample_digests is None


def test_writer_writes_digests(tmp_path):
    with ShardWriter(str(tmp_path / "s-%03d.tar"), maxcount=4, verbose=0, mtime=0) as sink:
        for i in range(10):
            sink.write({"__key__": f"k{i:02d}", "txt": "x" * (i * 333), "cls": i})
    raw = json.loads((tmp_path / "manifest.json").read_text())
    assert raw["version"] == 3
    m = load_manifest(str(tmp_path / "manifest.json"))
    assert [s.samples for s in m.shards] == [4, 4, 2]
    for s in m.shards:
        assert list(s.sample_digests) == _expected(s.url)


def test_compressed_writer_has_no_digests(tmp_path):
    with ShardWriter(str(tmp_path / "s-%03d.tgz"), maxcount=4, verbose=0, mtime=0) as sink:
        for i in range(5):
            sink.write({"__key__": f"k{i}", "txt": "y" * 100})
    m = load_manifest(str(tmp_path / "manifest.json"))
    assert all(s.sample_digests is None for s in m.shards)


def _v3(**shard):
    d = {"url": "a.tar", "size": 3072, "samples": 2, "offsets": [0, 1024, 2048]}
    d.update(shard)
    return json.dumps({"format": "resumewds.manifest", "version": 3, "shards": [d]}).encode()


@pytest.mark.parametrize("shard, words", [
    ({"sample_xxh3_64": "00" * 8}, "has 16 hex digits, expected 16 per sample = 32"),
    ({"sample_xxh3_64": "g" * 32}, "not hex"),
    ({"sample_xxh3_64": 12}, "must be a string"),
    ({"sample_xxh3_64": "0" * 32, "samples": None, "offsets": None}, "without 'samples'"),
    ({"digests_at": 0}, "needs 'digests_file'"),
])
def test_bad_inline_digests_are_refused(shard, words):
    with pytest.raises(SourceError) as ei:
        parse_manifest_bytes(_v3(**shard), "m.json")
    assert words in str(ei.value) and "m.json: shard a.tar" in str(ei.value)


def test_bad_side_file_entries_are_refused(tmp_path):
    (tmp_path / "m.json.digests").write_bytes(b"\0" * 8 * 3)

    def load(**kw):
        doc = json.loads(_v3(**kw.pop("shard", {})))
        doc.update({"digests_file": "m.json.digests"}, **kw)
        (tmp_path / "m.json").write_text(json.dumps(doc))
        return load_manifest(str(tmp_path / "m.json"))

    assert list(load(shard={"digests_at": 1}).shards[0].sample_digests) == [0, 0]
    for kw, words in [({"shard": {"digests_at": 2}}, "needs digests 2..3 but"),
                      ({"shard": {"digests_at": -1}}, "'digests_at' must be a non-negative integer"),
                      ({"shard": {"digests_at": "0"}}, "'digests_at' must be a non-negative integer"),
                      ({"shard": {"digests_at": 0}, "digests_size": 7}, "multiple of 8"),
                      ({"shard": {"digests_at": 0}, "digests_file": 3}, "'digests_file' must be")]:
        with pytest.raises(SourceError) as ei:
            load(**kw)
        assert words in str(ei.value), (kw, str(ei.value))


def _flip(path, at):
    flip_byte(path, at, 0x55)


def test_verify_names_bad_samples(data):
    out = _index(data)
    m = load_manifest(out)
    s = m.shards[1]
    a, b = s.sample_range(5)
    _flip(s.url, a + 520)  # in sample 5's first member's data (after its 512-byte header)
    res = CliRunner().invoke(cli, ["verify", out, "--no-progress"])
    assert res.exit_code == 1
    lines = [ln for ln in res.stderr.splitlines() if ln.startswith("BAD SAMPLE")]
    key = scan_file(m.shards[0].url).keys[5].replace("000000_", "000001_")  # synth's key pattern
    assert len(lines) == 1, res.stderr
    assert f"{s.url}: sample 5 (key {key}, bytes {a}-{b})" in lines[0]
    assert "verify: 2 ok, 1 failed" in res.stderr


def test_verify_checks_digests_without_whole_checksum(data):
    out = _index(data)
    doc = json.loads(open(out).read())
    for e in doc["shards"]:
        e["xxh3_64"] = None
    open(out, "w").write(json.dumps(doc))
    m = load_manifest(out)
    s = m.shards[2]
    a, b = s.sample_range(16)
    _flip(s.url, a + 520)  # inside the last sample's data: still a well-formed tar
    res = CliRunner().invoke(cli, ["verify", out, "--no-progress"])
    assert res.exit_code == 1, res.stderr
    assert f"BAD SAMPLE {s.url}: sample 16 " in res.stderr and "1 failed" in res.stderr


def test_bad_samples_none_when_intact(data):
    m = load_manifest(_index(data))
    assert all(dg.bad_samples(s.url, s) == [] for s in m.shards)


def test_remote_side_file_comes_through_the_cache(data, tmp_path):
    from chaos.faultserver import FaultServer
    from resumewds.errors import UnsafeSourceError
    from resumewds.sources._resolve import resolve_sources

    local = load_manifest(_index(data, "--offsets", "file"))
    with FaultServer(str(data)) as srv:
        m = resolve_sources(srv.url.rstrip("/") + "/m.json", cache_dir=str(tmp_path / "c"))
        assert isinstance(m.shards[0].sample_digests, dg.LazyDigests)
        assert not m.shards[0].sample_digests.file.path.startswith("http")  # the cached copy
        assert [list(s.sample_digests) for s in m.shards] == [list(s.sample_digests) for s in local.shards]
        doc = json.loads((data / "m.json").read_text())
        doc["digests_file"] = str(data / "m.json.digests")  # a local path in a remote manifest
        (data / "evil.json").write_text(json.dumps(doc))
        with pytest.raises(UnsafeSourceError) as ei:
            resolve_sources(srv.url.rstrip("/") + "/evil.json", cache_dir=str(tmp_path / "c"))
        assert "m.json.digests" in str(ei.value)
