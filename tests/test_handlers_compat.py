"""webdataset 1.0.2's handler semantics in the drop-in: a damaged
shard's samples before the damage, ``ignore_and_stop`` under WebLoader, stage errors
recorded like ``on_error="skip"``, webdataset's sample keys, ``"-"`` for stdin.
The real webdataset installed beside resumewds is the reference."""

from __future__ import annotations

import json
import logging
import os
import sqlite3
import subprocess
import sys
import warnings

import pytest
import webdataset as real_wds

import resumewds as rw
from resumewds.synth import write_shards

REPO = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def _truncate(path: str, keep: int) -> None:
    with open(path, "rb") as f:
        data = f.read()
    with open(path, "wb") as f:
        f.write(data[:keep])


def _damaged(tmp_path, shards=3, samples=12):
    paths = write_shards(str(tmp_path / "d"), shards=shards, samples=samples)
    size = os.path.getsize(paths[1])
    _truncate(paths[1], size // 2 + 100)  # inside a member of shard 1
    return paths


def _theirs(paths):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ds = real_wds.WebDataset(paths, handler=real_wds.ignore_and_continue, shardshuffle=False)
        return [(s["__key__"], s.get("bin"), s.get("cls")) for s in ds]


# ---- (a) a damaged shard: the samples before the damage ------------------------------
def test_truncated_shard_yields_the_samples_before_the_damage_like_webdataset(tmp_path, cache_dir):
    paths = _damaged(tmp_path)
    theirs = _theirs(paths)
    ds = rw.WebDataset(paths, handler=rw.ignore_and_continue, shardshuffle=False, cache_dir=cache_dir)
    ours = [(s["__key__"], s["bin"], s["cls"]) for s in ds]
    kept = [k for k, _, _ in ours if k.startswith("s000001")]
    assert 0 < len(kept) < 12
    # every sample we yield is the one webdataset yields, bytes and order; webdataset
    # yields one more sample of shard 1 at most (the one in progress at the damage, partial)
    their_one = [x for x in theirs if x[0].startswith("s000001")]
    assert ours == [x for x in theirs if x not in their_one[len(kept):]]
    assert len(their_one) - len(kept) in (0, 1, 2)
    assert ours[:12] == theirs[:12] and ours[-12:] == theirs[-12:]  # shards 0 and 2 whole


def test_truncated_shard_keeps_its_samples_under_webloader_and_resumes_exactly(tmp_path, cache_dir):
    paths = _damaged(tmp_path)
    def loader(resume, jpath):
        ds = rw.WebDataset(paths, handler=rw.warn_and_continue, shuffle=True, seed=3, cache_dir=cache_dir)
        return rw.WebLoader(ds.to_tuple("__key__"), batch_size=5, num_workers=2, journal=jpath, resume=resume)

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref_ld = loader(False, str(tmp_path / "ref.db"))
        ref = [k for b in ref_ld for k in b[0]]
        ref_ld.close()
        jpath = str(tmp_path / "run.db")
        ld = loader(False, jpath)
        got = []
        for step, b in enumerate(ld):
            got += list(b[0])
            ld.commit(step)
            if step == 3:
                break
        ld.close()
        again = loader(True, jpath)
        for step, b in enumerate(again, start=again.steps_done):
            got += list(b[0])
            again.commit(step)
        again.close()
    assert got == ref and 24 < len(ref) < 36
    assert sum(k.startswith("s000001") for k in ref) > 0


def test_a_checksummed_shard_that_does_not_match_is_skipped_whole(tmp_path, cache_dir):
    paths = write_shards(str(tmp_path / "m"), shards=3, samples=12)
    rw.build_manifest(paths, str(tmp_path / "m" / "manifest.json"))
    _truncate(paths[1], os.path.getsize(paths[1]) // 2 + 100)
    ds = rw.WebDataset(str(tmp_path / "m" / "manifest.json"), handler=rw.ignore_and_continue,
                       cache_dir=cache_dir)
    keys = [s["__key__"] for s in ds]
    assert len(keys) == 24 and not any(k.startswith("s000001") for k in keys)


def test_framed_prefix_of_a_whole_archive_is_none_and_of_garbage_is_none(tmp_path):
    from resumewds.tariterators import framed_prefix

    paths = write_shards(str(tmp_path / "w"), shards=1, samples=4)
    assert framed_prefix(paths[0]) is None  # not damaged: the normal index applies
    junk = tmp_path / "junk.tar"
    junk.write_bytes(b"x" * 2000)
    assert framed_prefix(str(junk)) is None


# ---- (b) ignore_and_stop under WebLoader ends the epoch ----------------------------------
@pytest.mark.parametrize("workers", [0, 2])
def test_ignore_and_stop_under_webloader_ends_the_epoch(tmp_path, cache_dir, workers):
    d = tmp_path / "s"
    paths = write_shards(str(d), shards=3, samples=10)
    rw.build_manifest(paths, str(d / "manifest.json"))
    _truncate(paths[1], os.path.getsize(paths[1]) // 2)  # found when read: size mismatch
    ds = rw.WebDataset(str(d / "manifest.json"), handler=rw.ignore_and_stop, cache_dir=cache_dir)
    # the sample sequence (worker_split="samples"): the stop ends the epoch at the same step for any
    # worker count (under webdataset's shard split it ends the epoch too, at that split's step)
    ld = rw.WebLoader(ds.to_tuple("__key__"), batch_size=4, num_workers=workers, worker_split="samples")
    keys = [k for b in ld for k in b[0]]
    # step 2 reaches shard 1, where the handler says stop: what came before it is delivered
    assert keys == [f"s000000_{i:06d}" for i in range(10)]
    assert (ld.epoch, ld.position) == (1, 0)
    ld.close()


@pytest.mark.parametrize("workers", [0, 2])
def test_a_map_under_ignore_and_stop_ends_the_epoch_instead_of_raising(shards, workers):
    def boom(s):
        if s["__key__"] == "s000001_000003":
            raise ValueError("bad")
        return s

    ds = rw.WebDataset(shards).map(boom, handler=rw.ignore_and_stop).to_tuple("__key__")
    ld = rw.WebLoader(ds, batch_size=8, num_workers=workers, worker_split="samples")  # the one sequence
    keys = [k for b in ld for k in b[0]]
    assert len(keys) == 40 and keys[-1] == "s000001_000002"  # the step with the error is not delivered
    assert ld.epoch == 1
    ld.close()


def _cut_in_member_data(tmp_path):
    import io
    import tarfile

    d = tmp_path / "c"
    d.mkdir()
    for s in range(3):
        with tarfile.open(d / f"s{s}.tar", "w", format=tarfile.USTAR_FORMAT) as tf:
            for i in range(10):
                for ext, data in (("txt", f"k{s}_{i}".encode() * 300), ("cls", str(i).encode())):
                    ti = tarfile.TarInfo(f"k{s}_{i:03d}.{ext}")
                    ti.size = len(data)
                    tf.addfile(ti, io.BytesIO(data))
    p = str(d / "s1.tar")
    _truncate(p, os.path.getsize(p) // 2 + 700)  # inside a member's data: webdataset stops there
    return [str(d / f"s{s}.tar") for s in range(3)]


@pytest.mark.parametrize("workers", [0, 2])
def test_ignore_and_stop_on_damage_found_when_indexing_stops_there_like_webdataset(tmp_path, cache_dir,
                                                                                   workers):
    paths = _cut_in_member_data(tmp_path)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = [s["__key__"] for s in real_wds.WebDataset(paths, handler=real_wds.ignore_and_stop,
                                                            shardshuffle=False)]
    assert theirs[-1].startswith("k1_") and len(theirs) < 20  # webdataset stops in shard 1
    ours = [s["__key__"] for s in rw.WebDataset(paths, handler=rw.ignore_and_stop, cache_dir=cache_dir)]
    assert ours == theirs[:len(ours)] and len(theirs) - len(ours) <= 2 and len(ours) > 10
    ld = rw.WebLoader(rw.WebDataset(paths, handler=rw.ignore_and_stop, cache_dir=cache_dir).to_tuple("__key__"),
                      batch_size=3, num_workers=workers, worker_split="samples")  # the one sequence
    assert [k for b in ld for k in b[0]] == ours and ld.epoch == 1
    ld.close()
    # ignore_and_continue goes on to shard 2, as webdataset does
    cont = [s["__key__"] for s in rw.WebDataset(paths, handler=rw.ignore_and_continue, cache_dir=cache_dir)]
    assert cont == ours + [f"k2_{i:03d}" for i in range(10)]


# ---- (c) a stage error skipped by a handler is recorded like on_error="skip" --------------
def _boom_every_10(s):
    if int(s["__key__"].rsplit("_", 1)[1]) % 10 == 3:
        raise ValueError(f"bad sample {s['__key__']}")
    return s


@pytest.mark.parametrize("workers", [0, 2])
def test_a_skipped_stage_error_is_counted_journaled_and_warned(shards, tmp_path, caplog, workers):
    jpath = str(tmp_path / "j.db")
    ds = rw.WebDataset(shards).map(_boom_every_10, handler=rw.ignore_and_continue).to_tuple("__key__")
    ld = rw.WebLoader(ds, batch_size=8, num_workers=workers, journal=jpath)
    with caplog.at_level(logging.WARNING, logger="resumewds"):
        keys = []
        for step, b in enumerate(ld):
            keys += list(b[0])
            ld.commit(step)
    bad = 5 * 4  # keys ending in 3, 13, 23, 33 in each of 5 shards of 37
    assert len(keys) == 5 * 37 - bad
    st = ld.stats()
    assert st["skipped_samples"] == bad and st["filtered"] == 0
    ld.close()
    with sqlite3.connect(jpath) as db:
        n = db.execute("select count(*) from events where kind = 'sample_skip'").fetchone()[0]
    assert n == bad
    msgs = [r.getMessage() for r in caplog.records if "skipped by a stage's handler" in r.getMessage()]
    assert len(msgs) == 1 and f"{bad} sample(s)" in msgs[0] and "s000000_000003" in msgs[0]


def test_a_datapipeline_map_skip_is_counted_as_skipped(shards):
    p = rw.DataPipeline(rw.SimpleShardList(shards), rw.tarfile_to_samples(),
                        rw.map(_boom_every_10, handler=rw.ignore_and_continue), rw.to_tuple("__key__"))
    assert p.exact
    ld = rw.WebLoader(p, batch_size=8, num_workers=0)
    keys = [k for b in ld for k in b[0]]
    assert len(keys) == 5 * 33 and ld.stats()["skipped_samples"] == 20
    ld.close()
    # direct iteration: the same samples, and ignore_and_stop ends it quietly
    assert [x[0] for x in p] == keys
    stop = rw.DataPipeline(rw.SimpleShardList(shards), rw.tarfile_to_samples(),
                           rw.map(_boom_every_10, handler=rw.ignore_and_stop), rw.to_tuple("__key__"))
    assert len(list(stop)) < 64


# ---- (d) webdataset's sample keys -----------------------------------------------------------
def test_samples_have_webdataset_keys_and_the_positions_stay_readable(shards, cache_dir):
    os.makedirs(cache_dir + "/w")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = next(iter(real_wds.WebDataset(shards, shardshuffle=False, cache_dir=cache_dir + "/w")))
    ours = next(iter(rw.WebDataset(shards, cache_dir=cache_dir)))
    assert set(ours) == set(theirs) == {"__key__", "__url__", "__local_path__", "bin", "cls", "txt"}
    assert len(ours) == len(theirs) and sorted(ours.items())[0][0] == "__key__"
    assert ours["__index__"] == 0 and ours["__epoch__"] == 0 and ours.get("__shard__") == "shard-000000.tar"
    assert "__index__" in ours and ours.copy().get("__index__") is None
    p = rw.DataPipeline(rw.SimpleShardList(shards), rw.tarfile_to_samples())
    assert set(next(iter(p))) == {"__key__", "__url__", "bin", "cls", "txt"}
    # no cache_dir: webdataset still names a local shard's file in __local_path__
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        plain = next(iter(real_wds.WebDataset(shards, shardshuffle=False)))
    mine = next(iter(rw.WebDataset(shards)))
    assert set(mine) == set(plain) and mine["__local_path__"] == plain["__local_path__"] == shards[0]


def test_batches_collate_only_webdataset_keys(shards):
    import torch

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = next(iter(real_wds.WebDataset(shards, shardshuffle=False).batched(4)))
    b = next(iter(rw.WebDataset(shards).batched(4)))
    assert set(b) == set(theirs) == {"__key__", "__url__", "__local_path__", "bin", "cls", "txt"}
    p = rw.DataPipeline(rw.SimpleShardList(shards), rw.tarfile_to_samples(), rw.batched(4))
    assert set(next(iter(p))) == {"__key__", "__url__", "bin", "cls", "txt"}
    dl = torch.utils.data.DataLoader(rw.WebDataset(shards), batch_size=4, num_workers=2)
    assert set(next(iter(dl))) == {"__key__", "__url__", "__local_path__", "bin", "cls", "txt"}
    # WebLoader (resumewds' own loader) keeps them: its batches are documented to carry them
    ld = rw.WebLoader(rw.WebDataset(shards), batch_size=4)
    assert list(next(iter(ld))["__index__"]) == [0, 1, 2, 3]
    ld.close()


# ---- (e) "-": stdin, where webdataset reads it -------------------------------------------------
def test_stdin_dash_in_a_datapipeline_reads_the_tar_on_stdin(shards):
    code = ("import sys, warnings; warnings.simplefilter('ignore'); import {m} as w\n"
            "p = w.DataPipeline(w.SimpleShardList('-'), w.tarfile_to_samples(), w.to_tuple('__key__', 'cls'))\n"
            "print([(k, c.decode()) for k, c in p])")
    env = dict(os.environ, PYTHONPATH=REPO + os.pathsep + os.environ.get("PYTHONPATH", ""))
    out = {}
    for m in ("resumewds", "webdataset"):
        with open(shards[0], "rb") as f:
            r = subprocess.run([sys.executable, "-c", code.format(m=m)], stdin=f, capture_output=True,
                               text=True, env=env, timeout=120)
        assert r.returncode == 0, r.stderr
        out[m] = r.stdout
    assert out["resumewds"] == out["webdataset"] and out["resumewds"].count("s000000_") == 37


def _tgz(path, n):
    import io
    import tarfile

    import numpy as np

    rng = np.random.default_rng(0)
    with tarfile.open(path, "w:gz") as tf:
        for i in range(n):
            for ext, data in (("bin", rng.integers(0, 255, 3000, dtype=np.uint8).tobytes()),
                              ("cls", str(i).encode())):
                ti = tarfile.TarInfo(f"k{i:04d}.{ext}")
                ti.size = len(data)
                tf.addfile(ti, io.BytesIO(data))


def test_a_truncated_tgz_yields_the_samples_before_the_damage(tmp_path, cache_dir):
    path = str(tmp_path / "a.tgz")
    _tgz(path, 20)
    _truncate(path, os.path.getsize(path) // 2)
    theirs = [(k, b) for k, b, _ in _theirs([path])]
    ours = [(s["__key__"], s["bin"]) for s in rw.WebDataset([path], handler=rw.warn_and_continue,
                                                               cache_dir=cache_dir)]
    assert 0 < len(ours) <= len(theirs) <= len(ours) + 2 and ours == theirs[:len(ours)]


def test_a_pipe_cut_short_delivers_its_first_samples_as_webdatasets_test_expects(tmp_path, cache_dir):
    # webdataset's test_dataset_missing_totuple_raises: `pipe:dd ... count=10` of a .tgz under
    # ignore_and_stop gives the first samples, which then fail to_tuple("foo", "bar")
    path = str(tmp_path / "b.tgz")
    _tgz(path, 20)
    url = f"pipe:dd if={path} bs=1024 count=10 2>/dev/null"
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        theirs = [k for k, in real_wds.DataPipeline(real_wds.SimpleShardList(url),
                                                    real_wds.tarfile_to_samples(handler=real_wds.ignore_and_stop),
                                                    real_wds.to_tuple("__key__"))]
    ours = [k for k, in rw.DataPipeline(rw.SimpleShardList(url), rw.tarfile_to_samples(handler=rw.ignore_and_stop),
                                        rw.to_tuple("__key__"))]
    assert 0 < len(ours) <= len(theirs) <= len(ours) + 2 and ours == theirs[:len(ours)]
    again = [k for k, in rw.DataPipeline(rw.SimpleShardList(url), rw.tarfile_to_samples(handler=rw.ignore_and_stop),
                                         rw.to_tuple("__key__"))]
    assert again == ours  # from the cache: the same prefix, the same plan
    with pytest.raises(ValueError):
        list(rw.DataPipeline(rw.SimpleShardList(url), rw.tarfile_to_samples(handler=rw.ignore_and_stop),
                             rw.to_tuple("foo", "bar")))


def test_a_stopping_handler_resumes_to_the_same_stop(tmp_path, cache_dir):
    paths = _cut_in_member_data(tmp_path)

    def loader(jpath, workers):
        ds = rw.WebDataset(paths, handler=rw.ignore_and_stop, shuffle=True, seed=5, cache_dir=cache_dir)
        return rw.WebLoader(ds.to_tuple("__key__"), batch_size=4, num_workers=workers, journal=jpath,
                            resume=True)

    ref_ld = loader(str(tmp_path / "ref.db"), 0)
    ref = [k for b in ref_ld if not isinstance(b, rw.EmptyBatch) for k in b[0]]
    ref_ld.close()
    assert 0 < len(ref) < 27  # the shuffled order reaches the stop before its end
    got = []
    ld = loader(str(tmp_path / "run.db"), 2)
    for step, b in enumerate(ld):
        got += [] if isinstance(b, rw.EmptyBatch) else list(b[0])
        ld.commit(step)
        if step == 1:
            break
    ld.close()
    again = loader(str(tmp_path / "run.db"), 1)
    for step, b in enumerate(again, start=again.steps_done):
        got += [] if isinstance(b, rw.EmptyBatch) else list(b[0])
        again.commit(step)
    assert got == ref and again.epoch == 1
    again.close()


def _boom_every_10_at(r):
    """A stage failing the samples whose number ends in ``r`` (each data set its own ``r``)."""
    def boom(s):
        if int(s["__key__"].rsplit("_", 1)[1]) % 10 == r:
            raise ValueError(f"bad sample {s['__key__']}")
        return s
    return boom


def _want_skips(paths, r):
    return sorted((p, f"s{i:06d}_{j:06d}") for i, p in enumerate(paths) for j in range(37) if j % 10 == r)


def test_two_data_sets_read_together_keep_their_own_skip_events(make_shards, tmp_path):
    """Two data sets with skipping handlers read interleaved in one process: each one's events,
    and each one's journal, hold exactly its own skipped samples."""
    a_paths, b_paths = make_shards(subdir="a"), make_shards(subdir="b")
    a = rw.WebDataset(a_paths).map(_boom_every_10_at(3), handler=rw.ignore_and_continue)
    b = rw.WebDataset(b_paths).map(_boom_every_10_at(7), handler=rw.ignore_and_continue)
    got = {"a": [], "b": []}
    for _ in zip(a, b):  # one sample of each in turn
        got["a"] += a.take_events()
        got["b"] += b.take_events()
    got["a"] += a.take_events()
    got["b"] += b.take_events()
    for name, paths, r in (("a", a_paths, 3), ("b", b_paths, 7)):
        skips = sorted((e["url"], e["key"]) for e in got[name] if e["kind"] == "sample_skip")
        assert skips == _want_skips(paths, r), name

    # a loader with a journal stepped between the samples of a data set read directly
    a = rw.WebDataset(a_paths).map(_boom_every_10_at(3), handler=rw.ignore_and_continue)
    journal = str(tmp_path / "b.db")
    lb = rw.WebLoader(b.to_tuple("__key__"), batch_size=8, num_workers=0, journal=journal)
    it, steps = iter(a), 0
    for step, _ in enumerate(lb):
        next(it), next(it)  # two samples of a between two steps of the loader
        lb.commit(step)
        steps += 1
    lb.close()
    assert len(list(it)) == 5 * 37 - 20 - 2 * steps
    skips = sorted((e["url"], e["key"]) for e in a.take_events() if e["kind"] == "sample_skip")
    assert skips == _want_skips(a_paths, 3)
    with sqlite3.connect(journal) as db:
        rows = db.execute("select url, detail from events where kind = 'sample_skip'").fetchall()
    assert sorted((u, json.loads(d)["key"]) for u, d in rows) == _want_skips(b_paths, 7)
