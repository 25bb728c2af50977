"""Exception handlers with webdataset's names and protocol.

A handler is a callable ``handler(exn) -> bool``: it re-raises the exception
to stop with it, returns True to skip what failed and continue, or returns
False to stop iterating quietly.  They are the ``handler=`` arguments of
:class:`resumewds.WebDataset`, its stages and the composable pipeline.

Difference from webdataset 1.0.2: ``warn_and_continue`` / ``warn_and_stop``
do not sleep 0.5 s after warning (webdataset sleeps so the warning stays on
screen); a skipped item is counted in the loader's stats and the journal
instead.

Example:
    >>> from resumewds.handlers import ignore_and_continue, reraise_exception
    >>> ignore_and_continue(ValueError("bad sample"))
    True
    >>> reraise_exception(ValueError("bad sample"))
    Traceback (most recent call last):
    ...
    ValueError: bad sample
"""

from __future__ import annotations

import warnings
from typing import Callable, Iterable, Iterator, Mapping, Optional, TypeVar

Handler = Callable[[BaseException], bool]
T = TypeVar("T")

__all__ = ["Handler", "HandlerStop", "empty_epoch_error", "ignore_and_continue", "ignore_and_stop", "reraise_exception",
           "until_stop", "warn_and_continue", "warn_and_stop"]


class HandlerStop(Exception):
    """A handler returned False (``ignore_and_stop``, ``warn_and_stop``): stop iterating.

    Raised where the handler is asked (a stage, a shard read) and caught where
    the iteration can end quietly: :func:`until_stop`.
    """


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


def ignore_and_continue(exn: BaseException) -> bool:
    """Skip what failed and go on (like ``on_error="skip"``, without a warning)."""
    return True


def warn_and_continue(exn: BaseException) -> bool:
    """Warn with ``repr(exn)``, skip what failed and go on."""
    warnings.warn(repr(exn), stacklevel=2)
    return True


def ignore_and_stop(exn: BaseException) -> bool:
    """Stop iterating, quietly."""
    return False


def warn_and_stop(exn: BaseException) -> bool:
    """Warn with ``repr(exn)`` and stop iterating."""
    warnings.warn(repr(exn), stacklevel=2)
    return False


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
