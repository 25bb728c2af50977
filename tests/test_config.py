"""resumewds.config: one precedence (defaults < environment < arguments),
webdataset's aliases (ours win), validation on every path, and a docstring
table that lists every variable."""

from __future__ import annotations

import os
import re

import pytest

from http_fixtures import fast_config, make_tar, shard_for
from resumewds import config
from resumewds.cache import ShardStore
from resumewds.fetch import FetchConfig, fetch_to_file

ALL_VARS = sorted(config.all_variables())
ALIASES = sorted({v.alias for v in config.all_variables().values() if v.alias})


@pytest.fixture(autouse=True)
def _clean_env(monkeypatch):
    for name in ALL_VARS + ALIASES:
        monkeypatch.delenv(name, raising=False)


def test_defaults_then_environment_then_arguments(monkeypatch):
    assert FetchConfig.from_env().attempts == 8
    monkeypatch.setenv("RESUMEWDS_FETCH_ATTEMPTS", "3")
    monkeypatch.setenv("RESUMEWDS_FETCH_MIN_RATE", "0")
    c = FetchConfig.from_env()
    assert (c.attempts, c.min_rate) == (3, 0)
    c = FetchConfig.from_env(attempts=5, read_timeout=None)  # None: an unset flag, no override
    assert (c.attempts, c.read_timeout) == (5, 30.0)


@pytest.mark.parametrize("var,raw,words", [
    ("RESUMEWDS_FETCH_ATTEMPTS", "0", "must be >= 1"),
    ("RESUMEWDS_FETCH_ATTEMPTS", "many", "not valid"),
    ("RESUMEWDS_FETCH_DEADLINE", "-1", "must be > 0"),
    ("RESUMEWDS_FETCH_READ_TIMEOUT", "nan", "not valid"),
    ("RESUMEWDS_FETCH_MAX_REDIRECTS", "-2", "must be >= 0"),
    ("RESUMEWDS_GOPEN_VERBOSE", "maybe", "not valid"),
])
def test_environment_values_are_validated_with_the_variable_named(monkeypatch, var, raw, words):
    monkeypatch.setenv(var, raw)
    with pytest.raises(ValueError, match=words) as ei:
        FetchConfig.from_env()
    assert var in str(ei.value)


def test_explicit_arguments_are_validated_too():
    with pytest.raises(ValueError, match="attempts"):
        FetchConfig.from_env(attempts=0)
    with pytest.raises(ValueError, match="cache_size"):
        config.cache_size("-5GB")


@pytest.mark.parametrize("ours,alias,ours_val,alias_val,getter,expected", [
    ("RESUMEWDS_CACHE_DIR", "WDS_CACHE", "/ours", "/theirs", config.cache_dir, ("/ours", "/theirs")),
    ("RESUMEWDS_CACHE_SIZE", "WDS_CACHE_SIZE", "1MiB", "2000", config.cache_size, (1 << 20, 2000)),
    ("RESUMEWDS_VERBOSE_CACHE", "WDS_VERBOSE_CACHE", "0", "1", config.verbose_cache, (False, True)),
    ("RESUMEWDS_SEED", "WDS_SEED", "7", "9", config.seed, (7, 9)),
])
def test_webdataset_aliases_and_ours_win(monkeypatch, ours, alias, ours_val, alias_val, getter, expected):
    monkeypatch.setenv(alias, alias_val)
    assert getter() == expected[1]
    monkeypatch.setenv(ours, ours_val)
    assert getter() == expected[0]


def test_cache_store_reads_the_aliases(monkeypatch, tmp_path):
    monkeypatch.setenv("WDS_CACHE", str(tmp_path / "wds"))
    monkeypatch.setenv("WDS_CACHE_SIZE", "12345")
    st = ShardStore()
    assert st.cache_dir == str(tmp_path / "wds") and st.cache_size == 12345
    st = ShardStore(cache_dir=str(tmp_path / "arg"), cache_size="1KB")  # arguments win
    assert st.cache_dir == str(tmp_path / "arg") and st.cache_size == 1000
    monkeypatch.setenv("RESUMEWDS_CACHE_SIZE", "abc")
    with pytest.raises(ValueError, match="RESUMEWDS_CACHE_SIZE"):
        ShardStore()


def test_gopen_verbose_logs_each_open_with_url_and_bytes(served, tmp_path, monkeypatch, capfd):
    root, srv = served
    data = make_tar(os.path.join(root, "a.tar"))
    monkeypatch.setenv("GOPEN_VERBOSE", "1")
    cfg = FetchConfig.from_env(**{k: v for k, v in vars(fast_config()).items() if k != "log_opens"})
    assert cfg.log_opens
    fetch_to_file(srv.url + "a.tar", str(tmp_path / "p"), config=cfg)
    err = capfd.readouterr().err
    assert f"[gopen] {srv.url}a.tar open" in err
    assert f"[gopen] {srv.url}a.tar closed: {len(data)} bytes" in err


def test_verbose_cache_prints_downloads_and_evictions(served, tmp_path, monkeypatch, capfd):
    root, srv = served
    datas = [make_tar(os.path.join(root, f"{n}.tar"), seed=i) for i, n in enumerate("ab")]
    monkeypatch.setenv("WDS_VERBOSE_CACHE", "1")
    st = ShardStore(cache_dir=str(tmp_path / "c"), cache_size=len(datas[0]) + 10, fetch=fast_config())
    for n, d in zip("ab", datas):
        st.ensure(shard_for(srv.url + f"{n}.tar", d))
    err = capfd.readouterr().err
    assert f"[cache] fetch_done {srv.url}a.tar ({len(datas[0])} bytes)" in err
    assert f"[cache] evict {srv.url}a.tar" in err


def test_docstring_table_lists_every_variable():
    doc = config.__doc__ or ""
    table = {m.group(1) for m in re.finditer(r"^(RESUMEWDS_[A-Z0-9_]+)\s", doc, re.M)}
    assert table == set(ALL_VARS)
    for alias in ALIASES:
        assert re.search(rf"^RESUMEWDS_[A-Z_]+\s+{alias}\s", doc, re.M), alias


def test_no_other_module_reads_resumewds_variables():
    here = os.path.dirname(config.__file__)
    reads = re.compile(r"(environ(\.get\(|\[)|getenv\()\s*[\"'](RESUMEWDS_|WDS_|GOPEN_)")
    for name in sorted(os.listdir(here)):
        if name.endswith(".py") and name != "config.py":
            with open(os.path.join(here, name)) as f:
                assert not reads.search(f.read()), f"{name} reads a setting from the environment itself"


def test_verbose_is_read_through_config(monkeypatch):
    from resumewds.events import _level_from

    monkeypatch.setenv("RESUMEWDS_VERBOSE", "2")
    assert _level_from(False) == 10
    monkeypatch.setenv("RESUMEWDS_VERBOSE", "loud")
    with pytest.raises(ValueError, match="RESUMEWDS_VERBOSE"):
        _level_from(False)
