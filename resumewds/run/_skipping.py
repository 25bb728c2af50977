"""Skipping training steps on purpose (loss-spike recovery, as Megatron-LM's
``--skip-train-iteration-range``): the arithmetic of ``WebLoader.skip_steps`` (docs: its docstring).

Example:
    >>> from resumewds.plan import Layout
    >>> advance(Layout(batch_size=4), totals=lambda e: 10, epoch=0, position=0, steps=4)
    (1, 4)
"""

from __future__ import annotations

import operator
from typing import Any, Callable, Optional, Tuple

__all__ = ["MAX_WALKED_EPOCHS", "advance", "check_steps"]

#: epochs whose steps differ from one epoch to the next (resampled shards,
#: webdataset's worker split) a skip may cross; each is laid out to count its steps
MAX_WALKED_EPOCHS = 1000


def check_steps(k: Any) -> int:
    """``k`` as a number of steps to skip: a non-negative int (a bool or a float is refused).

    Example:
        >>> check_steps(3)
        3
        >>> check_steps(2.7)
        Traceback (most recent call last):
        ...
        TypeError: skip_steps(2.7): the number of steps must be a non-negative int, got a float
    """
    if isinstance(k, bool):
        raise TypeError(f"skip_steps({k!r}): the number of steps must be a non-negative int, got a bool")
    try:
        n = operator.index(k)
    except TypeError:
        raise TypeError(f"skip_steps({k!r}): the number of steps must be a non-negative int, "
                        f"got a {type(k).__name__}") from None
    if n < 0:
        raise ValueError(f"skip_steps({n}): cannot skip a negative number of steps")
    return n


def advance(layout: Any, totals: Callable[[int], int], epoch: int, position: int, steps: int,
            layout_of: Optional[Callable[[int], Any]] = None, same_epochs: bool = False) -> Tuple[int, int]:
    """``(epoch, position)`` after ``steps`` more steps from ``(epoch, position)``.

    ``layout`` (or ``layout_of(epoch)``) cuts an epoch of ``totals(epoch)`` samples into steps; a skip
    that ends exactly at an epoch's end stays there, as a commit at its last step does.
    ``same_epochs``: every epoch has the same steps, so whole epochs are counted with one division;
    otherwise each epoch crossed is laid out, and more than :data:`MAX_WALKED_EPOCHS` are refused.
    """
    steps = check_steps(steps)

    def of(e: int) -> Any:
        return layout if layout_of is None else layout_of(e)

    total = totals(epoch)
    n = of(epoch).num_steps(total, position)
    if steps <= n:  # within the current epoch
        return (epoch, position) if steps == 0 else (epoch, of(epoch).position_after(total, position, steps - 1))
    steps, epoch = steps - n, epoch + 1  # whole epochs from here, each from its position 0
    total = totals(epoch)
    per = of(epoch).num_steps(total, 0)
    if per == 0:
        raise ValueError(f"epoch {epoch} has no steps: nothing to skip")
    if same_epochs:
        whole, rest = divmod(steps, per)
        if rest == 0:  # ends at the end of an epoch: it stays there
            return epoch + whole - 1, of(epoch).position_after(total, 0, per - 1)
        return epoch + whole, of(epoch).position_after(total, 0, rest - 1)
    if steps > MAX_WALKED_EPOCHS * per:
        raise _too_far(steps, epoch, per)
    first = epoch
    while steps > per:
        steps, epoch = steps - per, epoch + 1
        if epoch - first > 2 * MAX_WALKED_EPOCHS:
            raise _too_far(steps, epoch, per)
        total = totals(epoch)
        per = of(epoch).num_steps(total, 0)
        if per == 0:
            raise ValueError(f"epoch {epoch} has no steps: nothing to skip")
    return epoch, of(epoch).position_after(total, 0, steps - 1)


def _too_far(steps: int, epoch: int, per: int) -> ValueError:
    return ValueError(
        f"skip_steps: {steps} more steps from epoch {epoch} (of about {per} steps each) cross more than "
        f"{MAX_WALKED_EPOCHS} epochs whose steps differ from one epoch to the next (resampled shards, or "
        f"webdataset's worker split): refused. A loss-spike skip is a few hundred steps: was a sample count "
        f"given? To start at another epoch, load a state taken there instead")
