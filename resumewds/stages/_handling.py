"""The handler protocol: what a ``handler=`` argument is, and where a stop ends a stream.

A handler is a callable ``handler(exn) -> bool`` (webdataset's protocol): it
re-raises the exception to stop with it, returns True to skip what failed
and continue, or returns False to stop iterating quietly, which the stage or
shard read that asked signals with :class:`~resumewds.errors.HandlerStop`.
:func:`until_stop` is where a stream ends at that signal;
:func:`reraise_exception` is the default handler; :func:`empty_epoch_error`
is the error of an epoch whose every shard a handler skipped.  webdataset's
other handlers (``ignore_and_continue``, ``warn_and_stop``...) are in
:mod:`resumewds.wds.handlers`.

Example:
    >>> def gen():
    ...     yield 1
    ...     raise HandlerStop("bad shard")
    >>> list(until_stop(gen()))
    [1]
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
    """``items``, ended quietly where a handler says stop (:class:`HandlerStop`).

    The one place a stream turns a handler's stop into its end: a composable
    stage, a data set's or a mixture's direct iteration, a DataPipeline.

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
    """The error of an epoch of 0 samples: names the shards a handler skipped, and why.

    webdataset raises ``ValueError("No samples found in dataset ...")`` there
    (``empty_check``); an epoch whose every shard was skipped is no success.

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
    """A stage's handler skipped an item.

    Raised by :class:`resumewds.stages.Handled` when its handler says skip.
    Whatever runs the stage (the step engine, a stream runner, a pipeline
    stage) catches it, drops the item, and reports the skip to the events of
    the data set it runs the stage for (:meth:`report`): each data set keeps
    its own skips, however many are read in one process.

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
        """Record the skip as a ``sample_skip`` event of ``on_event`` (stats, journal); None:
        logged only (a stage run by hand, no data set)."""
        if on_event is None:
            event_record(EventKind.SAMPLE_SKIP, self.url, self.detail)
        else:
            on_event(EventKind.SAMPLE_SKIP, self.url, **self.detail)


def report_stop(stop: HandlerStop, on_event: Optional[OnEvent]) -> None:
    """Record the item whose handler said stop (a :class:`~resumewds.stages.Handled` stage's ``HandlerStop``)
    as a ``sample_skip`` event of ``on_event``, once, before the stop goes on up."""
    skip = getattr(stop, "skipped", None)
    if skip is not None:
        stop.skipped = None
        skip.report(on_event)
