"""``WebDataset``: the engine's data set with webdataset's constructor and fluent methods.

:class:`WebDataset` composes :class:`resumewds.direct.DirectDataset` (the
engine's data set, :class:`resumewds.shardset.ShardDataset`, iterable directly) with
:class:`resumewds.wds.webdataset.WebDatasetAPI` (webdataset 1.0.2's
constructor arguments and the fluent methods the engine has no name for).
This module and the package's ``__init__`` are where the core and the
WebDataset wing meet; the core modules import neither.

Example:
    >>> ds = (WebDataset("data/shard-{000000..000003}.tar", seed=7, shuffle=True)  # doctest: +SKIP
    ...       .decode("pil").to_tuple("jpg;png", "cls"))
    >>> img, cls = next(iter(ds))                                                 # doctest: +SKIP
"""

from __future__ import annotations

from .direct import DirectDataset
from .indexing import build_manifest, index_manifest
from .wds.webdataset import WebDatasetAPI

__all__ = ["WebDataset", "build_manifest", "index_manifest"]


class WebDataset(WebDatasetAPI, DirectDataset):
    """A resumable, deterministic WebDataset; also webdataset 1.0.2's ``WebDataset``.

    ``import resumewds as wds`` runs webdataset code unchanged: the
    constructor takes webdataset's arguments and every fluent stage
    (docs/COMPAT.md lists the exact semantics and differences).  It is a
    ``torch.utils.data.IterableDataset`` (registered when torch is imported,
    so ``import resumewds`` stays torch-free): a plain torch ``DataLoader``
    works, each worker taking its own share of the sample sequence, and
    ``state_dict()`` / ``load_state_dict()`` speak torchdata's
    ``StatefulDataLoader`` protocol.

    Args:
        urls: a path, URL, brace pattern, ``pipe:`` command or manifest.json,
            or a list of them, or a :class:`~resumewds.manifest.Manifest`;
            also webdataset's ``"a.tar::b-{0..3}.tar"`` and ``file:/abs/path``.
        seed: seed of the order (same seed, same order on any machine);
            None: ``WDS_SEED`` if set, else 0.
        shuffle: False: manifest order; True / ``"window"``: shard order
            permuted per epoch and samples shuffled within windows of
            ``shuffle_window`` shards; ``"shards"``: shard order only.
            Default: ``"shards"`` if ``shardshuffle`` is set, else False.
        shuffle_window: shards per shuffle window.
        cache_dir, cache_size, verify: passed to the shard cache
            (:class:`resumewds.cache.ShardStore`).
        fetch: a :class:`resumewds.fetch.FetchConfig` (timeouts, retries).
        on_error: ``"raise"`` (default) stops at a shard that cannot be
            fetched or verified (recording it as failed); ``"skip"`` skips its
            samples, records it as failed and reports it in stats and the
            journal.  A skipped shard is skipped for the rest of the epoch
            (by each process that reads it) and tried again in the next
            epoch, whatever ``num_workers``; once it delivers samples again
            the journal no longer calls it failed.
        allow_pickle: let decoders unpickle (pkl/pyd): off by default.
        allow_remote_pipe: accept ``pipe:`` urls from a manifest fetched over
            the network.
        prefetch: how many upcoming shards to download in the background.
        partitions: node-local partitions of the order (:class:`resumewds.plan.Plan`);
            None: the number of nodes at the run's start (a resume keeps the
            run's recorded count); 1: one order over all shards.
        ranged_reads: read remote v3 shards that are not cached yet sample by
            sample (verified ranges, the partial download; docs/DIGESTS.md);
            None: ``RESUMEWDS_RANGED_READS`` (default on).
        handler: webdataset's handler for shard and sample (tar) errors:
            ``reraise_exception`` (default, ``on_error="raise"``); a handler
            returning True skips the shard like ``on_error="skip"``; False
            stops the iteration.
        resampled: draw each epoch's shards with replacement (deterministic:
            a pure function of seed, epoch and position); iteration goes on
            over epochs (use ``.with_epoch(n)``).
        shardshuffle: webdataset's shard shuffle: True or N > 0 permutes the
            shard order per epoch (``shuffle="shards"``); False/None/0: manifest order.
        detshuffle: accepted; our shuffles are always deterministic.
        nodesplitter, workersplitter: ``split_by_node``, ``split_by_worker``,
            ``single_node_only`` (ours or webdataset's) map onto the rank /
            worker split of the sample sequence; None: no split (every rank /
            worker sees everything, as in webdataset); a user callable gets
            the shard list (``{"url": ...}`` dicts) and keeps what it yields.
        select_files, rename_files: webdataset's member filters (by
            ``"<key>.<ext>"`` name).
        empty_check: raise ValueError when an epoch has no samples at all.
        url_to_name, cache_size semantics, verbose, mode: accepted for
            compatibility (our cache names entries by URL digest).

    Example:
        >>> ds = WebDataset(["a.tar", "b.tar"], seed=3).decode().to_tuple("txt", "cls")  # doctest: +SKIP
        >>> ds = (WebDataset("shards-{000..099}.tar", shardshuffle=100)            # doctest: +SKIP
        ...       .shuffle(1000).decode("pil").to_tuple("jpg;png", "cls").batched(64))
    """
