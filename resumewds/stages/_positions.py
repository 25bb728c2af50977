"""The position keys each sample carries (``__epoch__``, ``__index__``, ``__shard__``): plain keys to
the stages before ``.batched``, hidden (readable, not listed) in what is handed out.
"""

from __future__ import annotations

from typing import Any, Dict

__all__ = ["POSITION_KEYS", "Sample", "hide_positions"]


#: what resumewds adds to each sample (its global position); webdataset has none of them
POSITION_KEYS = ("__epoch__", "__index__", "__shard__")


class Sample(dict):
    """A sample dict whose position keys can be read (``s["__index__"]``, ``get``, ``in``, ``to_tuple``)
    but are not listed: ``keys()``, ``len``, collation, ``json.dumps``, ``==`` and copies see exactly
    the keys webdataset 1.0.2 yields.

    Example:
        >>> s = hide_positions({"__key__": "k", "txt": b"a", "__epoch__": 0, "__index__": 7, "__shard__": "x"})
        >>> sorted(s), s["__index__"], "__epoch__" in s, s.get("__shard__")
        (['__key__', 'txt'], 7, True, 'x')
    """

    positions: Dict[str, Any]  # the hidden keys (an instance attribute: pickled with the sample)

    def __missing__(self, key: Any) -> Any:
        hidden = self.__dict__.get("positions")
        if hidden is not None and key in hidden:
            return hidden[key]
        raise KeyError(key)

    def get(self, key: Any, default: Any = None) -> Any:
        if dict.__contains__(self, key):
            return dict.__getitem__(self, key)
        return (self.__dict__.get("positions") or {}).get(key, default)

    def __contains__(self, key: object) -> bool:
        return dict.__contains__(self, key) or key in (self.__dict__.get("positions") or ())


def hide_positions(x: Any) -> Any:
    """``x`` with its position keys moved out of sight (a :class:`Sample`); anything
    but a dict holding them is returned as is."""
    if type(x) is not dict or "__index__" not in x:
        return x
    s = Sample(x)
    s.positions = {k: dict.pop(s, k) for k in POSITION_KEYS if dict.__contains__(s, k)}
    return s
