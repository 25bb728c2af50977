"""webdataset's ``pytorch`` module: torch's ``DataLoader``, ``IterableDataset`` and ``Tensor``.

As in webdataset, each is torch's own when torch is installed, else an empty
stand-in class (so that code naming them imports without torch).  Importing
this module imports torch; the other wing modules that have these names
(webdataset's ``compat.DataLoader``, ``shardlists.IterableDataset``,
``filters.TorchTensor``...) resolve them from here on first use.

Example:
    >>> import torch.utils.data
    >>> IterableDataset is torch.utils.data.IterableDataset
    True
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
    """``name`` (one of ``__all__`` but this) for a module's PEP 562 ``__getattr__``: the
    torch names webdataset's modules import, loaded (with torch) on first use.

    Raises:
        AttributeError: any other name (the module has no such attribute).

    Example:
        >>> torch_name("resumewds.shardlists", "IterableDataset") is IterableDataset
        True
    """
    if name in ("DataLoader", "IterableDataset", "TorchTensor"):
        return globals()[name]
    raise AttributeError(f"module {module!r} has no attribute {name!r}")
