"""Exception handlers with webdataset's names and protocol: ``handler(exn) -> bool``.

A handler re-raises to stop with the exception, returns True to skip what failed, or False to
stop quietly.  Unlike webdataset 1.0.2's, the ``warn_and_*`` handlers do not sleep 0.5 s.
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
