"""``WebDataset``: the engine's data set with webdataset's constructor and fluent methods.

:class:`WebDataset` (defined in the wing, :mod:`resumewds.wds.webdataset`)
composes :class:`resumewds.wds._direct.DirectDataset` (the engine's data set,
:class:`resumewds.read.ShardDataset`, iterable directly) with
:class:`resumewds.wds.webdataset.WebDatasetAPI` (webdataset 1.0.2's
constructor arguments and the fluent methods the engine has no name for).
:func:`build_manifest` and :func:`index_manifest` are :mod:`resumewds.sources`'s.
This module and the package's ``__init__`` present these names; the core
imports neither.

Example:
    >>> ds = (WebDataset("data/shard-{000000..000003}.tar", seed=7, shuffle=True)  # doctest: +SKIP
    ...       .decode("pil").to_tuple("jpg;png", "cls"))
    >>> img, cls = next(iter(ds))                                                 # doctest: +SKIP
"""

from __future__ import annotations

from .sources import build_manifest, index_manifest
from .wds.webdataset import WebDataset

__all__ = ["WebDataset", "build_manifest", "index_manifest"]
