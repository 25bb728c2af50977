"""Exact resume: interrupt a WebLoader anywhere, load its state into a loader
with another worker count, and get exactly the uninterrupted sequence."""

from __future__ import annotations

from typing import Any, Dict, List, Optional, Tuple

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import resumewds as rw
from conftest import N_SAMPLES, N_SHARDS
from resumewds.errors import StateError
from resumewds.synth import write_shards
from resumewds.tar import _io as tario

EPOCHS = 2

pytestmark = pytest.mark.filterwarnings("ignore:This DataLoader will create:UserWarning")
TOTAL = N_SHARDS * N_SAMPLES  # 185: no batch size below divides it


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> List[str]:
    """Shards shared by the module (hypothesis forbids function-scoped fixtures)."""
    root = tmp_path_factory.mktemp("resume")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("RESUMEWDS_CACHE_DIR", str(root / "cache"))
        for var in ("RESUMEWDS_CACHE_SIZE", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
            mp.delenv(var, raising=False)
        yield write_shards(str(root / "data"), shards=N_SHARDS, samples=N_SAMPLES,
                           size_range=(10, 200))


def dataset(data, seed=7, window=2, shuffle=True) -> rw.WebDataset:
    return rw.WebDataset(data, seed=seed, shuffle=shuffle, shuffle_window=window)


def keys_of(batch: Any) -> Tuple[str, ...]:
    if isinstance(batch, dict):
        return tuple(batch["__key__"])
    return tuple(batch[0])  # tuples with the key first


def run(loader, stop_after: Optional[int] = None, epochs: int = EPOCHS) -> List[Tuple[str, ...]]:
    """Batches (as key tuples) until ``epochs`` are done or ``stop_after`` batches."""
    out: List[Tuple[str, ...]] = []
    while loader.epoch < epochs:
        for batch in loader:
            out.append(keys_of(batch))
            if stop_after is not None and len(out) >= stop_after:
                return out
    return out


_REF: Dict[Tuple, List[Tuple[str, ...]]] = {}


def reference(data, seed: int, window: int, batch: int) -> List[Tuple[str, ...]]:
    key = (seed, window, batch)
    if key not in _REF:
        _REF[key] = run(rw.WebLoader(dataset(data, seed, window), batch_size=batch, num_workers=0))
    return _REF[key]


def check_resume(data, seed, window, batch, w1, w2, n) -> None:
    ref = reference(data, seed, window, batch)
    first = rw.WebLoader(dataset(data, seed, window), batch_size=batch, num_workers=w1)
    head = run(first, stop_after=n)
    assert head == ref[:n]
    state = first.state_dict()
    fresh = rw.WebLoader(dataset(data, seed, window), batch_size=batch, num_workers=w2)
    fresh.load_state_dict(state)
    tail = run(fresh)
    assert head + tail == ref
    assert fresh.epoch == EPOCHS and fresh.position == 0


def test_reference_is_a_shuffle_of_everything_twice(data):
    ref = reference(data, 7, 2, 8)
    per_epoch = -(-TOTAL // 8)
    assert len(ref) == 2 * per_epoch
    e0 = [k for b in ref[:per_epoch] for k in b]
    e1 = [k for b in ref[per_epoch:] for k in b]
    assert sorted(e0) == sorted(e1) == sorted(f"s{s:06d}_{i:06d}" for s in range(5) for i in range(37))
    assert e0 != e1 and e0 != sorted(e0)
    assert len(ref[per_epoch - 1]) == TOTAL % 8


@pytest.mark.parametrize("w1", [0, 2])
def test_uninterrupted_runs_agree_for_any_worker_count(data, w1):
    loader = rw.WebLoader(dataset(data), batch_size=8, num_workers=w1)
    assert run(loader) == reference(data, 7, 2, 8)


@pytest.mark.parametrize("w1,w2,n", [
    (0, 3, 5),      # mid epoch 0, more workers
    (2, 0, 23),     # end of epoch 0 exactly (ceil(185/8) = 24 batches: 23 is the one before)
    (2, 1, 24),     # right at the epoch boundary
    (3, 2, 31),     # inside epoch 1
    (1, 3, 47),     # the last batch of epoch 1 remains
])
def test_resume_explicit(data, w1, w2, n):
    check_resume(data, 7, 2, 8, w1, w2, n)


@pytest.fixture(scope="module")
def data_v4(data, tmp_path_factory) -> str:
    """The same shards through a version-4 manifest (an index file per shard)."""
    out = str(tmp_path_factory.mktemp("v4") / "manifest.json")
    rw.build_manifest(data, out, offsets="index", digests=True)
    return out


@pytest.mark.parametrize("w1,w2,n", [(0, 3, 5), (2, 1, 24), (3, 0, 31)])
def test_resume_explicit_on_a_v4_manifest(data, data_v4, w1, w2, n):
    v4 = run(rw.WebLoader(dataset(data_v4), batch_size=8, num_workers=0))
    assert v4 == reference(data, 7, 2, 8)
    check_resume(data_v4, 7, 2, 8, w1, w2, n)
    # a state taken on the paths resumes on the version-4 manifest of the same data
    first = rw.WebLoader(dataset(data), batch_size=8, num_workers=w1)
    head = run(first, stop_after=n)
    fresh = rw.WebLoader(dataset(data_v4), batch_size=8, num_workers=w2)
    fresh.load_state_dict(first.state_dict())
    assert head + run(fresh) == v4


@settings(max_examples=8, deadline=None, derandomize=True,
          suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(seed=st.integers(0, 3), window=st.integers(1, 5), batch=st.sampled_from([6, 11, 16]),
       w1=st.integers(0, 3), w2=st.integers(0, 3), frac=st.floats(0, 1))
def test_resume_property(data, seed, window, batch, w1, w2, frac):
    nb = 2 * -(-TOTAL // batch)
    n = max(1, min(nb - 1, int(frac * nb)))
    check_resume(data, seed, window, batch, w1, w2, n)


def test_resume_reads_only_what_it_delivers(data, monkeypatch):
    # every read of a sample parses it once, whichever path read it (one
    # pread per sample, one per run of consecutive samples, or the loader's
    # own reads of open shards, by a shard's member pattern or not)
    calls = {"n": 0}
    real_parse, real_as = tario.parse_sample, tario.parse_sample_as

    def counting_parse(*a, **kw):
        calls["n"] += 1
        return real_parse(*a, **kw)

    def counting_as(*a, **kw):
        got = real_as(*a, **kw)
        calls["n"] += got is not None  # a refusal is followed by parse_sample
        return got

    monkeypatch.setattr(tario, "parse_sample", counting_parse)
    monkeypatch.setattr(tario, "parse_sample_as", counting_as)
    ref = reference(data, 7, 2, 8)
    for n in (3, 20, 40):
        first = rw.WebLoader(dataset(data), batch_size=8)
        run(first, stop_after=n)
        state = first.state_dict()
        fresh = rw.WebLoader(dataset(data), batch_size=8)
        fresh.load_state_dict(state)
        calls["n"] = 0
        tail = run(fresh)
        delivered = sum(len(b) for b in tail)
        assert delivered == sum(len(b) for b in ref[n:])
        assert calls["n"] == delivered, (n, calls["n"], delivered)


def test_state_of_other_data_is_refused(data):
    loader = rw.WebLoader(dataset(data, seed=7), batch_size=8)
    run(loader, stop_after=3)
    state = loader.state_dict()
    assert state["epoch"] == 0 and state["position"] == 24
    for other in (dataset(data, seed=8), rw.WebDataset(data[:4], seed=7, shuffle=True, shuffle_window=2),
                  dataset(data, seed=7, window=3), dataset(data, seed=7, shuffle="shards"),
                  dataset(data, seed=7, shuffle=False)):
        with pytest.raises(StateError):
            rw.WebLoader(other, batch_size=8).load_state_dict(state)
    fresh = rw.WebLoader(dataset(data, seed=7), batch_size=8)
    for bad in ({}, None, dict(state, format="x"), dict(state, version=99),
                dict(state, position=TOTAL + 1), dict(state, position=-1)):
        with pytest.raises(StateError):
            fresh.load_state_dict(bad)
    # a different batch size or worker count is fine: the position is global
    rw.WebLoader(dataset(data, seed=7), batch_size=4, num_workers=2).load_state_dict(state)


def test_get_state_set_state_aliases(data):
    ref = reference(data, 7, 2, 8)
    a = rw.WebLoader(dataset(data), batch_size=8)
    head = run(a, stop_after=30)
    st_ = a.get_state()
    assert st_ == a.state_dict()
    b = rw.WebLoader(dataset(data), batch_size=8)
    b.set_state(st_)
    assert head + run(b) == ref


def test_resume_with_another_batch_size_continues_the_sequence(data):
    ref = [k for b in reference(data, 7, 2, 8) for k in b]
    a = rw.WebLoader(dataset(data), batch_size=8)
    head = [k for b in run(a, stop_after=10) for k in b]
    b = rw.WebLoader(dataset(data), batch_size=5, num_workers=2)
    b.load_state_dict(a.state_dict())
    assert head + [k for bb in run(b) for k in bb] == ref


@pytest.mark.parametrize("w1,w2,n", [(0, 2, 50), (2, 3, 185), (3, 0, 301)])
def test_unbatched_resume_mid_chunk(data, w1, w2, n):
    """batch_size=None: samples one by one; stop inside a worker chunk."""
    ref = [s["__key__"] for s in _samples(rw.WebLoader(dataset(data), batch_size=None, chunk_size=16))]
    assert len(ref) == 2 * TOTAL
    a = rw.WebLoader(dataset(data), batch_size=None, num_workers=w1, chunk_size=16)
    head = [s["__key__"] for s in _samples(a, stop_after=n)]
    b = rw.WebLoader(dataset(data), batch_size=None, num_workers=w2, chunk_size=7)
    b.load_state_dict(a.state_dict())
    assert head + [s["__key__"] for s in _samples(b)] == ref


def _samples(loader, stop_after=None):
    out = []
    while loader.epoch < EPOCHS:
        for s in loader:
            out.append(s)
            if stop_after is not None and len(out) >= stop_after:
                return out
    return out


def test_world_size_two_splits_the_same_sequence(data):
    """Two ranks with batch 4 deliver, step by step, what one rank with batch 8
    does; the final step (1 sample for 2 ranks) gives rank 1 a flagged pad."""
    ref = reference(data, 7, 2, 8)
    ranks = []
    for r in range(2):
        loader = rw.WebLoader(dataset(data), batch_size=4, rank=r, world_size=2)
        batches = []
        while loader.epoch < EPOCHS:
            for b in loader:
                pads = b.get("__pad__")
                batches.append(tuple(k for i, k in enumerate(b["__key__"])
                                     if pads is None or not bool(pads[i])))
                if pads is not None:
                    assert len(b["__key__"]) == 1 and r == 1
        ranks.append(batches)
    assert len(ranks[0]) == len(ranks[1]) == len(ref)
    for step, full in enumerate(ref):
        assert ranks[0][step] + ranks[1][step] == full, step


# ---------------------------------------------------------------------------
# Stages keep exact resume
# ---------------------------------------------------------------------------

def _tag(sample):
    sample = dict(sample)
    sample["tag"] = f"{sample['__epoch__']}:{sample['__index__']}"
    return sample


def _not_three(sample):
    return sample["label"] != 3


def _inc(x):
    return x + 1


def _upper(s):
    return s.upper()


def _staged(data, batched: bool):
    ds = (dataset(data).decode().rename(label="cls", payload="bin").select(_not_three).map(_tag)
          .map_dict(txt=_upper).to_tuple("__key__", "label", "txt", "tag").map_tuple(None, _inc, None, None))
    if batched:
        ds = ds.batched(9)
    return ds


@pytest.mark.parametrize("batched,w1,w2,n", [(False, 2, 0, 13), (True, 0, 3, 29), (True, 2, 1, 5)])
def test_stages_keep_exact_resume(data, batched, w1, w2, n):
    bs = None if batched else 9
    full = rw.WebLoader(_staged(data, batched), batch_size=bs, num_workers=0)
    ref = []
    while full.epoch < EPOCHS:
        for b in full:
            ref.append((tuple(b[0]), tuple(b[1].tolist()), tuple(b[2]), tuple(b[3])))
    assert all(3 + 1 not in labels for _, labels, _, _ in ref)
    assert any(len(k) < 9 for k, _, _, _ in ref[:-1])  # select made batches short
    assert all(t.isupper() for _, _, txts, _ in ref for t in txts)
    a = rw.WebLoader(_staged(data, batched), batch_size=bs, num_workers=w1)
    got = []
    stop = False
    while a.epoch < EPOCHS and not stop:
        for b in a:
            got.append((tuple(b[0]), tuple(b[1].tolist()), tuple(b[2]), tuple(b[3])))
            if len(got) == n:
                stop = True
                break
    b2 = rw.WebLoader(_staged(data, batched), batch_size=bs, num_workers=w2)
    b2.load_state_dict(a.state_dict())
    while b2.epoch < EPOCHS:
        for b in b2:
            got.append((tuple(b[0]), tuple(b[1].tolist()), tuple(b[2]), tuple(b[3])))
    assert got == ref


@pytest.mark.parametrize("remainder", ["pad", "keep"])
def test_pad_samples_are_flagged_in_collated_batches(data, remainder):
    """Pads never count as delivered data, so the user must be able to see them.

    BUG (remainder="pad"): a final batch mixing real samples and pads is
    collated with the keys of its first (real) sample, so ``__pad__`` is
    silently dropped.  Fix in report (dataset.iter_steps).
    """
    loader = rw.WebLoader(dataset(data), batch_size=4, rank=0, world_size=2, remainder=remainder)
    last = list(loader)[-1]
    # 185 = 23 * 8 + 1: rank 0 gets the one real sample (+3 pads with "pad")
    assert list(last["__index__"]) == ([184, 0, 1, 2] if remainder == "pad" else [184])
    pads = last.get("__pad__")
    if remainder == "keep":
        assert pads is None
    else:
        assert pads is not None and [bool(p) for p in pads] == [False, True, True, True]
    assert loader.epoch == 1 and loader.position == 0
