"""webdataset's ``pipeline`` module: ``DataPipeline``, and the stage callables.

``resumewds.pipeline.DataPipeline`` is :class:`resumewds.wds.datapipeline.DataPipeline`
(loaded on first use: it is a torch ``IterableDataset``).  The per-sample stage
callables and collations that resumewds has always offered here are those of
:mod:`resumewds.stages`, the one implementation of each stage.

Example:
    >>> from resumewds.pipeline import ToTuple
    >>> ToTuple("txt")({"txt": "hi"})
    ('hi',)
"""

from __future__ import annotations

from typing import Any

from ..errors import HandlerStop
from ..stages import (
    Decoder,
    ExtractKeys,
    FieldError,
    Handled,
    Map,
    MapDict,
    MapTuple,
    Rename,
    RenameKeys,
    SampleTypeError,
    Select,
    SelectFiles,
    Stage,
    ToTuple,
    decode_image,
    default_collate,
    default_collation_fn,
    getfirst,
    list_collate,
)
from .utils import PipelineStage

__all__ = ["DataPipeline",  # noqa: F822  (module __getattr__: loaded on first use)
           "Decoder", "ExtractKeys", "FieldError", "Handled", "HandlerStop", "Map", "MapDict",
           "MapTuple", "PipelineStage", "Rename", "RenameKeys", "SampleTypeError", "Select", "SelectFiles", "Stage",
           "ToTuple", "add_length_method", "decode_image", "default_collate", "default_collation_fn", "getfirst",
           "list_collate"]


def add_length_method(obj: Any) -> Any:
    """Give ``obj`` a ``__len__`` returning ``obj.size`` (its class becomes a subclass
    ``<name>_Length``), as webdataset's ``with_length`` does; returns ``obj``.

    Example:
        >>> class P: size = 3
        >>> len(add_length_method(P()))
        3
    """

    def length(self: Any) -> int:
        return self.size

    obj.__class__ = type(obj.__class__.__name__ + "_Length", (obj.__class__,), {"__len__": length})
    return obj


def __getattr__(name: str) -> Any:
    if name == "DataPipeline":
        from .datapipeline import DataPipeline  # lazy: a torch IterableDataset (imports torch)

        return DataPipeline
    from .pytorch import torch_name  # lazy: DataLoader, IterableDataset (imports torch)

    return torch_name(__name__, name)
