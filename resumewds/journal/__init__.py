"""The durable progress journal: a SQLite record of a run, safe under kill -9.

One SQLite file per rank (``run.db``, ``run.rank1.db``, ...), written only by
that rank's main (training) process; DataLoader workers never touch it.

Where things are (every name below is importable from ``resumewds.journal``)::

    _schema.py  tables, migrations, JOURNAL_SCHEMA_VERSION, checks on open
    _states.py  ShardState, SHARD_STATES, TRANSITIONS; shard_updates_from_events
    _paths.py   rank files: rank_journal_path, run_journal_paths
    _lock.py    the lock file and run-id protocol (LockFile), close_inherited
    _core.py    Journal: one rank's file (config, events, shards, commits)
    _run.py     a whole run: open_run, resolve_resume
    _read.py    the public read API: RunReader, read_commits / read_events / ...
    _status.py  status(): the ``resumewds status --json`` summary
    _text.py    format_status(): its text

Tables: ``_meta`` (schema_version, run_id, rank, created,
consumption_through), ``config``, ``shards`` (one row per url: state,
counters), ``consumption`` ((url, epoch) -> samples, total, complete),
``events`` and ``commits`` (step -> epoch, position, consumed deltas, place).
Each event kind's effect is in :data:`resumewds.events.EVENTS`; a shard move
outside ``TRANSITIONS`` is applied and recorded as ``invalid_transition``.

One writer per rank file, under a lock file that also guards against a
deleted journal or lost commits (_lock.py); readers take no lock and never
migrate.  Schema versions: docs/ARCHITECTURE.md, "Journal schema".

Example:
    >>> import os, tempfile
    >>> d = tempfile.mkdtemp()
    >>> with Journal(os.path.join(d, "run.db")) as j:
    ...     _ = j.check_config({"seed": 1, "batch_size": 8})
    ...     j.commit(1, epoch=0, position=8, consumed={("a.tar", 0): (8, 10)})
    ...     j.latest_commit()["position"]
    8
    >>> resolve_resume(os.path.join(d, "run.db"))["step"]
    1
"""

from __future__ import annotations

import typing as _typing

from .. import _lazy

if _typing.TYPE_CHECKING:
    from ._core import CONSUMPTION_EVERY, Journal
    from ._lock import LockFile
    from ._paths import rank_journal_path, run_journal_paths
    from ._read import RunReader, read_commits, read_consumption, read_event_totals, read_events
    from ._run import open_run, resolve_resume
    from ._schema import JOURNAL_SCHEMA_VERSION, MIGRATION_SET
    from ._states import ERROR_EVENT_KINDS, SHARD_STATES, TRANSITIONS, ShardState, shard_updates_from_events
    from ._status import status, summarize
    from ._text import format_status

# each name loads its module on first use (PEP 562)
_LAZY: _typing.Dict[str, str] = {
    "CONSUMPTION_EVERY": "_core",
    "ERROR_EVENT_KINDS": "_states",
    "format_status": "_text",
    "Journal": "_core",
    "JOURNAL_SCHEMA_VERSION": "_schema",
    "LockFile": "_lock",
    "MIGRATION_SET": "_schema",
    "open_run": "_run",
    "rank_journal_path": "_paths",
    "read_commits": "_read",
    "read_consumption": "_read",
    "read_event_totals": "_read",
    "read_events": "_read",
    "resolve_resume": "_run",
    "run_journal_paths": "_paths",
    "RunReader": "_read",
    "SHARD_STATES": "_states",
    "shard_updates_from_events": "_states",
    "ShardState": "_states",
    "status": "_status",
    "summarize": "_status",
    "TRANSITIONS": "_states",
}

__all__ = ["CONSUMPTION_EVERY", "ERROR_EVENT_KINDS", "JOURNAL_SCHEMA_VERSION", "Journal", "LockFile",
           "MIGRATION_SET", "RunReader", "SHARD_STATES", "ShardState", "TRANSITIONS", "format_status", "open_run",
           "rank_journal_path", "read_commits", "read_consumption", "read_event_totals", "read_events",
           "resolve_resume", "run_journal_paths", "shard_updates_from_events", "status", "summarize"]

__getattr__, __dir__ = _lazy.attach(__name__, _LAZY)
