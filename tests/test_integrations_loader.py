"""WebLoader where a framework expects a torch DataLoader: its attributes and an epoch-sized len()."""

from __future__ import annotations

import subprocess
import sys

import pytest

import resumewds as rw
from conftest import N_SAMPLES, N_SHARDS

TOTAL = N_SHARDS * N_SAMPLES  # 185


def test_dataloader_attributes(make_shards):
    ds = rw.WebDataset(make_shards(), seed=3, shuffle=True)
    loader = rw.WebLoader(ds, batch_size=8, num_workers=2, timeout=30, persistent_workers=True)
    assert loader.sampler is None and loader.batch_sampler is None and loader.generator is None
    assert loader.dataset is ds and loader.batch_size == 8 and loader.num_workers == 2
    assert loader.drop_last is False and loader.collate_fn is not None
    assert (loader.timeout, loader.persistent_workers, loader.prefetch_factor) == (30, True, 2)
    assert (loader.pin_memory, loader.worker_init_fn, loader.multiprocessing_context) == (False, None, None)
    plain = rw.WebLoader(ds, batch_size=8, drop_last=True)
    assert plain.drop_last is True and plain.prefetch_factor is None and plain.timeout == 0
    assert rw.WebLoader(ds, batch_size=None).collate_fn is None


@pytest.mark.parametrize("batch,remainder,whole", [(8, "keep", -(-TOTAL // 8)), (8, "drop", TOTAL // 8),
                                                   (None, "keep", TOTAL)])
def test_len_is_a_whole_epoch_at_any_position(make_shards, batch, remainder, whole):
    """len() does not shrink as the epoch goes (Lightning reads it after loading a state)."""
    ds = rw.WebDataset(make_shards(), seed=3, shuffle=True)
    loader = rw.WebLoader(ds, batch_size=batch, remainder=remainder)
    assert len(loader) == loader.batches_left == whole
    it = iter(loader)
    for _ in range(5):
        next(it)
    state = loader.state_dict()
    fresh = rw.WebLoader(rw.WebDataset(make_shards(), seed=3, shuffle=True), batch_size=batch, remainder=remainder)
    fresh.load_state_dict(state)
    assert len(fresh) == whole and fresh.batches_left == whole - 5
    assert sum(1 for _ in fresh) == whole - 5


def test_two_ranks_len_is_this_ranks_share(make_shards):
    ds = rw.WebDataset(make_shards(), seed=3)
    loader = rw.WebLoader(ds, batch_size=8, rank=1, world_size=2)
    assert len(loader) == -(-TOTAL // 16)
    assert sum(1 for _ in loader) == len(loader)


def test_integrations_import_no_framework():
    """``import resumewds`` and ``resumewds.integrations`` load no framework."""
    code = ("import sys, resumewds, resumewds.integrations; "
            "bad = [m for m in ('lightning', 'pytorch_lightning', 'accelerate', 'transformers') if m in sys.modules]; "
            "assert not bad, bad")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)



def keys_of(loader) -> list:
    return [k for batch in loader for k in batch[0]]


def test_a_world_set_up_after_the_loader_was_built(make_shards, monkeypatch, tmp_path):
    """Built with no world (Lightning's DDP sets rank 0's up inside fit): len and the first
    iteration take the world of then, and it stays after the first iteration; a loader given
    rank / world_size keeps it; one holding a journal opened as the only rank refuses to change."""
    def loader(**kw):
        return rw.WebLoader(rw.WebDataset(make_shards(), seed=3).to_tuple("__key__"), batch_size=8, **kw)

    late, fixed, journaled = loader(), loader(rank=0, world_size=1), loader(journal=str(tmp_path / "j.db"))
    assert len(late) == -(-TOTAL // 8)
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    assert len(late) == -(-TOTAL // 16) and (late.rank, late.world_size) == (1, 2)
    assert keys_of(late) == keys_of(loader(rank=1, world_size=2))
    monkeypatch.setenv("WORLD_SIZE", "4")
    assert len(late) == -(-TOTAL // 16) and late.world_size == 2  # iterated: the world stays
    assert len(fixed) == -(-TOTAL // 8) and len(keys_of(fixed)) == TOTAL
    with pytest.raises(ValueError, match="opened its journal .*j.db as the only rank, and now runs as rank 1 of 4"):
        next(iter(journaled))


def keep(sample) -> bool:
    return sample["__index__"] % 4 != 1


@pytest.mark.parametrize("form", ["select", "select-batched", "handler-batched"])
def test_a_loader_of_samples_that_may_be_dropped_has_no_len(make_shards, form):
    """One item per sample (batch_size=None) over stages that may drop samples: how many items an epoch
    has is unknown until it is read, so len() is a TypeError (as for webdataset's loaders), never a count
    of positions (which made trainers size epochs eightfold); with_length(n) gives one; a loader that
    batches positions (batch_size=8) keeps its exact len()."""
    shards = make_shards()

    def make():
        ds = rw.WebDataset(shards, seed=3, shuffle=True)
        if form == "select":
            return rw.WebLoader(ds.select(keep).to_tuple("__key__"), batch_size=None)
        if form == "select-batched":
            return rw.WebLoader(ds.select(keep).to_tuple("__key__").batched(8), batch_size=None)
        return rw.WebLoader(ds.decode(handler=rw.warn_and_continue).to_tuple("__key__").batched(8), batch_size=None)

    loader = make()
    with pytest.raises(TypeError, match="len.. of this WebLoader is unknown.*batch_size=None.*may drop samples"):
        len(loader)
    if form == "select":
        assert bool(loader)  # ``if loader:`` does not ask for the length
    kept = sum(1 for _ in rw.WebDataset(shards).select(keep)) if form != "handler-batched" else TOTAL
    assert kept < TOTAL or form == "handler-batched"
    items = sum(1 for _ in loader)
    assert items == (kept if form == "select" else -(-kept // 8))
    assert len(make().with_length(items)) == items
    filtered = rw.WebLoader(rw.WebDataset(shards, seed=3, shuffle=True).select(keep).to_tuple("__key__"),
                            batch_size=8)
    assert len(filtered) == sum(1 for _ in filtered) == -(-TOTAL // 8)
    assert len(rw.WebLoader(rw.WebDataset(shards, seed=3).to_tuple("__key__"), batch_size=None)) == TOTAL
