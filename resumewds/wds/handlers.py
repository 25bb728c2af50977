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

from ..errors import HandlerStop
from ..stages import Handler, empty_epoch_error, reraise_exception, until_stop

__all__ = ["Handler", "HandlerStop", "empty_epoch_error", "ignore_and_continue", "ignore_and_stop", "reraise_exception",
           "until_stop", "warn_and_continue", "warn_and_stop"]


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
