"""Batches out of real DataLoader workers through shared memory (resumewds.run).

Every test compares whole sequences: what ``transport="auto"`` (the shared
ring) delivers must be exactly what the old path (``transport="queue"``,
everything pickled) and the in-process loader deliver, with the same
container and leaf types, and the ring must actually have been used.
"""

from __future__ import annotations

import pytest
import torch

import resumewds as rw
from resumewds.run import _shmbatch as transport
from resumewds.run._shmbatch import MIN_PACK, BytesRing, Packed

pytestmark = pytest.mark.usefixtures("cache_dir")


@pytest.fixture
def big_shards(make_shards):
    # .bin of 2-30 KB (packed), .cls/.txt of a few bytes (left in the pickle)
    return make_shards(shards=3, samples=40, size_range=(2000, 30000))


@pytest.fixture
def unpacks(monkeypatch):
    """Counts, in the main process, the batches that came through the ring."""
    seen = {"n": 0}
    orig = BytesRing.unpack

    def counting(self, p):
        seen["n"] += 1
        return orig(self, p)

    monkeypatch.setattr(BytesRing, "unpack", counting)
    return seen


def _batches(shards, nw, tr, stage=None, batch_size=8, **kw):
    ds = rw.WebDataset(shards, shuffle=True, seed=3)
    ds = stage(ds) if stage is not None else ds
    with rw.WebLoader(ds, batch_size=batch_size, num_workers=nw, transport=tr, **kw) as loader:
        return list(loader)


def _same(a, b):
    """Deep equality, tensors included (same dtype, shape and values)."""
    if type(a) is not type(b):
        return False
    if isinstance(a, torch.Tensor):
        return a.dtype == b.dtype and torch.equal(a, b)
    if type(a) in (list, tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    if type(a) is dict:
        return list(a) == list(b) and all(_same(a[k], b[k]) for k in a)
    return bool(a == b)


def _types(x):
    """The batch's structure as types, leaves included."""
    if type(x) in (list, tuple):
        return (type(x).__name__, [_types(v) for v in x])
    if type(x) is dict:
        return ("dict", {k: _types(v) for k, v in x.items()})
    return type(x).__name__


@pytest.mark.parametrize("nw", [1, 2])
def test_tuple_batches_are_the_queue_path_batches(big_shards, unpacks, nw):
    stage = lambda ds: ds.to_tuple("__key__", "bin", "cls")
    ref = _batches(big_shards, 0, "auto", stage)
    queue = _batches(big_shards, nw, "queue", stage)
    assert unpacks["n"] == 0
    shm = _batches(big_shards, nw, "auto", stage)
    assert unpacks["n"] >= len(shm) // 2  # the ring carried the batches (a busy slot may fall back)
    assert shm == queue == ref
    assert [_types(b) for b in shm] == [_types(b) for b in ref]
    assert all(type(x) is bytes for b in shm for x in b[1])


def test_dict_batches_are_the_queue_path_batches(big_shards, unpacks):
    ref = _batches(big_shards, 0, "auto")
    queue = _batches(big_shards, 2, "queue")
    shm = _batches(big_shards, 2, "auto")
    assert unpacks["n"] > 0
    assert _same(shm, queue) and _same(shm, ref)
    assert [_types(b) for b in shm] == [_types(b) for b in ref]


def test_unbatched_samples_are_the_queue_path_samples(big_shards, unpacks):
    # batch_size=None: the workers send chunks of sample dicts, handed out one by one
    ref = _batches(big_shards, 0, "auto", batch_size=None, chunk_size=16)
    queue = _batches(big_shards, 2, "queue", batch_size=None, chunk_size=16)
    shm = _batches(big_shards, 2, "auto", batch_size=None, chunk_size=16)
    assert unpacks["n"] > 0
    assert [s["__key__"] for s in shm] == [s["__key__"] for s in ref]
    assert shm == queue == ref
    assert [_types(s) for s in shm] == [_types(s) for s in ref]


def test_one_bytes_object_twice_stays_one_object(big_shards, unpacks):
    # pickle keeps the identity of an object referenced twice; so must the ring
    stage = lambda ds: ds.map(lambda s: (s["bin"], s["bin"], s["__key__"]))
    queue = _batches(big_shards, 2, "queue", stage)
    shm = _batches(big_shards, 2, "auto", stage)
    assert unpacks["n"] > 0
    assert shm == queue
    for b in shm:
        assert all(x is y for x, y in zip(b[0], b[1]))


def test_resume_from_a_ring_run_is_exact(big_shards):
    stage = lambda ds: ds.to_tuple("__key__", "bin")
    full = _batches(big_shards, 0, "auto", stage)
    ds = stage(rw.WebDataset(big_shards, shuffle=True, seed=3))
    with rw.WebLoader(ds, batch_size=8, num_workers=2) as loader:
        it = iter(loader)
        head = [next(it) for _ in range(5)]
        state = loader.state_dict()
        del it
    ds = stage(rw.WebDataset(big_shards, shuffle=True, seed=3))
    with rw.WebLoader(ds, batch_size=8, num_workers=2) as loader:
        loader.load_state_dict(state)
        tail = list(loader)
    assert head + tail == full


def test_pack_falls_back_to_the_queue_and_never_waits():
    ring = BytesRing(num_workers=1, slots=2, slot_bytes=1 << 20)
    try:
        big = [[b"a" * 40000, b"b" * 40000], [1, 2]]
        p0, p1 = ring.pack(0, big), ring.pack(0, big)
        assert type(p0) is Packed and type(p1) is Packed
        # both slots held by the main process: the next batch goes as it is
        assert ring.pack(0, big) is big
        assert ring.unpack(p0) == big  # frees slot 0
        p2 = ring.pack(0, [[b"c" * 40000, b"d" * 40000]])
        assert type(p2) is Packed and p2.seq == 2
        assert ring.unpack(p1) == big and ring.unpack(p2) == [[b"c" * 40000, b"d" * 40000]]
        small = [[b"x" * 2000], ["k"]]  # below MIN_PACK
        assert 2000 < MIN_PACK and ring.pack(0, small) is small
        huge = [[b"h" * (2 << 20)]]  # larger than a slot
        assert ring.pack(0, huge) is huge
        other = (b"z" * 100000, "not walked into", {"k": [b"q" * 100000]})
        got = ring.unpack(ring.pack(0, other))
        assert got == other and type(got) is tuple and type(got[2]["k"][0]) is bytes
    finally:
        ring.close()


def test_transport_is_checked(big_shards):
    with pytest.raises(ValueError, match="transport"):
        rw.WebLoader(rw.WebDataset(big_shards), batch_size=8, transport="pipes")
    assert transport.MIN_LEAF <= 2000  # the fixture's .bin payloads are packed


@pytest.mark.slow
def test_spawned_workers_send_their_batches_through_the_queue(big_shards, unpacks):
    """Spawned workers share no memory with the loader: their batches come through the
    queue (none through the ring), the same as in process."""
    stage = lambda ds: ds.to_tuple("__key__", "bin", "cls")
    ref = _batches(big_shards, 0, "auto", stage)
    spawned = _batches(big_shards, 2, "auto", stage, multiprocessing_context="spawn")
    assert unpacks["n"] == 0 and spawned == ref


def test_the_re_mixing_idiom_keeps_the_loaders_transport(big_shards, unpacks):
    """WebLoader(...).unbatched().batched(n) builds a new loader: it keeps transport= (no
    batch through the ring), and delivers what the in-process chain delivers."""
    def chained(nw, tr):
        ds = rw.WebDataset(big_shards).to_tuple("__key__", "bin").batched(4)
        return [(list(b[0]), list(b[1])) for b in rw.WebLoader(ds, batch_size=None, num_workers=nw,
                                                                 transport=tr).unbatched().batched(8)]
    ref = chained(0, "auto")
    assert chained(2, "queue") == ref and unpacks["n"] == 0
    assert chained(2, "auto") == ref and unpacks["n"] > 0  # (where the ring is kept, it carries them)


def test_shared_containers_stay_shared_and_a_cycle_falls_back():
    ring = BytesRing(num_workers=1, slots=4, slot_bytes=1 << 20)
    try:
        inner = [b"s" * 70000, "k"]
        batch = [inner, inner, {"a": inner}, (inner,)]
        got = ring.unpack(ring.pack(0, batch))
        assert got == batch
        assert got[0] is got[1] is got[2]["a"] is got[3][0]  # one list, as pickle keeps it
        assert got[0] is not inner and type(got[0][0]) is bytes
        cyc: list = [b"c" * 70000]
        cyc.append(cyc)
        assert ring.pack(0, cyc) is cyc  # self-referential: through the queue (pickle copes)
    finally:
        ring.close()


def test_small_tensors_travel_in_the_slot_and_come_back_exact():
    """Every dtype, 0-dim and n-dim; what the slot cannot give back exactly
    (non-contiguous, autograd, empty, larger than MAX_TENSOR, a subclass) is
    left in the skeleton for torch's own path."""
    ring = BytesRing(num_workers=1, slots=4, slot_bytes=4 << 20)
    try:
        g = torch.Generator().manual_seed(0)
        packed = [torch.randn(3, 5, generator=g), torch.arange(64), torch.tensor(7), torch.tensor([True, False]),
                  torch.randint(0, 255, (2, 3, 4), dtype=torch.uint8, generator=g),
                  torch.randn(9, generator=g).to(torch.float16), torch.randn(9, generator=g).to(torch.bfloat16),
                  torch.randn(4, dtype=torch.complex64, generator=g), torch.tensor([-1, 2], dtype=torch.int8)]
        kept = [torch.randn(4, 6, generator=g).t(), torch.randn(3, requires_grad=True), torch.empty(0),
                torch.zeros(transport.MAX_TENSOR // 4 + 1), torch.nn.Parameter(torch.ones(2)),
                torch.randn(3, dtype=torch.complex64, generator=g).conj()]
        batch = [packed, kept, b"b" * 100]  # little in bytes: packed because of the tensors
        p = ring.pack(0, batch)
        assert type(p) is Packed
        got = ring.unpack(p)
        assert _same(got[0], packed) and [t.shape for t in got[0]] == [t.shape for t in packed]
        assert all(x is not y for x, y in zip(got[0], packed))  # new tensors, copied out of the slot
        assert all(x is y for x, y in zip(got[1], kept))  # never packed: the very objects
        assert got[2] == b"b" * 100
        one = torch.arange(10)
        twice = ring.unpack(ring.pack(0, {"a": one, "b": [one]}))
        assert twice["a"] is twice["b"][0] and torch.equal(twice["a"], one)
    finally:
        ring.close()


def test_label_tensors_come_through_the_ring_from_real_workers(big_shards, unpacks):
    """Batches of a key list and a label tensor, no large bytes: before, the
    queue carried them (a shared-memory segment and a file descriptor per tensor)."""
    stage = lambda ds: ds.decode().to_tuple("__key__", "cls").map_tuple(None, lambda c: c * 2)
    ring_run = _batches(big_shards, 2, "auto", stage)
    assert unpacks["n"] > 0
    queue_run = _batches(big_shards, 2, "queue", stage)
    inproc = _batches(big_shards, 0, "auto", stage)
    assert _same(ring_run, queue_run) and _same(ring_run, inproc)
    assert _types(ring_run) == _types(queue_run)


# ---- large batch tensors: collated into tensor slots ------------------------------

def _arrays(ds):
    """Each sample's .bin as a 60,000-byte uint8 array: a batch of 8 is a 480 KB
    tensor, of 32 a 1.9 MB one (over MAX_TENSOR: a tensor slot)."""
    import numpy as np

    def arr(b):
        return np.frombuffer((b * (60000 // len(b) + 1))[:60000], dtype=np.uint8).reshape(200, 300)

    return ds.to_tuple("bin", "cls").map_tuple(arr, lambda c: int(c))


@pytest.fixture
def slot_uses(monkeypatch):
    """Counts, in the main process, the batch tensors handed out over a tensor slot."""
    seen = {"n": 0}
    orig = transport.TensorSlots.tensor

    def counting(self, m, views):
        seen["n"] += 1
        return orig(self, m, views)

    monkeypatch.setattr(transport.TensorSlots, "tensor", counting)
    return seen


@pytest.mark.parametrize("nw", [1, 2])
def test_batch_tensors_collated_into_slots_are_the_queue_path_batches(big_shards, slot_uses, nw):
    ring_run = _batches(big_shards, nw, "auto", _arrays, batch_size=32)
    assert slot_uses["n"] > 0  # some batches over a slot (the others: every slot still held by the list)
    queue_run = _batches(big_shards, nw, "queue", _arrays, batch_size=32)
    inproc = _batches(big_shards, 0, "auto", _arrays, batch_size=32)
    assert _same(ring_run, queue_run) and _same(ring_run, inproc)
    assert _types(ring_run) == _types(queue_run)
    assert ring_run[0][0].shape == (32, 200, 300) and ring_run[0][0].dtype == torch.uint8


def test_released_slots_are_reused_and_held_batches_stay_intact(make_shards, slot_uses):
    """Batches dropped after use free their slot (more batches come over a
    slot than there are slots); a batch still held, and changed in place, is
    never overwritten by a later one."""
    shards = make_shards(shards=4, samples=100, size_range=(2000, 30000))  # 13 batches of 32
    ds = _arrays(rw.WebDataset(shards, shuffle=True, seed=3))
    want = [b[0].clone() for b in _batches(shards, 2, "queue", _arrays, batch_size=32)]
    with rw.WebLoader(ds, batch_size=32, num_workers=2) as loader:
        got, kept = [], None
        for i, (x, _cls) in enumerate(loader):
            got.append(x.clone())
            if i == 0:
                kept = x  # held to the end, and written to
                kept[0, 0, 0] = 255 - int(kept[0, 0, 0])
        del x
    assert len(got) == len(want) and all(torch.equal(a, b) for a, b in zip(got, want))
    slots = 2 * (2 + 2)  # 2 workers x (prefetch_factor + 2)
    assert len(want) == 13 and slot_uses["n"] > slots  # slots came back as batches were dropped
    assert kept is not None and int(kept[0, 0, 0]) == 255 - int(want[0][0, 0, 0])
    assert torch.equal(kept.flatten()[1:], want[0].flatten()[1:])  # the loader's end left it intact


def test_a_slot_is_reused_only_once_no_tensor_is_over_it():
    import gc

    ring = BytesRing(num_workers=1, slots=4, slot_bytes=1 << 20, tensor_slots=2, tensor_slot_bytes=4 << 20)
    ts = ring.tensors
    try:
        collate = ts.collate(0)
        rows = [torch.full((512, 512), float(i)) for i in range(2)]  # 2 MB: over MAX_TENSOR
        first = collate(rows)
        assert ts.marker(0, first).slot == 0
        view = first.transpose(1, 2)  # non-contiguous: no marker, torch's path
        got = ring.unpack(ring.pack(0, [first, view]))
        assert ts.marker(0, view) is None and got[1] is view
        assert torch.equal(got[0], first) and got[0].data_ptr() == first.data_ptr()  # no copy
        del first, view
        gc.collect()
        second = collate(rows)  # slot 0 is held by the main process's tensor
        assert ts.marker(0, second).slot == 1
        assert collate(rows).shape == (2, 512, 512) and ts.take(0, 1 << 20) is None  # both busy: torch's path
        kept_worker_side = second
        got2 = ring.unpack(ring.pack(0, [second]))
        del got, second
        gc.collect()  # the main process's tensors over slot 0 are gone
        third = collate(rows)
        assert ts.marker(0, third).slot == 0
        del got2, kept_worker_side
        gc.collect()
        assert ts.marker(0, collate(rows)).slot == 1  # the worker's last reference to slot 1 went too
        # a tensor larger than a slot, or a user class, is never put in one
        assert ts.marker(0, collate([torch.zeros(1024, 1024)] * 2)) is None
    finally:
        ring.close()


def test_pin_memory_pins_what_the_ring_delivered(big_shards, unpacks, monkeypatch):
    """torch's pin thread sees only the Packed marker: with pinning on (an
    accelerator present), the loader pins the unpacked batch itself.  Here,
    without an accelerator, torch is told one is present and pinning records
    what it is given."""
    import resumewds.run._loader as L

    monkeypatch.setattr(torch.accelerator, "is_available", lambda: True)
    monkeypatch.setattr(torch.accelerator, "current_accelerator", lambda *a, **k: torch.device("cuda"))
    monkeypatch.setattr(torch.accelerator, "current_device_index", lambda: 0)
    monkeypatch.setattr(torch.accelerator, "set_device_index", lambda i: None)
    pinned = []
    monkeypatch.setattr(L, "_pin_memory", lambda batch, device: (pinned.append((device, batch)), batch)[1])
    got = _batches(big_shards, 2, "auto", _arrays, batch_size=32, pin_memory=True)
    assert unpacks["n"] > 0 and len(pinned) == unpacks["n"]
    assert all(d == "cuda" for d, _ in pinned)
    assert _same([b for _, b in pinned], [b for b in got if any(b is p for _, p in pinned)])


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16, torch.int64, torch.bool,
                                   torch.uint8, torch.complex64])
def test_slot_collation_is_default_collate_for_every_dtype(dtype):
    from torch.utils.data import default_collate

    ring = BytesRing(num_workers=1, slots=2, slot_bytes=1 << 20, tensor_slots=2, tensor_slot_bytes=32 << 20)
    try:
        g = torch.Generator().manual_seed(1)
        rows = [(torch.randn(700, 1000, generator=g) * 3).to(dtype) for _ in range(3)]  # over MAX_TENSOR
        want = default_collate([(r, i) for i, r in enumerate(rows)])
        got = ring.tensors.collate(0)([(r, i) for i, r in enumerate(rows)])
        assert _same(got, want) and ring.tensors.marker(0, got[0]) is not None
        back = ring.unpack(ring.pack(0, got))
        assert _same(back, want) and ring.tensors.marker(0, back[0]) is not None  # over the slot, no copy
    finally:
        ring.close()
