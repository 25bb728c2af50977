"""Each package's face is its API, and everything behind it is private.

* A name without a leading underscore that a package holds is API: it is in
  ``__all__``, or it is not in the package (submodules and the ``from
  __future__ import annotations`` flag are not names of the API).
* Every subpackage's implementation modules are private (``_name.py``); the
  public modules are the faces (``__init__.py``), webdataset's module names
  (the top level and ``wds/``) and the one module per framework of
  ``integrations/``.
* Each face says what its package is for in its first docstring line, and
  every name it exports resolves.
"""

from __future__ import annotations
import __future__

import importlib
import os
import pkgutil
import types

import pytest

import resumewds

ROOT = os.path.dirname(resumewds.__file__)
SUBPACKAGES = sorted(m.name for m in pkgutil.iter_modules([ROOT]) if m.ispkg)
PACKAGES = ["resumewds"] + [f"resumewds.{p}" for p in SUBPACKAGES]

# webdataset 1.0.2's module names (resumewds.<name> is resumewds.wds.<name>)
WEBDATASET_MODULES = {"autodecode", "compat", "extradatasets", "filters", "gopen", "handlers", "mix", "multi",
                      "pipeline", "pytorch", "shardlists", "tariterators", "tenbin", "typecheck", "utils", "writer"}
# the top level's own public modules: the faces of the engine's main names, and what users import
TOP_MODULES = {"config", "dataset", "errors", "events", "loader", "mixdataset", "redact", "synth"}
PUBLIC_MODULES = {
    "resumewds": TOP_MODULES | WEBDATASET_MODULES,
    # webdataset's module names, and the modules of the wing's public classes (WebDataset,
    # DataPipeline, FluidWrapper, WebLoader, the splitters) that the top level forwards to
    "resumewds.wds": WEBDATASET_MODULES - {"autodecode", "tenbin", "writer"} | {
        "filecache", "datapipeline", "fluid", "loaderchain", "splitters", "webdataset"},
    "resumewds.integrations": {"accelerate", "lightning", "stateful", "transformers"},
}


def _public(module: types.ModuleType) -> set:
    names = set()
    for name in dir(module):
        if name.startswith("_"):
            continue
        value = getattr(module, name)
        if isinstance(value, (types.ModuleType, __future__._Feature)):
            continue
        names.add(name)
    return names


@pytest.mark.parametrize("package", [p for p in PACKAGES if p != "resumewds"])
def test_public_names_are_all(package):
    module = importlib.import_module(package)
    assert _public(module) == set(module.__all__)
    assert len(module.__all__) == len(set(module.__all__))


@pytest.mark.parametrize("package", PACKAGES)
def test_implementation_modules_are_private(package):
    module = importlib.import_module(package)
    public = {m.name for m in pkgutil.iter_modules(module.__path__)
              if not m.name.startswith("_") and not m.ispkg}
    assert public <= PUBLIC_MODULES.get(package, set()), sorted(public - PUBLIC_MODULES.get(package, set()))


@pytest.mark.parametrize("package", PACKAGES)
def test_each_face_says_what_its_package_is_for(package):
    module = importlib.import_module(package)
    first = (module.__doc__ or "").strip().splitlines()
    assert first and len(first[0]) > 20, f"{package}: no one-line purpose in its docstring"


def test_resumewds_all_names_resolve():
    missing = [n for n in resumewds.__all__ if not hasattr(resumewds, n)]
    assert not missing


def test_webdataset_module_names_are_the_wing_modules():
    import resumewds.filters
    import resumewds.shardlists
    import resumewds.wds.filters
    import resumewds.wds.shardlists

    assert resumewds.filters is resumewds.wds.filters and resumewds.shardlists is resumewds.wds.shardlists
    assert resumewds.filters.__name__ == "resumewds.wds.filters"


LAZY_FACES = [p for p in PACKAGES if p not in ("resumewds", "resumewds.wds", "resumewds.integrations",
                                               "resumewds.cli")]


@pytest.mark.parametrize("package", LAZY_FACES)
def test_a_face_loads_its_modules_on_first_use(package):
    """Importing a package (or one module of it) loads none of its other modules:
    the light modules (the CLI's start-up, the tar reader) stay light."""
    import subprocess
    import sys

    code = (f"import sys, resumewds\n"
            f"before = set(sys.modules)\n"
            f"import {package}\n"
            f"print(sorted(m for m in set(sys.modules) - before if m.startswith('{package}._')))\n"
            f"name = sorted({package}.__all__)[0]\n"
            f"getattr({package}, name)\n"
            f"print(len([m for m in sys.modules if m.startswith('{package}._')]) > 0)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split("\n")[:2] == ["[]", "True"], out.stdout
