"""resumewds: crash-safe, exactly-resumable WebDataset loading for PyTorch.

The public names are in ``__all__``; torch is imported only when
``WebLoader`` is first used.

Example:
    >>> import resumewds as rw
    >>> ds = rw.WebDataset("data/shard-{000000..000003}.tar", seed=7, shuffle=True)
    >>> loader = rw.WebLoader(ds.decode("rgb8").to_tuple("jpg;png", "cls"),
    ...                       batch_size=8, num_workers=2, journal="run.db", resume=True)
    >>> for step, (images, labels) in enumerate(loader, start=loader.steps_done):
    ...     loader.commit(step)         # after your own checkpoint of step `step`
    >>> tuple(images.shape), loader.steps_done
    ((8, 16, 16, 3), 4)
    >>> loader.close()                  # or a new process: the journal has one writer
    >>> again = rw.WebLoader(ds.decode("rgb8").to_tuple("jpg;png", "cls"),
    ...                      batch_size=8, journal="run.db", resume=True)
    >>> again.epoch, again.position     # a rerun continues after the last commit
    (1, 0)
    >>> again.close()
"""

from __future__ import annotations

from typing import Any

from .dataset import WebDataset, build_manifest, index_manifest
from .errors import (CacheError, ChecksumMismatch, DecodeError, FetchError, IntegrityError,
                     JournalConfigMismatch, JournalError, JournalIncompleteCommit,
                     PermanentFetchError, ResumeWDSError, ShardFormatError, SourceError, StateError,
                     TransientFetchError, UnsafeSourceError)
from .manifest import Manifest, ShardInfo, load_manifest
from .mixdataset import MixedDataset, RandomMix
from .mixture import MixPlan
from .plan import Layout, Plan
from .tario import sample_digest, scan_file

__version__ = "0.1.0"

__all__ = [
    "CacheError",
    "ChecksumMismatch",
    "DecodeError",
    "FetchError",
    "IntegrityError",
    "JournalConfigMismatch",
    "JournalError",
    "JournalIncompleteCommit",
    "Layout",
    "Manifest",
    "MixPlan",
    "MixedDataset",
    "PermanentFetchError",
    "Plan",
    "RandomMix",
    "ResumeWDSError",
    "ShardFormatError",
    "ShardInfo",
    "SourceError",
    "StateError",
    "TransientFetchError",
    "UnsafeSourceError",
    "WebDataset",
    "WebLoader",
    "build_manifest",
    "index_manifest",
    "load_manifest",
    "sample_digest",
    "scan_file",
]


def __getattr__(name: str) -> Any:
    # WebLoader imports torch; keep `import resumewds` light for the CLI.
    if name == "WebLoader":
        from .loader import WebLoader

        return WebLoader
    raise AttributeError(f"module 'resumewds' has no attribute {name!r}")
