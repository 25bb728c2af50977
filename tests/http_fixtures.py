"""Shared helpers (not fixtures) for the fetch and cache tests.

The fixtures (``served``: a live server on 127.0.0.1; ``_loopback_only``)
are in ``tests/conftest.py``.
"""

from __future__ import annotations

import io
import os
import struct
import tarfile
from typing import Any, List, Set, Tuple

import xxhash

import resumewds as rw
from resumewds import synth
from resumewds.fetch import FetchConfig
from resumewds.fetch._settings import no_sleep
from resumewds.manifest._manifest import ShardInfo


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


def write_v3(root: str, shards: int, samples: int) -> Set[int]:
    """v3 shards (per-sample digests, 2-8 kB samples) and their ``manifest.json``
    in ``root``, as the sparse-partial tests serve them; returns the shards'
    xxh3_64 as ints: the tags of a sparse map's records of bytes present (not
    of claims), for :func:`sparse_records`."""
    synth.write_shards(root, shards=shards, samples=samples, size_range=(2000, 8000), seed=3)
    manifest = os.path.join(root, "manifest.json")
    rw.build_manifest(os.path.join(root, f"shard-{{000000..{shards - 1:06d}}}.tar"), manifest, digests=True)
    return {int(s.xxh3_64, 16) for s in rw.load_manifest(manifest).shards}


def sparse_records(path: str, tags: Set[int]) -> List[Tuple[int, int]]:
    """A sparse map's records of bytes present: ``(start, end)`` (``tags``: :func:`write_v3`'s)."""
    with open(path, "rb") as f:
        raw = f.read()
    recs = [struct.unpack_from("<QQQQ", raw, off) for off in range(0, len(raw) - 39, 40)]
    return [(a, b) for a, b, _, tag in recs if tag in tags]


def data_bytes(root: str) -> int:
    """The bytes of the ``.tar`` files in ``root``."""
    return sum(os.path.getsize(os.path.join(root, n)) for n in os.listdir(root) if n.endswith(".tar"))


def tar_bytes_sent(srv: Any) -> int:
    """The bytes of ``.tar`` files a FaultServer sent."""
    return sum(n for p, n in srv.bytes_by_path.items() if p.endswith(".tar"))


_MOVED = ("_loopback_only", "served")


def __getattr__(name: str):
    # The fixtures moved to tests/conftest.py: pytest finds them without an import.
    if name in _MOVED:
        raise ImportError(f"http_fixtures.{name} is a fixture in tests/conftest.py now: "
                          "drop it from the import, pytest provides it")
    raise AttributeError(name)
