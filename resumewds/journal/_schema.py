"""The journal's tables, their migrations, and the checks made on open.

Migrations are sqlite-utils 4's ``Migrations`` (set ``MIGRATION_SET``).  Each
step also records ``_meta.schema_version`` in its own transaction, and
:func:`check_schema` refuses a journal from a newer resumewds.  A new step:
``_m00N_<what>(db)`` appended to ``_MIGRATIONS``, ``JOURNAL_SCHEMA_VERSION =
N``, a line in docs/ARCHITECTURE.md; never edit or reorder a released step.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import tempfile
from typing import TYPE_CHECKING, Any, Callable, Dict, List, Optional, Tuple

if TYPE_CHECKING:
    import sqlite_utils

from ..errors import JournalError
from ._lock import recorded_run_id
from ._paths import uri_path

MIGRATION_SET = "resumewds.journal"
MIGRATIONS_TABLE = "_sqlite_migrations"  # the table sqlite-utils Migrations uses
TABLES = ("_meta", "config", "shards", "consumption", "events", "commits")


def _m001_initial(db: sqlite_utils.Database) -> None:
    """Version 1: every table of the journal."""
    db.execute("CREATE TABLE _meta (key TEXT PRIMARY KEY, value TEXT)")
    db.execute("CREATE TABLE config (key TEXT PRIMARY KEY, value TEXT, updated REAL)")
    db.table("shards").create(
        {"url": str, "name": str, "state": str, "bytes": int, "xxh3_64": str,
         "attempts": int, "retries": int, "repairs": int, "last_error": str,
         "cache_path": str, "first_seen": float, "updated": float},
        pk="url", not_null={"state", "attempts", "retries", "repairs"},
        defaults={"state": "pending", "attempts": 0, "retries": 0, "repairs": 0})
    db.table("shards").create_index(["state"])
    db.table("consumption").create(
        {"url": str, "epoch": int, "samples": int, "total": int, "complete": int,
         "updated": float},
        pk=("url", "epoch"), not_null={"samples", "complete"},
        defaults={"samples": 0, "complete": 0})
    db.table("events").create(
        {"id": int, "ts": float, "kind": str, "url": str, "detail": str}, pk="id")
    db.table("events").create_index(["kind"])
    db.table("commits").create(
        {"step": int, "epoch": int, "position": int, "rank": int, "world_size": int,
         "batch_size": int, "ts": float, "samples_total": int, "stats": str},
        pk="step", not_null={"epoch", "position", "rank", "world_size", "ts"})


def _m002_commit_consumed(db: sqlite_utils.Database) -> None:
    """Version 2: each commit row carries its own consumption deltas (JSON)."""
    db.execute("ALTER TABLE commits ADD COLUMN consumed TEXT")


def _m003_commit_place(db: sqlite_utils.Database) -> None:
    """Version 3: a commit row may carry its loader's place beyond ``(epoch, position)``."""
    db.execute("ALTER TABLE commits ADD COLUMN place TEXT")


# (version, name, function); append only
_MIGRATIONS: List[Tuple[int, str, Callable[[sqlite_utils.Database], None]]] = [
    (1, "m001_initial", _m001_initial),
    (2, "m002_commit_consumed", _m002_commit_consumed),
    (3, "m003_commit_place", _m003_commit_place),
]
JOURNAL_SCHEMA_VERSION: int = 3


def _migrations() -> Any:
    import sqlite_utils  # lazy: ~60 ms of import, paid only by a loader that opens a journal
    migrations = sqlite_utils.Migrations(MIGRATION_SET)
    for version, name, fn in _MIGRATIONS:
        migrations(name=name)(_recording_version(version, fn))
    return migrations


def _recording_version(version: int, fn: Callable[[sqlite_utils.Database], None]
                       ) -> Callable[[sqlite_utils.Database], None]:
    def run(db: sqlite_utils.Database) -> None:
        fn(db)
        db.execute("INSERT OR REPLACE INTO _meta (key, value) VALUES ('schema_version', ?)", [str(version)])
    run.__name__ = fn.__name__
    return run


def apply_migrations(db: sqlite_utils.Database) -> int:
    """Bring the schema to ``JOURNAL_SCHEMA_VERSION`` (one transaction per step)."""
    _migrations().apply(db)
    return JOURNAL_SCHEMA_VERSION


def applied_migrations(conn: sqlite3.Connection) -> List[str]:
    """The names of the steps applied to the file, in order (read-only)."""
    import sqlite_utils  # lazy: ~60 ms of import, paid only by a loader that opens a journal
    return [m.name for m in _migrations().applied(sqlite_utils.Database(conn, execute_plugins=False))]


def check_schema(conn: sqlite3.Connection, file: str) -> int:
    """The file's schema version (0: none yet); a JournalError naming ``file`` when it is
    newer than this code (a higher version, or applied steps it does not know)."""
    version = meta_get(conn, "schema_version")
    v = int(version) if version and version.isdigit() else 0
    known = {name for _, name, _ in _MIGRATIONS}
    unknown = [n for n in applied_migrations(conn) if n not in known]
    if v > JOURNAL_SCHEMA_VERSION or unknown:
        raise JournalError(
            f"{file}: journal schema version {v} is newer than this resumewds understands "
            f"(max {JOURNAL_SCHEMA_VERSION}"
            + (f"; unknown migrations {unknown}" if unknown else "")
            + "); upgrade resumewds")
    return v


def meta_get(conn: sqlite3.Connection, key: str) -> Optional[str]:
    """``_meta[key]`` (None when absent or before the schema exists)."""
    if conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = '_meta'").fetchone() is None:
        return None
    row = conn.execute("SELECT value FROM _meta WHERE key = ?", (key,)).fetchone()
    return None if row is None else row[0]


#: what SQLite answers when a read-only open cannot make or use the WAL index (``-shm``):
#: SQLITE_CANTOPEN (read-only file system), SQLITE_READONLY_CANTINIT, SQLITE_READONLY_DIRECTORY
_NO_WAL_INDEX = {14: "unable to open database file", 1288: "attempt to write a readonly database",
                 1544: "attempt to write a readonly database"}


def _no_wal_index(exc: sqlite3.Error) -> bool:
    code = getattr(exc, "sqlite_errorcode", None)  # Python 3.11+
    return code in _NO_WAL_INDEX if code is not None else str(exc) in _NO_WAL_INDEX.values()


def connect_readonly(file: str, **kwargs: Any) -> Tuple[sqlite3.Connection, Optional[str]]:
    """A read-only connection to journal ``file``, also where nothing can be written.

    SQLite opens a WAL journal ``mode=ro`` only when its ``-shm`` index exists
    or can be made.  Where it cannot: with no (or an empty) ``-wal`` the file
    is opened ``immutable=1``; a ``-wal`` with frames would be ignored that
    way, so file and ``-wal`` are copied to a temporary directory instead.

    Returns:
        The connection and the temporary directory to remove once it is
        closed (None when not copied).

    Raises:
        JournalError: a copy was needed and no temporary directory is writable.
    """
    uri = f"file:{uri_path(file)}"
    conn = sqlite3.connect(f"{uri}?mode=ro", uri=True, **kwargs)
    try:
        conn.execute("SELECT count(*) FROM sqlite_master").fetchone()  # SQLite opens on first use
        return conn, None
    except sqlite3.OperationalError as exc:
        conn.close()
        if not _no_wal_index(exc):
            raise
    wal = file + "-wal"
    if not os.path.exists(wal) or os.path.getsize(wal) == 0:
        conn = sqlite3.connect(f"{uri}?mode=ro&immutable=1", uri=True, **kwargs)
        return conn, None
    try:
        copy_dir = tempfile.mkdtemp(prefix="resumewds-journal-")
    except OSError as exc:
        raise JournalError(f"{file}: its directory is read-only and its write-ahead log {wal} holds commits: "
                           f"reading them needs a copy in a writable temporary directory, and none could be "
                           f"made ({exc}); set TMPDIR to a writable directory") from exc
    try:
        copy = os.path.join(copy_dir, os.path.basename(file))
        shutil.copyfile(file, copy)
        shutil.copyfile(wal, copy + "-wal")
        conn = sqlite3.connect(f"file:{uri_path(copy)}?mode=ro", uri=True, **kwargs)
    except BaseException:
        shutil.rmtree(copy_dir, ignore_errors=True)
        raise
    return conn, copy_dir


def never_initialised(file: str) -> bool:
    """True for a journal whose creation failed before the schema was written
    (no table but ours, no version, no commit, no run in its lock file)."""
    if recorded_run_id(file):
        return False
    ours = {*TABLES, MIGRATIONS_TABLE}
    try:
        conn, copied = connect_readonly(file)
        try:
            tables = {r[0] for r in conn.execute(
                "SELECT name FROM sqlite_master WHERE type = 'table' AND name NOT LIKE 'sqlite_%'")}
            if not tables <= ours:
                return False
            if "_meta" in tables and meta_get(conn, "schema_version"):
                return False
            return "commits" not in tables or \
                conn.execute("SELECT count(*) FROM commits").fetchone()[0] == 0
        finally:
            conn.close()
            if copied:
                shutil.rmtree(copied, ignore_errors=True)
    except (sqlite3.Error, OSError):
        return False


def dumps(value: Any) -> str:
    """A JSON column's text (sorted keys, compact; unknown types as str)."""
    return json.dumps(value, sort_keys=True, default=str, separators=(",", ":"))


def loads(text: Optional[str]) -> Any:
    """A JSON column's value (None stays None)."""
    return None if text is None else json.loads(text)


def commit_row(row: Optional[sqlite3.Row]) -> Optional[Dict[str, Any]]:
    """A ``commits`` row as a dict with ``stats`` and ``place`` parsed (None stays None)."""
    if row is None:
        return None
    d = dict(row)
    for key in ("stats", "place"):
        text = d.get(key)
        d[key] = json.loads(text) if text else None
    return d
