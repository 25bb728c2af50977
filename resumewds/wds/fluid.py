"""``FluidWrapper``: webdataset's fluent interface around any iterable.

``FluidWrapper(initial)`` is ``DataPipeline(initial)`` with the fluent stage methods, as in
webdataset 1.0.2: over an arbitrary iterable it runs as webdataset's (not exactly resumable,
``.exact`` is False).  This module imports torch.
"""

from __future__ import annotations

from typing import Any

from .datapipeline import DataPipeline

__all__ = ["FluidWrapper"]


class FluidWrapper(DataPipeline):
    """``DataPipeline(initial, *more, **kw)`` with webdataset's fluent methods."""

    def __init__(self, initial: Any, *more: Any, **kw: Any):
        super().__init__(initial, *more, **kw)
