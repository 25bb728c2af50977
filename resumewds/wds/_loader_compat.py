"""The attributes of ``torch.utils.data.DataLoader`` that frameworks read from a loader.

Lightning, Accelerate and ``transformers.Trainer`` read some of a DataLoader's attributes
(``drop_last``, ``sampler``, ``num_workers``...) and ``len(loader)``: :class:`DataLoaderAttributes`
gives :class:`resumewds.WebLoader` the values that describe what it does, and a ``__len__`` that
counts a *whole* epoch on this rank whatever the position (so a resumed framework sizes epochs right).

Example:
    >>> import resumewds as rw
    >>> ds = rw.WebDataset("data/shard-{000000..000003}.tar")
    >>> loader = rw.WebLoader(ds, batch_size=8, drop_last=True)
    >>> (loader.drop_last, loader.sampler, loader.batch_sampler, loader.timeout, len(loader))
    (True, None, None, 0, 4)
    >>> loader.position = 16                  # two batches into the epoch
    >>> len(loader), loader.batches_left
    (4, 2)
"""

from __future__ import annotations

from typing import Any, Dict, Optional

from ..stages import Handled

__all__ = ["DataLoaderAttributes"]


def _dropping_stage(dataset: Any) -> Optional[str]:
    """What in ``dataset`` may drop a sample before it is handed out, None if nothing does."""
    if getattr(dataset, "handler", None) is not None:
        return "the data set's handler"
    specs = getattr(dataset, "stage_specs", ())
    for st in specs[:getattr(dataset, "stream_from", 0)]:
        if st.name == "select":
            return "a .select(...)"
        if isinstance(st.fn, Handled):  # a stage run under a handler
            return f"a .{st.name}(..., handler=...)"
    return None


#: torch's DataLoader defaults for what WebLoader passes on to it
_DEFAULTS: Dict[str, Any] = {
    "pin_memory": False,
    "timeout": 0,
    "worker_init_fn": None,
    "multiprocessing_context": None,
    "generator": None,
    "persistent_workers": False,
    "pin_memory_device": "",
    "in_order": True,
}


class DataLoaderAttributes:
    """A mixin of an engine loader: DataLoader's read-only attributes and an epoch-sized ``__len__``."""

    remainder: str
    layout: Any
    dataset: Any
    epoch: int
    config: Dict[str, Any]
    position: int
    batch_size: Optional[int]
    world_size: int
    num_workers: int
    dataloader_kwargs: Dict[str, Any]
    _collate_fn: Any

    @property
    def sampler(self) -> None:
        """None: the order is the dataset's plan (its seed and shuffle settings)."""
        return None

    @property
    def batch_sampler(self) -> None:
        """None, as for a DataLoader over an IterableDataset."""
        return None

    @property
    def drop_last(self) -> bool:
        """Whether the short last batch of an epoch is dropped (``remainder="drop"``)."""
        return self.remainder == "drop"

    @property
    def collate_fn(self) -> Any:
        """The collate function of batches (None with ``batch_size=None``)."""
        return self._collate_fn

    def _dl_kwarg(self, name: str) -> Any:
        return self.dataloader_kwargs.get(name, _DEFAULTS[name])

    @property
    def pin_memory(self) -> bool:
        return bool(self._dl_kwarg("pin_memory"))

    @property
    def timeout(self) -> float:
        return self._dl_kwarg("timeout")

    @property
    def worker_init_fn(self) -> Any:
        return self._dl_kwarg("worker_init_fn")

    @property
    def multiprocessing_context(self) -> Any:
        return self._dl_kwarg("multiprocessing_context")

    @property
    def generator(self) -> Any:
        return self._dl_kwarg("generator")

    @property
    def persistent_workers(self) -> bool:
        return bool(self._dl_kwarg("persistent_workers"))

    @property
    def pin_memory_device(self) -> str:
        return self._dl_kwarg("pin_memory_device")

    @property
    def in_order(self) -> bool:
        return True  # always: the loader checks every step number it receives

    @property
    def prefetch_factor(self) -> Optional[int]:
        """As torch's DataLoader: None without workers, else the given value (default 2)."""
        if self.num_workers == 0:
            return None
        value = self.dataloader_kwargs.get("prefetch_factor")
        return 2 if value is None else int(value)

    def _take_world(self) -> None:
        """The loader's: a world set up after it was built (frameworks read ``len`` before iterating)."""

    def _items(self, start: int) -> int:
        """Items (batches, or samples with ``batch_size=None``) from ``start`` to the epoch's end.

        Raises:
            TypeError: one item per sample over stages that may drop samples.
        """
        dropping = _dropping_stage(self.dataset) if self.batch_size is None else None
        if dropping is not None:
            raise TypeError(f"len() of this WebLoader is unknown: it hands out one item per sample "
                            f"(batch_size=None) and {dropping} may drop samples, so how many items an epoch has "
                            "is known only once it is read (webdataset's loaders have no len() at all). A trainer "
                            "then runs each epoch to its end; give a length with .with_length(n) if one needs it, "
                            "or let the WebLoader batch (batch_size=B: batches of B positions, a dropped sample "
                            "makes its batch shorter, so len() is exact)")
        self._take_world()
        total = int(self.config["samples"])
        layout = self._layout_of(self.epoch)
        n = layout.num_steps(total, start)
        if self.batch_size is None:
            if self.world_size == 1:
                return max(0, layout.end(total) - start)
            return n * layout.batch_size
        return n

    def _layout_of(self, epoch: int) -> Any:
        """The layout of epoch ``epoch``'s steps (the loader's: a shard split's depend on the epoch)."""
        return self.layout

    def __len__(self) -> int:
        """Batches in a whole epoch on this rank (samples with ``batch_size=None``; see :attr:`batches_left`).

        A ``TypeError`` with ``batch_size=None`` over stages that may drop samples, as torch gives
        for an iterable of unknown length.
        """
        return self._items(0)

    def __bool__(self) -> bool:
        """Always true (``if loader:`` does not ask for the length)."""
        return True

    @property
    def batches_left(self) -> int:
        """Batches (samples with ``batch_size=None``) left in the current epoch, from the position."""
        return self._items(self.position)
