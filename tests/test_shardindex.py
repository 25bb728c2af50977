"""Manifest version 4 (an index file per shard) and counts-only sources (wids, img2dataset).

Whole sequences are compared with the same data read through an inline
(version 1/3) manifest: the format changes where offsets live, never what is
delivered.
"""

from __future__ import annotations

import json
import os
import pickle
import shutil

import pytest

import resumewds as rw
from resumewds.errors import ChecksumMismatch, ShardFormatError, SourceError
from resumewds.manifest import IndexSet
from resumewds.manifest._manifest import load_manifest
from resumewds.tar import scan_file

pytestmark = pytest.mark.usefixtures("cache_dir")


def keys(src, **kw):
    return [s["__key__"] for s in rw.WebDataset(src, shuffle=True, seed=4, **kw)]


@pytest.fixture
def data(make_shards, tmp_path):
    paths = make_shards(shards=6, samples=23)
    d = tmp_path / "data"
    m = rw.build_manifest(paths, digests=True)
    m.save(str(d / "v4.json"), offsets="index")
    m.save(str(d / "v3.json"), offsets="inline")
    return paths, str(d / "v4.json"), str(d / "v3.json")


def test_v4_delivers_what_v3_delivers_and_keeps_offsets_out_of_the_json(data):
    paths, v4, v3 = data
    doc = json.load(open(v4))
    assert doc["version"] == 4 and doc["index_digests"] is True
    assert all("offsets" not in s and "sample_xxh3_64" not in s for s in doc["shards"])
    assert sorted(os.listdir(v4 + ".index")) == sorted(s["index_xxh3_64"] + ".idx" for s in doc["shards"])
    assert keys(v4) == keys(v3) and len(keys(v4)) == 6 * 23
    m4, m3 = load_manifest(v4), load_manifest(v3)
    assert m4.digest() == m3.digest()  # a run resumes across the formats
    for a, b in zip(m4.shards, m3.shards):
        assert list(a.offsets) == list(b.offsets) and list(a.sample_digests) == list(b.sample_digests)
        assert a.sample_range(7) == b.sample_range(7) and a.num_samples == 23


def test_a_pickled_shard_carries_no_offsets(data):
    _, v4, _ = data
    s = load_manifest(v4).shards[0]
    s.sample_range(0)  # loaded in this process
    copy = pickle.loads(pickle.dumps(s))
    assert copy.offsets.ref.arrays is None  # a worker loads what it reads
    assert copy.sample_range(3) == s.sample_range(3)


def test_loaded_indexes_stay_within_the_budget(make_shards, tmp_path):
    paths = make_shards(shards=12, samples=5, subdir="many")
    m = rw.build_manifest(paths, digests=True)
    m.save(str(tmp_path / "m.json"), offsets="index")
    m4 = load_manifest(str(tmp_path / "m.json"))
    iset = m4.shards[0].index.set
    iset.budget, iset.keep = 1, 3
    for s in m4.shards:
        s.sample_range(0)
    assert iset.loaded() == 3
    assert [s.sample_range(4) for s in m4.shards] == [s.sample_range(4) for s in m.shards]


def _damage(path):
    with open(path, "r+b") as f:
        f.seek(60)
        b = f.read(1)
        f.seek(60)
        f.write(bytes([b[0] ^ 1]))


def test_a_damaged_missing_or_foreign_index_is_an_error_naming_it(data):
    _, v4, _ = data
    doc = json.load(open(v4))
    first = os.path.join(v4 + ".index", doc["shards"][0]["index_xxh3_64"] + ".idx")
    second = os.path.join(v4 + ".index", doc["shards"][1]["index_xxh3_64"] + ".idx")
    saved = open(first, "rb").read()
    _damage(first)
    with pytest.raises(SourceError, match=r"\.idx \(index of .*shard-000000.tar\): xxh3_64 .* damaged or stale"):
        keys(v4)
    os.remove(first)
    with pytest.raises(SourceError, match="cannot read the shard's index .*resumewds index"):
        keys(v4)
    # another shard's index under this shard's name (and the manifest edited to match): refused
    shutil.copy(second, first)
    doc["shards"][0]["index_xxh3_64"] = doc["shards"][1]["index_xxh3_64"]
    json.dump(doc, open(v4, "w"))
    with pytest.raises(SourceError, match="the index is of another shard"):
        keys(v4)
    assert saved  # the good bytes were there before


def test_v4_over_http_fetches_each_index_through_the_cache_once(served, make_shards, cache_dir):
    root, srv = served
    paths = make_shards(shards=4, samples=11)
    for p in paths:
        shutil.copy(p, root)
    m = rw.build_manifest([os.path.join(root, os.path.basename(p)) for p in paths], digests=True)
    m.save(os.path.join(root, "m.json"), offsets="index")
    m.save(os.path.join(root, "inline.json"), offsets="inline")
    url = srv.url + "/m.json"
    want = keys(os.path.join(root, "inline.json"))
    assert keys(url) == want
    assert keys(url) == want
    idx_requests = {p: n for p, n in srv.requests.items() if p.endswith(".idx")}
    assert len(idx_requests) == 4 and set(idx_requests.values()) == {1}, srv.requests


def wids_doc(paths, **extra):
    return {"__kind__": "wids-shard-index-v1", "wids_version": 1, "name": "t",
            "shardlist": [dict({"url": os.path.basename(p), "nsamples": scan_file(p).samples,
                                "filesize": os.path.getsize(p)}, **extra) for p in paths]}


def test_a_wids_index_is_a_source_recorded_at_first_open_and_checked_after(data, cache_dir):
    paths, _, v3 = data
    d = os.path.dirname(paths[0])
    wids = os.path.join(d, "wids.json")
    json.dump(wids_doc(paths), open(wids, "w"))
    want = keys(v3)
    assert keys(wids) == want
    assert len(os.listdir(os.path.join(cache_dir, "records"))) == 6
    assert keys(wids) == want  # checked against the records
    assert load_manifest(wids).digest() != ""  # a counts-only manifest has a digest of its own
    # the shard changes after its first download was recorded: refused, naming it
    with open(paths[2], "r+b") as f:
        f.seek(700)
        b = f.read(1)
        f.seek(700)
        f.write(bytes([b[0] ^ 0x20]))
    with pytest.raises(ChecksumMismatch, match="shard-000002.tar: not the shard recorded at its first download"):
        keys(wids)


def test_a_wrong_count_or_md5_in_a_wids_index_is_an_error_naming_the_source(data, tmp_path):
    paths, _, _ = data
    d = os.path.dirname(paths[0])
    doc = wids_doc(paths)
    doc["shardlist"][1]["nsamples"] = 22
    json.dump(doc, open(os.path.join(d, "bad.json"), "w"))
    with pytest.raises(ShardFormatError, match=r"shard-000001.tar: the wids shard index .*bad.json says it "
                                               r"holds 22 samples, it holds 23"):
        keys(os.path.join(d, "bad.json"))
    doc = wids_doc(paths, md5sum="0" * 32)
    json.dump(doc, open(os.path.join(d, "md5.json"), "w"))
    with pytest.raises(ChecksumMismatch, match="md5 .*says 0000"):
        keys(os.path.join(d, "md5.json"), cache_dir=str(tmp_path / "c2"))


def test_img2dataset_stats_are_a_source(data):
    paths, _, v3 = data
    stats = []
    for p in paths:
        s = p[:-len(".tar")] + "_stats.json"
        json.dump({"count": 30, "successes": scan_file(p).samples, "failed_to_download": 7}, open(s, "w"))
        stats.append(s)
    # synth names shards shard-NNNNNN.tar: their stats are shard-NNNNNN_stats.json
    assert keys(stats) == keys(v3)


def test_index_set_pickles_without_what_it_loaded(data):
    _, v4, _ = data
    m = load_manifest(v4)
    for s in m.shards:
        s.sample_range(0)
    iset: IndexSet = m.shards[0].index.set
    assert iset.loaded() == 6
    assert pickle.loads(pickle.dumps(iset)).loaded() == 0


def test_verify_checks_the_counts_a_wids_index_declares(data, tmp_path):
    from click.testing import CliRunner

    from resumewds.cli._main import cli

    paths, _, _ = data
    doc = wids_doc(paths)
    doc["shardlist"][4]["nsamples"] = 24
    src = str(tmp_path / "wids.json")
    json.dump(dict(doc, base=os.path.dirname(paths[0])), open(src, "w"))
    r = CliRunner().invoke(cli, ["verify", src, "--cache-dir", str(tmp_path / "c")])
    assert r.exit_code == 1 and "shard-000004.tar" in r.output and "holds 23 samples, its source says 24" in r.output


@pytest.mark.parametrize("location", ["/d/sub/manifest.json", "file:///d/m.json", "rel/m.json",
                                      "http://h/d/m.json?sig=1&x=2", "https://h/m.json#f", "s3://bucket/d/m.json"])
@pytest.mark.parametrize("url", ["a.tar", "sub/a b.tar", "../up.tar", "./here.tar", "/abs.tar", "a%20b.tar",
                                 "q?x=1.tar", "http://o/x.tar", "pipe:cat a.tar", "s3://b/k.tar", "a//b.tar",
                                 "dir/", "shard #1.tar", "ü.tar"])
def test_url_resolver_is_resolve_url(location, url):
    from resumewds.manifest._manifest import resolve_url, url_resolver

    assert url_resolver(location)(url) == resolve_url(url, location)
