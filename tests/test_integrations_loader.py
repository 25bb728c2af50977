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
