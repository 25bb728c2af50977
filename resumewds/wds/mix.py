"""webdataset's ``mix`` module: ``RoundRobin`` (here) and ``RandomMix``.

:class:`RoundRobin` interleaves datasets one item each in turn, with
webdataset 1.0.2's semantics: it stops when the first source runs out
(``longest=False``, even in the middle of a round), or goes on with the
remaining sources until all are exhausted (``longest=True``).  It is a torch
``IterableDataset`` once torch is imported.

Resume: ``RoundRobin`` keeps no state of its own and is not exactly
resumable (nor is webdataset's).  For an exactly resumable mixture use
:func:`resumewds.RandomMix` / :class:`resumewds.MixedDataset`, which
``WebLoader`` resumes at any worker count.

Example:
    >>> list(RoundRobin([[1, 2, 3], "ab"]))
    [1, 'a', 2, 'b', 3]
    >>> list(RoundRobin([[1, 2, 3], "ab"], longest=True))
    [1, 'a', 2, 'b', 3]
    >>> list(RoundRobin([[1], "abc"], longest=True))
    [1, 'a', 'b', 'c']
"""

from __future__ import annotations

from typing import Any, Iterable, Iterator, List, Sequence

from .._torchreg import register_iterable_dataset
from ..mixdataset import RandomMix

__all__ = ["RandomMix", "RoundRobin", "round_robin_longest", "round_robin_shortest"]


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
