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
NO_CONVERT = ("WebLoader(batch_size=None) does not apply torch's default_convert as webdataset's DataLoader does: "
              "numpy fields of a batch (the collated cls) stay numpy int64 arrays where webdataset gives torch "
              "int64 tensors")

REMIX = ("with 2 workers WebLoader(...).unbatched().batched(m) re-batches resumewds's one sample sequence, "
         "webdataset the round-robin of its workers' batches: the same samples, in another order (docs/COMPAT.md, "
         "split_by_worker)")
RESTART = ("WebLoader over a DataPipeline(...).with_epoch(n) goes on with the stream at each iter(), so an epoch "
           "spans two passes and repeats samples; webdataset starts each worker's pipeline again: in process the "
           "next pass, under fresh DataLoader workers the first one again (the loader chain's passes, "
           "resumewds/wds/loaderchain.py, must follow the data set's with_epoch as its direct iteration does)")
_CLEAN = ("local-w0", "local-w2", "http-w0", "pipe-w0")  # (the damaged copy raises on both: no handler there)

#: (pipeline, variant) -> the divergence resumewds shows today ("*": every variant)
XFAIL: Dict[Tuple[str, str], str] = {
    ("smoke_next_chain", "local-w2"): REMIX,
    **{("clap", v): RESTART for v in _CLEAN},
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
    train = not (corrupt and spec.unseeded)  # (see Spec.unseeded)
    ref = run(spec, webdataset, urls, workers, train=train, **kw)
    got = run(spec, resumewds, urls, workers, train=train, **kw)
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
    errs = compare(spec.mode, ref, got, universe, repeats=spec.repeats)
    assert not errs, f"{spec.name} ({variant}): " + "; ".join(errs)
