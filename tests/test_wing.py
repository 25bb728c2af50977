"""The WebDataset wing (``resumewds/wds/``) stands beside the core, never under it.

The core (every module of the package except the wing, the two faces that
compose core and wing -- ``dataset.py``, ``loader.py`` -- the package's
``__init__``, and the applications built on the faces: ``cli.py``,
``demo.py``, ``integrations/``) imports neither the wing nor the faces, at
module level or inside a function.  And every webdataset module name is
reachable as ``resumewds.<name>``, one module object under both names.
"""

from __future__ import annotations

import ast
import importlib
import pathlib
import subprocess
import sys

import pytest

import resumewds
from resumewds.wds import MODULES

PKG = pathlib.Path(resumewds.__file__).parent
FACES = {"resumewds", "resumewds.dataset", "resumewds.loader"}
APPS = {"resumewds.cli", "resumewds.demo", "resumewds.__main__"}


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


def _forbidden(target: str) -> bool:
    wing_alias = target.split(".")[1] in MODULES if target.count(".") >= 1 else False
    return target.startswith("resumewds.wds") or target in FACES - {"resumewds"} or wing_alias


def test_the_core_never_imports_the_wing_or_the_faces():
    bad = []
    for path in sorted(PKG.rglob("*.py")):
        me = _modname(path)
        if not _is_core(me):
            continue
        bad += [f"{me} imports {t}" for t in sorted(_imports(path)) if _forbidden(t)]
    assert bad == [], "\n".join(bad)


def test_the_check_sees_a_core_module_that_imports_the_wing(tmp_path):
    fake = tmp_path / "shardset.py"
    fake.write_text((PKG / "shardset.py").read_text() + "\n\ndef _late():\n    from .wds import filters\n")
    found = {t for t in _imports(fake, "resumewds.shardset") if _forbidden(t)}
    assert found == {"resumewds.wds", "resumewds.wds.filters"}


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
            "import resumewds.utils as u, resumewds.urls as core\n"
            "u.enforce_security = True\n"
            "assert core.enforce_security is True\n"
            "sys.modules['webdataset'] = rw  # the package under another name: its wing too\n"
            "import webdataset.mix\n"
            "assert webdataset.mix is sys.modules['resumewds.wds.mix']\n"
            "print('ok')\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr
