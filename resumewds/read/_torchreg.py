"""Make resumewds datasets ``torch.utils.data.IterableDataset``s without importing torch.

torch's ``IterableDataset`` is an ABC: ``IterableDataset.register(cls)`` passes
every check ``DataLoader`` makes.  It is done once ``torch.utils.data.dataset``
exists: at once, or right after its import (a meta-path hook that wraps that
one module's loader and then removes itself).

Example:
    >>> class Demo: ...
    >>> register_iterable_dataset(Demo)    # doctest: +SKIP
    >>> import torch.utils.data            # doctest: +SKIP
    >>> isinstance(Demo(), torch.utils.data.IterableDataset)  # doctest: +SKIP
    True
"""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
import threading
from typing import Any, List, Optional

_TARGET = "torch.utils.data.dataset"
_pending: List[type] = []
_lock = threading.Lock()
_hook: Optional[_Hook] = None


def _register_now(mod: Any) -> None:
    base = getattr(mod, "IterableDataset", None)
    if base is None:
        return
    with _lock:
        todo = list(_pending)
    for cls in todo:
        if not issubclass(cls, base):
            base.register(cls)


class _Loader(importlib.abc.Loader):
    def __init__(self, inner: Any):
        self.inner = inner

    def create_module(self, spec: Any) -> Any:
        return self.inner.create_module(spec)

    def exec_module(self, module: Any) -> None:
        self.inner.exec_module(module)
        _register_now(module)


class _Hook(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != _TARGET:
            return None
        _remove_hook()
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return spec
        spec.loader = _Loader(spec.loader)
        return spec


def _remove_hook() -> None:
    global _hook
    with _lock:
        if _hook is not None and _hook in sys.meta_path:
            sys.meta_path.remove(_hook)
        _hook = None


def register_iterable_dataset(cls: type) -> type:
    """Register ``cls`` as a virtual subclass of torch's ``IterableDataset`` (now or on import).

    Returns ``cls`` (usable as a class decorator).
    """
    global _hook
    with _lock:
        _pending.append(cls)
    mod = sys.modules.get(_TARGET)
    if mod is not None and getattr(mod, "IterableDataset", None) is not None:
        _register_now(mod)
        return cls
    with _lock:
        if _hook is None:
            _hook = _Hook()
            sys.meta_path.insert(0, _hook)
    return cls
