"""The checksum of a loader state: an edited or damaged state is refused, never loaded.

Every resumewds ``state_dict()`` ends with :func:`seal` (xxh3_64 of the state's canonical JSON,
which survives ``torch.save``, pickle and JSON round trips) and every ``load_state_dict()`` starts
with :func:`check_seal`: a position moved by hand would otherwise load silently, losing some
samples and repeating others.  A state without a checksum (an earlier resumewds) loads as before.

Example:
    >>> state = seal({"format": "resumewds.loader", "epoch": 0, "position": 64})
    >>> state["checksum"]
    'xxh3_64:...'
    >>> check_seal(dict(state), "this state")             # as taken: fine
    >>> check_seal(dict(state, position=32), "this state")
    Traceback (most recent call last):
    ...
    resumewds.errors.StateError: this state was changed after it was taken: ...
"""

from __future__ import annotations

import json
from typing import Any, Dict

import xxhash

from ..errors import StateError

__all__ = ["CHECKSUM_KEY", "canonical", "check_seal", "seal"]

#: the state's key that holds its checksum
CHECKSUM_KEY = "checksum"
_ALGO = "xxh3_64"


def _plain(x: Any) -> Any:
    if isinstance(x, dict):
        return {str(k): _plain(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)):
        return [_plain(v) for v in x]
    if x is None or isinstance(x, (bool, str)):
        return x
    if isinstance(x, int):
        return int(x)
    if isinstance(x, float):
        return int(x) if x.is_integer() else x
    item = getattr(x, "item", None)  # a numpy or torch scalar
    if callable(item):
        try:
            return _plain(item())
        except (TypeError, ValueError):
            pass
    return str(x)


def canonical(state: Dict[str, Any]) -> bytes:
    """The bytes the checksum is taken of: ``state`` without its checksum, as compact sorted JSON.

    Example:
        >>> canonical({"b": (1, 2.0), 3: None, "checksum": "x"})
        b'{"3":null,"b":[1,2]}'
    """
    body = {k: v for k, v in state.items() if k != CHECKSUM_KEY}
    return json.dumps(_plain(body), sort_keys=True, separators=(",", ":"), ensure_ascii=True,
                      allow_nan=True).encode()


def _digest(state: Dict[str, Any]) -> str:
    return f"{_ALGO}:{xxhash.xxh3_64_hexdigest(canonical(state))}"


def seal(state: Dict[str, Any]) -> Dict[str, Any]:
    """Set ``state["checksum"]`` to the checksum of the rest of ``state``; returns ``state``."""
    state.pop(CHECKSUM_KEY, None)
    state[CHECKSUM_KEY] = _digest(state)
    return state


def check_seal(state: Dict[str, Any], what: str) -> None:
    """Refuse ``state`` (a :class:`~resumewds.errors.StateError`) when its checksum does not match its
    content; a state without one passes.  ``what`` names the state in the message."""
    if not isinstance(state, dict) or CHECKSUM_KEY not in state:
        return
    got = state[CHECKSUM_KEY]
    want = _digest(state)
    if got == want:
        return
    if not isinstance(got, str) or not got.startswith(f"{_ALGO}:"):
        raise StateError(f"{what}: its checksum {got!r} is not one resumewds writes ({_ALGO}:<16 hex digits>): "
                         "the state was damaged; load the state as it was saved, or take a new one")
    raise StateError(f"{what} was changed after it was taken: its checksum is {got}, its content now "
                     f"gives {want} (a field edited by hand or by a tool, or a damaged file). Loading it would "
                     "resume at a place no run stood at, losing some samples and repeating others. Load the "
                     "state as it was saved; to skip data on purpose, load it and call skip_steps(k)")
