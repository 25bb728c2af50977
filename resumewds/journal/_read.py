"""The public read API: what ``resumewds status``, ``report`` and tools read.

:class:`RunReader` opens every rank file of a run read-only once and answers
questions about the whole run as plain, JSON-able data; each ``read_*``
function opens a reader for one question.  Callers outside the journal read
through here.  A run with no files at all reads as empty.

Example:
    >>> with Journal("run.db") as j:
    ...     j.commit(1, epoch=0, position=8, samples_total=8, consumed={("a.tar", 0): (8, 10)})
    >>> with RunReader("run.db") as run:
    ...     run.ranks(), run.consumption()
    ([0], {0: {'a.tar': {'samples': 8, 'total': 10}}})
    >>> read_commits("run.db")[0][-1]["position"]
    8
"""

from __future__ import annotations

import json
from typing import Any, Dict, List, Optional, Sequence, Tuple

from ..events import EventKind
from ._core import Journal
from ._run import close_all, open_run, resolve_in
from ._states import ERROR_EVENT_KINDS


class RunReader:
    """Every rank file of the run at ``path`` (rank 0's file), open read-only.

    Raises:
        JournalError: a file is unreadable, or rank 0's journal is missing
            while its lock file or other rank files remain.

    Example:
        >>> with Journal("run.db", rank=0, world_size=2) as j:
        ...     j.commit(3, epoch=0, position=8)
        >>> with Journal("run.db", rank=1, world_size=2) as j:
        ...     j.commit(3, epoch=0, position=8)
        >>> with RunReader("run.db") as run:
        ...     run.ranks(), run.resume_point()["step"], run.commit_count(1)
        ([0, 1], 3, 1)
    """

    def __init__(self, path: str):
        self.path = path
        self.journals: Dict[int, Journal] = open_run(path)

    def __enter__(self) -> RunReader:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def close(self) -> None:
        close_all(self.journals)

    def __bool__(self) -> bool:
        """False when the run has no journal file yet."""
        return bool(self.journals)

    def ranks(self) -> List[int]:
        """The ranks that have a journal file, in order."""
        return sorted(self.journals)

    def _by_rank(self) -> List[Tuple[int, Journal]]:
        return sorted(self.journals.items())

    def journal(self, rank: int = 0) -> Journal:
        """Rank ``rank``'s read-only :class:`Journal`."""
        return self.journals[rank]

    def commit_count(self, rank: int) -> int:
        """The number of commit rows of ``rank``."""
        return int(self.journals[rank].conn.execute("SELECT count(*) FROM commits").fetchone()[0])

    def rate(self, rank: int, window: int) -> Tuple[Optional[float], Optional[float], Optional[float]]:
        """``(samples/s, steps/s, seconds spanned)`` over ``rank``'s last ``window`` commits
        (Nones when fewer than two, or no time passed)."""
        rows = list(self.journals[rank].conn.execute(
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

    def resume_point(self, step: Optional[int] = None) -> Optional[Dict[str, Any]]:
        """:func:`resumewds.journal.resolve_resume` of this run."""
        return resolve_in(self.journals, self.path, step)

    def commits(self) -> Dict[int, List[Dict[str, Any]]]:
        """Every rank's commits, oldest first: ``{rank: [{step, epoch,
        position, ts, samples_total, stats}]}`` (``stats`` parsed, or None)."""
        out: Dict[int, List[Dict[str, Any]]] = {}
        for r, j in self._by_rank():
            rows = [dict(x) for x in j.conn.execute(
                "SELECT step, epoch, position, ts, samples_total, stats FROM commits ORDER BY ts, step")]
            for x in rows:
                x["stats"] = json.loads(x["stats"]) if x["stats"] else None
            out[r] = rows
        return out

    def shards(self) -> Dict[str, Dict[str, Any]]:
        """One row per shard url over all ranks: the most recently updated
        row's state and fields, with ``attempts``, ``retries``, ``repairs``
        summed over ranks and the earliest ``first_seen``."""
        shards: Dict[str, Dict[str, Any]] = {}
        for _, j in self._by_rank():
            for row in j.conn.execute("SELECT * FROM shards"):
                row = dict(row)
                prev = shards.get(row["url"])
                if prev is None:
                    shards[row["url"]] = row
                    continue
                summed: Dict[str, Any] = {k: (prev.get(k) or 0) + (row.get(k) or 0)
                                          for k in ("attempts", "retries", "repairs")}
                seen = [x for x in (prev.get("first_seen"), row.get("first_seen")) if x is not None]
                summed["first_seen"] = min(seen) if seen else None
                if (row.get("updated") or 0) > (prev.get("updated") or 0):
                    prev.update(row)
                prev.update(summed)
        return shards

    def event_counts(self) -> Dict[str, int]:
        """``{kind: n}`` over every rank."""
        by_kind: Dict[str, int] = {}
        for _, j in self._by_rank():
            for kind, n in j.conn.execute("SELECT kind, count(*) AS n FROM events GROUP BY kind"):
                by_kind[kind] = by_kind.get(kind, 0) + n
        return by_kind

    def error_events(self, limit: int) -> List[Dict[str, Any]]:
        """The newest ``limit`` events of kinds ``ERROR_EVENT_KINDS`` over
        every rank, newest first: ``[{ts, rank, kind, url, detail}]``."""
        errors: List[Dict[str, Any]] = []
        marks = ",".join("?" * len(ERROR_EVENT_KINDS))
        for r, j in self._by_rank():
            for row in j.conn.execute(f"SELECT * FROM events WHERE kind IN ({marks}) "
                                      f"ORDER BY id DESC LIMIT ?", [*ERROR_EVENT_KINDS, limit]):
                errors.append({"ts": row["ts"], "rank": r, "kind": row["kind"], "url": row["url"],
                               "detail": None if row["detail"] is None else json.loads(row["detail"])})
        errors.sort(key=lambda e: e["ts"] or 0, reverse=True)
        return errors[:limit]

    def events(self, kinds: Sequence[str], limit_per_kind: int = 5000) -> List[Dict[str, Any]]:
        """The newest ``limit_per_kind`` events of each kind, every rank, oldest
        first: ``[{ts, rank, kind, url, detail}]`` (``detail`` parsed, {} when empty)."""
        out: List[Dict[str, Any]] = []
        for r, j in self._by_rank():
            for kind in kinds:
                for x in j.conn.execute("SELECT ts, kind, url, detail FROM events WHERE kind = ? "
                                        "ORDER BY id DESC LIMIT ?", (kind, int(limit_per_kind))):
                    e = dict(x)
                    e["rank"] = r
                    e["detail"] = json.loads(e["detail"]) if e["detail"] else {}
                    out.append(e)
        out.sort(key=lambda e: e["ts"] or 0)
        return out

    def event_totals(self) -> Dict[str, Any]:
        """Totals over every rank and loader of the run: ``{"downloads":
        {count, bytes, seconds}, "evicted": {url: n}, "last_evict": {url: ts},
        "last_fetch": {url: ts}}``."""
        downloads = {"count": 0, "bytes": 0, "seconds": 0.0}
        evicted: Dict[str, int] = {}
        last_evict: Dict[str, float] = {}
        last_fetch: Dict[str, float] = {}
        done, evict = EventKind.FETCH_DONE.value, EventKind.EVICT.value
        seen = (done, EventKind.CACHE_HIT.value, EventKind.VERIFY_OK.value)
        for _, j in self._by_rank():
            row = j.conn.execute(
                "SELECT count(*), sum(json_extract(detail, '$.bytes')), "
                "sum(json_extract(detail, '$.seconds')) FROM events WHERE kind = ?", (done,)).fetchone()
            downloads["count"] += row[0] or 0
            downloads["bytes"] += row[1] or 0
            downloads["seconds"] += row[2] or 0.0
            for url, n, ts in j.conn.execute("SELECT url, count(*), max(ts) FROM events WHERE kind = ? "
                                             "GROUP BY url", (evict,)):
                evicted[url] = evicted.get(url, 0) + n
                last_evict[url] = max(ts or 0, last_evict.get(url, 0))
            for url, ts in j.conn.execute("SELECT url, max(ts) FROM events WHERE kind IN (?, ?, ?) "
                                          "GROUP BY url", seen):
                last_fetch[url] = max(ts or 0, last_fetch.get(url, 0))
        return {"downloads": downloads, "evicted": evicted, "last_evict": last_evict, "last_fetch": last_fetch}

    def consumption(self, epoch: Optional[int] = None) -> Dict[int, Dict[str, Dict[str, Any]]]:
        """Samples consumed per epoch (optionally one) and shard, summed over ranks, up
        to the latest commit: ``{epoch: {url: {"samples": n, "total": t}}}``."""
        out: Dict[int, Dict[str, Dict[str, Any]]] = {}
        for j in self.journals.values():
            for row in j.consumption(epoch):
                c = out.setdefault(int(row["epoch"]), {}).setdefault(
                    row["url"], {"samples": 0, "total": row["total"]})
                c["samples"] += row["samples"] or 0
                if row["total"] is not None:
                    c["total"] = row["total"]
        return out

    def epoch_consumption(self, epoch: int) -> Dict[str, Any]:
        """One epoch summed over ranks: ``{"epoch", "shards_started",
        "shards_complete" (samples reached the shard total), "samples"}``."""
        shards = self.consumption(epoch).get(epoch, {}).values()
        return {"epoch": epoch, "shards_started": len(shards),
                "shards_complete": sum(1 for c in shards if c["total"] is not None and c["samples"] >= c["total"]),
                "samples": sum(c["samples"] for c in shards)}


def read_commits(path: str) -> Dict[int, List[Dict[str, Any]]]:
    """:meth:`RunReader.commits` of the run at ``path``.

    Example:
        >>> read_commits("run.db")      # no journal: nothing to read
        {}
    """
    with RunReader(path) as run:
        return run.commits()


def read_events(path: str, kinds: Sequence[str], limit_per_kind: int = 5000) -> List[Dict[str, Any]]:
    """:meth:`RunReader.events` of the run at ``path``."""
    with RunReader(path) as run:
        return run.events(kinds, limit_per_kind)


def read_event_totals(path: str) -> Dict[str, Any]:
    """:meth:`RunReader.event_totals` of the run at ``path``."""
    with RunReader(path) as run:
        return run.event_totals()


def read_consumption(path: str) -> Dict[int, Dict[str, Dict[str, Any]]]:
    """:meth:`RunReader.consumption` of the run at ``path``."""
    with RunReader(path) as run:
        return run.consumption()
