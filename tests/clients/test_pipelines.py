"""The client corpus: each real pipeline on webdataset 1.0.2 and on resumewds, compared.

For every pipeline of :mod:`tests.clients.pipelines`, the same builder runs
on ``webdataset`` and on ``resumewds`` over the same shards (local paths,
http on 127.0.0.1, ``pipe:curl``; 0 and 2 DataLoader workers; a damaged copy
under the client's handler), and :func:`tests.clients.harness.compare`
checks what both delivered. A known divergence is an ``xfail(strict=True)``
with the divergence as its reason: a fix turns it into an unexpected pass,
which fails, so the marker goes when the defect does.
"""

from __future__ import annotations

from typing import Dict, Tuple

import pytest
import webdataset

import resumewds
from tests.clients.harness import compare, run, universe_of
from tests.clients.pipelines import SPECS

pytestmark = pytest.mark.clients

VARIANTS = ("local-w0", "local-w2", "http-w0", "pipe-w0", "corrupt-w0")

# The divergences resumewds shows today, by cause (each is a defect of the drop-in,
# or a documented difference where the reason says so).
BATCH_FILTER = ("WebLoader(batch_size=None) over select(...) + batched(n): resumewds filters inside each batch of "
                "n positions, so batches come out short (e.g. 6 rows instead of 8, 17 batches instead of 13), and a "
                "batch of to_tuple samples is a tuple where webdataset's default_collation_fn gives a list")
NO_CONVERT = ("WebLoader(batch_size=None) does not apply torch's default_convert as webdataset's DataLoader does: "
              "numpy fields of a batch (the collated cls) stay numpy int64 arrays where webdataset gives torch "
              "int64 tensors")
RESAMPLED_ENDS = ("WebDataset(resampled=True) under WebLoader(batch_size=None) is not an endless stream: the second "
                  "iter() ends after the 2 batches left of one pass over len(shards) draws; webdataset's resampled "
                  "stream gives the 8 batches the client takes, every epoch")
WORKER_SPLIT = ("documented difference: with num_workers=2 resumewds splits samples, not shards, between the "
                "workers, so the batches (and their order) differ from webdataset's shard-per-worker interleaving")

#: (pipeline, variant) -> the divergence resumewds shows today ("*": every variant)
XFAIL: Dict[Tuple[str, str], str] = {
    ("openclip_eval", "*"): BATCH_FILTER,
    ("openclip_eval", "local-w2"): BATCH_FILTER + "; " + WORKER_SPLIT,
    ("wds_readme", "local-w2"): WORKER_SPLIT + " (16 batches of 8 instead of 15: the workers' partial batches)",
    ("wds_train_example", "local-w0"): NO_CONVERT,
    ("wds_train_example", "local-w2"): NO_CONVERT,
    ("wds_train_example", "http-w0"): NO_CONVERT,
    ("wds_train_example", "pipe-w0"): NO_CONVERT,
    ("wds_datapipeline", "local-w2"): WORKER_SPLIT,
    ("dalle_pytorch", "local-w0"): BATCH_FILTER,
    ("dalle_pytorch", "local-w2"): BATCH_FILTER + "; " + WORKER_SPLIT,
    ("dalle_pytorch", "http-w0"): BATCH_FILTER,
    ("dalle_pytorch", "pipe-w0"): BATCH_FILTER,
    ("stable_diffusion", "local-w0"): BATCH_FILTER + "; " + NO_CONVERT,
    ("stable_diffusion", "local-w2"): BATCH_FILTER + "; " + NO_CONVERT,
    ("stable_diffusion", "http-w0"): BATCH_FILTER + "; " + NO_CONVERT,
    ("stable_diffusion", "pipe-w0"): BATCH_FILTER + "; " + NO_CONVERT,
    ("stable_diffusion", "corrupt-w0"): BATCH_FILTER + "; " + NO_CONVERT,
    ("clip_retrieval", "local-w2"): WORKER_SPLIT,
    ("latents_npy", "local-w0"): RESAMPLED_ENDS,
    ("latents_npy", "local-w2"): RESAMPLED_ENDS,
    ("latents_npy", "http-w0"): RESAMPLED_ENDS,
    ("latents_npy", "pipe-w0"): RESAMPLED_ENDS,
    ("video2dataset", "local-w2"): WORKER_SPLIT,
}

_universe: Dict[Tuple[str, str], Tuple[set, set]] = {}


def _cases():
    for spec in SPECS:
        for variant in VARIANTS:
            if variant.endswith("w2") and 2 not in spec.workers:
                continue
            marks = []
            reason = XFAIL.get((spec.name, variant)) or XFAIL.get((spec.name, "*"))
            if reason:
                marks.append(pytest.mark.xfail(strict=True, reason=reason))
            yield pytest.param(spec, variant, id=f"{spec.name}-{variant}", marks=marks)


@pytest.mark.parametrize("spec,variant", list(_cases()))
def test_same_data(corpus, spec, variant, tmp_path, no_handler_sleep):
    how, w = variant.split("-")
    workers = int(w[1:])
    corrupt = how == "corrupt"
    urls = corpus.urls(spec.layout, "local" if corrupt else how, corrupt=corrupt)
    kw = {}
    if spec.name == "clip_retrieval":
        kw["cache_path"] = str(tmp_path / "clientcache")
        (tmp_path / "clientcache").mkdir()
    ref = run(spec, webdataset, urls, workers, **kw)
    got = run(spec, resumewds, urls, workers, **kw)
    universe = None
    if spec.mode == "sample":
        key = (spec.name, "bad" if corrupt else "good")
        if key not in _universe:
            _universe[key] = universe_of(run(spec, webdataset, corpus.urls(spec.layout, "local", corrupt=corrupt),
                                             0, train=False, epochs=1, **kw))
        universe = _universe[key]
    if ref.error is not None:
        # the client has no handler for this damage: webdataset raises, so must resumewds
        assert got.error is not None, (f"{spec.name} ({variant}): webdataset raises {ref.error!r}, resumewds "
                                       f"delivers {sum(len(e.items) for e in got)} items without an error")
        return
    assert got.error is None, f"{spec.name} ({variant}): resumewds raises {got.error!r}"
    assert sum(len(e.rows) for e in ref) > 0, "webdataset delivered nothing: the case tests nothing"
    errs = compare(spec.mode, ref, got, universe)
    assert not errs, f"{spec.name} ({variant}): " + "; ".join(errs)
