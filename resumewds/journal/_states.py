"""The shard state machine: the states of a ``shards`` row and how events move it.

The lifecycle of one shard row::

    pending -> downloading -> downloaded -> verified
                   |             |            |
                   +-------------+------------+-> corrupt   (failed verification;
                                                  |          downloading on repair)
    any state ------------------------------------+-> failed (retries exhausted,
                                                             skipped, unreadable)

Also: a cached file goes pending -> verified; eviction verified -> pending;
failed -> verified when a failed shard delivers again (``recovered``).  A
move outside ``TRANSITIONS`` is applied (the journal is a record, not an
authority) with an ``invalid_transition`` event.  Which event moves a row
where is each kind's entry in :data:`resumewds.events.EVENTS`.
"""

from __future__ import annotations

from enum import Enum
from typing import Any, Dict, FrozenSet, Iterable, List, Optional, Tuple

from ..events import EventKind, error_kinds, shard_effects


class ShardState(str, Enum):
    """The state of one shard in the journal (``shards.state``).

    A ``str`` enum: ``ShardState.VERIFIED == "verified"``.

    Example:
        >>> ShardState("corrupt") is ShardState.CORRUPT, str(ShardState.FAILED)
        (True, 'failed')
    """

    PENDING = "pending"          # known; no verified copy in the cache (new, or evicted)
    DOWNLOADING = "downloading"  # a download (or a repair's download) is under way
    DOWNLOADED = "downloaded"    # downloaded, not verified yet
    VERIFIED = "verified"        # in the cache and its checks passed (or read in place)
    CORRUPT = "corrupt"          # a copy failed verification; a repair downloads it again
    FAILED = "failed"            # retries exhausted, skipped or unreadable

    def __str__(self) -> str:
        return self.value


SHARD_STATES: Tuple[str, ...] = tuple(s.value for s in ShardState)


def _to(*states: ShardState) -> FrozenSet[str]:
    return frozenset(s.value for s in states)


_S = ShardState

#: state -> the states a row may move to from it (the diagram above)
TRANSITIONS: Dict[str, FrozenSet[str]] = {
    _S.PENDING.value: _to(_S.DOWNLOADING, _S.DOWNLOADED, _S.VERIFIED, _S.CORRUPT, _S.FAILED),
    _S.DOWNLOADING.value: _to(_S.DOWNLOADED, _S.VERIFIED, _S.CORRUPT, _S.FAILED, _S.PENDING),
    _S.DOWNLOADED.value: _to(_S.VERIFIED, _S.CORRUPT, _S.DOWNLOADING, _S.FAILED, _S.PENDING),
    _S.VERIFIED.value: _to(_S.PENDING, _S.DOWNLOADING, _S.CORRUPT, _S.FAILED),
    _S.CORRUPT.value: _to(_S.DOWNLOADING, _S.FAILED, _S.PENDING),
    _S.FAILED.value: _to(_S.DOWNLOADING, _S.PENDING, _S.VERIFIED),
}

# the columns of a shards row an update may set, and those it may increment
SHARD_COLUMNS = ("name", "state", "bytes", "xxh3_64", "attempts", "retries", "repairs", "last_error", "cache_path")
COUNTER_COLUMNS = ("attempts", "retries", "repairs", "bytes")

# event kind -> (new state or None, counter to bump or None): from resumewds.events.EVENTS
_EVENT_SHARD_EFFECT: Dict[str, Tuple[Optional[str], Optional[str]]] = shard_effects()

#: event kinds ``status`` lists as errors (``last_errors``)
ERROR_EVENT_KINDS = error_kinds()


def shard_updates_from_events(events: Iterable[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Translate cache/fetch events into ``Journal.update_shards`` updates
    (each kind's effect in :data:`resumewds.events.EVENTS`; others ignored).

    Example:
        >>> shard_updates_from_events([{"kind": "retry", "url": "a.tar", "error": "reset"}])
        [{'url': 'a.tar', '+retries': 1, 'last_error': 'reset'}]
    """
    out: List[Dict[str, Any]] = []
    for ev in events:
        url = ev.get("url")
        effect = _EVENT_SHARD_EFFECT.get(ev.get("kind", ""))
        if not url or effect is None:
            continue
        state, counter = effect
        upd: Dict[str, Any] = {"url": url}
        if state is not None:
            upd["state"] = state
        if counter is not None:
            upd["+" + counter] = 1
        if ev.get("kind") == EventKind.FETCH_DONE and isinstance(ev.get("bytes"), int):
            upd["bytes"] = ev["bytes"]
        if ev.get("kind") == EventKind.VERIFY_FAIL:
            upd["last_error"] = (f"verification failed: expected {ev.get('expected')}, "
                                 f"got {ev.get('actual')}")
        elif ev.get("error") is not None:
            upd["last_error"] = str(ev["error"])
        path = ev.get("cache_path", ev.get("path"))
        if isinstance(path, str):
            upd["cache_path"] = path
        out.append(upd)
    return out
