"""``resumewds index`` and ``resumewds cat``: the cat line format is a public
contract, checked here against an independent computation."""

from __future__ import annotations

import json
import os
import subprocess
import tarfile
from typing import Dict, List

import pytest
import xxhash
from click.testing import CliRunner

from conftest import PY, raw_samples, subprocess_env
from resumewds.cli import cli
from resumewds.manifest import load_manifest
from resumewds.plan import Plan

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
    """What cat must print, computed without the loader or resumewds.tario."""
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
