"""``resumewds index`` and ``resumewds cat``: the cat line format is a public
contract, checked here against an independent computation."""

from __future__ import annotations

import io
import json
import os
import subprocess
import tarfile
from typing import Dict, List

import pytest
import xxhash
from click.testing import CliRunner

from conftest import PY, raw_samples, subprocess_env
from resumewds.cli._main import cli
from resumewds.manifest._manifest import load_manifest
from resumewds.plan._plan import Plan

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")


@pytest.fixture
def indexed(shards, tmp_path) -> str:
    """The shards plus data/manifest.json written by ``resumewds index``."""
    out = str(tmp_path / "data" / "manifest.json")
    res = CliRunner().invoke(cli, ["index", *shards, "-o", out])
    assert res.exit_code == 0, res.output
    assert "5 shards, 185 samples" in res.stderr
    return out


def expected_lines(manifest_path: str, seed: int, shuffle, epochs: int, window: int = 8) -> List[str]:
    """What cat must print, computed without the loader or resumewds.tar."""
    m = load_manifest(manifest_path)
    raw: Dict[int, list] = {i: raw_samples(s.url) for i, s in enumerate(m.shards)}
    plan = Plan([len(raw[i]) for i in range(len(raw))], seed=seed, shuffle=shuffle, window=window)
    lines = []
    for e in range(epochs):
        ep = plan.epoch(e)
        for i in range(len(ep)):
            si, j = ep.sample_at(i)
            s = raw[si][j]
            members = b"".join(s[ext] for ext in sorted(k for k in s if k != "__key__"))
            lines.append(f"{os.path.basename(m.shards[si].url)}\t{s['__key__']}\t"
                         f"{xxhash.xxh3_64_hexdigest(members)}")
    return lines


def cat(*args: str) -> List[str]:
    res = CliRunner().invoke(cli, ["cat", *args])
    assert res.exit_code == 0, (res.output, res.exception)
    return res.stdout.splitlines()


def test_index_writes_a_relative_manifest(indexed, shards):
    d = json.load(open(indexed))
    assert [s["url"] for s in d["shards"]] == [os.path.basename(p) for p in shards]
    assert [s["samples"] for s in d["shards"]] == [37] * 5


@pytest.mark.parametrize("workers", [0, 2, 3])
def test_cat_shuffled_two_epochs_matches_independent_computation(indexed, workers):
    want = expected_lines(indexed, 7, True, 2)
    assert len(want) == 370 and want[:185] != want[185:]
    got = cat(indexed, "--seed", "7", "--shuffle", "--epochs", "2", "--workers", str(workers),
              "--chunk", "16")
    assert got == want


def test_cat_unshuffled_and_shards_mode(indexed):
    assert cat(indexed) == expected_lines(indexed, 0, False, 1)
    assert cat(indexed, "--seed", "3", "--shuffle-mode", "shards") == \
        expected_lines(indexed, 3, "shards", 1)
    assert cat(indexed, "--seed", "3", "--shuffle", "--shuffle-window", "2") == \
        expected_lines(indexed, 3, True, 1, window=2)


def test_cat_limit(indexed):
    want = expected_lines(indexed, 7, True, 2)
    assert cat(indexed, "--seed", "7", "--shuffle", "--epochs", "2", "--limit", "10") == want[:10]
    assert cat(indexed, "--seed", "7", "--shuffle", "--epochs", "2", "--limit", "200",
               "--workers", "2") == want[:200]
    assert cat(indexed, "--seed", "7", "--shuffle", "--epochs", "2", "--limit", "1000") == want


def test_cat_plain_paths_equal_cat_manifest(indexed, shards):
    args = ["--seed", "7", "--shuffle", "--epochs", "2"]
    assert cat(*shards, *args) == cat(indexed, *args)
    pattern = os.path.join(os.path.dirname(shards[0]), "shard-{000000..000004}.tar")
    assert cat(pattern, *args) == cat(indexed, *args)


def test_cat_errors_are_click_errors(tmp_path, cache_dir):
    bad = tmp_path / "bad.tar"
    bad.write_bytes(b"0" * 2048)
    res = CliRunner().invoke(cli, ["cat", str(bad)])
    assert res.exit_code == 1
    assert "Error:" in res.output and str(bad) in res.output and "at byte 0" in res.output
    res = CliRunner().invoke(cli, ["cat", "gs://bucket/a.tar"])
    assert res.exit_code == 1 and "scheme" in res.output


def test_cat_real_subprocess(indexed):
    proc = subprocess.run([PY, "-m", "resumewds", "cat", indexed, "--seed", "7", "--shuffle",
                           "--epochs", "2", "--workers", "2"],
                          capture_output=True, text=True, env=subprocess_env(), timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == expected_lines(indexed, 7, True, 2)
    assert all(len(line.split("\t")) == 3 for line in proc.stdout.splitlines())


def test_every_command_has_help():
    runner = CliRunner()
    res = runner.invoke(cli, ["--help"])
    assert res.exit_code == 0
    assert {"index", "cat"} <= set(cli.commands)
    for name, cmd in cli.commands.items():
        res = runner.invoke(cli, [name, "--help"])
        assert res.exit_code == 0, name
        assert "Usage:" in res.output and "Example" in res.output, name
        assert cmd.help and cmd.help.strip(), name


# ---------------------------------------------------------------------------
# SHARD and KEY are escaped; plain keys are byte-identical
# ---------------------------------------------------------------------------

from resumewds.cli import unescape_field  # noqa: E402
from resumewds.cli._main import _Bar, escape_field  # noqa: E402

NASTY_KEYS = ["tab\there", "new\nline", "back\\slash", "cr\rx", "plain-key_01", "sp ace"]


def _nasty_shard(path: str) -> List[str]:
    """A shard whose keys hold TAB, newline, CR, backslash, and a non-UTF-8 byte."""
    keys = list(NASTY_KEYS)
    with tarfile.open(path, "w", format=tarfile.GNU_FORMAT, encoding="latin-1") as tf:
        for k in keys + ["caf\xe9"]:
            for ext, data in (("txt", k.encode("latin-1")), ("cls", b"1")):
                ti = tarfile.TarInfo(f"{k}.{ext}")
                ti.size = len(data)
                tf.addfile(ti, io.BytesIO(data))
    # tario decodes names as UTF-8 with surrogateescape: latin-1 é is byte 0xe9
    return keys + [b"caf\xe9".decode("utf-8", "surrogateescape")]


def test_escaping_round_trips_and_keeps_plain_keys():
    for k in NASTY_KEYS + ["a\0b", "x\udc80y", "\\x41", "ünï/çode", ""]:
        e = escape_field(k)
        assert unescape_field(e) == k
        assert not any(c in e for c in "\t\n\r\0")
        e.encode("utf-8")  # always printable as UTF-8
    for plain in ("plain-key_01", "dir/x.y/sample-000123", "ünï/çode", "sp ace"):
        assert escape_field(plain) is plain
    assert escape_field("a\tb\\c\0\n\r") == "a\\tb\\\\c\\0\\n\\r"
    with pytest.raises(ValueError):
        unescape_field("bad\\q")


def test_cat_escapes_keys_so_every_line_has_three_fields(tmp_path):
    path = str(tmp_path / "nasty-keys.tar")
    keys = _nasty_shard(path)
    p = subprocess.run([PY, "-m", "resumewds", "cat", path], capture_output=True, env=subprocess_env(),
                       timeout=120)
    assert p.returncode == 0, p.stderr
    lines = p.stdout.decode("utf-8").split("\n")
    assert lines[-1] == ""
    lines = lines[:-1]
    assert len(lines) == len(keys)
    fields = [ln.split("\t") for ln in lines]
    assert all(len(f) == 3 for f in fields)
    assert [unescape_field(f[1]) for f in fields] == keys
    assert fields[4][1] == "plain-key_01" and fields[5][1] == "sp ace"   # byte-identical
    assert fields[6][1] == "caf\\xe9" and fields[2][1] == "back\\\\slash"
    digests = [f[2] for f in fields]
    expected = [xxhash.xxh3_64_hexdigest(b"1" + k.encode()) for k in keys[:-1]]  # cls then txt
    assert digests[:-1] == expected


def test_progress_redraws_are_rate_limited():
    """One redraw per sample was 2.75 MB of terminal output for 40k samples."""
    t = [0.0]
    out = io.StringIO()
    with _Bar(40_000, "cat", "samples", file=out, clock=lambda: t[0]) as bar:
        for _ in range(40_000):
            t[0] += 0.0001  # 10k samples/s for 4 s
            bar.update(1)
    assert bar.redraws <= 4 * 10 + 3
    assert len(out.getvalue()) < 10_000
    last = out.getvalue().rstrip("\n").split("\r")[-1]
    assert "40,000/40,000 samples" in last and "samples/s" in last and "100%" in last
    out = io.StringIO()
    with _Bar(3_000_000, "verifying", "bytes", file=out, clock=lambda: t[0]) as bar:
        t[0] += 1.0
        bar.update(1_500_000)
    assert "1.5 MB/3.0 MB" in out.getvalue() and "MB/s" in out.getvalue() and "eta" in out.getvalue()


def test_cat_progress_output_is_bounded(shards):
    p = subprocess.run([PY, "-m", "resumewds", "cat", *shards, "--progress", "--epochs", "3"],
                       capture_output=True, env=subprocess_env(), timeout=120)
    assert p.returncode == 0, p.stderr
    assert p.stdout.count(b"\n") == 3 * 185
    assert p.stderr.count(b"\r") < 60  # 555 samples: not one redraw each
