"""``WebLoader``: the engine's loader with webdataset's fluent loader methods.

:class:`WebLoader` (:mod:`resumewds.wds.loaderchain`) is
:class:`resumewds.run.ShardLoader` (exact, layout-independent resume) with
webdataset's fluent loader methods; the core does not import this module.

Example:
    >>> import resumewds as rw
    >>> ds = rw.WebDataset("data/shard-{000000..000003}.tar", seed=7, shuffle=True).map(lambda s: s["__key__"])
    >>> loader = rw.WebLoader(ds, batch_size=4)
    >>> it = iter(loader)
    >>> first = next(it)
    >>> state = loader.state_dict()
    >>> fresh = rw.WebLoader(ds, batch_size=4)   # any num_workers, another process...
    >>> fresh.load_state_dict(state)
    >>> next(iter(fresh)) == next(it)            # the batch `loader` gives next
    True
"""

from __future__ import annotations

from .wds.loaderchain import STATE_FORMAT, BatchInfo, EmptyBatch, WebLoader

__all__ = ["STATE_FORMAT", "BatchInfo", "EmptyBatch", "WebLoader"]
