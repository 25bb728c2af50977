"""Forms of real training code that webdataset runs, run on resumewds: the same data, item for item.

Each test builds the same pipeline on ``webdataset`` 1.0.2 and on
``resumewds`` (only the import differs) and compares whole sequences:

* a ``RandomMix`` of ``DataPipeline`` sources with a stage of their own
  (open_lm): webdataset's mixing, draw for draw;
* a ``DataPipeline`` subclass with its own ``__init__`` that builds itself
  with ``append`` (DALLE2-pytorch's decoder loader);
* a node splitter of your own (``nodesplitter=lambda src: src``,
  CLIP_benchmark) under two and three DataLoader workers;
* ``with_epoch(n)``: each ``iter()`` a new pass (CLAP), in process and
  under fresh and persistent DataLoader workers, and its exact resume.
"""

from __future__ import annotations

import random
import warnings
from collections import Counter

import pytest
import torch
import webdataset as real
from torch.utils.data import DataLoader

import resumewds as ours

LIBS = (real, ours)


@pytest.fixture(autouse=True)
def _quiet():
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        yield


@pytest.fixture
def urls(make_shards):
    """6 shards x 20 samples (.bin/.cls/.txt)."""
    return make_shards(shards=6, samples=20)


@pytest.fixture
def other(make_shards):
    """A second source: 4 shards x 10 samples."""
    return make_shards(shards=4, samples=10, subdir="other")


def _keys(batches):
    return [tuple(b[0]) for b in batches]


# ---- RandomMix over DataPipelines with a stage of their own (open_lm) -------------------

def _user_stage(src):  # a generator of the user's (open_lm's tarfile_to_samples_nothrow is one)
    yield from src


def _openlm(lib, sources, workers):
    datasets = [lib.DataPipeline(lib.SimpleShardList(s), lib.split_by_worker, lib.tarfile_to_samples(),
                                 _user_stage, lib.to_tuple("__key__", "cls"), lib.batched(4))
                for s in sources]
    mix = lib.RandomMix(datasets, probs=[0.6, 0.4], longest=True)
    for i in range(len(datasets)):
        datasets[i] = datasets[i].with_epoch(6)  # after the mixture was made, as open_lm does
    return lib.WebLoader(mix, batch_size=None, shuffle=False, num_workers=workers)


@pytest.mark.parametrize("workers", [0, 2])
def test_random_mix_of_pipelines_with_a_user_stage_is_webdatasets(urls, other, workers):
    got = {}
    for lib in LIBS:
        loader = _openlm(lib, [urls, other], workers)
        runs = []
        for seed in (1, 2):  # webdataset draws with Python's random: seeded, the draws are repeatable
            random.seed(seed)
            torch.manual_seed(seed)
            runs.append(_keys(loader))
        got[lib] = runs
    assert got[real][0] != got[real][1]  # the draws decide the order
    assert got[ours] == got[real]
    assert len(got[ours][0]) == 12 * max(1, workers)
    assert ours.WebLoader is not None and _openlm(ours, [urls, other], 0).state_dict()["exact"] is False


def test_random_mix_of_exact_sources_stays_the_exact_mixture(urls, other):
    mix = ours.RandomMix([ours.WebDataset(urls, shardshuffle=False), ours.WebDataset(other, shardshuffle=False)])
    assert isinstance(mix, ours.MixedDataset)
    stream = ours.RandomMix([ours.WebDataset(urls, shardshuffle=False).batched(4), ours.WebDataset(other)])
    assert type(stream).__name__ == "StreamMix"  # batched sources: webdataset mixes batches


# ---- a DataPipeline subclass built with append (DALLE2-pytorch) ------------------------

def _join(samples):
    for s in samples:
        s["emb"] = {"cls": s["cls"]}
        yield s


def _dalle2(lib, urls, shuffle_num):
    class ImageEmbeddingDataset(lib.DataPipeline, lib.compat.FluidInterface):
        def __init__(self, urls, handler=lib.handlers.reraise_exception):
            super().__init__()
            self.append(lib.SimpleShardList(urls))
            self.append(lib.split_by_worker)
            self.append(lib.tarfile_to_samples(handler=handler))
            self.append(lib.decode(handler=handler))
            self.append(_join)
            self.append(lib.map(self.preproc))
            self.append(lib.to_tuple("__key__", "emb", "cls"))

        def preproc(self, sample):
            sample["cls"] = sample["cls"] * 10
            return sample

    ds = ImageEmbeddingDataset(urls)
    if shuffle_num:
        ds.shuffle(shuffle_num)  # a copy, discarded: ds is unchanged (webdataset's compose)
    return ds


@pytest.mark.parametrize("workers", [0, 2])
def test_a_pipeline_subclass_built_with_append_is_webdatasets(urls, workers):
    got = {lib: [(k, e["cls"].tolist(), c.tolist()) for k, e, c in
                 [(b[0], b[1], b[2]) for b in DataLoader(_dalle2(lib, urls, 1000), batch_size=8,
                                                         num_workers=workers)]]
           for lib in LIBS}
    assert got[ours] == got[real] and len(got[ours]) == (15 if workers == 0 else 16)


def test_append_and_compose_keep_the_pipeline_and_its_epoch(urls):
    for lib in LIBS:
        p = lib.DataPipeline(lib.SimpleShardList(urls), lib.tarfile_to_samples()).with_epoch(7)
        q = p.compose(lib.to_tuple("__key__"))
        assert len(list(p)) == 7 and len(list(q)) == 7  # compose copies, with_epoch kept
        assert isinstance(next(iter(p)), dict) and isinstance(next(iter(q)), tuple)
    f = ours.FluidWrapper(ours.SimpleShardList(urls), ours.tarfile_to_samples(), ours.to_tuple("__key__"))
    g = f.batched(4)
    assert isinstance(next(iter(f)), tuple) and len(next(iter(g))[0]) == 4  # f is unchanged


# ---- a node splitter of your own (CLIP_benchmark) --------------------------------------

def _clip_benchmark(lib, urls, nodesplitter):
    ds = (lib.WebDataset(urls, nodesplitter=nodesplitter, shardshuffle=False).decode()
          .to_tuple(["txt", "bin"], "cls").map_tuple(len, None))
    return ds.batched(5)


def _drop_second(src):
    for i, d in enumerate(src):
        if i != 1:
            yield d


@pytest.mark.parametrize("workers,splitter", [(2, "identity"), (3, "identity"), (2, "drop"), (3, "drop")])
def test_a_node_splitter_of_your_own_keeps_webdatasets_worker_split(urls, workers, splitter):
    fn = (lambda src: src) if splitter == "identity" else _drop_second
    got = {lib: [(b[0].tolist(), b[1].tolist()) for b in DataLoader(_clip_benchmark(lib, urls, fn), batch_size=None,
                                                                     num_workers=workers)]
           for lib in LIBS}
    assert got[ours] == got[real]
    assert sum(len(b[0]) for b in got[ours]) == (120 if splitter == "identity" else 100)


# ---- with_epoch(n): each iter() a new pass (CLAP) ----------------------------------------

def _clap(lib, urls, n, seeded):
    stages = [lib.SimpleShardList(urls)]
    if seeded:
        stages.append(lib.detshuffle(bufsize=8, initial=2, seed=3))
    stages += [lib.split_by_node, lib.split_by_worker, lib.tarfile_to_samples()]
    if seeded:
        stages.append(lib.shuffle(bufsize=20, initial=5, rng=random.Random(3)))
    stages += [lib.to_tuple("__key__", "cls"), lib.batched(4, partial=False)]
    return lib.DataPipeline(*stages).with_epoch(n)


@pytest.mark.parametrize("workers,persistent", [(0, False), (2, False), (2, True)])
def test_with_epoch_starts_a_new_pass_at_each_iter_as_webdataset(urls, workers, persistent):
    got = {}
    for lib in LIBS:
        loader = DataLoader(_clap(lib, urls, 4, False), batch_size=None, num_workers=workers,
                            persistent_workers=persistent)
        got[lib] = [_keys(loader) for _ in range(3)]
    assert got[ours] == got[real]  # unshuffled: the same batches, epoch after epoch
    # seeded shuffles (CLAP's detshuffle and Random(seed)): the orders are each library's, but
    # whether every epoch repeats the first one is webdataset's (fresh workers: it does)
    for lib in LIBS:
        loader = DataLoader(_clap(lib, urls, 4, True), batch_size=None, num_workers=workers,
                            persistent_workers=persistent)
        epochs = [Counter(k for b in _keys(loader) for k in b) for _ in range(3)]
        got[lib] = (epochs[0] == epochs[1] == epochs[2], [sum(e.values()) for e in epochs])
    assert got[ours] == got[real]


def test_webdataset_with_epoch_starts_a_new_pass_at_each_iter(urls):
    got = {}
    for lib in LIBS:
        ds = lib.WebDataset(urls, shardshuffle=False).to_tuple("__key__").batched(4).with_epoch(5)
        got[lib] = [[k for b in ds for k in b[0]] for _ in range(3)]
    assert got[ours] == got[real] and got[ours][0] == got[ours][1]


@pytest.mark.parametrize("form", ["DataPipeline", "WebDataset"])
@pytest.mark.parametrize("cut", [4, 2])
def test_a_with_epoch_state_resumes_to_the_same_pass(urls, cut, form):
    def make():
        if form == "WebDataset":
            return ours.WebDataset(urls, shardshuffle=False).to_tuple("__key__", "cls").batched(4, partial=False) \
                .with_epoch(4)
        return _clap(ours, urls, 4, False)

    p = make()
    ref = [_keys(p) for _ in range(3)]
    assert ref[0] == ref[1] == ref[2]  # webdataset's: a new pass (the same order, unshuffled)
    p = make()
    _keys(p)
    it = iter(p)
    head = [tuple(next(it)[0]) for _ in range(cut)]  # the chunk's end (4), or its middle (2)
    q = make()
    q.load_state_dict(p.state_dict())
    if cut == 4:  # the chunk was done: the resumed loop's next iter() is the next pass, as this run's
        assert head == ref[1] and _keys(q) == ref[2]
    else:  # the rest of the chunk, then the next pass
        assert head + _keys(q) == ref[1] and _keys(q) == ref[2]
