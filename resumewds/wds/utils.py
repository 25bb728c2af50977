"""Names shared with webdataset's ``wds.utils`` module.

``enforce_security`` has webdataset 1.0.2's meaning and default (``WDS_SECURE`` or
``RESUMEWDS_SECURE``): local and ``pipe:`` sources, URL rewriting and unpickling refused.
It is read at each use, so setting it at run time works (the policy is on while either is set).
"""

from __future__ import annotations

import fnmatch
import functools
import glob
import importlib
import itertools
import re
import sys
import warnings
from typing import Any, Callable, Iterable, Iterator, List, Optional, Sequence, Tuple

from .. import config, sources
from ..plan import worker_info
from ..sources import EnforcedSecurityError, check_source_allowed, expand_braces

__all__ = ["EnforcedSecurityError", "ObsoleteException", "PipelineStage", "add_length_method", "check_source_allowed",
           "compute_sample_weights", "deprecated", "enforce_security", "fnmatch_with_braces",
           "glob_with_braces", "guess_batchsize", "identity", "is_iterable", "lookup_sym", "make_seed",
           "obsolete", "pytorch_worker_info", "pytorch_worker_seed", "repeatedly", "repeatedly0",
           "safe_eval"]

#: webdataset's switch (``WDS_SECURE``): local and ``pipe:`` sources, URL rewriting and unpickling refused
enforce_security: bool = sources.enforce_security
sources.watch_security_switch(sys.modules[__name__])


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
    """The batch size of a batch: the length of its first field."""
    return len(batch[0])


def repeatedly0(loader: Iterable[Any], nepochs: int = sys.maxsize, nbatches: int = sys.maxsize) -> Iterator[Any]:
    """``nepochs`` passes over ``loader``, at most ``nbatches`` items from each."""
    for _ in range(nepochs):
        yield from itertools.islice(loader, nbatches)


def repeatedly(source: Iterable[Any], nepochs: Optional[int] = None, nbatches: Optional[int] = None,
               nsamples: Optional[int] = None,
               batchsize: Callable[[Any], int] = guess_batchsize) -> Iterator[Any]:
    """Iterate ``source`` again and again (webdataset 1.0.2's ``utils.repeatedly``).

    Stops after ``nepochs`` passes, ``nbatches`` items, or once ``batchsize(item)`` adds up to
    ``nsamples``.  Unlike webdataset's, ``batchsize`` is used, and an empty pass ends it.

    Example:
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


class PipelineStage:
    """webdataset's base class of a stage object: ``run(src)`` returns the stage's iterator.

    Example:
        >>> class Twice(PipelineStage):
        ...     def run(self, src):
        ...         return (2 * x for x in src)
        >>> list(Twice().run(iter([1, 2])))
        [2, 4]
    """

    def invoke(self, *args: Any, **kw: Any) -> Any:
        """Not used (webdataset's abstract method); subclasses define :meth:`run`."""
        raise NotImplementedError

    def run(self, *args: Any, **kw: Any) -> Any:  # pragma: no cover - interface
        """The stage's output iterator for the input ``args[0]``."""
        raise NotImplementedError


def make_seed(*args: Any) -> int:
    """A 31-bit seed from ``args`` (webdataset's: ``hash`` of each, so salted for strings)."""
    seed = 0
    for arg in args:
        seed = (seed * 31 + hash(arg)) & 0x7FFFFFFF
    return seed


def glob_with_braces(pattern: str) -> List[str]:
    """``glob`` of every brace expansion of ``pattern``."""
    return [f for pat in expand_braces(pattern) for f in glob.glob(pat)]


def fnmatch_with_braces(filename: str, pattern: str) -> bool:
    """``fnmatch`` against any brace expansion of ``pattern``."""
    return any(fnmatch.fnmatch(filename, pat) for pat in expand_braces(pattern))


def safe_eval(s: str, expr: str = "{}") -> Any:
    """``eval(expr.format(s))`` for an ``s`` made only of letters, digits and ``_``."""
    if re.sub("[^A-Za-z0-9_]", "", s) != s:
        raise ValueError(f"safe_eval: illegal characters in: '{s}'")
    return eval(expr.format(s))  # webdataset's helper; input restricted above


def lookup_sym(sym: str, modules: Sequence[str]) -> Any:
    """The first ``module.sym`` found (relative names are resumewds modules), else None.

    Example:
        >>> lookup_sym("identity", [".utils"]) is identity
        True
    """
    for mname in modules:
        module = importlib.import_module(mname, package="resumewds")
        result = getattr(module, sym, None)
        if result is not None:
            return result
    return None


#: ``(rank, world_size, worker, num_workers)`` (:func:`resumewds.plan.worker_info`)
pytorch_worker_info = worker_info


def pytorch_worker_seed(group: Any = None) -> int:
    """``rank * 1000 + worker``, webdataset's per-worker seed."""
    rank, _, worker, _ = pytorch_worker_info(group)
    return rank * 1000 + worker


def deprecated(arg: Any = None) -> Any:
    """Decorator (``@deprecated`` or ``@deprecated("reason")``): warn with a ``DeprecationWarning`` on each call."""
    reason = None if callable(arg) else arg

    def decorator(func: Callable[..., Any]) -> Callable[..., Any]:
        @functools.wraps(func)
        def new_func(*args: Any, **kwargs: Any) -> Any:
            msg = f"Call to deprecated function {func.__name__}."
            if reason is not None:
                msg += " Reason: " + reason
            warnings.warn(msg, category=DeprecationWarning, stacklevel=2)
            return func(*args, **kwargs)

        return new_func

    return decorator(arg) if callable(arg) else decorator


class ObsoleteException(Exception):
    """A call to an :func:`obsolete` function without ``ALLOW_OBSOLETE=1``."""


def obsolete(func: Optional[Callable[..., Any]] = None, *, reason: Optional[str] = None) -> Any:
    """Decorator: calls raise :class:`ObsoleteException` unless ``ALLOW_OBSOLETE=1`` is set."""
    if func is None:
        return functools.partial(obsolete, reason=reason)
    f = func

    @functools.wraps(f)
    def new_func(*args: Any, **kwargs: Any) -> Any:
        if not config.value("allow_obsolete"):
            msg = f"Call to obsolete function {f.__name__}. Set env ALLOW_OBSOLETE=1 to permit."
            if reason is not None:
                msg += " Reason: " + reason
            raise ObsoleteException(msg)
        return f(*args, **kwargs)

    return new_func


def compute_sample_weights(n_w_pairs: Sequence[Tuple[float, float]]) -> Any:
    """``n * w`` of each ``(n, w)`` pair, scaled so the largest is 1 (a numpy array)."""
    import numpy as np

    ns = np.array([p[0] for p in n_w_pairs])
    ws = np.array([p[1] for p in n_w_pairs])
    weighted = ns * ws
    return weighted / np.amax(weighted)


def add_length_method(obj: Any) -> Any:
    """Give ``obj`` a ``__len__`` returning ``obj.size`` (webdataset's ``with_length``); returns ``obj``."""

    def length(self: Any) -> int:
        return self.size

    obj.__class__ = type(obj.__class__.__name__ + "_Length", (obj.__class__,), {"__len__": length})
    return obj
