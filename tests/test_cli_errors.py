"""Bad input through the real CLI: every case ends
with one ``Error:`` line naming the thing, never a traceback, in a real
``python -m resumewds`` process."""

from __future__ import annotations

import gzip
import json
import os
import subprocess
from typing import Dict, Optional, Tuple

import pytest

from conftest import PY, subprocess_env

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")


def run_cli(*args: str, env: Optional[Dict[str, str]] = None, stdout: object = subprocess.PIPE,
            cwd: Optional[str] = None, timeout: float = 120) -> Tuple[int, str, str]:
    e = subprocess_env()
    e.update(env or {})
    p = subprocess.run([PY, "-m", "resumewds", *args], stdout=stdout, stderr=subprocess.PIPE, text=True,
                       env=e, cwd=cwd, timeout=timeout)
    return p.returncode, p.stdout or "", p.stderr


def assert_clear_error(rc: int, err: str, *words: str) -> str:
    """Non-zero exit, no traceback, and the last line is ``Error: ...`` with ``words``."""
    assert rc != 0, err
    assert "Traceback" not in err, err
    lines = [ln for ln in err.splitlines() if ln.strip()]
    last = lines[-1]
    assert last.startswith("Error: "), err
    for w in words:
        assert w in last, (w, last)
    return last


@pytest.fixture
def data(make_shards, tmp_path) -> Dict[str, object]:
    paths = make_shards(shards=3, samples=7)
    d = os.path.dirname(paths[0])
    m = os.path.join(d, "manifest.json")
    rc, _, err = run_cli("index", *paths, "-o", m)
    assert rc == 0, err
    return {"dir": d, "shards": paths, "manifest": m, "tmp": str(tmp_path)}


# ---------------------------------------------------------------------------
# item 17: options, environment, directories, outputs
# ---------------------------------------------------------------------------

def test_cat_and_index_of_a_directory(data):
    rc, out, err = run_cli("cat", data["dir"])
    assert_clear_error(rc, err, data["dir"], "is a directory", "*.tar")
    rc, out, err = run_cli("index", data["dir"], "-o", os.path.join(data["tmp"], "x.json"))
    assert_clear_error(rc, err, data["dir"], "is a directory")


@pytest.mark.parametrize("args,env,words", [
    (["--cache-size", "abc"], {}, ["--cache-size", "abc"]),
    (["--cache-size", "-5GB"], {}, ["--cache-size", "-5GB"]),
    ([], {"RESUMEWDS_CACHE_SIZE": "abc"}, ["RESUMEWDS_CACHE_SIZE", "abc"]),
    (["--workers", "-1"], {}, ["--workers", "-1"]),
    (["--shuffle-window", "0"], {}, ["--shuffle-window", "0"]),
    (["--chunk", "0"], {}, ["--chunk"]),
    (["--attempts", "0"], {}, ["--attempts"]),
    (["--world-size", "0"], {}, ["--world-size"]),
], ids=["cache-size-abc", "cache-size-negative", "env-cache-size", "workers", "shuffle-window", "chunk",
        "attempts", "world-size"])
def test_bad_cat_settings(data, args, env, words):
    rc, out, err = run_cli("cat", data["manifest"], *args, env=env)
    assert_clear_error(rc, err, *words)
    assert out == ""


@pytest.mark.parametrize("verb", ["verify", "prefetch"])
def test_bad_cache_size_for_cache_passes(data, verb):
    rc, _, err = run_cli(verb, data["manifest"], "--cache-size", "abc")
    assert_clear_error(rc, err, "--cache-size", "abc")
    rc, _, err = run_cli(verb, data["manifest"], env={"RESUMEWDS_CACHE_SIZE": "12 parsecs"})
    assert_clear_error(rc, err, "RESUMEWDS_CACHE_SIZE")


def test_output_into_a_missing_directory(data):
    rc, _, err = run_cli("index", *data["shards"], "-o", "/nonexistent/dir/x")
    assert_clear_error(rc, err, "/nonexistent/dir", "does not exist")
    db = os.path.join(data["tmp"], "run.db")
    rc, _, err = run_cli("cat", data["manifest"], "--journal", db, "--limit", "3")
    assert rc == 0, err
    rc, _, err = run_cli("report", db, "-o", "/nonexistent/dir/x")
    assert_clear_error(rc, err, "/nonexistent/dir", "does not exist")


def test_stdout_on_a_full_disk_with_a_journal(data):
    """/dev/full: the write error is one line, and nothing unprinted is committed."""
    db = os.path.join(data["tmp"], "full.db")
    with open("/dev/full", "w") as full:
        rc, _, err = run_cli("cat", data["manifest"], "--journal", db, "--commit-every", "2", stdout=full)
    assert_clear_error(rc, err, "stdout", "No space left on device")
    rc, out, err = run_cli("cat", data["manifest"], "--journal", db)
    rc2, ref, _ = run_cli("cat", data["manifest"])
    assert rc == 0 and rc2 == 0, err
    assert out == ref and len(ref.splitlines()) == 21


# ---------------------------------------------------------------------------
# item 17: manifests are validated on load
# ---------------------------------------------------------------------------

def _edit(data, name: str, fn) -> str:
    with open(data["manifest"]) as f:
        m = json.load(f)
    fn(m["shards"][1])
    path = os.path.join(data["dir"], name)
    with open(path, "w") as f:
        json.dump(m, f)
    return path


def _set(key, value):
    def fn(s):
        s[key] = value
    return fn


def _offset(i, value, drop=()):
    def fn(s):
        s["offsets"][i] = value
        for k in drop:
            s.pop(k, None)
    return fn


def _swap(s):
    s["offsets"][1], s["offsets"][2] = s["offsets"][2], s["offsets"][1]


_MALFORMED = [
    (_offset(1, -5), ["offsets[1]", "negative"]),
    (_swap, ["offsets go backwards"]),
    (_offset(1, 1024.0), ["offsets[1]", "not an integer"]),
    (_offset(-1, 10 ** 12), ["past the shard's size"]),
    (_offset(-1, 2 ** 64), ["past the shard's size"]),
    (_offset(-1, 2 ** 64, drop=("size",)), ["beyond what any file can hold"]),
    (_set("samples", "10"), ["'samples'", "non-negative integer", '"10"']),
    (_set("size", -1), ["'size'"]),
    (_set("xxh3_64", 12), ["'xxh3_64'"]),
    (_set("offsets", "0,1"), ["'offsets' must be a list"]),
]
_MALFORMED_IDS = ["negative", "backwards", "float", "huge-1e12", "huge-2^64", "huge-2^64-no-size", "samples-str",
                  "size-negative", "xxh-int", "offsets-str"]
_MALFORMED_DEFAULT = {"negative", "huge-2^64-no-size", "samples-str"}  # three CLI runs each: the rest under -m slow


@pytest.mark.parametrize("edit,words", [
    pytest.param(*case, id=i, marks=() if i in _MALFORMED_DEFAULT else pytest.mark.slow)
    for case, i in zip(_MALFORMED, _MALFORMED_IDS)])
def test_malformed_manifest_is_refused_on_load(data, edit, words):
    path = _edit(data, "bad.json", edit)
    for cmd in (["cat", path], ["verify", path], ["index", path, "-o", path + ".out.json"]):
        rc, out, err = run_cli(*cmd)
        last = assert_clear_error(rc, err, path, "shard-000001.tar", *words)
        assert out == "", cmd
    assert len(last) < 300


def test_index_ending_past_the_file_without_a_size(data):
    """A manifest (no size, no checksum) whose index ends at byte 10^11: no
    10^11-byte allocation, an error naming the shard."""
    def fn(s):
        s.pop("size")
        s.pop("xxh3_64")
        s["offsets"][-1] = 10 ** 11
    path = _edit(data, "far.json", fn)
    rc, out, err = run_cli("cat", path, "--shuffle-mode", "none")
    assert_clear_error(rc, err, "shard-000001.tar", "file ends at byte", str(10 ** 11))
    rc, ref, _ = run_cli("cat", data["manifest"], "--shuffle-mode", "none")
    got = out.splitlines()
    assert len(got) <= 7 + 6 and got == ref.splitlines()[:len(got)]  # a correct prefix, no bad sample


def test_manifest_version_must_be_an_integer(data):
    with open(data["manifest"]) as f:
        m = json.load(f)
    m["version"] = "1"
    path = os.path.join(data["dir"], "v.json")
    with open(path, "w") as f:
        json.dump(m, f)
    rc, _, err = run_cli("cat", path)
    assert_clear_error(rc, err, path, "'version'")


# ---------------------------------------------------------------------------
# item 18: duplicates, globs, nothing to print
# ---------------------------------------------------------------------------

def test_duplicate_shards_are_refused(data):
    rc, out, err = run_cli("cat", data["manifest"], data["manifest"])
    assert_clear_error(rc, err, "shard-000000.tar", "twice")
    assert out == ""
    rc, out, err = run_cli("cat", data["shards"][0], data["shards"][1], data["shards"][0])
    assert_clear_error(rc, err, "shard-000000.tar", "twice")


def test_unexpanded_glob_gets_a_hint(data):
    pattern = os.path.join(data["dir"], "shard-*.tar")
    rc, out, err = run_cli("cat", pattern)
    assert_clear_error(rc, err, pattern, "not expanded", "matches 3 file(s)", "{")
    rc, out, err = run_cli("index", os.path.join(data["dir"], "nope-*.tar"), "-o", data["manifest"] + ".x")
    assert_clear_error(rc, err, "nope-*.tar", "matches nothing")


def test_epochs_zero_and_a_finished_limit_say_so(data):
    rc, out, err = run_cli("cat", data["manifest"], "--epochs", "0")
    assert rc == 0 and out == "" and "--epochs 0" in err
    db = os.path.join(data["tmp"], "lim.db")
    rc, out, err = run_cli("cat", data["manifest"], "--journal", db, "--limit", "5")
    assert rc == 0 and len(out.splitlines()) == 5
    rc, out, err = run_cli("cat", data["manifest"], "--journal", db, "--limit", "5")
    assert rc == 0 and out == "" and "--limit 5 already reached" in err
    db2 = os.path.join(data["tmp"], "done.db")
    rc, out, err = run_cli("cat", data["manifest"], "--journal", db2)
    assert rc == 0 and len(out.splitlines()) == 21
    rc, out, err = run_cli("cat", data["manifest"], "--journal", db2)
    assert rc == 0 and out == "" and "already delivered" in err


# ---------------------------------------------------------------------------
# item 7: verify is never "ok" for something that is not a shard
# ---------------------------------------------------------------------------

def test_verify_refuses_non_shards(data, tmp_path):
    d = tmp_path / "junk"
    d.mkdir()
    (d / "empty.tar").write_bytes(b"")
    (d / "text.tar").write_text("hello, I am not a tar file\n" * 40)
    with open(data["shards"][0], "rb") as f:
        good = f.read()
    # a gzip file that is not a gzipped tar (a gzipped tar is a compressed shard: ok, below)
    (d / "gz.tar").write_bytes(gzip.compress(b"hello, I am gzipped text\n" * 40))
    (d / "cut.tar").write_bytes(good[:len(good) // 2])
    (d / "dir.tar").mkdir()
    words = {"empty.tar": "empty file", "text.tar": "not a tar", "gz.tar": "gzip", "cut.tar": "",
             "dir.tar": "is a directory"}
    for name, w in words.items():
        rc, _, err = run_cli("verify", str(d / name))
        assert rc != 0 and "Traceback" not in err, err
        assert "0 ok" in err or err.strip().splitlines()[-1].startswith("Error:"), err
        assert w in err and name in err, (name, err)
    # a directory listed in a manifest is named too
    with open(data["manifest"]) as f:
        m = json.load(f)
    m["shards"][0] = {"url": str(d / "dir.tar")}
    mp = os.path.join(data["dir"], "m.json")
    with open(mp, "w") as f:
        f.write(json.dumps(m))
    rc, _, err = run_cli("verify", mp)
    assert rc == 1 and "dir.tar" in err and "is a directory" in err and "2 ok, 1 failed" in err
    # and real shards stay ok, with or without a checksum
    rc, _, err = run_cli("verify", data["shards"][0])
    assert rc == 0 and "1 ok, 0 failed" in err
    rc, _, err = run_cli("verify", data["manifest"])
    assert rc == 0 and "3 ok, 0 failed" in err
    (d / "good.tar.gz").write_bytes(gzip.compress(good))
    rc, _, err = run_cli("verify", str(d / "good.tar.gz"))
    assert rc == 0 and "1 ok, 0 failed" in err, err


def test_verify_checks_a_shard_against_the_manifest_index(data):
    """Same bytes count is not enough without a checksum: the index must match."""
    with open(data["manifest"]) as f:
        m = json.load(f)
    s = m["shards"][2]
    s.pop("xxh3_64")
    s["offsets"][1] += 512
    path = os.path.join(data["dir"], "idx.json")
    with open(path, "w") as f:
        json.dump(m, f)
    rc, _, err = run_cli("verify", path)
    assert rc == 1 and "shard-000002.tar" in err and "does not match" in err
