"""Servers that answer Range requests wrongly, corrupt ranges, HTML and encoded bodies, odd names.

Each test runs a real :class:`chaos.faultserver.FaultServer` on 127.0.0.1:

* every request for a shard, ranged or whole, draws from the shard's one
  fetch budget (a server that never answers gets ``attempts`` requests per
  shard, not that many per range and step; a fault after progress is free);
* a 200 is the whole file: a 200 carrying the ``Content-Range`` of a part,
  or shorter than the known size, in answer to a Range request, is never
  published as the shard;
* a 416 or a 200 to a ranged read sends the shard to the whole-shard path;
* ranges whose bytes keep failing their digests send the shard to a whole
  GET; bytes that are wrong everywhere end the read with an error naming the
  shard and its manifest;
* an HTML page with a 5xx status, one gzip-encoded body, one HTML page where
  a shard of known size was expected: retried;
* names from a remote manifest are percent-encoded when joined to its URL.
"""

from __future__ import annotations

import json
import os
import tarfile
import time

import pytest

import resumewds as rw
from chaos.faultserver import FaultServer
from http_fixtures import Recorder, digest, fast_config, make_tar, shard_for
from resumewds import synth
from resumewds.cache import ShardStore
from resumewds.errors import PermanentFetchError, TransientFetchError
from resumewds.fetch import fetch_to_file
from resumewds.tar import _io as tario

pytestmark = pytest.mark.usefixtures("cache_dir")

SHARDS = 2
SAMPLES = 120


@pytest.fixture
def v3(tmp_path):
    """SHARDS shards and a v3 manifest.json (sample digests) in tmp_path/srv."""
    root = tmp_path / "srv"
    synth.write_shards(str(root), shards=SHARDS, samples=SAMPLES, size_range=(1000, 4000), seed=7)
    rw.build_manifest(str(root / f"shard-{{000000..{SHARDS - 1:06d}}}.tar"), str(root / "manifest.json"),
                      digests=True)
    return str(root)


def _truth(root):
    out = []
    for name in sorted(os.listdir(root)):
        if name.endswith(".tar"):
            for s in tario.iter_samples_file(os.path.join(root, name)):
                out.append((s["__key__"], tuple(sorted((k, bytes(v)) for k, v in s.items()
                                                       if not k.startswith("__")))))
    return sorted(out)


def _plain(s):
    return s["__key__"], tuple(sorted((k, bytes(v)) for k, v in s.items() if not k.startswith("__")))


def _fast_env(monkeypatch, **extra):
    monkeypatch.setenv("RESUMEWDS_FETCH_BACKOFF_INITIAL", "0.01")
    monkeypatch.setenv("RESUMEWDS_FETCH_BACKOFF_MAX", "0.05")
    for k, v in extra.items():
        monkeypatch.setenv(k, str(v))


def _epoch(url, cache, **kw):
    ds = rw.WebDataset(url + "manifest.json", cache_dir=cache, seed=3, **kw)
    try:
        return sorted(_plain(s) for s in ds)
    finally:
        ds.close()


# ---------------------------------------------------------------------------
# one budget per shard: ranged reads, prefetch and the reader
# ---------------------------------------------------------------------------
def test_ranged_reads_spend_the_shards_one_budget(v3, tmp_path, monkeypatch):
    """A server that answers and then never sends a byte of the body: the
    requests of a shard (ranges, prefetch and reader) share its budget, so it
    gets ``attempts`` failed requests in a row in all (plus those already in
    flight: the ranged reads' connections and the prefetch), not that many per
    range and step, and the read ends soon.  (A body that stops part-way
    brings verified samples first: progress, which starts the count again.)"""
    _fast_env(monkeypatch, RESUMEWDS_FETCH_ATTEMPTS=2, RESUMEWDS_FETCH_READ_TIMEOUT=0.5,
              RESUMEWDS_FETCH_DEADLINE=60)
    with FaultServer(v3, stall_seconds=60) as srv:
        for i in range(SHARDS):
            srv.script(f"/shard-{i:06d}.tar", ["stall@0"] * 100)  # the headers, then silence
        t0 = time.monotonic()
        ds = rw.WebDataset(srv.url + "manifest.json", cache_dir=str(tmp_path / "c"), seed=3)
        with pytest.raises(TransientFetchError, match="read timeout"):
            for _ in ds:
                pass
        ds.close()
        took = time.monotonic() - t0
        per_shard = {p: n for p, n in srv.requests.items() if p.endswith(".tar")}
    from resumewds.read._ranged import RANGE_THREADS

    assert per_shard and max(per_shard.values()) <= 2 + RANGE_THREADS + 1, (per_shard, srv.range_log)
    assert took < 30, took


def test_a_range_waits_for_the_attempts_held_by_requests_in_flight(v3, tmp_path, monkeypatch):
    """One attempt in all (prefetch, ranges and reader share it): a healthy server
    still serves the whole epoch, the requests waiting for each other."""
    _fast_env(monkeypatch, RESUMEWDS_FETCH_ATTEMPTS=1)
    truth = _truth(v3)
    with FaultServer(v3) as srv:
        got = _epoch(srv.url, str(tmp_path / "c"), shuffle=True)
    assert got == truth


def test_the_next_iteration_reads_with_a_budget_of_its_own(v3, tmp_path, monkeypatch):
    """A shard whose reads spend its budget (two faults in a row, no progress) is
    skipped; the next epoch (a new read of it) starts with a fresh budget and reads it."""
    _fast_env(monkeypatch, RESUMEWDS_CACHE_SIZE=1, RESUMEWDS_FETCH_ATTEMPTS=2)
    truth = _truth(v3)
    with FaultServer(v3) as srv:
        srv.script("/shard-000000.tar", ["500", "500"])
        ds = rw.WebDataset(srv.url + "manifest.json", cache_dir=str(tmp_path / "c"), seed=3, shuffle=False,
                           on_error="skip")
        first = sorted(_plain(s) for s in ds)
        second = sorted(_plain(s) for s in ds)
        ds.close()
    assert len(first) == SAMPLES * (SHARDS - 1)
    assert second == truth


# ---------------------------------------------------------------------------
# a 200 is the whole file
# ---------------------------------------------------------------------------
def _cut_at_a_sample(path):
    """A ``truncate@f`` fault that cuts the body of ``path`` at a sample's first header."""
    with tarfile.open(path) as tf:
        members = tf.getmembers()
    off = members[len(members) // 2 // 2 * 2].offset  # a .txt header: a sample starts there
    return f"truncate@{(off + 0.5) / os.path.getsize(path)!r}", off


@pytest.mark.parametrize("kind,known", [("range200_tail", False), ("range200_tail", True),
                                        ("range200_partial", True)])
def test_a_200_to_a_range_request_is_never_taken_for_the_whole_file(tmp_path, kind, known):
    """A download cut at a sample boundary is resumed with ``Range``; the server
    answers 200 with only the rest (with ``Content-Range``, or shorter than the
    manifest's size).  The tail is never published; the shard is fetched whole.
    (A 200 without Content-Range, of unknown size, is a changed file for all we know.)"""
    root = tmp_path / "srv"
    root.mkdir()
    data = make_tar(str(root / "a.tar"), samples=16, payload=3000)
    cut, off = _cut_at_a_sample(str(root / "a.tar"))
    with FaultServer(str(root), range_fault=kind) as srv:
        srv.script("/a.tar", [cut])
        st = ShardStore(cache_dir=str(tmp_path / "cache"), fetch=fast_config())
        path = st.ensure(shard_for(srv.url + "a.tar", data, known=known))
        with open(path, "rb") as f:
            assert f.read() == data
        assert srv.faults[kind] >= 1 and srv.faults["truncate"] == 1
        st.close()
    assert 0 < off < len(data)


# ---------------------------------------------------------------------------
# ranged reads: 416, a 200, a corrupt range -> the whole-shard path
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("kind", ["range416", "range200_partial", "range200_tail"])
def test_a_wrong_answer_to_a_ranged_read_falls_back_to_the_whole_shard(v3, tmp_path, monkeypatch, kind):
    _fast_env(monkeypatch, RESUMEWDS_CACHE_SIZE=1)  # nothing prefetched: every read starts as a range
    truth = _truth(v3)
    with FaultServer(v3, range_fault=kind) as srv:
        got = _epoch(srv.url, str(tmp_path / "c"), shuffle=True)
        assert srv.faults[kind] >= SHARDS
    assert got == truth


def test_ranges_that_keep_arriving_corrupt_send_the_shard_to_a_whole_get(v3, tmp_path, monkeypatch):
    """Every Range answer has a flipped byte, whole GETs are clean: the ranged
    reads of each shard are retried, then the shard is downloaded whole (no Range)
    and verified; the epoch is exact, nothing corrupt is delivered."""
    _fast_env(monkeypatch, RESUMEWDS_CACHE_SIZE=1, RESUMEWDS_FETCH_ATTEMPTS=4)
    truth = _truth(v3)
    with FaultServer(v3, range_fault="flip_data") as srv:
        got = _epoch(srv.url, str(tmp_path / "c"), shuffle=False)
        flips = srv.faults["flip_data"]
    assert got == truth
    assert flips >= SHARDS


def test_bytes_wrong_everywhere_end_the_read_naming_the_shard_and_its_manifest(v3, tmp_path, monkeypatch):
    """Every response, ranged or whole, is corrupt: the read ends with a
    ChecksumMismatch that names the shard and the manifest its index came from."""
    _fast_env(monkeypatch, RESUMEWDS_CACHE_SIZE=1, RESUMEWDS_FETCH_ATTEMPTS=1)
    with FaultServer(v3, faults="flip_data=1.0") as srv:
        srv.script("/manifest.json", [None] * 10)
        ds = rw.WebDataset(srv.url + "manifest.json", cache_dir=str(tmp_path / "c"), seed=3, shuffle=False)
        with pytest.raises(rw.errors.ChecksumMismatch, match=r"shard-00000.\.tar.*index from http://.*manifest\.json"):
            for _ in ds:
                pass
        ds.close()


# ---------------------------------------------------------------------------
# HTML pages and encoded bodies: the status decides
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("fault", ["html502", "gzip", "html200"])
def test_one_html_or_encoded_answer_is_retried(served, tmp_path, fault):
    root, srv = served
    data = make_tar(os.path.join(root, "a.tar"))
    srv.script("/a.tar", [fault])
    rec = Recorder()
    res = fetch_to_file(srv.url + "a.tar", str(tmp_path / "p"), expected_size=len(data), config=fast_config(),
                        on_event=rec)
    assert res.xxh3_64 == digest(data) and res.attempts == 2
    assert len(rec.kinds("retry")) == 1


def test_gzip_on_every_attempt_ends_clearly_after_the_budget(served, tmp_path):
    root, srv = served
    make_tar(os.path.join(root, "a.tar"))
    srv.script("/a.tar", ["gzip"] * 10)
    with pytest.raises(TransientFetchError, match="gzip-encoded"):
        fetch_to_file(srv.url + "a.tar", str(tmp_path / "p"), config=fast_config(attempts=3))
    assert srv.requests["/a.tar"] == 3


def test_html_200_for_a_shard_of_unknown_size_is_a_clear_error_at_once(served, tmp_path):
    root, srv = served
    make_tar(os.path.join(root, "a.tar"))
    srv.script("/a.tar", ["html200"] * 10)
    with pytest.raises(PermanentFetchError, match="HTML page"):
        fetch_to_file(srv.url + "a.tar", str(tmp_path / "p"), config=fast_config())
    assert srv.requests["/a.tar"] == 1


# ---------------------------------------------------------------------------
# names from a remote manifest
# ---------------------------------------------------------------------------
def test_reserved_characters_in_manifest_names_are_percent_encoded(tmp_path):
    root = tmp_path / "srv"
    root.mkdir()
    names = ["shard #1.tar", "50% off?.tar"]
    for i, n in enumerate(names):
        make_tar(str(root / n), samples=3, seed=i)
    rw.build_manifest([str(root / n) for n in names], str(root / "manifest.json"))
    with open(root / "manifest.json") as f:
        assert {os.path.basename(s["url"]) for s in json.load(f)["shards"]} == set(names)
    with FaultServer(str(root)) as srv:
        ds = rw.WebDataset(srv.url + "manifest.json", cache_dir=str(tmp_path / "c"), shuffle=False)
        keys = [s["__key__"] for s in ds]
        ds.close()
        assert srv.requests["/shard #1.tar"] >= 1 and srv.requests["/50% off?.tar"] >= 1
    assert len(keys) == 6
