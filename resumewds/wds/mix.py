"""webdataset's ``mix`` module: ``RoundRobin``, ``RandomMix`` and ``random_samples``.

:class:`RoundRobin` interleaves datasets one item each in turn, with
webdataset 1.0.2's semantics: it stops when the first source runs out
(``longest=False``, even in the middle of a round), or goes on with the
remaining sources until all are exhausted (``longest=True``).  It is a torch
``IterableDataset`` once torch is imported.  This module imports torch
(:class:`StreamMix` is a torch ``IterableDataset``, as webdataset's ``RandomMix``).

:func:`RandomMix` picks the form by its sources:

* every source is a data set resumewds runs exactly (a ``WebDataset`` or a
  compiled ``DataPipeline``, neither batched nor with stages after its
  compiled part): :class:`resumewds.MixedDataset`, deterministic and exactly
  resumable at any worker count (:func:`resumewds.mixing.RandomMix`,
  ``docs/MIXTURES.md``);
* anything else (a ``DataPipeline`` with a stage of your own, batched
  sources, any iterable): :class:`StreamMix`, webdataset's ``RandomMix``:
  each item is drawn from a source with :func:`random_samples` (Python's
  ``random``), so it gives webdataset's data.  It keeps no state: its resume
  is approximate, as webdataset's (under ``WebLoader`` it runs as
  webdataset's loader, which says so; ``state_dict()["exact"]`` is False).

Resume: ``RoundRobin`` and ``StreamMix`` keep no state of their own and are
not exactly resumable (nor are webdataset's).

Example:
    >>> list(RoundRobin([[1, 2, 3], "ab"]))
    [1, 'a', 2, 'b', 3]
    >>> list(RoundRobin([[1, 2, 3], "ab"], longest=True))
    [1, 'a', 2, 'b', 3]
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
    """One item from each iterator in turn, until one of them is exhausted.

    Example:
        >>> list(round_robin_shortest(iter([1, 2]), iter("abc")))
        [1, 'a', 2, 'b']
    """
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
    """One item from each iterator in turn; an exhausted one drops out, until none is left.

    Example:
        >>> list(round_robin_longest(iter([1, 2]), iter("abc")))
        [1, 'a', 2, 'b', 'c']
    """
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
    """Interleave ``datasets`` round-robin (webdataset's ``RoundRobin``).

    Args:
        datasets: iterables (our datasets, pipelines, lists, arrays...);
            each is iterated afresh by every ``iter(...)``.
        longest: go on until every source is exhausted (default: stop at
            the first exhausted one).

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
    """Items drawn from ``sources`` at random, by ``probs`` (webdataset's ``random_samples``).

    Each draw is ``random.random()`` (Python's global generator, as webdataset's:
    ``random.seed`` makes it repeatable) against the cumulative normalised
    ``probs`` (default: equal).  An exhausted source ends the stream, or with
    ``longest=True`` drops out (its probability too) until none is left.
    ``sources`` (a list) is consumed.

    Example:
        >>> random.seed(1)
        >>> list(random_samples([iter("ab"), iter("xy")], [1, 3]))
        ['a', 'x', 'y']
    """
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
    """webdataset's ``RandomMix``: items of ``datasets`` drawn at random by ``probs``.

    Each ``iter()`` iterates every dataset afresh and draws with
    :func:`random_samples`.  It keeps no state (its resume is approximate,
    as webdataset's); :func:`RandomMix` gives it for sources resumewds
    cannot mix exactly.

    Args:
        datasets: the sources (any iterables).
        probs: relative probabilities (default: equal).
        longest: go on until every source is exhausted (default: stop at the first).

    Example:
        >>> random.seed(0)
        >>> sorted(StreamMix([[1, 2], [3]], longest=True))
        [1, 2, 3]
    """

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
    """Whether :class:`resumewds.MixedDataset` can mix ``ds`` exactly: a data set of the
    plan (``WebDataset``, a compiled ``DataPipeline``), not batched, with no stage after
    its compiled part (the mixture runs a source's per-sample stages only).

    Example:
        >>> exact_source([1, 2, 3])
        False
    """
    c = getattr(ds, "compiled", None)  # a DataPipeline's compiled form
    if c is not None and (c.generic or c.tail):
        return False
    specs = getattr(ds, "stage_specs", None)
    if specs is None or not hasattr(ds, "iter_steps") or getattr(ds, "batch_size", None) is not None:
        return False
    return not specs[ds.stream_from:]


def RandomMix(datasets: Sequence[Any], probs: Optional[Sequence[float]] = None,
              longest: bool = False) -> Union[MixedDataset, StreamMix]:
    """webdataset's ``RandomMix(datasets, probs=None, longest=False)``.

    Sources resumewds runs exactly (:func:`exact_source`) give the
    deterministic, exactly resumable :class:`resumewds.MixedDataset`
    (:func:`resumewds.mixing.RandomMix`); any other source gives
    :class:`StreamMix`, webdataset's own mixing (its data, an approximate
    resume).  See the module docs.

    Example:
        >>> type(RandomMix([[1, 2], [3]])).__name__
        'StreamMix'
    """
    datasets = list(datasets)
    if datasets and all(exact_source(d) for d in datasets):
        return ExactRandomMix(datasets, probs=probs, longest=longest)
    return StreamMix(datasets, probs=probs, longest=longest)
