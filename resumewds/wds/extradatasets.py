"""webdataset's ``extradatasets`` module: ``MockDataset``, ``repeatedly``, ``with_epoch``, ``with_length``.

webdataset 1.0.2's classes here lack the methods that would run them; each of these does what
its docstring there says, as a torch ``IterableDataset`` and as a pipeline stage.  They run on
the stream and keep no state (the fluent ``.repeat()`` / ``.with_epoch(n)`` keep exact resume).

Example:
    >>> list(with_epoch([1, 2, 3], 2)), len(with_length([1, 2, 3], 10))
    ([1, 2], 10)
"""

from __future__ import annotations

from typing import Any, Iterable, Iterator, Optional

from torch.utils.data import IterableDataset

from . import utils
from .compat import MockDataset
from .utils import PipelineStage

__all__ = ["IterableDataset", "MockDataset", "PipelineStage", "repeatedly", "with_epoch", "with_length"]


class repeatedly(IterableDataset, PipelineStage):
    """``source`` iterated again and again (:func:`resumewds.utils.repeatedly`); ``len()`` is ``length``.

    Example:
        >>> list(repeatedly([1, 2], nepochs=2))
        [1, 2, 1, 2]
    """

    def __init__(self, source: Iterable[Any], nepochs: Optional[int] = None, nbatches: Optional[int] = None,
                 length: Optional[int] = None):
        super().__init__()
        self.source, self.nepochs, self.nbatches, self.length = source, nepochs, nbatches, length

    def invoke(self, source: Iterable[Any]) -> Iterator[Any]:
        """``source`` repeated (the stage form)."""
        return utils.repeatedly(source, nepochs=self.nepochs, nbatches=self.nbatches)

    run = invoke

    def __iter__(self) -> Iterator[Any]:
        return self.invoke(self.source)

    def __len__(self) -> int:
        if self.length is None:
            raise TypeError("repeatedly(...) has no len() without length=")
        return int(self.length)


class with_epoch(IterableDataset):
    """``length`` items of ``dataset`` per ``iter()``, the next ``iter()`` continuing where this one
    stopped (webdataset's nominal epoch).

    Example:
        >>> e = with_epoch([1, 2, 3], 2)
        >>> list(e), list(e)
        ([1, 2], [3, 1])
    """

    def __init__(self, dataset: Iterable[Any], length: int):
        super().__init__()
        self.dataset, self.length = dataset, int(length)
        self.source: Optional[Iterator[Any]] = None

    def __getstate__(self) -> dict:
        d = dict(self.__dict__)
        d["source"] = None  # an iterator does not pickle: a copy starts the dataset again
        return d

    def invoke(self, dataset: Iterable[Any]) -> Iterator[Any]:
        """``length`` items of ``dataset``, continuing the iterator kept between calls."""
        if self.source is None:
            self.source = iter(dataset)
        for _ in range(self.length):
            try:
                sample = next(self.source)
            except StopIteration:
                self.source = iter(dataset)
                try:
                    sample = next(self.source)
                except StopIteration:
                    return
            yield sample

    def __iter__(self) -> Iterator[Any]:
        return self.invoke(self.dataset)

    def __len__(self) -> int:
        return self.length


class with_length(IterableDataset, PipelineStage):
    """``dataset`` as it is, with ``len()`` = ``length`` (for loaders that ask for one).

    Example:
        >>> list(with_length([1, 2], 5)), len(with_length([1, 2], 5))
        ([1, 2], 5)
    """

    def __init__(self, dataset: Iterable[Any], length: int):
        super().__init__()
        self.dataset, self.length = dataset, int(length)

    def invoke(self, dataset: Iterable[Any]) -> Iterator[Any]:
        """``iter(dataset)`` (the stage form)."""
        return iter(dataset)

    run = invoke

    def __iter__(self) -> Iterator[Any]:
        return iter(self.dataset)

    def __len__(self) -> int:
        return self.length
