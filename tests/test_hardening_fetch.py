"""Fetch and cache hardening: every wait bounded, one retry budget
per shard and read, no spliced or poisoned downloads, clear errors.

Real servers on 127.0.0.1 (chaos.faultserver), real pipe: commands, real
processes killed with SIGKILL.
"""

from __future__ import annotations

import fcntl
import json
import logging
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any, Dict, List

import pytest
from click.testing import CliRunner

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
from resumewds.errors import (
    ChecksumMismatch,
    PermanentFetchError,
    ShardFormatError,
    TransientFetchError,
    UnsafeSourceError,
)
from resumewds.fetch import FetchConfig, fetch_bytes, fetch_to_file
from resumewds.manifest._manifest import ShardInfo

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
KB = 1024


def _in_thread(fn, bound: float):
    """Run ``fn`` in a thread; (finished, result or exception) after at most ``bound`` s."""
    box: dict = {}

    def run():
        try:
            box["value"] = fn()
        except BaseException as exc:
            box["error"] = exc

    t = threading.Thread(target=run, daemon=True)
    t.start()
    t.join(bound)
    return (not t.is_alive()), box.get("error", box.get("value"))


def read(path: str) -> bytes:
    with open(path, "rb") as f:
        return f.read()


# ---------------------------------------------------------------------------
# 1. Retry-After and the deadline; the download lock
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("fault", ["retry_after_huge", "retry_after_date"])
def test_retry_after_past_the_deadline_gives_up_at_once(served, tmp_path, fault):
    root, srv = served
    make_blob(os.path.join(root, "a.tar"), 4 * KB)
    srv.script("/a.tar", [fault])
    waits: list = []
    with pytest.raises(TransientFetchError, match="beyond what is left") as ei:
        fetch_to_file(srv.url + "a.tar", str(tmp_path / "p"), config=fast_config(sleep=waits.append))
    assert waits == [] and srv.requests["/a.tar"] == 1
    assert "a.tar" in str(ei.value)


def test_repeated_429_ends_within_the_deadline(served, tmp_path):
    root, srv = served
    make_blob(os.path.join(root, "a.tar"), 4 * KB)
    srv.retry_after = 1.0
    srv.script("/a.tar", ["429"] * 1000)
    waits: List[float] = []

    def sleep(w: float) -> None:
        waits.append(w)
        time.sleep(w)

    cfg = fast_config(sleep=sleep, attempts=1000, deadline=1.5)
    with pytest.raises(TransientFetchError, match="429.*beyond what is left"):
        fetch_to_file(srv.url + "a.tar", str(tmp_path / "p"), config=cfg)
    # one wait of 1 s fitted in the deadline; the next Retry-After did not:
    # no attempt is made after the deadline
    assert srv.requests["/a.tar"] == 2 and len(waits) == 1 and waits[0] >= 1.0


def test_reader_waits_on_another_download_no_longer_than_its_deadline(served, tmp_path):
    root, srv = served
    data = make_tar(os.path.join(root, "a.tar"))
    shard = shard_for(srv.url + "a.tar", data)
    st = ShardStore(cache_dir=str(tmp_path / "cache"), fetch=fast_config(deadline=1.0))
    st._ensure_dirs()
    # another downloader holds the shard's download lock (a separate open file
    # description: flock conflicts as between processes)
    dl = os.open(st.entry_path(shard.url) + ".dl", os.O_RDWR | os.O_CREAT)
    fcntl.flock(dl, fcntl.LOCK_EX)
    try:
        done, res = _in_thread(lambda: st.acquire(shard), bound=15)
        assert done, "the reader waited on the download lock past its deadline"
        assert isinstance(res, TransientFetchError) and "another download" in str(res)
    finally:
        os.close(dl)
    with st.acquire(shard) as ls:  # the lock released: it is fetched
        assert read(ls.path) == data


# ---------------------------------------------------------------------------
# 2. trickling bodies and pipe: commands
# ---------------------------------------------------------------------------
def test_trickling_body_fails_the_attempt_and_is_retried(served, tmp_path):
    root, srv = served
    data = make_blob(os.path.join(root, "a.tar"), 4 * KB)
    srv.trickle_seconds = 0.02
    srv.script("/a.tar", ["trickle"])
    rec = Recorder()
    cfg = fast_config(min_rate=2000, rate_window=0.5, read_timeout=5)
    done, res = _in_thread(lambda: fetch_to_file(srv.url + "a.tar", str(tmp_path / "p"), config=cfg,
                                                 on_event=rec), bound=20)
    assert done and not isinstance(res, BaseException), res
    assert read(str(tmp_path / "p")) == data
    assert "too slow" in rec.kinds("retry")[0]["error"]


def test_the_deadline_holds_inside_one_attempt(served, tmp_path):
    root, srv = served
    make_blob(os.path.join(root, "a.tar"), 4 * KB)
    srv.trickle_seconds = 0.05
    srv.script("/a.tar", ["trickle"])
    cfg = fast_config(min_rate=0, deadline=1.0, read_timeout=5)
    done, res = _in_thread(lambda: fetch_to_file(srv.url + "a.tar", str(tmp_path / "p"), config=cfg), bound=15)
    assert done and isinstance(res, TransientFetchError) and "deadline" in str(res)


def test_trickling_pipe_command_is_killed(tmp_path):
    script = tmp_path / "trickle.py"
    script.write_text("import sys, time\nfor i in range(100000):\n"
                      "    sys.stdout.buffer.write(b'x'); sys.stdout.flush(); time.sleep(0.02)\n")
    cfg = fast_config(min_rate=2000, rate_window=0.5, read_timeout=5, attempts=1)
    done, res = _in_thread(lambda: fetch_to_file(f"pipe:{sys.executable} {script}", str(tmp_path / "p"),
                                                 config=cfg), bound=20)
    assert done and isinstance(res, TransientFetchError) and "too slow" in str(res) and "killed" in str(res)


def test_failing_pipe_with_empty_stderr_says_so(tmp_path):
    with pytest.raises(TransientFetchError) as ei:
        fetch_to_file("pipe:false", str(tmp_path / "p"), config=fast_config(attempts=1))
    assert "exited with status 1 (stderr was empty)" in str(ei.value)


def test_pipe_command_dies_with_a_sigkilled_parent(tmp_path):
    pidfile = tmp_path / "pid"
    code = ("import sys; sys.path.insert(0, %r)\n"
            "from resumewds.fetch import FetchConfig, fetch_to_file\n"
            "fetch_to_file('pipe:echo $$ > %s; exec sleep 1000', %r,"
            " config=FetchConfig(read_timeout=600, min_rate=0))\n") % (REPO, str(pidfile), str(tmp_path / "p"))
    parent = subprocess.Popen([sys.executable, "-c", code])
    try:
        for _ in range(200):
            if pidfile.exists() and pidfile.read_text().strip():
                break
            time.sleep(0.05)
        child = int(pidfile.read_text())  # its death signal was set before the shell ran
        os.kill(parent.pid, signal.SIGKILL)
        parent.wait()

        def alive(pid: int) -> bool:
            try:
                with open(f"/proc/{pid}/status") as f:
                    return "\nState:\tZ" not in f.read()
            except FileNotFoundError:
                return False

        for _ in range(100):
            if not alive(child):
                break
            time.sleep(0.05)
        still = alive(child)
        if still:
            os.kill(child, signal.SIGKILL)
        assert not still, "the pipe: command outlived its SIGKILLed parent"
    finally:
        if parent.poll() is None:
            parent.kill()


# ---------------------------------------------------------------------------
# 4, 16. one budget per shard and read; corrupt downloads spend it
# ---------------------------------------------------------------------------
def test_prefetch_and_reader_share_one_budget(served, tmp_path):
    root, srv = served
    data = make_tar(os.path.join(root, "a.tar"))
    shard = shard_for(srv.url + "a.tar", data)
    srv.script("/a.tar", ["500"] * 100)
    st = ShardStore(cache_dir=str(tmp_path / "cache"), fetch=fast_config(attempts=3))
    st.prefetch([shard], depth=1)
    for _ in range(400):
        if st.counters["prefetch_error"]:
            break
        time.sleep(0.01)
    assert st.counters["prefetch_error"] == 1
    with pytest.raises(TransientFetchError, match="500"):
        st.acquire(shard)
    assert srv.requests["/a.tar"] == 3  # not 3 by the prefetch + 3 by the reader
    # the next read has a budget of its own
    srv.script("/a.tar", [])
    srv._scripts.clear()
    with st.acquire(shard) as ls:
        assert read(ls.path) == data
    st.close()


def test_a_corrupt_download_is_a_failed_attempt_of_the_budget(served, tmp_path):
    root, srv = served
    data = make_tar(os.path.join(root, "a.tar"))
    srv.set_faults("flip_data=1.0")
    st = ShardStore(cache_dir=str(tmp_path / "cache"), fetch=fast_config(attempts=5))
    with pytest.raises(ChecksumMismatch):
        st.acquire(shard_for(srv.url + "a.tar", data))
    assert srv.requests["/a.tar"] == 5  # the fetch budget, not max_repairs, decides
    srv.set_faults("")
    srv.script("/a.tar", ["flip_data", "flip_data", "flip_data", "flip_data"])  # 4 bad, then good
    with st.acquire(shard_for(srv.url + "a.tar", data)) as ls:
        assert read(ls.path) == data


# ---------------------------------------------------------------------------
# 5. a 206 of another version is not appended
# ---------------------------------------------------------------------------
def test_206_of_a_changed_file_is_not_spliced(tmp_path):
    root = tmp_path / "srv"
    root.mkdir()
    path = str(root / "a.tar")
    make_tar(path, seed=1, payload=4 * KB)
    with FaultServer(str(root), honour_if_range=False) as srv:
        srv.script("/a.tar", ["truncate@0.5"])
        with pytest.raises(TransientFetchError):
            fetch_to_file(srv.url + "a.tar", str(tmp_path / "p"), config=fast_config(attempts=1))
        assert 0 < os.path.getsize(tmp_path / "p") < os.path.getsize(path)
        new = make_tar(path, seed=2, payload=4 * KB)  # same size, other bytes, new ETag
        st = os.stat(path)
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
        rec = Recorder()
        fetch_to_file(srv.url + "a.tar", str(tmp_path / "p"), config=fast_config(), on_event=rec)
    assert read(str(tmp_path / "p")) == new
    assert "changed on the server" in rec.kinds("retry")[0]["error"]


def _new_version(path: str, seed: int) -> bytes:
    """Replace the tar at ``path`` by another of the same size (a new ETag)."""
    data = make_tar(path, seed=seed, payload=4 * KB)
    st = os.stat(path)
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns + 10**9))
    return data


def _one_tar(tmp_path):
    """A server root holding one tar, ``a.tar``: ``(root, its path, its bytes)``."""
    root = tmp_path / "srv"
    root.mkdir()
    path = str(root / "a.tar")
    return root, path, make_tar(path, seed=1, payload=4 * KB)


def test_a_change_one_reader_saw_is_named_to_the_next_reader_of_the_cache(tmp_path):
    """Two stores on one cache (two DataLoader workers): the first sees the object
    replaced between its two requests; the second, which only ever gets the new
    bytes, still says the object changed (at once, not after its whole budget)."""
    root, path, old = _one_tar(tmp_path)
    cache = str(tmp_path / "cache")
    with FaultServer(str(root)) as srv:
        shard = shard_for(srv.url + "a.tar", old)  # size and xxh3_64, no sample digests: whole GETs
        srv.script("/a.tar", ["truncate@0.5"])
        srv.at_request("/a.tar", 1, lambda: _new_version(path, seed=2))
        for _ in range(2):
            with pytest.raises(ChecksumMismatch, match="changed on the server"):
                ShardStore(cache_dir=cache, fetch=fast_config()).acquire(shard)
        assert srv.requests["/a.tar"] == 3


def test_a_partial_of_a_replaced_object_makes_the_next_reader_name_the_change(tmp_path):
    """A reader gives up half way (its partial and validator stay); the object is
    replaced; another reader resumes, the server refuses the old version: the
    error says the object changed, not merely that the checksum differs."""
    root, path, old = _one_tar(tmp_path)
    cache = str(tmp_path / "cache")
    with FaultServer(str(root)) as srv:
        shard = shard_for(srv.url + "a.tar", old)
        srv.script("/a.tar", ["truncate@0.5"])
        with pytest.raises(TransientFetchError):
            ShardStore(cache_dir=cache, fetch=fast_config(attempts=1)).acquire(shard)
        _new_version(path, seed=2)
        with pytest.raises(ChecksumMismatch, match="changed on the server"):
            ShardStore(cache_dir=cache, fetch=fast_config()).acquire(shard)


# ---------------------------------------------------------------------------
# 6, 18. encodings, HTML pages, incomplete tars, redirect loops
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("fault,words", [("html200", "HTML page")])  # gzip: retried (test_fetch_faults.py)
def test_encoded_or_html_body_is_a_clear_permanent_error(served, tmp_path, fault, words):
    root, srv = served
    make_tar(os.path.join(root, "a.tar"))
    srv.script("/a.tar", [fault] * 10)
    t0 = time.monotonic()
    with pytest.raises(PermanentFetchError, match=words):
        fetch_to_file(srv.url + "a.tar", str(tmp_path / "p"), config=fast_config(sleep=time.sleep))
    assert srv.requests["/a.tar"] == 1 and time.monotonic() - t0 < 5


def test_one_bad_response_does_not_poison_the_cache(served, tmp_path):
    root, srv = served
    data = make_tar(os.path.join(root, "a.tar"))
    shard = ShardInfo(url=srv.url + "a.tar")  # no checksum known
    st = ShardStore(cache_dir=str(tmp_path / "cache"), fetch=fast_config())
    srv.script("/a.tar", ["html200"])
    with pytest.raises(PermanentFetchError):
        st.ensure(shard)
    assert not os.path.exists(st.entry_path(shard.url))
    assert read(st.ensure(shard)) == data  # the healthy server is asked again


def test_unchecksummed_download_must_be_a_complete_tar(served, tmp_path):
    root, srv = served
    full = make_tar(os.path.join(root, "a.tar"))
    # served whole (no short body), but cut inside a member: not a complete tar
    with open(os.path.join(root, "a.tar"), "wb") as f:
        f.write(full[: len(full) // 2 + 100])
    st = ShardStore(cache_dir=str(tmp_path / "cache"), fetch=fast_config(attempts=2))
    with pytest.raises(ShardFormatError, match="download of"):
        st.ensure(ShardInfo(url=srv.url + "a.tar"))
    assert srv.requests["/a.tar"] == 2 and not os.path.exists(st.entry_path(srv.url + "a.tar"))
    with open(os.path.join(root, "a.tar"), "wb") as f:
        f.write(full)
    assert read(st.ensure(ShardInfo(url=srv.url + "a.tar"))) == full


def test_redirect_loop_is_permanent_after_a_few_redirects(served, tmp_path):
    root, srv = served
    make_blob(os.path.join(root, "a.tar"), KB)
    srv.script("/a.tar", ["redirect_loop"] * 1000)
    with pytest.raises(PermanentFetchError, match="redirect"):
        fetch_to_file(srv.url + "a.tar", str(tmp_path / "p"), config=fast_config(max_redirects=5))
    assert srv.requests["/a.tar"] == 6


# ---------------------------------------------------------------------------
# 14. the CLI and manifests honour RESUMEWDS_FETCH_*
# ---------------------------------------------------------------------------
def _manifest_server(tmp_path, shards_entries):
    root = tmp_path / "srv"
    root.mkdir()
    (root / "manifest.json").write_text(json.dumps({"format": "resumewds.manifest", "version": 1,
                                                     "shards": shards_entries}))
    return root


def test_cat_uses_the_environment_fetch_settings(tmp_path, monkeypatch):
    root = tmp_path / "srv"
    root.mkdir()
    make_tar(str(root / "a.tar"))
    monkeypatch.setenv("RESUMEWDS_FETCH_ATTEMPTS", "2")
    monkeypatch.setenv("RESUMEWDS_FETCH_BACKOFF_INITIAL", "0.01")
    monkeypatch.setenv("RESUMEWDS_FETCH_BACKOFF_MAX", "0.02")
    with FaultServer(str(root)) as srv:
        srv.script("/a.tar", ["500"] * 100)
        res = CliRunner().invoke(__import__("resumewds.cli._main", fromlist=["cli"]).cli,
                                 ["cat", srv.url + "a.tar", "--cache-dir", str(tmp_path / "c")])
        n = srv.requests["/a.tar"]
    assert res.exit_code == 1 and "Error:" in res.output and "500" in res.output
    assert n == 2


def test_cat_refuses_attempts_zero(tmp_path):
    from resumewds.cli._main import cli

    res = CliRunner().invoke(cli, ["cat", str(tmp_path / "a.tar"), "--attempts", "0"])
    assert res.exit_code == 2 and "--attempts" in res.output and "Traceback" not in res.output


def test_manifest_retries_are_logged_and_use_the_environment(tmp_path, monkeypatch, caplog):
    from resumewds.sources._resolve import resolve_sources

    root = _manifest_server(tmp_path, [{"url": "a.tar"}])
    monkeypatch.setenv("RESUMEWDS_VERBOSE", "1")
    monkeypatch.setenv("RESUMEWDS_FETCH_BACKOFF_INITIAL", "0.01")
    monkeypatch.setenv("RESUMEWDS_FETCH_ATTEMPTS", "3")
    with FaultServer(str(root)) as srv, caplog.at_level(logging.INFO, logger="resumewds"):
        srv.script("/manifest.json", ["500", "500", "500", "500"])
        with pytest.raises(TransientFetchError):
            resolve_sources(srv.url + "manifest.json")
        assert srv.requests["/manifest.json"] == 3
        srv.script("/manifest.json", [])
        srv._scripts.clear()
        srv.script("/manifest.json", ["503"])
        m = resolve_sources(srv.url + "manifest.json")
    assert m.shards[0].url.endswith("/a.tar")
    assert any(r.getMessage().startswith("retry " + srv.url + "manifest.json") for r in caplog.records)


# ---------------------------------------------------------------------------
# 19. remote manifests: no local files, bounded size
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("local", ["/etc/passwd", "file:///etc/hostname"])
def test_remote_manifest_cannot_name_local_files(tmp_path, monkeypatch, local):
    from resumewds.sources._resolve import resolve_sources

    monkeypatch.delenv("RESUMEWDS_ALLOW_REMOTE_LOCAL", raising=False)
    root = _manifest_server(tmp_path, [{"url": "a.tar"}, {"url": local}])
    with FaultServer(str(root)) as srv:
        with pytest.raises(UnsafeSourceError, match="local file"):
            resolve_sources(srv.url + "manifest.json")
        monkeypatch.setenv("RESUMEWDS_ALLOW_REMOTE_LOCAL", "1")
        assert len(resolve_sources(srv.url + "manifest.json").shards) == 2
        monkeypatch.delenv("RESUMEWDS_ALLOW_REMOTE_LOCAL")
        assert len(resolve_sources(srv.url + "manifest.json", allow_remote_local=True).shards) == 2


def test_allow_remote_local_is_an_argument_of_the_data_set_and_the_cli(tmp_path, monkeypatch):
    """``allow_remote_local=`` beside ``allow_remote_pipe=``: on the data set (the argument wins over
    ``RESUMEWDS_ALLOW_REMOTE_LOCAL``) and as ``--allow-remote-local`` of cat, verify and prefetch."""
    import resumewds as rw
    from resumewds.cli._main import cli

    monkeypatch.delenv("RESUMEWDS_ALLOW_REMOTE_LOCAL", raising=False)
    local = tmp_path / "local"
    local.mkdir()
    for name in ("a.tar", "b.tar"):
        make_tar(str(local / name))
    root = _manifest_server(tmp_path, [{"url": str(local / "a.tar")}, {"url": str(local / "b.tar")}])
    with FaultServer(str(root)) as srv:
        url = srv.url + "manifest.json"
        with pytest.raises(UnsafeSourceError, match="allow_remote_local=True"):
            list(rw.WebDataset(url))
        assert len(list(rw.WebDataset(url, allow_remote_local=True))) == 16
        monkeypatch.setenv("RESUMEWDS_ALLOW_REMOTE_LOCAL", "1")
        with pytest.raises(UnsafeSourceError):
            list(rw.WebDataset(url, allow_remote_local=False))
        monkeypatch.delenv("RESUMEWDS_ALLOW_REMOTE_LOCAL")
        refused = CliRunner().invoke(cli, ["cat", url])
        assert refused.exit_code != 0 and "--allow-remote-local" in refused.output
        res = CliRunner().invoke(cli, ["cat", url, "--allow-remote-local"])
        assert res.exit_code == 0, res.output
        assert len(res.stdout.splitlines()) == 16
        for verb in ("verify", "prefetch"):
            assert CliRunner().invoke(cli, [verb, url]).exit_code != 0
            res = CliRunner().invoke(cli, [verb, url, "--allow-remote-local", "--cache-dir", str(tmp_path / "c")])
            assert res.exit_code == 0, (verb, res.output)


def test_remote_manifest_size_is_capped(tmp_path, monkeypatch):
    from resumewds.sources._resolve import resolve_sources

    root = _manifest_server(tmp_path, [{"url": f"s{i}.tar"} for i in range(200)])
    monkeypatch.setenv("RESUMEWDS_MANIFEST_MAX_BYTES", "1KiB")
    with FaultServer(str(root)) as srv:
        with pytest.raises(PermanentFetchError, match="larger than the 1024 bytes"):
            resolve_sources(srv.url + "manifest.json")
        assert srv.requests["/manifest.json"] == 1
        with pytest.raises(PermanentFetchError, match="larger than"):  # also without a Content-Length
            fetch_bytes(srv.url + "manifest.json", fast_config(), max_bytes=100)
        # an argument of the data set (and of resolve_sources) before the environment
        assert len(resolve_sources(srv.url + "manifest.json", manifest_max_bytes="1MiB").shards) == 200
        monkeypatch.delenv("RESUMEWDS_MANIFEST_MAX_BYTES")
        import resumewds as rw

        with pytest.raises(PermanentFetchError, match="larger than the 2000 bytes"):
            _ = rw.WebDataset(srv.url + "manifest.json", manifest_max_bytes=2000).manifest


# ---------------------------------------------------------------------------
# 15. cache_size is a limit
# ---------------------------------------------------------------------------
def _tars(root: str, n: int):
    return [make_tar(os.path.join(root, f"s{i}.tar"), seed=i, payload=4 * KB) for i in range(n)]


def test_cache_never_keeps_more_than_cache_size_once_released(served, tmp_path):
    root, srv = served
    datas = _tars(root, 5)
    size = len(datas[0])
    budget = int(size * 2.5)
    st = ShardStore(cache_dir=str(tmp_path / "cache"), cache_size=budget, fetch=fast_config())
    leases = [st.acquire(shard_for(srv.url + f"s{i}.tar", d)) for i, d in enumerate(datas[:4])]
    assert st.cached_bytes() == 4 * size  # in use: may exceed the budget
    for ls in leases:
        ls.close()
    assert st.cached_bytes() <= budget
    for i, d in enumerate(datas):
        with st.acquire(shard_for(srv.url + f"s{i}.tar", d)) as ls:
            assert read(ls.path) == d
        assert st.cached_bytes() <= budget


def test_prefetch_stays_within_the_budget(served, tmp_path):
    root, srv = served
    datas = _tars(root, 6)
    size = len(datas[0])
    st = ShardStore(cache_dir=str(tmp_path / "cache"), cache_size=2 * size, fetch=fast_config())
    shards = [shard_for(srv.url + f"s{i}.tar", d) for i, d in enumerate(datas)]
    st.prefetch(shards, depth=6)
    deadline = time.monotonic() + 60  # every shard of the wish list decided: 2 fetched, 4 over budget
    while st.counters["prefetch_over_budget"] < 4 or st.counters["fetch_done"] < 2:
        assert time.monotonic() < deadline, dict(st.counters)
        time.sleep(0.01)
    assert st.cached_bytes() <= 2 * size
    assert sum(srv.requests.values()) == 2  # only what fits was fetched
    assert st.counters["prefetch_over_budget"] == 4
    st.close()


def test_prefetch_budget_holds_when_a_download_is_published_during_the_scan(served, tmp_path, monkeypatch):
    """A prefetch thread's download renamed from ``.partial`` to its entry between
    the cache scan's listdir and its lstat is in neither name: the budget counts a
    reserved shard by its reservation, never by what the scan happened to see
    (subtracting its on-disk size let a third shard "fit" in a two-shard cache)."""
    from resumewds.cache import _eviction as eviction

    root, srv = served
    datas = _tars(root, 3)
    size = len(datas[0])
    st = ShardStore(cache_dir=str(tmp_path / "cache"), cache_size=2 * size, fetch=fast_config())
    a, b, c = (shard_for(srv.url + f"s{i}.tar", d) for i, d in enumerate(datas))
    for sh in (a, b):
        with st.acquire(sh):
            pass
    pf = st._prefetch
    pf.keep = {st.entry_path(a.url), st.entry_path(b.url)}  # both fetched for later: never evicted
    b_base = st.entry_path(b.url)
    with pf._fit:  # b's prefetch thread: published, not unreserved yet
        pf._reserved[b_base] = size
    real_listdir = os.listdir

    def listed_before_the_rename(path):  # the listing still shows b as a partial download
        return [n + ".partial" if os.path.join(path, n) == b_base else n for n in real_listdir(path)]

    monkeypatch.setattr(eviction.os, "listdir", listed_before_the_rename)
    assert eviction.cached_bytes(st.shards_dir) == 2 * size  # the scan finds b under its new name
    assert not pf.fits(c)  # a + b fill the cache: c does not fit
    pf.unreserve(b)
    assert not pf.fits(c)
    monkeypatch.undo()
    assert not pf.fits(c) and eviction.cached_bytes(st.shards_dir) == 2 * size
    st.close()


def test_a_window_that_cannot_fit_is_said_once_with_numbers(served, tmp_path, caplog):
    root, srv = served
    datas = _tars(root, 4)
    size = len(datas[0])
    st = ShardStore(cache_dir=str(tmp_path / "cache"), cache_size=2 * size, fetch=fast_config())
    shards = [shard_for(srv.url + f"s{i}.tar", d) for i, d in enumerate(datas)]
    with caplog.at_level(logging.WARNING, logger="resumewds"):
        st.prefetch(shards, depth=0, window=4)
        st.prefetch(shards, depth=0, window=4)
    warns = [r.getMessage() for r in caplog.records if "shuffle window" in r.getMessage()]
    assert len(warns) == 1
    assert f"({2 * size} bytes)" in warns[0] and "4 shards" in warns[0] and f"({4 * size} bytes)" in warns[0]
    st.close()


def test_fetch_config_validates_every_field():
    bads: List[Dict[str, Any]] = [dict(attempts=0), dict(deadline=0), dict(read_timeout=-1), dict(min_rate=-1),
                                  dict(max_redirects=-1), dict(rate_window=0)]
    for bad in bads:
        with pytest.raises(ValueError):
            FetchConfig(**bad)


def test_a_dataset_read_ends_within_cache_size(tmp_path, caplog):
    """End to end through WebDataset: in order, then with a window too big for the budget."""
    import resumewds as rw
    from resumewds.synth import write_shards

    root = tmp_path / "srv"
    paths = write_shards(str(root), shards=8, samples=20, size_range=(2000, 4000), seed=3)
    sizes = [os.path.getsize(p) for p in paths]
    budget = int(max(sizes) * 3.5)
    names = ",".join(os.path.basename(p) for p in paths)
    with FaultServer(str(root)) as srv:
        ds = rw.WebDataset(srv.url + "{" + names + "}", cache_dir=str(tmp_path / "c"), cache_size=budget,
                           fetch=fast_config())
        n = sum(1 for _ in ds)
        store = ds.store
        assert n == 160 and store.cached_bytes() <= budget
        ds.close()
        assert store.cached_bytes() <= budget
        with caplog.at_level(logging.WARNING, logger="resumewds"):
            ds = rw.WebDataset(srv.url + "{" + names + "}", cache_dir=str(tmp_path / "c2"), cache_size=budget,
                               fetch=fast_config(), shuffle=True, shuffle_window=8, seed=1)
            assert sum(1 for _ in ds) == 160
            store = ds.store
            ds.close()
        assert store.cached_bytes() <= budget
    warns = [r.getMessage() for r in caplog.records if "cannot hold one shuffle window" in r.getMessage()]
    assert len(warns) == 1 and "8 shards" in warns[0]


def test_verify_replaces_a_poisoned_cached_copy_without_checksum(served, tmp_path):
    """An entry stored by an older version (an error page kept as the shard) is
    found by ``verify`` and fetched again from the healthy server."""
    root, srv = served
    data = make_tar(os.path.join(root, "a.tar"))
    shard = ShardInfo(url=srv.url + "a.tar")
    rec = Recorder()
    st = ShardStore(cache_dir=str(tmp_path / "cache"), fetch=fast_config(), on_event=rec)
    st._ensure_dirs()
    base = st.entry_path(shard.url)
    page = b"<html><body>502 Bad Gateway</body></html>\n"
    with open(base, "wb") as f:
        f.write(page)
    st._write_meta(base, shard.url, digest(page), synced=True)
    assert read(st.ensure(shard)) == page  # what the old cache served
    [(_, ok, err)] = st.verify_all([shard])
    assert ok and err is None and read(base) == data
    assert "cached copy of" in rec.kinds("verify_fail")[0]["actual"]


def test_cat_with_workers_warns_once_and_ends_within_cache_size(tmp_path):
    from resumewds.synth import write_shards

    root = tmp_path / "srv"
    paths = write_shards(str(root), shards=6, samples=10, size_range=(2000, 4000), seed=5)
    budget = int(max(os.path.getsize(p) for p in paths) * 2.5)
    env = dict(os.environ, PYTHONPATH=REPO, NO_PROXY="127.0.0.1", RESUMEWDS_FETCH_BACKOFF_INITIAL="0.01")
    for k in ("HTTP_PROXY", "http_proxy", "RESUMEWDS_CACHE_SIZE", "RESUMEWDS_VERBOSE"):
        env.pop(k, None)
    with FaultServer(str(root)) as srv:
        src = srv.url + "shard-{000000..000005}.tar"
        p = subprocess.run([sys.executable, "-m", "resumewds", "cat", src, "--cache-dir", str(tmp_path / "c"),
                            "--cache-size", str(budget), "--shuffle", "--shuffle-window", "6", "--workers", "2"],
                           env=env, capture_output=True, text=True, timeout=120)
    assert p.returncode == 0, p.stderr
    assert len(p.stdout.splitlines()) == 60
    assert p.stderr.count("cannot hold one shuffle window") == 1, p.stderr
    st = ShardStore(cache_dir=str(tmp_path / "c"), cache_size=budget)
    assert st.cached_bytes() <= budget


def test_identity_is_asked_for_whatever_the_session(tmp_path):
    import http.server

    seen: list = []
    body = make_tar(str(tmp_path / "a.tar"))

    class H(http.server.BaseHTTPRequestHandler):
        def log_message(self, *a):
            pass

        def do_GET(self):
            seen.append(self.headers.get("Accept-Encoding"))
            self.send_response(200)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), H)
    threading.Thread(target=httpd.serve_forever, daemon=True).start()
    try:
        from resumewds.fetch import new_session

        with new_session() as plain:  # a caller's session, its headers changed
            plain.headers["Accept-Encoding"] = "gzip, deflate"
            fetch_to_file(f"http://127.0.0.1:{httpd.server_address[1]}/a.tar", str(tmp_path / "p"),
                          config=fast_config(), session=plain)
    finally:
        httpd.shutdown()
        httpd.server_close()
    assert seen == ["identity"] and read(str(tmp_path / "p")) == body


def test_a_steady_body_is_let_finish_past_the_deadline(served, tmp_path):
    root, srv = served
    data = make_blob(os.path.join(root, "a.tar"), 48 * KB)
    srv.bytes_per_second = 24 * KB  # about 2 s: longer than the deadline, faster than the minimum rate
    cfg = fast_config(deadline=0.5, min_rate=2000, rate_window=0.3, read_timeout=5)
    res = fetch_to_file(srv.url + "a.tar", str(tmp_path / "p"), config=cfg)
    assert res.attempts == 1 and read(str(tmp_path / "p")) == data


def test_reader_waits_past_its_deadline_only_while_the_other_download_progresses(served, tmp_path):
    root, srv = served
    data = make_tar(os.path.join(root, "a.tar"), payload=6 * KB)
    shard = shard_for(srv.url + "a.tar", data)
    srv.bytes_per_second = len(data) / 2.0  # the prefetch takes about 2 s
    st = ShardStore(cache_dir=str(tmp_path / "cache"),
                    fetch=fast_config(deadline=0.5, min_rate=2000, rate_window=0.3, read_timeout=5))
    st.prefetch([shard], depth=1)
    for _ in range(200):  # until the prefetch holds the download lock
        if os.path.exists(st.entry_path(shard.url) + ".partial"):
            break
        time.sleep(0.01)
    with st.acquire(shard) as ls:
        assert read(ls.path) == data
    assert srv.requests["/a.tar"] == 1  # the reader waited for the prefetch, it did not fetch again
    st.close()


def test_a_retry_after_past_the_deadline_spends_the_shared_budget(served, tmp_path):
    root, srv = served
    data = make_tar(os.path.join(root, "a.tar"))
    shard = shard_for(srv.url + "a.tar", data)
    srv.script("/a.tar", ["retry_after_huge"])  # then healthy: but the server said "not before a day"
    st = ShardStore(cache_dir=str(tmp_path / "cache"), fetch=fast_config())
    st.prefetch([shard], depth=1)
    for _ in range(400):
        if st.counters["prefetch_error"]:
            break
        time.sleep(0.01)
    with pytest.raises(TransientFetchError, match="beyond what is left"):
        st.acquire(shard)
    assert srv.requests["/a.tar"] == 1
    st.close()


def test_fetch_bytes_pipe_has_the_stall_timeout_too(tmp_path):
    """fetch_bytes goes through the same attempt code as fetch_to_file."""
    cfg = fast_config(read_timeout=0.5, attempts=1)
    done, res = _in_thread(lambda: fetch_bytes("pipe:sleep 30", cfg), bound=15)
    assert done and isinstance(res, TransientFetchError) and "stalled" in str(res)
    assert fetch_bytes("pipe:printf abc", cfg) == b"abc"
