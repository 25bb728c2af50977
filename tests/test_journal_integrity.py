"""A journal that lost committed steps (its ``-wal`` deleted, truncated or not
copied) is refused; the legitimate cases (a fresh run, a clean close, a
copy with its lock file, readers, rewinds, other ranks) are not.

Real SQLite files, real processes killed with SIGKILL.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap

import pytest

from resumewds.errors import JournalError
from resumewds.journal import Journal
from resumewds.journal._lock import COMMIT_FIELD, lock_path, parse_commit_record, read_lock_info
from resumewds.journal._paths import rank_journal_path

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))

# commits steps 0..N-1 (checkpointing the WAL into the main file after step
# CKPT, as SQLite's auto-checkpoint does), says so, and waits to be killed
KILLED_WRITER = textwrap.dedent("""
    import sys, time
    from resumewds.journal import Journal
    path, rank, n, ckpt = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
    j = Journal(path, rank=rank, world_size=2 if rank else 1)
    for s in range(n):
        j.commit(s, epoch=0, position=(s + 1) * 4, batch_size=4)
        if s == ckpt:
            j.conn.execute("PRAGMA wal_checkpoint(PASSIVE)")
    print("ready", flush=True)
    time.sleep(600)
""")


def _env():
    env = dict(os.environ)
    env["PYTHONPATH"] = REPO + os.pathsep + env.get("PYTHONPATH", "")
    return env


def _killed_run(path, n=200, ckpt=80, rank=0):
    """A writer that committed ``n`` steps, killed -9: its newest commits are in the WAL only."""
    p = subprocess.Popen([sys.executable, "-c", KILLED_WRITER, path, str(rank), str(n), str(ckpt)],
                         env=_env(), stdout=subprocess.PIPE, text=True)
    try:
        assert p.stdout.readline().strip() == "ready"
    finally:
        p.send_signal(signal.SIGKILL)
        p.wait()
    f = rank_journal_path(path, rank)
    assert os.path.getsize(f + "-wal") > 0
    return f


@pytest.fixture
def path(tmp_path):
    return str(tmp_path / "run.db")


def _latest(path, rank=0):
    with Journal(path, rank=rank, world_size=2 if rank else 1) as j:
        return j.latest_commit()["step"]


def test_killed_run_resumes_at_its_last_commit(path):
    _killed_run(path)
    assert _latest(path) == 199


@pytest.mark.parametrize("damage", ["delete", "truncate_half"])
def test_lost_wal_is_refused(path, damage):
    _killed_run(path)
    wal = path + "-wal"
    if damage == "delete":
        os.unlink(wal)
    else:
        os.truncate(wal, os.path.getsize(wal) // 2)
    with pytest.raises(JournalError) as ei:
        Journal(path)
    msg = str(ei.value)
    assert msg.startswith(path + ": journal lost committed steps")
    assert "records step 199" in msg and path + "-wal" in msg
    assert f"delete {lock_path(path)}" in msg
    # refused again (the lock file was left as it was), and a reader still reads it
    with pytest.raises(JournalError, match="lost committed steps"):
        Journal(path)
    with Journal(path, readonly=True) as r:
        older = r.latest_commit()["step"]
    assert 80 <= older < 199
    # the way out the message names: delete the lock file, resume from what is left
    os.unlink(lock_path(path))
    assert _latest(path) == older


def test_clean_close_checkpoints_and_reopens(path):
    with Journal(path) as j:
        for s in range(50):
            j.commit(s, epoch=0, position=s)
    assert not os.path.exists(path + "-wal") or os.path.getsize(path + "-wal") == 0
    rec = parse_commit_record(read_lock_info(lock_path(path))["last_commit"])
    assert rec is not None and rec[0] == 49
    assert _latest(path) == 49


def test_fresh_run_and_run_without_commits(path):
    with Journal(path) as j:
        assert j.latest_commit() is None
    assert read_lock_info(lock_path(path))["last_commit"] == " " * COMMIT_FIELD
    with Journal(path) as j:
        j.commit(0, epoch=0, position=1)
    assert _latest(path) == 0


def test_copy_with_lock_file_and_wal_opens(tmp_path, path):
    _killed_run(path)
    dst = tmp_path / "copy"
    dst.mkdir()
    for suffix in ("", "-wal", ".lock"):
        shutil.copy2(path + suffix, str(dst / ("run.db" + suffix)))
    assert _latest(str(dst / "run.db")) == 199


def test_copy_without_wal_is_refused(tmp_path, path):
    _killed_run(path)
    dst = tmp_path / "copy"
    dst.mkdir()
    for suffix in ("", ".lock"):
        shutil.copy2(path + suffix, str(dst / ("run.db" + suffix)))
    with pytest.raises(JournalError, match="lost committed steps"):
        Journal(str(dst / "run.db"))


def test_reader_during_writes_and_rewind(path):
    with Journal(path) as j:
        for s in range(20):
            j.commit(s, epoch=0, position=s)
            with Journal(path, readonly=True) as r:
                assert r.latest_commit()["step"] == s
        j.commit(5, epoch=0, position=5)  # resumed from an earlier step: a rewind
    assert _latest(path) == 5


def test_rewind_killed_before_it_was_recorded(path):
    """A commit that rewound the run reached the journal but not the lock
    file (killed in between): the journal is newer than the record, not older."""
    with Journal(path) as j:
        for s in range(20):
            j.commit(s, epoch=0, position=s)
        rec = read_lock_info(lock_path(path))["last_commit"]
        j._lock.record_commit = lambda step, ts: None  # the kill between COMMIT and the record
        j.commit(5, epoch=0, position=5)
    assert read_lock_info(lock_path(path))["last_commit"] == rec
    assert _latest(path) == 5


def test_each_rank_is_checked_on_its_own(path):
    with Journal(path) as j:
        j.commit(0, epoch=0, position=4)
    f1 = _killed_run(path, rank=1)
    os.unlink(f1 + "-wal")
    assert _latest(path) == 0  # rank 0 is whole
    with pytest.raises(JournalError) as ei:
        Journal(path, rank=1, world_size=2)
    assert str(ei.value).startswith(f1 + ": journal lost committed steps")


def test_old_lock_file_without_record_is_accepted(path):
    _killed_run(path)
    info = read_lock_info(lock_path(path))
    del info["last_commit"]
    with open(lock_path(path), "w") as f:
        json.dump(info, f)
    os.unlink(path + "-wal")  # nothing recorded to check against: as before
    assert 80 <= _latest(path) < 199


def test_record_is_one_fixed_width_field():
    from resumewds.journal._lock import commit_record

    for step, ts in ((0, 0.0), (12345678901234, 1.7e9 + 0.123456789), (-1, 1e-300)):
        rec = commit_record(step, ts)
        assert len(rec) == COMMIT_FIELD
        assert parse_commit_record(rec) == (step, ts)
    assert parse_commit_record(" " * COMMIT_FIELD) is None
    assert parse_commit_record("x y") is None


# ---- the journal's file removed or replaced while a run writes it ----------------------------------

def _removed(j_dir, path):
    shutil.rmtree(j_dir)


def _replaced(j_dir, path):
    # another file at the same path: a copy, as `cp backup/run.db run.db` would leave
    shutil.copy2(path, path + ".copy")
    os.replace(path + ".copy", path)


def _moved(j_dir, path):
    os.rename(path, path + ".old")


@pytest.mark.parametrize("change", [_removed, _replaced, _moved], ids=["directory-removed", "replaced", "moved"])
def test_a_commit_into_a_file_that_lost_its_path_is_refused(tmp_path, change):
    j_dir = tmp_path / "journal"
    j_dir.mkdir()
    path = str(j_dir / "run.db")
    j = Journal(path)
    try:
        for s in range(10):
            j.commit(s, epoch=0, position=(s + 1) * 4)
        change(str(j_dir), path)
        with pytest.raises(JournalError) as ei:
            j.commit(10, epoch=0, position=44)
        msg = str(ei.value)
        assert msg.startswith(f"{path}: the journal file was deleted or replaced while this run was writing it")
        assert "its newest commit is step 9" in msg and "commit of step 10" in msg
        with pytest.raises(JournalError, match="deleted or replaced"):  # every later write too
            j.record_events([{"kind": "retry", "url": "a.tar"}])
    finally:
        j.close()


def test_a_commit_after_the_lock_file_was_deleted_is_refused(path):
    with Journal(path) as j:
        j.commit(0, epoch=0, position=4)
        os.unlink(lock_path(path))
        with pytest.raises(JournalError, match=r"its lock file .* was deleted while this run was writing"):
            j.commit(1, epoch=0, position=8)
    assert _latest(path) == 0  # the journal itself is whole: a rerun resumes after step 0


def test_cat_stops_when_its_journal_directory_is_removed(make_shards, tmp_path):
    """``resumewds cat --journal`` whose journal directory is removed mid-run
    ends with an error naming the journal (it used to finish with status 0,
    its commits gone with the unlinked file)."""
    data = make_shards(shards=4, samples=50)
    j_dir = tmp_path / "journal"
    j_dir.mkdir()
    path = str(j_dir / "run.db")
    p = subprocess.Popen([sys.executable, "-m", "resumewds", "cat", *data, "--epochs", "200", "--journal", path,
                          "--commit-every", "50"], env=_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                         text=True)
    try:
        for _ in range(120):  # two commits made
            assert p.stdout.readline()
        shutil.rmtree(str(j_dir))
        rest = sum(1 for _ in p.stdout)
        err = p.stderr.read()
    finally:
        p.kill()
        p.wait()
    assert p.returncode == 1, err
    assert rest < 200 * 200 - 120  # it stopped at the next commit, not at the end
    assert f"Error: {path}: the journal file was deleted or replaced while this run was writing it" in err


# ---- reading a journal where nothing can be written --------------------------------------------

# run in the read-only view: proves that the directory cannot be written, then `resumewds status --json`
READ_ONLY_STATUS = textwrap.dedent("""
    import errno, os, sys
    d = sys.argv[1]
    try:
        open(os.path.join(d, "probe"), "w").close()
    except OSError as exc:
        if exc.errno not in (errno.EACCES, errno.EPERM, errno.EROFS):
            raise
    else:
        sys.exit("the directory can be written: this is not a read-only location")
    from resumewds.cli import main
    main(["status", "--json", os.path.join(d, "run.db")])
""")


def _mount_works() -> bool:
    """A read-only bind mount in a private mount namespace (root with CAP_SYS_ADMIN)."""
    if shutil.which("unshare") is None:
        return False
    return subprocess.run(["unshare", "-m", "sh", "-c", "mount --bind / / && mount -o remount,ro,bind / /"],
                          stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).returncode == 0


def _without_dac_override() -> None:
    """In a child of root, before exec: give up the capabilities that ignore file
    permissions (CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH), so that a directory of mode
    0555 is read-only to it, as to anyone else.  Root keeps a capability across exec
    when it is in the bounding set, the inheritable set or the ambient set: all three."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)

    def check(rc: int, what: str) -> None:
        if rc != 0:
            raise OSError(ctypes.get_errno(), what)

    for cap in (1, 2):  # CAP_DAC_OVERRIDE, CAP_DAC_READ_SEARCH
        check(libc.prctl(24, cap, 0, 0, 0), "prctl(PR_CAPBSET_DROP)")
    libc.prctl(47, 4, 0, 0, 0)  # PR_CAP_AMBIENT_CLEAR_ALL (EINVAL before Linux 4.3: nothing to clear)

    class Header(ctypes.Structure):
        _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]

    class Data(ctypes.Structure):
        _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32),
                    ("inheritable", ctypes.c_uint32)]

    hdr, data = Header(0x20080522, 0), (Data * 2)()  # _LINUX_CAPABILITY_VERSION_3
    check(libc.capget(ctypes.byref(hdr), data), "capget")
    data[0].inheritable = data[1].inheritable = 0
    check(libc.capset(ctypes.byref(hdr), data), "capset")


def _status_read_only(d: str, how: str) -> subprocess.CompletedProcess:
    """``resumewds status --json`` of ``d/run.db`` with ``d`` read-only, ``how``:

    * ``"mount"``: ``d`` bind-mounted read-only (EROFS) in a mount namespace of its own;
    * ``"permissions"``: ``d`` mode 0555 (EACCES); a root test run reads it without the
      capabilities that ignore permissions (:func:`_without_dac_override`).

    The child first proves that it cannot write ``d``.
    """
    cmd = [sys.executable, "-c", READ_ONLY_STATUS, d]
    kw = {}
    if how == "mount":
        cmd = ["unshare", "-m", "sh", "-c", 'mount --bind "$1" "$1" && mount -o remount,ro,bind "$1" "$1" '
               '&& shift && exec "$@"', "sh", d, *cmd]
    else:
        os.chmod(d, 0o555)
        if os.geteuid() == 0:
            kw = dict(preexec_fn=_without_dac_override)
    try:
        return subprocess.run(cmd, env=_env(), capture_output=True, text=True, timeout=120, **kw)
    finally:
        os.chmod(d, 0o755)




@pytest.mark.parametrize("how", ["permissions", "mount"])
@pytest.mark.parametrize("left", ["closed", "killed", "wal-without-shm"])
def test_status_of_a_journal_on_a_read_only_location(tmp_path, how, left):
    """A journal on a read-only location reads as it is (it used to be "corrupt
    or not a SQLite database"), including the commits still in its ``-wal``:
    opening the file alone (``immutable=1``) would show step 80, a silent rewind."""
    if how == "mount" and not _mount_works():
        pytest.skip("no read-only bind mount here (needs root with CAP_SYS_ADMIN); 'permissions' covers it")
    open_dir = str(tmp_path / "journal")
    os.mkdir(open_dir)
    path = os.path.join(open_dir, "run.db")
    if left == "closed":
        with Journal(path) as j:
            for s in range(200):
                j.commit(s, epoch=0, position=(s + 1) * 4, batch_size=4)
        assert not os.path.exists(path + "-wal") and not os.path.exists(path + "-shm")
    else:
        _killed_run(path, n=200, ckpt=80)
        if left == "wal-without-shm":
            os.unlink(path + "-shm")
    for f in os.listdir(open_dir):
        os.chmod(os.path.join(open_dir, f), 0o644)
    before = sorted(os.listdir(open_dir))
    res = _status_read_only(open_dir, how)
    assert res.returncode == 0, res.stderr
    st = json.loads(res.stdout)
    assert st["latest"]["step"] == 199 and st["latest"]["position"] == 800
    assert st["resume"]["step"] == 199 and st["ranks"][0]["commits"] == 200
    assert sorted(os.listdir(open_dir)) == before  # nothing written there
