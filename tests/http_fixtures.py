"""Shared helpers for the fetch and cache tests: tiny shards and a live server.

Everything talks to 127.0.0.1 only.
"""

from __future__ import annotations

import io
import os
import tarfile
from typing import Callable, List

import pytest
import xxhash

from chaos.faultserver import FaultServer
from resumewds.fetch import FetchConfig, no_sleep
from resumewds.manifest import ShardInfo


def make_tar(path: str, samples: int = 8, payload: int = 1000, seed: int = 0) -> bytes:
    """Write a small WebDataset-style tar (``key.txt`` + ``key.bin``); return its bytes."""
    rnd = __import__("random").Random(seed)
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tf:
        for i in range(samples):
            for ext, data in (("txt", f"sample {i}".encode()), ("bin", rnd.randbytes(payload))):
                ti = tarfile.TarInfo(f"s{i:06d}.{ext}")
                ti.size = len(data)
                ti.mtime = 0
                tf.addfile(ti, io.BytesIO(data))
    raw = buf.getvalue()
    with open(path, "wb") as f:
        f.write(raw)
    return raw


def make_blob(path: str, size: int, seed: int = 0) -> bytes:
    data = __import__("random").Random(seed).randbytes(size)
    with open(path, "wb") as f:
        f.write(data)
    return data


def digest(data: bytes) -> str:
    return xxhash.xxh3_64(data).hexdigest()


def shard_for(url: str, data: bytes, known: bool = True) -> ShardInfo:
    return ShardInfo(url=url, size=len(data) if known else None, xxh3_64=digest(data) if known else None)


class Recorder:
    """An on_event callback that keeps what it saw."""

    def __init__(self) -> None:
        self.events: List[tuple] = []

    def __call__(self, kind: str, url: str, **detail) -> None:
        self.events.append((kind, url, detail))

    def kinds(self, kind: str) -> List[dict]:
        return [d for k, _, d in self.events if k == kind]


def fast_config(**kw) -> FetchConfig:
    base = dict(connect_timeout=2.0, read_timeout=0.5, attempts=6, deadline=30.0,
                backoff_initial=0.01, backoff_max=0.05, sleep=no_sleep)
    base.update(kw)
    return FetchConfig(**base)


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
