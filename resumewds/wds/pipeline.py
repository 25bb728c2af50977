"""webdataset's ``pipeline`` module: ``DataPipeline`` (loaded on first use), and the stage
callables of :mod:`resumewds.stages`.
"""

from __future__ import annotations

from typing import Any

from ..autodecode import Decoder, decode_image
from ..errors import HandlerStop
from ..stages import (
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
    default_collate,
    default_collation_fn,
    getfirst,
    list_collate,
)
from .utils import PipelineStage, add_length_method

__all__ = ["DataPipeline",  # noqa: F822  (module __getattr__: loaded on first use)
           "Decoder", "ExtractKeys", "FieldError", "Handled", "HandlerStop", "Map", "MapDict",
           "MapTuple", "PipelineStage", "Rename", "RenameKeys", "SampleTypeError", "Select", "SelectFiles", "Stage",
           "ToTuple", "add_length_method", "decode_image", "default_collate", "default_collation_fn", "getfirst",
           "list_collate"]


def __getattr__(name: str) -> Any:
    if name == "DataPipeline":
        from .datapipeline import DataPipeline  # lazy: a torch IterableDataset (imports torch)

        return DataPipeline
    from .pytorch import torch_name  # lazy: DataLoader, IterableDataset (imports torch)

    return torch_name(__name__, name)
