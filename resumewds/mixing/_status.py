"""A mixture run's per-source delivered vs requested counts, from its journal alone.

The mixture is a pure function of its stored config: ``resumewds status``, the
report and a live MixedDataset compute the same numbers without the data.
"""

from __future__ import annotations

from typing import Any, Dict, Optional, Sequence

from ._plan import MixPlan


def _proportions(mp: MixPlan, names: Sequence[str], epoch: int, position: int) -> Dict[str, Any]:
    g = epoch * mp.epoch_size + position
    got = mp.delivered_global(g)
    tot = sum(got)
    req = mp.requested(g)
    ph = mp.phase_of(g)
    want = mp.expected_global(g)
    bounds = mp.prefix_bounds(ph)
    return {"phase": ph, "global_position": g, "sources": [
        {"name": names[i], "delivered": got[i], "delivered_fraction": got[i] / tot if tot else 0.0,
         "requested_fraction": req[i], "expected": want[i], "deviation": got[i] - want[i],
         "bound": bounds[i]}
        for i in range(len(got))]}


def mixture_status(config: Dict[str, Any], epoch: int, position: int) -> Optional[Dict[str, Any]]:
    """Delivered vs requested proportions from a journal's stored config and a commit.

    Pass ``status(path)["config"]`` and the latest commit's epoch and
    position; None when the run is not a mixture.

    Example:
        >>> cfg = {"mixture_sources": [{"name": "a", "samples": 10}, {"name": "b", "samples": 5}],
        ...        "mixture_phases": [[0, [3, 1]]], "samples": 40, "seed": 0}
        >>> [s["delivered"] for s in mixture_status(cfg, 0, 8)["sources"]]
        [6, 2]
    """
    srcs, phases = config.get("mixture_sources"), config.get("mixture_phases")
    if not srcs or not phases:
        return None
    mp = MixPlan([int(s["samples"]) for s in srcs], weights=list(phases[0][1]),
                 epoch_size=int(config["samples"]), seed=int(config.get("seed") or 0),
                 phases=[(int(a), list(w)) for a, w in phases[1:]], block=int(config.get("mixture_block") or 1),
                 partitions=int(config.get("partitions") or 1))
    return _proportions(mp, [str(s["name"]) for s in srcs], int(epoch), int(position))


def format_mixture(mx: Dict[str, Any]) -> str:
    """One line per source: ``name delivered (fraction) requested r, deviation d (bound b)``.

    Example:
        >>> cfg = {"mixture_sources": [{"name": "a", "samples": 10}, {"name": "b", "samples": 5}],
        ...        "mixture_phases": [[0, [3, 1]]], "samples": 40, "seed": 0}
        >>> print(format_mixture(mixture_status(cfg, 0, 8)))
        mixture phase 0 at position 8:
          a  6 samples (0.750), requested 0.750, deviation +0.00 (bound < 1)
          b  2 samples (0.250), requested 0.250, deviation +0.00 (bound < 1)
    """
    width = max(len(s["name"]) for s in mx["sources"])
    lines = [f"mixture phase {mx['phase']} at position {mx['global_position']}:"]
    for s in mx["sources"]:
        lines.append(f"  {s['name']:<{width}}  {s['delivered']} samples ({s['delivered_fraction']:.3f}), "
                     f"requested {s['requested_fraction']:.3f}, deviation {s['deviation']:+.2f} "
                     f"(bound < {max(1.0, s['bound']):g})")
    return "\n".join(lines)


__all__ = ["format_mixture", "mixture_status"]
