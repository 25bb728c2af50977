"""webdataset's ``FluidInterface``: the fluent methods of a pipeline, each one stage.

Each method returns ``self.compose(<the stage of the same name>)`` from :mod:`resumewds.wds.filters`,
as webdataset 1.0.2's does, so ``ds.shuffle(n)`` and ``ds.compose(wds.shuffle(n))`` are one stage.
"""

from __future__ import annotations

from typing import Any, Callable, Dict, List, Optional

from ..stages import Stage, default_collation_fn

__all__ = ["FluidInterface", "engine_specs"]


def _handled(handler: Any) -> Dict[str, Any]:
    """``handler=`` for a stage factory: left out when None (the factory's default: re-raise)."""
    return {} if handler is None else {"handler": handler}


def _filters() -> Any:
    """:mod:`resumewds.wds.filters`, loaded by the first stage composed (a bare data set needs none)."""
    from . import filters  # lazy: the stages and their decoders

    return filters


def engine_specs(stages: Any) -> List[Stage]:
    """``stages`` as the engine's specs; a stage it cannot see through becomes an opaque stream stage.

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
        f = _filters()
        spec = st.spec() if isinstance(st, f.StreamStage) else None
        if spec is not None:
            out.append(spec)
            continue
        name = getattr(st, "__name__", None) or (
            "mcached" if isinstance(st, f.Cached) else "lmdb_cached" if isinstance(st, f.LMDBCached) else "compose")
        out.append(Stage("stream", name, st))
    return out


class FluidInterface:
    """webdataset's fluent mixin, for a class with a ``compose(stage)`` method.

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
        """Batches of ``batchsize`` (``collation_fn=None``: lists)."""
        return self.compose(_filters().batched(batchsize, collation_fn=collation_fn, partial=partial))

    def unbatched(self) -> Any:
        """Split batches back into samples."""
        return self.compose(_filters().unbatched())

    def listed(self, batchsize: int, partial: bool = True) -> Any:
        """Lists of ``batchsize`` samples (no collation)."""
        return self.compose(_filters().batched(batchsize, collation_fn=None, partial=partial))

    def unlisted(self) -> Any:
        """Split lists (from ``listed``) back into samples."""
        return self.compose(_filters().unlisted())

    def log_keys(self, logfile: Optional[str] = None) -> Any:
        """Append ``index, worker, rank, key`` lines to ``logfile`` (None: off)."""
        return self.compose(_filters().log_keys(logfile))

    def shuffle(self, size: int, **kw: Any) -> Any:
        """A shuffle of ``size`` (no-op if ``size < 1``).

        On a :class:`resumewds.WebDataset`, before any stream stage, it is compiled into the plan:
        samples shuffled within windows of whole shards holding at least ``3 * n`` samples (and 8
        shards), at least webdataset's buffer's mixing.  Elsewhere: a buffer shuffle on the stream.
        """
        if size < 1:
            return self
        return self.compose(_filters().shuffle(size, **kw))

    def map(self, f: Callable[[Any], Any], handler: Any = None) -> Any:
        """Apply ``f`` to each item; a None result drops it; ``handler=`` decides about an exception."""
        return self.compose(_filters().map(f, **_handled(handler)))

    def decode(self, *args: Any, pre: Any = None, post: Any = None, only: Any = None, partial: bool = False,
               handler: Any = None, allow_pickle: Optional[bool] = None) -> Any:
        """Decode members: image specs (``"pil"``, ``"rgb8"``...) and/or callables ``(key, data)``;
        ``allow_pickle`` defaults to the host's setting.
        """
        if allow_pickle is None:
            allow_pickle = bool(getattr(self, "allow_pickle", False))
        return self.compose(_filters().decode(*args, pre=pre, post=post, only=only, partial=partial,
                                           allow_pickle=allow_pickle, **_handled(handler)))

    def map_dict(self, handler: Any = None, **kw: Callable[[Any], Any]) -> Any:
        """Apply functions to named fields of dict samples (a missing field: KeyError)."""
        return self.compose(_filters().map_dict(**_handled(handler), **kw))

    def select(self, predicate: Callable[[Any], bool], **kw: Any) -> Any:
        """Keep only the items for which ``predicate`` is true."""
        return self.compose(_filters().select(predicate, **kw))

    def to_tuple(self, *args: str, **kw: Any) -> Any:
        """Turn samples into tuples: ``to_tuple("jpg;png", "cls")`` or ``to_tuple("jpg;png cls")``."""
        return self.compose(_filters().to_tuple(*args, **kw))

    def map_tuple(self, *args: Optional[Callable[[Any], Any]], handler: Any = None) -> Any:
        """Apply functions to the fields of tuple samples, by position."""
        return self.compose(_filters().map_tuple(*args, **_handled(handler)))

    def slice(self, *args: Optional[int]) -> Any:
        """``itertools.islice`` over the stream (over each worker's stream of an epoch)."""
        return self.compose(_filters().slice(*args))

    def rename(self, **kw: Any) -> Any:
        """Rename fields: ``rename(image="jpg;png", label="cls")``."""
        if kw.get("handler", 0) is None:
            del kw["handler"]
        return self.compose(_filters().rename(**kw))

    def rsample(self, p: float = 0.5) -> Any:
        """Keep each item with probability ``p``."""
        return self.compose(_filters().rsample(p))

    def rename_keys(self, *args: Any, **kw: Any) -> Any:
        """Rename fields by glob patterns (``filters.rename_keys``)."""
        return self.compose(_filters().rename_keys(*args, **kw))

    def extract_keys(self, *args: Any, **kw: Any) -> Any:
        """A tuple of the fields matching glob patterns (``filters.extract_keys``)."""
        return self.compose(_filters().extract_keys(*args, **kw))

    def xdecode(self, *args: Any, **kw: Any) -> Any:
        """Decode fields by glob patterns with stream decoders (``filters.xdecode``)."""
        return self.compose(_filters().xdecode(*args, **kw))

    def mcached(self) -> Any:
        """Keep the first complete pass in memory (:class:`Cached`); later passes replay it."""
        return self.compose(_filters().Cached())

    def lmdb_cached(self, *args: Any, **kw: Any) -> Any:
        """Keep the first complete pass in an LMDB database (:class:`resumewds.filters.LMDBCached`)."""
        return self.compose(_filters().LMDBCached(*args, **kw))
