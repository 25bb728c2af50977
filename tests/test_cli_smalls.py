"""Small CLI and library fixes: a rerun demo, consumption accounting, error
messages, broken pipes, skip lines, status throughput, duplicate shards."""

from __future__ import annotations

import json
import os
import subprocess

import pytest
from click.testing import CliRunner

from conftest import PY, subprocess_env
from resumewds.cli._main import cli

pytestmark = [pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning"),
              pytest.mark.usefixtures("cache_dir")]


def run_cli(*args: str, **kw) -> subprocess.CompletedProcess:
    return subprocess.run([PY, "-m", "resumewds", *args], capture_output=True, text=True,
                          env=kw.pop("env", subprocess_env()), timeout=600, **kw)


@pytest.fixture
def manifest(shards, tmp_path) -> str:
    out = str(tmp_path / "data" / "manifest.json")
    res = CliRunner().invoke(cli, ["index", *shards, "-o", out])
    assert res.exit_code == 0, res.output
    return out


@pytest.mark.slow
def test_demo_runs_twice_in_the_same_directory(tmp_path):
    d = str(tmp_path / "demo")
    for attempt in range(2):
        res = run_cli("demo", "--dir", d, "--shards", "2", "--samples", "120")
        assert res.returncode == 0, (attempt, res.stdout, res.stderr)
        assert "sequences match" in res.stdout, (attempt, res.stdout)
        assert "MISMATCH" not in res.stdout


@pytest.mark.parametrize("workers", [0, 2])
def test_cat_limit_consumption_equals_delivered(manifest, tmp_path, workers):
    journal = str(tmp_path / "run.db")
    res = CliRunner().invoke(cli, ["cat", manifest, "--journal", journal, "--limit", "50", "--chunk", "16",
                                   "--commit-every", "7", "--workers", str(workers), "--shuffle"])
    assert res.exit_code == 0, res.output
    assert len(res.stdout.splitlines()) == 50
    st = json.loads(CliRunner().invoke(cli, ["status", journal, "--json"]).stdout)
    assert st["consumption"]["samples"] == 50
    assert st["latest"]["samples_total"] == 50
    # the rest of the epoch: consumption ends at the epoch's size, not past it
    res = CliRunner().invoke(cli, ["cat", manifest, "--journal", journal, "--chunk", "16",
                                   "--workers", str(workers), "--shuffle"])
    assert res.exit_code == 0, res.output
    from resumewds.journal._read import read_consumption

    by_url = read_consumption(journal)[0]
    assert sum(c["samples"] for c in by_url.values()) == 185
    assert all(c["samples"] == c["total"] for c in by_url.values())


@pytest.mark.parametrize("args", [["status"], ["status", "--json"]])
def test_status_into_a_closed_pipe_exits_quietly(manifest, tmp_path, args):
    journal = str(tmp_path / "run.db")
    assert CliRunner().invoke(cli, ["cat", manifest, "--journal", journal, "--limit", "20"]).exit_code == 0
    r, w = os.pipe()
    os.close(r)  # `| head -1` that already left: every write to stdout fails with EPIPE
    try:
        res = subprocess.run([PY, "-m", "resumewds", args[0], journal, *args[1:]], stdout=w,
                             stderr=subprocess.PIPE, text=True, env=subprocess_env(), timeout=600)
    finally:
        os.close(w)
    assert res.returncode == 1
    assert res.stderr == ""


@pytest.mark.parametrize("workers", [pytest.param("0", marks=pytest.mark.slow), "2"])
def test_each_skipped_shard_is_one_line_naming_it_once(manifest, shards, workers):
    with open(shards[1], "r+b") as f:  # damage a sample of shard 1: that sample fails its digest
        f.seek(2000)
        f.write(b"XXXXXXXX")
    os.unlink(shards[3])
    res = run_cli("cat", manifest, "--on-error", "skip", "--workers", workers, "--epochs", "2")
    assert res.returncode == 0, res.stderr
    lines = [ln for ln in res.stderr.splitlines() if shards[3] in ln]
    assert len(lines) == 1, res.stderr
    assert lines[0].startswith(f"resumewds: skipped shard {shards[3]}: ")
    assert lines[0].count(shards[3]) == 1
    # shard 1 is not skipped: its damaged sample alone is, in each epoch, and named
    assert not any(ln.startswith(f"resumewds: skipped shard {shards[1]}") for ln in res.stderr.splitlines())
    assert f"skipping sample {shards[1]}: sample 0 " in res.stderr, res.stderr
    assert len(res.stdout.splitlines()) == 2 * (4 * 37 - 1)
    res = run_cli("verify", manifest)
    assert res.returncode == 1
    failed = [ln for ln in res.stderr.splitlines() if ln.startswith("FAILED")]
    assert failed and all(ln.count(ln.split()[1].rstrip(":")) == 1 for ln in failed), res.stderr


def test_library_skip_warnings_name_the_shard_once(manifest, shards, caplog):
    import resumewds as rw

    os.unlink(shards[2])
    loader = rw.WebLoader(rw.WebDataset(manifest, on_error="skip"), batch_size=None, num_workers=0)
    with caplog.at_level("WARNING", logger="resumewds"):
        assert len(list(loader)) == 4 * 37
    said = [r.getMessage() for r in caplog.records if shards[2] in r.getMessage()]
    assert len(said) == 2, said  # when it is skipped, and the epoch's summary
    assert all(m.count(shards[2]) == 1 for m in said), said


def test_cat_without_numpy_prints_no_numpy_warning(manifest):
    shim = ("import sys\nsys.modules['numpy'] = None  # the minimal install: no numpy\n"
            "from resumewds.cli._main import main\nmain(sys.argv[1:])\n")
    res = subprocess.run([PY, "-c", shim, "cat", manifest, "--limit", "3"], capture_output=True, text=True,
                         env=subprocess_env(), timeout=600)
    assert res.returncode == 0, res.stderr
    assert len(res.stdout.splitlines()) == 3
    assert "NumPy" not in res.stderr and res.stderr == "", res.stderr


def test_decode_pil_without_pillow_in_a_worker_says_what_to_install(make_shards, monkeypatch):
    import sys

    import resumewds as rw
    from resumewds.errors import DecodeError

    paths = make_shards(shards=2, samples=4, images=True, image_side=8, subdir="img")
    monkeypatch.setitem(sys.modules, "PIL", None)  # pillow not installed (forked workers inherit it)
    monkeypatch.setitem(sys.modules, "PIL.Image", None)
    loader = rw.WebLoader(rw.WebDataset(paths).decode("pil"), batch_size=None, num_workers=1)
    with pytest.raises(DecodeError, match=r"pip install 'resumewds\[image\]'"):
        next(iter(loader))


def test_the_image_extra_brings_numpy():
    import tomllib

    from conftest import REPO

    with open(os.path.join(REPO, "pyproject.toml"), "rb") as f:
        extras = tomllib.load(f)["project"]["optional-dependencies"]
    names = {r.split(">")[0].split("=")[0].strip() for r in extras["image"]}
    assert {"pillow", "numpy"} <= names


def test_webdataset_of_a_directory_or_a_quoted_glob_says_what_to_pass(shards, tmp_path):
    import resumewds as rw
    from resumewds.errors import SourceError

    d = os.path.dirname(shards[0])
    with pytest.raises(SourceError, match="is a directory, not a shard or manifest.*5 files"):
        next(iter(rw.WebDataset(d)))
    with pytest.raises(SourceError, match=r"glob pattern that was not expanded \(it matches 5 file"):
        next(iter(rw.WebDataset(os.path.join(d, "*.tar"))))
    with pytest.raises(SourceError, match="matches nothing"):
        next(iter(rw.WebDataset([shards[0], str(tmp_path / "nowhere" / "*.tar")])))
    # the command line says it in the same words
    res = CliRunner().invoke(cli, ["cat", os.path.join(d, "*.tar")])
    assert res.exit_code == 1 and "glob pattern that was not expanded (it matches 5 file" in res.stderr


def test_status_throughput_leaves_out_the_idle_time_between_runs(manifest, tmp_path):
    import sqlite3

    journal = str(tmp_path / "run.db")
    for limit in ("60", "120"):
        res = CliRunner().invoke(cli, ["cat", manifest, "--journal", journal, "--limit", limit,
                                       "--commit-every", "10"])
        assert res.exit_code == 0, res.output
    # the clock of a run that went at 100 samples/s, stopped, and came back 5000 s later
    t0 = 1.9e9
    with sqlite3.connect(journal) as db:
        db.execute("UPDATE commits SET ts = ? + step / 100.0 WHERE step <= 60", (t0,))
        db.execute("UPDATE commits SET ts = ? + (step - 60) / 100.0 WHERE step > 60", (t0 + 5000,))
        assert db.execute("UPDATE events SET ts = ? WHERE kind = 'resume'", (t0 + 5000,)).rowcount == 1
    st = json.loads(CliRunner().invoke(cli, ["status", journal, "--json"]).stdout)
    assert st["throughput"]["samples_per_s"] == pytest.approx(100.0)
    assert st["throughput"]["window_s"] == pytest.approx(1.1)  # 0.5 s (steps 10..60) + 0.6 s since the restart


def _wrong_digest(manifest_path: str, shard: int, sample: int) -> str:
    """A copy of the manifest with one wrong per-sample digest (the shard's bytes and whole checksum intact)."""
    doc = json.load(open(manifest_path))
    e = doc["shards"][shard]
    h = e["sample_xxh3_64"]
    e["sample_xxh3_64"] = h[:16 * sample] + "0" * 16 + h[16 * (sample + 1):]
    out = os.path.join(os.path.dirname(manifest_path), "wrong.json")
    json.dump(doc, open(out, "w"))
    return out


@pytest.mark.parametrize("verify", ["once", "always"])
def test_a_wrong_sample_digest_is_an_error_in_every_verify_mode(manifest, verify, caplog):
    bad = _wrong_digest(manifest, 0, 5)
    res = CliRunner().invoke(cli, ["cat", bad, "--verify", verify])
    assert res.exit_code == 1
    assert "sample 5 " in res.stderr and "xxh3_64 mismatch: expected 0000000000000000" in res.stderr
    assert all(not ln.endswith("\t" + "0" * 16) for ln in res.stdout.splitlines())
    res = CliRunner().invoke(cli, ["cat", bad, "--verify", verify, "--on-error", "skip"])
    assert res.exit_code == 0
    lines = res.stdout.splitlines()
    first = [ln for ln in lines if ln.startswith("shard-000000.tar\t")]
    # the damaged sample alone is skipped (each sample is checked against its own digest)
    assert len(lines) - len(first) == 4 * 37 and len(first) == 36
    assert sorted(int(ln.split("\t")[1][-6:]) for ln in first) == [i for i in range(37) if i != 5]
    said = res.stderr + caplog.text  # the library's warning (a log record under CliRunner)
    assert "skipped shard" not in said and "skipping sample" in said and "sample 5 " in said


def test_verify_checks_sample_digests_when_the_whole_file_matches(manifest):
    bad = _wrong_digest(manifest, 2, 5)
    res = CliRunner().invoke(cli, ["verify", bad, "--no-progress"])
    assert res.exit_code == 1, res.stderr
    assert "BAD SAMPLE" in res.stderr and "sample 5 " in res.stderr and "4 ok, 1 failed" in res.stderr


def test_a_wrong_sample_digest_of_a_remote_shard_is_an_error(manifest, tmp_path):
    from chaos.faultserver import FaultServer

    bad = _wrong_digest(manifest, 1, 3)
    with FaultServer(os.path.dirname(manifest)) as srv:
        url = srv.url.rstrip("/") + "/" + os.path.basename(bad)
        for verify in ("always", "once"):
            res = CliRunner().invoke(cli, ["cat", url, "--verify", verify, "--cache-dir",
                                           str(tmp_path / f"c-{verify}")])
            assert res.exit_code == 1, (verify, res.stderr)
            assert "sample 3 " in res.stderr and "mismatch" in res.stderr, (verify, res.stderr)
        res = CliRunner().invoke(cli, ["verify", url, "--no-progress", "--cache-dir", str(tmp_path / "c-v")])
        assert res.exit_code == 1 and "sample 3 " in res.stderr, res.stderr


def test_one_shard_under_two_names_is_warned_about_once(shards, tmp_path):
    import shutil

    twin = os.path.join(os.path.dirname(shards[1]), "twin-of-1.tar")
    shutil.copyfile(shards[1], twin)
    out = str(tmp_path / "data" / "dup.json")
    res = run_cli("index", *shards, twin, "-o", out)
    assert res.returncode == 0, res.stderr
    said = [ln for ln in res.stderr.splitlines() if "same shard" in ln]
    assert len(said) == 1 and shards[1] in said[0] and twin in said[0], res.stderr
    res = run_cli("cat", out, "--workers", "2")
    assert res.returncode == 0, res.stderr
    assert len(res.stdout.splitlines()) == 6 * 37  # delivered as listed, but said once
    said = [ln for ln in res.stderr.splitlines() if "same shard" in ln]
    assert len(said) == 1 and shards[1] in said[0] and twin in said[0] and "twice per epoch" in said[0]


@pytest.mark.parametrize("version", ["v1", "v3"])
def test_a_manifest_of_fewer_samples_than_the_shard_holds_is_refused(shards, tmp_path, version):
    out = str(tmp_path / "data" / "m.json")
    res = CliRunner().invoke(cli, ["index", *shards, "-o", out, *(["--no-digests"] if version == "v1" else [])])
    assert res.exit_code == 0, res.output
    doc = json.load(open(out))
    e = doc["shards"][0]  # a "subset" manifest: 3 of the shard's 37 samples
    e["samples"], e["offsets"] = 3, e["offsets"][:4]
    if "sample_xxh3_64" in e:
        e["sample_xxh3_64"] = e["sample_xxh3_64"][:3 * 16]
    json.dump(doc, open(out, "w"))
    for verify in ("once", "always"):
        res = CliRunner().invoke(cli, ["cat", out, "--verify", verify, "--cache-dir", str(tmp_path / verify)])
        assert res.exit_code == 1, (verify, res.stdout[-300:])
        assert "the manifest lists 3 samples" in res.stderr and "Index it again" in res.stderr, res.stderr
        assert shards[0] in res.stderr
    res = CliRunner().invoke(cli, ["verify", out, "--no-progress"])
    assert res.exit_code == 1 and "the manifest lists 3 samples" in res.stderr and "4 ok, 1 failed" in res.stderr
