"""Untrusted data must not run code, reach the shell, or write through planted symlinks.

Everything talks to 127.0.0.1 only.
"""

from __future__ import annotations

import glob
import io
import json
import os
import pickle
import stat
import subprocess

import pytest

import resumewds as rw
from chaos.faultserver import FaultServer
from resumewds.cache import ShardStore
from resumewds.errors import CacheError, DecodeError, UnsafeSourceError
from resumewds.manifest._manifest import ShardInfo
from resumewds.sources._resolve import resolve_sources
from tests.conftest import PY, subprocess_env, tar_bytes

pytestmark = pytest.mark.usefixtures("cache_dir")


class _Boom:
    """Unpickling this creates ``path``: proof that code ran."""

    def __init__(self, path: str):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def _shard(path: str, ext: str, payload: bytes) -> str:
    with open(path, "wb") as f:
        f.write(tar_bytes([(f"a.{ext}", payload), ("a.txt", b"x")]))
    return path


@pytest.mark.parametrize("ext", ["pyd", "pkl", "pickle"])
def test_pickle_members_are_not_unpickled_by_default(tmp_path, ext):
    marker = tmp_path / "pwned"
    shard = _shard(str(tmp_path / "evil.tar"), ext, pickle.dumps(_Boom(str(marker))))
    ds = rw.WebDataset(shard).decode()
    with pytest.raises(UnsafeSourceError, match="allow_pickle"):
        list(ds)
    assert not marker.exists()


def test_pickle_decoding_when_allowed(tmp_path):
    shard = _shard(str(tmp_path / "ok.tar"), "pkl", pickle.dumps({"a": [1, 2]}))
    (sample,) = list(rw.WebDataset(shard).decode(allow_pickle=True))
    assert sample["pkl"] == {"a": [1, 2]}


def test_torch_members_load_weights_only(tmp_path):
    marker = tmp_path / "pwned"
    buf = io.BytesIO()
    import torch

    torch.save({"x": _Boom(str(marker))}, buf)
    shard = _shard(str(tmp_path / "evil.tar"), "pth", buf.getvalue())
    with pytest.raises(DecodeError):
        list(rw.WebDataset(shard).decode())
    assert not marker.exists()


@pytest.fixture
def pipe_manifest(tmp_path, shards):
    """A manifest.json whose shards are ``pipe:cat ...`` commands, served over HTTP."""
    root = tmp_path / "srv"
    root.mkdir()
    m = rw.build_manifest(shards)
    data = m.to_json()
    for d, path in zip(data["shards"], shards):
        d["url"] = f"pipe:cat {path}"
    (root / "manifest.json").write_text(json.dumps(data))
    with FaultServer(str(root)) as srv:
        yield srv.url + "manifest.json", shards


def test_remote_manifest_cannot_run_pipe_commands(pipe_manifest):
    url, _ = pipe_manifest
    with pytest.raises(UnsafeSourceError, match="allow_remote_pipe"):
        resolve_sources(url)
    with pytest.raises(UnsafeSourceError):
        rw.WebDataset(url).config()


def test_remote_pipe_allowed_explicitly(pipe_manifest):
    url, shards = pipe_manifest
    ds = rw.WebDataset(url, allow_remote_pipe=True)
    got = [s["__key__"] for s in ds]
    want = [s["__key__"] for s in rw.WebDataset(shards)]
    assert got == want and got


def test_local_manifest_pipe_is_trusted(tmp_path, shards):
    m = rw.build_manifest(shards).to_json()
    for d, path in zip(m["shards"], shards):
        d["url"] = f"pipe:cat {path}"
    p = tmp_path / "local.json"
    p.write_text(json.dumps(m))
    assert len(list(rw.WebDataset(str(p)))) == sum(1 for _ in rw.WebDataset(shards))


def test_files_follow_the_umask(tmp_path, shards):
    """Cache files, the journal and its side files are created with the user's umask."""
    srv_root = tmp_path / "srv"
    srv_root.mkdir()
    for p in shards:
        os.link(p, srv_root / os.path.basename(p))
    rw.build_manifest(sorted(str(p) for p in srv_root.glob("*.tar")), str(srv_root / "manifest.json"))
    cache = tmp_path / "c"
    journal = tmp_path / "j" / "run.db"
    journal.parent.mkdir()
    with FaultServer(str(srv_root)) as srv:
        cmd = [PY, "-m", "resumewds", "cat", srv.url + "manifest.json", "--cache-dir", str(cache),
               "--journal", str(journal), "--commit-every", "10", "--workers", "1"]
        env = subprocess_env()
        env["NO_PROXY"] = "127.0.0.1"
        r = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=120,
                           preexec_fn=lambda: os.umask(0o027))
    assert r.returncode == 0, r.stderr
    files = [p for p in glob.glob(str(cache) + "/**", recursive=True) + glob.glob(str(journal) + "*")
             if os.path.isfile(p)]
    assert any(p.endswith(".tar") for p in files) and any(p.endswith("run.db") for p in files)
    for p in files:
        assert stat.S_IMODE(os.stat(p).st_mode) & 0o027 == 0, (p, oct(os.stat(p).st_mode))


def _served_shard(tmp_path, name="a.tar"):
    root = tmp_path / "srv"
    root.mkdir(exist_ok=True)
    data = tar_bytes([("k.txt", b"hello"), ("k.cls", b"1")])
    (root / name).write_bytes(data)
    return root, data


@pytest.mark.parametrize("side", ["", ".partial", ".meta", ".lock", ".partial.etag"])
def test_cache_never_writes_through_planted_symlinks(tmp_path, side):
    """Another user plants ``<entry><side> -> victim`` in a shared cache directory."""
    import xxhash

    root, data = _served_shard(tmp_path)
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    cache = tmp_path / "shared-cache"
    with FaultServer(str(root)) as srv:
        url = srv.url + "a.tar"
        store = ShardStore(cache_dir=str(cache))
        base = store.entry_path(url)
        os.makedirs(os.path.dirname(base), exist_ok=True)
        os.symlink(victim, base + side)
        shard = ShardInfo(url=url, size=len(data), xxh3_64=xxhash.xxh3_64(data).hexdigest())
        try:
            with store.acquire(shard) as ls:
                assert os.path.realpath(ls.path) != str(victim)
                with open(ls.path, "rb") as f:
                    assert f.read() == data
        except CacheError as exc:
            assert "symlink" in str(exc)
        finally:
            store.close()
    assert victim.read_bytes() == b"precious"  # (replacing the link itself is fine)


def test_cache_refuses_a_symlinked_shards_dir(tmp_path):
    root, data = _served_shard(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    cache = tmp_path / "c"
    cache.mkdir()
    os.symlink(elsewhere, cache / "shards")
    with FaultServer(str(root)) as srv:
        store = ShardStore(cache_dir=str(cache))
        with pytest.raises(CacheError, match="symlink"):
            store.ensure(ShardInfo(url=srv.url + "a.tar"))
    assert list(elsewhere.iterdir()) == []


def test_journal_lock_not_followed_through_symlink(tmp_path):
    from resumewds.journal import Journal

    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    os.symlink(victim, tmp_path / "run.db.lock")
    with pytest.raises(rw.JournalError, match="symbolic link"):
        Journal(str(tmp_path / "run.db")).close()
    assert victim.read_bytes() == b"precious"
    os.remove(tmp_path / "run.db.lock")
    os.symlink(victim, tmp_path / "run.db")
    with pytest.raises(rw.JournalError, match="symbolic link"):
        Journal(str(tmp_path / "run.db")).close()
    assert victim.read_bytes() == b"precious"
