"""A cache entry replaced by another file of the same size and mtime (another
user of a shared cache, ``utime``) is noticed under ``verify="once"``: the
meta records what ``utime`` cannot set back (device, inode, ctime).

Real HTTP server on 127.0.0.1, real files.
"""

from __future__ import annotations

import json
import os

from http_fixtures import digest, make_tar, shard_for
from resumewds.cache import ShardStore
from resumewds.cache import _layout as layout


def _store(tmp_path, **kw) -> ShardStore:
    return ShardStore(cache_dir=str(tmp_path / "cache"), **kw)


def _read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def _other_version(tmp_path, data: bytes) -> bytes:
    """Bytes of the same length as ``data`` that are another tar."""
    other = make_tar(str(tmp_path / "other.tar"), samples=8, seed=99)
    assert len(other) == len(data) and other != data
    return other


def test_meta_records_identity(served, tmp_path):
    root, srv = served
    data = make_tar(os.path.join(root, "a.tar"))
    path = _store(tmp_path).ensure(shard_for(srv.url + "a.tar", data))
    meta = json.load(open(path + ".meta"))
    st = os.lstat(path)
    assert (meta["dev"], meta["ino"], meta["ctime_ns"]) == (st.st_dev, st.st_ino, st.st_ctime_ns)


def test_replaced_entry_same_size_and_mtime_is_not_delivered(served, tmp_path):
    root, srv = served
    data = make_tar(os.path.join(root, "a.tar"))
    shard = shard_for(srv.url + "a.tar", data)
    path = _store(tmp_path).ensure(shard)
    st = os.lstat(path)
    # a co-tenant publishes its version of the shard under the same name
    tmp = path + ".cotenant"
    with open(tmp, "wb") as f:
        f.write(_other_version(tmp_path, data))
    os.utime(tmp, ns=(st.st_atime_ns, st.st_mtime_ns))
    os.replace(tmp, path)
    assert (os.lstat(path).st_size, os.lstat(path).st_mtime_ns) == (st.st_size, st.st_mtime_ns)
    store = _store(tmp_path)  # verify="once", a new process's store
    with store.acquire(shard) as ls:
        assert _read(ls.path) == data
    assert store.counters["verify_fail"] >= 1


def test_rewritten_in_place_with_mtime_set_back_is_not_delivered(served, tmp_path):
    root, srv = served
    data = make_tar(os.path.join(root, "a.tar"))
    shard = shard_for(srv.url + "a.tar", data)
    path = _store(tmp_path).ensure(shard)
    st = os.lstat(path)
    with open(path, "r+b") as f:
        f.write(_other_version(tmp_path, data))
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert os.lstat(path).st_ino == st.st_ino
    store = _store(tmp_path)
    with store.acquire(shard) as ls:
        assert _read(ls.path) == data
    assert store.counters["verify_fail"] >= 1


def test_replaced_entry_without_checksum_is_fetched_again(served, tmp_path):
    root, srv = served
    data = make_tar(os.path.join(root, "a.tar"))
    shard = shard_for(srv.url + "a.tar", data, known=False)
    path = _store(tmp_path).ensure(shard)
    meta = json.load(open(path + ".meta"))
    meta["xxh3_64"] = None  # nothing to check a changed file against
    with open(path + ".meta", "w") as f:
        json.dump(meta, f)
    st = os.lstat(path)
    tmp = path + ".cotenant"
    with open(tmp, "wb") as f:
        f.write(_other_version(tmp_path, data))
    os.utime(tmp, ns=(st.st_atime_ns, st.st_mtime_ns))
    os.replace(tmp, path)
    assert _read(_store(tmp_path).ensure(shard)) == data
    assert srv.requests["/a.tar"] == 2


def test_reads_do_not_make_an_entry_look_changed(served, tmp_path):
    """Every acquire records the use (for the LRU) without moving the shard
    file's ctime, so the entry is not hashed again on every use."""
    root, srv = served
    data = make_tar(os.path.join(root, "a.tar"))
    shard = shard_for(srv.url + "a.tar", data)
    _store(tmp_path).ensure(shard)
    for _ in range(3):
        store = _store(tmp_path)
        with store.acquire(shard) as ls:
            assert _read(ls.path) == data
        assert store.counters["cache_hit"] == 1
        assert store.counters["verify_ok"] == 0 and store.counters["verify_fail"] == 0
    assert srv.requests["/a.tar"] == 1


def test_older_meta_without_identity_is_verified_once(served, tmp_path):
    root, srv = served
    data = make_tar(os.path.join(root, "a.tar"))
    shard = shard_for(srv.url + "a.tar", data)
    path = _store(tmp_path).ensure(shard)
    meta = json.load(open(path + ".meta"))
    for k in ("dev", "ino", "ctime_ns"):
        del meta[k]
    with open(path + ".meta", "w") as f:
        json.dump(meta, f)
    store = _store(tmp_path)
    assert _read(store.ensure(shard)) == data
    assert store.counters["verify_ok"] == 1  # hashed once, and the meta completed
    assert layout.moved(os.lstat(path), layout.read_meta(path)) is False
    assert digest(_read(path)) == shard.xxh3_64


def test_local_shard_replaced_same_size_and_mtime_is_verified_again(tmp_path):
    import pytest

    from resumewds.errors import ChecksumMismatch

    src = str(tmp_path / "a.tar")
    data = make_tar(src)
    shard = shard_for(src, data)
    with _store(tmp_path).acquire(shard):
        pass
    st = os.lstat(src)
    tmp = src + ".new"
    with open(tmp, "wb") as f:
        f.write(_other_version(tmp_path, data))
    os.utime(tmp, ns=(st.st_atime_ns, st.st_mtime_ns))
    os.replace(tmp, src)
    with pytest.raises(ChecksumMismatch):
        _store(tmp_path).acquire(shard)


def test_a_use_is_recorded_for_the_evictor(served, tmp_path):
    from resumewds.cache import _eviction as eviction

    root, srv = served
    data = make_tar(os.path.join(root, "a.tar"))
    shard = shard_for(srv.url + "a.tar", data)
    path = _store(tmp_path).ensure(shard)
    old = 1_000_000_000 * 10**9
    os.utime(path, ns=(old, os.lstat(path).st_mtime_ns))
    os.utime(path + ".meta", ns=(old, os.lstat(path + ".meta").st_mtime_ns))
    ctime = os.lstat(path).st_ctime_ns
    assert [u for b, _, u, _ in eviction.scan(os.path.dirname(path)) if b == path] == [old]
    with _store(tmp_path).acquire(shard):
        pass
    (used,) = [u for b, _, u, _ in eviction.scan(os.path.dirname(path)) if b == path]
    assert used > old and os.lstat(path).st_ctime_ns == ctime
