"""webdataset's ``pytorch`` module: torch's ``DataLoader``, ``IterableDataset`` and ``Tensor``.

Each is torch's own, else an empty stand-in class, as webdataset's; the wing's other modules
that have these names resolve them from here on first use.
"""

from __future__ import annotations

from typing import Any

__all__ = ["DataLoader", "IterableDataset", "TorchTensor", "torch_name"]

try:
    from torch.utils.data import DataLoader, IterableDataset
except ModuleNotFoundError:  # pragma: no cover - torch is installed with resumewds's loader

    class IterableDataset:  # type: ignore[no-redef]
        """Empty stand-in for torch's ``IterableDataset`` when torch is not installed."""

    class DataLoader:  # type: ignore[no-redef]
        """Empty stand-in for torch's ``DataLoader`` when torch is not installed."""


try:
    from torch import Tensor as TorchTensor
except ModuleNotFoundError:  # pragma: no cover

    class TorchTensor:  # type: ignore[no-redef]
        """Empty stand-in for torch's ``Tensor`` when torch is not installed."""


def torch_name(module: str, name: str) -> Any:
    """``name`` for a module's PEP 562 ``__getattr__``: the torch names, loaded on first use.

    Example:
        >>> torch_name("resumewds.shardlists", "IterableDataset") is IterableDataset
        True
    """
    if name in ("DataLoader", "IterableDataset", "TorchTensor"):
        return globals()[name]
    raise AttributeError(f"module {module!r} has no attribute {name!r}")
