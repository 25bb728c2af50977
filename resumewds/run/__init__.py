"""Running a data set under torch's DataLoader: ShardLoader (exact, layout-independent resume), its
workers, journal session, preemption, stall watchdog, state checksums, stats and skipped steps.

Where things are (private modules; import from this package)::

    _loader.py      ShardLoader: state_dict / load_state_dict, commit, the journal
    _workers.py     what the DataLoader workers run, and what comes back
    _shmbatch.py    batches out of workers without pickling their bytes
    _session.py     the loader's journal session: resume, commits, consumption
    _preemption.py  preemption signals: stop at a step boundary
    _watchdog.py    workers that die with the parent; stopped workers
    _statecheck.py  the checksum of a loader state: edited states refused
    _stats.py       counters and rates aggregated in the main process
    _skipping.py    skipping training steps on purpose (loss spikes)
    _framecheck.py  which training framework iterates a data set; its warnings
"""

from __future__ import annotations

import typing as _typing

from .. import _lazy

if _typing.TYPE_CHECKING:  # (the names as the type checker sees them)
    from ._framecheck import (
        check_restored_state,
        has_len,
        mark_checkpointed,
        note_framework,
        state_num_workers,
        worker_count_error,
    )
    from ._loader import STATE_FORMAT, ShardLoader
    from ._skipping import check_steps
    from ._statecheck import CHECKSUM_KEY, check_seal, seal
    from ._stats import Stats
    from ._watchdog import WorkerStallError
    from ._workers import BatchInfo, EmptyBatch

# the loader imports torch: every name loads its module on first use (PEP 562), so that
# the torch-free modules here (the watchdog, the state checksum, stats) stay torch-free
_LAZY: _typing.Dict[str, str] = {
    "BatchInfo": "_workers",
    "CHECKSUM_KEY": "_statecheck",
    "EmptyBatch": "_workers",
    "STATE_FORMAT": "_loader",
    "ShardLoader": "_loader",
    "Stats": "_stats",
    "WorkerStallError": "_watchdog",
    "check_restored_state": "_framecheck",
    "check_seal": "_statecheck",
    "check_steps": "_skipping",
    "has_len": "_framecheck",
    "mark_checkpointed": "_framecheck",
    "note_framework": "_framecheck",
    "seal": "_statecheck",
    "state_num_workers": "_framecheck",
    "worker_count_error": "_framecheck",
}

__all__ = ["BatchInfo", "check_restored_state", "check_seal", "check_steps", "CHECKSUM_KEY", "EmptyBatch",
           "has_len", "mark_checkpointed", "note_framework", "seal", "ShardLoader", "STATE_FORMAT",
           "state_num_workers", "Stats", "worker_count_error", "WorkerStallError"]

__getattr__, __dir__ = _lazy.attach(__name__, _LAZY)
