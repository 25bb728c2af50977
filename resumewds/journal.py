"""The durable progress journal: a SQLite record of a run, safe under kill -9.

One SQLite file per rank (``run.db``, ``run.rank1.db``, ...), written only by
that rank's main (training) process.  DataLoader workers never touch it: they
attach events to the batches they yield and the loader calls the journal.

What a journal holds::

    _meta        key/value: schema_version, run_id, rank, created
    config       key -> JSON value; the run configuration resumes must match
    shards       one row per shard url, its state and counters (see below)
    consumption  (url, epoch) -> samples delivered by this rank, total, complete
    events       id, ts, kind, url, detail (JSON): retry, repair, evict, ...
    commits      step -> epoch, position, rank, world_size, batch_size, ts,
                 samples_total (cumulative, this rank), stats (JSON snapshot)

Shard states (``SHARD_STATES``; ``TRANSITIONS`` lists the allowed moves)::

    pending -> downloading -> downloaded -> verified
                   |             |            |
                   +-------------+------------+-> corrupt   (failed verification;
                                                  |          downloading on repair)
    any state ------------------------------------+-> failed (retries exhausted,
                                                             skipped, unreadable)

    A file already in the cache goes pending -> verified (or -> corrupt);
    verified -> pending when the cache evicts it; failed -> downloading when a
    later run retries it; failed -> verified (a ``recovered`` event) when a
    shard that failed delivers samples again (a local shard, or one the
    cache already held).  A move outside ``TRANSITIONS`` is still applied (the
    reporter saw it happen; the journal is a record, not an authority) and an
    ``invalid_transition`` event is written next to it, so a bookkeeping slip
    never stops a training run.

Durability:
    The journal runs in WAL mode.  Every change is one transaction.  With the
    default ``synchronous="NORMAL"`` a transaction is in the WAL file (written
    with ``write(2)``) when ``commit`` returns, so it survives kill -9 or any
    other crash of the *process*; a power loss or kernel crash may lose the
    last transactions (never corrupting the file).  ``synchronous="FULL"``
    fsyncs the WAL on every transaction and survives power loss as well, at
    the cost of one fsync per commit (milliseconds instead of microseconds).

Locking:
    A writer holds an exclusive ``flock`` on ``<file>.lock`` for as long as it
    is open; a second writer of the same rank file gets ``JournalError``
    ("already in use by pid N").  The lock file also stores the run id once
    the journal exists, so a journal that was deleted while its lock file
    stayed is reported ("journal was deleted") instead of silently starting
    a fresh run.  Delete the lock file too to really start over.  Read-only
    opens (``status``, ``resolve_resume``) take no lock.  A resuming writer
    reads its resume point only once it holds the lock (``after_lock``), so
    two runs started together never resume from the same commit.

Cost:
    ``commit`` is the hot path: raw ``sqlite3`` statements (cached by the
    driver), one ``BEGIN``/``COMMIT``, no sqlite-utils helpers; tens of
    thousands of commits per second with ``synchronous="NORMAL"``.  Commits
    are kept for the whole run (any step can be resumed from); a commit row
    is ~100 bytes.  ``PRAGMA quick_check`` runs on every open.

Schema version history (``JOURNAL_SCHEMA_VERSION``):
    1: first version.
    Migrations are sqlite-utils ``Migrations`` (set ``resumewds.journal``,
    recorded in ``_sqlite_migrations``) plus ``_meta.schema_version``; with an
    older sqlite-utils without ``Migrations`` a tiny equivalent writes the
    same table.  A journal whose schema is newer than this code is refused.

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

import datetime
import errno
import fcntl
import json
import os
import re
import sqlite3
import threading
import time
import uuid
from typing import Any, Callable, Dict, Iterable, Iterator, List, Optional, Sequence, Tuple

import sqlite_utils

from .errors import JournalConfigMismatch, JournalError, JournalIncompleteCommit
from .events import EventKind, error_kinds, shard_effects
from .manifest import shard_basename

# ---------------------------------------------------------------------------
# Schema and migrations
# ---------------------------------------------------------------------------

MIGRATION_SET = "resumewds.journal"
_MIGRATIONS_TABLE = "_sqlite_migrations"  # the table sqlite-utils Migrations uses


def _m001_initial(db: sqlite_utils.Database) -> None:
    """Version 1: every table of the journal."""
    db.execute("CREATE TABLE _meta (key TEXT PRIMARY KEY, value TEXT)")
    db.execute("CREATE TABLE config (key TEXT PRIMARY KEY, value TEXT, updated REAL)")
    db["shards"].create(
        {"url": str, "name": str, "state": str, "bytes": int, "xxh3_64": str,
         "attempts": int, "retries": int, "repairs": int, "last_error": str,
         "cache_path": str, "first_seen": float, "updated": float},
        pk="url", not_null={"state", "attempts", "retries", "repairs"},
        defaults={"state": "pending", "attempts": 0, "retries": 0, "repairs": 0})
    db["shards"].create_index(["state"])
    db["consumption"].create(
        {"url": str, "epoch": int, "samples": int, "total": int, "complete": int,
         "updated": float},
        pk=("url", "epoch"), not_null={"samples", "complete"},
        defaults={"samples": 0, "complete": 0})
    db["events"].create(
        {"id": int, "ts": float, "kind": str, "url": str, "detail": str}, pk="id")
    db["events"].create_index(["kind"])
    db["commits"].create(
        {"step": int, "epoch": int, "position": int, "rank": int, "world_size": int,
         "batch_size": int, "ts": float, "samples_total": int, "stats": str},
        pk="step", not_null={"epoch", "position", "rank", "world_size", "ts"})


def _m002_commit_consumed(db: sqlite_utils.Database) -> None:
    """Version 2: each commit row carries its own consumption deltas (JSON),
    so the hot path writes one row; the ``consumption`` table is brought up to
    date every few commits and on open (``_meta.consumption_through``)."""
    db.execute("ALTER TABLE commits ADD COLUMN consumed TEXT")


# (version, name, function); version k's function leaves the schema at k.
# Append only: never edit or reorder a released step.
_MIGRATIONS: List[Tuple[int, str, Callable[[sqlite_utils.Database], None]]] = [
    (1, "m001_initial", _m001_initial),
    (2, "m002_commit_consumed", _m002_commit_consumed),
]
JOURNAL_SCHEMA_VERSION: int = 2
CONSUMPTION_EVERY = 32  # commits between materialisations of the consumption table


def _set_schema_version(db: sqlite_utils.Database, version: int) -> None:
    db.execute("INSERT OR REPLACE INTO _meta (key, value) VALUES ('schema_version', ?)",
               [str(version)])


def _applied_migrations(conn: sqlite3.Connection) -> List[str]:
    if not _table_exists(conn, _MIGRATIONS_TABLE):
        return []
    return [r[0] for r in conn.execute(
        f"SELECT name FROM {_MIGRATIONS_TABLE} WHERE migration_set = ? ORDER BY rowid",
        (MIGRATION_SET,))]


def _apply_migrations(db: sqlite_utils.Database, upto: Optional[int] = None) -> None:
    """Bring the schema to version ``upto`` (default: the newest), one
    transaction per step (the step and the record of it commit together)."""
    steps = [s for s in _MIGRATIONS if upto is None or s[0] <= upto]

    def wrap(version: int, fn: Callable) -> Callable:
        def run(d: sqlite_utils.Database) -> None:
            fn(d)
            _set_schema_version(d, version)
        run.__name__ = fn.__name__
        return run

    if hasattr(sqlite_utils, "Migrations"):
        migrations = sqlite_utils.Migrations(MIGRATION_SET)
        for version, name, fn in steps:
            migrations(name=name)(wrap(version, fn))
        migrations.apply(db)
        return
    # sqlite-utils < 4 has no Migrations: the same thing, same bookkeeping table
    # (so a journal can move between sqlite-utils versions).
    with db.atomic():
        db.execute(f"CREATE TABLE IF NOT EXISTS {_MIGRATIONS_TABLE} (id INTEGER PRIMARY KEY, "
                   "migration_set TEXT, name TEXT, applied_at TEXT)")
        db.execute(f"CREATE UNIQUE INDEX IF NOT EXISTS idx_{_MIGRATIONS_TABLE}_set_name "
                   f"ON {_MIGRATIONS_TABLE} (migration_set, name)")
    done = set(_applied_migrations(db.conn))
    for version, name, fn in steps:
        if name in done:
            continue
        with db.atomic():
            wrap(version, fn)(db)
            db.execute(f"INSERT INTO {_MIGRATIONS_TABLE} (migration_set, name, applied_at) "
                       "VALUES (?, ?, ?)",
                       [MIGRATION_SET, name, str(datetime.datetime.now(datetime.timezone.utc))])


def _table_exists(conn: sqlite3.Connection, name: str) -> bool:
    return conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?",
                        (name,)).fetchone() is not None


def _meta_get(conn: sqlite3.Connection, key: str) -> Optional[str]:
    if not _table_exists(conn, "_meta"):
        return None
    row = conn.execute("SELECT value FROM _meta WHERE key = ?", (key,)).fetchone()
    return None if row is None else row[0]


# ---------------------------------------------------------------------------
# Shard state machine
# ---------------------------------------------------------------------------

SHARD_STATES = ("pending", "downloading", "downloaded", "verified", "corrupt", "failed")

TRANSITIONS: Dict[str, frozenset] = {
    "pending": frozenset({"downloading", "downloaded", "verified", "corrupt", "failed"}),
    "downloading": frozenset({"downloaded", "verified", "corrupt", "failed", "pending"}),
    "downloaded": frozenset({"verified", "corrupt", "downloading", "failed", "pending"}),
    "verified": frozenset({"pending", "downloading", "corrupt", "failed"}),
    "corrupt": frozenset({"downloading", "failed", "pending"}),
    "failed": frozenset({"downloading", "pending", "verified"}),
}

_SHARD_COLUMNS = ("name", "state", "bytes", "xxh3_64", "attempts", "retries", "repairs",
                  "last_error", "cache_path")
_COUNTER_COLUMNS = ("attempts", "retries", "repairs", "bytes")

# event kind -> (new state or None, counter to bump or None): from resumewds.events.EVENTS
_EVENT_SHARD_EFFECT: Dict[str, Tuple[Optional[str], Optional[str]]] = shard_effects()

ERROR_EVENT_KINDS = error_kinds()


def shard_updates_from_events(events: Iterable[Dict[str, Any]]) -> List[Dict[str, Any]]:
    """Translate cache/fetch events into ``Journal.update_shards`` updates.

    The effect of each kind is its ``shard_state`` / ``shard_counter`` in
    :data:`resumewds.events.EVENTS`; other kinds are ignored.

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


# ---------------------------------------------------------------------------
# Paths
# ---------------------------------------------------------------------------

# A flock belongs to the open file description, which fork() shares: a
# DataLoader worker forked while the journal is open would keep the lock alive
# after its parent was killed (until the worker notices, seconds later), and
# the rerun would be refused.  Children close their copies at once.
_CHILD_CLOSE: set = set()


def _close_lock_fds_in_child() -> None:
    for fd in list(_CHILD_CLOSE):
        try:
            os.close(fd)
        except OSError:
            pass
    _CHILD_CLOSE.clear()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_close_lock_fds_in_child)


def rank_journal_path(path: str, rank: int) -> str:
    """The journal file of ``rank``: ``path`` itself for rank 0, else
    ``<stem>.rank<r><suffix>``.

    Example:
        >>> rank_journal_path("/x/run.db", 0), rank_journal_path("/x/run.db", 1)
        ('/x/run.db', '/x/run.rank1.db')
    """
    if not isinstance(rank, int) or rank < 0:
        raise ValueError(f"rank must be a non-negative int, got {rank!r}")
    if rank == 0:
        return path
    stem, suffix = os.path.splitext(path)
    return f"{stem}.rank{rank}{suffix}"


def _rank_files(path: str) -> List[Tuple[int, str]]:
    """``(0, path)`` plus ``(r, file)`` for every existing rank file, by rank."""
    d = os.path.dirname(path) or "."
    stem, suffix = os.path.splitext(os.path.basename(path))
    pat = re.compile(rf"^{re.escape(stem)}\.rank([1-9][0-9]*){re.escape(suffix)}$")
    found: List[Tuple[int, str]] = []
    try:
        names = os.listdir(d)
    except OSError:
        names = []
    for n in names:
        m = pat.match(n)
        if m:
            found.append((int(m.group(1)), os.path.join(os.path.dirname(path), n)))
    return [(0, path)] + sorted(found)


def run_journal_paths(path: str) -> List[str]:
    """``path`` (rank 0, whether or not it exists) followed by the existing
    rank files of the same run, sorted by rank."""
    return [p for _, p in _rank_files(path)]


def _lock_path(file: str) -> str:
    return file + ".lock"


def _read_lock_info(lock_file: str) -> Dict[str, Any]:
    try:
        fd = os.open(lock_file, os.O_RDONLY | getattr(os, "O_NOFOLLOW", 0))
        with os.fdopen(fd, "r") as f:
            text = f.read()
    except OSError:
        return {}
    try:
        info = json.loads(text) if text.strip() else {}
    except ValueError:
        return {}
    return info if isinstance(info, dict) else {}


def _deleted_error(file: str) -> JournalError:
    return JournalError(
        f"{file}: journal was deleted (its lock file {_lock_path(file)} records a run); "
        f"refusing to start a fresh run silently. Restore the journal, or delete "
        f"{_lock_path(file)} as well to start over")


# ---------------------------------------------------------------------------
# The journal
# ---------------------------------------------------------------------------

_SYNC_MODES = ("NORMAL", "FULL", "EXTRA")

_SQL_COMMIT_INSERT = (
    "INSERT INTO commits (step, epoch, position, rank, world_size, batch_size, ts, "
    "samples_total, stats, consumed) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?)")
_SQL_THROUGH = "INSERT OR REPLACE INTO _meta (key, value) VALUES ('consumption_through', ?)"
_SQL_CONSUME = (
    "INSERT INTO consumption (url, epoch, samples, total, complete, updated) "
    "VALUES (?, ?, ?, ?, ?, ?) ON CONFLICT (url, epoch) DO UPDATE SET "
    "samples = consumption.samples + excluded.samples, "
    "total = coalesce(excluded.total, consumption.total), "
    "complete = coalesce(consumption.samples + excluded.samples "
    "                    >= coalesce(excluded.total, consumption.total), 0), "
    "updated = excluded.updated")
_SQL_EVENT = "INSERT INTO events (ts, kind, url, detail) VALUES (?, ?, ?, ?)"


def _json(value: Any) -> str:
    return json.dumps(value, sort_keys=True, default=str, separators=(",", ":"))


def _commit_row(row: Optional[sqlite3.Row]) -> Optional[Dict[str, Any]]:
    if row is None:
        return None
    d = dict(row)
    stats = d.get("stats")
    d["stats"] = json.loads(stats) if stats else None
    return d


class Journal:
    """The journal file of one rank of a run.

    Args:
        path: the run's journal path (rank 0's file); rank r writes
            ``rank_journal_path(path, r)``.
        rank: this process's rank.
        world_size: number of ranks; the default for ``commit``.
        readonly: open ``mode=ro`` without taking the lock (for ``status``).
        synchronous: ``"NORMAL"`` (survives process crash) or ``"FULL"``
            (survives power loss too; one fsync per transaction).
        after_lock: called once the writer holds the lock, before the file
            is opened or created; its result is ``self.after_lock_result``.
            The loader reads the run's resume point here, so that two runs
            started together can never both resume from the same point: the
            second one is refused at the lock before it reads anything.

    Raises:
        JournalError: the file is corrupt, truncated, not a database, has a
            newer schema, is in use by another writer, or was deleted while
            its lock file stayed.  The message names the file.

    A Journal lives in the main process only; it refuses to be pickled.
    """

    def __init__(self, path: str, *, rank: int = 0, world_size: int = 1,
                 readonly: bool = False, synchronous: str = "NORMAL",
                 after_lock: Optional[Callable[[], Any]] = None):
        sync = str(synchronous).upper()
        if sync not in _SYNC_MODES:
            raise ValueError(f"synchronous must be one of {_SYNC_MODES}, got {synchronous!r}")
        if not isinstance(world_size, int) or world_size < 1:
            raise ValueError(f"world_size must be a positive int, got {world_size!r}")
        self.base_path = path
        self.path = rank_journal_path(path, rank)
        self.rank = rank
        self.world_size = world_size
        self.readonly = readonly
        self.run_id: Optional[str] = None
        self.schema_version: int = 0
        self._lock_fd: Optional[int] = None
        self._conn: Optional[sqlite3.Connection] = None
        self._max_step: Optional[int] = None
        self._pending: Dict[Tuple[str, int], Tuple[int, Optional[int]]] = {}
        self._since = 0
        self._mutex = threading.RLock()
        self._after_lock = after_lock
        self.after_lock_result: Any = None
        try:
            if readonly:
                self._open_readonly()
            else:
                self._open_writer(sync)
        except BaseException:
            self.close()
            raise

    # ---- opening -------------------------------------------------------
    def _err(self, what: str, exc: Optional[BaseException] = None) -> JournalError:
        detail = f": {exc}" if exc is not None else ""
        return JournalError(f"{self.path}: {what}{detail}")

    def _connect(self, uri: str) -> sqlite3.Connection:
        try:
            # check_same_thread off: a checkpoint thread may commit; self._mutex
            # serialises our own use of the connection.
            conn = sqlite3.connect(uri, uri=True, isolation_level=None, timeout=10.0,
                                   check_same_thread=False)
        except sqlite3.Error as exc:
            raise self._err("cannot open journal", exc) from exc
        conn.row_factory = sqlite3.Row
        return conn

    def _check_integrity(self, conn: sqlite3.Connection) -> None:
        try:
            rows = [r[0] for r in conn.execute("PRAGMA quick_check")]
        except sqlite3.DatabaseError as exc:
            raise self._err("journal is corrupt or not a SQLite database", exc) from exc
        if rows != ["ok"]:
            raise self._err("journal is corrupt (quick_check: " + "; ".join(rows[:5]) + ")")

    def _check_schema(self, conn: sqlite3.Connection) -> int:
        """The file's schema version; JournalError if it is newer than ours."""
        version = _meta_get(conn, "schema_version")
        v = int(version) if version and version.isdigit() else 0
        known = {name for _, name, _ in _MIGRATIONS}
        unknown = [n for n in _applied_migrations(conn) if n not in known]
        if v > JOURNAL_SCHEMA_VERSION or unknown:
            raise self._err(
                f"journal schema version {v} is newer than this resumewds understands "
                f"(max {JOURNAL_SCHEMA_VERSION}"
                + (f"; unknown migrations {unknown}" if unknown else "")
                + "); upgrade resumewds")
        return v

    def _open_readonly(self) -> None:
        if not os.path.exists(self.path):
            if _read_lock_info(_lock_path(self.path)).get("run_id"):
                raise _deleted_error(self.path)
            raise self._err("no journal here")
        conn = self._conn = self._connect(f"file:{_uri_path(self.path)}?mode=ro")
        try:
            conn.execute("PRAGMA busy_timeout = 5000")
            self._check_integrity(conn)
            self.schema_version = self._check_schema(conn)
            if self.schema_version == 0:
                raise self._err("not a resumewds journal (no schema version)")
            self.run_id = _meta_get(conn, "run_id")
        except sqlite3.Error as exc:
            raise self._err("cannot read journal", exc) from exc

    def _open_writer(self, sync: str) -> None:
        lock_file = _lock_path(self.path)
        d = os.path.dirname(self.path)
        if d and not os.path.isdir(d):
            raise self._err(f"directory {d} does not exist")
        for f in (self.path, lock_file, self.path + "-wal", self.path + "-shm"):
            if os.path.islink(f):
                raise self._err(f"{f} is a symbolic link; refusing to follow it "
                                "(a journal never writes through links)")
        try:
            fd = os.open(lock_file, os.O_RDWR | os.O_CREAT | getattr(os, "O_NOFOLLOW", 0)
                         | getattr(os, "O_CLOEXEC", 0), 0o644)
        except OSError as exc:
            if exc.errno == errno.ELOOP:
                raise self._err(f"lock file {lock_file} is a symbolic link; refusing to follow it",
                                exc) from exc
            raise self._err(f"cannot open lock file {lock_file}", exc) from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError as exc:
            os.close(fd)
            if exc.errno in (errno.EWOULDBLOCK, errno.EAGAIN, errno.EACCES):
                pid = _read_lock_info(lock_file).get("pid", "unknown")
                raise self._err(f"journal is already in use by pid {pid} "
                                f"(lock {lock_file})") from exc
            raise self._err(f"cannot lock {lock_file}", exc) from exc
        self._lock_fd = fd
        _CHILD_CLOSE.add(fd)
        if self._after_lock is not None:
            self.after_lock_result = self._after_lock()  # under the lock, before any file
        info = _read_lock_info(lock_file)
        marker = info.get("run_id")
        existed = os.path.exists(self.path)
        if marker and not existed:
            raise _deleted_error(self.path)
        conn = self._conn = self._connect(f"file:{_uri_path(self.path)}?mode=rwc")
        try:
            conn.execute("PRAGMA busy_timeout = 10000")
            self._check_integrity(conn)
            self.schema_version = self._check_schema(conn)
            if self.schema_version == 0 and _never_initialised(self.path):
                # a creation that failed part-way (e.g. disk full) left empty
                # tables of ours: clear them so the migrations start clean
                for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' "
                                            "AND name NOT LIKE 'sqlite_%'").fetchall():
                    conn.execute(f'DROP TABLE IF EXISTS "{name}"')
                conn.commit()
            if self.schema_version == 0 and conn.execute(
                    "SELECT 1 FROM sqlite_master WHERE name NOT LIKE 'sqlite_%' "
                    f"AND name != '{_MIGRATIONS_TABLE}'").fetchone():
                raise self._err("not a resumewds journal (a SQLite database with other "
                                "tables); refusing to add tables to it")
            if marker and _meta_get(conn, "run_id") is None:
                raise self._err(
                    f"journal was truncated or replaced: lock file {lock_file} records "
                    f"run {marker} but the journal holds no run; refusing to start a fresh "
                    f"run silently (delete {lock_file} as well to start over)")
            mode = conn.execute("PRAGMA journal_mode = WAL").fetchone()[0]
            if str(mode).lower() != "wal":
                raise self._err(f"cannot switch to WAL mode (got {mode})")
            conn.execute(f"PRAGMA synchronous = {sync}")
            conn.execute("PRAGMA journal_size_limit = 67108864")
            db = self._db()
            _apply_migrations(db)
            self.schema_version = JOURNAL_SCHEMA_VERSION
            with db.atomic():
                for key, value in (("run_id", uuid.uuid4().hex), ("rank", str(self.rank)),
                                   ("created", str(time.time()))):
                    db.execute("INSERT OR IGNORE INTO _meta (key, value) VALUES (?, ?)",
                               [key, value])
            self.run_id = _meta_get(conn, "run_id")
            row = conn.execute("SELECT max(step) FROM commits").fetchone()
            self._max_step = row[0]
            self._catch_up_consumption(conn)
        except sqlite3.Error as exc:
            raise self._err("cannot open journal", exc) from exc
        # Written only now that the journal holds the run id durably, so the
        # marker never points at a journal that was never written; write then
        # trim, so a kill in between never leaves an empty marker.
        payload = json.dumps({"pid": os.getpid(), "run_id": self.run_id, "rank": self.rank,
                              "journal": os.path.abspath(self.path)}).encode()
        try:
            os.pwrite(fd, payload, 0)
            os.ftruncate(fd, len(payload))
            os.fsync(fd)
        except OSError as exc:
            raise self._err(f"cannot write lock file {lock_file}", exc) from exc

    def _db(self) -> sqlite_utils.Database:
        return sqlite_utils.Database(self.conn, execute_plugins=False)

    @property
    def conn(self) -> sqlite3.Connection:
        if self._conn is None:
            raise JournalError(f"{self.path}: journal is closed")
        return self._conn

    def _writable(self) -> sqlite3.Connection:
        if self.readonly:
            raise JournalError(f"{self.path}: journal was opened read-only")
        return self.conn

    # ---- life cycle ----------------------------------------------------
    def close(self) -> None:
        """Bring consumption up to date, close the database and release the
        lock (idempotent)."""
        with self._mutex:
            try:
                if self._conn is not None and not self.readonly and self._pending:
                    self.flush_consumption()
            except JournalError:
                pass  # the deltas are in the commit rows; the next open folds them in
            finally:
                self._close_locked()

    def _close_locked(self) -> None:
        if self._conn is not None:
            try:
                self._conn.close()
            except sqlite3.Error:
                pass
            self._conn = None
        if self._lock_fd is not None:
            _CHILD_CLOSE.discard(self._lock_fd)
            try:
                os.close(self._lock_fd)  # closing the descriptor drops the flock
            except OSError:
                pass
            self._lock_fd = None

    def __enter__(self) -> "Journal":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __reduce__(self) -> Any:
        raise TypeError("a Journal belongs to the main process and cannot be pickled; "
                        "workers send events with their batches instead")

    def __repr__(self) -> str:
        mode = "ro" if self.readonly else "rw"
        return f"<Journal {self.path!r} rank={self.rank} {mode}>"

    # ---- transactions --------------------------------------------------
    def _transaction(self, body: Callable[[sqlite3.Connection], Any]) -> Any:
        with self._mutex:
            return self._transaction_locked(body)

    def _transaction_locked(self, body: Callable[[sqlite3.Connection], Any]) -> Any:
        conn = self._writable()
        try:
            conn.execute("BEGIN")
            try:
                result = body(conn)
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                raise
        except sqlite3.Error as exc:
            raise self._err("write failed", exc) from exc
        return result

    # ---- config --------------------------------------------------------
    def config(self) -> Dict[str, Any]:
        """The stored run configuration (empty before ``check_config``)."""
        return {r["key"]: json.loads(r["value"])
                for r in self.conn.execute("SELECT key, value FROM config ORDER BY key")}

    def check_config(self, config: Dict[str, Any], *,
                     compatible_keys: Sequence[str] = ("batch_size", "world_size",
                                                       "num_workers", "rank")) -> List[str]:
        """Store the run configuration, or check a resume against it.

        The first call stores ``config``.  Later calls compare key by key
        (values compared as JSON, so tuples equal lists; a key present on
        only one side differs from the other side's ``None``).

        Args:
            config: JSON-serializable values by key.
            compatible_keys: keys that may change between runs.

        Returns:
            The compatible keys whose value changed; they are updated and a
            ``config_change`` event records old and new values.

        Raises:
            JournalConfigMismatch: some other key differs; the message names
                each key with its old and new value, and nothing is changed.
                ``exc.differences`` maps key -> (old, new).
        """
        new = {str(k): _json(v) for k, v in config.items()}

        def body(conn: sqlite3.Connection) -> List[str]:
            old = {r[0]: r[1] for r in conn.execute("SELECT key, value FROM config")}
            now = time.time()
            if not old:
                conn.executemany("INSERT INTO config (key, value, updated) VALUES (?, ?, ?)",
                                 [(k, v, now) for k, v in sorted(new.items())])
                return []
            differ = sorted(k for k in set(old) | set(new)
                            if old.get(k, "null") != new.get(k, "null"))
            bad = [k for k in differ if k not in compatible_keys]
            if bad:
                diffs = {k: (_loads(old.get(k)), _loads(new.get(k))) for k in bad}
                exc = JournalConfigMismatch(
                    f"{self.path}: configuration differs from the journal's run: "
                    + "; ".join(f"{k}: journal has {o!r}, now {n!r}" for k, (o, n) in diffs.items())
                    + " (resume with the original settings, or start a new journal)")
                exc.differences = diffs  # type: ignore[attr-defined]
                raise exc
            for k in differ:
                if k in new:
                    conn.execute("INSERT OR REPLACE INTO config (key, value, updated) "
                                 "VALUES (?, ?, ?)", (k, new[k], now))
                else:
                    conn.execute("DELETE FROM config WHERE key = ?", (k,))
                conn.execute(_SQL_EVENT, (now, EventKind.CONFIG_CHANGE.value, None, _json(
                    {"key": k, "old": _loads(old.get(k)), "new": _loads(new.get(k))})))
            return differ

        return self._transaction(body)

    # ---- events and shards ---------------------------------------------
    def record_events(self, events: List[Dict[str, Any]]) -> None:
        """Append events in one transaction.

        Each event is a dict with ``kind`` (required), optional ``url`` and
        ``ts`` (default: now); every other key (or a ``detail`` dict) goes to
        the JSON ``detail`` column.
        """
        now = time.time()
        rows = []
        for ev in events:
            kind = ev.get("kind")
            if not kind:
                raise ValueError(f"event without a kind: {ev!r}")
            detail = {k: v for k, v in ev.items() if k not in ("kind", "url", "ts", "detail")}
            if isinstance(ev.get("detail"), dict):
                detail.update(ev["detail"])
            rows.append((float(ev.get("ts") or now), str(kind), ev.get("url"),
                         _json(detail) if detail else None))
        if rows:
            self._transaction(lambda conn: conn.executemany(_SQL_EVENT, rows))

    def update_shards(self, updates: List[Dict[str, Any]]) -> None:
        """Apply shard updates in one transaction.

        Each update is ``{"url": ..., <column>: value, "+<counter>": n}``;
        columns are ``name, state, bytes, xxh3_64, attempts, retries, repairs,
        last_error, cache_path``; counters (``attempts, retries, repairs,
        bytes``) may be incremented with a ``+`` prefix; an optional ``ts``
        sets ``updated`` (default: now).  An unknown url is
        inserted as ``pending`` first (``name`` defaults to its basename).
        A state change outside ``TRANSITIONS`` is applied and an
        ``invalid_transition`` event is recorded with it.

        Raises:
            ValueError: unknown column or state, or no url.
        """
        prepared = []
        for upd in updates:
            url = upd.get("url")
            if not url:
                raise ValueError(f"shard update without a url: {upd!r}")
            sets: List[str] = []
            args: List[Any] = []
            for key, value in upd.items():
                if key in ("url", "ts"):
                    continue
                if key.startswith("+"):
                    col = key[1:]
                    if col not in _COUNTER_COLUMNS:
                        raise ValueError(f"{key!r}: only {_COUNTER_COLUMNS} can be incremented")
                    sets.append(f"{col} = coalesce({col}, 0) + ?")
                    args.append(int(value))
                elif key in _SHARD_COLUMNS:
                    if key == "state" and value not in SHARD_STATES:
                        raise ValueError(f"{url}: unknown shard state {value!r}; "
                                         f"states are {SHARD_STATES}")
                    sets.append(f"{key} = ?")
                    args.append(value)
                else:
                    raise ValueError(f"{url}: unknown shard column {key!r}")
            prepared.append((url, upd.get("state"), float(upd.get("ts") or 0.0), sets, args))

        def body(conn: sqlite3.Connection) -> None:
            now = time.time()
            for url, state, ts, sets, args in prepared:
                ts = ts or now
                row = conn.execute("SELECT state FROM shards WHERE url = ?", (url,)).fetchone()
                old = "pending" if row is None else row[0]
                if row is None:
                    conn.execute("INSERT INTO shards (url, name, state, first_seen, updated) "
                                 "VALUES (?, ?, 'pending', ?, ?)", (url, shard_basename(url), ts, ts))
                if state is not None and state != old and state not in TRANSITIONS.get(old, ()):
                    conn.execute(_SQL_EVENT, (ts, EventKind.INVALID_TRANSITION.value, url,
                                              _json({"from": old, "to": state})))
                if sets:
                    conn.execute(f"UPDATE shards SET {', '.join(sets)}, updated = ? WHERE url = ?",
                                 (*args, ts, url))

        if prepared:
            self._transaction(body)

    def shards_in_state(self, state: str) -> List[str]:
        """The urls of the shards now in ``state`` (one of ``SHARD_STATES``)."""
        return [r[0] for r in self.conn.execute("SELECT url FROM shards WHERE state = ?", (state,))]

    def shard(self, url: str) -> Optional[Dict[str, Any]]:
        """One shard's row, or None."""
        row = self.conn.execute("SELECT * FROM shards WHERE url = ?", (url,)).fetchone()
        return None if row is None else dict(row)

    def events(self, kind: Optional[str] = None, limit: Optional[int] = None) -> List[Dict[str, Any]]:
        """Events in order of recording (optionally one kind, the last ``limit``)."""
        sql = "SELECT * FROM events" + (" WHERE kind = ?" if kind else "") + " ORDER BY id DESC"
        args: Tuple[Any, ...] = (kind,) if kind else ()
        if limit is not None:
            sql += " LIMIT ?"
            args += (int(limit),)
        rows = [dict(r) for r in self.conn.execute(sql, args)]
        for r in rows:
            r["detail"] = _loads(r["detail"])
        return rows[::-1]

    def consumption(self, epoch: Optional[int] = None) -> List[Dict[str, Any]]:
        """Consumption rows (this rank), optionally of one epoch.

        Up to date with the latest commit: the table plus the deltas carried
        by commits not yet folded into it (schema version 2).
        """
        with self._mutex:
            conn = self.conn
            if epoch is None:
                cur = conn.execute("SELECT * FROM consumption ORDER BY epoch, url")
            else:
                cur = conn.execute("SELECT * FROM consumption WHERE epoch = ? ORDER BY url", (epoch,))
            rows = {(r["url"], r["epoch"]): dict(r) for r in cur}
            if self.schema_version < 2:
                return list(rows.values())
            for _, url, ep, delta, total in _unfolded_deltas(conn):
                if epoch is not None and ep != epoch:
                    continue
                r = rows.setdefault((url, ep), {"url": url, "epoch": ep, "samples": 0, "total": total,
                                                "complete": 0, "updated": None})
                r["samples"] += delta
                if total is not None:
                    r["total"] = total
                r["complete"] = int(r["total"] is not None and r["samples"] >= r["total"])
            return sorted(rows.values(), key=lambda r: (r["epoch"], r["url"]))

    # ---- commits -------------------------------------------------------
    def commit(self, step: int, *, epoch: int, position: int,
               consumed: Optional[Dict[Tuple[str, int], Tuple[int, Optional[int]]]] = None,
               world_size: Optional[int] = None, batch_size: Optional[int] = None,
               samples_total: Optional[int] = None, stats: Optional[Dict[str, Any]] = None,
               materialize: bool = False) -> None:
        """Record that ``step`` was reached, in one transaction.

        Args:
            step: the training step (int) whose batches have all been handed out.
            epoch, position: the global position after this step (samples of
                ``epoch`` delivered over all ranks).
            consumed: ``{(url, epoch): (delta_samples, total_samples_in_shard)}``
                added to this rank's consumption rows; ``complete`` is set when
                the row's samples reach the total.
            world_size: ranks in this run (default: the journal's).
            batch_size: per-rank batch size, recorded for resume checks.
            samples_total: cumulative samples delivered by this rank.
            stats: optional JSON-able snapshot (``loader.stats()``).
            materialize: also bring the ``consumption`` table up to date in
                this transaction (otherwise done every ``CONSUMPTION_EVERY``
                commits; the deltas are in the commit row either way, so a
                crash loses nothing: the next open folds them in).

        A step at or below the newest committed one means the run was resumed
        from an earlier step: the commits from that step on (the abandoned
        timeline) are replaced and a ``rewind`` event says which.
        Consumption counts are deliveries, so replayed samples count again.

        Raises:
            JournalError: the write failed (disk full, I/O error...).
        """
        ts = time.time()
        step = int(step)
        deltas = None
        if consumed:
            deltas = json.dumps([[u, e, d, t] for (u, e), (d, t) in consumed.items()],
                                separators=(",", ":"))
        row = (step, int(epoch), int(position), self.rank,
               self.world_size if world_size is None else int(world_size),
               batch_size, ts, samples_total, None if stats is None else _json(stats), deltas)
        with self._mutex:
            conn = self._writable()
            max_step = self._max_step
            try:
                conn.execute("BEGIN")
                try:
                    if max_step is not None and step <= max_step:
                        self._rewind(conn, step, max_step, ts)
                    conn.execute(_SQL_COMMIT_INSERT, row)
                    if consumed:
                        for key, (delta, total) in consumed.items():
                            d0, _ = self._pending.get(key, (0, None))
                            self._pending[key] = (d0 + delta, total)
                    self._since += 1
                    if self._since >= CONSUMPTION_EVERY or materialize:
                        self._materialize(conn, step, ts)
                    conn.execute("COMMIT")
                except BaseException:
                    if conn.in_transaction:
                        conn.execute("ROLLBACK")
                    self._pending.clear()  # rebuilt from the commit rows on the next open
                    raise
            except sqlite3.Error as exc:
                raise self._err(f"commit of step {step} failed", exc) from exc
            self._max_step = step

    def _materialize(self, conn: sqlite3.Connection, step: int, ts: float) -> None:
        """Add the pending consumption deltas to ``consumption`` (inside the
        caller's transaction) and record that commits up to ``step`` are in."""
        for (url, ep), (delta, total) in self._pending.items():
            conn.execute(_SQL_CONSUME, (url, ep, delta, total,
                                        int(total is not None and delta >= total), ts))
        conn.execute(_SQL_THROUGH, (str(step),))
        self._pending.clear()
        self._since = 0

    def _catch_up_consumption(self, conn: sqlite3.Connection) -> None:
        """On open: fold in the deltas of commits after ``consumption_through``
        (a crash between materialisations loses nothing)."""
        if self.schema_version < 2:
            return
        last = None
        for step, url, ep, delta, total in _unfolded_deltas(conn):
            d0, _ = self._pending.get((url, ep), (0, None))
            self._pending[(url, ep)] = (d0 + delta, total)
            last = step
        if last is not None:
            self._transaction_locked(lambda c: self._materialize(c, last, time.time()))

    def flush_consumption(self) -> None:
        """Bring the ``consumption`` table up to date now (at epoch end, close)."""
        with self._mutex:
            if not self._pending or self._max_step is None:
                return
            step = self._max_step
            self._transaction_locked(lambda conn: self._materialize(conn, step, time.time()))

    def _rewind(self, conn: sqlite3.Connection, step: int, max_step: int, ts: float) -> None:
        prev = conn.execute("SELECT epoch, position FROM commits WHERE step = ?", (step,)).fetchone()
        n = conn.execute("DELETE FROM commits WHERE step >= ?", (step,)).rowcount
        conn.execute(_SQL_EVENT, (ts, EventKind.REWIND.value, None, _json({
            "step": step, "dropped": n, "dropped_upto": max_step,
            "replaced": None if prev is None else {"epoch": prev[0], "position": prev[1]}})))

    def latest_commit(self) -> Optional[Dict[str, Any]]:
        """The newest commit of this rank as a dict (``stats`` parsed), or None."""
        with self._mutex:
            return _commit_row(self.conn.execute(
                "SELECT * FROM commits ORDER BY step DESC LIMIT 1").fetchone())

    def commit_at(self, step: int) -> Optional[Dict[str, Any]]:
        """This rank's commit of ``step``, or None."""
        with self._mutex:
            return _commit_row(self.conn.execute(
                "SELECT * FROM commits WHERE step = ?", (step,)).fetchone())


def _loads(text: Optional[str]) -> Any:
    return None if text is None else json.loads(text)


def _uri_path(path: str) -> str:
    # "?" and "#" would end the path part of a file: URI
    return os.path.abspath(path).replace("%", "%25").replace("?", "%3f").replace("#", "%23")


# ---------------------------------------------------------------------------
# Whole-run readers
# ---------------------------------------------------------------------------

def _open_run(path: str) -> Dict[int, Journal]:
    """Read-only journals of every rank file that exists, by rank ({} when
    the run has no files at all).  A missing rank 0 with any trace of the
    run left (its lock file's run id, other rank files) is a JournalError."""
    files = _rank_files(path)
    if not os.path.exists(path):
        if _read_lock_info(_lock_path(path)).get("run_id"):
            raise _deleted_error(path)
        if len(files) > 1:
            raise JournalError(f"{path}: rank 0 journal is missing but rank files exist "
                               f"({', '.join(p for _, p in files[1:])})")
        return {}
    journals: Dict[int, Journal] = {}
    try:
        for r, p in files:
            if os.path.exists(p):
                if _never_initialised(p):
                    continue  # created, then the disk filled before the schema: nothing committed
                journals[r] = Journal(path, rank=r, readonly=True)
    except BaseException:
        for j in journals.values():
            j.close()
        raise
    return journals


def _unfolded_deltas(conn: sqlite3.Connection) -> Iterator[Tuple[int, str, int, int, Optional[int]]]:
    """``(step, url, epoch, delta, total)`` of commits not yet folded into the
    consumption table (after ``_meta.consumption_through``), in step order."""
    through = _meta_get(conn, "consumption_through")
    lo = int(through) if through is not None and through.lstrip("-").isdigit() else -(1 << 62)
    for step, text in conn.execute("SELECT step, consumed FROM commits WHERE step > ? "
                                   "AND consumed IS NOT NULL ORDER BY step", (lo,)).fetchall():
        for url, ep, delta, total in json.loads(text):
            yield int(step), url, int(ep), int(delta), total


def _never_initialised(file: str) -> bool:
    """True for a journal file that holds no table at all and whose lock file
    names no run: a creation that failed (say, on a full disk) before the
    schema was written.  Nothing was ever committed to it, so a rerun may
    start fresh; the writer creates the schema in it."""
    if _read_lock_info(_lock_path(file)).get("run_id"):
        return False
    ours = {"_meta", "config", "shards", "consumption", "events", "commits", _MIGRATIONS_TABLE}
    try:
        conn = sqlite3.connect(f"file:{_uri_path(file)}?mode=ro", uri=True)
        try:
            tables = {r[0] for r in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'")}
            if not tables <= ours:
                return False
            if "_meta" in tables and _meta_get(conn, "schema_version"):
                return False
            return "commits" not in tables or \
                conn.execute("SELECT count(*) FROM commits").fetchone()[0] == 0
        finally:
            conn.close()
    except sqlite3.Error:
        return False


def _close_all(journals: Dict[int, Journal]) -> None:
    for j in journals.values():
        j.close()


def _check_step(journals: Dict[int, Journal], step: int, ref: Dict[str, Any]
                ) -> Tuple[List[int], List[int], int]:
    """(missing ranks, disagreeing ranks, world size) of ``step`` judged
    against rank 0's commit ``ref``."""
    world = int(ref["world_size"])
    missing: List[int] = []
    disagree: List[int] = []
    for r in range(1, world):
        j = journals.get(r)
        c = j.commit_at(step) if j is not None else None
        if c is None:
            missing.append(r)
        elif (c["epoch"], c["position"], c["world_size"]) != (ref["epoch"], ref["position"], world):
            disagree.append(r)
    return missing, disagree, world


_MAX_SKIPPED_REPORTED = 20


def resolve_resume(path: str, step: Optional[int] = None) -> Optional[Dict[str, Any]]:
    """Where a run should resume: a step every rank of its layout committed.

    Reads every journal file of the run read-only.  A commit of step S made
    under world size W is complete when ranks 0..W-1 all have step S with the
    same ``(epoch, position, world_size)``.

    Args:
        path: the run's journal path (rank 0's file).
        step: a specific step (e.g. the step of the model checkpoint being
            loaded), or None for the latest complete step.

    Returns:
        None when the run has no journal at all, or no commit yet (start from
        the beginning); otherwise ``{"step", "epoch", "position",
        "world_size", "batch_size", "ts", "samples_total" (rank 0's),
        "samples_total_per_rank" ([rank 0, ..., rank W-1]), "run_id",
        "skipped_incomplete": [{"step", "missing_ranks", "disagreeing_ranks"},
        ...] (newer steps passed over, newest first, at most 20),
        "skipped_incomplete_count"}``.

    Raises:
        JournalError: rank 0's journal is missing while its lock file or other
            rank files remain, or a file is unreadable.
        JournalIncompleteCommit: ``step`` is not complete (the message names
            the ranks that lack it or disagree), or commits exist but none is
            complete.
    """
    journals = _open_run(path)
    if not journals:
        return None
    try:
        j0 = journals[0]
        skipped: List[Dict[str, Any]] = []
        n_skipped = 0
        if step is not None:
            ref = j0.commit_at(step)
            if ref is None:
                raise JournalIncompleteCommit(f"{path}: step {step} was never committed by rank 0")
            missing, disagree, world = _check_step(journals, step, ref)
            if missing or disagree:
                raise JournalIncompleteCommit(_incomplete_msg(path, step, world, missing,
                                                              disagree, journals))
            return _resume_dict(journals, ref, world, [], 0, j0.run_id)
        cur = j0.conn.execute("SELECT * FROM commits ORDER BY step DESC")
        any_commit = False
        for row in cur:
            any_commit = True
            ref = _commit_row(row)
            assert ref is not None
            missing, disagree, world = _check_step(journals, ref["step"], ref)
            if not missing and not disagree:
                return _resume_dict(journals, ref, world, skipped, n_skipped, j0.run_id)
            n_skipped += 1
            if len(skipped) < _MAX_SKIPPED_REPORTED:
                skipped.append({"step": ref["step"], "missing_ranks": missing,
                                "disagreeing_ranks": disagree})
        if not any_commit:
            if any(j.latest_commit() is not None for r, j in journals.items() if r):
                raise JournalIncompleteCommit(f"{path}: other ranks committed steps but rank 0 "
                                              f"has none")
            return None
        first = skipped[0] if skipped else {}
        raise JournalIncompleteCommit(
            f"{path}: no step is complete across ranks ({n_skipped} steps checked; newest "
            f"{first.get('step')} missing ranks {first.get('missing_ranks')}, disagreeing "
            f"ranks {first.get('disagreeing_ranks')})")
    finally:
        _close_all(journals)


def _incomplete_msg(path: str, step: int, world: int, missing: List[int], disagree: List[int],
                    journals: Dict[int, Journal]) -> str:
    parts = []
    if missing:
        parts.append("missing on rank(s) " + ", ".join(
            f"{r}" + ("" if r in journals else f" (no file {rank_journal_path(path, r)})")
            for r in missing))
    if disagree:
        parts.append("rank(s) " + ", ".join(map(str, disagree))
                     + " committed it with a different epoch/position/world size")
    return f"{path}: step {step} (world size {world}) is incomplete: " + "; ".join(parts)


def _resume_dict(journals: Dict[int, Journal], ref: Dict[str, Any], world: int,
                 skipped: List[Dict[str, Any]], n_skipped: int, run_id: Optional[str]) -> Dict[str, Any]:
    totals = [ref["samples_total"]] + [journals[r].commit_at(ref["step"])["samples_total"]
                                       for r in range(1, world)]
    return {"step": ref["step"], "epoch": ref["epoch"], "position": ref["position"],
            "world_size": world, "batch_size": ref["batch_size"], "ts": ref["ts"],
            "samples_total": totals[0], "samples_total_per_rank": totals, "run_id": run_id,
            "skipped_incomplete": skipped, "skipped_incomplete_count": n_skipped}


def status(path: str, *, last_errors: int = 10, throughput_window: int = 50) -> Dict[str, Any]:
    """A JSON-serializable summary of a whole run (all rank files).

    This is the ``resumewds status --json`` contract.  Fields:

    - ``path`` (str): the run's journal path (rank 0's file).
    - ``run_id`` (str | None): rank 0's run id.
    - ``schema_version`` (int): rank 0's schema version.
    - ``generated`` (float): Unix time this summary was made.
    - ``config`` (dict): rank 0's stored run configuration.
    - ``latest`` (dict | None): rank 0's newest commit: ``step``, ``epoch``,
      ``position``, ``world_size``, ``batch_size``, ``ts``, ``samples_total``.
    - ``resume`` (dict | None): what ``resolve_resume(path)`` returns
      (None: would start from the beginning).
    - ``resume_error`` (str | None): why no resume point could be found.
    - ``ranks`` (list): per rank file, by rank: ``rank``, ``path``,
      ``latest_step`` (int | None), ``epoch``, ``position``, ``ts`` (of that
      commit), ``samples_total``, ``commits`` (number of commit rows).
    - ``shards`` (dict): ``total`` (int); ``counts`` ({state: n} with every
      state of ``SHARD_STATES``); ``list``: one dict per url (``url``,
      ``name``, ``state``, ``bytes``, ``xxh3_64``, ``attempts``, ``retries``,
      ``repairs``, ``last_error``, ``cache_path``, ``first_seen``,
      ``updated``).  A url in several rank files shows the most recently
      updated row's state and fields, with counters summed over ranks.
    - ``counts`` (dict): event totals over all ranks: ``retries``,
      ``repairs``, ``failures`` (``fail``), ``skips``, ``evictions``,
      ``verify_failures``, ``config_changes``, ``rewinds``.
    - ``events_by_kind`` ({kind: n}): every event kind over all ranks.
    - ``last_errors`` (list): the newest ``last_errors`` events of kinds
      ``ERROR_EVENT_KINDS``, newest first: ``ts``, ``rank``, ``kind``,
      ``url``, ``detail`` (dict | None).
    - ``throughput`` (dict): from each rank's last ``throughput_window``
      commits: ``samples_per_s`` (sum over ranks, None if unknown),
      ``steps_per_s`` (rank 0), ``per_rank`` ([{``rank``,
      ``samples_per_s``}]), ``window_s`` (rank 0's time span).
    - ``consumption`` (dict): for rank 0's latest epoch (``epoch``), summed
      over ranks: ``shards_started``, ``shards_complete`` (samples reached the
      shard total), ``samples``.
    - ``stats`` (dict | None): the ``stats`` snapshot of rank 0's latest commit.

    Raises:
        JournalError: there is no journal at ``path``, or a file is unreadable.
    """
    journals = _open_run(path)
    if not journals:
        raise JournalError(f"{path}: no journal here")
    try:
        j0 = journals[0]
        latest = j0.latest_commit()
        out: Dict[str, Any] = {
            "path": path, "run_id": j0.run_id, "schema_version": j0.schema_version,
            "generated": time.time(), "config": j0.config(),
            "latest": None if latest is None else {
                k: latest[k] for k in ("step", "epoch", "position", "world_size", "batch_size",
                                       "ts", "samples_total")},
        }
        try:
            out["resume"], out["resume_error"] = resolve_resume(path), None
        except JournalError as exc:
            out["resume"], out["resume_error"] = None, str(exc)

        ranks = []
        per_rank_rate = []
        for r, j in sorted(journals.items()):
            c = j.latest_commit()
            n = j.conn.execute("SELECT count(*) FROM commits").fetchone()[0]
            ranks.append({"rank": r, "path": j.path,
                          "latest_step": c and c["step"], "epoch": c and c["epoch"],
                          "position": c and c["position"], "ts": c and c["ts"],
                          "samples_total": c and c["samples_total"], "commits": n})
            per_rank_rate.append({"rank": r, "samples_per_s": _rate(j, throughput_window)[0]})
        out["ranks"] = ranks

        shards: Dict[str, Dict[str, Any]] = {}
        for r, j in sorted(journals.items()):
            for row in _db_of(j).query("SELECT * FROM shards"):
                prev = shards.get(row["url"])
                if prev is None:
                    shards[row["url"]] = dict(row)
                    continue
                summed: Dict[str, Any] = {k: (prev.get(k) or 0) + (row.get(k) or 0)
                                          for k in ("attempts", "retries", "repairs")}
                seen = [x for x in (prev.get("first_seen"), row.get("first_seen")) if x is not None]
                summed["first_seen"] = min(seen) if seen else None
                if (row.get("updated") or 0) > (prev.get("updated") or 0):
                    prev.update(row)
                prev.update(summed)
        counts = {s: 0 for s in SHARD_STATES}
        for s in shards.values():
            counts[s["state"]] = counts.get(s["state"], 0) + 1
        out["shards"] = {"total": len(shards), "counts": counts,
                         "list": sorted(shards.values(), key=lambda s: s["url"])}

        by_kind: Dict[str, int] = {}
        errors: List[Dict[str, Any]] = []
        marks = ",".join("?" * len(ERROR_EVENT_KINDS))
        for r, j in sorted(journals.items()):
            db = _db_of(j)
            for row in db.query("SELECT kind, count(*) AS n FROM events GROUP BY kind"):
                by_kind[row["kind"]] = by_kind.get(row["kind"], 0) + row["n"]
            for row in db.query(f"SELECT * FROM events WHERE kind IN ({marks}) "
                                f"ORDER BY id DESC LIMIT ?", [*ERROR_EVENT_KINDS, last_errors]):
                errors.append({"ts": row["ts"], "rank": r, "kind": row["kind"],
                               "url": row["url"], "detail": _loads(row["detail"])})
        errors.sort(key=lambda e: e["ts"] or 0, reverse=True)
        K = EventKind
        out["counts"] = {name: by_kind.get(kind.value, 0) for name, kind in (
            ("retries", K.RETRY), ("repairs", K.REPAIR), ("failures", K.FAIL), ("skips", K.SKIP),
            ("evictions", K.EVICT), ("verify_failures", K.VERIFY_FAIL),
            ("config_changes", K.CONFIG_CHANGE), ("rewinds", K.REWIND))}
        out["events_by_kind"] = dict(sorted(by_kind.items()))
        out["last_errors"] = errors[:last_errors]

        rates = [p["samples_per_s"] for p in per_rank_rate]
        _, steps_per_s, window = _rate(j0, throughput_window)
        out["throughput"] = {
            "samples_per_s": sum(rates) if rates and all(x is not None for x in rates) else None,
            "steps_per_s": steps_per_s, "per_rank": per_rank_rate, "window_s": window}

        cons = {"epoch": None, "shards_started": 0, "shards_complete": 0, "samples": 0}
        if latest is not None:
            ep = latest["epoch"]
            agg: Dict[str, List[Optional[int]]] = {}
            for j in journals.values():
                for row in j.consumption(ep):
                    a = agg.setdefault(row["url"], [0, None])
                    a[0] = (a[0] or 0) + row["samples"]
                    a[1] = row["total"] if row["total"] is not None else a[1]
            cons = {"epoch": ep, "shards_started": len(agg),
                    "shards_complete": sum(1 for s, t in agg.values() if t is not None and s >= t),
                    "samples": sum(s for s, _ in agg.values())}
        out["consumption"] = cons
        out["stats"] = None if latest is None else latest["stats"]
        return out
    finally:
        _close_all(journals)


def _db_of(j: Journal) -> sqlite_utils.Database:
    return j._db()


def _rate(j: Journal, window: int) -> Tuple[Optional[float], Optional[float], Optional[float]]:
    """(samples/s, steps/s, seconds spanned) over the last ``window`` commits."""
    rows = list(j.conn.execute(
        "SELECT step, ts, samples_total FROM commits ORDER BY step DESC LIMIT ?", (window,)))
    if len(rows) < 2:
        return None, None, None
    last, first = rows[0], rows[-1]
    dt = last["ts"] - first["ts"]
    if dt <= 0:
        return None, None, None
    samples = None
    if last["samples_total"] is not None and first["samples_total"] is not None:
        samples = (last["samples_total"] - first["samples_total"]) / dt
    return samples, (last["step"] - first["step"]) / dt, dt


def format_status(st: Dict[str, Any]) -> str:
    """Human-readable text of a ``status()`` dict, for ``resumewds status``.

    A mixture run's dict (completed by :func:`resumewds.report.complete_status`)
    also has ``mixture``: one line per source (delivered samples and fraction
    against the current phase's weight), after the phase index and position.
    Any other run's text has no mixture line.
    """
    lines = [f"journal  {st['path']}  (run {st.get('run_id')}, schema v{st.get('schema_version')})"]
    latest = st.get("latest")
    if latest is None:
        lines.append("latest   no commit yet")
    else:
        lines.append(f"latest   step {latest['step']}  epoch {latest['epoch']}  position "
                     f"{latest['position']}  world {latest['world_size']}  at {_fmt_ts(latest['ts'])}")
    res = st.get("resume")
    if res is not None:
        extra = (f"  (skipped {res['skipped_incomplete_count']} incomplete newer step(s))"
                 if res.get("skipped_incomplete_count") else "")
        lines.append(f"resume   step {res['step']}  epoch {res['epoch']}  position {res['position']}{extra}")
    elif st.get("resume_error"):
        lines.append(f"resume   NOT POSSIBLE: {st['resume_error']}")
    else:
        lines.append("resume   from the beginning")
    for r in st.get("ranks", []):
        lines.append(f"  rank {r['rank']}: step {r['latest_step']}  position {r['position']}  "
                     f"samples {r['samples_total']}  commits {r['commits']}")
    tp = st.get("throughput") or {}
    if tp.get("samples_per_s") is not None or tp.get("steps_per_s") is not None:
        sps = tp.get("samples_per_s")
        lines.append("rate     " + (f"{sps:,.1f} samples/s  " if sps is not None else "")
                     + (f"{tp['steps_per_s']:,.2f} steps/s" if tp.get("steps_per_s") else ""))
    sh = st.get("shards") or {}
    counts = ", ".join(f"{k} {v}" for k, v in (sh.get("counts") or {}).items() if v)
    lines.append(f"shards   {sh.get('total', 0)}" + (f": {counts}" if counts else ""))
    cons = st.get("consumption") or {}
    if cons.get("epoch") is not None:
        lines.append(f"epoch {cons['epoch']}: {cons['shards_complete']}/{cons['shards_started']} "
                     f"shards done, {cons['samples']} samples")
    if st.get("mixture"):  # a mixture run (report.complete_status): one line per source
        from .mixdataset import format_mixture

        lines.extend(format_mixture(st["mixture"]).splitlines())
    elif st.get("mixture_error"):
        lines.append(f"mixture  {st['mixture_error']}")
    c = st.get("counts") or {}
    lines.append("events   " + ", ".join(f"{k} {v}" for k, v in c.items()))
    errs = st.get("last_errors") or []
    if errs:
        lines.append("last errors:")
        for e in errs:
            d = e.get("detail") or {}
            msg = d.get("error") or d.get("actual") or (_json(d) if d else "")
            lines.append(f"  {_fmt_ts(e['ts'])} rank {e['rank']} {e['kind']:<12} "
                         f"{e.get('url') or '-'}  {msg}")
    return "\n".join(lines)


def _fmt_ts(ts: Optional[float]) -> str:
    if ts is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(ts))


__all__ = [
    "ERROR_EVENT_KINDS",
    "JOURNAL_SCHEMA_VERSION",
    "Journal",
    "SHARD_STATES",
    "TRANSITIONS",
    "format_status",
    "rank_journal_path",
    "resolve_resume",
    "run_journal_paths",
    "shard_updates_from_events",
    "status",
]


# ---------------------------------------------------------------------------
# Public read functions for reports (issue 11: ``report`` no longer reaches
# into private methods or tables with raw SQL).  Self-contained block (H2).
# ---------------------------------------------------------------------------

def read_commits(path: str) -> Dict[int, List[Dict[str, Any]]]:
    """Every rank's commits, oldest first: ``{rank: [{step, epoch, position,
    ts, samples_total, stats}]}`` (``stats`` parsed, or None).

    Example:
        >>> read_commits("run.db")[0][-1]["step"]      # doctest: +SKIP
        160
    """
    journals = _open_run(path)
    try:
        out: Dict[int, List[Dict[str, Any]]] = {}
        for r, j in sorted(journals.items()):
            rows = [dict(x) for x in j.conn.execute(
                "SELECT step, epoch, position, ts, samples_total, stats FROM commits ORDER BY ts, step")]
            for x in rows:
                x["stats"] = json.loads(x["stats"]) if x["stats"] else None
            out[r] = rows
        return out
    finally:
        _close_all(journals)


def read_events(path: str, kinds: Sequence[str], limit_per_kind: int = 5000) -> List[Dict[str, Any]]:
    """The newest ``limit_per_kind`` events of each kind, every rank, oldest
    first: ``[{ts, rank, kind, url, detail}]`` (``detail`` parsed)."""
    journals = _open_run(path)
    try:
        out: List[Dict[str, Any]] = []
        for r, j in sorted(journals.items()):
            for kind in kinds:
                for x in j.conn.execute("SELECT ts, kind, url, detail FROM events WHERE kind = ? "
                                        "ORDER BY id DESC LIMIT ?", (kind, int(limit_per_kind))):
                    e = dict(x)
                    e["rank"] = r
                    e["detail"] = json.loads(e["detail"]) if e["detail"] else {}
                    out.append(e)
        out.sort(key=lambda e: e["ts"] or 0)
        return out
    finally:
        _close_all(journals)


def read_event_totals(path: str) -> Dict[str, Any]:
    """Totals over every rank and loader of the run: ``{"downloads": {count,
    bytes, seconds}, "evicted": {url: n}, "last_evict": {url: ts},
    "last_fetch": {url: ts}}``."""
    journals = _open_run(path)
    try:
        downloads = {"count": 0, "bytes": 0, "seconds": 0.0}
        evicted: Dict[str, int] = {}
        last_evict: Dict[str, float] = {}
        last_fetch: Dict[str, float] = {}
        for j in journals.values():
            row = j.conn.execute(
                "SELECT count(*), sum(json_extract(detail, '$.bytes')), "
                "sum(json_extract(detail, '$.seconds')) FROM events WHERE kind = 'fetch_done'").fetchone()
            downloads["count"] += row[0] or 0
            downloads["bytes"] += row[1] or 0
            downloads["seconds"] += row[2] or 0.0
            for url, n, ts in j.conn.execute("SELECT url, count(*), max(ts) FROM events WHERE kind = 'evict' "
                                             "GROUP BY url"):
                evicted[url] = evicted.get(url, 0) + n
                last_evict[url] = max(ts or 0, last_evict.get(url, 0))
            for url, ts in j.conn.execute("SELECT url, max(ts) FROM events WHERE kind IN "
                                          "('fetch_done', 'cache_hit', 'verify_ok') GROUP BY url"):
                last_fetch[url] = max(ts or 0, last_fetch.get(url, 0))
        return {"downloads": downloads, "evicted": evicted, "last_evict": last_evict,
                "last_fetch": last_fetch}
    finally:
        _close_all(journals)


def read_consumption(path: str) -> Dict[int, Dict[str, Dict[str, Any]]]:
    """Samples consumed per epoch and shard, summed over ranks, up to the
    latest commit: ``{epoch: {url: {"samples": n, "total": t}}}``."""
    journals = _open_run(path)
    try:
        out: Dict[int, Dict[str, Dict[str, Any]]] = {}
        for j in journals.values():
            for row in j.consumption():
                c = out.setdefault(int(row["epoch"]), {}).setdefault(
                    row["url"], {"samples": 0, "total": row["total"]})
                c["samples"] += row["samples"] or 0
                if row["total"] is not None:
                    c["total"] = row["total"]
        return out
    finally:
        _close_all(journals)


__all__ += ["read_commits", "read_consumption", "read_event_totals", "read_events"]
