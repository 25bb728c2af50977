"""The durable progress journal: a SQLite record of a run, safe under kill -9.

One SQLite file per rank (``run.db``, ``run.rank1.db``, ...), written only by
that rank's main (training) process.  DataLoader workers never touch it: they
attach events to the batches they yield and the loader calls the journal.

Where things are (every name below is importable from ``resumewds.journal``)::

    schema.py   the tables, the migrations (sqlite-utils' Migrations) and
                JOURNAL_SCHEMA_VERSION; the checks made on open (newer
                schema refused, a failed creation recognised)
    states.py   the shard state machine: ShardState, SHARD_STATES,
                TRANSITIONS; events -> shard updates (shard_updates_from_events)
    paths.py    rank files: rank_journal_path, run_journal_paths
    lock.py     the lock file and run-id protocol (LockFile), and
                close_inherited (a loader's forked worker closes its copies
                of the lock descriptors)
    core.py     Journal: one rank's file (open, config, events, shards,
                commits, consumption)
    run.py      a whole run: open_run, resolve_resume (the newest step every
                rank committed alike)
    read.py     the public read API: RunReader and read_commits / read_events /
                read_event_totals / read_consumption (status, report, tools)
    status.py   status(): the ``resumewds status --json`` summary
    text.py     format_status(): its text

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

from .core import CONSUMPTION_EVERY, Journal
from .lock import LockFile
from .paths import rank_journal_path, run_journal_paths
from .read import RunReader, read_commits, read_consumption, read_event_totals, read_events
from .run import open_run, resolve_resume
from .schema import _MIGRATIONS as _MIGRATIONS  # read by tests/test_journal.py
from .schema import JOURNAL_SCHEMA_VERSION, MIGRATION_SET
from .states import _EVENT_SHARD_EFFECT as _EVENT_SHARD_EFFECT  # tests/test_events.py, test_repair.py
from .states import ERROR_EVENT_KINDS, SHARD_STATES, TRANSITIONS, ShardState, shard_updates_from_events
from .status import status, summarize
from .text import format_status

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
