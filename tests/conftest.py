"""Shared fixtures: tiny shards in ``tmp_path``, an isolated shard cache, a live server.

Only ``_loopback_only`` is autouse (test traffic never goes through a proxy).
Test modules that read shards through :class:`resumewds.WebDataset` ask for
``cache_dir`` (directly, through ``shards``, or with
``pytestmark = pytest.mark.usefixtures("cache_dir")``), so tests of other
modules keep their own view of the environment. ``served`` runs a
:class:`chaos.faultserver.FaultServer` on 127.0.0.1. Helpers that are not
fixtures (``make_tar``, ``fast_config``, ``Recorder``...) are in
``tests/http_fixtures.py``. ``chaos`` and the repository root are importable
through pytest's ``pythonpath`` setting (pyproject.toml), not a path hack.
"""

from __future__ import annotations

import io
import os
import sys
import tarfile
from typing import Callable, Dict, Iterable, List, Tuple

import pytest

from chaos.faultserver import FaultServer
from resumewds.synth import write_shards

# A script run by tests/test_distributed.py under torchrun, not a test module
# (it would otherwise be imported by --doctest-modules collection).
collect_ignore = ["dist_driver.py"]

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# Small enough that a loader with worker processes starts and finishes in well
# under a second; 37 samples per shard so batches never divide shards evenly.
N_SHARDS = 5
N_SAMPLES = 37


@pytest.fixture(autouse=True)
def _loopback_only(monkeypatch):
    """Never route test traffic through a proxy."""
    for var in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("NO_PROXY", "127.0.0.1,localhost")


@pytest.fixture
def served(tmp_path):
    """``(root, server)`` with a FaultServer on 127.0.0.1 over ``tmp_path/srv``."""
    root = tmp_path / "srv"
    root.mkdir()
    srv = FaultServer(str(root), stall_seconds=2.0, retry_after=0)
    srv.start()
    try:
        yield str(root), srv
    finally:
        srv.stop()


@pytest.fixture
def cache_dir(tmp_path, monkeypatch) -> str:
    """An empty RESUMEWDS_CACHE_DIR for this test (restored afterwards)."""
    d = tmp_path / "cache"
    d.mkdir()
    monkeypatch.setenv("RESUMEWDS_CACHE_DIR", str(d))
    monkeypatch.delenv("RESUMEWDS_CACHE_SIZE", raising=False)
    monkeypatch.delenv("RESUMEWDS_VERBOSE", raising=False)
    for var in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    return str(d)


@pytest.fixture
def make_shards(tmp_path, cache_dir) -> Callable[..., List[str]]:
    """``make_shards(shards=.., samples=.., subdir=.., **kw)`` -> shard paths in tmp_path."""

    def make(shards: int = N_SHARDS, samples: int = N_SAMPLES, subdir: str = "data",
             **kw) -> List[str]:
        kw.setdefault("size_range", (10, 300))
        return write_shards(str(tmp_path / subdir), shards=shards, samples=samples, **kw)

    return make


@pytest.fixture
def shards(make_shards) -> List[str]:
    """5 shards x 37 samples of .bin/.cls/.txt (synth defaults, small payloads)."""
    return make_shards()


def tar_bytes(members: Iterable[Tuple], fmt: int = tarfile.USTAR_FORMAT) -> bytes:
    """An in-memory tar of ``(name, data)`` regular files, ``(name, None)``
    directories, or ``(name, data, type)`` for other entry types."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tf:
        for m in members:
            name, data = m[0], m[1]
            ti = tarfile.TarInfo(name)
            ti.mtime = 1_700_000_000
            if len(m) > 2:
                ti.type = m[2]
                if ti.type == tarfile.SYMTYPE:
                    ti.linkname = "target"
                tf.addfile(ti)
            elif data is None:
                ti.type = tarfile.DIRTYPE
                ti.mode = 0o755
                tf.addfile(ti)
            else:
                ti.size = len(data)
                tf.addfile(ti, io.BytesIO(data))
    return buf.getvalue()


def raw_samples(path: str) -> List[Dict[str, object]]:
    """Reference grouping with tarfile (for synth shards: plain members only)."""
    out: List[Dict[str, object]] = []
    with tarfile.open(path) as tf:
        for ti in tf:
            if not ti.isreg():
                continue
            base, ext = ti.name.split(".", 1)
            data = tf.extractfile(ti).read()
            if not out or out[-1]["__key__"] != base:
                out.append({"__key__": base})
            out[-1][ext.lower()] = data
    return out


def subprocess_env() -> Dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    return env


PY = sys.executable
