"""Fixtures of the client corpus: the shards of every layout, served three ways.

``corpus`` writes each layout of :mod:`tests.clients.shards` (and a damaged
copy of it) once per session, and serves the directory on 127.0.0.1. A
session-wide ``RESUMEWDS_CACHE_DIR`` keeps resumewds's shard cache inside it.
"""

from __future__ import annotations

import os
import types
from dataclasses import dataclass
from typing import Dict, List

import pytest

from chaos.faultserver import FaultServer
from tests.clients.shards import LAYOUTS, MODALITIES, corrupt_copy, modality_paths, write_layout


@dataclass
class Corpus:
    root: str
    port: int
    paths: Dict[str, List[str]]

    def urls(self, layout: str, how: str, corrupt: bool = False) -> str:
        """The brace pattern of ``layout``'s shards: ``local``, ``http`` or ``pipe`` (curl)."""
        sub = f"{layout}-bad" if corrupt else layout
        n = len(self.paths[layout])
        name = f"{layout}-{{000000..{n - 1:06d}}}.tar"
        if how == "local":
            return os.path.join(self.root, sub, name)
        url = f"http://127.0.0.1:{self.port}/{sub}/{name}"
        if how == "http":
            return url
        if how == "pipe":
            return f"pipe:curl -s -L {url}"
        raise ValueError(how)


BAD_EXT = {"imgtxt": "jpg", "imgcls": "jpg", "latent": "npy", "audio": "wav", "video": "json", "tokens": "json",
           "modal": "jpg"}


@pytest.fixture
def no_handler_sleep(monkeypatch):
    """webdataset's warn_and_continue sleeps 0.5 s per warning; not in these tests (the data is the same)."""
    import webdataset.handlers

    monkeypatch.setattr(webdataset.handlers, "time", types.SimpleNamespace(sleep=lambda s: None))


@pytest.fixture(scope="session")
def corpus(tmp_path_factory):
    root = str(tmp_path_factory.mktemp("clients"))
    paths = {}
    for layout in LAYOUTS:
        paths[layout] = write_layout(os.path.join(root, layout), layout)
        corrupt_copy(paths[layout], os.path.join(root, f"{layout}-bad"), BAD_EXT[layout])
        for modality, ext in MODALITIES.get(layout, {}).items():  # the damage in each modality's shards
            corrupt_copy(modality_paths(paths[layout], modality), os.path.join(root, f"{layout}-bad_{modality}"), ext)
    saved = {k: os.environ.get(k) for k in ("RESUMEWDS_CACHE_DIR", "NO_PROXY")}
    os.environ["RESUMEWDS_CACHE_DIR"] = os.path.join(root, "_rwcache")
    os.environ["NO_PROXY"] = "127.0.0.1,localhost"
    srv = FaultServer(root, stall_seconds=2.0, retry_after=0)
    srv.start()
    try:
        yield Corpus(root, srv.port, paths)
    finally:
        srv.stop()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def pytest_collection_modifyitems(config, items):
    """The corpus takes about two minutes: it runs only with ``-m clients`` (as tests/compat with ``-m compat``)."""
    if "clients" in (config.option.markexpr or ""):
        return
    here = os.path.dirname(os.path.abspath(__file__))
    chosen, dropped = [], []
    for item in items:
        (dropped if str(item.path).startswith(here + os.sep) else chosen).append(item)
    if dropped:
        config.hook.pytest_deselected(items=dropped)
        items[:] = chosen
