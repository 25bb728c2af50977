"""Tests for resumewds.cache.ShardStore against a live 127.0.0.1 fault server."""

from __future__ import annotations

import fcntl
import multiprocessing
import os
import pickle
import signal
import subprocess
import sys
import textwrap
import threading
import time

import pytest

from chaos.faultserver import FaultServer
from http_fixtures import (
    Recorder,
    digest,
    fast_config,
    make_blob,
    make_tar,
    shard_for,
)
from resumewds.cache import ShardStore
from resumewds.cache._prefetch import THREAD_NAME
from resumewds.cache._store import default_cache_dir
from resumewds.config import parse_size
from resumewds.errors import CacheError, ChecksumMismatch, PermanentFetchError, TransientFetchError, UnsafeSourceError
from resumewds.fetch import fetch_to_file
from resumewds.manifest._manifest import ShardInfo

KB = 1024
FORK = multiprocessing.get_context("fork")


def store_for(tmp_path, **kw) -> ShardStore:
    kw.setdefault("fetch", fast_config())
    return ShardStore(cache_dir=str(tmp_path / "cache"), **kw)


def read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


def test_remote_miss_then_hit(served, tmp_path):
    root, srv = served
    data = make_tar(os.path.join(root, "a.tar"))
    shard = shard_for(srv.url + "a.tar", data)
    rec = Recorder()
    st = store_for(tmp_path, on_event=rec)
    with st.acquire(shard) as ls:
        assert ls.pinned and ls.cached and read(ls.path) == data
        assert ls.path.startswith(st.shards_dir)
    assert not ls.pinned
    with st.acquire(shard) as ls2:
        assert read(ls2.path) == data
    assert srv.requests["/a.tar"] == 1
    kinds = [k for k, _, _ in rec.events]
    assert kinds == ["cache_miss", "fetch_start", "fetch_done", "verify_ok", "cache_hit"]
    assert st.counters["cache_hit"] == 1 and st.counters["bytes_fetched"] == len(data)
    meta = __import__("json").load(open(ls.path + ".meta"))
    assert meta["url"] == shard.url and meta["xxh3_64"] == digest(data) and meta["size"] == len(data)


def test_unknown_checksum_is_recorded_at_first_download(served, tmp_path):
    root, srv = served
    data = make_tar(os.path.join(root, "a.tar"), payload=2 * KB)  # no checksum: it must be a tar
    shard = ShardInfo(url=srv.url + "a.tar")
    st = store_for(tmp_path)
    path = st.ensure(shard)
    meta = __import__("json").load(open(path + ".meta"))
    assert meta["xxh3_64"] == digest(data)
    # later corruption that changes the mtime is caught against the recorded digest
    with open(path, "r+b") as f:
        f.write(b"\0")
    os.utime(path, ns=(time.time_ns(), time.time_ns() + 10**9))
    assert read(st.ensure(shard)) == data
    assert st.counters["repair"] == 1 and srv.requests["/a.tar"] == 2


def test_same_basename_different_urls_do_not_collide(served, tmp_path):
    root, srv = served
    os.makedirs(os.path.join(root, "x"))
    os.makedirs(os.path.join(root, "y"))
    a = make_blob(os.path.join(root, "x", "s.tar"), 5 * KB, seed=1)
    b = make_blob(os.path.join(root, "y", "s.tar"), 5 * KB, seed=2)
    st = store_for(tmp_path)
    pa = st.ensure(shard_for(srv.url + "x/s.tar", a))
    pb = st.ensure(shard_for(srv.url + "y/s.tar", b))
    assert pa != pb and read(pa) == a and read(pb) == b
    assert os.path.basename(pa).endswith("-s.tar")


def test_transient_faults_through_the_store(served, tmp_path):
    root, srv = served
    data = make_tar(os.path.join(root, "a.tar"), samples=20)
    srv.script("/a.tar", ["reset", "500", "truncate@0.7", "429"])
    rec = Recorder()
    st = store_for(tmp_path, on_event=rec)
    assert read(st.ensure(shard_for(srv.url + "a.tar", data))) == data
    assert len(rec.kinds("retry")) == 4


def test_local_shards_are_used_in_place_and_verified_once(tmp_path):
    src = str(tmp_path / "a.tar")
    data = make_tar(src)
    st = store_for(tmp_path)
    shard = shard_for(src, data)
    for _ in range(3):
        with st.acquire(shard) as ls:
            assert ls.path == src and not ls.pinned
    assert st.counters["verify_ok"] == 1
    with st.acquire(ShardInfo(url="file://" + src, size=len(data), xxh3_64=digest(data))) as ls:
        assert ls.path == src
    # "once" holds across processes through the sidecar under cache_dir
    st2 = pickle.loads(pickle.dumps(store_for(tmp_path)))
    st2.ensure(shard)
    assert st2.counters["verify_ok"] == 0
    # "always" hashes every time
    st3 = store_for(tmp_path, verify="always")
    st3.ensure(shard)
    st3.ensure(shard)
    assert st3.counters["verify_ok"] == 2


def test_corrupt_local_shard_is_not_repairable(tmp_path):
    src = str(tmp_path / "a.tar")
    data = make_tar(src)
    with open(src, "r+b") as f:
        f.seek(700)
        f.write(b"X")
    st = store_for(tmp_path)
    with pytest.raises(ChecksumMismatch) as ei:
        st.acquire(shard_for(src, data))
    assert src in str(ei.value)
    with pytest.raises(ChecksumMismatch, match="size"):
        st.acquire(ShardInfo(url=src, size=len(data) + 1))
    assert store_for(tmp_path, verify="never").ensure(shard_for(src, data)) == src
    with pytest.raises(PermanentFetchError, match="missing.tar"):
        st.acquire(ShardInfo(url=str(tmp_path / "missing.tar")))


def test_local_verify_falls_back_to_memory_when_cache_dir_unusable(tmp_path):
    src = str(tmp_path / "a.tar")
    data = make_tar(src)
    blocker = tmp_path / "file"
    blocker.write_text("not a dir")
    st = ShardStore(cache_dir=str(blocker / "cache"), fetch=fast_config())
    st.ensure(shard_for(src, data))
    st.ensure(shard_for(src, data))
    assert st.counters["verify_ok"] == 1


def _corrupt_keep_mtime(path: str) -> None:
    s = os.stat(path)
    with open(path, "r+b") as f:
        f.seek(s.st_size // 2)
        b = f.read(1)
        f.seek(s.st_size // 2)
        f.write(bytes([b[0] ^ 0xFF]))
    os.utime(path, ns=(s.st_atime_ns, s.st_mtime_ns))


def test_verify_policies_on_cached_entries(served, tmp_path):
    root, srv = served
    data = make_tar(os.path.join(root, "a.tar"))
    shard = shard_for(srv.url + "a.tar", data)
    # never: a same-size corruption with the mtime restored goes unnoticed (by design)
    st = store_for(tmp_path / "n", verify="never")
    p = st.ensure(shard)
    _corrupt_keep_mtime(p)
    assert read(st.ensure(shard)) != data
    # once: a same-size corruption with the mtime restored is noticed (the ctime moved) ...
    st = store_for(tmp_path / "o", verify="once")
    p = st.ensure(shard)
    _corrupt_keep_mtime(p)
    assert read(st.ensure(shard)) == data and st.counters["repair"] == 1
    # ... and so is one that changed the mtime
    _corrupt_keep_mtime(p)
    os.utime(p, ns=(time.time_ns(), time.time_ns() + 10**9))
    assert read(st.ensure(shard)) == data and st.counters["repair"] == 2
    # always: caught every time
    rec = Recorder()
    st = store_for(tmp_path / "a", verify="always", on_event=rec)
    p = st.ensure(shard)
    _corrupt_keep_mtime(p)
    with st.acquire(shard) as ls:
        assert read(ls.path) == data
    kinds = [k for k, _, _ in rec.events]
    assert kinds.count("verify_fail") == 1 and kinds.count("repair") == 1
    assert rec.kinds("verify_fail")[0]["expected"] == digest(data)
    with pytest.raises(ValueError):
        ShardStore(verify="sometimes")


def test_download_that_stays_corrupt_fails_after_max_repairs(served, tmp_path):
    root, srv = served
    data = make_tar(os.path.join(root, "a.tar"))
    srv.set_faults("flip_data=1.0")
    shard = shard_for(srv.url + "a.tar", data)
    st = store_for(tmp_path, max_repairs=2)
    with pytest.raises(ChecksumMismatch) as ei:
        st.acquire(shard)
    assert shard.url in str(ei.value)
    assert srv.requests["/a.tar"] == 3
    assert st.counters["repair"] == 2 and st.counters["verify_fail"] == 3
    assert not os.path.exists(st.entry_path(shard.url))
    srv.set_faults("")
    srv.script("/a.tar", ["flip_header"])  # one bad download, then a good one
    with st.acquire(shard) as ls:
        assert read(ls.path) == data


def test_missing_meta_is_adopted_or_refetched(served, tmp_path):
    root, srv = served
    data = make_tar(os.path.join(root, "a.tar"), payload=3 * KB)
    st = store_for(tmp_path)
    known = shard_for(srv.url + "a.tar", data)
    p = st.ensure(known)
    os.unlink(p + ".meta")  # as if killed between publish and meta
    assert read(st.ensure(known)) == data and srv.requests["/a.tar"] == 1  # proven by checksum
    with open(p + ".meta", "w") as f:
        f.write("{not json")
    assert read(st.ensure(ShardInfo(url=known.url))) == data
    assert srv.requests["/a.tar"] == 2  # nothing to prove it with: fetched again


def test_leftover_partial_is_resumed(served, tmp_path):
    root, srv = served
    size = 512 * KB
    data = make_blob(os.path.join(root, "a.tar"), size)
    shard = shard_for(srv.url + "a.tar", data)
    st = store_for(tmp_path)
    os.makedirs(st.shards_dir)
    partial = st.entry_path(shard.url) + ".partial"
    srv.script("/a.tar", ["truncate@0.5"])
    with pytest.raises(TransientFetchError):
        fetch_to_file(shard.url, partial, expected_size=size, config=fast_config(attempts=1))
    srv.reset_counters()
    assert read(st.ensure(shard)) == data
    assert srv.bytes_sent == size - size // 2
    assert not os.path.exists(partial) and not os.path.exists(partial + ".etag")


def _download_forever(cache_dir: str, url: str, size: int, dig: str) -> None:
    st = ShardStore(cache_dir=cache_dir, fetch=fast_config(read_timeout=5))
    st.ensure(ShardInfo(url=url, size=size, xxh3_64=dig))


def test_sigkill_mid_download_then_next_acquire_is_correct(tmp_path):
    root = tmp_path / "srv"
    root.mkdir()
    size = 1024 * KB
    data = make_blob(str(root / "a.tar"), size)
    with FaultServer(str(root), bytes_per_second=2 * 1024 * KB) as srv:
        shard = shard_for(srv.url + "a.tar", data)
        cache = str(tmp_path / "cache")
        proc = FORK.Process(target=_download_forever, args=(cache, shard.url, size, shard.xxh3_64))
        proc.start()
        st = ShardStore(cache_dir=cache, fetch=fast_config())
        partial = st.entry_path(shard.url) + ".partial"
        deadline = time.monotonic() + 10
        while time.monotonic() < deadline:
            if os.path.exists(partial) and os.path.getsize(partial) > 200 * KB:
                break
            time.sleep(0.01)
        os.kill(proc.pid, signal.SIGKILL)
        proc.join()
        kept = os.path.getsize(partial)
        assert 0 < kept < size and not os.path.exists(st.entry_path(shard.url))
        srv.bytes_per_second = None
        with st.acquire(shard) as ls:
            assert read(ls.path) == data
        assert srv.bytes_sent < size + (size - kept) // 2 + 256 * KB  # resumed, not restarted


def test_lru_eviction_respects_cache_size(served, tmp_path):
    root, srv = served
    blobs = {n: make_blob(os.path.join(root, f"{n}.tar"), 100 * KB, seed=i) for i, n in enumerate("abcd")}
    shards = {n: shard_for(srv.url + f"{n}.tar", d) for n, d in blobs.items()}
    rec = Recorder()
    st = store_for(tmp_path, cache_size=int(250 * KB), on_event=rec)
    st.ensure(shards["a"])
    time.sleep(0.01)
    st.ensure(shards["b"])
    time.sleep(0.01)
    st.ensure(shards["a"])  # a is now more recent than b
    time.sleep(0.01)
    st.ensure(shards["c"])
    assert [e[1] for e in rec.events if e[0] == "evict"] == [shards["b"].url]
    assert rec.kinds("evict")[0]["bytes"] == 100 * KB
    assert st.cached_bytes() <= 250 * KB
    assert os.path.exists(st.entry_path(shards["a"].url))
    assert not os.path.exists(st.entry_path(shards["b"].url))
    assert not os.path.exists(st.entry_path(shards["b"].url) + ".meta")
    assert st.counters["evict"] == 1 and st.counters["bytes_evicted"] == 100 * KB
    assert parse_size("250KiB") == 250 * KB


def test_pinned_entries_are_never_evicted(served, tmp_path):
    root, srv = served
    blobs = {n: make_blob(os.path.join(root, f"{n}.tar"), 100 * KB, seed=i) for i, n in enumerate("abc")}
    shards = {n: shard_for(srv.url + f"{n}.tar", d) for n, d in blobs.items()}
    st = store_for(tmp_path, cache_size=100 * KB)
    la = st.acquire(shards["a"])
    lb = st.acquire(shards["b"])  # over budget, but a is being read
    assert read(la.path) == blobs["a"] and read(lb.path) == blobs["b"]
    assert st.counters["evict"] == 0 and st.cached_bytes() == 200 * KB
    la.close()
    with st.acquire(shards["c"]) as lc:  # a is free now; b is still pinned
        assert read(lc.path) == blobs["c"]
        assert not os.path.exists(la.path) and os.path.exists(lb.path)
    lb.close()
    # a pin from another process counts too
    other = store_for(tmp_path, cache_size=100 * KB)
    with other.acquire(shards["c"]):
        st.ensure(shards["a"])
        assert os.path.exists(st.entry_path(shards["c"].url))


def _acquire_and_report(cache_dir: str, url: str, size: int, dig: str, barrier, q) -> None:
    st = ShardStore(cache_dir=cache_dir, fetch=fast_config(read_timeout=5))
    barrier.wait()
    with st.acquire(ShardInfo(url=url, size=size, xxh3_64=dig)) as ls:
        q.put(digest(read(ls.path)))


def test_two_processes_download_once(tmp_path):
    root = tmp_path / "srv"
    root.mkdir()
    data = make_blob(str(root / "a.tar"), 256 * KB)
    with FaultServer(str(root), bytes_per_second=1024 * KB) as srv:
        url = srv.url + "a.tar"
        barrier = FORK.Barrier(2)
        q = FORK.Queue()
        procs = [FORK.Process(target=_acquire_and_report,
                              args=(str(tmp_path / "cache"), url, len(data), digest(data), barrier, q))
                 for _ in range(2)]
        for p in procs:
            p.start()
        results = [q.get(timeout=30) for _ in procs]
        for p in procs:
            p.join(timeout=30)
            assert p.exitcode == 0
        assert results == [digest(data)] * 2
        assert srv.requests["/a.tar"] == 1


def _hold_lock_until_killed(lock_path: str, ready) -> None:
    fd = os.open(lock_path, os.O_RDWR | os.O_CREAT)
    fcntl.flock(fd, fcntl.LOCK_EX)
    ready.set()
    time.sleep(60)


def test_stale_lock_of_a_killed_process_does_not_block(served, tmp_path):
    root, srv = served
    data = make_blob(os.path.join(root, "a.tar"), 10 * KB)
    shard = shard_for(srv.url + "a.tar", data)
    st = store_for(tmp_path)
    os.makedirs(st.shards_dir)
    ready = FORK.Event()
    proc = FORK.Process(target=_hold_lock_until_killed, args=(st.entry_path(shard.url) + ".lock", ready))
    proc.start()
    assert ready.wait(10)
    os.kill(proc.pid, signal.SIGKILL)
    proc.join()
    t0 = time.monotonic()
    assert read(st.ensure(shard)) == data
    assert time.monotonic() - t0 < 5


def test_symlink_planted_in_cache_is_refused(served, tmp_path):
    root, srv = served
    data = make_blob(os.path.join(root, "a.tar"), 10 * KB)
    shard = shard_for(srv.url + "a.tar", data)
    st = store_for(tmp_path)
    os.makedirs(st.shards_dir)
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    entry = st.entry_path(shard.url)
    os.symlink(victim, entry)
    with pytest.raises(CacheError) as ei:
        st.ensure(shard)
    assert entry in str(ei.value) and "symlink" in str(ei.value)
    os.unlink(entry)
    os.symlink(victim, entry + ".partial")
    with pytest.raises(CacheError, match="symlink"):
        st.ensure(shard)
    assert victim.read_bytes() == b"precious"
    os.unlink(entry + ".partial")
    os.unlink(entry + ".lock")
    os.symlink(victim, entry + ".lock")
    with pytest.raises(CacheError, match="symlink"):
        st.ensure(shard)


_READONLY_SCRIPT = textwrap.dedent("""
    import os, sys
    from resumewds.cache import ShardStore
    from resumewds.errors import CacheError
    from resumewds.manifest import ShardInfo
    if os.geteuid() == 0:  # root ignores permissions: become nobody (after the imports)
        os.setgid(65534); os.setuid(65534)
    st = ShardStore(cache_dir=sys.argv[1])
    try:
        st.ensure(ShardInfo(url="http://127.0.0.1:9/a.tar"))
    except CacheError as exc:
        print("CacheError:", exc)
""")


def test_read_only_cache_dir_is_a_cache_error(tmp_path):
    import tempfile

    cache = tempfile.mkdtemp(prefix="resumewds-ro-", dir="/tmp")
    try:
        os.chmod(cache, 0o555)
        env = dict(os.environ, PYTHONPATH=os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
        out = subprocess.run([sys.executable, "-c", _READONLY_SCRIPT, os.path.join(cache, "c")], env=env,
                             capture_output=True, text=True, timeout=60, cwd="/")
        if "CacheError:" not in out.stdout and os.geteuid() == 0 and "Permission denied" in out.stderr:
            pytest.skip(f"cannot drop privileges to test a read-only dir: {out.stderr[-200:]}")
        assert "CacheError:" in out.stdout, out.stderr
        assert cache in out.stdout and "permission denied" in out.stdout
    finally:
        os.chmod(cache, 0o755)
        os.rmdir(cache)


def test_prefetch_downloads_in_background_and_swallows_errors(served, tmp_path):
    root, srv = served
    blobs = {n: make_blob(os.path.join(root, f"{n}.tar"), 50 * KB, seed=i) for i, n in enumerate("ab")}
    shards = [shard_for(srv.url + f"{n}.tar", d) for n, d in blobs.items()]
    missing = ShardInfo(url=srv.url + "missing.tar")
    st = store_for(tmp_path)
    before = set(threading.enumerate())
    try:
        st.prefetch([missing] + shards, depth=3)
        deadline = time.monotonic() + 10
        # the two shards are published, and the 404 of the third counted (under
        # load its thread may still be waiting for the answer when the others are in)
        while time.monotonic() < deadline and not (all(
                os.path.exists(st.entry_path(s.url) + ".meta") for s in shards)
                and st.counters["prefetch_error"] >= 1):
            time.sleep(0.01)
        for s in shards:
            with st.acquire(s) as ls:
                assert read(ls.path) == blobs[s.url[-5]]
        assert st.counters["cache_hit"] >= 2 and st.counters["prefetch_error"] == 1
        with pytest.raises(PermanentFetchError, match="404"):
            st.acquire(missing)
        clone = pickle.loads(pickle.dumps(st))  # threads and sessions are dropped
        assert read(clone.ensure(shards[0])) == blobs["a"]
    finally:
        st.close()
    assert [t for t in threading.enumerate() if t.name == THREAD_NAME and t not in before] == []  # stopped


def test_pipe_shards_are_cached_and_untrusted_ones_refused(tmp_path):
    src = str(tmp_path / "a.tar")
    data = make_tar(src)
    st = store_for(tmp_path)
    shard = shard_for(f"pipe:cat {src}", data)
    with st.acquire(shard) as ls:
        assert read(ls.path) == data and ls.cached
    with pytest.raises(UnsafeSourceError):
        st.acquire(ShardInfo(url=f"pipe:cat {src}", trusted=False))


def test_verify_all_and_prefetch_all(served, tmp_path):
    root, srv = served
    good_local = str(tmp_path / "good.tar")
    gd = make_tar(good_local, seed=1)
    bad_local = str(tmp_path / "bad.tar")
    bd = make_tar(bad_local, seed=2)
    _corrupt_keep_mtime(bad_local)
    rd = make_tar(os.path.join(root, "r.tar"), seed=3)
    shards = [shard_for(good_local, gd), shard_for(bad_local, bd), shard_for(srv.url + "r.tar", rd),
              ShardInfo(url=srv.url + "missing.tar")]
    st = store_for(tmp_path)
    seen = []
    pre = st.prefetch_all(shards, progress=seen.append)
    assert [ok for _, ok, _ in pre] == [True, True, True, False]
    assert seen == [len(rd)]
    seen.clear()
    res = st.verify_all(shards, progress=seen.append)
    assert [ok for _, ok, _ in res] == [True, False, True, False]
    assert isinstance(res[1][2], ChecksumMismatch) and isinstance(res[3][2], PermanentFetchError)
    assert sum(seen) >= len(gd) + len(bd) + len(rd)
    assert srv.requests["/r.tar"] == 1


def test_parse_size_and_defaults(monkeypatch, tmp_path):
    assert parse_size("20GB") == 20 * 10**9
    assert parse_size("500MiB") == 500 * 2**20
    assert parse_size("1.5G") == int(1.5 * 2**30)
    assert parse_size(" 7 ") == 7 and parse_size(10) == 10
    for bad in ("", "lots", "5XB", "-1", True):
        with pytest.raises(ValueError):
            parse_size(bad)
    monkeypatch.setenv("RESUMEWDS_CACHE_DIR", str(tmp_path / "c"))
    monkeypatch.setenv("RESUMEWDS_CACHE_SIZE", "1MiB")
    st = ShardStore()
    assert st.cache_dir == str(tmp_path / "c") and st.cache_size == 2**20
    monkeypatch.delenv("RESUMEWDS_CACHE_DIR")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert default_cache_dir() == str(tmp_path / "xdg" / "resumewds")


def _download_with_tiny_fsize(cache_dir: str, url: str, q) -> None:
    import resource

    signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 * KB, 64 * KB))
    st = ShardStore(cache_dir=cache_dir, fetch=fast_config())
    try:
        st.ensure(ShardInfo(url=url))
        q.put("no error")
    except CacheError as exc:
        q.put(f"CacheError: {exc}")
    except Exception as exc:  # pragma: no cover - reported to the parent
        q.put(f"{type(exc).__name__}: {exc}")


def test_disk_full_mid_download_is_a_cache_error_and_keeps_the_partial(served, tmp_path):
    root, srv = served
    make_blob(os.path.join(root, "a.tar"), 200 * KB)
    q = FORK.Queue()
    cache = str(tmp_path / "cache")
    proc = FORK.Process(target=_download_with_tiny_fsize, args=(cache, srv.url + "a.tar", q))
    proc.start()
    msg = q.get(timeout=30)
    proc.join(timeout=30)
    assert msg.startswith("CacheError:") and "file too large" in msg
    assert os.path.join(cache, "shards") in msg
    st = store_for(tmp_path)
    partial = st.entry_path(srv.url + "a.tar") + ".partial"
    assert os.path.getsize(partial) == 64 * KB  # kept for a later resume
    assert srv.requests["/a.tar"] == 1  # not retried: a full disk is not the server's fault


def test_store_in_a_forked_child_gets_fresh_runtime(served, tmp_path):
    root, srv = served
    data = make_blob(os.path.join(root, "a.tar"), 20 * KB)
    st = store_for(tmp_path)
    st.ensure(shard_for(srv.url + "a.tar", data))
    parent_session = st.session()
    q = FORK.Queue()

    def child():
        q.put((st.session() is not parent_session, digest(read(st.ensure(shard_for(srv.url + "a.tar", data))))))

    p = FORK.Process(target=child)
    p.start()
    fresh, dig = q.get(timeout=30)
    p.join(timeout=30)
    assert fresh and dig == digest(data)


def test_prefetch_all_in_parallel_keeps_order_and_fetches_each_shard_once(served, tmp_path):
    root, srv = served
    datas = [make_tar(os.path.join(root, f"p{i}.tar"), seed=10 + i) for i in range(6)]
    shards = [shard_for(srv.url + f"p{i}.tar", d) for i, d in enumerate(datas)]
    shards.append(shards[2])  # the same shard twice: still one download
    st = store_for(tmp_path)
    seen = []
    res = st.prefetch_all(shards, progress=seen.append, parallel=3)
    assert [s.url for s, _, _ in res] == [s.url for s in shards]
    assert all(ok for _, ok, _ in res)
    assert sorted(seen) == sorted([len(d) for d in datas] + [len(datas[2])])
    for i, d in enumerate(datas):
        assert srv.requests[f"/p{i}.tar"] == 1
        with open(st.ensure(shards[i]), "rb") as f:
            assert f.read() == d


def _meta(path: str) -> dict:
    return __import__("json").load(open(path + ".meta"))


def _corrupt_keeping_stat(path: str) -> None:
    """Flip bytes without changing size or mtime (what a lost page looks like)."""
    st = os.stat(path)
    with open(path, "r+b") as f:
        f.seek(100)
        f.write(b"\x00" * 64)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


@pytest.mark.parametrize("verify", ["once", "never"])
def test_unsynced_entry_is_rehashed_after_a_reboot(served, tmp_path, monkeypatch, verify):
    """sync="boot": a download is not fsynced, so an entry from an earlier boot
    is hashed again at first use, whatever the policy, and repaired if the
    crash ate bytes; within the boot that wrote it, it is trusted."""
    import resumewds.fetch as F
    from resumewds.fetch import _partial as partial

    root, srv = served
    datas = [make_tar(os.path.join(root, f"{n}.tar"), seed=i) for i, n in enumerate("ab")]
    shards = [shard_for(srv.url + f"{n}.tar", d) for n, d in zip("ab", datas)]
    rec = Recorder()
    st = store_for(tmp_path, verify=verify, sync="boot", on_event=rec)
    paths = [st.ensure(s) for s in shards]
    for p in paths:
        assert _meta(p)["synced"] is False and _meta(p)["boot"] == F.boot_id()
    _corrupt_keeping_stat(paths[0])
    # same boot, same size and mtime: trusted (as the policies document)
    rec.events.clear()
    st.ensure(shards[1])
    assert rec.kinds("verify_ok") == [] and srv.requests["/b.tar"] == 1
    # after a reboot: both are hashed; the damaged one is fetched again
    monkeypatch.setattr(partial, "_BOOT_ID", "another-boot")
    assert read(st.ensure(shards[0])) == datas[0] and srv.requests["/a.tar"] == 2
    assert read(st.ensure(shards[1])) == datas[1] and srv.requests["/b.tar"] == 1
    assert len(rec.kinds("verify_fail")) == 1 and st.counters["repair"] == 1
    # the survivor was read back from disk in the new boot: durable, not hashed again
    assert _meta(paths[1])["synced"] is True
    rec.events.clear()
    st.ensure(shards[1])
    assert rec.kinds("verify_ok") == [] and rec.kinds("verify_fail") == []


def test_unsynced_entry_without_a_checksum_is_refetched_after_a_reboot(served, tmp_path, monkeypatch):
    from resumewds.fetch import _partial as partial

    root, srv = served
    data = make_tar(os.path.join(root, "a.tar"), payload=2 * KB)
    shard = ShardInfo(url=srv.url + "a.tar")
    st = store_for(tmp_path, sync="boot")
    path = st.ensure(shard)
    meta = _meta(path)
    meta["xxh3_64"] = None  # an entry whose digest was never recorded
    open(path + ".meta", "w").write(__import__("json").dumps(meta))
    monkeypatch.setattr(partial, "_BOOT_ID", "another-boot")
    assert read(st.ensure(shard)) == data and srv.requests["/a.tar"] == 2


def test_sync_fsync_syncs_every_download_and_no_download_is_read_back(served, tmp_path, monkeypatch):
    root, srv = served
    datas = [make_tar(os.path.join(root, f"{n}.tar"), seed=i) for i, n in enumerate("ab")]
    shards = [shard_for(srv.url + f"{n}.tar", d) for n, d in zip("ab", datas)]
    synced: list = []
    real_fsync = os.fsync
    monkeypatch.setattr(os, "fsync", lambda fd: (synced.append(os.readlink(f"/proc/self/fd/{fd}")),
                                                 real_fsync(fd))[1])
    hashed: list = []
    real_hash = ShardStore._hash
    monkeypatch.setattr(ShardStore, "_hash", lambda self, p, progress=None: (hashed.append(p),
                                                                            real_hash(self, p, progress))[1])
    st = store_for(tmp_path, sync="fsync")
    for s, d in zip(shards, datas):
        path = st.ensure(s)
        assert read(path) == d and _meta(path)["synced"] is True
    assert [os.path.basename(p) for p in synced] == [os.path.basename(st.entry_path(s.url)) + ".partial"
                                                     for s in shards]
    assert hashed == []  # verified from the bytes as they were written
    synced.clear()
    boot = store_for(tmp_path / "b", sync="boot")
    assert read(boot.ensure(shards[0])) == datas[0] and synced == [] and hashed == []


def test_sync_mode_from_env_and_bad_values(monkeypatch, tmp_path):
    monkeypatch.setenv("RESUMEWDS_CACHE_SYNC", "fsync")
    assert store_for(tmp_path).sync == "fsync"
    monkeypatch.setenv("RESUMEWDS_CACHE_SYNC", "sometimes")
    with pytest.raises(ValueError, match="RESUMEWDS_CACHE_SYNC"):
        store_for(tmp_path)
    monkeypatch.delenv("RESUMEWDS_CACHE_SYNC")
    assert store_for(tmp_path).sync == "boot"  # Linux has a boot id
    assert store_for(tmp_path, sync="fsync").sync == "fsync"


@pytest.mark.parametrize("sync,synced", [("fsync", True), ("boot", False)])
def test_a_data_set_chooses_its_cache_sync_over_the_environment(monkeypatch, tmp_path, sync, synced):
    import resumewds as rw

    root = tmp_path / "srv"
    root.mkdir()
    make_tar(str(root / "a.tar"))
    monkeypatch.setenv("RESUMEWDS_CACHE_SYNC", "boot" if sync == "fsync" else "fsync")
    with FaultServer(str(root)) as srv:
        ds = rw.WebDataset(srv.url + "a.tar", cache_dir=str(tmp_path / "c"), cache_sync=sync)
        assert len(list(ds)) == 8
        assert _meta(ds.store.entry_path(srv.url + "a.tar"))["synced"] is synced
    with pytest.raises(ValueError, match="cache_sync"):
        rw.WebDataset(srv.url + "a.tar", cache_sync="sometimes")


def test_prefetch_runs_in_parallel_and_fetches_an_evicted_shard_again(tmp_path):
    root = tmp_path / "srv"
    root.mkdir()
    blobs = {n: make_blob(str(root / f"{n}.tar"), 64 * KB, seed=i) for i, n in enumerate("abc")}
    # a slow server (0.25 s a shard): both downloads start before either ends
    with FaultServer(str(root), bytes_per_second=256 * KB) as srv:
        shards = [shard_for(srv.url + f"{n}.tar", d) for n, d in blobs.items()]
        rec = Recorder()
        st = store_for(tmp_path, prefetch_threads=2, on_event=rec)
        try:
            t0 = time.monotonic()
            st.prefetch(shards[:2], depth=2)
            while not all(os.path.exists(st.entry_path(s.url) + ".meta") for s in shards[:2]):
                assert time.monotonic() - t0 < 10
                time.sleep(0.005)
            order = [k for k, _, _ in rec.events if k in ("fetch_start", "fetch_done")]
            assert order[:2] == ["fetch_start", "fetch_start"], order
            # evicted, then wanted again: prefetched again
            os.remove(st.entry_path(shards[0].url) + ".meta")
            os.remove(st.entry_path(shards[0].url))
            srv.bytes_per_second = None
            st.prefetch(shards, depth=3)
            while not all(os.path.exists(st.entry_path(s.url) + ".meta") for s in shards):
                assert time.monotonic() - t0 < 10
                time.sleep(0.005)
            assert srv.requests["/a.tar"] == 2 and srv.requests["/b.tar"] == 1 and srv.requests["/c.tar"] == 1
        finally:
            st.close()
    with pytest.raises(ValueError, match="prefetch_threads"):
        store_for(tmp_path, prefetch_threads=0)


def test_entry_removed_by_a_repairer_while_being_hashed_is_looked_at_again(served, tmp_path, monkeypatch):
    """Repairs hold the download lock, not the readers' pins, so an entry can
    vanish between a reader's stat and its hash (after a reboot every process
    hashes the same stale entries at once).  That reader looks again under
    the download lock instead of failing with "No such file"."""
    root, srv = served
    data = make_tar(os.path.join(root, "a.tar"))
    shard = shard_for(srv.url + "a.tar", data)
    st = store_for(tmp_path, verify="always")
    path = st.ensure(shard)
    real_hash = ShardStore._hash
    calls = []

    def racing_hash(self, p, progress=None):
        if not calls:  # the other process removes it for repair just now
            os.remove(p + ".meta")
            os.remove(p)
        calls.append(p)
        return real_hash(self, p, progress)

    monkeypatch.setattr(ShardStore, "_hash", racing_hash)
    with st.acquire(shard) as ls:
        assert read(ls.path) == data
    assert srv.requests["/a.tar"] == 2 and read(path) == data


def test_reader_acquires_again_when_a_verified_entry_vanishes_before_it_is_opened(served, tmp_path, monkeypatch):
    from resumewds.read._shards import ShardReader as _ShardReader

    root, srv = served
    data = make_tar(os.path.join(root, "a.tar"))
    shard = shard_for(srv.url + "a.tar", data)
    st = store_for(tmp_path)
    real_acquire = ShardStore.acquire
    seen = []

    def acquire_then_lose_it(self, s):
        lease = real_acquire(self, s)
        if not seen:  # damaged from outside and removed by a repairer, just now
            os.remove(lease.path + ".meta")
            os.remove(lease.path)
        seen.append(lease.path)
        return lease

    monkeypatch.setattr(ShardStore, "acquire", acquire_then_lose_it)
    reader = _ShardReader(st, 4)
    fd = reader.fd(0, shard)
    assert os.pread(fd, len(data), 0) == data and len(seen) == 2 and srv.requests["/a.tar"] == 2
    reader.close()
    # a copy that can never be opened is a CacheError naming it, not an OSError
    seen.clear()
    monkeypatch.setattr(ShardStore, "acquire", lambda self, s: (seen.append(1), real_acquire(self, s))[1])
    entry, real_open = st.entry_path(shard.url), os.open

    def refuse_entry(path, *a, **k):
        if path == entry:
            raise PermissionError(13, "Permission denied", path)
        return real_open(path, *a, **k)

    monkeypatch.setattr(os, "open", refuse_entry)
    with pytest.raises(CacheError, match="cannot open the verified copy"):
        _ShardReader(st, 4).fd(0, shard)


def test_entry_states_through_one_entrys_life(served, tmp_path):
    """EntryState (resumewds.cache) as the store classifies one real entry:
    absent -> verified (downloaded) -> corrupt (bytes changed on disk) -> repaired
    -> untrusted (meta lost) -> evicted (absent again)."""
    from resumewds.cache._layout import EntryState

    root, srv = served
    data = make_tar(os.path.join(root, "a.tar"), payload=3 * KB)
    st = store_for(tmp_path, cache_size=1 << 20)
    shard = shard_for(srv.url + "a.tar", data)
    base = st.entry_path(shard.url)

    def state() -> EntryState:
        return st._check_entry(shard, base, "always", None)[0]

    assert state() is EntryState.ABSENT
    with st.acquire(shard) as ls:  # pinned while read
        assert ls.pinned and ls.path == base and state() is EntryState.VERIFIED
    with open(base, "r+b") as f:
        f.write(b"X")
    assert state() is EntryState.CORRUPT
    assert read(st.ensure(shard)) == data and state() is EntryState.VERIFIED  # repaired
    os.unlink(base + ".meta")
    assert state() is EntryState.UNTRUSTED
    st.ensure(shard)  # adopted: the manifest's checksum proves it
    st.cache_size = 1
    st._evict()
    assert state() is EntryState.ABSENT and st.counters["evict"] == 1
    assert [str(s) for s in EntryState] == ["missing", "nometa", "corrupt", "ok"]


def test_cache_package_keeps_the_names_of_the_module():
    import resumewds.cache as cache

    for name in ("LocalShard", "SYNC_MODES", "ShardStore", "VERIFY_POLICIES", "default_cache_dir", "parse_size"):
        assert hasattr(cache, name), name
    assert {"verify_all", "prefetch_all", "prefetch", "acquire", "ensure", "cached_bytes", "close"} <= set(
        dir(cache.ShardStore))
