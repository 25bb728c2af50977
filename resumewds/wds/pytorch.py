"""webdataset's ``pytorch`` module: torch's ``DataLoader``, ``IterableDataset`` and ``Tensor``.

The wing's other modules that have these names resolve them from here on first use.
"""

from __future__ import annotations

from typing import Any

from torch import Tensor as TorchTensor
from torch.utils.data import DataLoader, IterableDataset

__all__ = ["DataLoader", "IterableDataset", "TorchTensor", "torch_name"]


def torch_name(module: str, name: str) -> Any:
    """``name`` for a module's PEP 562 ``__getattr__``: the torch names, loaded on first use.

    Example:
        >>> torch_name("resumewds.shardlists", "IterableDataset") is IterableDataset
        True
    """
    if name in ("DataLoader", "IterableDataset", "TorchTensor"):
        return globals()[name]
    raise AttributeError(f"module {module!r} has no attribute {name!r}")
