"""Manifest format: version 1 (inline offsets) and version 2 (offsets side file)."""

from __future__ import annotations

import json
import pickle

import pytest
from click.testing import CliRunner

import resumewds as rw
from chaos.faultserver import FaultServer
from resumewds.cli._main import cli
from resumewds.errors import ChecksumMismatch, SourceError
from resumewds.manifest._manifest import LazyOffsets, load_manifest
from resumewds.synth import write_shards


@pytest.fixture
def data(tmp_path, monkeypatch):
    monkeypatch.setenv("RESUMEWDS_CACHE_DIR", str(tmp_path / "cache"))
    d = tmp_path / "data"
    write_shards(str(d), shards=4, samples=23, size_range=(100, 900), seed=1)
    return d


def _cat(*args):
    res = CliRunner().invoke(cli, ["cat", *args], catch_exceptions=False)
    assert res.exit_code == 0, res.output
    return res.stdout


def test_offsets_file_equals_inline(data):
    pattern = str(data / "shard-{000000..000003}.tar")
    rw.build_manifest(pattern, str(data / "v1.json"), offsets="inline")
    rw.build_manifest(pattern, str(data / "v2.json"), offsets="file")
    v1 = json.loads((data / "v1.json").read_text())
    v2 = json.loads((data / "v2.json").read_text())
    assert v1["version"] == 1 and "offsets" in v1["shards"][0]
    assert v2["version"] == 2 and v2["offsets_file"] == "v2.json.offsets"
    assert "offsets" not in v2["shards"][0] and v2["shards"][1]["offsets_at"] == 24
    m1, m2 = load_manifest(str(data / "v1.json")), load_manifest(str(data / "v2.json"))
    assert isinstance(m2.shards[0].offsets, LazyOffsets)
    for a, b in zip(m1.shards, m2.shards):
        assert list(a.offsets) == list(b.offsets)
    assert m1.digest() == m2.digest()
    # pickles as (file path, start, count): workers map the file themselves
    again = pickle.loads(pickle.dumps(m2.shards[2]))
    assert list(again.offsets) == list(m2.shards[2].offsets)
    out1 = _cat(str(data / "v1.json"), "--seed", "3", "--shuffle", "--epochs", "2")
    out2 = _cat(str(data / "v2.json"), "--seed", "3", "--shuffle", "--epochs", "2", "--workers", "2")
    assert out1 == out2 and len(out1.splitlines()) == 2 * 4 * 23


def test_cli_index_offsets_option(data):
    res = CliRunner().invoke(cli, ["index", *sorted(str(p) for p in data.glob("*.tar")),
                                   "-o", str(data / "m.json"), "--offsets", "file"])
    assert res.exit_code == 0, res.output
    assert (data / "m.json.offsets").stat().st_size == 8 * 4 * 24


def test_missing_offsets_file_is_a_clear_error(data):
    rw.build_manifest(str(data / "shard-{000000..000003}.tar"), str(data / "v2.json"), offsets="file")
    (data / "v2.json.offsets").unlink()
    res = CliRunner().invoke(cli, ["cat", str(data / "v2.json")])
    assert res.exit_code != 0
    assert "v2.json.offsets" in res.output


def test_newer_version_refused(data):
    rw.build_manifest(str(data / "shard-{000000..000003}.tar"), str(data / "m.json"))
    doc = json.loads((data / "m.json").read_text())
    doc["version"] = 99
    (data / "m.json").write_text(json.dumps(doc))
    with pytest.raises(SourceError, match="newer"):
        load_manifest(str(data / "m.json"))


def test_remote_v2_manifest_offsets_come_verified_through_the_cache(data, tmp_path):
    rw.build_manifest(str(data / "shard-{000000..000003}.tar"), str(data / "v2.json"), offsets="file")
    local = _cat(str(data / "v2.json"), "--seed", "5", "--shuffle")
    with FaultServer(str(data), faults="mixed:0.2", seed=4, max_faults_per_path=2, stall_seconds=1.0,
                     retry_after=0) as srv:
        remote = _cat(srv.url + "v2.json", "--seed", "5", "--shuffle", "--timeout", "0.5",
                      "--cache-dir", str(tmp_path / "c2"))
    assert remote == local
    # a tampered side file fails its checksum instead of feeding wrong offsets
    raw = bytearray((data / "v2.json.offsets").read_bytes())
    raw[9] ^= 0xFF
    (data / "v2.json.offsets").write_bytes(bytes(raw))
    with FaultServer(str(data), faults="", seed=0) as srv:
        with pytest.raises(ChecksumMismatch, match="v2.json.offsets"):
            _ = rw.WebDataset(srv.url + "v2.json", cache_dir=str(tmp_path / "c3")).manifest


# ---------------------------------------------------------------------------
# a manifest is validated on load, before any allocation
# ---------------------------------------------------------------------------

from array import array  # noqa: E402

from resumewds.manifest import Manifest  # noqa: E402
from resumewds.manifest._manifest import validate_offsets  # noqa: E402


def _doc(**shard):
    base = {"url": "a.tar", "size": 4096, "xxh3_64": "0123456789abcdef", "samples": 2,
            "offsets": [0, 1024, 2048]}
    base.update(shard)
    return {"format": "resumewds.manifest", "version": 1, "shards": [base]}


@pytest.mark.parametrize("shard,words", [
    ({"offsets": [0, -1024, 2048]}, "offsets[1] is negative"),
    ({"offsets": [0, 2048, 1024]}, "offsets go backwards at entry 2"),
    ({"offsets": [0, 1024.0, 2048]}, "offsets[1] is 1024.0, not an integer"),
    ({"offsets": [0, True, 2048]}, "offsets[1] is true, not an integer"),
    ({"offsets": [0, 1024, 10 ** 12]}, "past the shard's size (4096 bytes)"),
    ({"offsets": [0, 1024, 2 ** 64], "size": None}, "beyond what any file can hold"),
    ({"offsets": [0, 1024]}, "offsets has 2 entries, expected samples+1 = 3"),
    ({"offsets": "0 1024 2048"}, "'offsets' must be a list"),
    ({"samples": "2"}, "'samples' must be a non-negative integer, got \"2\""),
    ({"samples": -1, "offsets": None}, "'samples' must be a non-negative integer"),
    ({"size": 4096.5}, "'size' must be a non-negative integer"),
    ({"size": 2 ** 64}, "'size' must be a non-negative integer"),
    ({"xxh3_64": "not-hex"}, "'xxh3_64' must be a hex digest"),
    ({"offsets": None, "offsets_at": 0}, "offsets_at needs 'offsets_file'"),
    ({"url": ""}, "shard #0 has no url"),
])
def test_bad_entries_are_refused(shard, words):
    with pytest.raises(SourceError) as ei:
        Manifest.from_json(_doc(**shard), "/d/m.json")
    assert words in str(ei.value) and str(ei.value).startswith("/d/m.json: ")


def test_good_entries_still_load():
    m = Manifest.from_json(_doc(), "/d/m.json")
    assert isinstance(m.shards[0].offsets, array) and list(m.shards[0].offsets) == [0, 1024, 2048]
    m = Manifest.from_json(_doc(size=None, xxh3_64=None, samples=None, offsets=None), "/d/m.json")
    assert not m.indexed
    assert list(validate_offsets([0, 0, 5], 2, 5, "w")) == [0, 0, 5]  # empty samples are fine


def _v2(data, tmp_path, edit_side=None, edit_doc=None):
    rw.build_manifest(str(data / "shard-{000000..000003}.tar"), str(data / "v2.json"), offsets="file")
    doc = json.loads((data / "v2.json").read_text())
    if edit_doc:
        edit_doc(doc)
    (data / "v2.json").write_text(json.dumps(doc))
    if edit_side:
        a = array("q")
        a.frombytes((data / "v2.json.offsets").read_bytes())
        edit_side(a)
        (data / "v2.json.offsets").write_bytes(a.tobytes())
    return load_manifest(str(data / "v2.json"))


def test_side_file_slices_are_validated_on_first_use(data, tmp_path):
    m = _v2(data, tmp_path, edit_side=lambda a: a.__setitem__(30, -7))  # shard 1 (offsets_at 24)
    assert list(m.shards[0].offsets)[:2] == [0, m.shards[0].offsets[1]]
    with pytest.raises(SourceError, match=r"shard shard-000001.tar: offsets\[6\] is negative"):
        m.shards[1].offsets[0]
    with pytest.raises(SourceError, match="shard-000003.tar: needs offsets 90..113 but .* holds 96"):
        _v2(data, tmp_path, edit_doc=lambda d: d["shards"][3].__setitem__("offsets_at", 90))
    m = _v2(data, tmp_path)  # a side file that shrinks after the load is caught on first use
    raw = (data / "v2.json.offsets").read_bytes()
    (data / "v2.json.offsets").write_bytes(raw[:8 * 80])
    with pytest.raises(SourceError, match="needs offsets 72..95 but .* holds 80"):
        m.shards[3].offsets[0]
    with pytest.raises(SourceError, match="'offsets_at' must be a non-negative integer"):
        _v2(data, tmp_path, edit_doc=lambda d: d["shards"][0].__setitem__("offsets_at", 1.5))


def test_lazy_offsets_count_is_the_sequence_method(data, tmp_path):
    m = _v2(data, tmp_path)
    off = m.shards[1].offsets
    assert isinstance(off, LazyOffsets)
    assert len(off) == off.length == 24
    assert off.count(off[3]) == 1 and off.count(-1) == 0  # Sequence.count(), not an int attribute
    assert off.index(off[5]) == 5
    again = pickle.loads(pickle.dumps(off))
    assert list(again) == list(off) and again.where == off.where


@pytest.mark.parametrize("raw,words", [
    (b"[" * 100_000, "nested too deeply"),
    (b'{"format": "resumewds.manifest", "version": 1, "shards": [{"url": "a.tar", "samples": NaN}]}',
     "'samples' must be a non-negative integer"),
    (b"\xff\xfe{", "not valid JSON"),
    (b'{"format": "resumewds.manifest", "version": true, "shards": []}', "'version' must be a positive integer"),
])
def test_hostile_json_is_a_source_error(raw, words):
    from resumewds.manifest._manifest import parse_manifest_bytes

    with pytest.raises(SourceError, match=words):
        parse_manifest_bytes(raw, "/d/m.json")
