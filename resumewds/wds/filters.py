"""Pipeline stages with webdataset's names and semantics, for :class:`resumewds.DataPipeline`.

Each factory returns a stage, ``stage(iterator) -> iterator``, as webdataset 1.0.2's.  Inside a
:class:`~resumewds.DataPipeline` the per-sample stages, ``shuffle`` and ``batched`` are compiled
into the deterministic plan; other stages run as given, on the stream.

Example:
    >>> list(batched(2, collation_fn=None)(iter(range(5))))
    [[0, 1], [2, 3], [4]]
"""

from __future__ import annotations

import functools
import io
import os
import random
import re
import sys
import time
from fnmatch import fnmatch
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Sequence

from ..errors import HandlerStop
from ..stages import (
    ExtractKeys,
    Handled,
    LogKeysRunner,
    Map,
    MapDict,
    MapRunner,
    MapTuple,
    Rename,
    RenameKeys,
    RSampleRunner,
    Select,
    ShuffleRunner,
    SliceRunner,
    Stage,
    ToTuple,
    UnbatchRunner,
    default_collation_fn,
    getfirst,
    hide_positions,
)
from . import utils  # noqa: F401  (webdataset's filters.utils)
from .handlers import reraise_exception, until_stop
from .utils import PipelineStage

__all__ = ["Cached", "FilterFunction", "LMDBCached", "RestCurried", "SampleStage", "StreamStage", "associate",
           "batched", "combine_values", "compose", "compose2", "decode", "decode_bin", "decode_pickle", "decode_text",
           "default_collation_fn", "detshuffle", "dict2tuple", "extract_keys", "find_decoder", "getfirst",
           "identity", "info", "log_keys", "map", "map_dict", "map_tuple", "parse_field_spec", "pick",
           "pipeline", "pipelinefilter", "rename", "rename_keys", "rsample", "select", "shuffle", "slice",
           "to_tuple", "transform_with", "tuple2dict", "unbatched", "unlisted", "xdecode"]

ExnHandler = Callable[[BaseException], bool]


#: what a stage raises when its handler says stop (the dataset's HandlerStop: one exception everywhere)
StopPipeline = HandlerStop


class StreamStage:
    """A stage over a stream, webdataset's form: ``stage(iterator) -> iterator``."""

    name = "stage"

    def __call__(self, src: Iterable[Any]) -> Iterator[Any]:
        raise NotImplementedError

    def spec(self) -> Optional[Stage]:
        """This stage as the engine's :class:`~resumewds.stages.Stage`, or None: run as given, on the stream.

        Example:
            >>> batched(4).spec().args["n"], info().spec() is None
            (4, True)
        """
        return None

    def __repr__(self) -> str:
        return f"<{self.name}>"


class SampleStage(StreamStage):
    """A stage that maps each item on its own: ``fn(x) -> y`` or None to drop ``x``."""

    def __init__(self, name: str, fn: Callable[[Any], Any]):
        self.name = name
        self.fn = fn

    def __call__(self, src: Iterable[Any]) -> Iterator[Any]:
        return until_stop(MapRunner(self.fn).run(iter(src)))

    def spec(self) -> Stage:
        """A per-sample spec of the same callable."""
        return Stage("sample", self.name, self.fn)


def _stage(name: str, fn: Callable[[Any], Any], handler: ExnHandler = reraise_exception) -> SampleStage:
    return SampleStage(name, fn if handler is reraise_exception else Handled(fn, handler, name))


class _Generic(StreamStage):
    def __init__(self, name: str, f: Callable[..., Iterator[Any]], *args: Any, **kw: Any):
        self.name, self.f, self.args, self.kw = name, f, args, kw

    def __call__(self, src: Iterable[Any]) -> Iterator[Any]:
        return self.f(iter(src), *self.args, **self.kw)


def pipelinefilter(f: Callable[..., Iterator[Any]]) -> Callable[..., StreamStage]:
    """Turn ``f(src, *args, **kw)`` into a stage factory ``f(*args, **kw)(src)`` (webdataset's helper)."""
    def factory(*args: Any, **kw: Any) -> StreamStage:
        return _Generic(getattr(f, "__name__", "stage"), f, *args, **kw)
    factory.__name__ = getattr(f, "__name__", "stage")
    factory.__doc__ = f.__doc__
    return factory


def parse_field_spec(fields: Any) -> List[List[str]]:
    """``"jpg;png cls"`` (or a list) as lists of alternatives (webdataset's helper)."""
    if isinstance(fields, str):
        fields = fields.split()
    return [f.split(";") for f in fields]


def transform_with(sample: Sequence[Any], transformers: Optional[Sequence[Any]]) -> Any:
    """Apply ``transformers[i]`` to ``sample[i]`` (None, or a missing one, keeps the field).

    Raises:
        ValueError: more transformers than fields.

    Example:
        >>> transform_with((1, "a", 3), [lambda x: x + 1, None])
        [2, 'a', 3]
    """
    if not transformers:
        return sample
    if len(transformers) > len(sample):
        raise ValueError(f"transform_with: {len(transformers)} transformers for {len(sample)} fields")
    result = list(sample)
    for i, f in enumerate(transformers):
        if f is not None:
            result[i] = f(sample[i])
    return result


def identity(x: Any) -> Any:
    """``x`` itself."""
    return x


class _Associate:
    def __init__(self, associator: Any):
        self.associator = associator

    def __call__(self, sample: Dict[str, Any]) -> Dict[str, Any]:
        a = self.associator
        extra = a(sample["__key__"]) if callable(a) else a.get(sample["__key__"], {})
        sample.update(extra)
        return sample


def associate(associator: Any) -> SampleStage:
    """Stage: add ``associator(key)`` (a callable) or ``associator[key]`` (a dict) to each sample.

    Example:
        >>> list(associate({"a": {"cls": 1}})(iter([{"__key__": "a"}, {"__key__": "b"}])))
        [{'__key__': 'a', 'cls': 1}, {'__key__': 'b'}]
    """
    return SampleStage("associate", _Associate(associator))


def map(f: Callable[[Any], Any], handler: ExnHandler = reraise_exception) -> SampleStage:
    """Stage: ``f(sample)``; None drops the sample; a dict result keeps ``__key__``."""
    return _stage("map", Map(f), handler)


def map_dict(handler: ExnHandler = reraise_exception, **kw: Callable[[Any], Any]) -> SampleStage:
    """Stage: apply functions to named fields, in place (a missing field is a KeyError)."""
    return _stage("map_dict", MapDict(**kw), handler)


def map_tuple(*args: Optional[Callable[[Any], Any]], handler: ExnHandler = reraise_exception) -> SampleStage:
    """Stage: apply functions to tuple fields by position (None keeps a field)."""
    return _stage("map_tuple", MapTuple(*args), handler)


def to_tuple(*args: str, handler: ExnHandler = reraise_exception, missing_is_error: bool = True,
             none_is_error: Optional[bool] = None) -> SampleStage:
    """Stage: dict samples to tuples: ``to_tuple("jpg;png", "cls")`` or ``to_tuple("jpg;png cls")``."""
    return _stage("to_tuple", ToTuple(*args, missing_is_error=missing_is_error, none_is_error=none_is_error),
                  handler)


def select(predicate: Callable[[Any], bool]) -> SampleStage:
    """Stage: keep the samples for which ``predicate`` is true."""
    return SampleStage("select", Select(predicate))


def rename(handler: ExnHandler = reraise_exception, keep: bool = True, **kw: str) -> SampleStage:
    """Stage: ``rename(image="jpg;png", label="cls")``; ``keep=False`` keeps only the new fields."""
    return _stage("rename", Rename(keep=keep, **kw), handler)


def rename_keys(*args: Any, keep_unselected: bool = False, must_match: bool = True,
                duplicate_is_error: bool = True, **kw: str) -> SampleStage:
    """Stage: rename fields by glob patterns (``rename_keys(image="*.jpg")``)."""
    return SampleStage("rename_keys", RenameKeys(*args, keep_unselected=keep_unselected, must_match=must_match,
                                                    duplicate_is_error=duplicate_is_error, **kw))


def extract_keys(*patterns: Any, duplicate_is_error: bool = True, ignore_missing: bool = False) -> SampleStage:
    """Stage: a tuple of the fields matching each glob pattern."""
    return SampleStage("extract_keys", ExtractKeys(*patterns, duplicate_is_error=duplicate_is_error,
                                                    ignore_missing=ignore_missing))


def decode(*args: Any, handler: ExnHandler = reraise_exception, **kw: Any) -> SampleStage:
    """Stage: :class:`resumewds.autodecode.Decoder` over image specs and handlers.

    ``kw``: ``pre``, ``post``, ``only``, ``partial``, ``allow_pickle``.
    """
    from .. import autodecode  # lazy: a pipeline that does not decode does not load the decoders

    return _stage("decode", autodecode.Decoder(args, **kw), handler)  # the fluent .decode's decoder


def decode_bin(stream: Any) -> bytes:
    """The bytes of a stream (an ``xdecode`` decoder, webdataset's)."""
    return stream.read()


def decode_text(stream: Any) -> str:
    """A stream's bytes as UTF-8 text (an ``xdecode`` decoder, webdataset's)."""
    return stream.read().decode("utf-8")


def decode_pickle(stream: Any) -> Any:
    """A pickle from a stream (an ``xdecode`` decoder, webdataset's; runs code from the data)."""
    from ..autodecode import unpickle_loads

    return unpickle_loads(stream.read())


default_decoders = [("*.bin", decode_bin), ("*.txt", decode_text), ("*.pyd", decode_pickle)]


def find_decoder(decoders: Sequence[Any], path: str) -> Any:
    """The decoder of ``path``: the last ``(pattern, decoder)`` whose glob matches its file name."""
    fname = re.sub(r".*/", "", path)
    if fname.startswith("__"):
        return lambda x: x
    for pattern, fun in list(decoders)[::-1]:
        if fnmatch(fname.lower(), pattern) or fnmatch("." + fname.lower(), pattern):
            return fun
    return None


class _XDecode:
    def __init__(self, args: Sequence[Any], must_decode: bool, defaults: Sequence[Any], kw: Dict[str, Any]):
        self.decoders = list(defaults) + list(args) + [("*." + k, v) for k, v in kw.items()]
        self.must_decode = must_decode

    def _find(self, path: str) -> Any:
        return find_decoder(self.decoders, path)

    def __call__(self, sample: Dict[str, Any]) -> Dict[str, Any]:
        new: Dict[str, Any] = {}
        for path, data in sample.items():
            if path.startswith("__"):
                new[path] = data
                continue
            dec = self._find(path)
            if dec is False:
                new[path] = data
            elif dec is None:
                if self.must_decode:
                    raise ValueError(f"No decoder found for {path}.")
                new[path] = data
            else:
                new[path] = dec(io.BytesIO(data) if isinstance(data, bytes) else data)
        return new


def xdecode(*args: Any, must_decode: bool = True, defaults: Sequence[Any] = default_decoders,
            **kw: Callable[[Any], Any]) -> SampleStage:
    """Stage: decode fields by glob pattern with stream decoders (``xdecode(png=imread)``)."""
    return SampleStage("xdecode", _XDecode(args, must_decode, defaults, kw))


class Cached:
    """webdataset's ``Cached()`` stage: the first complete pass is kept in memory and replayed.

    In a ``DataPipeline`` a stage the plan cannot see through (not exactly resumable).
    """

    def __init__(self) -> None:
        self.cached: Optional[List[Any]] = None

    def __call__(self, source: Iterable[Any]) -> Iterator[Any]:
        if self.cached is not None:
            yield from self.cached
            return
        temp: List[Any] = []
        for sample in source:
            temp.append(sample)
            yield sample
        self.cached = temp

    run = __call__  # webdataset's PipelineStage.run

    def invoke(self, source: Iterable[Any]) -> Iterator[Any]:
        """webdataset's ``PipelineStage.invoke``."""
        return self(source)


class FilterFunction:
    """``FilterFunction(f, *a, **kw)(data)`` is ``f(data, *a, **kw)`` (webdataset's picklable curried stage)."""

    def __init__(self, f: Callable[..., Any], *args: Any, **kw: Any):
        self.f, self.args, self.kw = f, args, kw

    def __call__(self, data: Any) -> Any:
        return self.f(data, *self.args, **self.kw)

    def __str__(self) -> str:
        return f"<{self.f.__name__} {self.args} {self.kw}>"

    __repr__ = __str__


class RestCurried:
    """``RestCurried(f)(*a, **kw)`` is ``FilterFunction(f, *a, **kw)`` (webdataset's)."""

    def __init__(self, f: Callable[..., Any]):
        self.f = f

    def __call__(self, *args: Any, **kw: Any) -> FilterFunction:
        return FilterFunction(self.f, *args, **kw)


def compose2(f: Callable[[Any], Any], g: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``g(f(x))`` (webdataset's)."""
    return lambda x: g(f(x))


def compose(*args: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """The functions composed left to right: ``compose(f, g)(x)`` is ``g(f(x))``."""
    return functools.reduce(compose2, args)


def pipeline(source: Any, *args: Callable[[Any], Any]) -> Any:
    """``source`` through the stages ``args`` (webdataset's ``pipeline``)."""
    if len(args) == 0:
        return source
    return compose(*args)(source)


def pick(buf: List[Any], rng: Any) -> Any:
    """Remove and return an item of ``buf`` at random (webdataset's shuffle-buffer pick)."""
    k = rng.randint(0, len(buf) - 1)
    sample = buf[k]
    buf[k] = buf[-1]
    buf.pop()
    return sample


def combine_values(b: Sequence[Any], combine_tensors: bool = True, combine_scalars: bool = True) -> Any:
    """One field of a batch collated as webdataset's ``default_collation_fn`` does."""
    import numpy as np

    torch: Any = sys.modules.get("torch")
    if isinstance(b[0], (int, float)):
        return np.array(list(b)) if combine_scalars else b
    is_tensor = torch is not None and isinstance(b[0], torch.Tensor)
    if not (is_tensor or isinstance(b[0], np.ndarray)):
        return list(b)
    if not combine_tensors:
        return b
    shapes = {x.shape for x in b}
    if len(shapes) != 1:
        raise ValueError(f"all shapes must be equal in collation, got {shapes}")
    return torch.stack(list(b)) if is_tensor else np.array(list(b))


def tuple2dict(sample: Any) -> Dict[Any, Any]:
    """A tuple as ``{index: field}`` (a dict is returned as it is)."""
    if isinstance(sample, dict):
        return sample
    return dict(enumerate(sample))


def dict2tuple(d: Dict[int, Any]) -> tuple:
    """``{0: a, 1: b}`` as ``(a, b)`` (the inverse of :func:`tuple2dict`)."""
    return tuple(d[i] for i in range(1 + max(d.keys())))


class LMDBCached(PipelineStage):
    """webdataset's ``LMDBCached``: the first complete pass is written to an LMDB database, and
    later passes read it from there.  Not exactly resumable in a ``DataPipeline``.

    Raises:
        ImportError: ``lmdb`` is not installed.
    """

    def __init__(self, fname: str, map_size: float = 1e12, pickler: Any = None, chunksize: int = 500):
        import pickle

        import lmdb  # type: ignore[import-not-found]  # an optional dependency, as in webdataset

        self.db = lmdb.open(fname, readonly=False, map_size=int(map_size))
        self.pickler = pickle if pickler is None else pickler
        self.chunksize = chunksize

    def is_complete(self) -> bool:
        """Whether a complete pass is in the database."""
        with self.db.begin(write=False) as txn:
            return txn.get(b"_") is not None

    def add_samples(self, samples: Iterable[Any]) -> None:
        """Write ``(key, sample)`` pairs."""
        with self.db.begin(write=True) as txn:
            for key, sample in samples:
                txn.put(key.encode(), self.pickler.dumps(sample))

    def run(self, source: Iterable[Any]) -> Iterator[Any]:
        """The database's samples when complete, else ``source``'s, written as they pass."""
        if self.is_complete():
            with self.db.begin(write=False) as txn:
                for key, value in txn.cursor():
                    if key != b"_":
                        yield self.pickler.loads(value)
            return
        buffer: List[Any] = []
        for i, sample in enumerate(source):
            key = (isinstance(sample, dict) and sample.get("__key__")) or str(i)
            buffer.append((key, sample))
            if len(buffer) >= self.chunksize:
                self.add_samples(buffer)
                buffer = []
            yield sample
        if buffer:
            self.add_samples(buffer)
        with self.db.begin(write=True) as txn:
            txn.put(b"_", b"1")


def __getattr__(name: str) -> Any:
    """``TorchTensor``: torch's ``Tensor``; ``autodecode`` (webdataset's ``filters.autodecode``):
    the module. Each loaded on first use."""
    if name == "autodecode":
        from .. import autodecode

        return autodecode
    if name != "TorchTensor":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from .pytorch import torch_name  # lazy: imports torch

    return torch_name(__name__, name)


class ShuffleStage(StreamStage):
    """``shuffle(bufsize, initial)``: a buffer shuffle on a stream; the plan's seeded shuffle in a DataPipeline."""

    name = "shuffle"

    def __init__(self, bufsize: int = 1000, initial: int = 100, rng: Optional[random.Random] = None,
                 seed: Optional[int] = None, handler: Any = None):
        if seed is not None and rng is not None:
            raise ValueError("shuffle: give rng or seed, not both")
        self.bufsize, self.initial, self.rng, self.seed = int(bufsize), int(initial), rng, seed

    def __call__(self, src: Iterable[Any]) -> Iterator[Any]:
        rng = self.rng or random.Random(self.seed if self.seed is not None
                                        else int((os.getpid() + time.time()) * 1e9))
        return ShuffleRunner(self.bufsize, self.initial,
                                     pick=lambda n: rng.randint(0, n - 1)).run(iter(src))

    def spec(self) -> Optional[Stage]:
        """The engine's ``shuffle`` (compiled into the plan before ``batched``; ``bufsize < 1``: none)."""
        return Stage("shuffle", "shuffle", n=self.bufsize, initial=self.initial)


def shuffle(bufsize: int = 1000, initial: int = 100, rng: Optional[random.Random] = None,
            seed: Optional[int] = None, handler: Any = None) -> ShuffleStage:
    """Stage: shuffle with a buffer of ``bufsize`` (see :class:`ShuffleStage`)."""
    return ShuffleStage(bufsize, initial, rng, seed, handler)


class detshuffle(ShuffleStage, PipelineStage):
    """A buffer shuffle that is the same on every run: each run is a new epoch, ``Random(seed + epoch)``.

    Example:
        >>> s = detshuffle(10, seed=3)
        >>> a = list(s(iter(range(20)))); b = list(s(iter(range(20))))
        >>> sorted(a) == list(range(20)), a != b, s.epoch
        (True, True, 1)
    """

    name = "detshuffle"

    def __init__(self, bufsize: int = 1000, initial: int = 100, seed: int = 0, epoch: int = -1):
        super().__init__(bufsize, initial, seed=seed)
        self.epoch = epoch

    def run(self, src: Iterable[Any]) -> Iterator[Any]:
        """Shuffle ``src`` as the next epoch (webdataset's ``PipelineStage.run``)."""
        self.epoch += 1
        rng = random.Random()
        rng.seed(self.seed + self.epoch)  # type: ignore[operator]
        return ShuffleStage(self.bufsize, self.initial, rng=rng)(src)

    def __call__(self, src: Iterable[Any]) -> Iterator[Any]:
        return self.run(src)

    def spec(self) -> Optional[Stage]:
        """None: composed on a data set it runs as given (each run over a stream is its next epoch)."""
        return None


class BatchedStage(StreamStage):
    """``batched(n)``: lists of ``n`` samples, collated."""

    name = "batched"

    def __init__(self, batchsize: int = 20, collation_fn: Optional[Callable[[List[Any]], Any]] = default_collation_fn,
                 partial: bool = True):
        if int(batchsize) < 1:
            raise ValueError(f"batchsize must be >= 1, got {batchsize}")
        self.batchsize, self.collation_fn, self.partial = int(batchsize), collation_fn, partial

    def __call__(self, src: Iterable[Any]) -> Iterator[Any]:
        # webdataset's _batched: a full batch goes out when the next sample comes in (or at the end)
        batch: List[Any] = []
        for sample in src:
            if len(batch) >= self.batchsize:
                yield self._collate(batch)
                batch = []
            batch.append(sample)
        if batch and (len(batch) == self.batchsize or self.partial):
            yield self._collate(batch)

    def _collate(self, batch: List[Any]) -> Any:
        batch = [hide_positions(s) for s in batch]
        return self.collation_fn(batch) if self.collation_fn is not None else batch

    def spec(self) -> Stage:
        """The engine's ``batched`` (what its loader runs)."""
        return Stage("batched", "batched", n=self.batchsize, collation_fn=self.collation_fn,
                     partial=bool(self.partial))


def batched(batchsize: int = 20, collation_fn: Optional[Callable[[List[Any]], Any]] = default_collation_fn,
            partial: bool = True) -> BatchedStage:
    """Stage: batch samples (``partial=False`` drops a short last batch)."""
    return BatchedStage(batchsize, collation_fn, partial)


class _RunnerStage(StreamStage):
    """A stream stage run by its :mod:`resumewds.stages` runner; ``args``: its engine spec's arguments."""

    def __init__(self, name: str, make: Callable[[], Any], **args: Any):
        self.name, self.make, self.args = name, make, args

    def __call__(self, src: Iterable[Any]) -> Iterator[Any]:
        return self.make().run(iter(src))

    def spec(self) -> Stage:
        """The engine's stream stage of the same name (its runner keyed by seed, epoch and count)."""
        args = dict(self.args)
        if self.name == "rsample":
            args["p"] = float(args["p"])
            if not 0.0 <= args["p"] <= 1.0:
                raise ValueError(f"rsample: p must be in [0, 1], got {self.args['p']}")
        return Stage("stream", self.name, **args)


def unbatched() -> StreamStage:
    """Stage: split batches back into samples."""
    return _RunnerStage("unbatched", functools.partial(UnbatchRunner, False))


def unlisted() -> StreamStage:
    """Stage: flatten lists of samples (each must be a list, as in webdataset)."""
    return _RunnerStage("unlisted", functools.partial(UnbatchRunner, True))


class _RandomKeyRSample:
    """``rsample``'s runner with a key drawn from ``random`` per run, as webdataset's."""

    def __init__(self, p: float):
        self.p = p

    def __call__(self) -> Any:
        if not 0.0 <= self.p <= 1.0:
            raise ValueError(f"rsample: p must be in [0, 1], got {self.p}")
        return RSampleRunner(self.p, random.getrandbits(64))


def rsample(p: float = 0.5) -> StreamStage:
    """Stage: keep each sample with probability ``p`` (random: not exactly resumable)."""
    return _RunnerStage("rsample", _RandomKeyRSample(p), p=p)


def slice(*args: Any) -> StreamStage:
    """Stage: ``itertools.islice`` of the stream."""
    return _RunnerStage("slice", functools.partial(SliceRunner, *args), args=args)


def _info(data: Iterator[Any], fmt: Optional[str] = None, n: int = 3, every: int = -1, width: int = 50,
          stream: Any = None, name: str = "") -> Iterator[Any]:
    stream = stream or sys.stderr
    for i, sample in enumerate(data):
        if i < n or (every > 0 and (i + 1) % every == 0):
            if fmt is None:
                print("---", name, file=stream)
                for k, v in sample.items():
                    print(k, repr(v)[:width], file=stream)
            else:
                print(fmt.format(**sample), file=stream)
        yield sample


def info(fmt: Optional[str] = None, n: int = 3, every: int = -1, width: int = 50, stream: Any = None,
         name: str = "") -> StreamStage:
    """Stage: print the first ``n`` samples (to stderr)."""
    return _Generic("info", _info, fmt, n, every, width, stream, name)


def log_keys(logfile: Optional[str] = None) -> StreamStage:
    """Stage: append ``index, worker, rank, key`` of each sample to ``logfile``."""
    return _RunnerStage("log_keys", functools.partial(LogKeysRunner, logfile), logfile=logfile)


def _shuffle(data: Iterable[Any], bufsize: int = 1000, initial: int = 100, rng: Any = None,
             seed: Optional[int] = None, handler: Any = None) -> Iterator[Any]:
    return ShuffleStage(bufsize, initial, rng, seed, handler)(data)


def _select(data: Iterable[Any], predicate: Callable[[Any], bool]) -> Iterator[Any]:
    return select(predicate)(data)


def _map(data: Iterable[Any], f: Callable[[Any], Any], handler: ExnHandler = reraise_exception) -> Iterator[Any]:
    return map(f, handler=handler)(data)


def _rename(data: Iterable[Any], handler: ExnHandler = reraise_exception, keep: bool = True,
            **kw: str) -> Iterator[Any]:
    return rename(handler=handler, keep=keep, **kw)(data)


def _map_dict(data: Iterable[Any], handler: ExnHandler = reraise_exception, **kw: Any) -> Iterator[Any]:
    return map_dict(handler=handler, **kw)(data)


def _to_tuple(data: Iterable[Any], *args: str, handler: ExnHandler = reraise_exception,
              missing_is_error: bool = True, none_is_error: Optional[bool] = None) -> Iterator[Any]:
    return to_tuple(*args, handler=handler, missing_is_error=missing_is_error, none_is_error=none_is_error)(data)


def _map_tuple(data: Iterable[Any], *args: Any, handler: ExnHandler = reraise_exception) -> Iterator[Any]:
    return map_tuple(*args, handler=handler)(data)


def _batched(data: Iterable[Any], batchsize: int = 20, collation_fn: Any = default_collation_fn,
             partial: bool = True) -> Iterator[Any]:
    return BatchedStage(batchsize, collation_fn, partial)(data)


def _decode(data: Iterable[Any], *args: Any, handler: ExnHandler = reraise_exception, **kw: Any) -> Iterator[Any]:
    return decode(*args, handler=handler, **kw)(data)


def _extract_keys(source: Iterable[Any], *patterns: Any, duplicate_is_error: bool = True,
                  ignore_missing: bool = False) -> Iterator[Any]:
    return extract_keys(*patterns, duplicate_is_error=duplicate_is_error, ignore_missing=ignore_missing)(source)


def _rename_keys(source: Iterable[Any], *args: Any, keep_unselected: bool = False, must_match: bool = True,
                 duplicate_is_error: bool = True, **kw: str) -> Iterator[Any]:
    return rename_keys(*args, keep_unselected=keep_unselected, must_match=must_match,
                       duplicate_is_error=duplicate_is_error, **kw)(source)


def _xdecode(source: Iterable[Any], *args: Any, must_decode: bool = True,
             defaults: Sequence[Any] = default_decoders, **kw: Any) -> Iterator[Any]:
    return xdecode(*args, must_decode=must_decode, defaults=defaults, **kw)(source)
