"""Torch conventions: WebDataset is a torch IterableDataset
(without ``import resumewds`` importing torch), a plain DataLoader gives each worker
its share, torchdata's real StatefulDataLoader resumes exactly, get_state/set_state
live in a torch checkpoint, and WebLoader's fluent re-mixing chain resumes exactly.
"""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset

import resumewds as wds
from conftest import subprocess_env

pytestmark = pytest.mark.usefixtures("cache_dir")


def test_iterable_dataset_without_importing_torch_first():
    code = ("import sys, resumewds as wds\n"
            "assert 'torch' not in sys.modules\n"
            "ds = wds.WebDataset('x.tar')\n"
            "import torch.utils.data as tud\n"
            "print(isinstance(ds, tud.IterableDataset), issubclass(wds.WebDataset, tud.IterableDataset))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         env=subprocess_env(), check=True)
    assert out.stdout.split() == ["True", "True"]
    assert isinstance(wds.WebDataset("x.tar"), IterableDataset)


@pytest.mark.parametrize("workers", [0, 2, 3])
def test_plain_dataloader_each_worker_takes_its_share(shards, workers):
    ds = wds.WebDataset(shards, shardshuffle=True, seed=4).decode().to_tuple("__key__", "cls")
    dl = DataLoader(ds, batch_size=7, num_workers=workers)
    keys = [k for b in dl for k in b[0]]
    assert sorted(keys) == sorted(s["__key__"] for s in wds.WebDataset(shards))
    assert len(keys) == len(set(keys)) == 5 * 37
    # a dataset batched like the DataLoader's batches: webdataset's order (each worker its own
    # shards of the epoch's shard order, its batches round-robin); in one process the global order
    bds = wds.WebDataset(shards, shardshuffle=True, seed=4).to_tuple("__key__").batched(7)
    got = [k for b in DataLoader(bds, batch_size=None, num_workers=workers) for k in b[0]]
    order = [s["__key__"] for s in wds.WebDataset(shards, shardshuffle=True, seed=4)]
    assert got == _shard_split(order, max(1, workers), 7)


def _shard_split(keys, W, b):
    """webdataset's split_by_worker of an epoch whose samples are ``keys`` (shard by shard)."""
    by_shard = {}
    for k in keys:
        by_shard.setdefault(k.split("_")[0], []).append(k)
    shards = list(by_shard.values())
    batches = []
    for w in range(W):
        stream = [k for sh in shards[w::W] for k in sh]
        batches.append([stream[i:i + b] for i in range(0, len(stream), b)])
    out, r = [], 0
    while any(r < len(x) for x in batches):
        out += [k for x in batches if r < len(x) for k in x[r]]
        r += 1
    return out


def test_workersplitter_none_duplicates_like_webdataset(shards):
    ds = wds.WebDataset(shards[:1], workersplitter=None).to_tuple("__key__")
    keys = [k for b in DataLoader(ds, batch_size=5, num_workers=2) for k in b[0]]
    assert len(keys) == 2 * 37 and len(set(keys)) == 37


def test_custom_workersplitter_gets_the_shard_list(shards):
    def odd_shards(src):
        for i, d in enumerate(src):
            if i % 2:
                yield d

    ds = wds.WebDataset(shards, workersplitter=odd_shards).to_tuple("__shard__")
    names = {n for b in DataLoader(ds, batch_size=4, num_workers=0) for n in b[0]}
    assert names == {"shard-000001.tar", "shard-000003.tar"}


def _stateful(make, workers, stop, epochs=2, batch_size=4):
    from torchdata.stateful_dataloader import StatefulDataLoader

    def rows(batch):
        return [tuple(x.tolist()) if hasattr(x, "tolist") else tuple(x) for x in batch]

    ref = []
    dl = StatefulDataLoader(make(), batch_size=batch_size, num_workers=workers)
    for _ in range(epochs):
        ref += [rows(b) for b in dl]
    got = []
    dl = StatefulDataLoader(make(), batch_size=batch_size, num_workers=workers)
    it = iter(dl)
    for _ in range(stop):
        got.append(rows(next(it)))
    state = dl.state_dict()
    del it
    dl2 = StatefulDataLoader(make(), batch_size=batch_size, num_workers=workers)
    dl2.load_state_dict(state)
    got += [rows(b) for b in dl2]
    return ref, got


@pytest.mark.parametrize("workers,stop", [(0, 7), (2, 5), (3, 17)])
def test_stateful_dataloader_resumes_exactly(shards, workers, stop):
    pytest.importorskip("torchdata.stateful_dataloader")

    def make():
        return (wds.WebDataset(shards, shardshuffle=100, seed=9).shuffle(40)
                .decode().to_tuple("__index__", "cls"))

    ref, got = _stateful(make, workers, stop, epochs=1)
    assert got == ref and len(ref) > stop


def test_stateful_dataloader_resampled_with_epoch(shards):
    pytest.importorskip("torchdata.stateful_dataloader")

    def make():
        return (wds.WebDataset(shards, resampled=True, seed=1).shuffle(30)
                .decode().to_tuple("__epoch__", "__index__").with_epoch(60))

    ref, got = _stateful(make, 2, 4, epochs=1, batch_size=5)
    assert got == ref and len(ref) == 2 * 60 // 5  # with_epoch counts per worker, as in webdataset


def test_get_state_set_state_in_a_torch_checkpoint(shards, tmp_path):
    def make():
        return wds.WebDataset(shards, shardshuffle=True, seed=2).shuffle(20).to_tuple("__key__").batched(6)

    ref = [b[0] for b in make()]
    ds = make()
    it = iter(ds)
    got = [next(it)[0] for _ in range(9)]
    torch.save({"model": {"w": torch.zeros(2)}, "data": ds.get_state(), "step": 9}, tmp_path / "ck.pt")
    ck = torch.load(tmp_path / "ck.pt", weights_only=True)
    fresh = make()
    fresh.set_state(ck["data"])
    got += [b[0] for b in fresh]
    assert got == ref
    with pytest.raises(wds.StateError):
        wds.WebDataset(shards, seed=3).load_state_dict(ck["data"])


# ---- item 4: WebLoader's fluent re-mixing chain ----------------------------------------
@pytest.mark.parametrize("w1,w2", [(2, 0), (0, 3)])
def test_webloader_remix_chain_resumes_exactly(shards, w1, w2):
    def make(workers):
        ds = wds.WebDataset(shards, shardshuffle=100, seed=6).decode().to_tuple("__key__", "cls")
        return (wds.WebLoader(ds, batch_size=None, num_workers=workers)
                .unbatched().shuffle(50).batched(8).with_epoch(9))

    a = make(0)
    ref = [tuple(b[0]) for _ in range(4) for b in a]  # 36 batches: over 1.5 epochs
    assert all(len(b) == 8 for b in ref[:20]) and len(ref) == 36
    flat = [k for b in ref[:24] for k in b]  # epoch 0: 23 batches of 8 and one of 1
    assert len(flat) == 185 and sorted(flat) == sorted(s["__key__"] for s in wds.WebDataset(shards))
    assert flat != sorted(flat)
    a = make(w1)
    got = [tuple(b[0]) for b in a]
    it = iter(a)
    got += [tuple(next(it)[0]) for _ in range(4)]
    state = a.state_dict()
    del it
    b = make(w2)
    b.load_state_dict(state)
    while len(got) < len(ref):
        got += [tuple(x[0]) for x in b]
    assert got == ref


def test_webloader_repeat_and_unbatched(shards):
    ds = wds.WebDataset(shards[:2], shardshuffle=False).decode().to_tuple("cls")
    assert sum(len(b[0]) for b in wds.WebLoader(ds, num_workers=2, batch_size=3).repeat(nepochs=2)) == 148
    assert sum(1 for _ in wds.WebLoader(ds, num_workers=2, batch_size=3).unbatched()) == 74


def test_handler_skips_under_webloader_reach_stats_and_journal(shards, tmp_path):
    def boom(s):
        if s["__index__"] % 7 == 3:
            raise ValueError("bad sample")
        return s

    def make(workers, **kw):
        ds = wds.WebDataset(shards[:2], shardshuffle=True, seed=1).map(boom, handler=wds.ignore_and_continue)
        return wds.WebLoader(ds.to_tuple("__key__"), batch_size=8, num_workers=workers, **kw)

    assert len([k for b in make(0) for k in b[0]]) == 74 - len([i for i in range(74) if i % 7 == 3])
    ref = [k for b in make(2) for k in b[0]]  # webdataset's split over 2 workers: a resume keeps it
    a = make(2, journal=str(tmp_path / "run.db"))
    got = []
    for step, b in enumerate(a):
        got += b[0]
        a.commit(step)
        if step == 4:
            break
    a.close()
    b = make(1, journal=str(tmp_path / "run.db"), resume=True)
    got += [k for x in b for k in x[0]]
    b.close()
    assert got == ref
    from resumewds.journal import Journal

    with Journal(str(tmp_path / "run.db")) as j:
        kinds = [e["kind"] for e in j.events()]
    assert kinds.count("sample_skip") >= 5
