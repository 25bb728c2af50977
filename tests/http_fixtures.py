"""Shared helpers (not fixtures) for the fetch and cache tests.

The fixtures (``served``: a live server on 127.0.0.1; ``_loopback_only``)
are in ``tests/conftest.py``.
"""

from __future__ import annotations

import io
import tarfile
from typing import List

import xxhash

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


_MOVED = ("_loopback_only", "served")


def __getattr__(name: str):
    # The fixtures moved to tests/conftest.py: pytest finds them without an import.
    if name in _MOVED:
        raise ImportError(f"http_fixtures.{name} is a fixture in tests/conftest.py now: "
                          "drop it from the import, pytest provides it")
    raise AttributeError(name)
