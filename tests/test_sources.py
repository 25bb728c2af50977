"""Tests for resumewds.sources and the manifest format: patterns, schemes,
manifests (relative urls, versions, stale offsets) and the remote-pipe rule."""

from __future__ import annotations

import json
import os
import shutil

import pytest

import resumewds as rw
from resumewds.errors import ShardFormatError, SourceError, UnsafeSourceError
from resumewds.manifest import Manifest, load_manifest, parse_manifest_bytes
from resumewds.manifest._manifest import FORMAT, VERSION
from resumewds.sources._resolve import expand_braces, resolve_sources
from resumewds.tar import sample_digest

pytestmark = pytest.mark.usefixtures("cache_dir")


@pytest.mark.parametrize("pattern,expected", [
    ("s-{000..003}.tar", ["s-000.tar", "s-001.tar", "s-002.tar", "s-003.tar"]),
    ("s-{8..11}.tar", ["s-8.tar", "s-9.tar", "s-10.tar", "s-11.tar"]),
    ("s-{09..11}", ["s-09", "s-10", "s-11"]),
    ("s-{3..1}", ["s-3", "s-2", "s-1"]),
    ("{train,val}-{0..1}.tar", ["train-0.tar", "train-1.tar", "val-0.tar", "val-1.tar"]),
    ("{a,b{1..2},c}", ["a", "b1", "b2", "c"]),
    ("x{a,{b,c}d}y", ["xay", "xbdy", "xcdy"]),
    ("plain.tar", ["plain.tar"]),
    ("{x}.tar", ["{x}.tar"]),
    ("d/{a,b}/{0..1}", ["d/a/0", "d/a/1", "d/b/0", "d/b/1"]),
])
def test_expand_braces(pattern, expected):
    assert expand_braces(pattern) == expected


def test_unbalanced_braces():
    with pytest.raises(SourceError):
        expand_braces("s-{0..3.tar")


def test_resolve_paths_patterns_and_lists(shards, tmp_path):
    d = os.path.dirname(shards[0])
    m = resolve_sources(os.path.join(d, "shard-{000000..000004}.tar"))
    assert [s.url for s in m.shards] == shards
    m = resolve_sources([shards[2], "file://" + shards[0]])
    assert [s.url for s in m.shards] == [shards[2], shards[0]]
    assert not m.indexed
    cwd = os.getcwd()
    try:
        os.chdir(d)
        assert resolve_sources("shard-000001.tar").shards[0].url == shards[1]
    finally:
        os.chdir(cwd)
    assert resolve_sources("pipe:cat /x/y.tar").shards[0].url == "pipe:cat /x/y.tar"
    assert resolve_sources("pipe:cat /x/y.tar").shards[0].name == "y.tar"


@pytest.mark.parametrize("bad", ["az://bucket/a.tar", "ftp://h/a.tar", "gs://b/{0..1}.tar"])
def test_bad_scheme(bad):
    with pytest.raises(SourceError) as ei:
        resolve_sources(bad)
    assert "scheme" in str(ei.value)


def test_empty_sources():
    with pytest.raises(SourceError):
        resolve_sources([])
    with pytest.raises(SourceError):
        resolve_sources([""])


def test_build_manifest_round_trip(shards, tmp_path):
    out = str(tmp_path / "data" / "manifest.json")
    m = rw.build_manifest(shards, out)
    raw = json.load(open(out))
    assert raw["format"] == FORMAT and raw["version"] == 1  # inline offsets: version 1 (readable by older readers)
    assert [s["url"] for s in raw["shards"]] == [os.path.basename(p) for p in shards]  # relative
    loaded = load_manifest(out)
    assert loaded.indexed and loaded.total_samples == 5 * 37
    assert [s.url for s in loaded.shards] == shards
    assert loaded.digest() == m.digest()
    for a, b in zip(loaded.shards, m.shards):
        assert (a.size, a.xxh3_64, a.samples, list(a.offsets)) == \
            (b.size, b.xxh3_64, b.samples, list(b.offsets))
        idx = rw.scan_file(a.url)
        assert list(a.offsets) == idx.offsets and a.xxh3_64 == idx.xxh3_64
    assert loaded.locate(37) == (1, 0)
    # a moved data set still has the same digest (journal check) and loads
    moved = tmp_path / "moved"
    shutil.copytree(tmp_path / "data", moved)
    m2 = load_manifest(str(moved / "manifest.json"))
    assert m2.shards[0].url == str(moved / "shard-000000.tar")
    assert m2.digest() == m.digest()
    # the same samples come out, through the manifest or through plain paths
    via_manifest = [sample_digest(s) for s in rw.WebDataset(str(moved / "manifest.json"))]
    via_paths = [sample_digest(s) for s in rw.WebDataset(shards)]
    assert via_manifest == via_paths and len(via_paths) == 185


def test_manifest_relative_urls_resolve_against_manifest(shards, tmp_path):
    sub = tmp_path / "elsewhere" / "m"
    sub.mkdir(parents=True)
    mpath = str(sub / "manifest.json")
    rw.build_manifest(shards[:2], mpath)
    urls = [s["url"] for s in json.load(open(mpath))["shards"]]
    assert urls == [os.path.join("..", "..", "data", os.path.basename(p)) for p in shards[:2]]
    cwd = os.getcwd()
    try:
        os.chdir(str(tmp_path / "elsewhere"))
        m = resolve_sources("m/manifest.json")
    finally:
        os.chdir(cwd)
    assert [s.url for s in m.shards] == shards[:2]
    # a manifest mixed with loose paths keeps the given order
    m = resolve_sources([shards[4], mpath, shards[3]])
    assert [s.url for s in m.shards] == [shards[4], shards[0], shards[1], shards[3]]


def _manifest_dict(**over):
    d = {"format": FORMAT, "version": VERSION, "shards": [{"url": "a.tar"}]}
    d.update(over)
    return d


def test_manifest_version_and_format_checks(tmp_path):
    for bad, words in [(_manifest_dict(version=VERSION + 1), "newer"),
                       (_manifest_dict(format="other"), "not a resumewds manifest"),
                       (_manifest_dict(shards={}), "list"),
                       (_manifest_dict(shards=[{"url": "a.tar", "samples": 2, "offsets": [0, 1]}]),
                        "offsets")]:
        p = tmp_path / "m.json"
        p.write_text(json.dumps(bad))
        with pytest.raises(SourceError) as ei:
            resolve_sources(str(p))
        assert words in str(ei.value)
    with pytest.raises(SourceError):
        parse_manifest_bytes(b"{not json", "x.json")
    with pytest.raises(SourceError):
        load_manifest(str(tmp_path / "missing.json"))


def test_pipe_urls_from_remote_manifest_are_refused(tmp_path):
    d = _manifest_dict(shards=[{"url": "pipe:cat /etc/passwd.tar"}, {"url": "b.tar"}])
    raw = json.dumps(d).encode()
    remote = parse_manifest_bytes(raw, "http://127.0.0.1:9/d/manifest.json", trusted=False)
    assert remote.shards[1].url == "http://127.0.0.1:9/d/b.tar"
    assert not remote.shards[0].trusted and remote.shards[1].trusted
    # a real remote manifest: untrusted pipes are refused
    from chaos.faultserver import FaultServer

    srv_root = tmp_path / "srv"
    srv_root.mkdir()
    (srv_root / "manifest.json").write_bytes(raw)
    with FaultServer(str(srv_root)) as srv:
        with pytest.raises(UnsafeSourceError):
            resolve_sources(srv.url + "manifest.json")
        ok = resolve_sources(srv.url + "manifest.json", allow_remote_pipe=True)
        assert ok.shards[0].url.startswith("pipe:")
    # a local manifest is trusted
    p = tmp_path / "local.json"
    p.write_bytes(raw)
    assert resolve_sources(str(p)).shards[0].trusted


def test_stale_manifest_offsets_raise_shard_format_error(shards, tmp_path):
    mpath = str(tmp_path / "data" / "manifest.json")
    rw.build_manifest(shards[:2], mpath)
    d = json.load(open(mpath))
    offs = d["shards"][0]["offsets"]
    d["shards"][0]["offsets"] = [offs[0]] + [o + 512 for o in offs[1:-1]] + [offs[-1]]
    d["shards"][0]["xxh3_64"] = None  # the shard itself is fine; only offsets are stale
    d["shards"][0]["size"] = None
    with open(mpath, "w") as f:
        json.dump(d, f)
    ds = rw.WebDataset(mpath)
    with pytest.raises(ShardFormatError) as ei:
        list(ds)
    assert ei.value.shard == shards[0]
    assert ei.value.offset in offs or ei.value.offset in d["shards"][0]["offsets"]


def test_shard_shorter_than_manifest_says(shards, tmp_path):
    mpath = str(tmp_path / "data" / "manifest.json")
    rw.build_manifest(shards[:1], mpath)
    d = json.load(open(mpath))
    d["shards"][0]["offsets"][-1] = os.path.getsize(shards[0]) + 4096
    d["shards"][0]["xxh3_64"] = None
    d["shards"][0]["size"] = None
    with open(mpath, "w") as f:
        json.dump(d, f)
    ds = rw.WebDataset(mpath, verify="never")
    with pytest.raises(ShardFormatError) as ei:
        list(ds)
    assert ei.value.shard == shards[0]
    assert ei.value.offset == os.path.getsize(shards[0])


def test_manifest_object_is_accepted(shards):
    m = rw.build_manifest(shards[:2])
    assert isinstance(m, Manifest)
    assert resolve_sources(m) is m
    assert len(list(rw.WebDataset(m))) == 74
