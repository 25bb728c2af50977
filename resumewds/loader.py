"""``WebLoader``: the engine's loader with webdataset's fluent loader methods.

:class:`WebLoader` composes :class:`resumewds.shardloader.ShardLoader` (torch's
DataLoader with an exact, layout-independent resume: ``state_dict``,
``commit``, the journal, preemption, stats) with
:class:`resumewds.wds.loaderchain.FluentLoader` (webdataset's
``.unbatched().shuffle(n).batched(m).with_epoch(k)`` on a loader), and takes
webdataset's rules for data sets the plan cannot see through
(:func:`resumewds.wds.loaderchain.route`).  This module and the package's
``__init__`` are where the core and the WebDataset wing meet.

Example:
    >>> import resumewds as rw                                         # doctest: +SKIP
    >>> ds = rw.WebDataset("d/shard-{0000..0031}.tar", seed=7, shuffle=True)
    >>> loader = rw.WebLoader(ds.decode().to_tuple("txt", "cls"), batch_size=64, num_workers=2)
    >>> for step, (txt, cls) in enumerate(loader): ...
    >>> state = loader.state_dict()
    >>> fresh = rw.WebLoader(<same dataset>, batch_size=64, num_workers=0)
    >>> fresh.load_state_dict(state)   # yields exactly what `loader` would have
"""

from __future__ import annotations

from typing import Any

from .epochsource import BatchInfo, EmptyBatch
from .shardloader import STATE_FORMAT, ShardLoader
from .wds.loaderchain import FluentLoader, route

__all__ = ["STATE_FORMAT", "BatchInfo", "EmptyBatch", "WebLoader"]


class WebLoader(FluentLoader, ShardLoader):
    __doc__ = ShardLoader.__doc__

    def __new__(cls, dataset: Any = None, *args: Any, **kw: Any) -> Any:
        # webdataset's rules where the plan cannot apply them (resumewds/wds/loaderchain.py: route)
        return route(cls, dataset, args, kw) or super().__new__(cls)

