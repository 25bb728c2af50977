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
