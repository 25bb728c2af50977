"""The cache's imports run one way: the store imports its helpers, never the reverse.

prefetch, bulk and repair call the store back only through its public
protocol (:class:`resumewds.cache._storeapi.StoreAPI`); the sample-digest code sits
below the manifest and the store; no module of this part of the package
imports a package module inside a function unless the line says why
(``# lazy: <reason>``, for a heavy or optional dependency).
"""

from __future__ import annotations

import ast
import inspect
import os
import re
from typing import Iterator, Tuple

import pytest

from resumewds.cache import ShardStore
from resumewds.cache._storeapi import StoreAPI

PKG = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "resumewds")
FILES = ["cache/__init__.py", "cache/_bulk.py", "cache/_eviction.py", "cache/_layout.py", "cache/_local.py",
         "cache/_locks.py", "cache/_prefetch.py", "cache/_store.py", "manifest/_arrayfile.py",
         "tar/_compressed.py", "tar/_decompress.py", "sources/_digests.py", "manifest/_manifest.py",
         "cache/_repair.py", "cache/_samplecheck.py", "manifest/_sampledigests.py", "cache/_storeapi.py"]


def _module(rel: str) -> str:
    parts = ["resumewds"] + rel[:-3].split("/")
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _imports(rel: str) -> Iterator[Tuple[str, bool, int]]:
    """(module imported, inside a function, line) for each import of a package module in ``rel``."""
    me = _module(rel)
    pkg = me if rel.endswith("__init__.py") else me.rsplit(".", 1)[0]
    with open(os.path.join(PKG, rel), encoding="utf-8") as f:
        tree = ast.parse(f.read())

    def walk(node: ast.AST, infunc: bool) -> Iterator[Tuple[str, bool, int]]:
        for ch in ast.iter_child_nodes(node):
            inner = infunc or isinstance(ch, (ast.FunctionDef, ast.AsyncFunctionDef))
            if isinstance(ch, ast.ImportFrom):
                base = pkg.split(".")[: len(pkg.split(".")) - (ch.level - 1)] if ch.level else []
                target = ".".join(base + ([ch.module] if ch.module else [])) if ch.level else (ch.module or "")
                if target.startswith("resumewds"):
                    if ch.module is None or os.path.isdir(os.path.join(PKG, *target.split(".")[1:])):
                        for a in ch.names:  # from . import x: the submodule x, if it is one
                            yield (f"{target}.{a.name}", inner, ch.lineno)
                    else:
                        yield (target, inner, ch.lineno)
            elif isinstance(ch, ast.Import):
                for a in ch.names:
                    if a.name.startswith("resumewds"):
                        yield (a.name, inner, ch.lineno)
            yield from walk(ch, inner)

    yield from walk(tree, False)


@pytest.mark.parametrize("rel", FILES)
def test_no_function_level_package_import_without_a_reason(rel):
    with open(os.path.join(PKG, rel), encoding="utf-8") as f:
        lines = f.read().splitlines()
    bad = [f"{rel}:{n}: {lines[n - 1].strip()}" for _, inner, n in _imports(rel)
           if inner and "# lazy:" not in lines[n - 1]]
    assert not bad


@pytest.mark.parametrize("rel, forbidden", [
    ("cache/_bulk.py", ("resumewds.cache._store", "resumewds.cache._repair")),
    ("cache/_prefetch.py", ("resumewds.cache._store", "resumewds.cache._repair")),
    ("cache/_local.py", ("resumewds.cache._store",)),
    ("cache/_locks.py", ("resumewds.cache._store",)),
    ("cache/_layout.py", ("resumewds.cache._store", "resumewds.sources", "resumewds.cache._samplecheck")),
    ("cache/_repair.py", ("resumewds.cache._store", "resumewds.sources")),
    ("cache/_storeapi.py", ("resumewds.cache._store", "resumewds.cache._repair", "resumewds.sources")),
    ("cache/_samplecheck.py", ("resumewds.cache._store", "resumewds.cache._repair", "resumewds.sources")),
    ("manifest/_sampledigests.py", ("resumewds.manifest._manifest", "resumewds.cache", "resumewds.sources")),
    ("manifest/_arrayfile.py", ("resumewds.manifest._manifest", "resumewds.manifest._sampledigests")),
    ("manifest/_manifest.py", ("resumewds.sources", "resumewds.cache")),
    ("tar/_compressed.py", ("resumewds.cache",)),
])
def test_imports_run_down(rel, forbidden):
    """A module below another never imports it (not even for type hints)."""
    up = [(m, n) for m, _, n in _imports(rel) if any(m == f or m.startswith(f + ".") for f in forbidden)]
    assert not up, f"{rel} imports modules above it: {up}"


def test_the_store_offers_its_protocol_in_public():
    """Every StoreAPI member is a public member of ShardStore with the same parameters."""
    members = [n for n, v in vars(StoreAPI).items() if not n.startswith("_") and callable(v)]
    assert {"ensure", "check_local", "emit", "count", "evict", "session", "close_session",
            "write_meta", "entry_path"} <= set(members)
    for name in members:
        want = list(inspect.signature(getattr(StoreAPI, name)).parameters)
        got = list(inspect.signature(getattr(ShardStore, name)).parameters)
        assert got == want, name
    for attr in StoreAPI.__annotations__:
        assert not attr.startswith("_")


def test_nothing_outside_the_store_reaches_into_its_private_members():
    pattern = re.compile(r"\b(?:store|_store|st)\._[a-z]\w*")
    seen = []
    for dirpath, _, files in os.walk(PKG):
        for f in files:
            path = os.path.join(dirpath, f)
            if not f.endswith(".py") or path == os.path.join(PKG, "cache", "_store.py"):
                continue
            with open(path, encoding="utf-8") as fh:
                for n, line in enumerate(fh, 1):
                    if pattern.search(line):
                        seen.append(f"{os.path.relpath(path, PKG)}:{n}: {line.strip()}")
    assert not seen
