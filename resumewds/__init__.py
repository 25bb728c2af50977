"""resumewds: crash-safe, exactly-resumable WebDataset loading for PyTorch.

Public names (torch is imported only when WebLoader is first used):

Example:
    >>> import resumewds as rw
    >>> ds = rw.WebDataset("data/shard-{000000..000031}.tar", seed=7, shuffle=True)  # doctest: +SKIP
    >>> loader = rw.WebLoader(ds.decode("pil").to_tuple("jpg;png", "cls"),           # doctest: +SKIP
    ...                       batch_size=64, num_workers=2, journal="run.db", resume=True)
"""

from __future__ import annotations

from typing import Any

from .compat import MockDataset
from .dataset import WebDataset, build_manifest, index_manifest
from .errors import (CacheError, ChecksumMismatch, DecodeError, FetchError, IntegrityError,
                     JournalConfigMismatch, JournalError, JournalIncompleteCommit,
                     PermanentFetchError, ResumeWDSError, ShardFormatError, SourceError, StateError,
                     TransientFetchError, UnsafeSourceError)
from .manifest import Manifest, ShardInfo, load_manifest
from .plan import Layout, Plan
from .handlers import (ignore_and_continue, ignore_and_stop, reraise_exception, warn_and_continue,
                       warn_and_stop)
from .pipeline import default_collation_fn
from .splitters import single_node_only, split_by_node, split_by_worker
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
    "MockDataset",
    "PermanentFetchError",
    "Plan",
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
    "default_collation_fn",
    "ignore_and_continue",
    "ignore_and_stop",
    "index_manifest",
    "load_manifest",
    "reraise_exception",
    "sample_digest",
    "scan_file",
    "single_node_only",
    "split_by_node",
    "split_by_worker",
    "warn_and_continue",
    "warn_and_stop",
]


def __getattr__(name: str) -> Any:
    # WebLoader imports torch; keep `import resumewds` light for the CLI.
    if name == "WebLoader":
        from .loader import WebLoader

        return WebLoader
    raise AttributeError(f"module 'resumewds' has no attribute {name!r}")
