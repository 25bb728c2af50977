"""A package face whose names load their modules on first use (PEP 562).

Where webdataset gives an engine module a name of its own (``cache.FileCache``),
the top-level face says where it lives (:func:`forward`), so that no engine
module names the WebDataset wing.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from typing import Any, Callable, Collection, Dict, Iterable, List, Optional, Tuple

#: (package, name) -> (the module that holds it, whether the name is that module itself)
FORWARDS: Dict[Tuple[str, str], Tuple[str, bool]] = {}


def forward(package: str, names: Iterable[str], module: str, whole: bool = False) -> None:
    """``package.<name>`` is ``module.<name>`` (``whole``: the module itself), found on first use.

    Example:
        >>> forward("json", ["JSONDecodeError"], "json.decoder")
        >>> forwarded("json", "JSONDecodeError").__name__
        'JSONDecodeError'
    """
    for name in names:
        FORWARDS[(package, name)] = (module, whole)


def forwarded(package: str, name: str) -> Any:
    """What :func:`forward` says ``package.<name>`` is; AttributeError for anything else."""
    where = FORWARDS.get((package, name))
    if where is None:
        raise AttributeError(f"module {package!r} has no attribute {name!r}")
    module = importlib.import_module(where[0])
    return module if where[1] else getattr(module, name)


def attach(package: str, names: Dict[str, str], submodules: Optional[Collection[str]] = None
           ) -> Tuple[Callable[[str], Any], Callable[[], List[str]]]:
    """``(__getattr__, __dir__)`` for ``package``: ``names`` maps a name to the module
    (relative to ``package``) that defines it; a forwarded name (:func:`forward`) is found too.
    With ``submodules``, every public submodule is an attribute too (as webdataset's are),
    and the names in ``submodules`` whether or not a file holds them.

    Example:
        >>> import json.encoder
        >>> getattr_, dir_ = attach("json", {"JSONEncoder": "encoder"})
        >>> getattr_("JSONEncoder") is json.encoder.JSONEncoder
        True
    """

    def __getattr__(name: str) -> Any:
        module = names.get(name)
        if module is not None:
            value = getattr(importlib.import_module(f"{package}.{module}"), name)
        elif submodules is not None and (name in submodules or (
                not name.startswith("_") and importlib.util.find_spec(f"{package}.{name}") is not None)):
            value = importlib.import_module(f"{package}.{name}")
        else:
            return forwarded(package, name)
        setattr(sys.modules[package], name, value)  # (found once)
        return value

    def __dir__() -> List[str]:
        face = sys.modules[package]
        return sorted(set(vars(face)) | set(getattr(face, "__all__", ())) | {n for p, n in FORWARDS if p == package})

    return __getattr__, __dir__
