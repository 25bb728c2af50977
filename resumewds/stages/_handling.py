"""The handler protocol: ``handler(exn) -> bool`` (webdataset's) re-raises to stop with the error,
returns True to skip and continue, or False to stop quietly (signalled by
:class:`~resumewds.errors.HandlerStop`, ended by :func:`until_stop`).  webdataset's other handlers
are in :mod:`resumewds.wds.handlers`.
"""

from __future__ import annotations

from typing import Any, Callable, Iterable, Iterator, Mapping, Optional, TypeVar

from ..errors import HandlerStop
from ..events import EventKind, event_record

Handler = Callable[[BaseException], bool]
T = TypeVar("T")

__all__ = ["Handler", "HandlerStop", "OnEvent", "SkippedSample", "empty_epoch_error", "report_stop",
           "reraise_exception", "until_stop"]


def until_stop(items: Iterable[T]) -> Iterator[T]:
    """``items``, ended quietly where a handler says stop: the one place a stream turns a handler's stop
    into its end.

    Example:
        >>> def gen():
        ...     yield 1
        ...     raise HandlerStop("bad shard")
        >>> list(until_stop(gen()))
        [1]
    """
    try:
        yield from items
    except HandlerStop as stop:
        report_stop(stop, None)  # (logged, if no data set recorded it on its way)
        return


def reraise_exception(exn: BaseException) -> bool:
    """Re-raise ``exn``: the default, the same as ``on_error="raise"``."""
    raise exn


def empty_epoch_error(epoch: int, skipped: Optional[Mapping[str, str]]) -> ValueError:
    """The error of an epoch of 0 samples (webdataset's ``empty_check``), naming the shards a handler
    skipped and why.

    Example:
        >>> str(empty_epoch_error(0, {"a.tar": "empty file"})).splitlines()[0]
        'No samples found in dataset: epoch 0 has 0 samples, every shard was skipped by the handler (1 shard):'
    """
    if not skipped:
        return ValueError(f"No samples found in dataset (epoch {epoch} has 0 samples); "
                          "turn this check off with empty_check=False")
    lines = [f"  {u}: {e}" for u, e in list(skipped.items())[:10]]
    more = [f"  ... and {len(skipped) - 10} more"] if len(skipped) > 10 else []
    return ValueError("\n".join([f"No samples found in dataset: epoch {epoch} has 0 samples, every shard was "
                                  f"skipped by the handler ({len(skipped)} shard{'s' if len(skipped) != 1 else ''}):",
                                  *lines, *more, "turn this check off with empty_check=False"]))


#: where a data set's events go: ``on_event(kind, url, **detail)`` (its ``_on_event``)
OnEvent = Callable[..., None]


class SkippedSample(Exception):
    """A stage's handler skipped an item (raised by :class:`resumewds.stages.Handled`): whatever runs the
    stage drops the item and reports the skip to its own data set's events (:meth:`report`).

    Example:
        >>> from resumewds.stages import Handled
        >>> seen = []
        >>> try:
        ...     Handled(int, lambda exc: True)({"__key__": "k", "__url__": "u"})
        ... except SkippedSample as skip:
        ...     skip.report(lambda kind, url, **d: seen.append((str(kind), url, d["key"])))
        >>> seen
        [('sample_skip', 'u', 'k')]
    """

    def __init__(self, item: Any, exc: BaseException, where: str):
        url = key = None
        if isinstance(item, dict):
            url, key = item.get("__url__"), item.get("__key__")
        self.url = str(url or "")
        self.detail = {"key": key, "stage": where, "error": f"{type(exc).__name__}: {exc}"}
        super().__init__(f"{where}: sample {key} skipped ({self.detail['error']})")

    def report(self, on_event: Optional[OnEvent]) -> None:
        """Record the skip as a ``sample_skip`` event of ``on_event`` (None: logged only)."""
        if on_event is None:
            event_record(EventKind.SAMPLE_SKIP, self.url, self.detail)
        else:
            on_event(EventKind.SAMPLE_SKIP, self.url, **self.detail)


def report_stop(stop: HandlerStop, on_event: Optional[OnEvent]) -> None:
    """Record the item whose handler said stop as a ``sample_skip`` event, once."""
    skip = getattr(stop, "skipped", None)
    if skip is not None:
        stop.skipped = None
        skip.report(on_event)
