"""webdataset's worker split (resumewds.wds._shardsplit): the pure layout, and loaders that follow it.

The reference is written out by hand: worker ``w`` reads the epoch's shards
``[w::W]`` front to back, cuts its stream into batches (its last one short,
or dropped), and the DataLoader takes the workers' batches round-robin, a
finished worker dropping out.  Loaders run with real DataLoader workers and
are compared whole, against an uninterrupted run and against webdataset 1.0.2.
"""

from __future__ import annotations

import io
import os
import tarfile
import warnings
from typing import List, Tuple

import pytest
from torch.utils.data import DataLoader

import resumewds
from resumewds.plan import Layout
from resumewds.plan._plan import Plan
from resumewds.read import ShardDataset
from resumewds.wds._shardsplit import ShardSplit, SplitSequence, WorkerStream, split_workers, worker_streams


def reference(counts: List[int], order: List[int], W: int, b: int, drop: bool) -> List[List[Tuple[int, int]]]:
    streams = []
    for w in range(W):
        s = [(sh, j) for sh in order[w::W] for j in range(counts[sh])]
        streams.append([s[i:i + b] for i in range(0, len(s), b) if not drop or len(s[i:i + b]) == b])
    out, r = [], 0
    while any(r < len(x) for x in streams):
        out.extend(x[r] for x in streams if r < len(x))
        r += 1
    return out


@pytest.mark.parametrize("algo", ["none", "shards"])
def test_sequence_is_the_round_robin_of_workers_batches(algo):
    cases = [([5, 1, 3, 0, 7], 2, 2, False), ([5, 1, 3, 0, 7], 3, 4, True), ([4, 4, 4], 2, 3, False),
             ([9], 1, 4, False), ([2, 9, 1, 1, 6, 3], 4, 2, False), ([2, 9, 1, 1, 6, 3], 2, 5, True)]
    for counts, W, b, drop in cases:
        for epoch in range(3):
            ep = Plan(counts, seed=11, shuffle=algo).epoch(epoch)
            ref = reference(counts, list(ep.seg_shard), W, b, drop)
            seq = SplitSequence(ep, W, b, drop)
            assert seq.num_units == len(ref)
            assert [seq.samples_at(range(*seq.unit_range(k))) for k in range(seq.num_units)] == ref
            flat = [p for u in ref for p in u]
            assert seq.end == len(flat) and seq.samples_at(range(seq.end)) == flat
            # a pure function: built again (another process), the same
            assert SplitSequence(Plan(counts, seed=11, shuffle=algo).epoch(epoch), W, b, drop).samples_at(
                range(seq.end)) == flat


def test_uneven_workers_drop_out_of_the_rotation():
    # worker 0: shards 0, 2 (6 + 1 samples); worker 1: shard 1 (2 samples)
    ep = Plan([6, 2, 1], shuffle=False).epoch(0)
    seq = SplitSequence(ep, 2, 2)
    units = [seq.unit_at(k) for k in range(seq.num_units)]
    assert units == [(0, 0), (1, 0), (0, 1), (0, 2), (0, 3)]
    assert [seq.unit_range(k)[1] - seq.unit_range(k)[0] for k in range(seq.num_units)] == [2, 2, 2, 2, 1]


def test_layout_steps_resume_anywhere():
    ep = Plan([5, 3, 4, 2, 6], seed=3, shuffle="shards").epoch(1)
    steps = ShardSplit(3, unit=3).bind(ep)
    total = len(ep)
    n = steps.num_steps(total, 0)
    whole = [steps.slots(total, 0, k) for k in range(n)]
    pos = 0
    for k in range(n):  # from the position after each step: the rest of the same steps
        assert [steps.slots(total, pos, j) for j in range(steps.num_steps(total, pos))] == whole[k:]
        pos = steps.position_after(total, pos, 0)
    assert pos == total and steps.num_steps(total, pos) == 0


def test_windowed_shuffle_keeps_each_worker_in_its_shards():
    ep = Plan([7] * 10, seed=5, shuffle=True, window=3).epoch(2)
    streams = worker_streams(ep, 3)
    order = list(ep.seg_shard)
    for w, s in enumerate(streams):
        got = s.samples_at(range(len(s)))
        assert sorted(got) == sorted((sh, j) for sh in order[w::3] for j in range(7))
        assert got != sorted(got, key=lambda p: (order.index(p[0]), p[1]))  # shuffled within its windows


def test_worker_stream_is_one_workers_part():
    ep = Plan([3, 2, 4, 1], shuffle=False).epoch(0)
    b = WorkerStream(2, 1, Layout(4)).bind(ep)
    assert b.sequence.samples_at(range(len(b.sequence))) == [(1, 0), (1, 1), (3, 0)]


# ---- loaders, with real DataLoader workers ----------------------------------------
def _shards(root: str, sizes: List[int]) -> str:
    os.makedirs(root, exist_ok=True)
    for s, n in enumerate(sizes):
        with tarfile.open(os.path.join(root, f"s-{s:06d}.tar"), "w") as tf:
            for i in range(n):
                for ext, data in (("cls", str(s * 100 + i).encode()), ("txt", f"{s}/{i}".encode())):
                    ti = tarfile.TarInfo(f"k{s:02d}_{i:03d}.{ext}")
                    ti.size = len(data)
                    tf.addfile(ti, io.BytesIO(data))
    return os.path.join(root, f"s-{{000000..{len(sizes) - 1:06d}}}.tar")


SIZES = [7, 3, 9, 5, 4]  # uneven: the workers' partial batches fall in the middle of the epoch


def _keys(batch) -> Tuple[str, ...]:
    return tuple(x.decode() if isinstance(x, bytes) else str(x) for x in batch[1])


def _batches(mod, urls, workers, **kw):
    ds = mod.WebDataset(urls, shardshuffle=False, **kw).to_tuple("cls", "txt").batched(4)
    return [_keys(b) for b in mod.WebLoader(ds, batch_size=None, num_workers=workers)]


def test_webloader_matches_webdataset_with_two_workers(tmp_path):
    import webdataset

    urls = _shards(str(tmp_path / "d"), SIZES)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = _batches(webdataset, urls, 2)
    got = _batches(resumewds, urls, 2)
    assert got == ref and len(got) == 7  # 5 + 2 batches of the workers (20 and 8 samples)


def test_torch_dataloader_matches_webdataset_with_two_workers(tmp_path):
    import webdataset

    urls = _shards(str(tmp_path / "d"), SIZES)

    def run(mod):
        ds = mod.WebDataset(urls, shardshuffle=False).to_tuple("cls", "txt")
        return [tuple(b[1]) for b in DataLoader(ds, batch_size=4, num_workers=2)]

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        assert run(resumewds) == run(webdataset)


def test_worker_split_samples_keeps_the_sample_sequence(tmp_path):
    urls = _shards(str(tmp_path / "d"), SIZES)
    assert _batches(resumewds, urls, 2, worker_split="samples") == _batches(resumewds, urls, 0)
    assert _batches(resumewds, urls, 2) != _batches(resumewds, urls, 0)


@pytest.mark.parametrize("after", [2, 3, 0])
def test_resume_across_worker_counts(tmp_path, after):
    urls = _shards(str(tmp_path / "d"), SIZES)
    ds = resumewds.WebDataset(urls, shardshuffle=10, seed=4).to_tuple("cls", "txt").batched(4)
    full = []
    loader = resumewds.WebLoader(ds, batch_size=None, num_workers=2)
    for _ in range(2):  # two epochs
        full.extend(_keys(b) for b in loader)
    first = resumewds.WebLoader(ds, batch_size=None, num_workers=2)
    got, it = [], iter(first)
    for _ in range(3):
        got.append(_keys(next(it)))
    state = first.state_dict()
    assert state["config"]["worker_split"] == 2
    del it
    again = resumewds.WebLoader(ds, batch_size=None, num_workers=after)
    again.load_state_dict(state)
    for _ in range(2):
        got.extend(_keys(b) for b in again)
    assert got[:len(full)] == full[:len(got)] and len(got) >= len(full)


def test_a_worker_without_shards_raises_as_in_webdataset(tmp_path):
    urls = _shards(str(tmp_path / "d"), [3, 3])
    ds = resumewds.WebDataset(urls, shardshuffle=False).batched(2)
    with pytest.raises(ValueError, match="fewer shards than workers"):
        list(resumewds.WebLoader(ds, batch_size=None, num_workers=3))
    with pytest.raises(Exception, match="fewer shards than workers"):
        list(DataLoader(resumewds.WebDataset(urls, shardshuffle=False), batch_size=2, num_workers=3))
    ok = resumewds.WebDataset(urls, shardshuffle=False, empty_check=False).batched(2)
    assert sum(len(b["__key__"]) for b in resumewds.WebLoader(ok, batch_size=None, num_workers=3)) == 6


def test_torch_and_loader_and_direct_agree_on_one_worker_stream(tmp_path):
    urls = _shards(str(tmp_path / "d"), SIZES)
    ds = resumewds.WebDataset(urls, shardshuffle=False).to_tuple("cls", "txt")
    direct = [_keys(b) for b in DataLoader(ds, batch_size=4, num_workers=2)]
    loader = [_keys(b) for b in resumewds.WebLoader(ds, batch_size=4, num_workers=2)]
    assert direct == loader and len(direct) == 7


_DRIVER = r"""
import os, signal, sys
import resumewds
urls, db, out, workers, kill_at = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5])
ds = resumewds.WebDataset(urls, shardshuffle=10, seed=9).to_tuple("cls", "txt").batched(4)
loader = resumewds.WebLoader(ds, batch_size=None, num_workers=workers, journal=db, resume=True)
with open(out, "a") as f:
    for step, b in enumerate(loader, start=loader.steps_done):
        if step == kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        f.write(f"{step} {','.join(x.decode() for x in b[1])}\n")
        f.flush()
        loader.commit(step)
"""


@pytest.mark.slow  # the split across worker counts: test_resume_across_worker_counts (default run)
def test_kill9_resume_with_other_workers_keeps_the_split(tmp_path, after=3):
    import signal
    import subprocess
    import sys

    from tests.conftest import subprocess_env

    urls = _shards(str(tmp_path / "d"), SIZES)

    def drive(name, workers, kill_at):
        return subprocess.run([sys.executable, "-c", _DRIVER, urls, str(tmp_path / f"{name}.db"),
                               str(tmp_path / f"{name}.txt"), str(workers), str(kill_at)],
                              env=subprocess_env(), capture_output=True, text=True, timeout=300)

    assert drive("full", 2, -1).returncode == 0
    killed = drive("cut", 2, 3)
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    resumed = drive("cut", after, -1)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    full = (tmp_path / "full.txt").read_text().splitlines()
    got = (tmp_path / "cut.txt").read_text().splitlines()
    assert got == full
    # the uninterrupted run is webdataset's order: each worker its shards, batches round-robin
    ep = resumewds.WebDataset(urls, shardshuffle=10, seed=9).plan.epoch(0)
    units = reference(SIZES, list(ep.seg_shard), 2, 4, False)
    assert [line.split()[1] for line in full] == [",".join(f"{s}/{j}" for s, j in u) for u in units]


def test_the_rule_picks_webdatasets_split_only_for_webdatasets_forms(tmp_path):
    urls = _shards(str(tmp_path / "d"), SIZES)
    W = resumewds.WebDataset
    assert W(urls, shardshuffle=False).split_workers(2) == 2          # webdataset's form
    assert W(urls, shardshuffle=False).split_workers(1) == 0          # one worker: nothing to split
    assert W(urls, shardshuffle=False).split_workers(2, world_size=2) == 0  # several ranks
    assert W(urls, shuffle=True).split_workers(2) == 0                # resumewds's own order asked for
    assert W(urls, resampled=True).split_workers(2) == 0
    assert W(urls, shardshuffle=False, workersplitter=None).split_workers(2) == 0
    assert W(urls, shardshuffle=False, worker_split="samples").split_workers(2) == 0
    assert W(urls, shuffle=True, worker_split="shards").split_workers(3) == 3
    assert split_workers(ShardDataset(urls), 2, 1) == 0  # the engine's own data set: no shard split
    with pytest.raises(ValueError, match="worker_split"):
        W(urls, worker_split="shard")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        p = resumewds.DataPipeline(resumewds.SimpleShardList(urls), resumewds.split_by_worker,
                                   resumewds.tarfile_to_samples())
        q = resumewds.DataPipeline(resumewds.SimpleShardList(urls), resumewds.tarfile_to_samples())
    assert p.split_workers(2) == 2 and q.split_workers(2) == 0
    loader = resumewds.WebLoader(W(urls, shardshuffle=False).batched(4), batch_size=None, num_workers=2,
                                 worker_split="samples")
    assert "worker_split" not in loader.state_dict()["config"]


def test_a_world_found_late_takes_the_sample_split(tmp_path, monkeypatch):
    urls = _shards(str(tmp_path / "d"), SIZES)
    monkeypatch.delenv("RANK", raising=False)
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    loader = resumewds.WebLoader(resumewds.WebDataset(urls, shardshuffle=False).batched(4), batch_size=None,
                                 num_workers=2)
    assert isinstance(loader.layout, ShardSplit) and loader.config["worker_split"] == 2
    monkeypatch.setenv("RANK", "0")  # a framework set the processes up after the loader was built
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert len(loader) == 4  # 28 samples, 2 ranks, batches of 4: the sample split's steps
    assert isinstance(loader.layout, Layout) and "worker_split" not in loader.config
