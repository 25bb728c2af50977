"""Each package's public names are exactly its ``__all__``.

A name without a leading underscore that a package holds is API: it is in
``__all__`` (and documented there), or it is not in the package.  Submodules
and the ``from __future__ import annotations`` flag are not names of the API.
"""

from __future__ import annotations
import __future__

import importlib
import types

import pytest

PACKAGES = ["resumewds.fetch", "resumewds.cache", "resumewds.journal", "resumewds.wds"]


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


@pytest.mark.parametrize("package", PACKAGES)
def test_public_names_are_all(package):
    module = importlib.import_module(package)
    assert _public(module) == set(module.__all__)
    assert len(module.__all__) == len(set(module.__all__))


def test_resumewds_all_names_resolve():
    import resumewds

    missing = [n for n in resumewds.__all__ if not hasattr(resumewds, n)]
    assert not missing
