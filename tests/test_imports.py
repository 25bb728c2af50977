"""Import hygiene, the public surface and the packaging metadata.

torch stays out of the modules that do not need it (fetch, cache, journal,
plan, tar reading, CLI start-up); every public name resolves and documents
itself with an example.
"""

from __future__ import annotations

import ast
import inspect
import os
import re
import subprocess
import sys

import pytest

import resumewds

try:
    import tomllib  # Python 3.11+
except ImportError:  # pragma: no cover
    tomllib = None

LIGHT = ["resumewds", "resumewds.cli._main", "resumewds.fetch", "resumewds.cache", "resumewds.journal",
         "resumewds.plan._plan", "resumewds.tar._io", "resumewds.manifest", "resumewds.sources._resolve",
         "resumewds.dataset", "resumewds.run._stats", "resumewds.errors"]


def test_core_modules_do_not_import_torch():
    code = ("import sys\n" + "".join(f"import {m}\n" for m in LIGHT)
            + "bad = [m for m in sys.modules if m == 'torch' or m.startswith('torch.')]\n"
            + "print(len(bad))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "0"


def test_cli_help_does_not_import_torch():
    code = ("import sys\nfrom resumewds.cli._main import main\n"
            "try:\n    main(['--help'])\nexcept SystemExit:\n    pass\n"
            "print('TORCH' if 'torch' in sys.modules else 'NOTORCH', file=sys.stderr)\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert "NOTORCH" in out.stderr


def test_public_names_resolve_sorted_and_documented():
    names = resumewds.__all__
    assert names == sorted(names)
    for name in names:
        obj = getattr(resumewds, name)
        assert obj is not None, name
        if inspect.isclass(obj) or inspect.isfunction(obj):
            assert (obj.__doc__ or "").strip(), f"{name} has no docstring"
    for name in ("WebDataset", "WebLoader", "Plan", "Manifest", "build_manifest"):
        assert "Example" in (getattr(resumewds, name).__doc__ or ""), name


# -- packaging: one version, every imported dependency declared ----------------

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# import name -> distribution name, where they differ
DIST_OF = {"PIL": "pillow", "sqlite_utils": "sqlite-utils", "yaml": "pyyaml", "zmq": "pyzmq"}


def _pyproject() -> dict:
    if tomllib is None:
        pytest.skip("tomllib needs Python 3.11")
    with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
        return tomllib.load(f)


def _dist(req: str) -> str:
    return re.split(r"[<>=!~\[; ]", req, maxsplit=1)[0].strip().lower().replace("_", "-")


def test_version_has_one_source():
    project = _pyproject()["project"]
    assert "version" not in project and "version" in project.get("dynamic", [])
    attr = _pyproject()["tool"]["setuptools"]["dynamic"]["version"]["attr"]
    assert attr == "resumewds.__version__"
    assert re.fullmatch(r"\d+\.\d+\.\d+([a-z]+\d+)?", resumewds.__version__)


def test_every_imported_third_party_module_is_declared():
    project = _pyproject()["project"]
    declared = {_dist(r) for r in project["dependencies"]}
    for reqs in project.get("optional-dependencies", {}).values():
        declared |= {_dist(r) for r in reqs}
    stdlib = set(getattr(sys, "stdlib_module_names", ())) or None
    if stdlib is None:  # pragma: no cover
        pytest.skip("sys.stdlib_module_names needs Python 3.10")
    missing = {}
    for root, _, files in os.walk(os.path.join(REPO, "resumewds")):
        for n in files:
            if not n.endswith(".py"):
                continue
            path = os.path.join(root, n)
            with open(path, encoding="utf-8") as f:
                tree = ast.parse(f.read(), path)
            for node in ast.walk(tree):
                if isinstance(node, ast.Import):
                    tops = [a.name.split(".")[0] for a in node.names]
                elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                    tops = [node.module.split(".")[0]]
                else:
                    continue
                for top in tops:
                    if top in stdlib or top == "resumewds":
                        continue
                    if DIST_OF.get(top, top).lower().replace("_", "-") not in declared:
                        missing.setdefault(top, os.path.relpath(path, REPO))
    assert not missing, f"imported but not declared in pyproject.toml: {missing}"


def test_package_is_typed_and_licensed():
    assert os.path.exists(os.path.join(REPO, "resumewds", "py.typed"))
    assert "py.typed" in _pyproject()["tool"]["setuptools"]["package-data"]["resumewds"]
    with open(os.path.join(REPO, "LICENSE"), encoding="utf-8") as f:
        assert "Apache License" in f.read(2000)
    assert _pyproject()["project"]["license"] == {"text": "Apache-2.0"}


def test_chaos_imports_as_a_package():
    # pyproject's pythonpath puts the repository root on sys.path: no hack in the tests
    import chaos.faultserver

    assert os.path.dirname(os.path.dirname(chaos.faultserver.__file__)) == REPO


def test_lint_and_type_checks_are_pinned_and_run_by_ci():
    # the `dev` extra pins the tools (a new release's new rules must not fail CI
    # by themselves) and .ci/run runs both on the whole repository, failing on findings
    dev = {_dist(r): r for r in _pyproject()["project"]["optional-dependencies"]["dev"]}
    assert re.fullmatch(r"ruff==\d+\.\d+\.\d+", dev["ruff"]) and re.fullmatch(r"mypy==\d+\.\d+\.\d+", dev["mypy"])
    with open(os.path.join(REPO, ".ci", "run"), encoding="utf-8") as f:
        lines = f.read().splitlines()
    step = [ln for ln in lines if "ruff check ." in ln]
    assert step == ["pip install -e '.[dev]' && ruff check . && mypy"]
    after = lines[lines.index(step[0]) + 1]
    assert after == 'rc=$?; [ "$rc" -eq 0 ] || exit "$rc"'  # a failing pip or ruff stops the run too
    assert _pyproject()["tool"]["mypy"]["files"] == ["resumewds"]
