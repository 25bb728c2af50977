"""The WebDataset wing (``resumewds/wds/``) stands beside the core, never under it.

The core (every module of the package except the wing, the two faces that
compose core and wing -- ``dataset.py``, ``loader.py`` -- the package's
``__init__``, and the applications built on the faces: ``cli.py``,
``demo.py``, ``integrations/``) imports neither the wing nor the faces, at
module level or inside a function.  webdataset's semantics (the worker
rotation, the shard split, direct iteration, DataLoader's attributes) live in
the wing, and the wing talks to the core through its public engine API only:
it reads or writes no ``_name`` of an object that is not its own (``self``,
``cls``) and imports no ``_name`` of a core module.  And every webdataset
module name is reachable as ``resumewds.<name>``, one module object under both names.
"""

from __future__ import annotations

import ast
import importlib
import pathlib
import subprocess
import sys
import textwrap
from typing import List, Tuple

import pytest

import resumewds
from resumewds.wds import MODULES

PKG = pathlib.Path(resumewds.__file__).parent
#: the faces: the package, dataset.py and loader.py, and webdataset's module names at the top level
#: (``resumewds/filters.py`` is ``resumewds.wds.filters`` under webdataset's name)
FACES = {"resumewds", "resumewds.dataset", "resumewds.loader"} | {
    f"resumewds.{p.stem}" for p in PKG.glob("*.py") if p.stem in MODULES}
APPS = {"resumewds.cli", "resumewds.cli._main", "resumewds.cli._demo", "resumewds.__main__"}


def _modname(path: pathlib.Path) -> str:
    parts = list(path.relative_to(PKG.parent).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _imports(path: pathlib.Path, me: str = "") -> set:
    """Every package module ``path`` (module ``me``) imports (``from . import x`` counts as ``pkg.x``)."""
    me = me or _modname(path)
    pkg = me if path.name == "__init__.py" else me.rsplit(".", 1)[0]
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = pkg.split(".")[: len(pkg.split(".")) - (node.level - 1)]
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            out.add(target)
            out.update(f"{target}.{a.name}" for a in node.names)
        elif isinstance(node, ast.Import):
            out.update(a.name for a in node.names)
    return {t for t in out if t == "resumewds" or t.startswith("resumewds.")}


def _is_core(name: str) -> bool:
    return not (name in FACES or name in APPS or name.startswith(("resumewds.wds", "resumewds.integrations")))


def _wing(target: str) -> bool:
    wing_alias = target.split(".")[1] in MODULES if target.count(".") >= 1 else False
    return target.startswith("resumewds.wds") or wing_alias


def _forbidden(target: str) -> bool:
    return _wing(target) or target in FACES - {"resumewds"}


def test_the_core_never_imports_the_wing_or_the_faces():
    bad = []
    for path in sorted(PKG.rglob("*.py")):
        me = _modname(path)
        if not _is_core(me):
            continue
        bad += [f"{me} imports {t}" for t in sorted(_imports(path)) if _forbidden(t)]
    assert bad == [], "\n".join(bad)


def test_only_the_faces_import_the_wing():
    """The applications built on the faces (the CLI, the demo, the integrations) go through them too."""
    bad = []
    for path in sorted(PKG.rglob("*.py")):
        me = _modname(path)
        if me in FACES or me.startswith("resumewds.wds"):
            continue
        bad += [f"{me} imports {t}" for t in sorted(_imports(path)) if _wing(t)]
    assert bad == [], "\n".join(bad)


def test_the_check_sees_a_core_module_that_imports_the_wing(tmp_path):
    fake = tmp_path / "_dataset.py"
    fake.write_text((PKG / "read" / "_dataset.py").read_text() + "\n\ndef _late():\n    from ..wds import filters\n")
    found = {t for t in _imports(fake, "resumewds.read._dataset") if _forbidden(t)}
    assert found == {"resumewds.wds", "resumewds.wds.filters"}


#: webdataset's semantics: modules of the wing, which the core reaches only through the engine API
WEBDATASET_SEMANTICS = ("rotation", "shardsplit", "direct", "loader_compat")


@pytest.mark.parametrize("name", WEBDATASET_SEMANTICS)
def test_webdatasets_semantics_live_in_the_wing(name, tmp_path):
    assert (PKG / "wds" / f"_{name}.py").is_file() and not list(PKG.rglob(f"{name}.py"))
    # a core module that imports it (lazily, inside a function) is seen
    fake = tmp_path / "_loader.py"
    fake.write_text((PKG / "run" / "_loader.py").read_text() + f"\n\ndef _late():\n    from ..wds import _{name}\n")
    assert f"resumewds.wds._{name}" in {t for t in _imports(fake, "resumewds.run._loader") if _forbidden(t)}


# ---- the wing uses the engine's public API, never another object's private names ----------------

#: ``_names`` of webdataset's own that webdataset itself exposes, which the wing may reach (none is)
ALLOWED_PRIVATE: frozenset = frozenset()


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__")) \
        and name not in ALLOWED_PRIVATE


def _own(node: ast.expr) -> bool:
    """``self``, ``cls`` or ``super()``: the object the code belongs to."""
    if isinstance(node, ast.Name):
        return node.id in ("self", "cls")
    return isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "super"


def private_reaches(source: str) -> List[Tuple[int, str]]:
    """``(line, what)`` for each reach of ``source`` (a module of the wing) into a private name:
    ``x._name`` read or written where ``x`` is not ``self`` / ``cls`` / ``super()``, the same through
    ``getattr`` / ``setattr`` / ``hasattr`` / ``delattr``, and ``from <core module> import _name``."""
    out: List[Tuple[int, str]] = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Attribute) and _private(node.attr) and not _own(node.value):
            out.append((node.lineno, ast.unparse(node)))
        elif (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
              and node.func.id in ("getattr", "setattr", "hasattr", "delattr") and len(node.args) >= 2
              and isinstance(node.args[1], ast.Constant) and isinstance(node.args[1].value, str)
              and _private(node.args[1].value) and not _own(node.args[0])):
            out.append((node.lineno, ast.unparse(node)))
        elif isinstance(node, ast.ImportFrom):
            module = node.module or ""
            core = node.level >= 2 or (node.level == 0 and module.startswith("resumewds")
                                       and not module.startswith("resumewds.wds"))
            out += [(node.lineno, f"from {'.' * node.level}{module} import {a.name}")
                    for a in node.names if core and _private(a.name)]
    return out


def test_the_wing_reaches_no_private_name_of_another_object():
    bad = [f"resumewds/wds/{path.name}:{line}: {what}" for path in sorted((PKG / "wds").glob("*.py"))
           for line, what in sorted(private_reaches(path.read_text()))]
    assert bad == [], "the wing reaches private names (use the engine's public API):\n" + "\n".join(bad)


def test_the_reach_check_sees_each_kind_of_reach():
    source = textwrap.dedent("""
        from ..epochsource import _SampleLayout, BatchInfo
        from .filters import _stage
        def f(self, ds, loader):
            ds._spec.append(1)
            ds._stream_from = 3
            loader._session.consumed_now()
            getattr(ds, "_compile")()
            setattr(loader, "_convert", False)
            self._mine, super()._theirs, ds.stage_specs, ds.__dict__, getattr(ds, "__name__")
    """)
    assert [what for _, what in sorted(private_reaches(source))] == [
        "from ..epochsource import _SampleLayout", "ds._spec", "ds._stream_from", "loader._session",
        "getattr(ds, '_compile')", "setattr(loader, '_convert', False)"]


@pytest.mark.parametrize("name", MODULES)
def test_every_wing_module_is_a_module_of_the_package_too(name):
    alias = importlib.import_module(f"resumewds.{name}")
    assert alias is importlib.import_module(f"resumewds.wds.{name}")
    assert getattr(resumewds, name) is alias or name == "gopen"  # resumewds.gopen is the function


def test_wing_modules_load_lazily_and_gopen_stays_a_function():
    code = ("import sys, resumewds as rw\n"
            "assert 'resumewds.wds.filters' not in sys.modules\n"
            "assert rw.handlers.ignore_and_continue(ValueError()) is True\n"
            "import resumewds.gopen\n"
            "assert callable(rw.gopen) and not isinstance(rw.gopen, type(sys))\n"
            "from resumewds.shardlists import SimpleShardList\n"
            "import resumewds.utils as u, resumewds.sources._urls as core\n"
            "u.enforce_security = True\n"
            "assert core.secure() is True\n"
            "sys.modules['webdataset'] = rw  # the package under another name: its wing too\n"
            "import webdataset.mix\n"
            "assert webdataset.mix is sys.modules['resumewds.wds.mix']\n"
            "print('ok')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
