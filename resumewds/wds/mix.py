"""webdataset's ``mix`` module: ``RoundRobin``, ``RandomMix`` and ``random_samples``.

:class:`RoundRobin` and :class:`StreamMix` (webdataset's ``RandomMix``) have webdataset 1.0.2's
semantics and keep no state.  :func:`RandomMix` gives the exact :class:`resumewds.MixedDataset`
where every source is one resumewds runs exactly (:func:`exact_source`), else :class:`StreamMix`.

Example:
    >>> list(RoundRobin([[1], "abc"], longest=True))
    [1, 'a', 'b', 'c']
    >>> import random; random.seed(0)
    >>> "".join(StreamMix(["aaaa", "bbbb"], longest=True))
    'bbaababa'
"""

from __future__ import annotations

import random
from typing import Any, Iterable, Iterator, List, Optional, Sequence, Union

import numpy as np
from torch.utils.data import IterableDataset

from ..mixing import MixedDataset
from ..mixing import RandomMix as ExactRandomMix
from ..read import register_iterable_dataset

__all__ = ["RandomMix", "RoundRobin", "StreamMix", "random_samples", "round_robin_longest",
           "round_robin_shortest"]


def round_robin_shortest(*sources: Iterator[Any]) -> Iterator[Any]:
    """One item from each iterator in turn, until one of them is exhausted."""
    if not sources:
        return
    i = 0
    while True:
        try:
            item = next(sources[i % len(sources)])
        except StopIteration:
            return
        yield item
        i += 1


def round_robin_longest(*sources: Iterator[Any]) -> Iterator[Any]:
    """One item from each iterator in turn; an exhausted one drops out, until none is left."""
    live: List[Iterator[Any]] = list(sources)
    i = 0
    while live:
        i %= len(live)
        try:
            item = next(live[i])
        except StopIteration:
            del live[i]
            continue
        i += 1
        yield item


class RoundRobin:
    """Interleave ``datasets`` round-robin, each iterated afresh by every ``iter(...)`` (webdataset's).

    Example:
        >>> list(RoundRobin([range(3), range(10, 12)]))
        [0, 10, 1, 11, 2]
    """

    def __init__(self, datasets: Sequence[Iterable[Any]], longest: bool = False):
        self.datasets = list(datasets)
        self.longest = bool(longest)

    def __iter__(self) -> Iterator[Any]:
        sources = [iter(d) for d in self.datasets]
        return round_robin_longest(*sources) if self.longest else round_robin_shortest(*sources)

    def __repr__(self) -> str:
        return f"RoundRobin({len(self.datasets)} datasets, longest={self.longest})"


register_iterable_dataset(RoundRobin)


def random_samples(sources: List[Iterator[Any]], probs: Optional[Sequence[float]] = None,
                   longest: bool = False) -> Iterator[Any]:
    """Items drawn from ``sources`` at random, by ``probs`` (webdataset's ``random_samples``)."""
    probs = [1] * len(sources) if probs is None else list(probs)
    while len(sources) > 0:
        cum = (np.array(probs) / np.sum(probs)).cumsum()
        i = int(np.searchsorted(cum, random.random()))
        try:
            yield next(sources[i])
        except StopIteration:
            if not longest:
                break
            del sources[i]
            del probs[i]


class StreamMix(IterableDataset):
    """webdataset's ``RandomMix``: items of ``datasets`` drawn at random by ``probs`` (no state)."""

    def __init__(self, datasets: Sequence[Iterable[Any]], probs: Optional[Sequence[float]] = None,
                 longest: bool = False):
        super().__init__()
        self.datasets = datasets
        self.probs = probs
        self.longest = longest

    def __iter__(self) -> Iterator[Any]:
        return random_samples([iter(d) for d in self.datasets], self.probs, longest=self.longest)

    def __repr__(self) -> str:
        return f"StreamMix({len(self.datasets)} datasets, probs={self.probs}, longest={self.longest})"


def exact_source(ds: Any) -> bool:
    """Whether :class:`resumewds.MixedDataset` can mix ``ds`` exactly (a plan's, unbatched, no stream stage)."""
    c = getattr(ds, "compiled", None)  # a DataPipeline's compiled form
    if c is not None and (c.generic or c.tail):
        return False
    specs = getattr(ds, "stage_specs", None)
    if specs is None or not hasattr(ds, "iter_steps") or getattr(ds, "batch_size", None) is not None:
        return False
    return not specs[ds.stream_from:]


def RandomMix(datasets: Sequence[Any], probs: Optional[Sequence[float]] = None,
              longest: bool = False) -> Union[MixedDataset, StreamMix]:
    """webdataset's ``RandomMix(datasets, probs=None, longest=False)`` (see the module docs).

    Example:
        >>> type(RandomMix([[1, 2], [3]])).__name__
        'StreamMix'
    """
    datasets = list(datasets)
    if datasets and all(exact_source(d) for d in datasets):
        return ExactRandomMix(datasets, probs=probs, longest=longest)
    return StreamMix(datasets, probs=probs, longest=longest)
