"""The stream stages (``batched``, ``unbatched``, ``unlisted``, ``slice``, ``rsample``, a buffer
``shuffle``, ``log_keys``, a user generator): one runner per stage, whichever form runs it.

The fluent form (:meth:`resumewds.stages.Stage.runner`) and the composable one (``filters.batched(n)``)
differ only in where randomness comes from: the fluent form hashes ``(seed, epoch, stage, count)``,
so a state is exact; ``filters.shuffle`` / ``filters.rsample`` draw as webdataset's do.

Example:
    >>> list(BatchRunner(2, None, True).run(iter(range(5))))
    [[0, 1], [2, 3], [4]]
    >>> list(SliceRunner(1, 6, 2).run(iter(range(10))))
    [1, 3, 5]
"""

from __future__ import annotations

from typing import Any, Callable, Iterator, List, Optional, Sequence

import xxhash

from ..errors import HandlerStop
from ._handling import OnEvent, SkippedSample, report_stop
from ._positions import hide_positions

__all__ = ["BatchRunner", "LogKeysRunner", "MapRunner", "OpaqueRunner", "RSampleRunner", "Runner",
           "ShuffleRunner", "SliceRunner", "UnbatchRunner", "unit"]


class Runner:
    """One stream stage's run over one worker's share of an epoch.

    It reports how many items it holds (``buffered``) and has taken in (``count``): the data set
    records a *clean point* whenever every runner is empty, and a state is "replay from that clean
    point, skip k outputs" (exact, no sample bytes stored).
    """

    def __init__(self) -> None:
        self.count = 0
        self.buffered = 0

    def run(self, src: Iterator[Any]) -> Iterator[Any]:  # pragma: no cover - interface
        raise NotImplementedError


class MapRunner(Runner):
    """A per-sample stage on the stream: None drops the item; a handler's skip is a ``sample_skip``
    event of ``on_event``."""

    def __init__(self, fn: Callable[[Any], Any], on_event: Optional[OnEvent] = None):
        super().__init__()
        self.fn = fn
        self.on_event = on_event

    def run(self, src: Iterator[Any]) -> Iterator[Any]:
        fn = self.fn
        for x in src:
            self.count += 1
            try:
                y = fn(x)
            except SkippedSample as skip:
                skip.report(self.on_event)
                continue
            except HandlerStop as stop:
                report_stop(stop, self.on_event)
                raise
            if y is not None:
                yield y


class BatchRunner(Runner):
    def __init__(self, n: int, collation_fn: Optional[Callable[[List[Any]], Any]], partial: bool):
        super().__init__()
        self.n, self.collation_fn, self.partial = n, collation_fn, partial

    def run(self, src: Iterator[Any]) -> Iterator[Any]:
        batch: List[Any] = []
        for x in src:
            self.count += 1
            batch.append(x)
            self.buffered = len(batch)
            if len(batch) >= self.n:
                out, batch = [hide_positions(s) for s in batch], []
                self.buffered = 0
                yield self.collation_fn(out) if self.collation_fn is not None else out
        self.buffered = 0
        if batch and (len(batch) == self.n or self.partial):
            batch = [hide_positions(s) for s in batch]
            yield self.collation_fn(batch) if self.collation_fn is not None else batch


class UnbatchRunner(Runner):
    def __init__(self, listed: bool):
        super().__init__()
        self.listed = listed

    def run(self, src: Iterator[Any]) -> Iterator[Any]:
        for b in src:
            self.count += 1
            if self.listed:
                if not isinstance(b, list):
                    raise ValueError(f"unlisted() needs lists, got {type(b).__name__}")
                items: Sequence[Any] = b
            elif isinstance(b, (list, tuple)):
                items = [tuple(x[i] for x in b) for i in range(len(b[0]))] if len(b) else []
            elif isinstance(b, dict):
                lengths = {len(v) for v in b.values()}
                if len(lengths) != 1:
                    raise ValueError(f"unbatched(): fields of different lengths {sorted(lengths)}")
                n = lengths.pop()
                items = [{k: v[i] for k, v in b.items()} for i in range(n)]
            else:
                raise ValueError(f"unknown sample type: {type(b)}")
            for i, x in enumerate(items):
                self.buffered = len(items) - i - 1
                yield x
            self.buffered = 0


class SliceRunner(Runner):
    """``itertools.islice(src, *args)``: the same items, the same refusal of negative
    bounds, and nothing taken after the stop."""

    def __init__(self, *args: Optional[int]):
        super().__init__()
        sl = slice(*args)
        for name, v in (("start", sl.start), ("stop", sl.stop), ("step", sl.step)):
            if v is not None and (not isinstance(v, int) or v < (1 if name == "step" else 0)):
                raise ValueError(f"slice: {name} must be None or an integer >= "
                                 f"{1 if name == 'step' else 0}, got {v!r} (as itertools.islice)")
        self.start, self.stop, self.step = sl.start or 0, sl.stop, sl.step or 1

    def run(self, src: Iterator[Any]) -> Iterator[Any]:
        stop = self.stop
        if stop is not None and self.count >= stop:
            return
        for x in src:
            i = self.count
            self.count += 1
            if i >= self.start and (i - self.start) % self.step == 0:
                yield x
            if stop is not None and self.count >= stop:
                return


def unit(key: int, i: int) -> float:
    return xxhash.xxh3_64_intdigest(i.to_bytes(8, "little"), key & ((1 << 64) - 1)) / float(1 << 64)


class RSampleRunner(Runner):
    def __init__(self, p: float, key: int):
        super().__init__()
        self.p, self.key = p, key

    def run(self, src: Iterator[Any]) -> Iterator[Any]:
        for x in src:
            i = self.count
            self.count += 1
            if unit(self.key, i) < self.p:
                yield x


class ShuffleRunner(Runner):
    """A buffer shuffle (webdataset's algorithm); ``pick(n)`` chooses the index in a buffer of ``n``
    (default: a hash of ``(key, picks so far)``, exact on resume; ``filters.shuffle`` passes ``rng.randint``)."""

    def __init__(self, size: int, initial: int, key: int = 0,
                 pick: Optional[Callable[[int], int]] = None):
        super().__init__()
        self.size, self.initial, self.key = size, min(initial, size), key
        self.pick = pick
        self.picks = 0

    def _pick(self, buf: List[Any]) -> Any:
        n = len(buf)
        k = self.pick(n) if self.pick is not None else int(unit(self.key, self.picks) * n)
        self.picks += 1
        buf[k], buf[-1] = buf[-1], buf[k]
        out = buf.pop()
        self.buffered = len(buf)
        return out

    def run(self, src: Iterator[Any]) -> Iterator[Any]:
        buf: List[Any] = []
        self.picks = self.count  # a clean point has an empty buffer: every input was picked
        src = iter(src)
        for x in src:
            self.count += 1
            buf.append(x)
            if len(buf) < self.size:
                try:
                    buf.append(next(src))  # fill the buffer twice as fast (webdataset)
                    self.count += 1
                except StopIteration:
                    pass
            self.buffered = len(buf)
            if len(buf) >= self.initial:
                yield self._pick(buf)
        while buf:
            yield self._pick(buf)
        self.buffered = 0


class OpaqueRunner(Runner):
    """A user generator ``f(iterator) -> iterator`` (``compose``): never known to be empty,
    so a state replays the epoch from its start (still exact if ``f`` is deterministic)."""

    def __init__(self, f: Callable[[Iterator[Any]], Iterator[Any]]):
        super().__init__()
        self.f = f
        self.buffered = 1

    def run(self, src: Iterator[Any]) -> Iterator[Any]:
        def counted() -> Iterator[Any]:
            for x in src:
                self.count += 1
                yield x

        return iter(self.f(counted()))


class LogKeysRunner(Runner):
    def __init__(self, logfile: Optional[str]):
        super().__init__()
        self.logfile = logfile

    def run(self, src: Iterator[Any]) -> Iterator[Any]:
        if not self.logfile:
            yield from src
            return
        import fcntl

        with open(self.logfile, "a") as stream:
            for x in src:
                i = self.count
                self.count += 1
                get = x.get if isinstance(x, dict) else (lambda k: None)
                line = f"{i}\t{get('__worker__')}\t{get('__rank__')}\t{get('__key__')}\n"
                fcntl.flock(stream.fileno(), fcntl.LOCK_EX)
                try:
                    stream.write(line)
                    stream.flush()
                finally:
                    fcntl.flock(stream.fileno(), fcntl.LOCK_UN)
                yield x
