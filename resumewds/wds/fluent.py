"""webdataset's ``FluidInterface``: the fluent methods of a pipeline, each one stage.

A class with a ``compose(stage)`` method (webdataset's ``DataPipeline``
contract) gets ``.shuffle(n)``, ``.map(f)``, ``.batched(n)``... from this
mixin, each returning ``self.compose(<the stage of the same name>)`` built by
:mod:`resumewds.wds.filters`, the one implementation of each.

Example:
    >>> class P(FluidInterface):
    ...     def __init__(self): self.stages = []
    ...     def compose(self, stage): self.stages.append(stage); return self
    >>> len(P().map(str).batched(2).stages)
    2
"""

from __future__ import annotations

from typing import Any, Optional

from . import filters
from .filters import Cached

__all__ = ["Cached", "FluidInterface"]


def _stage(name: str, *args: Any, **kw: Any) -> Any:
    return getattr(filters, name)(*args, **kw)


class FluidInterface:
    """webdataset's fluent mixin: each method returns ``self.compose(<the stage>)``.

    For a class with a ``compose(stage)`` method (webdataset's ``DataPipeline``
    contract).  :class:`resumewds.WebDataset` has its own fluent methods (compiled
    into the plan); this mixin is for pipelines of your own and for
    :class:`resumewds.fluid.FluidWrapper` over an arbitrary source.

    Example:
        >>> class P(FluidInterface):
        ...     def __init__(self, src): self.src = src
        ...     def compose(self, stage): return P(stage(iter(self.src)))
        ...     def __iter__(self): return iter(self.src)
        >>> list(P(range(5)).map(lambda x: x * 10).select(lambda x: x > 10))
        [20, 30, 40]
    """

    def compose(self, *stages: Any) -> Any:  # pragma: no cover - provided by the host class
        raise NotImplementedError

    def batched(self, batchsize: int, collation_fn: Any = "default", partial: bool = True) -> Any:
        """Batches of ``batchsize`` (``filters.batched``)."""
        if collation_fn == "default":
            return self.compose(_stage("batched", batchsize, partial=partial))
        return self.compose(_stage("batched", batchsize, collation_fn=collation_fn, partial=partial))

    def unbatched(self) -> Any:
        """Split batches into samples."""
        return self.compose(_stage("unbatched"))

    def listed(self, batchsize: int, partial: bool = True) -> Any:
        """Lists of ``batchsize`` samples (no collation)."""
        return self.compose(_stage("batched", batchsize, collation_fn=None, partial=partial))

    def unlisted(self) -> Any:
        """Split lists into samples."""
        return self.compose(_stage("unlisted"))

    def log_keys(self, logfile: Optional[str] = None) -> Any:
        """Log each sample's key."""
        return self.compose(_stage("log_keys", logfile))

    def shuffle(self, size: int, **kw: Any) -> Any:
        """A shuffle buffer of ``size`` (no-op if ``size < 1``)."""
        if size < 1:
            return self
        return self.compose(_stage("shuffle", size, **kw))

    def map(self, f: Any, handler: Any = None) -> Any:
        """Apply ``f`` to each sample."""
        return self.compose(_stage("map", f, **({} if handler is None else {"handler": handler})))

    def decode(self, *args: Any, **kw: Any) -> Any:
        """Decode members (``filters.decode``)."""
        return self.compose(_stage("decode", *args, **kw))

    def map_dict(self, handler: Any = None, **kw: Any) -> Any:
        """Apply a function per field of dict samples."""
        return self.compose(_stage("map_dict", **({} if handler is None else {"handler": handler}), **kw))

    def select(self, predicate: Any, **kw: Any) -> Any:
        """Keep the samples for which ``predicate`` is true."""
        return self.compose(_stage("select", predicate, **kw))

    def to_tuple(self, *args: Any, **kw: Any) -> Any:
        """Dict samples to tuples of fields."""
        return self.compose(_stage("to_tuple", *args, **kw))

    def map_tuple(self, *args: Any, handler: Any = None) -> Any:
        """Apply a function per field of tuple samples."""
        return self.compose(_stage("map_tuple", *args, **({} if handler is None else {"handler": handler})))

    def slice(self, *args: Any) -> Any:
        """``itertools.islice`` of the stream."""
        return self.compose(_stage("slice", *args))

    def rename(self, **kw: Any) -> Any:
        """Rename fields (``filters.rename``)."""
        return self.compose(_stage("rename", **kw))

    def rsample(self, p: float = 0.5) -> Any:
        """Keep each sample with probability ``p``."""
        return self.compose(_stage("rsample", p))

    def rename_keys(self, *args: Any, **kw: Any) -> Any:
        """Rename fields by patterns."""
        return self.compose(_stage("rename_keys", *args, **kw))

    def extract_keys(self, *args: Any, **kw: Any) -> Any:
        """Tuples of the fields matching patterns."""
        return self.compose(_stage("extract_keys", *args, **kw))

    def xdecode(self, *args: Any, **kw: Any) -> Any:
        """Decode fields by patterns."""
        return self.compose(_stage("xdecode", *args, **kw))

    def mcached(self) -> Any:
        """Keep the first complete pass in memory (:class:`Cached`)."""
        return self.compose(Cached())

    def lmdb_cached(self, *args: Any, **kw: Any) -> Any:
        """Keep the first complete pass in an LMDB database (:class:`resumewds.filters.LMDBCached`;
        needs the ``lmdb`` package)."""
        return self.compose(filters.LMDBCached(*args, **kw))
