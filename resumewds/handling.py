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

from typing import Callable, Iterable, Iterator, Mapping, Optional, TypeVar

from .errors import HandlerStop

Handler = Callable[[BaseException], bool]
T = TypeVar("T")

__all__ = ["Handler", "HandlerStop", "empty_epoch_error", "reraise_exception", "until_stop"]


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
    except HandlerStop:
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
