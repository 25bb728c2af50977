"""pytest plugin: make ``import webdataset`` import resumewds, with no way back to the real one.

Loaded with ``-p wds_alias`` by tests/compat/harness.py.  At start-up,
``sys.modules["webdataset"]`` becomes the resumewds package and every
``resumewds.X`` module is also ``webdataset.X``; a meta-path finder placed
first refuses any other ``webdataset.*`` name, so a test that needs a module
resumewds does not have fails with ModuleNotFoundError instead of silently
using the real webdataset.
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.machinery
import pkgutil
import sys

import resumewds
from resumewds.wds import MODULES as WING


class _ThisTree(importlib.abc.MetaPathFinder):
    """``resumewds.X`` only from the resumewds package under test (an editable install's
    finder would otherwise fill in modules missing from this tree from another checkout)."""

    def find_spec(self, fullname, path, target=None):
        if not fullname.startswith("resumewds.") or fullname.split(".")[1] in WING:
            return None  # the wing's modules under the package's name: resumewds' own finder
        # a subpackage's module (resumewds.cache) is looked up in its parent
        # package's path, which this finder found in this tree too
        where = list(path) if path is not None and fullname.count(".") > 1 else list(resumewds.__path__)
        spec = importlib.machinery.PathFinder.find_spec(fullname, where)
        if spec is None:
            raise ModuleNotFoundError(f"No module named {fullname!r} in {resumewds.__path__[0]}",
                                      name=fullname)
        return spec


class _Refuse(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname == "webdataset" or fullname.startswith("webdataset."):
            raise ModuleNotFoundError(f"No module named {fullname!r} (resumewds alias: "
                                      f"resumewds has no {fullname.replace('webdataset', 'resumewds', 1)!r})",
                                      name=fullname)
        return None


def _install() -> None:
    sys.meta_path.insert(0, _ThisTree())
    sys.modules["webdataset"] = resumewds
    for info in pkgutil.iter_modules(resumewds.__path__):
        if info.name.startswith("_") or info.name in ("__main__",):
            continue
        try:
            mod = importlib.import_module(f"resumewds.{info.name}")
        except Exception:  # pragma: no cover - optional dependency missing
            continue
        sys.modules[f"webdataset.{info.name}"] = mod
    for name in WING:  # webdataset's module names, which resumewds keeps in its wing
        sys.modules[f"webdataset.{name}"] = importlib.import_module(f"resumewds.{name}")
    sys.meta_path.insert(0, _Refuse())


def pytest_configure(config) -> None:
    """Install the alias when loaded as a plugin (``-p wds_alias``, the compat suite's
    subprocess), never merely on import: importing this module (``--doctest-modules``
    collecting tests/) must not turn ``webdataset`` into resumewds in the test process."""
    _install()
