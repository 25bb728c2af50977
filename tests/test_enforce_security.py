"""webdataset's ``wds.utils.enforce_security`` (``WDS_SECURE``), honoured where
webdataset honours it: local and ``pipe:`` sources, ``GOPEN_REWRITE``, pickle
members; remote URLs still work.  Real shards, a real server on 127.0.0.1,
real subprocesses."""

from __future__ import annotations

import json
import os
import pickle
import subprocess

import pytest

import resumewds as rw
from http_fixtures import make_tar
from resumewds import config, utils
from resumewds.autodecode import decoders
from resumewds.gopen import gopen, rewrite_url
from resumewds.utils import EnforcedSecurityError
from tests.conftest import PY, subprocess_env

pytestmark = pytest.mark.usefixtures("cache_dir")


@pytest.fixture
def secure():
    utils.enforce_security = True
    try:
        yield
    finally:
        utils.enforce_security = False


@pytest.fixture
def shard(tmp_path) -> str:
    path = str(tmp_path / "a.tar")
    make_tar(path, samples=3)
    return path


def _keys(ds) -> list:
    return [s["__key__"] for s in ds]


@pytest.mark.parametrize("form", ["path", "file", "pipe", "manifest"])
def test_webdataset_refuses_local_and_pipe_sources(tmp_path, shard, form):
    url = {"path": shard, "file": "file://" + shard, "pipe": f"pipe:cat {shard}",
           "manifest": str(tmp_path / "m.json")}[form]
    if form == "manifest":
        rw.build_manifest([shard], url)
    utils.enforce_security = True
    try:
        with pytest.raises(ValueError, match="unsafe_gopen is False") as ei:
            _keys(rw.WebDataset(url))
    finally:
        utils.enforce_security = False
    assert isinstance(ei.value, EnforcedSecurityError) and url.split(":", 1)[-1] in str(ei.value)


def test_the_same_sources_open_when_security_is_off(tmp_path, shard):
    assert _keys(rw.WebDataset(shard)) == _keys(rw.WebDataset(f"pipe:cat {shard}")) == \
        ["s000000", "s000001", "s000002"]


def test_remote_shards_still_read_when_secure(served, secure):
    root, srv = served
    make_tar(os.path.join(root, "r.tar"), samples=4)
    assert _keys(rw.WebDataset(srv.url + "r.tar")) == [f"s{i:06d}" for i in range(4)]
    with gopen(srv.url + "r.tar") as f:  # the streaming opener too
        assert len(f.read()) == os.path.getsize(os.path.join(root, "r.tar"))


def test_streaming_stages_refuse_pipe_sources(shard, secure):
    p = rw.DataPipeline(rw.SimpleShardList([f"pipe:cat {shard}"]), rw.tarfile_samples)
    with pytest.raises(ValueError, match="cannot open pipe URLs"):
        list(p)


def test_gopen_semantics(tmp_path, shard, secure):
    for url in (shard, "file://" + shard, "file:" + shard):
        with pytest.raises(EnforcedSecurityError, match="cannot open local files"):
            gopen(url)
    with pytest.raises(EnforcedSecurityError, match="cannot open pipe URLs"):
        gopen("pipe:echo hi")
    assert gopen("-", "rb") is not None and gopen("-", "wb") is not None
    utils.enforce_security = False
    assert gopen("file:" + shard).read() == gopen(shard).read() == open(shard, "rb").read()
    assert gopen("pipe:echo hello").read() == b"hello\n"
    with pytest.raises(OSError, match="exit status 3"):
        gopen("pipe:exit 3").read()
    with gopen(f"pipe:cat > {tmp_path}/w.bin", "wb") as f:
        f.write(b"written")
    assert open(tmp_path / "w.bin", "rb").read() == b"written"
    with pytest.raises(ValueError, match="unknown mode"):
        gopen(shard, "r")


def test_gopen_rewrite_applies_to_webdataset_and_is_refused_when_secure(served, monkeypatch):
    root, srv = served
    make_tar(os.path.join(root, "r.tar"), samples=2)
    monkeypatch.setenv("GOPEN_REWRITE", f"http://shards.invalid/={srv.url}")
    assert config.value("gopen_rewrite") == f"http://shards.invalid/={srv.url}"
    assert rewrite_url("http://shards.invalid/r.tar") == srv.url + "r.tar"
    assert rewrite_url("http://other.invalid/r.tar") == "http://other.invalid/r.tar"
    ds = rw.WebDataset("http://shards.invalid/r.tar")
    assert _keys(ds) == ["s000000", "s000001"]
    assert {s["__url__"] for s in ds} == {srv.url + "r.tar"}
    utils.enforce_security = True
    try:
        with pytest.raises(ValueError, match="rewrite_url: unsafe_gopen is False"):
            _ = rw.WebDataset("http://shards.invalid/r.tar").manifest
    finally:
        utils.enforce_security = False


def test_writers_refuse_local_and_pipe_outputs_when_secure(tmp_path, secure):
    import io

    for out in (str(tmp_path / "w.tar"), f"pipe:cat > {tmp_path}/p.tar"):
        with pytest.raises(EnforcedSecurityError, match="unsafe_gopen is False"):
            rw.TarWriter(out)
    with pytest.raises(EnforcedSecurityError):
        rw.ShardWriter(str(tmp_path / "s-%06d.tar"), maxcount=2)
    assert sorted(os.listdir(tmp_path)) == ["cache"]  # nothing written (cache: the fixture)
    buf = io.BytesIO()
    with rw.TarWriter(buf) as w:  # a stream is fine
        w.write({"__key__": "a", "txt": "x"})
    assert len(buf.getvalue()) > 0


def test_pickle_decoders_refused_when_secure(secure):
    with pytest.raises(ValueError, match="Unpickling is not allowed"):
        decoders["pkl"](pickle.dumps({"a": 1}))
    utils.enforce_security = False
    assert decoders["pkl"](pickle.dumps({"a": 1})) == {"a": 1}


def test_wds_secure_environment_variable_sets_it(tmp_path, shard):
    code = ("import resumewds as rw, resumewds.utils as u; print(u.enforce_security)\n"
            "try:\n    list(rw.WebDataset(%r))\nexcept ValueError as e:\n    print(type(e).__name__, e)\n" % shard)
    for var, val, expect in (("WDS_SECURE", "1", "True"), ("RESUMEWDS_SECURE", "1", "True"),
                             ("WDS_SECURE", "0", "False")):
        env = subprocess_env()
        env.pop("WDS_SECURE", None)
        env.pop("RESUMEWDS_SECURE", None)
        env[var] = val
        out = subprocess.run([PY, "-c", code], env=env, capture_output=True, text=True, timeout=120).stdout
        assert out.splitlines()[0] == expect, out
        assert ("EnforcedSecurityError gopen: unsafe_gopen is False" in out) == (expect == "True"), out


def test_cli_error_is_one_line(shard):
    env = subprocess_env()
    env["WDS_SECURE"] = "1"
    r = subprocess.run([PY, "-m", "resumewds", "cat", shard], env=env, capture_output=True, text=True,
                       timeout=120)
    assert r.returncode != 0 and "Traceback" not in r.stderr, r.stderr
    assert "unsafe_gopen is False" in r.stderr and shard in r.stderr
    json.dumps(r.stderr)
