"""The world layout: which positions of an epoch each rank delivers at each step.

A *position* ``p`` counts the samples of the epoch sequence delivered over
all ranks; a *step* covers ``batch_size * world_size`` positions (see
:class:`Layout`).  The final, short step follows ``remainder``:

* ``"keep"`` (default): the leftover samples are split into ``world_size``
  parts differing by at most one; a rank that would get nothing gets one
  *padding* sample, so every rank yields the same number of batches.
* ``"pad"``: the last step is filled up from the start of the epoch, as padding.
* ``"drop"``: the leftover samples are not delivered this epoch.

Padding samples carry ``__pad__ = True``; they never advance the position.
An :class:`EpochLayout` (webdataset's shard split) depends on the epoch: bound
to an epoch's plan it gives a :class:`BoundLayout`.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, List, Optional, Protocol, Tuple

__all__ = ["REMAINDERS", "BoundLayout", "EpochLayout", "Layout", "worker_steps"]

REMAINDERS = ("keep", "pad", "drop")


@dataclass(frozen=True)
class Layout:
    """How an epoch's sequence is cut into steps and split across ranks.

    A step is a contiguous range of ``batch_size * world_size`` positions; rank
    ``r`` takes its r-th ``batch_size`` slice.  With ``nodes`` (node-major,
    dividing ``world_size``) node ``n`` takes the positions ``p % nodes == n``
    and its local rank ``l`` the l-th ``batch_size`` of them.  ``remainder``:
    ``"keep"``, ``"pad"`` or ``"drop"`` (see the module docs).

    Example:
        >>> [Layout(2, 4, r, nodes=2).slots(100, 0, 0) for r in (0, 2)]
        [[(0, False), (2, False)], [(1, False), (3, False)]]
    """

    batch_size: int
    world_size: int = 1
    rank: int = 0
    remainder: str = "keep"
    nodes: int = 1

    def __post_init__(self) -> None:
        if self.batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {self.batch_size}")
        if self.world_size < 1 or not 0 <= self.rank < self.world_size:
            raise ValueError(f"rank {self.rank} is not in a world of size {self.world_size}")
        if self.remainder not in REMAINDERS:
            raise ValueError(f"remainder must be one of {REMAINDERS}, got {self.remainder!r}")
        if self.nodes < 1 or self.world_size % self.nodes:
            raise ValueError(f"{self.nodes} nodes cannot split a world of {self.world_size} ranks "
                             "evenly")

    @property
    def step_size(self) -> int:
        return self.batch_size * self.world_size

    @property
    def ranks_per_node(self) -> int:
        return self.world_size // self.nodes

    def num_steps(self, total: int, start: int) -> int:
        """Steps from position ``start`` to the end of an epoch of ``total``."""
        left = max(0, total - start)
        full, rem = divmod(left, self.step_size)
        if rem and self.remainder != "drop":
            return full + 1
        return full

    def position_after(self, total: int, start: int, step: int) -> int:
        """Global position once steps ``0..step`` from ``start`` are delivered."""
        p = start + (step + 1) * self.step_size
        n = self.num_steps(total, start)
        if step + 1 >= n:
            return total
        return p

    def slots(self, total: int, start: int, step: int, rank: Optional[int] = None
              ) -> List[Tuple[int, bool]]:
        """Positions rank ``rank`` delivers at ``step``: ``[(position, is_pad)]``.

        A padding slot carries a real position to read (from the start of the
        epoch, of the rank's node) and ``is_pad=True``.
        """
        r = self.rank if rank is None else rank
        b, N = self.batch_size, self.nodes
        L = self.world_size // N
        n, lr = divmod(r, L)
        s0 = start + step * self.step_size
        left = total - s0
        if left <= 0:
            return []
        f = s0 + (n - s0) % N  # the node's first position of the step
        if left >= self.step_size:
            return [(f + N * (lr * b + j), False) for j in range(b)]
        # the final, short step
        if self.remainder == "drop":
            return []
        if self.remainder == "pad":
            out = []
            for j in range(b):
                g = f + N * (lr * b + j)
                out.append((g, False) if g < total else ((g - total) % total, True))
            return out
        mine = max(0, (total - f + N - 1) // N)  # the node's positions in [s0, total)
        q, extra = divmod(mine, L)
        if q == 0:
            if lr < mine:
                return [(f + N * lr, False)]
            return [((n + N * (lr - mine)) % total, True)]
        lo = lr * q + min(lr, extra)
        size = q + (1 if lr < extra else 0)
        return [(f + N * (lo + j), False) for j in range(size)]


def worker_steps(num_steps: int, worker: int, num_workers: int) -> range:
    """Steps produced by DataLoader worker ``worker`` (round-robin order)."""
    return range(worker, num_steps, max(1, num_workers))


class BoundLayout(Protocol):
    """An :class:`EpochLayout` bound to one epoch: its steps over ``sequence``.

    As :class:`Layout`, plus ``end`` (the position after the last sample) and
    ``sequence`` (the epoch as delivered, an :class:`~resumewds.plan.EpochPlan`).

    Example:
        >>> from resumewds.plan import Plan
        >>> from resumewds.wds._shardsplit import ShardSplit
        >>> bound = ShardSplit(2, unit=2).bind(Plan([3, 1, 2], shuffle=False).epoch(0))
        >>> bound.slots(6, 0, 0), bound.sequence.samples_at([0, 1, 2])
        ([(0, False), (1, False)], [(0, 0), (0, 1), (1, 0)])
    """

    batch_size: int
    step_size: int
    sequence: Any

    def num_steps(self, total: int, start: int) -> int: ...

    def position_after(self, total: int, start: int, step: int) -> int: ...

    def slots(self, total: int, start: int, step: int) -> List[Tuple[int, bool]]: ...

    def end(self, total: int) -> int: ...


class EpochLayout(Protocol):
    """A layout whose steps depend on the epoch: ``bind(epoch_plan)`` gives a
    :class:`BoundLayout`, or raises what makes the epoch impossible to lay out.

    Example:
        >>> from resumewds.plan import Plan
        >>> from resumewds.wds._shardsplit import ShardSplit
        >>> bound = ShardSplit(2, unit=2).bind(Plan([3, 1, 2], shuffle=False).epoch(0))
        >>> bound.num_steps(6, 0), bound.slots(6, 0, 1)
        (4, [(2, False)])
    """

    def bind(self, ep: Any) -> BoundLayout: ...
