"""The ``Journal`` class: one rank's journal file, its writer and its own reads.

Durability: WAL mode, one transaction per change.  ``synchronous="NORMAL"``
survives kill -9 (a power loss may lose the last transactions, never
corrupting the file); ``"FULL"`` fsyncs every transaction and survives power
loss too.  ``commit`` is the hot path: raw cached ``sqlite3`` statements, one
``BEGIN``/``COMMIT``.  What is recorded goes through :mod:`resumewds.redact`
first.  A commit row carries its consumption deltas; the ``consumption``
table folds them in every ``CONSUMPTION_EVERY`` commits, at epoch ends, on
close and on open (``_meta.consumption_through``), and readers add the rest.
"""

from __future__ import annotations

import json
import os
import shutil
import sqlite3
import threading
import time
import uuid
from typing import TYPE_CHECKING, Any, Callable, Dict, Iterator, List, Optional, Sequence, Tuple

if TYPE_CHECKING:
    import sqlite_utils

from ..errors import JournalConfigMismatch, JournalError
from ..events import EventKind
from ..manifest import shard_basename
from ..redact import redact_text, redact_url
from ._lock import (
    LockFile,
    deleted_error,
    lock_path,
    lost_commits_error,
    parse_commit_record,
    read_lock_info,
    recorded_run_id,
)
from ._paths import rank_journal_path, uri_path
from ._schema import (
    MIGRATIONS_TABLE,
    apply_migrations,
    check_schema,
    commit_row,
    connect_readonly,
    dumps,
    loads,
    meta_get,
    never_initialised,
)
from ._states import COUNTER_COLUMNS, SHARD_COLUMNS, SHARD_STATES, TRANSITIONS

CONSUMPTION_EVERY = 32  # commits between materialisations of the consumption table

_SYNC_MODES = ("NORMAL", "FULL", "EXTRA")

_SQL_COMMIT_INSERT = (
    "INSERT INTO commits (step, epoch, position, rank, world_size, batch_size, ts, "
    "samples_total, stats, consumed, place) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)")
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
            is opened; its result is ``self.after_lock_result`` (the loader
            reads its resume point here, so two runs never share one).

    Raises:
        JournalError: the file is corrupt, not a journal, newer, in use by
            another writer, or deleted or lost commits its lock file
            records.  The message names the file.

    A Journal lives in the main process only; it refuses to be pickled.

    Example:
        >>> with Journal("run.db") as j:
        ...     j.update_shards([{"url": "a.tar", "state": "verified", "bytes": 10}])
        ...     j.commit(1, epoch=0, position=4, consumed={("a.tar", 0): (4, 10)})
        ...     j.shard("a.tar")["state"], j.latest_commit()["step"]
        ('verified', 1)
    """

    def __init__(self, path: str, *, rank: int = 0, world_size: int = 1,
                 readonly: bool = False, synchronous: str = "NORMAL",
                 after_lock: Optional[Callable[[], Any]] = None):
        sync = str(synchronous).upper()
        if sync not in _SYNC_MODES:
            raise ValueError(f"synchronous must be one of {_SYNC_MODES}, got {synchronous!r}")
        if not isinstance(world_size, int) or world_size < 1:
            raise ValueError(f"world_size must be a positive int, got {world_size!r}")
        self.path = rank_journal_path(path, rank)
        self.rank = rank
        self.world_size = world_size
        self.readonly = readonly
        self.run_id: Optional[str] = None
        self.schema_version: int = 0
        self._lock: Optional[LockFile] = None
        self._copy_dir: Optional[str] = None  # a read-only copy's directory (see connect_readonly)
        self._conn: Optional[sqlite3.Connection] = None
        self._max_step: Optional[int] = None
        self._file_id: Optional[Tuple[int, int]] = None  # (st_dev, st_ino) of the file the writer opened
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

    def _err(self, what: str, exc: Optional[BaseException] = None) -> JournalError:
        detail = f": {exc}" if exc is not None else ""
        return JournalError(f"{self.path}: {what}{detail}")

    def _connect(self, uri: str) -> sqlite3.Connection:
        try:
            # check_same_thread off: a checkpoint thread may commit; self._mutex
            # serialises our own use of the connection.
            conn = sqlite3.connect(uri, uri=True, isolation_level=None, timeout=10.0, check_same_thread=False)
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

    def _open_readonly(self) -> None:
        if not os.path.exists(self.path):
            if recorded_run_id(self.path):
                raise deleted_error(self.path)
            raise self._err("no journal here")
        try:  # also where nothing can be written (a read-only file system)
            conn, self._copy_dir = connect_readonly(self.path, isolation_level=None, timeout=10.0,
                                                    check_same_thread=False)
        except (sqlite3.OperationalError, OSError) as exc:
            raise self._err("cannot open journal", exc) from exc
        except sqlite3.DatabaseError as exc:
            raise self._err("journal is corrupt or not a SQLite database", exc) from exc
        conn.row_factory = sqlite3.Row
        self._conn = conn
        try:
            conn.execute("PRAGMA busy_timeout = 5000")
            self._check_integrity(conn)
            self.schema_version = check_schema(conn, self.path)
            if self.schema_version == 0:
                raise self._err("not a resumewds journal (no schema version)")
            self.run_id = meta_get(conn, "run_id")
        except sqlite3.Error as exc:
            raise self._err("cannot read journal", exc) from exc

    def _open_writer(self, sync: str) -> None:
        lock = LockFile(self.path)
        lock_file = lock.path
        d = os.path.dirname(self.path)
        if d and not os.path.isdir(d):
            raise self._err(f"directory {d} does not exist")
        for f in (self.path, lock_file, self.path + "-wal", self.path + "-shm"):
            if os.path.islink(f):
                raise self._err(f"{f} is a symbolic link; refusing to follow it "
                                "(a journal never writes through links)")
        lock.acquire()
        self._lock = lock
        if self._after_lock is not None:
            self.after_lock_result = self._after_lock()  # under the lock, before any file
        marker = recorded_run_id(self.path)
        existed = os.path.exists(self.path)
        if marker and not existed:
            raise deleted_error(self.path)
        conn = self._conn = self._connect(f"file:{uri_path(self.path)}?mode=rwc")
        try:
            conn.execute("PRAGMA busy_timeout = 10000")
            self._check_integrity(conn)
            self.schema_version = check_schema(conn, self.path)
            if self.schema_version == 0 and never_initialised(self.path):
                # a creation that failed part-way (e.g. disk full) left empty
                # tables of ours: clear them so the migrations start clean
                for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table' "
                                            "AND name NOT LIKE 'sqlite_%'").fetchall():
                    conn.execute(f'DROP TABLE IF EXISTS "{name}"')
                conn.commit()
            if self.schema_version == 0 and conn.execute(
                    "SELECT 1 FROM sqlite_master WHERE name NOT LIKE 'sqlite_%' "
                    f"AND name != '{MIGRATIONS_TABLE}'").fetchone():
                raise self._err("not a resumewds journal (a SQLite database with other "
                                "tables); refusing to add tables to it")
            if marker and meta_get(conn, "run_id") is None:
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
            self.schema_version = apply_migrations(db)
            with db.atomic():
                for key, value in (("run_id", uuid.uuid4().hex), ("rank", str(self.rank)),
                                   ("created", str(time.time()))):
                    db.execute("INSERT OR IGNORE INTO _meta (key, value) VALUES (?, ?)", [key, value])
            self.run_id = meta_get(conn, "run_id")
            row = conn.execute("SELECT max(step) FROM commits").fetchone()
            self._max_step = row[0]
            self._check_last_commit(conn)
            self._catch_up_consumption(conn)
            newest = conn.execute("SELECT step, ts FROM commits ORDER BY step DESC LIMIT 1").fetchone()
        except sqlite3.Error as exc:
            raise self._err("cannot open journal", exc) from exc
        try:  # what every write checks the path against (see _check_file)
            st = os.stat(self.path)
        except OSError as exc:
            raise self._err("cannot stat the journal file it just opened", exc) from exc
        self._file_id = (st.st_dev, st.st_ino)
        # only now that the journal holds the run id durably (see LockFile.write_marker)
        lock.write_marker(self.run_id, self.rank, None if newest is None else (int(newest[0]), float(newest[1])))

    def _check_last_commit(self, conn: sqlite3.Connection) -> None:
        """Refuse a journal that lost the newest commit its lock file records."""
        info = read_lock_info(lock_path(self.path))
        if info.get("run_id") != self.run_id:
            return  # no marker, or another run's: nothing recorded about this journal
        recorded = parse_commit_record(info.get("last_commit"))
        if recorded is None:
            return
        step, ts = recorded
        row = conn.execute("SELECT ts FROM commits WHERE step = ?", (step,)).fetchone()
        if row is not None and float(row[0]) == ts:
            return
        # a newer transaction (a commit that rewound the run, killed before
        # it was recorded) also holds everything the record promises
        if conn.execute("SELECT 1 FROM commits WHERE ts > ? LIMIT 1", (ts,)).fetchone():
            return
        raise lost_commits_error(self.path, recorded, self._max_step)

    def _db(self) -> sqlite_utils.Database:
        import sqlite_utils  # lazy: ~60 ms of import, paid only by a loader that opens a journal
        return sqlite_utils.Database(self.conn, execute_plugins=False)

    @property
    def conn(self) -> sqlite3.Connection:
        if self._conn is None:
            raise JournalError(f"{self.path}: journal is closed")
        return self._conn

    def _writable(self, what: str = "write") -> sqlite3.Connection:
        if self.readonly:
            raise JournalError(f"{self.path}: journal was opened read-only")
        conn = self.conn
        self._check_file(what)
        return conn

    def _check_file(self, what: str) -> None:
        """Refuse to write once the path no longer names the file this writer
        opened (SQLite would keep writing to the unlinked file, lost to any
        rerun), or its lock file was deleted."""
        if self._file_id is None:
            return
        try:
            st = os.stat(self.path)
            same = (st.st_dev, st.st_ino) == self._file_id
        except OSError:  # gone, or its directory is (ENOENT, ENOTDIR)
            same = False
        lock_gone = self._lock is not None and self._lock.unlinked()
        if same and not lock_gone:
            return
        newest = "it held no commit" if self._max_step is None else f"its newest commit is step {self._max_step}"
        if not same:
            raise JournalError(
                f"{self.path}: the journal file was deleted or replaced while this run was writing it (its "
                f"directory removed, or the file moved or overwritten): {newest}, and the path no longer "
                f"names the file that holds it. Refusing the {what}: it would go into a file nobody can open "
                f"again, and a crash or a rerun would start again from the beginning without a word. Stop "
                f"the run; restore the journal (with its -wal and lock file) from a copy to resume, or "
                f"resume from your checkpoint's loader state_dict() with a new journal path")
        resume = "from the beginning" if self._max_step is None else f"after step {self._max_step}"
        raise JournalError(
            f"{self.path}: its lock file {lock_path(self.path)} was deleted while this run was writing the "
            f"journal: another run could now open the journal at the same time, and a deleted journal would "
            f"no longer be noticed. Refusing the {what}. Stop the run and rerun it: it resumes {resume} "
            f"and makes the lock file again")

    def close(self) -> None:
        """Bring consumption up to date, close the database, release the lock (idempotent)."""
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
        if self._copy_dir is not None:
            shutil.rmtree(self._copy_dir, ignore_errors=True)
            self._copy_dir = None
        if self._lock is not None:
            self._lock.release()
            self._lock = None

    def __enter__(self) -> Journal:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def __reduce__(self) -> Any:
        raise TypeError("a Journal belongs to the main process and cannot be pickled; "
                        "workers send events with their batches instead")

    def __repr__(self) -> str:
        mode = "ro" if self.readonly else "rw"
        return f"<Journal {self.path!r} rank={self.rank} {mode}>"

    def _transaction(self, body: Callable[[sqlite3.Connection], Any]) -> Any:
        with self._mutex:
            return self._transaction_locked(body)

    def _transaction_locked(self, body: Callable[[sqlite3.Connection], Any], what: str = "write",
                            undo: Optional[Callable[[], None]] = None) -> Any:
        conn = self._writable(what)
        try:
            conn.execute("BEGIN")
            try:
                result = body(conn)
                conn.execute("COMMIT")
            except BaseException:
                if conn.in_transaction:
                    conn.execute("ROLLBACK")
                if undo is not None:
                    undo()
                raise
        except sqlite3.Error as exc:
            raise self._err(f"{what} failed", exc) from exc
        return result

    def config(self) -> Dict[str, Any]:
        """The stored run configuration (empty before ``check_config``)."""
        return {r["key"]: json.loads(r["value"])
                for r in self.conn.execute("SELECT key, value FROM config ORDER BY key")}

    def check_config(self, config: Dict[str, Any], *,
                     compatible_keys: Sequence[str] = ("batch_size", "world_size",
                                                       "num_workers", "rank")) -> List[str]:
        """Store the run configuration, or check a resume against it key by key
        (values compared as JSON; a key on one side only differs).

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
        new = {str(k): redact_text(dumps(v)) for k, v in config.items()}

        def body(conn: sqlite3.Connection) -> List[str]:
            old = {r[0]: r[1] for r in conn.execute("SELECT key, value FROM config")}
            now = time.time()
            if not old:
                conn.executemany("INSERT INTO config (key, value, updated) VALUES (?, ?, ?)",
                                 [(k, v, now) for k, v in sorted(new.items())])
                return []
            differ = sorted(k for k in set(old) | set(new) if old.get(k, "null") != new.get(k, "null"))
            bad = [k for k in differ if k not in compatible_keys]
            if bad:
                diffs = {k: (loads(old.get(k)), loads(new.get(k))) for k in bad}
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
                conn.execute(_SQL_EVENT, (now, EventKind.CONFIG_CHANGE.value, None, dumps(
                    {"key": k, "old": loads(old.get(k)), "new": loads(new.get(k))})))
            return differ

        return self._transaction(body)

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
            url = ev.get("url")
            rows.append((float(ev.get("ts") or now), str(kind), redact_url(url) if url else url,
                         redact_text(dumps(detail)) if detail else None))
        if rows:
            self._transaction(lambda conn: conn.executemany(_SQL_EVENT, rows))

    def update_shards(self, updates: List[Dict[str, Any]]) -> None:
        """Apply shard updates in one transaction.

        Each update is ``{"url": ..., <column>: value, "+<counter>": n}``
        (``SHARD_COLUMNS``; a ``+`` increments a counter; ``ts`` sets
        ``updated``).  An unknown url is inserted as ``pending`` first; a
        state change outside ``TRANSITIONS`` also records ``invalid_transition``.

        Raises:
            ValueError: unknown column or state, or no url.
        """
        prepared = []
        for upd in updates:
            url = upd.get("url")
            if not url:
                raise ValueError(f"shard update without a url: {upd!r}")
            url = redact_url(url)
            sets: List[str] = []
            args: List[Any] = []
            for key, value in upd.items():
                if key in ("url", "ts"):
                    continue
                if key.startswith("+"):
                    col = key[1:]
                    if col not in COUNTER_COLUMNS:
                        raise ValueError(f"{key!r}: only {COUNTER_COLUMNS} can be incremented")
                    sets.append(f"{col} = coalesce({col}, 0) + ?")
                    args.append(int(value))
                elif key in SHARD_COLUMNS:
                    if key == "state" and value not in SHARD_STATES:
                        raise ValueError(f"{url}: unknown shard state {value!r}; "
                                         f"states are {SHARD_STATES}")
                    sets.append(f"{key} = ?")
                    args.append(redact_text(value) if key == "last_error" else value)
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
                                              dumps({"from": old, "to": state})))
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
        row = self.conn.execute("SELECT * FROM shards WHERE url = ?", (redact_url(url),)).fetchone()
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
            r["detail"] = loads(r["detail"])
        return rows[::-1]

    def consumption(self, epoch: Optional[int] = None) -> List[Dict[str, Any]]:
        """Consumption rows (this rank), optionally of one epoch, up to date with
        the latest commit (the table plus the deltas not folded in yet)."""
        with self._mutex:
            conn = self.conn
            if epoch is None:
                cur = conn.execute("SELECT * FROM consumption ORDER BY epoch, url")
            else:
                cur = conn.execute("SELECT * FROM consumption WHERE epoch = ? ORDER BY url", (epoch,))
            rows = {(r["url"], r["epoch"]): dict(r) for r in cur}
            if self.schema_version < 2:
                return list(rows.values())
            for _, url, ep, delta, total in unfolded_deltas(conn):
                if epoch is not None and ep != epoch:
                    continue
                r = rows.setdefault((url, ep), {"url": url, "epoch": ep, "samples": 0, "total": total,
                                                "complete": 0, "updated": None})
                r["samples"] += delta
                if total is not None:
                    r["total"] = total
                r["complete"] = int(r["total"] is not None and r["samples"] >= r["total"])
            return sorted(rows.values(), key=lambda r: (r["epoch"], r["url"]))

    def commit(self, step: int, *, epoch: int, position: int,
               consumed: Optional[Dict[Tuple[str, int], Tuple[int, Optional[int]]]] = None,
               world_size: Optional[int] = None, batch_size: Optional[int] = None,
               samples_total: Optional[int] = None, stats: Optional[Dict[str, Any]] = None,
               materialize: bool = False, place: Optional[Dict[str, Any]] = None) -> None:
        """Record that ``step`` was reached, in one transaction.

        Args:
            step: the training step whose batches have all been handed out.
            epoch, position: the global position after this step (samples of
                ``epoch`` delivered over all ranks).
            consumed: ``{(url, epoch): (delta_samples, total_samples_in_shard)}``
                added to this rank's consumption rows.
            samples_total: cumulative samples delivered by this rank.
            stats: optional JSON-able snapshot (``loader.stats()``).
            place: where the loader stands beyond ``(epoch, position)`` (JSON-able).
            materialize: also bring the ``consumption`` table up to date now.

        A step at or below the newest committed one (a resume from an earlier
        step) replaces the commits from that step on, with a ``rewind`` event.
        Consumption counts are deliveries, so replayed samples count again.

        Raises:
            JournalError: the write failed (disk full, I/O error...).
        """
        ts = time.time()
        step = int(step)
        deltas = None
        if consumed:  # recorded under the URLs as they may be printed (resumewds.redact)
            red: Dict[Tuple[str, int], Tuple[int, Optional[int]]] = {}
            for (u, e), (d, t) in consumed.items():
                red[(redact_url(u), e)] = (red.get((redact_url(u), e), (0, None))[0] + d, t)
            consumed = red
            deltas = json.dumps([[u, e, d, t] for (u, e), (d, t) in consumed.items()], separators=(",", ":"))
        row = (step, int(epoch), int(position), self.rank,
               self.world_size if world_size is None else int(world_size),
               batch_size, ts, samples_total, None if stats is None else redact_text(dumps(stats)), deltas,
               None if place is None else json.dumps(place, separators=(",", ":")))

        def body(conn: sqlite3.Connection) -> None:
            if max_step is not None and step <= max_step:
                self._rewind(conn, step, max_step, ts)
            conn.execute(_SQL_COMMIT_INSERT, row)
            for key, (delta, total) in (consumed or {}).items():
                self._pending[key] = (self._pending.get(key, (0, None))[0] + delta, total)
            self._since += 1
            if self._since >= CONSUMPTION_EVERY or materialize:
                self._materialize(conn, step, ts)

        with self._mutex:
            max_step = self._max_step
            # a failed commit's pending deltas are rebuilt from the commit rows on the next open
            self._transaction_locked(body, f"commit of step {step}", undo=self._pending.clear)
            self._max_step = step
            if self._lock is not None:
                self._lock.record_commit(step, ts)  # checked on the next open (journal.lock)

    def _materialize(self, conn: sqlite3.Connection, step: int, ts: float) -> None:
        """Fold the pending deltas into ``consumption`` (caller's transaction)."""
        for (url, ep), (delta, total) in self._pending.items():
            conn.execute(_SQL_CONSUME, (url, ep, delta, total, int(total is not None and delta >= total), ts))
        conn.execute(_SQL_THROUGH, (str(step),))
        self._pending.clear()
        self._since = 0

    def _catch_up_consumption(self, conn: sqlite3.Connection) -> None:
        """On open: fold in the deltas of commits after ``consumption_through``."""
        if self.schema_version < 2:
            return
        last = None
        for step, url, ep, delta, total in unfolded_deltas(conn):
            self._pending[(url, ep)] = (self._pending.get((url, ep), (0, None))[0] + delta, total)
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
        conn.execute(_SQL_EVENT, (ts, EventKind.REWIND.value, None, dumps({
            "step": step, "dropped": n, "dropped_upto": max_step,
            "replaced": None if prev is None else {"epoch": prev[0], "position": prev[1]}})))

    def latest_commit(self) -> Optional[Dict[str, Any]]:
        """The newest commit of this rank as a dict (``stats`` parsed), or None."""
        with self._mutex:
            return commit_row(self.conn.execute("SELECT * FROM commits ORDER BY step DESC LIMIT 1").fetchone())

    def commit_at(self, step: int) -> Optional[Dict[str, Any]]:
        """This rank's commit of ``step``, or None."""
        with self._mutex:
            return commit_row(self.conn.execute("SELECT * FROM commits WHERE step = ?", (step,)).fetchone())


def unfolded_deltas(conn: sqlite3.Connection) -> Iterator[Tuple[int, str, int, int, Optional[int]]]:
    """``(step, url, epoch, delta, total)`` of commits not yet folded into the
    consumption table (after ``_meta.consumption_through``), in step order."""
    through = meta_get(conn, "consumption_through")
    lo = int(through) if through is not None and through.lstrip("-").isdigit() else -(1 << 62)
    for step, text in conn.execute("SELECT step, consumed FROM commits WHERE step > ? "
                                   "AND consumed IS NOT NULL ORDER BY step", (lo,)).fetchall():
        for url, ep, delta, total in json.loads(text):
            yield int(step), url, int(ep), int(delta), total


