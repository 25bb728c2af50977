"""Shard lists and ``detshuffle`` as standalone classes: webdataset 1.0.2's semantics,
checked against the real webdataset installed beside resumewds."""

from __future__ import annotations

import multiprocessing as mp
import os
import time
import warnings
from pathlib import Path

import pytest
import webdataset as real_wds
import webdataset.shardlists as real_shardlists

import resumewds as wds
from resumewds import shardlists

URLS = [f"http://127.0.0.1/shard-{i:03d}.tar" for i in range(17)]


# ---- SimpleShardList / ResampledShards / expand_source ------------------------------
def test_simple_shard_list_order_and_seeded_order_match_webdataset():
    for seed in (None, 0, 3):
        ours = [d["url"] for d in shardlists.SimpleShardList(URLS, seed)]
        theirs = [d["url"] for d in real_shardlists.SimpleShardList(URLS, seed)]
        assert ours == theirs
    s = shardlists.SimpleShardList("a-{0..3}.tar::b.tar")
    assert s.urls == ["a-0.tar", "a-1.tar", "a-2.tar", "a-3.tar", "b.tar"] and s.seed is None


def test_resampled_shards_deterministic_draws_match_webdataset_epoch_by_epoch():
    ours = shardlists.ResampledShards(URLS, nshards=50, seed=7, worker_seed=lambda: 1, deterministic=True)
    theirs = real_shardlists.ResampledShards(URLS, nshards=50, seed=7, worker_seed=lambda: 1,
                                             deterministic=True)
    assert ours.epoch == theirs.epoch == -1
    for epoch in range(3):
        a, b = [d["url"] for d in ours], [d["url"] for d in theirs]
        assert a == b and len(a) == 50 and ours.epoch == epoch
    # with replacement: 50 draws from 17 urls repeat some
    assert len(set(a)) < 50


def test_resampled_shards_default_worker_seed_and_nondeterministic_runs():
    rs = shardlists.ResampledShards(URLS, nshards=40)
    assert rs.worker_seed() == 0 and rs.deterministic is False
    first = [d["url"] for d in rs]
    again = [d["url"] for d in shardlists.ResampledShards(URLS, nshards=40)]
    assert len(first) == 40 and set(first) <= set(URLS)
    assert first != again  # pid, time and urandom in the seed, as in webdataset
    with pytest.raises(ValueError, match="no shards found"):
        shardlists.ResampledShards([])


def test_expand_source_takes_lists_strings_and_iterables_like_webdataset():
    gen = (u for u in URLS)
    assert shardlists.expand_source(gen, max_urls=4) == real_shardlists.expand_source(iter(URLS), max_urls=4)
    assert shardlists.expand_source("x-{0..2}.tar") == ["x-0.tar", "x-1.tar", "x-2.tar"]
    assert shardlists.expand_source(URLS, max_urls=3) == URLS  # a list is taken whole, as there
    with pytest.raises(ValueError, match="cannot handle"):
        shardlists.expand_source(42)  # type: ignore[arg-type]


# ---- detshuffle -----------------------------------------------------------------------
def test_detshuffle_matches_webdataset_and_changes_per_epoch():
    ours, theirs = wds.detshuffle(10, seed=4), real_wds.detshuffle(10, seed=4)
    for epoch in range(3):
        a = list(ours(iter(range(300))))
        b = list(theirs.run(iter(range(300))))
        assert a == b and sorted(a) == list(range(300)) and ours.epoch == epoch


def test_detshuffle_in_a_generic_pipeline_as_webdataset_test_expects():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        p1 = wds.DataPipeline(wds.SimpleShardList("{000000..000199}"), wds.detshuffle(10))
        p2 = wds.DataPipeline(wds.SimpleShardList("{000000..000199}"), wds.detshuffle(10))
    r1, r2 = list(p1), list(p2)
    assert r1 == r2 and r1 != [{"url": f"{i:06d}"} for i in range(200)]
    r22 = list(p2)
    assert r22 != r2 and list(p1) == r22 and p2.stage(1).epoch == 1


# ---- DirectoryShardList ------------------------------------------------------------------
def _touch(d: Path, names, t0: float = 1_000_000.0):
    for i, n in enumerate(names):
        p = d / n
        p.touch()
        os.utime(p, (t0 + i, t0 + i))


def test_directory_shard_list_oldest_unlink_claims_renames_and_deletes(tmp_path):
    d = str(tmp_path) + "/"
    _touch(tmp_path, [f"f{i}.tar" for i in (3, 1, 4, 0, 2)])  # mtime order: f3 f1 f4 f0 f2
    ds = shardlists.DirectoryShardList(d, pattern="*.tar", select="oldest", mode="unlink", poll=None)
    it = iter(ds)
    first = next(it)["url"]
    assert first == d + f"f3.tar._{os.getpid()}_" and os.path.exists(first)
    rest = [x["url"] for x in it]
    assert [os.path.basename(u).split("._")[0] for u in rest] == ["f1.tar", "f4.tar", "f0.tar", "f2.tar"]
    assert os.listdir(d) == []


def test_directory_shard_list_keep_and_resample_modes(tmp_path):
    d = str(tmp_path) + "/"
    _touch(tmp_path, ["a.tar", "b.tgz", "c.txt"])
    kept = [x["url"] for x in shardlists.DirectoryShardList(d, mode="keep", poll=None)]
    # the default pattern "*.{tar,tgz,tar.tgz}" (braces expanded): both shards, not c.txt
    assert len(kept) == 2
    assert sorted(os.listdir(d)) == ["a.tar._done_", "b.tgz._done_", "c.txt"]
    _touch(tmp_path, ["x.tar"])
    ds = shardlists.DirectoryShardList(d, pattern="*.tar", mode="resample", poll=None)
    it = iter(ds)
    for _ in range(3):  # resample puts it back: the same file again and again
        assert next(it)["url"] == d + f"x.tar._{os.getpid()}_"
    it.close()
    with pytest.raises(ValueError, match="must end with '/'"):
        shardlists.DirectoryShardList(str(tmp_path))
    with pytest.raises(ValueError, match="unknown selection strategy"):
        shardlists.DirectoryShardList(d, select="newest")


def test_directory_shard_list_recycles_shards_of_dead_processes(tmp_path):
    d = str(tmp_path) + "/"
    proc = mp.get_context("fork").Process(target=time.sleep, args=(0,))
    proc.start()
    proc.join()
    dead = proc.pid
    _touch(tmp_path, [f"z.tar._{dead}_", f"y.tar._{os.getpid()}_"])
    ds = shardlists.DirectoryShardList(d, pattern="*.tar", mode="resample", poll=None)
    ds.cleanup_files_without_processes()
    assert sorted(os.listdir(d)) == [f"y.tar._{os.getpid()}_", "z.tar"]  # ours (alive) stays claimed


def test_directory_shard_list_poll_waits_for_files_and_times_out(tmp_path):
    d = str(tmp_path) + "/"
    ds = shardlists.DirectoryShardList(d, pattern="*.tar", mode="unlink", poll=0.01, timeout=0.3)
    t0 = time.monotonic()
    assert list(ds) == []
    assert time.monotonic() - t0 >= 0.25


def _consume(d: str, out) -> None:
    ds = shardlists.DirectoryShardList(d, pattern="*.tar", mode="unlink", poll=None)
    for x in ds:
        out.put(os.path.basename(x["url"]).split("._")[0])
        time.sleep(0.002)
    out.put(None)


def test_directory_shard_list_two_processes_share_a_directory_without_duplicates(tmp_path):
    d = str(tmp_path) + "/"
    names = [f"s{i:03d}.tar" for i in range(60)]
    _touch(tmp_path, names)
    ctx = mp.get_context("fork")
    q = ctx.Queue()
    procs = [ctx.Process(target=_consume, args=(d, q)) for _ in range(2)]
    for p in procs:
        p.start()
    got, done = [], 0
    while done < 2:
        x = q.get(timeout=60)
        if x is None:
            done += 1
        else:
            got.append(x)
    for p in procs:
        p.join(timeout=30)
    assert sorted(got) == names  # every shard once, none twice
    assert os.listdir(d) == []


def test_directory_shard_list_in_a_datapipeline_runs_as_webdataset_not_exact(tmp_path):
    import io
    import tarfile

    d = str(tmp_path) + "/"
    for s in range(3):
        with tarfile.open(tmp_path / f"s{s}.tar", "w") as tf:
            for j in range(4):
                data = f"{s}-{j}".encode()
                ti = tarfile.TarInfo(f"k{s}_{j}.txt")
                ti.size = len(data)
                tf.addfile(ti, io.BytesIO(data))
    with pytest.warns(UserWarning, match="cannot see through"):
        p = wds.DataPipeline(shardlists.DirectoryShardList(d, pattern="*.tar", mode="keep", poll=None),
                             wds.tarfile_to_samples(), wds.to_tuple("txt"))
    assert not p.exact and p.state_dict()["exact"] is False
    got = sorted(x[0].decode() for x in p)
    assert got == sorted(f"{s}-{j}" for s in range(3) for j in range(4))


# ---- MultiShardSample / shardspec ---------------------------------------------------------
def test_multi_shard_sample_yaml_spec_matches_webdataset(tmp_path, monkeypatch):
    monkeypatch.setenv("ALLOW_OBSOLETE", "1")  # webdataset 1.0.2 refuses the class without it; ours does not
    spec = tmp_path / "spec.yaml"
    spec.write_text("prefix: /data/\ndatasets:\n"
                    "  - name: a\n    shards: a-{000..009}.tar\n    choose: 4\n"
                    "  - name: b\n    shards: [\"b-{0..2}.tar\"]\n    resample: 5\n"
                    "  - name: c\n    shards: c.tar\n")
    ours = wds.shardspec(str(spec))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = real_shardlists.MultiShardSample(str(spec))
    for seed in (0, 1):
        ours.set_epoch(seed)
        theirs.set_epoch(seed)
        a, b = [x["url"] for x in ours], [x["url"] for x in theirs]
        assert a == b and len(a) == 4 + 5 + 1
    with pytest.raises(ValueError, match="only one of perepoch or choose"):
        shardlists.MultiShardSample({"datasets": [{"shards": "a-{0..3}.tar", "choose": 2, "resample": 2}]})


def test_a_pipeline_stage_object_runs_through_its_run_method():
    class Every(wds.PipelineStage):
        def __init__(self, k):
            self.k = k

        def run(self, src):
            return (x for i, x in enumerate(src) if i % self.k == 0)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        p = wds.DataPipeline(wds.SimpleShardList("s-{0..9}.tar"), Every(3))
    assert [x["url"] for x in p] == ["s-0.tar", "s-3.tar", "s-6.tar", "s-9.tar"]
    from resumewds.pipeline import DataPipeline  # webdataset.pipeline's name

    assert DataPipeline is wds.DataPipeline


# ---- filters' webdataset helpers -------------------------------------------------------
def test_associate_and_transform_with_match_webdataset(shards):
    extra = {"s000000_000001": {"note": b"x"}}
    ours = wds.DataPipeline(wds.SimpleShardList(shards), wds.tarfile_to_samples(), wds.associate(extra),
                            wds.to_tuple("__key__", "note", missing_is_error=False))
    theirs = real_wds.DataPipeline(real_wds.SimpleShardList(shards), real_wds.tarfile_to_samples(),
                                   real_wds.associate(extra),
                                   real_wds.to_tuple("__key__", "note", missing_is_error=False))
    assert ours.exact  # a function of the key: compiled like map
    assert list(ours) == list(theirs)
    assert wds.transform_with((1, "a", 3), [str, None]) == real_wds.transform_with((1, "a", 3), [str, None])
    assert wds.filters.parse_field_spec("jpg;png cls") == real_wds.filters.parse_field_spec("jpg;png cls")


def test_resampled_shard_dicts_are_opened_again_by_tarfile_samples(shards):
    # resampled() yields the same {"url": ...} dict several times; each is a fresh read, as in webdataset
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        p = wds.DataPipeline(wds.SimpleShardList(shards[:1]), wds.resampled(4), wds.tarfile_samples,
                             wds.to_tuple("__key__"))
        theirs = real_wds.DataPipeline(real_wds.SimpleShardList(shards[:1]), real_wds.resampled(4),
                                       real_wds.tarfile_samples, real_wds.to_tuple("__key__"))
        assert not p.exact
        assert list(p) == list(theirs) and len(list(p)) == 4 * 37
