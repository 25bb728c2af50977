"""webdataset's ``FluidInterface``: the fluent methods of a pipeline, each one stage.

The one fluent face of the package: each method returns
``self.compose(<the stage of the same name>)`` built by :mod:`resumewds.wds.filters`,
the one implementation of each stage, as webdataset 1.0.2's ``FluidInterface``
does.  A class with a ``compose(stage)`` method (webdataset's ``DataPipeline``
contract) gets ``.shuffle(n)``, ``.map(f)``, ``.batched(n)``... from this mixin:
:class:`resumewds.DataPipeline` and :class:`resumewds.FluidWrapper` append the
stage to their pipeline; :class:`resumewds.WebDataset` appends its engine spec
(:meth:`resumewds.wds.filters.StreamStage.spec`, see :func:`engine_specs`), so
``ds.shuffle(n)`` and ``ds.compose(wds.shuffle(n))`` are one stage.

Example:
    >>> class P(FluidInterface):
    ...     def __init__(self): self.stages = []
    ...     def compose(self, stage): self.stages.append(stage); return self
    >>> len(P().map(str).batched(2).stages)
    2
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional

from ..stages import Stage, default_collation_fn
from . import filters
from .filters import Cached, LMDBCached

__all__ = ["Cached", "FluidInterface", "engine_specs"]


def _handled(handler: Any) -> Dict[str, Any]:
    """``handler=`` for a stage factory: left out when None (the factory's default: re-raise)."""
    return {} if handler is None else {"handler": handler}


def engine_specs(stages: Any) -> List[Stage]:
    """``stages`` (webdataset's stages, engine :class:`~resumewds.stages.Stage` specs, or
    generator functions ``f(iterator) -> iterator``) as the engine's specs: a
    :class:`~resumewds.wds.filters.StreamStage` by its :meth:`~resumewds.wds.filters.StreamStage.spec`,
    anything else it cannot see through as an opaque stream stage run as given.

    Raises:
        TypeError: a stage that is not callable.

    Example:
        >>> from resumewds.wds import filters
        >>> engine_specs([filters.map(str), filters.shuffle(100), filters.batched(4), filters.info()])
        [Stage(map), Stage(shuffle), Stage(batched), Stage(compose)]
    """
    out: List[Stage] = []
    for st in stages:
        if isinstance(st, Stage):
            out.append(st)
            continue
        if not callable(st):
            raise TypeError(f"compose() needs callables, got {st!r}")
        spec = st.spec() if isinstance(st, filters.StreamStage) else None
        if spec is not None:
            out.append(spec)
            continue
        name = getattr(st, "__name__", None) or (
            "mcached" if isinstance(st, Cached) else "lmdb_cached" if isinstance(st, LMDBCached) else "compose")
        out.append(Stage("stream", name, st))
    return out


class FluidInterface:
    """webdataset's fluent mixin: each method returns ``self.compose(<the stage>)``.

    For a class with a ``compose(stage)`` method (webdataset's ``DataPipeline``
    contract): :class:`resumewds.WebDataset`, :class:`resumewds.DataPipeline`,
    :class:`resumewds.fluid.FluidWrapper`, a WebLoader's chain and pipelines of your own.

    Example:
        >>> class P(FluidInterface):
        ...     def __init__(self, src): self.src = src
        ...     def compose(self, stage): return P(stage(iter(self.src)))
        ...     def __iter__(self): return iter(self.src)
        >>> list(P(range(5)).map(lambda x: x * 10).select(lambda x: x > 10))
        [20, 30, 40]
    """

    compose: Callable[..., Any]  # the host's: a copy (or the host) with the stage appended

    def batched(self, batchsize: int, collation_fn: Optional[Callable[[List[Any]], Any]] = default_collation_fn,
                partial: bool = True) -> Any:
        """Batches of ``batchsize`` (``filters.batched``; ``collation_fn=None``: lists).

        Iterated directly, ``partial=False`` drops a short last batch; under
        WebLoader the loader's ``remainder`` decides.
        """
        return self.compose(filters.batched(batchsize, collation_fn=collation_fn, partial=partial))

    def unbatched(self) -> Any:
        """Split batches back into samples."""
        return self.compose(filters.unbatched())

    def listed(self, batchsize: int, partial: bool = True) -> Any:
        """Lists of ``batchsize`` samples (no collation)."""
        return self.compose(filters.batched(batchsize, collation_fn=None, partial=partial))

    def unlisted(self) -> Any:
        """Split lists (from ``listed``) back into samples."""
        return self.compose(filters.unlisted())

    def log_keys(self, logfile: Optional[str] = None) -> Any:
        """Append ``index, worker, rank, key`` lines to ``logfile`` (None: off)."""
        return self.compose(filters.log_keys(logfile))

    def shuffle(self, size: int, **kw: Any) -> Any:
        """A shuffle of ``size`` (no-op if ``size < 1``; ``filters.shuffle``'s ``initial``,
        ``rng``, ``seed``).

        On a :class:`resumewds.WebDataset`, before any ``batched`` / ``slice`` /
        ... stage, ``.shuffle(n)`` is compiled into the plan: samples are
        shuffled uniformly within windows of whole shards holding at least
        ``3 * n`` samples (on average) and at least 8 shards, so the mixing is
        at least that of webdataset's buffer of ``n`` (whose effective span is
        about ``2n``), and a resume recomputes any position in O(1).  After
        such a stage it is webdataset's buffer shuffle, with every pick a hash
        of (seed, epoch, count).  Elsewhere: a buffer shuffle on the stream.
        """
        if size < 1:
            return self
        return self.compose(filters.shuffle(size, **kw))

    def map(self, f: Callable[[Any], Any], handler: Any = None) -> Any:
        """Apply ``f`` to each item (a sample, or a batch after ``batched``); a None
        result drops it; ``handler=`` decides about an exception (skip or stop)."""
        return self.compose(filters.map(f, **_handled(handler)))

    def decode(self, *args: Any, pre: Any = None, post: Any = None, only: Any = None, partial: bool = False,
               handler: Any = None, allow_pickle: Optional[bool] = None) -> Any:
        """Decode members: image specs (``"pil"``, ``"rgb8"``, ``"torchrgb"``...) and/or callables
        ``(key, data) -> value or None``; ``only=`` limits decoding to those extensions,
        ``handler=`` handles a decoding error (skip / stop); ``allow_pickle``: default, the
        host's ``allow_pickle`` setting (a data set's), else False."""
        if allow_pickle is None:
            allow_pickle = bool(getattr(self, "allow_pickle", False))
        return self.compose(filters.decode(*args, pre=pre, post=post, only=only, partial=partial,
                                           allow_pickle=allow_pickle, **_handled(handler)))

    def map_dict(self, handler: Any = None, **kw: Callable[[Any], Any]) -> Any:
        """Apply functions to named fields of dict samples (a missing field: KeyError)."""
        return self.compose(filters.map_dict(**_handled(handler), **kw))

    def select(self, predicate: Callable[[Any], bool], **kw: Any) -> Any:
        """Keep only the items for which ``predicate`` is true.

        Under WebLoader, filtering happens inside a batch: the batch of
        positions ``[k*B, (k+1)*B)`` keeps its survivors, so batches may be
        smaller, and resume stays exact.  Iterated directly, ``.batched(n)``
        fills each batch from the filtered stream, as webdataset does.
        """
        return self.compose(filters.select(predicate, **kw))

    def to_tuple(self, *args: str, **kw: Any) -> Any:
        """Turn samples into tuples: ``to_tuple("jpg;png", "cls")`` or ``to_tuple("jpg;png cls")``."""
        return self.compose(filters.to_tuple(*args, **kw))

    def map_tuple(self, *args: Optional[Callable[[Any], Any]], handler: Any = None) -> Any:
        """Apply functions to the fields of tuple samples, by position."""
        return self.compose(filters.map_tuple(*args, **_handled(handler)))

    def slice(self, *args: Optional[int]) -> Any:
        """``itertools.islice`` over the stream (over each worker's stream of an epoch)."""
        return self.compose(filters.slice(*args))

    def rename(self, **kw: Any) -> Any:
        """Rename fields: ``rename(image="jpg;png", label="cls")`` (``keep``, ``handler`` as
        ``filters.rename``)."""
        if kw.get("handler", 0) is None:
            del kw["handler"]
        return self.compose(filters.rename(**kw))

    def rsample(self, p: float = 0.5) -> Any:
        """Keep each item with probability ``p`` (on a WebDataset: deterministic per seed,
        epoch and count)."""
        return self.compose(filters.rsample(p))

    def rename_keys(self, *args: Any, **kw: Any) -> Any:
        """Rename fields by glob patterns (``filters.rename_keys``)."""
        return self.compose(filters.rename_keys(*args, **kw))

    def extract_keys(self, *args: Any, **kw: Any) -> Any:
        """A tuple of the fields matching glob patterns (``filters.extract_keys``)."""
        return self.compose(filters.extract_keys(*args, **kw))

    def xdecode(self, *args: Any, **kw: Any) -> Any:
        """Decode fields by glob patterns with stream decoders (``filters.xdecode``)."""
        return self.compose(filters.xdecode(*args, **kw))

    def mcached(self) -> Any:
        """Keep the first complete pass in memory (:class:`Cached`); later passes replay it."""
        return self.compose(Cached())

    def lmdb_cached(self, *args: Any, **kw: Any) -> Any:
        """Keep the first complete pass in an LMDB database (:class:`resumewds.filters.LMDBCached`;
        needs the ``lmdb`` package)."""
        return self.compose(LMDBCached(*args, **kw))
