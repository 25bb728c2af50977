"""``WebLoader``: the engine's loader with webdataset's fluent loader methods.

:class:`WebLoader` (defined in the wing, :mod:`resumewds.wds.loaderchain`)
composes :class:`resumewds.shardloader.ShardLoader` (torch's DataLoader with
an exact, layout-independent resume: ``state_dict``, ``commit``, the
journal, preemption, stats) with :class:`resumewds.wds.loaderchain.FluentLoader`
(webdataset's ``.unbatched().shuffle(n).batched(m).with_epoch(k)`` on a
loader), and takes webdataset's rules for data sets the plan cannot see
through (:func:`resumewds.wds.loaderchain.route`).  This module and the
package's ``__init__`` present the wing's names; the core imports neither.

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

from .wds.loaderchain import STATE_FORMAT, BatchInfo, EmptyBatch, WebLoader

__all__ = ["STATE_FORMAT", "BatchInfo", "EmptyBatch", "WebLoader"]
