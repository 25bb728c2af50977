"""Pipeline stages with webdataset's names and semantics, for :class:`resumewds.DataPipeline`.

Each factory (``shuffle(1000)``, ``decode("rgb8")``, ``to_tuple("jpg cls")``,
``map(f)``, ``batched(64)``...) returns a stage: a callable that takes an
iterator and returns one, exactly as webdataset 1.0.2's stages do, so they
also work in a generic pipeline or by hand (``list(map(f)(iter(xs)))``).

Inside a :class:`~resumewds.DataPipeline` the per-sample stages (``decode``,
``map``, ``map_dict``, ``map_tuple``, ``to_tuple``, ``select``,
``rename``, ``rename_keys``, ``extract_keys``, ``xdecode``), ``shuffle``
and ``batched`` are *recognised*: they are compiled into the deterministic
plan (a sample-level ``shuffle(n)`` becomes the plan's seeded window
shuffle, a shard-level one the shard order shuffle), which resumes exactly.
Other stages (``unbatched``, ``slice``, ``rsample``, ``info``, your own
generators) run as given, on the stream.

``handler=`` follows webdataset: ``handler(exn)`` True skips the sample
(counted as filtered), False stops the iteration, or it re-raises.

Example:
    >>> list(map(lambda x: x * 2)(iter([1, 2, 3])))
    [2, 4, 6]
    >>> list(batched(2, collation_fn=None)(iter(range(5))))
    [[0, 1], [2, 3], [4]]
"""

from __future__ import annotations

import builtins
import functools
import io
import os
import random
import re
import sys
import time
from fnmatch import fnmatch
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Sequence

from .. import autodecode, runners
from ..errors import HandlerStop
from ..stages import (
    ExtractKeys,
    Handled,
    Map,
    MapDict,
    MapTuple,
    Rename,
    RenameKeys,
    Select,
    ToTuple,
    default_collation_fn,
    getfirst,
)
from .handlers import reraise_exception, until_stop
from .utils import PipelineStage

__all__ = ["Stage", "SampleStage", "associate", "batched", "decode", "default_collation_fn", "detshuffle",
           "extract_keys", "identity", "parse_field_spec", "transform_with",
           "getfirst", "info", "log_keys", "map", "map_dict", "map_tuple", "pipelinefilter",
           "rename", "rename_keys", "rsample", "select", "shuffle", "slice", "to_tuple",
           "unbatched", "unlisted", "xdecode"]

ExnHandler = Callable[[BaseException], bool]


#: what a stage raises when its handler says stop (the dataset's HandlerStop: one exception everywhere)
StopPipeline = HandlerStop


class Stage:
    """A stage: ``stage(iterator) -> iterator``.  ``name`` says what it is."""

    name = "stage"

    def __call__(self, src: Iterable[Any]) -> Iterator[Any]:
        raise NotImplementedError

    def __repr__(self) -> str:
        return f"<{self.name}>"


class SampleStage(Stage):
    """A stage that maps each item on its own: ``fn(x) -> y`` or None to drop ``x``.

    ``fn`` raises :class:`StopPipeline` when the handler says stop.
    """

    def __init__(self, name: str, fn: Callable[[Any], Any]):
        self.name = name
        self.fn = fn

    def __call__(self, src: Iterable[Any]) -> Iterator[Any]:
        return until_stop(self._run(src))

    def _run(self, src: Iterable[Any]) -> Iterator[Any]:
        fn = self.fn
        for x in src:
            y = fn(x)
            if y is not None:
                yield y


def _stage(name: str, fn: Callable[[Any], Any], handler: ExnHandler = reraise_exception) -> SampleStage:
    return SampleStage(name, fn if handler is reraise_exception else Handled(fn, handler, name))


class _Generic(Stage):
    def __init__(self, name: str, f: Callable[..., Iterator[Any]], *args: Any, **kw: Any):
        self.name, self.f, self.args, self.kw = name, f, args, kw

    def __call__(self, src: Iterable[Any]) -> Iterator[Any]:
        return self.f(iter(src), *self.args, **self.kw)


def pipelinefilter(f: Callable[..., Iterator[Any]]) -> Callable[..., Stage]:
    """Turn ``f(src, *args, **kw)`` into a stage factory ``f(*args, **kw)(src)`` (webdataset's helper)."""
    def factory(*args: Any, **kw: Any) -> Stage:
        return _Generic(getattr(f, "__name__", "stage"), f, *args, **kw)
    factory.__name__ = getattr(f, "__name__", "stage")
    factory.__doc__ = f.__doc__
    return factory


def parse_field_spec(fields: Any) -> List[List[str]]:
    """``"jpg;png cls"`` (or a list) as lists of alternatives (webdataset's helper).

    Example:
        >>> parse_field_spec("jpg;png cls")
        [['jpg', 'png'], ['cls']]
    """
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

    A function of the sample's key, so a DataPipeline compiles it into the plan like ``map``.

    Example:
        >>> list(associate({"a": {"cls": 1}})(iter([{"__key__": "a"}, {"__key__": "b"}])))
        [{'__key__': 'a', 'cls': 1}, {'__key__': 'b'}]
    """
    return SampleStage("associate", _Associate(associator))


# ---- per-sample stages: the callables of resumewds.pipeline, one per webdataset name ----

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
    return _stage("decode", autodecode.Decoder(args, **kw), handler)  # the fluent .decode's decoder


def _decode_bin(stream: Any) -> bytes:
    return stream.read()


def _decode_text(stream: Any) -> str:
    return stream.read().decode("utf-8")


def _decode_pickle(stream: Any) -> Any:
    return autodecode.unpickle_loads(stream.read())


default_decoders = [("*.bin", _decode_bin), ("*.txt", _decode_text), ("*.pyd", _decode_pickle)]


class _XDecode:
    def __init__(self, args: Sequence[Any], must_decode: bool, defaults: Sequence[Any], kw: Dict[str, Any]):
        self.decoders = list(defaults) + list(args) + [("*." + k, v) for k, v in kw.items()]
        self.must_decode = must_decode

    def _find(self, path: str) -> Any:
        fname = re.sub(r".*/", "", path)
        if fname.startswith("__"):
            return lambda x: x
        for pattern, fun in self.decoders[::-1]:
            if fnmatch(fname.lower(), pattern) or fnmatch("." + fname.lower(), pattern):
                return fun
        return None

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


# ---- stream stages -------------------------------------------------------------------

class ShuffleStage(Stage):
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
        return runners.ShuffleRunner(self.bufsize, self.initial,
                                     pick=lambda n: rng.randint(0, n - 1)).run(iter(src))


def shuffle(bufsize: int = 1000, initial: int = 100, rng: Optional[random.Random] = None,
            seed: Optional[int] = None, handler: Any = None) -> ShuffleStage:
    """Stage: shuffle with a buffer of ``bufsize`` (see :class:`ShuffleStage`)."""
    return ShuffleStage(bufsize, initial, rng, seed, handler)


class detshuffle(ShuffleStage, PipelineStage):
    """``detshuffle(bufsize, initial, seed, epoch)``: a buffer shuffle that is the same on every run.

    As webdataset 1.0.2's: each run over a stream is a new epoch (``self.epoch``
    counts from ``epoch``, default -1, so the first run is epoch 0) and shuffles
    with ``random.Random(seed + epoch)``: two pipelines built alike give the same
    order, and each further iteration a new one.  Inside a
    :class:`resumewds.DataPipeline` it is compiled like :func:`shuffle` with
    ``seed=`` (the plan's seeded shuffle, also a new order each epoch).

    Example:
        >>> s = detshuffle(10, seed=3)
        >>> a = list(s(iter(range(20)))); b = list(s(iter(range(20))))
        >>> sorted(a) == list(range(20)), a != b, s.epoch
        (True, True, 1)
        >>> a == list(detshuffle(10, seed=3)(iter(range(20))))
        True
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


# webdataset's default collation: the one the fluent ``.batched(n)`` uses
# (resumewds.pipeline.default_collation_fn, imported above)


class BatchedStage(Stage):
    """``batched(n)``: lists of ``n`` samples, collated."""

    name = "batched"

    def __init__(self, batchsize: int = 20, collation_fn: Optional[Callable[[List[Any]], Any]] = default_collation_fn,
                 partial: bool = True):
        if int(batchsize) < 1:
            raise ValueError(f"batchsize must be >= 1, got {batchsize}")
        self.batchsize, self.collation_fn, self.partial = int(batchsize), collation_fn, partial

    def __call__(self, src: Iterable[Any]) -> Iterator[Any]:
        return runners.BatchRunner(self.batchsize, self.collation_fn, self.partial).run(iter(src))


def batched(batchsize: int = 20, collation_fn: Optional[Callable[[List[Any]], Any]] = default_collation_fn,
            partial: bool = True) -> BatchedStage:
    """Stage: batch samples (``partial=False`` drops a short last batch)."""
    return BatchedStage(batchsize, collation_fn, partial)


class _RunnerStage(Stage):
    """A stream stage run by its :mod:`resumewds.runners` runner (the fluent form's)."""

    def __init__(self, name: str, make: Callable[[], Any]):
        self.name, self.make = name, make

    def __call__(self, src: Iterable[Any]) -> Iterator[Any]:
        return self.make().run(iter(src))


def unbatched() -> Stage:
    """Stage: split batches back into samples."""
    return _RunnerStage("unbatched", functools.partial(runners.UnbatchRunner, False))


def unlisted() -> Stage:
    """Stage: flatten lists of samples (each must be a list, as in webdataset)."""
    return _RunnerStage("unlisted", functools.partial(runners.UnbatchRunner, True))


class _RandomKeyRSample:
    """``rsample``'s runner with a key drawn from ``random`` per run (``random.seed``
    repeats it, as webdataset's draws from ``random``)."""

    def __init__(self, p: float):
        self.p = p

    def __call__(self) -> Any:
        if not 0.0 <= self.p <= 1.0:
            raise ValueError(f"rsample: p must be in [0, 1], got {self.p}")
        return runners.RSampleRunner(self.p, random.getrandbits(64))


def rsample(p: float = 0.5) -> Stage:
    """Stage: keep each sample with probability ``p`` (random: not exactly resumable)."""
    return _RunnerStage("rsample", _RandomKeyRSample(p))


def slice(*args: Any) -> Stage:
    """Stage: ``itertools.islice`` of the stream."""
    return _RunnerStage("slice", functools.partial(runners.SliceRunner, *args))


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
         name: str = "") -> Stage:
    """Stage: print the first ``n`` samples (to stderr)."""
    return _Generic("info", _info, fmt, n, every, width, stream, name)


def log_keys(logfile: Optional[str] = None) -> Stage:
    """Stage: append ``index, worker, rank, key`` of each sample to ``logfile``."""
    return _RunnerStage("log_keys", functools.partial(runners.LogKeysRunner, logfile))


_ = builtins  # map/slice shadow builtins here on purpose (webdataset's names)


# ---- webdataset's generator forms (``_map(data, f)`` ...), for code and tests that call them ----

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
