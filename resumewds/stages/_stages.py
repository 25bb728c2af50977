"""The per-sample stages (plain callables on one sample, or on one batch after ``batched``), the
fluent :class:`Stage` and the collations.

Every stage is deterministic given the sample, so a resume never depends on what a stage saw
before; a stage that wants randomness seeds it from ``sample["__index__"]`` and
``sample["__epoch__"]`` (the same in every run and layout).  The decoders: :mod:`resumewds.autodecode`
(the table: docs/USAGE.md).

Example:
    >>> ToTuple("txt cls")({"txt": "hi", "cls": 3})
    ('hi', 3)
"""

from __future__ import annotations

import operator
import re
import sys
from fnmatch import fnmatch
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

from ..errors import DecodeError, HandlerStop, MissingKeyError
from . import _runners as r
from ._handling import OnEvent, SkippedSample, report_stop

__all__ = ["ExtractKeys", "FieldError", "Handled", "Map", "MapDict", "MapTuple", "Rename", "RenameKeys",
           "SampleTypeError", "Select", "SelectFiles", "Stage", "ToTuple", "apply_stages", "default_collate",
           "default_collation_fn", "getfirst", "list_collate"]


class FieldError(DecodeError, ValueError):
    """A field a stage needs is missing: also a ``ValueError``, as webdataset raises there."""


class SampleTypeError(DecodeError, TypeError):
    """A stage got a sample of the wrong kind (webdataset asserts there): a ``TypeError`` naming it."""


def getfirst(sample: Dict[str, Any], keys: Union[str, Sequence[str]], default: Any = None,
             missing_is_error: bool = True) -> Any:
    """The value of the first of ``keys`` (``"jpg;png"`` or a list) present in ``sample``.

    Raises:
        FieldError: none is present and ``missing_is_error``.

    Example:
        >>> getfirst({"png": 1}, "jpg;png")
        1
    """
    alts = keys.split(";") if isinstance(keys, str) else list(keys)
    for a in alts:
        if a in sample:
            return sample[a]
    if missing_is_error:
        has = sorted(k for k in sample if isinstance(k, str) and not k.startswith("__")) \
            if isinstance(sample, dict) else list(sample)
        raise FieldError(f"{_where(sample)} has none of {';'.join(alts)} (it has {has})")
    return default


class ToTuple:
    """``to_tuple``: pick fields into a tuple; ``"jpg;png"`` takes the first present.

    As in webdataset, one argument with spaces is split (``ToTuple("jpg;png cls")``).  A missing
    field raises :class:`FieldError` unless ``missing_is_error=False`` (None); ``none_is_error``
    (default: ``missing_is_error``) also refuses None values.
    """

    _pick: Any

    def __init__(self, *specs: Union[str, Sequence[str]], missing_is_error: bool = True,
                 none_is_error: Optional[bool] = None):
        if len(specs) == 1 and isinstance(specs[0], str) and " " in specs[0]:
            specs = tuple(specs[0].split())
        self.specs = [s.split(";") if isinstance(s, str) else list(s) for s in specs]
        self.missing_is_error = missing_is_error
        self.none_is_error = missing_is_error if none_is_error is None else none_is_error
        # the common case, one name per field: picked in C (a missing name
        # falls back to the general path, which raises or gives None)
        self._pick = (operator.itemgetter(*(a[0] for a in self.specs))
                      if len(self.specs) > 1 and all(len(a) == 1 for a in self.specs) else None)

    def __call__(self, sample: Dict[str, Any]) -> Tuple[Any, ...]:
        out: Tuple[Any, ...]
        if self._pick is not None and type(sample) is dict:  # ("in" and [] agree on a plain dict)
            try:
                out = self._pick(sample)
            except KeyError:
                out = self._general(sample)
        else:
            out = self._general(sample)
        if self.none_is_error:
            for x in out:
                if x is None:
                    raise FieldError(f"{_where(sample)}: to_tuple "
                                     f"{[';'.join(a) for a in self.specs]} got a None field")
        return out

    def _general(self, sample: Dict[str, Any]) -> Tuple[Any, ...]:
        if not isinstance(sample, dict):
            raise SampleTypeError(f"to_tuple needs dict samples, got {type(sample).__name__}")
        return tuple(getfirst(sample, alts, missing_is_error=self.missing_is_error) for alts in self.specs)


def _where(sample: Any) -> str:
    """``url: sample key`` of a dict sample, for an error message."""
    if isinstance(sample, dict):
        return f"{sample.get('__url__')}: sample {sample.get('__key__')}"
    return f"a {type(sample).__name__} sample"


class MapDict:
    """``map_dict``: apply functions to named fields, in place; a missing field is a
    :class:`~resumewds.errors.MissingKeyError` (a ``KeyError``, as in webdataset)."""

    def __init__(self, **fns: Callable[[Any], Any]):
        if not fns:
            raise ValueError("map_dict needs at least one field=function")
        for k, f in fns.items():
            if not callable(f):
                raise TypeError(f"map_dict: {k}= is not callable: {f!r}")
        self.fns = fns

    def __call__(self, sample: Dict[str, Any]) -> Dict[str, Any]:
        if not isinstance(sample, dict):
            raise SampleTypeError(f"map_dict needs dict samples, got {type(sample).__name__}")
        for k, f in self.fns.items():
            try:
                v = sample[k]
            except KeyError:
                raise MissingKeyError(f"{_where(sample)}: map_dict: no field {k!r} (it has "
                                      f"{sorted(x for x in sample if not x.startswith('__'))})") from None
            sample[k] = f(v)
        return sample


class MapTuple:
    """``map_tuple``: apply functions to tuple fields by position (None: unchanged); as in webdataset,
    the first ``min(len(fns), len(sample))`` fields are mapped and the rest kept."""

    def __init__(self, *fns: Optional[Callable[[Any], Any]]):
        for f in fns:
            if f is not None and not callable(f):
                raise TypeError(f"map_tuple: {f!r} is not callable")
        self.fns = fns

    def __call__(self, t: Tuple[Any, ...]) -> Tuple[Any, ...]:
        if not isinstance(t, (list, tuple)):
            raise SampleTypeError(f"{_where(t)}: map_tuple needs tuple samples, got {type(t).__name__}")
        out = list(t)
        for i, f in enumerate(self.fns[:len(out)]):
            if f is not None:
                out[i] = f(out[i])
        return tuple(out)


class Rename:
    """``rename(image="jpg;png", label="cls")``: new names from the first present old one; the renamed
    fields are dropped (``keep=True``, webdataset's default) or only the new fields kept (``keep=False``)."""

    def __init__(self, keep: bool = True, **kw: Union[str, Sequence[str]]):
        self.map = {new: (old.split(";") if isinstance(old, str) else list(old)) for new, old in kw.items()}
        self.keep = keep

    def __call__(self, sample: Dict[str, Any]) -> Dict[str, Any]:
        if not isinstance(sample, dict):
            raise SampleTypeError(f"rename needs dict samples, got {type(sample).__name__}")
        new = {k: getfirst(sample, alts) for k, alts in self.map.items()}
        if not self.keep:
            return new
        replaced = {a for alts in self.map.values() for a in alts}
        out = {k: v for k, v in sample.items() if k not in replaced}
        out.update(new)
        return out


class Select:
    """Keep samples for which the predicate is true (others are filtered out)."""

    def __init__(self, predicate: Callable[[Any], bool]):
        self.predicate = predicate

    def __call__(self, sample: Any) -> Any:
        return sample if self.predicate(sample) else None


class Map:
    """webdataset's ``map``: ``f(sample)``; None drops the sample; a dict result of a
    dict sample gets the sample's ``__key__``."""

    def __init__(self, f: Callable[[Any], Any]):
        self.f = f

    def __call__(self, sample: Any) -> Any:
        result = self.f(sample)
        if isinstance(sample, dict) and isinstance(result, dict):
            result["__key__"] = sample.get("__key__")
        return result


class ExtractKeys:
    """webdataset's ``extract_keys``: a tuple of the values whose keys match glob patterns."""

    def __init__(self, *patterns: Union[str, Sequence[str]], duplicate_is_error: bool = True,
                 ignore_missing: bool = False):
        self.patterns = [p.split(";") if isinstance(p, str) else list(p) for p in patterns]
        self.duplicate_is_error = duplicate_is_error
        self.ignore_missing = ignore_missing

    def __call__(self, sample: Dict[str, Any]) -> Tuple[Any, ...]:
        out = []
        for pats in self.patterns:
            matches = [k for k in sample if any(fnmatch("." + k, p) or fnmatch(k, p) for p in pats)]
            if not matches:
                if self.ignore_missing:
                    continue
                raise FieldError(f"Cannot find {pats} in sample keys {list(sample)}.")
            if len(matches) > 1 and self.duplicate_is_error:
                raise FieldError(f"Multiple sample keys {list(sample)} match {pats}.")
            out.append(sample[matches[0]])
        return tuple(out)


class RenameKeys:
    """webdataset's ``rename_keys``: rename by glob patterns on the key's basename."""

    def __init__(self, *args: Tuple[str, str], keep_unselected: bool = False, must_match: bool = True,
                 duplicate_is_error: bool = True, **kw: str):
        self.renamings = [(pat, out) for out, pat in args] + [(pat, out) for out, pat in kw.items()]
        self.keep_unselected = keep_unselected
        self.must_match = must_match
        self.duplicate_is_error = duplicate_is_error

    def __call__(self, sample: Dict[str, Any]) -> Dict[str, Any]:
        new: Dict[str, Any] = {}
        matched = {p: False for p, _ in self.renamings}
        for path, value in sample.items():
            fname = re.sub(r".*/", "", path)
            name = None
            for pat, out in self.renamings[::-1]:
                if fnmatch(fname.lower(), pat):
                    matched[pat] = True
                    name = out
                    break
            if name is None:
                if self.keep_unselected:
                    new[path] = value
                continue
            if name in new:
                if self.duplicate_is_error:
                    raise FieldError(f"Duplicate value in sample {list(sample)} after rename.")
                continue
            new[name] = value
        if self.must_match and not all(matched.values()):
            raise FieldError(f"Not all patterns ({matched}) matched sample keys ({list(sample)}).")
        return new


class SelectFiles:
    """The ``select_files=`` / ``rename_files=`` arguments of WebDataset, on a read sample (each gets
    a member's name ``"<key>.<extension>"``; a renamed member stays in its sample)."""

    def __init__(self, select_files: Optional[Callable[[str], bool]] = None,
                 rename_files: Optional[Callable[[str], str]] = None):
        self.select_files = select_files
        self.rename_files = rename_files

    def __call__(self, sample: Dict[str, Any]) -> Optional[Dict[str, Any]]:
        key = sample.get("__key__", "")
        out: Dict[str, Any] = {}
        for k, v in sample.items():
            if k.startswith("__"):
                out[k] = v
                continue
            name = f"{key}.{k}"
            if self.select_files is not None and not self.select_files(name):
                continue
            if self.rename_files is not None:
                name = self.rename_files(name)
                base = name.rsplit("/", 1)[-1]
                k = base.split(".", 1)[1] if "." in base else base
            out[k] = v
        if not any(not k.startswith("__") for k in out):
            return None
        return out


# ---- handlers: the handler= argument of stages ------------------------------
class Handled:
    """Run ``fn`` under a webdataset ``handler``: re-raise, skip (True: :class:`SkippedSample`) or stop
    (False: :class:`~resumewds.errors.HandlerStop` holding the skip as ``skipped``)."""

    def __init__(self, fn: Callable[[Any], Any], handler: Callable[[BaseException], bool],
                 name: str = "map"):
        self.fn = fn
        self.handler = handler
        self.name = name

    def __call__(self, item: Any) -> Any:
        try:
            return self.fn(item)
        except (HandlerStop, SkippedSample):
            raise
        except Exception as exc:
            skip = SkippedSample(item, exc, self.name)
            if self.handler(exc):
                raise skip from exc
            stop = HandlerStop(str(exc))
            stop.skipped = skip
            raise stop from exc


# ---- webdataset's default collation ----------------------------------------
def _combine(b: List[Any], combine_tensors: bool = True, combine_scalars: bool = True) -> Any:
    first = b[0]
    if isinstance(first, (int, float)):
        if combine_scalars:
            import numpy as np

            return np.array(list(b))
        return list(b)
    for lib, kind in ((sys.modules.get("torch"), "Tensor"), (sys.modules.get("numpy"), "ndarray")):
        if lib is not None and isinstance(first, getattr(lib, kind)):
            if not combine_tensors:
                return list(b)
            shapes = {x.shape for x in b}
            if len(shapes) != 1:
                raise ValueError(f"all shapes must be equal in collation, got {shapes}")
            return lib.stack(list(b)) if kind == "Tensor" else lib.array(list(b))
    return list(b)


def default_collation_fn(samples: List[Any], combine_tensors: bool = True,
                         combine_scalars: bool = True) -> Any:
    """webdataset's default collation (``.batched(n)``): per field, numbers become a numpy
    array, tensors are stacked, numpy arrays are stacked, anything else becomes a list.

    Example:
        >>> default_collation_fn([(1, "a"), (2, "b")])[1]
        ['a', 'b']
    """
    rows = [x if isinstance(x, dict) else dict(enumerate(x)) for x in samples]
    keys = set(rows[0])
    for row in rows[1:]:
        if set(row) != keys:
            raise ValueError("keys don't match in different samples")
    result = {k: _combine([row[k] for row in rows], combine_tensors, combine_scalars) for k in keys}
    if isinstance(samples[0], (list, tuple)):
        return tuple(result[i] for i in range(1 + max(result)))
    return result


class Stage:
    """One fluent stage of a :class:`resumewds.WebDataset` (a picklable description); ``kind`` is
    ``"sample"`` (a function of one item, None drops it), ``"shuffle"``, ``"batched"`` or ``"stream"``."""

    def __init__(self, kind: str, name: str, fn: Any = None, **args: Any):
        self.kind, self.name, self.fn, self.args = kind, name, fn, args

    def __repr__(self) -> str:
        return f"Stage({self.name})"

    def runner(self, key: int, on_event: Optional[OnEvent] = None) -> Any:
        """A fresh runner of this stage for one epoch (``key``: its random stream; ``on_event``: where a
        handler's skip goes)."""
        a = self.args
        if self.kind == "sample":
            return r.MapRunner(self.fn, on_event)
        if self.kind == "batched":
            return r.BatchRunner(a["n"], a["collation_fn"], a["partial"])
        if self.kind == "shuffle":
            return r.ShuffleRunner(a["n"], a["initial"], key)
        if self.name == "unbatched":
            return r.UnbatchRunner(False)
        if self.name == "unlisted":
            return r.UnbatchRunner(True)
        if self.name == "slice":
            return r.SliceRunner(*a["args"])
        if self.name == "rsample":
            return r.RSampleRunner(a["p"], key)
        if self.name == "log_keys":
            return r.LogKeysRunner(a["logfile"])
        return r.OpaqueRunner(self.fn)


def default_collate(samples: List[Any]) -> Any:
    """torch's default_collate (strings and bytes become lists)."""
    from torch.utils.data import default_collate as dc

    return dc(samples)


def list_collate(samples: List[Any]) -> List[Any]:
    """No collation: the batch is the list of samples."""
    return list(samples)


def apply_stages(stages: Sequence[Callable[[Any], Any]], x: Any, on_event: Optional[OnEvent] = None) -> Any:
    """``x`` through ``stages``; None as soon as one returns None or a handler skips it (a
    ``sample_skip`` event of ``on_event``; None: logged only).

    Example:
        >>> apply_stages([lambda x: x + 1, lambda x: x * 2], 3)
        8
        >>> apply_stages([lambda x: None, lambda x: x * 2], 3) is None
        True
    """
    try:
        for st in stages:
            x = st(x)
            if x is None:
                return None
    except SkippedSample as skip:
        skip.report(on_event)
        return None
    except HandlerStop as stop:
        report_stop(stop, on_event)
        raise
    return x
