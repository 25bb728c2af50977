"""webdataset's ``WebDataset`` constructor and fluent methods, over the engine's data set.

:class:`WebDatasetAPI` is a mixin: ``resumewds.WebDataset`` is
``WebDatasetAPI`` + :class:`resumewds.wds._direct.DirectDataset` (the engine's data set,
:class:`resumewds.read.ShardDataset`, iterated directly).  It takes
webdataset 1.0.2's constructor arguments (``shardshuffle``, ``nodesplitter``,
``workersplitter``, ``select_files``, ``mode``, ``url_to_name``...) and maps
them onto the engine's settings; its fluent methods are webdataset's
(:class:`resumewds.wds._fluent.FluidInterface`, each ``self.compose(filters.X(...))``),
and its ``compose`` appends each stage's engine spec (:class:`resumewds.stages.Stage`),
which the engine runs as it runs any other (per-sample stages where samples
are read, stream stages through :mod:`resumewds.stages`).

Example:
    >>> import resumewds as wds
    >>> ds = wds.WebDataset("data/shard-{000000..000003}.tar", shardshuffle=100)  # doctest: +SKIP
    >>> ds = ds.shuffle(1000).decode("pil").to_tuple("jpg;png", "cls").batched(64)  # doctest: +SKIP
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
    """webdataset's ``WebDataset`` constructor and ``compose``, with webdataset's fluent methods
    (:class:`~resumewds.wds._fluent.FluidInterface`).

    A mixin over :class:`~resumewds.wds._direct.DirectDataset`: see
    :class:`resumewds.WebDataset` for the arguments.
    """

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
        """A copy with ``stages`` appended (webdataset's ``compose``): webdataset's stages
        (:mod:`resumewds.filters`) as the engine runs the fluent method of the same name
        (``ds.compose(wds.shuffle(n))`` is ``ds.shuffle(n)``), engine
        :class:`~resumewds.stages.Stage` specs as they are, and any other generator function
        ``f(iterator) -> iterator`` run over each worker's stream (opaque: a resume replays
        its epoch from the start).

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
        """How DataLoader workers share an epoch: ``worker_split`` if given, else
        ``"shards"`` (webdataset's ``split_by_worker``: each worker its own shards)
        when webdataset's worker split is in force (``workersplitter`` left as is or
        ``split_by_worker``) and no ``shuffle=`` asked for resumewds's own order;
        ``"samples"`` otherwise."""
        if self.worker_split is not None:
            return self.worker_split
        ws = self.workersplitter
        kind = "split_by_worker" if ws is _UNSET else (None if ws is None else _builtin_splitter(ws))
        return "shards" if kind == "split_by_worker" and not self._order_asked else "samples"

    def _split(self) -> Tuple[int, int, int, int, List[Any]]:
        """``(rank, world, worker, num_workers, custom splitters)`` for this process:
        webdataset's ``nodesplitter`` / ``workersplitter``, mapped onto the engine's split."""
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

    ``import resumewds as wds`` runs webdataset code unchanged: the
    constructor takes webdataset's arguments and every fluent stage
    (docs/COMPAT.md lists the exact semantics and differences).  It is a
    ``torch.utils.data.IterableDataset`` (registered when torch is imported,
    so ``import resumewds`` stays torch-free): a plain torch ``DataLoader``
    works, each worker taking its own shards (webdataset's ``split_by_worker``), and
    ``state_dict()`` / ``load_state_dict()`` speak torchdata's
    ``StatefulDataLoader`` protocol.

    Args:
        urls: a path, URL, brace pattern, ``pipe:`` command or manifest.json,
            or a list of them, or a :class:`~resumewds.manifest.Manifest`;
            also webdataset's ``"a.tar::b-{0..3}.tar"`` and ``file:/abs/path``.
        seed: seed of the order (same seed, same order on any machine);
            None: ``WDS_SEED`` if set, else 0.
        shuffle: False: manifest order; True / ``"window"``: shard order
            permuted per epoch and samples shuffled within windows of
            ``shuffle_window`` shards; ``"shards"``: shard order only.
            Default: ``"shards"`` if ``shardshuffle`` is set, else False.
        shuffle_window: shards per shuffle window.
        cache_dir, cache_size, verify, fetch, on_error, allow_pickle, allow_remote_pipe,
        allow_remote_local, manifest_max_bytes, cache_sync, prefetch, partitions,
        ranged_reads: the engine's settings, as
            :class:`resumewds.read.ShardDataset` documents them.
        handler: webdataset's handler for shard and sample (tar) errors:
            ``reraise_exception`` (default, ``on_error="raise"``); a handler
            returning True skips the shard like ``on_error="skip"``; False
            stops the iteration.
        resampled: draw each epoch's shards with replacement (deterministic:
            a pure function of seed, epoch and position); iteration goes on
            over epochs (use ``.with_epoch(n)``).
        repeat: iterate over epochs without end (as ``.repeat()``).
        shardshuffle: webdataset's shard shuffle: True or N > 0 permutes the
            shard order per epoch (``shuffle="shards"``); False/None/0: manifest order.
        detshuffle: accepted; our shuffles are always deterministic.
        nodesplitter, workersplitter: ``split_by_node``, ``split_by_worker``,
            ``single_node_only`` (ours or webdataset's) map onto the rank /
            worker split; None: no split (every rank / worker sees everything,
            as in webdataset); a user callable gets the shard list
            (``{"url": ...}`` dicts) and keeps what it yields.
        worker_split: how DataLoader workers share an epoch on one rank.
            None (default): ``"shards"`` while webdataset's worker split is in
            force (``workersplitter`` left as is, or ``split_by_worker``) and
            ``shuffle=`` is not given, else ``"samples"``.  ``"shards"``:
            webdataset's ``split_by_worker``: worker ``w`` of ``W`` reads the
            epoch's shards ``w, w+W, ...`` and the DataLoader interleaves the
            workers' batches round-robin (the same data as webdataset; a
            state resumes it with any ``num_workers``).  ``"samples"``:
            resumewds's split of the one sample sequence (the same data for
            any worker count).  See :mod:`resumewds.wds._shardsplit`.
        select_files, rename_files: webdataset's member filters (by
            ``"<key>.<ext>"`` name).
        empty_check: raise ValueError when an epoch has no samples at all.
        url_to_name, cache_size semantics, verbose, mode: accepted for
            compatibility (our cache names entries by URL digest).

    Example:
        >>> ds = WebDataset(["a.tar", "b.tar"], seed=3).decode().to_tuple("txt", "cls")  # doctest: +SKIP
        >>> ds = (WebDataset("shards-{000..099}.tar", shardshuffle=100)            # doctest: +SKIP
        ...       .shuffle(1000).decode("pil").to_tuple("jpg;png", "cls").batched(64))
    """
