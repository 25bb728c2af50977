"""The durable progress journal: a SQLite record of a run, safe under kill -9.

One SQLite file per rank (``run.db``, ``run.rank1.db``, ...), written only by
that rank's main (training) process.  DataLoader workers never touch it: they
attach events to the batches they yield and the loader calls the journal.

Where things are (every name below is importable from ``resumewds.journal``)::

    _schema.py  the tables, the migrations (sqlite-utils' Migrations) and
                JOURNAL_SCHEMA_VERSION; the checks made on open (newer
                schema refused, a failed creation recognised)
    _states.py  the shard state machine: ShardState, SHARD_STATES,
                TRANSITIONS; events -> shard updates (shard_updates_from_events)
    _paths.py   rank files: rank_journal_path, run_journal_paths
    _lock.py    the lock file and run-id protocol (LockFile), and
                close_inherited (a loader's forked worker closes its copies
                of the lock descriptors)
    _core.py    Journal: one rank's file (open, config, events, shards,
                commits, consumption)
    _run.py     a whole run: open_run, resolve_resume (the newest step every
                rank committed alike)
    _read.py    the public read API: RunReader and read_commits / read_events /
                read_event_totals / read_consumption (status, report, tools)
    _status.py  status(): the ``resumewds status --json`` summary
    _text.py    format_status(): its text

What a journal holds::

    _meta        key/value: schema_version, run_id, rank, created, consumption_through
    config       key -> JSON value; the run configuration resumes must match
    shards       one row per shard url, its state and counters
    consumption  (url, epoch) -> samples delivered by this rank, total, complete
    events       id, ts, kind, url, detail (JSON): retry, repair, evict, ...
    commits      step -> epoch, position, rank, world_size, batch_size, ts,
                 samples_total (cumulative, this rank), stats (JSON snapshot),
                 consumed (JSON consumption deltas, schema v2)

The lifecycle of one shard row (states.py has the whole diagram)::

    first update naming the url     -> inserted as pending
    fetch_start / fetch_done        -> downloading -> downloaded (+attempts, bytes)
    verify_ok / cache_hit           -> verified
    verify_fail                     -> corrupt, then repair -> downloading (+repairs)
    retry                           -> +retries, last_error
    skip / fail                     -> failed; recovered -> verified again
    evict                           -> pending

Each event kind's effect is in :data:`resumewds.events.EVENTS`; a move
outside ``TRANSITIONS`` is applied and recorded as ``invalid_transition``.

Locking (lock.py): a writer holds an exclusive ``flock`` on ``<file>.lock``;
a second writer of the same rank file gets ``JournalError``.  The lock file
records the run id, so a journal deleted while its lock file stayed is an
error, never a silent fresh run; and the newest commit, so a journal that
lost commits (its ``-wal`` deleted or truncated) is an error, never a silent
rewind.  Readers take no lock and never migrate.
A resuming writer reads its resume point only once it holds the lock
(``after_lock``), so two runs started together never resume from the same
commit.

Schema version history (``JOURNAL_SCHEMA_VERSION``):
    1: first version.
    2: each commit row carries its consumption deltas (``m002_commit_consumed``).
    3: a commit row may carry its loader's place beyond (epoch, position)
       (``m003_commit_place``: the worker rotation's per-stream positions).
    A migration goes in schema.py: a function ``_m00N_<what>(db)`` appended
    to ``_MIGRATIONS`` as ``(N, name, fn)``, and ``JOURNAL_SCHEMA_VERSION = N``
    (never edit a released step).  Older journals are upgraded on the next
    writer open; a journal whose schema is newer than this code is refused.

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

if _typing.TYPE_CHECKING:  # (the names as the type checker sees them)
    from ._core import CONSUMPTION_EVERY, Journal
    from ._lock import LockFile
    from ._paths import rank_journal_path, run_journal_paths
    from ._read import RunReader, read_commits, read_consumption, read_event_totals, read_events
    from ._run import open_run, resolve_resume
    from ._schema import JOURNAL_SCHEMA_VERSION, MIGRATION_SET
    from ._states import ERROR_EVENT_KINDS, SHARD_STATES, TRANSITIONS, ShardState, shard_updates_from_events
    from ._status import status, summarize
    from ._text import format_status

# every name loads its module on first use (PEP 562): importing one module of this
# package (or the package) loads nothing else of it
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

__all__ = [
    "CONSUMPTION_EVERY",
    "ERROR_EVENT_KINDS",
    "JOURNAL_SCHEMA_VERSION",
    "Journal",
    "LockFile",
    "MIGRATION_SET",
    "RunReader",
    "SHARD_STATES",
    "ShardState",
    "TRANSITIONS",
    "format_status",
    "open_run",
    "rank_journal_path",
    "read_commits",
    "read_consumption",
    "read_event_totals",
    "read_events",
    "resolve_resume",
    "run_journal_paths",
    "shard_updates_from_events",
    "status",
    "summarize",
]

__getattr__, __dir__ = _lazy.attach(__name__, _LAZY)
