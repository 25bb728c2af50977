"""``WebLoader``: the engine's loader with webdataset's fluent loader methods.

:class:`WebLoader` (defined in the wing, :mod:`resumewds.wds.loaderchain`)
composes :class:`resumewds.run.ShardLoader` (torch's DataLoader with
an exact, layout-independent resume: ``state_dict``, ``commit``, the
journal, preemption, stats) with :class:`resumewds.wds.loaderchain.FluentLoader`
(webdataset's ``.unbatched().shuffle(n).batched(m).with_epoch(k)`` on a
loader), and takes webdataset's rules for data sets the plan cannot see
through (:func:`resumewds.wds.loaderchain.route`).  This module and the
package's ``__init__`` present the wing's names; the core imports neither.

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
