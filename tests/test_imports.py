"""Import hygiene and the public surface.

torch stays out of the modules that do not need it (fetch, cache, journal,
plan, tar reading, CLI start-up); every public name resolves and documents
itself with an example.
"""

from __future__ import annotations

import inspect
import subprocess
import sys

import resumewds

LIGHT = ["resumewds", "resumewds.cli", "resumewds.fetch", "resumewds.cache", "resumewds.journal",
         "resumewds.plan", "resumewds.tario", "resumewds.manifest", "resumewds.sources",
         "resumewds.dataset", "resumewds.stats", "resumewds.errors"]


def test_core_modules_do_not_import_torch():
    code = ("import sys\n" + "".join(f"import {m}\n" for m in LIGHT)
            + "bad = [m for m in sys.modules if m == 'torch' or m.startswith('torch.')]\n"
            + "print(len(bad))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "0"


def test_cli_help_does_not_import_torch():
    code = ("import sys\nfrom resumewds.cli import main\n"
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
