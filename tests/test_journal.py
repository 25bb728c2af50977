"""Tests for resumewds.journal: real SQLite files in tmp_path, real processes
for locking and kill -9."""

from __future__ import annotations

import json
import os
import pickle
import random
import signal
import sqlite3
import subprocess
import sys
import textwrap
import time

import pytest
import sqlite_utils

from resumewds import journal as jmod
from resumewds.errors import JournalConfigMismatch, JournalError, JournalIncompleteCommit
from resumewds.journal import Journal, format_status, resolve_resume, run_journal_paths, shard_updates_from_events
from resumewds.journal import _schema as jschema  # the migrations live here
from resumewds.journal._paths import rank_journal_path
from resumewds.journal._schema import JOURNAL_SCHEMA_VERSION
from resumewds.journal._states import SHARD_STATES
from resumewds.journal._status import status

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    return env


@pytest.fixture
def path(tmp_path):
    return str(tmp_path / "run.db")


def _fill(path, rank=0, world_size=1, steps=range(1, 6), batch=4, position=None):
    with Journal(path, rank=rank, world_size=world_size) as j:
        for s in steps:
            pos = s * batch * world_size if position is None else position(s)
            j.commit(s, epoch=0, position=pos, batch_size=batch, samples_total=s * batch)


# ---- paths ---------------------------------------------------------------

def test_rank_journal_path():
    assert rank_journal_path("/x/run.db", 0) == "/x/run.db"
    assert rank_journal_path("/x/run.db", 1) == "/x/run.rank1.db"
    assert rank_journal_path("/x/run", 3) == "/x/run.rank3"
    assert rank_journal_path("/x/a.b.db", 2) == "/x/a.b.rank2.db"
    with pytest.raises(ValueError):
        rank_journal_path("/x/run.db", -1)


def test_run_journal_paths(tmp_path, path):
    assert run_journal_paths(path) == [path]
    for r in (10, 2, 1):
        open(rank_journal_path(path, r), "w").close()
    # look-alikes that are not rank files of this run
    for name in ("run.rank1.db-wal", "run.rank1.db.lock", "other.rank1.db", "run.rankx.db"):
        open(tmp_path / name, "w").close()
    assert run_journal_paths(path) == [path] + [rank_journal_path(path, r) for r in (1, 2, 10)]


# ---- round trips ----------------------------------------------------------

def test_commit_round_trip_and_reopen(path):
    with Journal(path, world_size=2) as j:
        assert j.latest_commit() is None
        j.commit(1, epoch=0, position=8, batch_size=4, samples_total=4,
                 consumed={("a.tar", 0): (3, 5), ("b.tar", 0): (1, 2)})
        j.commit(2, epoch=0, position=16, batch_size=4, samples_total=8,
                 consumed={("a.tar", 0): (2, 5), ("b.tar", 0): (0, 2)}, stats={"rate": 1.5})
        c = j.latest_commit()
        assert c["step"] == 2 and c["position"] == 16 and c["world_size"] == 2
        assert c["rank"] == 0 and c["batch_size"] == 4 and c["samples_total"] == 8
        assert c["stats"] == {"rate": 1.5}
        assert j.commit_at(1)["stats"] is None
        assert j.commit_at(7) is None
        run_id = j.run_id
    with Journal(path) as j:
        assert j.run_id == run_id
        assert j.latest_commit()["step"] == 2
        rows = {r["url"]: r for r in j.consumption(0)}
        assert rows["a.tar"]["samples"] == 5 and rows["a.tar"]["complete"] == 1
        assert rows["b.tar"]["samples"] == 1 and rows["b.tar"]["complete"] == 0
        j.commit(3, epoch=1, position=8, consumed={("b.tar", 0): (1, 2)})
        assert {r["url"]: r["complete"] for r in j.consumption(0)}["b.tar"] == 1
        assert j.consumption(1) == []


def test_recommit_after_resume_rewinds(path):
    _fill(path, steps=range(1, 11))
    with Journal(path) as j:
        j.commit(5, epoch=0, position=20, batch_size=4, samples_total=20)
        assert j.latest_commit()["step"] == 5
        assert j.commit_at(6) is None
        (ev,) = j.events("rewind")
        assert ev["detail"]["step"] == 5 and ev["detail"]["dropped"] == 6
        assert ev["detail"]["dropped_upto"] == 10
        j.commit(6, epoch=0, position=24)
        assert j.latest_commit()["step"] == 6
        assert len(j.events("rewind")) == 1


def test_events_round_trip(path):
    with Journal(path) as j:
        j.record_events([
            {"kind": "retry", "url": "u1", "attempt": 2, "error": "reset", "ts": 100.0},
            {"kind": "resume", "detail": {"step": 3}},
            {"kind": "fetch_done", "url": "u1", "bytes": 10, "seconds": 0.5},
        ])
        evs = j.events()
        assert [e["kind"] for e in evs] == ["retry", "resume", "fetch_done"]
        assert evs[0]["ts"] == 100.0 and evs[0]["detail"] == {"attempt": 2, "error": "reset"}
        assert evs[1]["url"] is None and evs[1]["detail"] == {"step": 3}
        assert j.events("fetch_done", limit=1)[0]["detail"]["bytes"] == 10
        with pytest.raises(ValueError):
            j.record_events([{"url": "u"}])
        assert len(j.events()) == 3  # nothing of the failed batch was written


def test_shard_states_and_counters(path):
    with Journal(path) as j:
        j.update_shards([{"url": "http://h/d/s-0.tar?x=1", "state": "downloading", "+attempts": 1}])
        s = j.shard("http://h/d/s-0.tar?x=1")
        assert s["name"] == "s-0.tar" and s["state"] == "downloading" and s["attempts"] == 1
        assert s["first_seen"] is not None and s["retries"] == 0
        j.update_shards([
            {"url": "http://h/d/s-0.tar?x=1", "+retries": 2, "last_error": "timeout"},
            {"url": "http://h/d/s-0.tar?x=1", "state": "downloaded", "bytes": 1234},
            {"url": "http://h/d/s-0.tar?x=1", "state": "verified", "xxh3_64": "ab",
             "cache_path": "/c/s-0.tar"},
        ])
        s = j.shard("http://h/d/s-0.tar?x=1")
        assert (s["state"], s["retries"], s["bytes"], s["xxh3_64"], s["last_error"]) == \
               ("verified", 2, 1234, "ab", "timeout")
        assert j.events("invalid_transition") == []
        # corrupt -> repair -> verified is a legal path
        j.update_shards([{"url": "b", "state": "downloading"}, {"url": "b", "state": "downloaded"},
                         {"url": "b", "state": "corrupt"},
                         {"url": "b", "state": "downloading", "+repairs": 1},
                         {"url": "b", "state": "downloaded"}, {"url": "b", "state": "verified"}])
        assert j.shard("b")["repairs"] == 1 and j.events("invalid_transition") == []
        # an impossible move is applied anyway and leaves a trace
        j.update_shards([{"url": "c", "state": "failed"}, {"url": "c", "state": "downloaded"}])
        assert j.shard("c")["state"] == "downloaded"
        (ev,) = j.events("invalid_transition")
        assert ev["url"] == "c" and ev["detail"] == {"from": "failed", "to": "downloaded"}
        for bad in ({"url": "d", "colour": 1}, {"url": "d", "state": "lost"},
                    {"url": "d", "+last_error": 1}, {"state": "pending"}):
            with pytest.raises(ValueError):
                j.update_shards([bad])
        assert j.shard("d") is None


def test_shard_updates_from_events(path):
    evs = [{"kind": "fetch_start", "url": "a"}, {"kind": "retry", "url": "a", "error": "503"},
           {"kind": "fetch_done", "url": "a", "bytes": 99, "path": "/c/a"},
           {"kind": "verify_fail", "url": "a", "expected": "1", "actual": "2"},
           {"kind": "repair", "url": "a"}, {"kind": "fetch_done", "url": "a", "bytes": 99},
           {"kind": "verify_ok", "url": "a"}, {"kind": "cache_miss", "url": "a"},
           {"kind": "evict", "url": "a", "bytes": 99}, {"kind": "fail", "url": "z", "error": "404"}]
    ups = shard_updates_from_events(evs)
    assert ups[0] == {"url": "a", "state": "downloading", "+attempts": 1}
    assert ups[2] == {"url": "a", "state": "downloaded", "bytes": 99, "cache_path": "/c/a"}
    with Journal(path) as j:
        j.update_shards(ups)
        a, z = j.shard("a"), j.shard("z")
        assert (a["state"], a["attempts"], a["retries"], a["repairs"]) == ("pending", 1, 1, 1)
        assert "expected 1, got 2" in a["last_error"]
        assert (z["state"], z["last_error"]) == ("failed", "404")
        assert j.events("invalid_transition") == []


# ---- config ---------------------------------------------------------------

CONF = {"manifest": "abc", "seed": 7, "shuffle": {"algo": "block", "buffer": 64},
        "batch_size": 8, "world_size": 2, "num_workers": 4, "version": "0.1.0"}


def test_config_first_call_stores_and_same_config_passes(path):
    with Journal(path) as j:
        assert j.check_config(CONF) == []
        assert j.check_config(dict(CONF, shuffle={"buffer": 64, "algo": "block"})) == []
        assert j.config() == CONF
    with Journal(path) as j:
        assert j.check_config(CONF) == []


def test_config_mismatch_names_keys(path):
    with Journal(path) as j:
        j.check_config(CONF)
    with Journal(path) as j:
        bad = dict(CONF, seed=8, manifest="zzz", batch_size=16)
        bad.pop("version")
        with pytest.raises(JournalConfigMismatch) as ei:
            j.check_config(bad)
        msg = str(ei.value)
        assert path in msg
        for piece in ("seed: journal has 7, now 8", "manifest: journal has 'abc', now 'zzz'",
                      "version: journal has '0.1.0', now None"):
            assert piece in msg
        assert "batch_size" not in msg  # compatible, but nothing is applied on mismatch
        assert set(ei.value.differences) == {"seed", "manifest", "version"}
        assert j.config() == CONF and j.events("config_change") == []


def test_config_compatible_changes_recorded(path):
    with Journal(path) as j:
        j.check_config(CONF)
        changed = j.check_config(dict(CONF, batch_size=16, num_workers=2))
        assert changed == ["batch_size", "num_workers"]
        assert j.config()["batch_size"] == 16
        evs = {e["detail"]["key"]: e["detail"] for e in j.events("config_change")}
        assert evs["batch_size"] == {"key": "batch_size", "old": 8, "new": 16}
        assert evs["num_workers"] == {"key": "num_workers", "old": 4, "new": 2}
        assert j.check_config(dict(CONF, seed=1, num_workers=9, batch_size=16),
                              compatible_keys=("seed", "num_workers")) == ["num_workers", "seed"]


# ---- migrations and schema versions ---------------------------------------

def _v2(db):
    db["commits"].add_column("note", str)
    db["events"].create_index(["url"])


NEXT = JOURNAL_SCHEMA_VERSION + 1  # a future schema version, simulated by a test migration


def _patch_v2(monkeypatch):
    monkeypatch.setattr(jschema, "_MIGRATIONS", jschema._MIGRATIONS + [(NEXT, "m999_test_note", _v2)])
    monkeypatch.setattr(jschema, "JOURNAL_SCHEMA_VERSION", NEXT)


def _schema_version(path):
    conn = sqlite3.connect(path)
    try:
        return int(conn.execute("SELECT value FROM _meta WHERE key='schema_version'").fetchone()[0])
    finally:
        conn.close()


def test_migrates_older_schema(path, monkeypatch):
    _fill(path, steps=[1, 2])
    with Journal(path) as j:
        j.check_config(CONF)
        run_id = j.run_id
    assert _schema_version(path) == JOURNAL_SCHEMA_VERSION
    db = sqlite_utils.Database(path)
    applied = [r["name"] for r in db.query("SELECT name FROM _sqlite_migrations ORDER BY id")]
    db.close()
    _patch_v2(monkeypatch)
    with Journal(path) as j:
        assert j.schema_version == NEXT and j.run_id == run_id
        assert j.latest_commit()["step"] == 2 and j.config() == CONF
        assert "note" in j.latest_commit()
        j.commit(3, epoch=0, position=12)
    assert _schema_version(path) == NEXT
    db = sqlite_utils.Database(path)
    assert [r["name"] for r in db.query("SELECT name FROM _sqlite_migrations ORDER BY id")] == \
           applied + ["m999_test_note"]  # the new one applied once, after the others
    db.close()


def test_newer_schema_refused(path, monkeypatch):
    with monkeypatch.context() as m:
        _patch_v2(m)
        _fill(path, steps=[1])
    for ro in (False, True):
        with pytest.raises(JournalError, match="newer") as ei:
            Journal(path, readonly=ro)
        assert path in str(ei.value) and "m999_test_note" in str(ei.value)
    # the lock was released on failure: a newer build can still open it
    with monkeypatch.context() as m:
        _patch_v2(m)
        Journal(path).close()


def test_newer_schema_version_in_meta_refused(path):
    _fill(path, steps=[1])
    conn = sqlite3.connect(path)
    with conn:
        conn.execute("UPDATE _meta SET value='99' WHERE key='schema_version'")
    conn.close()
    with pytest.raises(JournalError, match=r"schema version 99 is newer"):
        Journal(path)
    with pytest.raises(JournalError, match="newer"):
        resolve_resume(path)


# ---- damaged and missing files --------------------------------------------

def test_truncated_journal(path):
    _fill(path, steps=range(1, 3000))
    size = os.path.getsize(path)
    assert size > 16384
    with open(path, "r+b") as f:
        f.truncate(size // 2)
    for ro in (False, True):
        with pytest.raises(JournalError) as ei:
            Journal(path, readonly=ro)
        assert path in str(ei.value) and "corrupt" in str(ei.value)


def test_garbage_file(path):
    with open(path, "wb") as f:
        f.write(random.Random(0).randbytes(8192))
    with pytest.raises(JournalError) as ei:
        Journal(path)
    assert path in str(ei.value) and "not a database" in str(ei.value)
    with pytest.raises(JournalError, match="not a database"):
        status(path)


def test_deleted_journal_with_leftover_lock(path):
    _fill(path, steps=[1, 2])
    os.remove(path)
    for call in (lambda: Journal(path), lambda: Journal(path, readonly=True),
                 lambda: resolve_resume(path), lambda: status(path)):
        with pytest.raises(JournalError, match="journal was deleted") as ei:
            call()
        assert path in str(ei.value)
    assert not os.path.exists(path)  # the refusal did not create a fresh file
    os.remove(path + ".lock")  # the documented way to start over
    with Journal(path) as j:
        assert j.latest_commit() is None


def test_emptied_journal_with_lock_refused(path):
    _fill(path, steps=[1])
    open(path, "wb").close()
    with pytest.raises(JournalError, match="truncated or replaced"):
        Journal(path)


def test_missing_rank0_with_rank_files(path):
    _fill(path, rank=1, world_size=2, steps=[1])
    with pytest.raises(JournalError, match="rank 0 journal is missing"):
        resolve_resume(path)


def test_status_without_journal(path):
    with pytest.raises(JournalError, match="no journal"):
        status(path)
    with pytest.raises(JournalError, match="no journal"):
        Journal(path, readonly=True)
    assert resolve_resume(path) is None


def test_readonly_cannot_write_and_needs_no_lock(path):
    with Journal(path) as w:
        w.commit(1, epoch=0, position=4)
        with Journal(path, readonly=True) as r:
            assert r.latest_commit()["step"] == 1
            with pytest.raises(JournalError, match="read-only"):
                r.commit(2, epoch=0, position=8)
        w.commit(2, epoch=0, position=8)
        assert status(path)["latest"]["step"] == 2


def test_pickle_refused(path):
    with Journal(path) as j:
        with pytest.raises(TypeError, match="main process"):
            pickle.dumps(j)


def test_bad_arguments(path):
    with pytest.raises(ValueError):
        Journal(path, synchronous="OFF")
    with pytest.raises(ValueError):
        Journal(path, world_size=0)
    with Journal(path, synchronous="full") as j:
        j.commit(1, epoch=0, position=1)
        assert j.conn.execute("PRAGMA synchronous").fetchone()[0] == 2  # FULL


# ---- locking ---------------------------------------------------------------

HOLDER = textwrap.dedent("""
    import sys
    from resumewds.journal import Journal
    j = Journal(sys.argv[1], rank=int(sys.argv[2]))
    print("ready", flush=True)
    sys.stdin.read()
    j.close()
""")


def test_second_writer_refused(path):
    p = subprocess.Popen([sys.executable, "-c", HOLDER, path, "0"], env=_env(),
                         stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "ready"
        with pytest.raises(JournalError) as ei:
            Journal(path)
        assert f"already in use by pid {p.pid}" in str(ei.value) and path in str(ei.value)
        Journal(path, rank=1).close()  # another rank's file is free
        with Journal(path, readonly=True) as r:  # readers are never blocked
            assert r.latest_commit() is None
    finally:
        p.stdin.close()
        p.wait(timeout=10)
    Journal(path).close()  # free again once the holder exits


def test_second_writer_in_same_process_refused(path):
    with Journal(path):
        with pytest.raises(JournalError, match=f"already in use by pid {os.getpid()}"):
            Journal(path)
    Journal(path).close()


# ---- resolve_resume -------------------------------------------------------

def test_resolve_resume_latest_complete(path):
    _fill(path, rank=0, world_size=2, steps=range(1, 6))
    _fill(path, rank=1, world_size=2, steps=range(1, 5))
    res = resolve_resume(path)
    assert (res["step"], res["epoch"], res["position"], res["world_size"]) == (4, 0, 32, 2)
    assert res["samples_total"] == 16 and res["samples_total_per_rank"] == [16, 16]
    assert res["skipped_incomplete"] == [{"step": 5, "missing_ranks": [1], "disagreeing_ranks": []}]
    assert resolve_resume(path, step=2)["position"] == 16
    with pytest.raises(JournalIncompleteCommit, match=r"step 5 .*missing on rank\(s\) 1"):
        resolve_resume(path, step=5)
    with pytest.raises(JournalIncompleteCommit, match="never committed"):
        resolve_resume(path, step=99)


def test_resolve_resume_disagreement(path):
    _fill(path, rank=0, world_size=2, steps=range(1, 4))
    _fill(path, rank=1, world_size=2, steps=range(1, 4),
          position=lambda s: 999 if s == 3 else s * 8)
    with pytest.raises(JournalIncompleteCommit, match=r"rank\(s\) 1 committed it with a different"):
        resolve_resume(path, step=3)
    res = resolve_resume(path)
    assert res["step"] == 2
    assert res["skipped_incomplete"] == [{"step": 3, "missing_ranks": [], "disagreeing_ranks": [1]}]


def test_resolve_resume_missing_rank_file_and_layout_change(path):
    _fill(path, rank=0, world_size=2, steps=[1, 2])
    with pytest.raises(JournalIncompleteCommit, match="no step is complete"):
        resolve_resume(path)
    with pytest.raises(JournalIncompleteCommit, match="no file"):
        resolve_resume(path, step=1)
    # the run continues on one rank: its commits need rank 0 only
    with Journal(path, world_size=1) as j:
        j.commit(3, epoch=0, position=20)
    assert resolve_resume(path)["step"] == 3


def test_resolve_resume_no_commits(path):
    Journal(path).close()
    assert resolve_resume(path) is None


# ---- kill -9 ----------------------------------------------------------------

COMMITTER = textwrap.dedent("""
    import sys
    from resumewds.journal import Journal
    j = Journal(sys.argv[1])
    last = j.latest_commit()
    step = 0 if last is None else last["step"]
    while True:
        step += 1
        j.commit(step, epoch=0, position=step * 4, consumed={("a.tar", 0): (4, None)},
                 samples_total=step * 4)
        print(step, flush=True)
""")


def test_kill9_keeps_every_returned_commit(path):
    rng = random.Random(1234)
    printed_all = set()
    for _ in range(5):
        p = subprocess.Popen([sys.executable, "-c", COMMITTER, path], env=_env(),
                             stdout=subprocess.PIPE, text=True)
        first = p.stdout.readline()
        assert first.strip().isdigit(), first
        time.sleep(rng.uniform(0.0, 0.25))
        os.kill(p.pid, signal.SIGKILL)
        rest, _ = p.communicate(timeout=10)
        assert p.returncode == -signal.SIGKILL
        printed = {int(x) for x in (first + rest).split()}
        printed_all |= printed
        with Journal(path, readonly=True) as r:
            steps = {row[0] for row in r.conn.execute("SELECT step FROM commits")}
        assert printed <= steps
        res = resolve_resume(path)
        assert res["step"] >= max(printed) and res["position"] == res["step"] * 4
    # each run continued where the last one stopped, without holes
    assert steps == set(range(1, max(steps) + 1)) and printed_all <= steps
    with Journal(path) as j:
        (row,) = j.consumption(0)
        assert row["samples"] == 4 * max(steps)


# ---- status -----------------------------------------------------------------

def test_status_fields(path):
    with Journal(path, world_size=2) as j:
        j.check_config(CONF)
        j.update_shards([{"url": "a", "state": "downloading", "+attempts": 1},
                         {"url": "a", "+retries": 1, "last_error": "reset"},
                         {"url": "b", "state": "failed", "last_error": "404"}])
        j.record_events([{"kind": "retry", "url": "a", "error": "reset", "ts": 10.0},
                         {"kind": "fail", "url": "b", "error": "404", "ts": 11.0},
                         {"kind": "evict", "url": "c", "bytes": 5}])
        for s in range(1, 4):
            j.commit(s, epoch=1, position=s * 8, batch_size=4, samples_total=s * 4,
                     consumed={("a", 1): (4, 8)}, stats={"cache_hits": s})
    with Journal(path, rank=1, world_size=2) as j:
        j.update_shards([{"url": "a", "state": "downloading", "+retries": 2},
                         {"url": "a", "state": "downloaded"}])
        j.record_events([{"kind": "retry", "url": "a", "error": "timeout", "ts": 12.0}])
        for s in range(1, 3):
            j.commit(s, epoch=1, position=s * 8, batch_size=4, samples_total=s * 4,
                     consumed={("a", 1): (4, 8)})
    st = status(path)
    assert json.loads(json.dumps(st)) == st
    assert st["path"] == path and st["schema_version"] == JOURNAL_SCHEMA_VERSION
    assert st["config"] == CONF and st["run_id"]
    assert st["latest"]["step"] == 3 and st["latest"]["epoch"] == 1 and st["latest"]["position"] == 24
    assert st["resume"]["step"] == 2 and st["resume_error"] is None
    assert [(r["rank"], r["latest_step"], r["commits"]) for r in st["ranks"]] == [(0, 3, 3), (1, 2, 2)]
    assert st["shards"]["total"] == 2 and set(st["shards"]["counts"]) == set(SHARD_STATES)
    assert st["shards"]["counts"]["downloaded"] == 1 and st["shards"]["counts"]["failed"] == 1
    a = st["shards"]["list"][0]
    assert a["url"] == "a" and a["state"] == "downloaded" and a["retries"] == 3
    assert st["counts"]["retries"] == 2 and st["counts"]["failures"] == 1
    assert st["counts"]["evictions"] == 1 and st["counts"]["repairs"] == 0
    assert st["events_by_kind"]["retry"] == 2
    assert [(e["kind"], e["rank"]) for e in st["last_errors"]] == [("retry", 1), ("fail", 0),
                                                                  ("retry", 0)]
    assert st["last_errors"][0]["detail"] == {"error": "timeout"}
    assert st["throughput"]["steps_per_s"] > 0 and st["throughput"]["samples_per_s"] > 0
    assert [p["rank"] for p in st["throughput"]["per_rank"]] == [0, 1]
    assert st["consumption"] == {"epoch": 1, "shards_started": 1, "shards_complete": 1,
                                 "samples": 20}
    assert st["stats"] == {"cache_hits": 3}
    text = format_status(st)
    for piece in ("step 3", "resume   step 2", "rank 1", "failed 1", "timeout", "retries 2"):
        assert piece in text, piece


def test_status_reports_unresumable_run(path):
    _fill(path, rank=0, world_size=2, steps=[1])
    st = status(path)
    assert st["resume"] is None and "no step is complete" in st["resume_error"]
    assert "NOT POSSIBLE" in format_status(st)
    assert st["throughput"]["samples_per_s"] is None


def test_status_empty_journal(path):
    Journal(path).close()
    st = status(path)
    assert st["latest"] is None and st["resume"] is None and st["stats"] is None
    assert "no commit yet" in format_status(st)


def test_foreign_database_refused(path):
    db = sqlite_utils.Database(path)
    db["users"].insert({"id": 1})
    db.close()
    with pytest.raises(JournalError, match="not a resumewds journal"):
        Journal(path)
    with pytest.raises(JournalError, match="not a resumewds journal"):
        Journal(path, readonly=True)
    assert sqlite_utils.Database(path).table_names() == ["users"]


def test_commits_from_another_thread(path):
    import threading

    with Journal(path) as j:
        def work(base):
            for s in range(50):
                j.record_events([{"kind": "tick", "n": base + s}])
        t = threading.Thread(target=work, args=(1000,))
        t.start()
        for s in range(1, 51):
            j.commit(s, epoch=0, position=s)
        t.join()
        assert j.latest_commit()["step"] == 50 and len(j.events("tick")) == 50


def test_readonly_reads_older_schema_without_migrating(path, monkeypatch):
    _fill(path, steps=[1, 2])
    _patch_v2(monkeypatch)
    st = status(path)
    assert st["schema_version"] == JOURNAL_SCHEMA_VERSION and st["latest"]["step"] == 2
    assert resolve_resume(path)["step"] == 2
    assert _schema_version(path) == JOURNAL_SCHEMA_VERSION  # readers never migrate


def test_real_v1_journal_migrates_to_v2_and_consumption_stays_exact(path, monkeypatch):
    """A journal written by schema version 1 (consumption written per commit)
    opens under version 2 (deltas in the commit rows, folded in periodically)."""
    with monkeypatch.context() as m:
        m.setattr(jschema, "_MIGRATIONS", jschema._MIGRATIONS[:1])
        m.setattr(jschema, "JOURNAL_SCHEMA_VERSION", 1)
        with Journal(path):
            pass
    conn = sqlite3.connect(path)  # what version 1 wrote for a commit: the row + a consumption row
    conn.execute("INSERT INTO commits (step, epoch, position, rank, world_size, ts) VALUES (1, 0, 4, 0, 1, 0)")
    conn.execute("INSERT INTO consumption (url, epoch, samples, total, complete) VALUES ('a.tar', 0, 4, 1000, 0)")
    conn.commit()
    conn.close()
    assert _schema_version(path) == 1
    with Journal(path) as j:
        assert j.schema_version == JOURNAL_SCHEMA_VERSION >= 2
        for step in range(2, 2 + 3 * jmod.CONSUMPTION_EVERY):
            j.commit(step, epoch=0, position=step, consumed={("a.tar", 0): (1, 1000)})
        n = 4 + 3 * jmod.CONSUMPTION_EVERY
        assert {r["url"]: r["samples"] for r in j.consumption(0)} == {"a.tar": n}


def test_consumption_survives_a_crash_between_materialisations(path):
    """Deltas live in the commit rows: a process killed before the table was
    brought up to date loses nothing (the next open folds them in)."""
    code = f"""
import os
from resumewds.journal import Journal
j = Journal({path!r})
for step in range(1, 11):
    j.commit(step, epoch=0, position=step, consumed={{("a.tar", 0): (1, 10)}})
os._exit(0)   # no close(): as if killed
"""
    subprocess.run([sys.executable, "-c", code], check=True, cwd=REPO)
    conn = sqlite3.connect(path)
    assert conn.execute("SELECT count(*) FROM consumption").fetchone()[0] == 0  # not yet folded in
    conn.close()
    with Journal(path, readonly=True) as r:   # readers see it already
        assert [(x["samples"], x["complete"]) for x in r.consumption(0)] == [(10, 1)]
    with Journal(path):                       # and the writer folds it in on open
        pass
    conn = sqlite3.connect(path)
    assert conn.execute("SELECT samples, complete FROM consumption").fetchall() == [(10, 1)]
    conn.close()
