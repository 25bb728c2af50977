"""Run a client pipeline on a module and compare what two modules delivered.

Items are reduced to hashable, comparable values (:func:`norm`): tensors and
arrays by shape, dtype and bytes, images by mode, size and pixels, dicts
without ``__url__`` / ``__local_path__`` (where the shard was read from, not
what it holds). Batches are compared as batches (their shapes) and as rows
(:func:`rows`), so a different batching of the same samples is visible.
"""

from __future__ import annotations

import hashlib
import warnings
from collections import Counter
from itertools import islice
from typing import Any, Dict, List, Optional, Tuple

import numpy as np
import torch
from PIL import Image

from tests.clients.pipelines import Client, Spec

SOURCE_KEYS = ("__url__", "__local_path__")
#: resumewds's position keys; where they show in a sample, :class:`Epoch` records it apart
POSITION_KEYS = ("__epoch__", "__index__", "__shard__", "__pad__")
IGNORED = SOURCE_KEYS + POSITION_KEYS


def _h(b: bytes) -> str:
    return hashlib.sha1(b).hexdigest()[:16]


def norm(x: Any, loose: bool = False) -> Any:
    """A hashable value equal for equal content (see the module docstring).

    ``loose``: a numpy array equals a torch tensor of the same dtype, shape and
    bytes, and a list equals a tuple (to say what a difference is made of).
    """
    if isinstance(x, torch.Tensor):
        a = x.detach().contiguous().numpy()
        if loose:
            return ("N", a.shape, a.dtype.str, _h(a.tobytes()))
        return ("T", tuple(x.shape), str(x.dtype), _h(a.tobytes()))
    if isinstance(x, (np.ndarray, np.generic)):
        a = np.asarray(x)  # tobytes() is C order whatever the layout
        return ("N" if loose else "A", a.shape, a.dtype.str, _h(a.tobytes()))
    if isinstance(x, Image.Image):
        return ("I", x.mode, x.size, _h(x.tobytes()))
    if isinstance(x, dict):
        return ("D", tuple(sorted((k, norm(v, loose)) for k, v in x.items() if k not in IGNORED)))
    if isinstance(x, (list, tuple)):
        return ("seq" if loose else type(x).__name__, tuple(norm(v, loose) for v in x))
    if isinstance(x, (bytes, bytearray)):
        return ("B", len(x), _h(bytes(x)))
    return x


def shape(x: Any) -> Any:
    """The batch's shape: tensor shapes, list lengths, per field."""
    if isinstance(x, (torch.Tensor, np.ndarray)):
        return tuple(x.shape)
    if isinstance(x, dict):
        return tuple(sorted((k, shape(v)) for k, v in x.items() if k not in IGNORED))
    if isinstance(x, tuple):
        return tuple(shape(v) for v in x)
    if isinstance(x, list):
        return ("len", len(x))
    return type(x).__name__


def _pick(f: Any, i: int) -> Any:
    if isinstance(f, dict):  # a collated dict inside a batch (default_collate of a json field)
        return {k: _pick(v, i) for k, v in f.items()}
    return f[i]


def rows(x: Any, loose: bool = False) -> List[Any]:
    """The rows of a batch (a tuple/list of fields, or a dict of fields), normalized."""
    if isinstance(x, dict):
        keys = sorted(k for k in x if k not in IGNORED)
        n = len(x[keys[0]])
        return [norm(tuple((k, _pick(x[k], i)) for k in keys), loose) for i in range(n)]
    if isinstance(x, (tuple, list)):
        n = len(next(iter(x[0].values())) if isinstance(x[0], dict) else x[0])
        return [norm(tuple(_pick(f, i) for f in x), loose) for i in range(n)]
    raise TypeError(f"not a batch: {type(x)}")


class Epoch:
    """What one epoch delivered: normalized items, their shapes, their rows."""

    def __init__(self, items: List[Any], batched: bool):
        self.items = [norm(i) for i in items]
        self.shapes = [shape(i) for i in items]
        self.rows: List[Any] = []
        self.loose_rows: List[Any] = []
        #: position keys an item (a dict, or a batch's dict) shows: webdataset has none
        self.extra_keys = sorted({k for i in items if isinstance(i, dict) for k in i.keys() if k in POSITION_KEYS})
        for i in items:
            self.rows.extend(rows(i) if batched else [norm(i)])
            self.loose_rows.extend(rows(i, True) if batched else [norm(i, True)])


def run(spec: Spec, mod: Any, urls: str, workers: int, train: bool = True, epochs: Optional[int] = None,
        **kw: Any) -> List[Epoch]:
    """Build the client on ``mod`` and walk its loader ``epochs`` times."""
    out = Run()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        args = dict(spec.kw or {}, **kw)
        if not train:
            args["train"] = False
        try:
            client: Client = spec.build(mod, urls, workers=workers, **args)
        except Exception as exc:  # resumewds indexes the shards when the dataset is made
            out.error = exc
            return out
        for e in range(spec.epochs if epochs is None else epochs):
            if client.set_epoch is not None:
                client.set_epoch(e)
            items: List[Any] = []
            try:
                it = iter(client.loader)
                for item in islice(it, client.take) if client.take else it:
                    items.append(item)
            except Exception as exc:  # the client has no handler for it: the run ends there
                out.error = exc
                out.append(Epoch(items, client.batched))
                return out
            del it
            out.append(Epoch(items, client.batched))
    return out


class Run(list):
    """The epochs of a run, and the exception that ended it (None: it did not raise)."""

    error: Optional[BaseException] = None


def _first_diff(a: List[Any], b: List[Any]) -> str:
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return f"item {i} differs ({str(x)[:160]} vs {str(y)[:160]})"
    return f"lengths {len(a)} vs {len(b)}"


def compare(mode: str, ref: List[Epoch], got: List[Epoch], universe: Optional[Tuple[set, set]] = None,
            repeats: bool = False) -> List[str]:
    """Differences of ``got`` (resumewds) from ``ref`` (webdataset); empty when they agree.

    * ``ordered``: the same items in the same order, every epoch.
    * ``multiset``: per epoch, the same rows (any order) and the same batch shapes.
    * ``sample``: the order and the selection are random in webdataset: per
      epoch the same number of items and batch shapes, every row one the
      client can deliver (``universe``), no repeated row where webdataset has none.

    ``repeats``: also which epochs deliver the very rows of the first one (webdataset
    starts each worker's pipeline again at every epoch: with seeded stages and fresh
    DataLoader workers, every epoch is the first one again).
    """
    errs = []
    extra = sorted({k for g in got for k in g.extra_keys})
    if extra:
        errs.append(f"the delivered dicts have keys webdataset's lack: {extra}")
    for e, (r, g) in enumerate(zip(ref, got)):
        if mode == "ordered":
            if r.items != g.items:
                errs.append(f"epoch {e}: {len(g.items)} items vs webdataset's {len(r.items)}; "
                            f"{_first_diff(r.items, g.items)}; same rows as a multiset: "
                            f"{Counter(r.rows) == Counter(g.rows)}{_loosely(r.loose_rows, g.loose_rows)}")
            continue
        if len(r.items) != len(g.items):
            errs.append(f"epoch {e}: {len(g.items)} items vs webdataset's {len(r.items)}")
        if Counter(r.shapes) != Counter(g.shapes):
            errs.append(f"epoch {e}: batch shapes {sorted(Counter(g.shapes).items(), key=str)[:4]} vs "
                        f"webdataset's {sorted(Counter(r.shapes).items(), key=str)[:4]}")
        if mode == "multiset":
            if Counter(r.rows) != Counter(g.rows):
                missing = Counter(r.rows) - Counter(g.rows)
                extra = Counter(g.rows) - Counter(r.rows)
                errs.append(f"epoch {e}: rows differ: {sum(missing.values())} missing, "
                            f"{sum(extra.values())} extra (of {len(r.rows)})"
                            f"{_loosely(r.loose_rows, g.loose_rows)}")
        elif mode == "sample":
            assert universe is not None
            foreign = [x for x in g.rows if x not in universe[0]]
            if foreign:
                loose_foreign = [x for x in g.loose_rows if x not in universe[1]]
                errs.append(f"epoch {e}: {len(foreign)} of {len(g.rows)} rows are not rows of the data"
                            + ("" if loose_foreign else " (all are, with numpy arrays in place of torch tensors"
                               " or lists in place of tuples)"))
            if len(set(r.rows)) == len(r.rows) and len(set(g.rows)) != len(g.rows):
                errs.append(f"epoch {e}: {len(g.rows) - len(set(g.rows))} repeated rows (webdataset: none)")
        else:
            raise ValueError(mode)
    if repeats and ref and got:
        same = [[Counter(e.rows) == Counter(run[0].rows) for e in run[1:]] for run in (ref, got)]
        if same[0] != same[1]:
            errs.append(f"epochs that repeat the first one's rows: {same[1]} vs webdataset's {same[0]}")
    if len(ref) != len(got):
        errs.append(f"{len(got)} epochs vs {len(ref)}")
    return errs


def _loosely(a: List[Any], b: List[Any]) -> str:
    if Counter(a) == Counter(b):
        return (" (and the same rows with numpy arrays taken for torch tensors and lists for tuples:"
                f" {'same order' if a == b else 'other order'})")
    return ""


def universe_of(epochs: List[Epoch]) -> Tuple[set, set]:
    """Every row the client can deliver (strictly, and loosely)."""
    return {x for ep in epochs for x in ep.rows}, {x for ep in epochs for x in ep.loose_rows}


Cache = Dict[Tuple[str, str, bool], Any]
