"""webdataset's ``WebDataset`` constructor and fluent methods, over the engine's data set.

``resumewds.WebDataset`` is :class:`WebDatasetAPI` (webdataset 1.0.2's constructor arguments
mapped onto the engine's settings, and ``compose``) + :class:`resumewds.wds._direct.DirectDataset`.
"""

from __future__ import annotations

import os
import warnings
from typing import TYPE_CHECKING, Any, Callable, List, Optional, Tuple, Union

from ..plan import worker_info
from ..run import note_framework
from ..sources import Source
from ..stages import SelectFiles, Stage
from ._direct import DirectDataset
from ._fluent import FluidInterface, engine_specs
from .splitters import single_node_only, split_by_node, split_by_worker

if TYPE_CHECKING:
    _Base = DirectDataset
else:
    _Base = object

__all__ = ["WebDataset", "WebDatasetAPI"]

_UNSET: Any = object()
_BUILTIN_NAMES = ("split_by_node", "split_by_worker", "single_node_only")


def _builtin_splitter(f: Any) -> Optional[str]:
    """The name of a built-in splitter (ours, or webdataset's own), else None."""
    if f is split_by_node or f is split_by_worker or f is single_node_only:
        return f.__name__
    name, mod = getattr(f, "__name__", None), getattr(f, "__module__", "") or ""
    if name in _BUILTIN_NAMES and mod.split(".")[0] in ("webdataset", "resumewds"):
        return name
    return None


def _wds_urls(urls: Any) -> Any:
    """webdataset's URL forms: ``a::b`` joined patterns, ``file:/abs/path``."""
    def one(u: Any) -> List[Any]:
        if not isinstance(u, str) or u.startswith("pipe:"):
            return [u]
        out = []
        for part in (u.split("::") if "::" in u else [u]):
            if part.startswith("file:") and not part.startswith("file://"):
                part = part[len("file:"):]
            out.append(part)
        return out

    if isinstance(urls, (str, os.PathLike)):
        parts = one(os.fspath(urls))
        return parts[0] if len(parts) == 1 else parts
    if isinstance(urls, (list, tuple)):
        return [p for u in urls for p in one(os.fspath(u) if isinstance(u, os.PathLike) else u)]
    return urls


class WebDatasetAPI(FluidInterface, _Base):
    """webdataset's ``WebDataset`` constructor and ``compose`` (a mixin: see :class:`resumewds.WebDataset`)."""

    def __init__(self, urls: Source, handler: Any = None, mode: Optional[str] = None,
                 resampled: bool = False, repeat: bool = False, shardshuffle: Any = None,
                 cache_size: Union[int, str, None] = None, cache_dir: Optional[str] = None,
                 url_to_name: Any = None, detshuffle: bool = False, nodesplitter: Any = _UNSET,
                 workersplitter: Any = _UNSET, select_files: Optional[Callable[[str], bool]] = None,
                 rename_files: Optional[Callable[[str], str]] = None, empty_check: bool = True,
                 verbose: bool = False, seed: Optional[int] = None, *,
                 shuffle: Union[bool, str, None] = None, **engine: Any):
        resampled = bool(resampled or mode == "resampled")
        self._order_asked = shuffle is not None  # resumewds's own order asked for: its own worker split
        if shuffle is None:
            shuffle = "shards" if (shardshuffle not in (None, False, 0) and not resampled) else False
        super().__init__(_wds_urls(urls), seed=seed, shuffle=shuffle, cache_dir=cache_dir,
                         cache_size=cache_size, handler=handler, resampled=resampled, repeat=repeat,
                         empty_check=empty_check, **engine)
        self.shardshuffle = shardshuffle
        self.detshuffle = detshuffle
        self.url_to_name = url_to_name
        self.nodesplitter = nodesplitter
        self.workersplitter = workersplitter
        self._length: Optional[int] = None
        if select_files is not None or rename_files is not None:
            first = Stage("sample", "select_files", SelectFiles(select_files, rename_files))
            self._set_stages((first,) + self.stage_specs)

    def compose(self, *stages: Any) -> Any:
        """A copy with ``stages`` appended (webdataset's ``compose``).

        webdataset's stages run as the fluent method of the same name, engine
        :class:`~resumewds.stages.Stage` specs as they are, and any other generator function over
        each worker's stream (opaque: a resume replays its epoch from the start).

        Example:
            >>> import resumewds as wds
            >>> ds = wds.WebDataset("data/shard-000000.tar").compose(wds.map(lambda s: s["__key__"]))
            >>> next(iter(ds))
            's000000_000000'
        """
        return self.with_stages(self.stage_specs + tuple(engine_specs(stages)))

    def with_length(self, n: int, silent: bool = False) -> Any:
        """Give the dataset a ``__len__`` of ``n`` (it does not change an epoch)."""
        if not silent:
            warnings.warn(".with_length() only sets the value of __len__ for compatibility with "
                          "some training environments. It does not change the number of samples "
                          "in an epoch.", stacklevel=2)
        self._length = int(n)
        return self

    def __len__(self) -> int:
        note_framework(self, "len")  # Lightning asks its loader's len() before it iterates: say what it loses
        if self._length is None:
            raise TypeError("WebDataset has no len(); use .with_length(n)")
        return self._length

    def worker_split_mode(self) -> str:
        """``worker_split`` if given, else ``"shards"`` while webdataset's worker split is in force and
        no ``shuffle=`` asked for resumewds's own order, else ``"samples"``.
        """
        if self.worker_split is not None:
            return self.worker_split
        ws = self.workersplitter
        kind = "split_by_worker" if ws is _UNSET else (None if ws is None else _builtin_splitter(ws))
        return "shards" if kind == "split_by_worker" and not self._order_asked else "samples"

    def _split(self) -> Tuple[int, int, int, int, List[Any]]:
        """``(rank, world, worker, num_workers, custom splitters)``: webdataset's splitters, mapped."""
        custom: List[Any] = []
        rank, world = 0, 1
        ns = self.nodesplitter
        kind = "split_by_node" if ns is _UNSET else (None if ns is None else _builtin_splitter(ns))
        info = worker_info()
        if kind == "split_by_node":
            rank, world = info[0], info[1]
        elif kind == "single_node_only":
            if info[1] > 1:
                raise ValueError("input pipeline needs to be reconfigured for multinode training "
                                 "(nodesplitter=single_node_only with WORLD_SIZE > 1)")
        elif ns is not None:
            custom.append(ns)
        worker, nworkers = 0, 1
        ws = self.workersplitter
        kind = "split_by_worker" if ws is _UNSET else (None if ws is None else _builtin_splitter(ws))
        if kind == "split_by_worker":
            worker, nworkers = info[2], info[3]
        elif ws is not None and kind is None:
            custom.append(ws)
        return rank, world, worker, nworkers, custom


class WebDataset(WebDatasetAPI, DirectDataset):
    """A resumable, deterministic WebDataset; also webdataset 1.0.2's ``WebDataset``.

    It takes webdataset's arguments and every fluent stage (differences: docs/COMPAT.md), is a
    ``torch.utils.data.IterableDataset`` (registered when torch is imported), and its
    ``state_dict()`` / ``load_state_dict()`` speak torchdata's ``StatefulDataLoader`` protocol.

    Args:
        urls: a path, URL, brace pattern, ``pipe:`` command or manifest.json, a list of them,
            or a :class:`~resumewds.manifest.Manifest`; also ``"a.tar::b-{0..3}.tar"``.
        seed: seed of the order; None: ``WDS_SEED`` if set, else 0.
        shuffle: False: manifest order; True / ``"window"``: shard order permuted per epoch
            and samples shuffled within windows of ``shuffle_window`` shards; ``"shards"``:
            shard order only.  Default: ``"shards"`` if ``shardshuffle`` is set, else False.
        handler: webdataset's handler for shard and sample errors (True skips the shard,
            False stops the iteration; default ``reraise_exception``).
        resampled: draw each epoch's shards with replacement (deterministic); iteration goes
            on over epochs.
        shardshuffle: True or N > 0 permutes the shard order per epoch.
        nodesplitter, workersplitter: the built-in splitters map onto the rank / worker split;
            None: no split; a callable of your own gets the shard list.
        worker_split: ``"shards"`` (webdataset's ``split_by_worker``), ``"samples"`` (the one
            sample sequence) or None (:meth:`worker_split_mode`).
        **engine: the engine's settings, as :class:`resumewds.read.ShardDataset` documents them.

    Example:
        >>> ds = (WebDataset("shards-{000..099}.tar", shardshuffle=100)            # doctest: +SKIP
        ...       .shuffle(1000).decode("pil").to_tuple("jpg;png", "cls").batched(64))
    """
