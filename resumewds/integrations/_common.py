"""What the framework integrations share: which loaders are ours, a torch DataLoader as a
WebLoader, the marks left on what an integration handles, one method rebound on one object."""

from __future__ import annotations

import logging
import types
from typing import Any, Dict, List, Optional, Set

from ..run import mark_checkpointed

log = logging.getLogger("resumewds")


def _is_resumewds_loader(obj: Any) -> bool:
    """A WebLoader, or a loader chain over one (their states have the resumewds format)."""
    from ..loader import WebLoader  # lazy: imports torch; `import resumewds.integrations` stays light

    return isinstance(obj, WebLoader) or (isinstance(getattr(obj, "loader", None), WebLoader)
                                          and hasattr(obj, "load_state_dict"))


def _webloader_for(loader: Any, stateful: bool = True) -> Optional[Any]:
    """The WebLoader equivalent to a torch ``DataLoader`` over a resumewds data set (same batch size,
    workers, collate function...); None for anything else (unless ``stateful``, also for a loader with
    its own state)."""
    from torch.utils.data import DataLoader

    from ..loader import WebLoader  # lazy: imports torch, as the line above

    dataset: Any = getattr(loader, "dataset", None)
    if not isinstance(loader, DataLoader) or not hasattr(dataset, "iter_steps") or (
            not stateful and hasattr(loader, "state_dict")):
        return None
    from torch.utils.data._utils.collate import default_collate as torch_default

    kwargs: Dict[str, Any] = {}
    if loader.collate_fn is not None and loader.collate_fn is not torch_default:
        kwargs["collate_fn"] = loader.collate_fn
    if loader.num_workers:
        kwargs["prefetch_factor"] = loader.prefetch_factor
        kwargs["persistent_workers"] = loader.persistent_workers
    log.info("resumewds: a torch DataLoader over a resumewds dataset becomes a WebLoader "
             "(each rank reads its own share, and the position is checkpointed)")
    return WebLoader(dataset, batch_size=loader.batch_size, num_workers=loader.num_workers,
                     drop_last=loader.drop_last, pin_memory=loader.pin_memory, timeout=loader.timeout, **kwargs)


def _mark_checkpointed(loader: Any, framework: str) -> None:
    """Say that ``framework``'s checkpoints hold ``loader``'s position: on the loader, the loaders it
    wraps, and their data sets."""
    seen = 0
    obj = loader
    while obj is not None and seen < 8:
        for target in (obj, getattr(obj, "dataset", None)):
            if target is not None:
                mark_checkpointed(target, framework)
        inner = getattr(obj, "loader", None)
        obj, seen = (inner if inner is not obj else None), seen + 1


def _rebind(obj: Any, method: str, **names: Any) -> None:
    """Run ``obj.method``, for this object only, with ``names`` in place of the module globals its
    class's method calls (a framework calls a module-level function at a point no hook reaches).
    The framework's module and class, and every other object, stay as they are; :func:`_unbind`
    undoes it.

    Raises:
        RuntimeError: the method no longer calls those names (another version of the framework).

    Example:
        >>> class Loop:
        ...     def run(self):
        ...         return len("abc")
        >>> loop = Loop(); _rebind(loop, "run", len=lambda s: -1)
        >>> loop.run(), Loop().run()
        (-1, 3)
    """
    func = getattr(type(obj), method)
    missing = sorted(set(names) - set(func.__code__.co_names))
    if missing:
        raise RuntimeError(f"resumewds: {type(obj).__qualname__}.{method} of this version of "
                           f"{type(obj).__module__.split('.')[0]} does not call {', '.join(missing)}: the integration "
                           "cannot serve it (see docs/FRAMEWORKS.md for the tested versions)")
    scope = dict(func.__globals__)
    scope.update(names)
    clone = types.FunctionType(func.__code__, scope, func.__name__, func.__defaults__, func.__closure__)
    clone.__kwdefaults__ = func.__kwdefaults__
    clone.__qualname__ = func.__qualname__
    clone.__doc__ = func.__doc__
    setattr(obj, method, types.MethodType(clone, obj))


def _unbind(obj: Any, method: str) -> None:
    """Undo :func:`_rebind`: ``obj.method`` is its class's again."""
    vars(obj).pop(method, None)


def resumewds_loaders(obj: Any) -> List[Any]:
    """The resumewds loaders in ``obj`` (a loader, a list / tuple / dict of them, or anything with
    ``flattened`` or ``iterables``, as Lightning's ``CombinedLoader``), in a stable order; a container
    that holds itself is followed once.

    Raises:
        ValueError: containers nest more than ``_MAX_NESTING`` deep (a ``flattened`` that makes a new
            container each time it is read).

    Example:
        >>> resumewds_loaders([1, {"a": "x"}])
        []
    """
    return _loaders_in(obj, set(), 0)


_MAX_NESTING = 100


def _loaders_in(obj: Any, path: Set[int], depth: int) -> List[Any]:
    """:func:`resumewds_loaders` of ``obj`` inside the containers ``path`` (their ids)."""
    if obj is None or id(obj) in path:
        return []
    if _is_resumewds_loader(obj):
        return [obj]
    if depth >= _MAX_NESTING:
        raise ValueError(f"resumewds_loaders: containers nest more than {_MAX_NESTING} levels deep at "
                         f"{type(obj).__name__} (does its `flattened` or `iterables` make a new container "
                         "each time it is read?)")
    if isinstance(obj, (list, tuple)):
        items: Any = obj
    elif isinstance(obj, dict):
        items = obj.values()
    else:
        items = None
        for attr in ("flattened", "iterables"):
            inner = getattr(obj, attr, None)
            if inner is not None and inner is not obj and not isinstance(inner, (str, bytes)):
                items = [inner]
                break
        if items is None:
            return []
    path.add(id(obj))
    try:
        return [x for item in items for x in _loaders_in(item, path, depth + 1)]
    finally:
        path.discard(id(obj))


def _batches_done(loader: Any) -> Any:
    """Batches of the current epoch already handed out (None: a loader of unknown length)."""
    try:
        left = getattr(loader, "batches_left", None)
        return None if left is None else len(loader) - left
    except TypeError:
        return None


def _skip_in_place(loader: Any, num_batches: int, framework: str) -> Any:
    """A framework asks to skip the first ``num_batches`` of a restored loader: it is there already
    (a warning where the counts differ: the framework's epoch boundaries move)."""
    done = _batches_done(loader)
    if num_batches and done is not None and done != num_batches:
        log.warning("resumewds: %s counts %d batches trained in this epoch, the restored loader %d (world size "
                    "or batch size changed?): the data continues exactly where the checkpoint was taken, the "
                    "framework's epoch boundaries move", framework, num_batches, done)
    return loader


def _check_world(loader: Any, world_size: int, framework: str, hint: str) -> None:
    """Refuse a loader built for another world size than the framework runs."""
    base = getattr(loader, "loader", loader)
    take = getattr(base, "_take_world", None)
    if take is not None:  # built before the framework set up its processes: the world of now
        take()
    have = int(getattr(base, "world_size", world_size))
    if have != int(world_size):
        raise ValueError(f"the resumewds loader was built for world size {have}, {framework} runs {world_size} "
                         f"processes: {hint}")
