"""Skipping training steps on purpose: loss-spike recovery.

When a run's loss spikes, a common remedy (Megatron-LM's
``--skip-train-iteration-range``) is to rewind to a checkpoint taken before
the spike and skip the data of the steps that led to it.  With resumewds
this is one explicit, journaled operation: resume at the model checkpoint's
step ``S`` (``WebLoader(..., resume=S - 1)`` restores the commit of step
``S - 1``, or ``load_state_dict`` of the state saved with it), then call
:meth:`resumewds.loader.WebLoader.skip_steps` with ``K``.  The loader moves
its position past the samples of steps ``S .. S+K-1`` without reading them
(crossing epoch ends as the run would have), counts them as done
(``steps_done`` becomes ``S + K``), and, with a journal, commits step
``S + K - 1`` at once with a ``skip_steps`` event, so a crash right after
the skip resumes after it, and ``resumewds status`` and the report show it.

Positions are global (see :mod:`resumewds.plan`), so the skip means the same
data at any worker count and any world size: every rank calls
``skip_steps(K)`` and each skips its share of the same steps.

Example:
    >>> from resumewds.plan import Layout
    >>> advance(Layout(batch_size=4), totals=lambda e: 10, epoch=0, position=0, steps=4)
    (1, 4)
"""

from __future__ import annotations

from typing import Any, Callable, Optional, Tuple

__all__ = ["advance"]


def advance(layout: Any, totals: Callable[[int], int], epoch: int, position: int, steps: int,
            layout_of: Optional[Callable[[int], Any]] = None) -> Tuple[int, int]:
    """``(epoch, position)`` after ``steps`` more steps from ``(epoch, position)``.

    ``layout`` (or ``layout_of(epoch)``, a layout whose steps depend on the
    epoch, as the shard split's do) cuts an epoch of ``totals(epoch)`` samples
    into steps (its ``num_steps(total, start)`` and ``position_after(total, start, step)``);
    an epoch whose steps are all taken ends, and the next starts at 0.  A
    skip that ends exactly at an epoch's end stays there, as a commit at the
    epoch's last step does (the next pass ends that epoch).
    """
    if steps < 0:
        raise ValueError(f"cannot skip {steps} steps")
    def of(e: int) -> Any:
        return layout if layout_of is None else layout_of(e)

    while steps > 0:
        total = totals(epoch)
        n = of(epoch).num_steps(total, position)
        if n == 0:
            epoch, position = epoch + 1, 0
            if of(epoch).num_steps(totals(epoch), 0) == 0:
                raise ValueError(f"epoch {epoch} has no steps: nothing to skip")
            continue
        if steps <= n:
            return epoch, of(epoch).position_after(total, position, steps - 1)
        steps -= n
        epoch, position = epoch + 1, 0
    return epoch, position
