"""Batches out of forked DataLoader workers without pickling their bytes.

Through torch's result queue a batch of ``bytes`` is pickled, piped 64 KB at a time and unpickled:
about 2.4x the CPU of reading it in-process.  :class:`BytesRing` is an anonymous shared mapping the
workers inherit at fork; each worker owns ``slots`` slots, used in turn.  A worker copies a batch's
large ``bytes`` leaves and small tensors into its next slot and sends a :class:`Packed` skeleton;
the main process copies them out and rebuilds the very same structure (same types, values and
sharing).  Large batch tensors are collated into :class:`TensorSlots` and handed out without a copy.
A worker never waits: a busy slot, a batch too large or with too little in bytes (:data:`MIN_PACK`)
goes through the queue, so the transport changes how batches travel, never what is delivered.

Example:
    >>> ring = BytesRing(num_workers=1, slots=2, slot_bytes=1 << 20)
    >>> batch = [["k0", "k1"], [b"x" * 40000, b"y" * 40000], [b"0", b"1"]]
    >>> p = ring.pack(0, batch)
    >>> type(p).__name__, ring.unpack(p) == batch
    ('Packed', True)
    >>> ring.close()
"""

from __future__ import annotations

import ctypes
import logging
import math
import mmap
import multiprocessing
import weakref
from typing import Any, Callable, Dict, List, Optional, Set, Tuple

#: leaves smaller than this stay in the pickled skeleton (a class label, a key)
MIN_LEAF = 1024
#: a batch with fewer bytes than this in large leaves goes through the queue (unless it holds a small tensor)
MIN_PACK = 64 * 1024
#: tensors up to this size travel in the slot; larger ones keep torch's own path (shared memory already)
MAX_TENSOR = 1 << 20

log = logging.getLogger("resumewds")

#: bytes of one tensor slot (virtual memory: a page costs memory once used); larger tensors take torch's path
TENSOR_SLOT_BYTES = 64 << 20

_TENSOR: Any = None  # torch.Tensor, once a worker packs (no torch import here before that)
_STRIDED: List[Any] = []  # [torch.strided], set with _TENSOR


def _tensor_type() -> Any:
    global _TENSOR
    if _TENSOR is None:
        import torch  # lazy: torch (heavy), only where tensors are handled

        _STRIDED.append(torch.strided)
        _TENSOR = torch.Tensor
    return _TENSOR


class _TensorLeaf:
    """The marker for a packed tensor: its dtype and shape (the bytes are in the slot)."""

    __slots__ = ("dtype", "shape")

    def __init__(self, dtype: Any, shape: Tuple[int, ...]):
        self.dtype, self.shape = dtype, shape

    def __getstate__(self) -> Tuple[Any, ...]:
        return (self.dtype, self.shape)

    def __setstate__(self, st: Tuple[Any, ...]) -> None:
        self.dtype, self.shape = st


class _SlotTensor:
    """The marker for a tensor in a :class:`TensorSlots` slot: where, dtype, shape."""

    __slots__ = ("slot", "offset", "dtype", "shape")

    def __init__(self, slot: int, offset: int, dtype: Any, shape: Tuple[int, ...]):
        self.slot, self.offset, self.dtype, self.shape = slot, offset, dtype, shape

    def __getstate__(self) -> Tuple[Any, ...]:
        return (self.slot, self.offset, self.dtype, self.shape)

    def __setstate__(self, st: Tuple[Any, ...]) -> None:
        self.slot, self.offset, self.dtype, self.shape = st


def _small_tensor(x: Any) -> bool:
    """A tensor the slot carries and gives back exactly: plain, contiguous, dense, CPU, no autograd,
    names or lazy conj/neg bits, 1 byte to :data:`MAX_TENSOR` (torch would send each as a new
    shared-memory segment whose descriptor crosses a socket, about 0.4 ms of CPU per tensor)."""
    try:
        return (x.device.type == "cpu" and x.layout is _STRIDED[0] and not x.requires_grad
                and x.is_contiguous() and not x.is_quantized and not any(getattr(x, "names", None) or ())
                and not x.is_conj() and not x.is_neg()
                and 0 < x.numel() * x.element_size() <= MAX_TENSOR)
    except Exception:  # an exotic tensor: torch's own path
        return False


class _Leaf:
    """The marker for a leaf in a packed skeleton (pickled by reference)."""

    __slots__ = ()

    def __reduce__(self) -> str:
        return "_LEAF"


_LEAF = _Leaf()


class Packed:
    """A batch whose large ``bytes`` leaves wait in a :class:`BytesRing` slot.

    Attributes:
        worker, seq: the worker and its batch number (the slot is ``seq % slots``).
        skeleton: the batch with :data:`_LEAF` in place of each packed leaf.
        refs: per marker, in walk order, the index of its leaf.
        offsets: ``len(leaves) + 1`` byte offsets of the leaves in the slot.
    """

    __slots__ = ("worker", "seq", "skeleton", "refs", "offsets")

    def __init__(self, worker: int, seq: int, skeleton: Any, refs: List[int], offsets: List[int]):
        self.worker, self.seq, self.skeleton, self.refs, self.offsets = worker, seq, skeleton, refs, offsets

    def __getstate__(self) -> Tuple[Any, ...]:
        return (self.worker, self.seq, self.skeleton, self.refs, self.offsets)

    def __setstate__(self, st: Tuple[Any, ...]) -> None:
        self.worker, self.seq, self.skeleton, self.refs, self.offsets = st


_WALKED = (list, tuple, dict)


def _strip(x: Any, leaves: List[bytes], ids: Dict[int, Any], refs: List[int],
           slot_of: Optional[Callable[[Any], Optional[_SlotTensor]]] = None) -> Any:
    """``x`` with every large leaf replaced by its marker, in walk order.  ``ids`` (``id()`` -> leaf
    index or stripped copy) keeps an object referenced twice shared; ``slot_of`` marks a tensor that
    lies in a tensor slot."""
    t = type(x)
    if t is bytes:
        if len(x) < MIN_LEAF:
            return x
        i = ids.get(id(x))
        if i is None:
            i = ids[id(x)] = len(leaves)
            leaves.append(x)
        refs.append(i)
        return _LEAF
    if t is _TENSOR:
        if not _small_tensor(x):
            if slot_of is not None:
                done = ids.get(id(x))
                if done is None:
                    done = ids[id(x)] = slot_of(x) or x
                return done
            return x
        got = ids.get(id(x))
        if got is None:
            got = ids[id(x)] = (len(leaves), _TensorLeaf(x.dtype, tuple(x.shape)))
            leaves.append(x)
        refs.append(got[0])
        return got[1]
    done = ids.get(id(x))
    if done is not None:
        return done
    if t is list or t is tuple:
        out = []
        for v in x:
            tv = type(v)
            if tv is bytes or tv in _WALKED or tv is _TENSOR:
                v = _strip(v, leaves, ids, refs, slot_of)
            out.append(v)
        res: Any = out if t is list else tuple(out)
    elif t is dict:
        res = {k: _strip(v, leaves, ids, refs, slot_of)
               if (type(v) is bytes or type(v) in _WALKED or type(v) is _TENSOR)
               else v for k, v in x.items()}
    else:
        return x
    ids[id(x)] = res
    return res


_REFILLED = (list, tuple, dict, _SlotTensor)


def _fill(x: Any, leaf: Callable[[int, Any], Any], refs: Any, done: Dict[int, Any]) -> Any:
    """The inverse of :func:`_strip`: each marker back through ``leaf(index, marker)`` (a slot
    tensor's: ``leaf(-1, marker)``); what the skeleton shares is rebuilt once."""
    t = type(x)
    if x is _LEAF or t is _TensorLeaf:
        return leaf(next(refs), x)
    if t not in _REFILLED:
        return x
    got = done.get(id(x))
    if got is not None:
        return got
    if t is _SlotTensor:
        res: Any = leaf(-1, x)
    elif t is dict:
        res = {k: leaf(next(refs), v) if (v is _LEAF or type(v) is _TensorLeaf)
               else (_fill(v, leaf, refs, done) if type(v) in _REFILLED else v) for k, v in x.items()}
    else:
        out = [leaf(next(refs), v) if (v is _LEAF or type(v) is _TensorLeaf)
               else (_fill(v, leaf, refs, done) if type(v) in _REFILLED else v) for v in x]
        res = out if t is list else tuple(out)
    done[id(x)] = res
    return res


def _slot_view(mm: mmap.mmap, offset: int, n: int) -> Any:
    """``n`` bytes of the mapping at ``offset`` as a uint8 tensor (no copy)."""
    import torch  # lazy: torch (heavy), only where tensors are handled

    return torch.frombuffer(mm, dtype=torch.uint8, count=n, offset=offset)


class TensorSlots:
    """Per-worker reusable buffers a worker collates its batch tensors into (one shared mapping).

    A slot is free when the main process holds no tensor over it (``held``: a lock-protected shared
    array that orders the main process's last reads before the worker's next writes) and the worker
    holds none either (a batch stage may keep one).  The lowest free slot is taken, so only as many
    slots as are in flight ever use memory.

    Example:
        >>> import torch
        >>> ts = TensorSlots(num_workers=1, slots=2, slot_bytes=4 << 20)
        >>> collate = ts.collate(0)
        >>> batch = collate([torch.ones(512, 512), torch.zeros(512, 512)])  # 2 MB
        >>> ts.marker(0, batch) is not None    # the batch lies in worker 0's slot
        True
        >>> ts.close()
    """

    def __init__(self, num_workers: int, slots: int, slot_bytes: int = TENSOR_SLOT_BYTES):
        self.num_workers, self.slots = int(num_workers), int(slots)
        self.slot_bytes = -(-int(slot_bytes) // mmap.PAGESIZE) * mmap.PAGESIZE
        self.mm: Optional[mmap.mmap] = mmap.mmap(-1, self.num_workers * self.slots * self.slot_bytes)
        probe = ctypes.c_char.from_buffer(self.mm)
        self._addr = ctypes.addressof(probe)
        del probe
        self.held = multiprocessing.get_context("fork").Array("b", self.num_workers * self.slots)
        self._busy: Set[int] = set()  # worker side: slots this process still has tensors over
        self._closed = False

    # ---- worker side ------------------------------------------------------
    def take(self, worker: int, nbytes: int) -> Any:
        """A free slot of ``worker`` as a uint8 tensor of ``nbytes``, or None."""
        mm = self.mm
        if mm is None or not 0 < nbytes <= self.slot_bytes:
            return None
        import torch  # lazy: torch (heavy), only where tensors are handled

        for s in range(self.slots):
            idx = worker * self.slots + s
            if idx in self._busy or self.held[idx]:
                continue
            self._busy.add(idx)
            buf = (ctypes.c_uint8 * nbytes).from_buffer(mm, idx * self.slot_bytes)
            weakref.finalize(buf, self._busy.discard, idx)  # when the last tensor over it is gone
            return torch.frombuffer(buf, dtype=torch.uint8)
        return None

    def collate(self, worker: int) -> Callable[[List[Any]], Any]:
        """torch's ``default_collate``, batch tensors over :data:`MAX_TENSOR` stacked into a free slot."""
        import torch  # lazy: torch (heavy), only where tensors are handled
        from torch.utils.data._utils.collate import collate, collate_tensor_fn, default_collate_fn_map  # lazy: torch

        def stack(batch: Any, *, collate_fn_map: Any = None) -> Any:
            elem = batch[0]
            if type(elem) is torch.Tensor and elem.layout is torch.strided and elem.device.type == "cpu" \
                    and not elem.is_nested and not elem.is_quantized:
                numel = sum(x.numel() for x in batch)
                nbytes = numel * elem.element_size()
                if nbytes > MAX_TENSOR and numel == len(batch) * elem.numel():
                    buf = self.take(worker, nbytes)
                    if buf is not None:
                        try:
                            out = buf.view(elem.dtype).view(len(batch), *elem.shape)
                        except (RuntimeError, TypeError):  # a dtype a byte buffer cannot be viewed as
                            out = None
                        if out is not None:
                            return torch.stack(batch, 0, out=out)
            return collate_tensor_fn(batch, collate_fn_map=collate_fn_map)

        fns = dict(default_collate_fn_map)
        fns[torch.Tensor] = stack

        def collate_fn(batch: List[Any]) -> Any:
            return collate(batch, collate_fn_map=fns)

        return collate_fn

    def marker(self, worker: int, x: Any) -> Optional[_SlotTensor]:
        """The marker of tensor ``x`` if its bytes lie, contiguous, in a slot of ``worker``."""
        if _TENSOR is None:
            _tensor_type()
        if self.mm is None or x.layout is not _STRIDED[0] or not x.is_contiguous() or x.requires_grad \
                or x.is_conj() or x.is_neg() or x.is_quantized or type(x) is not _TENSOR:
            return None
        nbytes = x.numel() * x.element_size()
        rel = x.data_ptr() - self._addr
        if nbytes <= 0 or not 0 <= rel < len(self.mm):
            return None
        idx, off = divmod(rel, self.slot_bytes)
        if idx // self.slots != worker or off + nbytes > self.slot_bytes:
            return None
        return _SlotTensor(idx, off, x.dtype, tuple(x.shape))

    def hold(self, slots: Set[int]) -> None:
        """The main process is about to hold these slots (worker, before sending)."""
        for idx in slots:
            self.held[idx] = 1

    # ---- main process side ----------------------------------------------------
    def tensor(self, m: _SlotTensor, views: Dict[int, Any]) -> Any:
        """The tensor ``m`` stands for, over the slot's memory (no copy); the slot is released when every
        tensor over it is gone (``views``: one batch's slot buffers, one release per slot and batch)."""
        import torch  # lazy: torch (heavy), only where tensors are handled

        buf = views.get(m.slot)
        if buf is None:
            assert self.mm is not None, "unpack after close"
            buf = views[m.slot] = (ctypes.c_uint8 * self.slot_bytes).from_buffer(self.mm, m.slot * self.slot_bytes)
            weakref.finalize(buf, self._release, m.slot)
        return torch.frombuffer(buf, dtype=m.dtype, count=math.prod(m.shape), offset=m.offset).view(m.shape)

    def _release(self, idx: int) -> None:
        if not self._closed:
            self.held[idx] = 0

    def close(self) -> None:
        """Unmap, unless batches handed out still use the memory (it then goes with the last of them)."""
        self._closed = True
        if self.mm is not None:
            try:
                self.mm.close()
            except BufferError:  # tensors over it are alive: their buffers keep it mapped
                pass
            self.mm = None

    def __getstate__(self) -> Dict[str, Any]:  # pragma: no cover - spawn: never sent
        raise TypeError("TensorSlots are inherited by forked workers, never pickled")


class BytesRing:
    """Per-worker slots in one anonymous shared mapping (inherited by forked workers).

    Besides the bytes, the two sides share only ``consumed`` (per worker, the batches the main process
    has copied out, in a lock-protected array that orders those reads before the worker's next writes).
    A worker writes batch ``seq`` into slot ``seq % slots`` only when ``seq - consumed < slots``.
    """

    def __init__(self, num_workers: int, slots: int, slot_bytes: int, tensor_slots: int = 0,
                 tensor_slot_bytes: int = TENSOR_SLOT_BYTES):
        self.num_workers, self.slots = int(num_workers), int(slots)
        self.slot_bytes = -(-int(slot_bytes) // mmap.PAGESIZE) * mmap.PAGESIZE
        self.mm: Optional[mmap.mmap] = mmap.mmap(-1, self.num_workers * self.slots * self.slot_bytes)
        self.consumed = multiprocessing.get_context("fork").Array("q", self.num_workers)
        self._seq: Dict[int, int] = {}  # worker side: batches packed so far (per process)
        #: where workers collate large batch tensors (None: torch's own path)
        self.tensors: Optional[TensorSlots] = None
        if tensor_slots > 0:
            try:
                self.tensors = TensorSlots(num_workers, tensor_slots, tensor_slot_bytes)
            except (OSError, ValueError, OverflowError):  # no room for the mapping: torch's path
                self.tensors = None

    # ---- worker side ------------------------------------------------------
    def pack(self, worker: int, batch: Any) -> Any:
        """``batch`` as a :class:`Packed` in this worker's next slot, or ``batch`` itself (little in bytes,
        too large, slot busy)."""
        if _TENSOR is None:
            _tensor_type()
        leaves: List[Any] = []
        refs: List[int] = []
        held: Set[int] = set()
        ts = self.tensors
        slot_of = None
        if ts is not None and ts.mm is not None:
            def slot_of(x: Any) -> Optional[_SlotTensor]:
                m = ts.marker(worker, x)
                if m is not None:
                    held.add(m.slot)
                return m
        try:
            skeleton = _strip(batch, leaves, {}, refs, slot_of)
        except RecursionError:  # a batch that contains itself: pickle handles it
            return batch
        if not leaves and not held:
            return batch
        offsets = [0]
        tensors = False
        for b in leaves:
            if type(b) is bytes:
                offsets.append(offsets[-1] + len(b))
            else:
                tensors = True
                offsets.append(offsets[-1] + b.numel() * b.element_size())
        size = offsets[-1]
        seq = self._seq.get(worker, 0)
        mm = self.mm
        if (size < MIN_PACK and not tensors and not held) or size > self.slot_bytes or mm is None:
            return batch
        if seq - self.consumed[worker] >= self.slots:
            return batch  # the main process still holds this slot's previous batch: no waiting
        if held:
            ts.hold(held)  # type: ignore[union-attr]  # released by the main process's tensors
        base = (worker * self.slots + seq % self.slots) * self.slot_bytes
        for b, a, e in zip(leaves, offsets, offsets[1:]):
            if type(b) is bytes:
                mm[base + a:base + e] = b
            else:
                dst = _slot_view(mm, base + a, e - a)
                dst.copy_(b.reshape(-1).view(dst.dtype))
        self._seq[worker] = seq + 1
        return Packed(worker, seq, skeleton, refs, offsets)

    # ---- main process side ----------------------------------------------------
    def unpack(self, p: Packed) -> Any:
        """The batch ``p`` stands for (new ``bytes`` objects); frees its slot."""
        mm = self.mm
        assert mm is not None, "unpack after close"
        base = (p.worker * self.slots + p.seq % self.slots) * self.slot_bytes
        offs = p.offsets
        vals: Dict[int, Any] = {}
        views: Dict[int, Any] = {}

        def leaf(i: int, marker: Any) -> Any:
            if i < 0:  # a tensor in a tensor slot
                assert self.tensors is not None
                return self.tensors.tensor(marker, views)
            v = vals.get(i)
            if v is None:
                a, e = base + offs[i], base + offs[i + 1]
                if marker is _LEAF:
                    v = mm[a:e]
                else:  # a new tensor, one copy out of the slot
                    import torch  # lazy: torch (heavy), only where tensors are handled

                    v = torch.empty(marker.shape, dtype=marker.dtype)
                    v.reshape(-1).view(torch.uint8).copy_(_slot_view(mm, a, e - a))
                vals[i] = v
            return v

        batch = _fill(p.skeleton, leaf, iter(p.refs), {})
        self.consumed[p.worker] = p.seq + 1  # under the array's lock: after the copies
        return batch

    def close(self) -> None:
        """Unmap (main process, after the workers are gone)."""
        if self.mm is not None:
            self.mm.close()
            self.mm = None
        if self.tensors is not None:
            self.tensors.close()

    def __getstate__(self) -> Dict[str, Any]:  # pragma: no cover - spawn: never sent
        raise TypeError("BytesRing is inherited by forked workers, never pickled")


def ring_for(num_workers: int, kw: Dict[str, Any], shards: Any, batch_size: int,
             tensors: bool) -> Optional[BytesRing]:
    """A :class:`BytesRing` for ``num_workers`` forked workers (``kw``: the DataLoader's arguments) sized
    for batches of ``batch_size`` samples of ``shards``; None where workers are not forked.
    ``tensors``: with tensor slots (the default collation).

    Example:
        >>> ring_for(2, {"multiprocessing_context": "spawn"}, [], 8, True) is None
        True
    """
    ctx = kw.get("multiprocessing_context")
    if ctx is None:
        method = multiprocessing.get_start_method(allow_none=True) or multiprocessing.get_all_start_methods()[0]
    else:
        method = ctx if isinstance(ctx, str) else ctx.get_start_method()
    if method != "fork":
        return None
    # a slot holds a batch's bytes: twice the average, pages used only when touched
    size = samples = 0
    for sh in shards:
        if sh.size and sh.samples:
            size, samples = size + int(sh.size), samples + int(sh.samples)
    per_sample = size / samples if samples else 1 << 20
    slot = max(1 << 20, int(2 * batch_size * per_sample))
    slots = int(kw.get("prefetch_factor") or 2) + 2
    # tensor slots only for the default collation; a user's collate_fn keeps its own tensors
    tensor_slots = slots if tensors else 0
    # virtual memory only until used, but at most 4 GB of it in all (many workers)
    tensor_bytes = max(8 << 20, min(TENSOR_SLOT_BYTES, (4 << 30) // max(1, num_workers * slots)))
    try:
        return BytesRing(num_workers, slots, slot, tensor_slots=tensor_slots, tensor_slot_bytes=tensor_bytes)
    except (OSError, ValueError) as exc:  # pragma: no cover - no shared memory here
        log.debug("shared-memory transport unavailable (%s): batches go through the queue", exc)
        return None
