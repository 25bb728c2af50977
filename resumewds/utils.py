"""Names shared with webdataset's ``wds.utils`` module.

``enforce_security`` has webdataset 1.0.2's meaning and default (the
``WDS_SECURE`` environment variable, or ours, ``RESUMEWDS_SECURE``; off
unless set).  When True:

* decoders refuse every pickle-based member (``pkl``, ``pickle``, ``pyd``,
  ``pth``) even with ``allow_pickle=True``;
* shard sources that are local files (plain paths, ``file:`` URLs, local
  manifests) or ``pipe:`` commands are refused, by ``WebDataset``,
  ``DataPipeline``, ``resumewds.gopen.gopen`` and ``tarfile_to_samples``
  alike; only remote URLs (``http(s)://``, ``s3://``) and ``"-"`` are opened;
* ``GOPEN_REWRITE`` URL rewriting is refused.

It is read at each use, so setting ``resumewds.utils.enforce_security =
True`` at run time works as it does in webdataset.

Example:
    >>> import resumewds.utils
    >>> isinstance(resumewds.utils.enforce_security, bool)
    True
    >>> len(list(repeatedly(range(3), nepochs=2)))
    6
"""

from __future__ import annotations

import itertools
import sys
from typing import Any, Callable, Iterable, Iterator, Optional

from . import config
from .errors import UnsafeSourceError

__all__ = ["EnforcedSecurityError", "check_source_allowed", "enforce_security", "guess_batchsize", "identity",
           "is_iterable", "repeatedly", "repeatedly0"]

enforce_security: bool = bool(config.value("secure"))


class EnforcedSecurityError(UnsafeSourceError, ValueError):
    """Refused because :data:`enforce_security` is set: a pickle-based member,
    a local or ``pipe:`` source, a ``GOPEN_REWRITE`` rewrite.

    A ``ValueError`` too, as webdataset raises in the same places; the
    message starts with webdataset's (``"gopen: unsafe_gopen is False, ..."``).
    """


def _is_local(url: str) -> bool:
    if url.startswith("file:"):
        return True
    if url.startswith("pipe:") or url == "-":
        return False
    return "://" not in url


def check_source_allowed(url: str) -> None:
    """Raise :class:`EnforcedSecurityError` if :data:`enforce_security` forbids opening ``url``.

    Forbidden when set: local paths, ``file:`` URLs and ``pipe:`` commands.

    Example:
        >>> check_source_allowed("/data/shard-000000.tar")  # enforce_security is off
    """
    if not enforce_security:
        return
    if url.startswith("pipe:"):
        raise EnforcedSecurityError(f"gopen_pipe: unsafe_gopen is False, cannot open pipe URLs: {url} "
                            "(resumewds.utils.enforce_security / WDS_SECURE is set)")
    if _is_local(url):
        raise EnforcedSecurityError(f"gopen: unsafe_gopen is False, cannot open local files: {url} "
                            "(resumewds.utils.enforce_security / WDS_SECURE is set)")


def identity(x: Any) -> Any:
    """Return ``x`` (webdataset's ``utils.identity``)."""
    return x


def is_iterable(obj: Any) -> bool:
    """True for iterables other than ``str`` and ``bytes`` (webdataset's rule)."""
    if isinstance(obj, (str, bytes)):
        return False
    try:
        iter(obj)
    except TypeError:
        return False
    return True


def guess_batchsize(batch: Any) -> int:
    """The batch size of a batch: the length of its first field.

    Example:
        >>> guess_batchsize(([1, 2, 3], [0, 1, 0]))
        3
    """
    return len(batch[0])


def repeatedly0(loader: Iterable[Any], nepochs: int = sys.maxsize, nbatches: int = sys.maxsize) -> Iterator[Any]:
    """``nepochs`` passes over ``loader``, at most ``nbatches`` items from each."""
    for _ in range(nepochs):
        yield from itertools.islice(loader, nbatches)


def repeatedly(source: Iterable[Any], nepochs: Optional[int] = None, nbatches: Optional[int] = None,
               nsamples: Optional[int] = None,
               batchsize: Callable[[Any], int] = guess_batchsize) -> Iterator[Any]:
    """Iterate ``source`` again and again (webdataset 1.0.2's ``utils.repeatedly``).

    Stops after ``nepochs`` full passes, after ``nbatches`` items in all, or
    once the items' sizes (``batchsize(item)``) add up to ``nsamples``,
    whichever comes first; with none of them it goes on forever.

    Differences from webdataset: ``batchsize`` is used (webdataset ignores
    it and always calls ``guess_batchsize``), and a pass that yields nothing
    ends the iteration instead of looping forever.

    Example:
        >>> len(list(repeatedly(range(3), nbatches=10)))
        10
        >>> len(list(repeatedly([[[1, 1], [2, 2]]] * 3, nsamples=10)))
        5
    """
    epoch = batch = total = 0
    while True:
        seen = False
        for item in source:
            seen = True
            yield item
            batch += 1
            if nbatches is not None and batch >= nbatches:
                return
            if nsamples is not None:
                total += batchsize(item)
                if total >= nsamples:
                    return
        epoch += 1
        if not seen or (nepochs is not None and epoch >= nepochs):
            return
