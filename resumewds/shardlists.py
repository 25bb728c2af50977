"""Shard lists with webdataset's names: the first stage of a :class:`~resumewds.DataPipeline`.

``SimpleShardList(urls)`` and ``ResampledShards(urls)`` iterate ``{"url":
...}`` dicts as in webdataset 1.0.2, so they work as stages of a generic
pipeline.  Inside a :class:`resumewds.DataPipeline` they are not iterated:
the pipeline reads their urls and seed and compiles them into the
deterministic plan (see :mod:`resumewds.datapipeline`).

Differences from webdataset, inside a DataPipeline: ``ResampledShards``
draws every shard once per epoch in a seeded random order, epoch after
epoch, instead of drawing shards with replacement (so a resume is exact and
no shard is over-represented); ``SimpleShardList(urls, seed=s)`` shuffles
the shard order per epoch with the plan's seed.

Example:
    >>> [d["url"] for d in SimpleShardList("s-{0..2}.tar")]
    ['s-0.tar', 's-1.tar', 's-2.tar']
"""

from __future__ import annotations

import os
import random
import re
import sys
import time
from typing import Any, Dict, Iterator, List, Optional, Sequence, Union

from .sources import expand_braces
from .splitters import single_node_only, split_by_node, split_by_worker

__all__ = ["ResampledShardList", "ResampledShards", "SimpleShardList", "expand_source", "expand_urls",
           "envsubst", "non_empty", "resampled", "shardspec", "single_node_only", "split_by_node",
           "split_by_worker"]


def envsubst(s: str) -> str:
    """Replace ``${NAME}`` with the environment variable ``WDS_NAME`` (webdataset's rule).

    Raises:
        ValueError: ``WDS_NAME`` is not set.
    """
    def look(m: "re.Match[str]") -> str:
        key = "WDS_" + m.group(1)
        if key not in os.environ:
            raise ValueError(f"{s}: missing environment variable {key}")
        return os.environ[key]

    return re.sub(r"\$\{(\w+)\}", look, s)


def expand_urls(urls: str) -> List[str]:
    """Expand ``::``-joined brace patterns (and ``${NAME}`` from ``WDS_NAME``) into a list of urls.

    Example:
        >>> expand_urls("a-{0..1}.tar::b.tar")
        ['a-0.tar', 'a-1.tar', 'b.tar']
    """
    out: List[str] = []
    for part in urls.split("::"):
        for _ in range(10):
            last, part = part, envsubst(part)
            if part == last:
                break
        if part:
            out.extend(expand_braces(part))
    return out


def expand_source(source: Union[str, Sequence[str]], max_urls: int = int(1e9)) -> List[str]:
    """A string pattern or a list of urls, as a list (at most ``max_urls``)."""
    urls = expand_urls(source) if isinstance(source, str) else list(source)
    if len(urls) > max_urls:
        raise ValueError(f"{len(urls)} urls, more than max_urls={max_urls}")
    return urls


class SimpleShardList:
    """The shards of ``urls``, in order (or shuffled with ``seed``).

    Args:
        urls: a brace pattern (``::`` joins several) or a list of urls.
        seed: None keeps the order; an int (or True) shuffles it.

    Example:
        >>> len(SimpleShardList(["a.tar", "b.tar"]))
        2
    """

    def __init__(self, urls: Union[str, Sequence[str]], seed: Union[None, bool, int] = None):
        self.urls = expand_urls(urls) if isinstance(urls, str) else list(urls)
        if not self.urls or not all(isinstance(u, str) for u in self.urls):
            raise ValueError(f"SimpleShardList needs a non-empty list of url strings, got {urls!r}")
        if seed is True:
            seed = int(time.time())
        self.seed = seed

    def __len__(self) -> int:
        return len(self.urls)

    def __iter__(self) -> Iterator[Dict[str, str]]:
        urls = list(self.urls)
        if self.seed is not None:
            random.Random(self.seed).shuffle(urls)
        for u in urls:
            yield {"url": u}


class ResampledShards:
    """An endless stream of shards drawn at random from ``urls``.

    Args:
        urls: a brace pattern or a list of urls.
        nshards: how many shards one iteration yields.
        seed: the seed.
        worker_seed, deterministic, max_urls: as webdataset.
        empty_check: refuse an empty list.

    Example:
        >>> rs = ResampledShards(["a.tar", "b.tar"], nshards=3, deterministic=True)
        >>> len([d["url"] for d in rs])
        3
    """

    def __init__(self, urls: Union[str, Sequence[str]], nshards: int = sys.maxsize, seed: int = 0,
                 worker_seed: Any = None, deterministic: bool = False, max_urls: int = int(1e6),
                 empty_check: bool = True):
        self.urls = expand_source(urls, max_urls)
        if empty_check and not self.urls:
            raise ValueError("empty_check=True, but no shards found in ResampledShards")
        self.nshards = nshards
        self.seed = seed
        self.worker_seed = worker_seed
        self.deterministic = deterministic
        self.epoch = -1

    def __iter__(self) -> Iterator[Dict[str, str]]:
        self.epoch += 1
        from .splitters import worker_info

        rank, _, worker, _ = worker_info()
        wseed = self.worker_seed() if callable(self.worker_seed) else (rank * 1000 + worker)
        parts = [wseed, self.epoch, self.seed]
        if not self.deterministic:
            parts += [os.getpid(), time.time_ns(), int.from_bytes(os.urandom(4), "little")]
        rng = random.Random(repr(parts))
        for _ in range(self.nshards):
            yield {"url": self.urls[rng.randint(0, len(self.urls) - 1)]}


ResampledShardList = ResampledShards


def _resampled(src: Any, n: int = sys.maxsize) -> Iterator[Any]:
    items = list(src)
    rng = random.Random(int.from_bytes(os.urandom(8), "little"))
    for _ in range(n):
        yield rng.choice(items)


def resampled(n: int = sys.maxsize) -> Any:
    """Stage: draw ``n`` items with replacement from everything the previous stage yields.

    Example:
        >>> len(list(resampled(5)(iter(["a.tar", "b.tar"]))))
        5
    """
    from .filters import _Generic

    return _Generic("resampled", _resampled, n)


def non_empty(src: Any) -> Iterator[Any]:
    """Pass ``src`` through; raise ValueError if it yields nothing."""
    count = 0
    for x in src:
        yield x
        count += 1
    if count == 0:
        raise ValueError("pipeline stage received no data at all and this was declared as an error")


def shardspec(spec: str) -> SimpleShardList:
    """A :class:`SimpleShardList` for ``spec`` (webdataset's ``.yaml`` specs are not supported).

    Raises:
        ValueError: a ``.yaml`` spec.
    """
    if spec.endswith(".yaml"):
        raise ValueError(f"{spec}: MultiShardSample .yaml specs are not supported by resumewds")
    return SimpleShardList(spec)
