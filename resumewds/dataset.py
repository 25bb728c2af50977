"""``WebDataset``: the engine's data set with webdataset's constructor and fluent methods.

:class:`WebDataset` (:mod:`resumewds.wds.webdataset`) is the engine's
:class:`resumewds.read.ShardDataset` with webdataset 1.0.2's constructor and
fluent methods; the core does not import this module.

Example:
    >>> ds = (WebDataset("data/shard-{000000..000003}.tar", seed=7, shuffle=True)  # doctest: +SKIP
    ...       .decode("pil").to_tuple("jpg;png", "cls"))
    >>> img, cls = next(iter(ds))                                                 # doctest: +SKIP
"""

from __future__ import annotations

from .sources import build_manifest, index_manifest
from .wds.webdataset import WebDataset

__all__ = ["WebDataset", "build_manifest", "index_manifest"]
