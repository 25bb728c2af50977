"""Runs the package's docstring examples (``--doctest-modules`` in pyproject.toml).

Every doctest in ``resumewds/`` runs in a fresh temporary directory holding
small generated data, so an example reads like real use and really executes:

* ``data/shard-000000.tar`` ... ``data/shard-000003.tar``: 4 shards x 8
  samples of ``.jpg`` (16x16), ``.cls`` and ``.txt``, written by
  :func:`resumewds.synth.write_shards` with seed 0;
* ``data/manifest.json``: their manifest (``resumewds index``);
* an empty shard cache (``RESUMEWDS_CACHE_DIR``), and no rank variables;
* ``rw`` is ``resumewds`` in every example's namespace.

The tests' own fixtures are in ``tests/conftest.py``.
"""

from __future__ import annotations

import importlib.util
import os
import shutil

import pytest

collect_ignore = [
    # importing it (as --doctest-modules would) makes `webdataset` an alias of
    # resumewds in this process: it is a plugin for the compat suite's subprocess only
    "tests/compat/wds_alias.py",
]
# resumewds.integrations' lightning and transformers modules import their framework (the
# `frameworks` extra): without it, --doctest-modules must not import them
for _name in ("lightning", "transformers"):
    if importlib.util.find_spec(_name) is None:
        collect_ignore.append(f"resumewds/integrations/{_name}.py")

# webdataset's module names (resumewds/filters.py, ...) hand over the wing's module: their
# examples are collected there (resumewds/wds/), not twice
for _path in sorted(os.listdir(os.path.join(os.path.dirname(__file__), "resumewds"))):
    _file = os.path.join(os.path.dirname(__file__), "resumewds", _path)
    if _path.endswith(".py") and "sys.modules[__name__] = " in open(_file).read():
        collect_ignore.append(f"resumewds/{_path}")

DOCTEST_SHARDS = 4
DOCTEST_SAMPLES = 8


@pytest.fixture(scope="session")
def _doctest_data(tmp_path_factory) -> str:
    from resumewds.dataset import build_manifest
    from resumewds.synth import write_shards

    root = tmp_path_factory.mktemp("doctest-data")
    data = root / "data"
    write_shards(str(data), shards=DOCTEST_SHARDS, samples=DOCTEST_SAMPLES, images=True, image_side=16)
    old = os.environ.get("RESUMEWDS_CACHE_DIR")
    os.environ["RESUMEWDS_CACHE_DIR"] = str(root / "index-cache")
    try:
        build_manifest(str(data / f"shard-{{000000..{DOCTEST_SHARDS - 1:06d}}}.tar"), str(data / "manifest.json"))
    finally:
        if old is None:
            del os.environ["RESUMEWDS_CACHE_DIR"]
        else:
            os.environ["RESUMEWDS_CACHE_DIR"] = old
    return str(data)


@pytest.fixture(autouse=True)
def _doctest_workdir(request):
    """For doctest items only: cwd = a fresh dir with ``data/``; an empty cache."""
    if type(request.node).__name__ != "DoctestItem":
        return
    import resumewds

    tmp_path = request.getfixturevalue("tmp_path")
    monkeypatch = request.getfixturevalue("monkeypatch")

    shutil.copytree(request.getfixturevalue("_doctest_data"), tmp_path / "data")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("RESUMEWDS_CACHE_DIR", str(tmp_path / "cache"))
    for var in ("RESUMEWDS_CACHE_SIZE", "RESUMEWDS_VERBOSE", "RANK", "WORLD_SIZE", "LOCAL_RANK",
                "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    request.getfixturevalue("doctest_namespace")["rw"] = resumewds
