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

import sys
from typing import Dict

from . import _lazy

# Loaded with the package: the exceptions (light, and what ``except rw.X`` needs).
from .errors import (
    CacheError,
    ChecksumMismatch,
    DecodeError,
    FetchError,
    IntegrityError,
    JournalConfigMismatch,
    JournalError,
    JournalIncompleteCommit,
    MissingKeyError,
    PermanentFetchError,
    ResumeWDSError,
    ShardFormatError,
    ShardNotFoundError,
    SourceError,
    StateError,
    TransientFetchError,
    UnsafeSourceError,
)

# ``gopen`` is a submodule and a function, as in webdataset: the module is registered under
# its alias now, so that importing it later cannot rebind ``resumewds.gopen`` to the module.
from .wds import gopen as _gopen_module

# webdataset's names in its ``cache`` and ``autodecode`` modules beside the engine's
_lazy.forward(f"{__name__}.cache", ("FileCache", "LRUCleanup", "StreamingOpen", "check_tar_format",
                                    "default_cache_size", "download", "get_filetype", "gopen", "islocal",
                                    "magic_filetype", "obsolete", "pipe_cleaner", "reraise_exception",
                                    "url_to_cache_name", "verbose_cache"), f"{__name__}.wds.filecache")
_lazy.forward(f"{__name__}.autodecode", ("utils",), f"{__name__}.wds.utils", whole=True)

sys.modules.setdefault(f"{__name__}.gopen", _gopen_module)
gopen = _gopen_module.gopen

# Every other public name is loaded from its module on first use (PEP 562).
_MODULES = ("filters", "shardlists", "tariterators", "tenbin", "utils")  # in __all__
_LAZY: Dict[str, str] = {
    **dict.fromkeys(("Continue", "Decoder", "DecodingError", "basichandlers", "gzfilter", "handle_extension",
                     "imagehandler", "torch_audio", "torch_loads", "torch_video"), "autodecode"),
    **dict.fromkeys(("Cached", "FluidInterface", "MockDataset"), "wds.compat"),
    **dict.fromkeys(("WebDataset", "build_manifest", "index_manifest"), "dataset"),
    **dict.fromkeys(("BadSample", "add_sample_digests", "bad_samples"), "sources"),
    **dict.fromkeys(("associate", "batched", "decode", "detshuffle", "extract_keys", "getfirst", "info",
                     "log_keys", "map", "map_dict", "map_tuple", "pipelinefilter", "rename", "rename_keys",
                     "rsample", "select", "shuffle", "slice", "to_tuple", "transform_with", "unbatched",
                     "unlisted", "xdecode"), "wds.filters"),
    **dict.fromkeys(("ignore_and_continue", "ignore_and_stop", "reraise_exception", "warn_and_continue",
                     "warn_and_stop"), "wds.handlers"),
    **dict.fromkeys(("Manifest", "ShardInfo", "load_manifest"), "manifest"),
    "MultiLoader": "wds.multi",
    **dict.fromkeys(("LRUCleanup", "pipe_cleaner"), "wds.filecache"),  # webdataset's cache module names
    **dict.fromkeys(("with_epoch", "with_length"), "wds.extradatasets"),  # (they import torch)
    "LMDBCached": "wds.filters",
    "pytorch_weights_only": "autodecode",
    **dict.fromkeys(("RandomMix", "RoundRobin"), "wds.mix"),
    "MixedDataset": "mixing",
    "MixPlan": "mixing",
    **dict.fromkeys(("Layout", "Plan"), "plan"),
    **dict.fromkeys(("MultiShardSample", "ResampledShards", "SimpleShardList", "non_empty", "resampled", "shardspec",
                     "single_node_only", "split_by_node", "split_by_worker"), "wds.shardlists"),
    **dict.fromkeys(("tarfile_samples", "tarfile_to_samples"), "wds.tariterators"),
    "default_collation_fn": "stages",
    **dict.fromkeys(("sample_digest", "scan_file"), "tar"),
    **dict.fromkeys(("PipelineStage", "repeatedly"), "wds.utils"),
    **dict.fromkeys(("World", "detect_world"), "plan"),
    "WorkerStallError": "run",  # a stopped DataLoader worker (no torch import)
    **dict.fromkeys(("ShardWriter", "TarWriter", "numpy_dumps", "torch_dumps"), "writer"),
    "gopen_schemes": "wds.gopen",
    # torch: WebLoader imports it; keep `import resumewds` light for the CLI
    **dict.fromkeys(("WebLoader", "EmptyBatch", "BatchInfo"), "loader"),
    "DataPipeline": "wds.datapipeline",  # a torch IterableDataset: imports torch
    "FluidWrapper": "wds.fluid",  # a DataPipeline: imports torch
    "S3Options": "fetch",  # s3:// settings: the s3 transport's module (boto3 is imported at the first fetch)
}

__version__ = "0.1.0"

# the exceptions imported above, then webdataset's module names, ``gopen`` and the lazy names
__all__ = ["CacheError", "ChecksumMismatch", "DecodeError", "FetchError", "IntegrityError", "JournalConfigMismatch",
           "JournalError", "JournalIncompleteCommit", "MissingKeyError", "PermanentFetchError", "ResumeWDSError",
           "ShardFormatError", "ShardNotFoundError", "SourceError", "StateError", "TransientFetchError",
           "UnsafeSourceError"]
__all__ = sorted({*__all__, *_MODULES, "gopen", *_LAZY})

__getattr__, __dir__ = _lazy.attach(__name__, _LAZY, submodules=_MODULES)
