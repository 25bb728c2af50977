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

from . import filters, shardlists, tariterators, tenbin, utils
from .autodecode import (Continue, Decoder, DecodingError, basichandlers, gzfilter, handle_extension,
                         imagehandler, torch_audio, torch_loads, torch_video)
from .compat import Cached, FluidInterface, MockDataset
from .dataset import WebDataset, build_manifest, index_manifest
from .digests import BadSample, add_sample_digests, bad_samples
from .errors import (CacheError, ChecksumMismatch, DecodeError, FetchError, IntegrityError,
                     JournalConfigMismatch, JournalError, JournalIncompleteCommit, MissingKeyError,
                     PermanentFetchError, ResumeWDSError, ShardFormatError, ShardNotFoundError,
                     SourceError, StateError, TransientFetchError, UnsafeSourceError)
from .filters import (associate, batched, decode, detshuffle, extract_keys, getfirst, info, log_keys, map, map_dict, map_tuple,
                      pipelinefilter, rename, rename_keys, rsample, select, shuffle, slice, to_tuple,
                      transform_with, unbatched, unlisted, xdecode)
from .gopen import gopen
from .handlers import (ignore_and_continue, ignore_and_stop, reraise_exception, warn_and_continue,
                       warn_and_stop)
from .manifest import Manifest, ShardInfo, load_manifest
from .multi import MultiLoader
from .mix import RoundRobin
from .mixdataset import MixedDataset, RandomMix
from .mixture import MixPlan
from .plan import Layout, Plan
from .shardlists import (MultiShardSample, ResampledShards, SimpleShardList, non_empty, resampled, shardspec,
                         single_node_only, split_by_node, split_by_worker)
from .tariterators import tarfile_samples, tarfile_to_samples
from .pipeline import PipelineStage, default_collation_fn
from .tario import sample_digest, scan_file
from .utils import repeatedly
from .world import World, detect_world
from .writer import ShardWriter, TarWriter, numpy_dumps, torch_dumps

__version__ = "0.1.0"

__all__ = [
    "BadSample",
    "BatchInfo",
    "CacheError",
    "Cached",
    "ChecksumMismatch",
    "Continue",
    "DataPipeline",
    "DecodeError",
    "Decoder",
    "DecodingError",
    "EmptyBatch",
    "FetchError",
    "FluidInterface",
    "FluidWrapper",
    "IntegrityError",
    "JournalConfigMismatch",
    "JournalError",
    "JournalIncompleteCommit",
    "Layout",
    "Manifest",
    "MissingKeyError",
    "MixPlan",
    "MixedDataset",
    "MockDataset",
    "MultiLoader",
    "MultiShardSample",
    "PermanentFetchError",
    "PipelineStage",
    "Plan",
    "RandomMix",
    "ResampledShards",
    "ResumeWDSError",
    "RoundRobin",
    "S3Options",
    "ShardFormatError",
    "ShardInfo",
    "ShardNotFoundError",
    "ShardWriter",
    "SimpleShardList",
    "SourceError",
    "StateError",
    "TarWriter",
    "TransientFetchError",
    "UnsafeSourceError",
    "WebDataset",
    "WebLoader",
    "World",
    "add_sample_digests",
    "associate",
    "bad_samples",
    "basichandlers",
    "batched",
    "build_manifest",
    "decode",
    "default_collation_fn",
    "detect_world",
    "detshuffle",
    "extract_keys",
    "filters",
    "getfirst",
    "gopen",
    "gzfilter",
    "handle_extension",
    "ignore_and_continue",
    "ignore_and_stop",
    "imagehandler",
    "index_manifest",
    "info",
    "load_manifest",
    "log_keys",
    "map",
    "map_dict",
    "map_tuple",
    "non_empty",
    "numpy_dumps",
    "pipelinefilter",
    "rename",
    "rename_keys",
    "repeatedly",
    "reraise_exception",
    "resampled",
    "rsample",
    "sample_digest",
    "scan_file",
    "select",
    "shardlists",
    "shardspec",
    "shuffle",
    "single_node_only",
    "slice",
    "split_by_node",
    "split_by_worker",
    "tarfile_samples",
    "tarfile_to_samples",
    "tariterators",
    "tenbin",
    "to_tuple",
    "torch_audio",
    "torch_dumps",
    "torch_loads",
    "torch_video",
    "transform_with",
    "unbatched",
    "unlisted",
    "utils",
    "warn_and_continue",
    "warn_and_stop",
    "xdecode",
]


def __getattr__(name: str) -> Any:
    # WebLoader imports torch; keep `import resumewds` light for the CLI.
    if name in ("WebLoader", "EmptyBatch", "BatchInfo"):
        from . import loader

        return getattr(loader, name)
    if name == "DataPipeline":  # a torch IterableDataset: imports torch
        from .datapipeline import DataPipeline

        return DataPipeline
    if name == "FluidWrapper":  # a DataPipeline: imports torch
        from .fluid import FluidWrapper

        return FluidWrapper
    if name == "S3Options":  # s3:// settings; resumewds.s3 leans on fetch's internals, load it on use
        from .s3 import S3Options

        return S3Options
    raise AttributeError(f"module 'resumewds' has no attribute {name!r}")
