"""Real client call patterns of webdataset, each written as ``build(wds, urls, ...)``.

Each builder follows the call sequence of a public training code base (the
source is cited above it) and takes the module to run on: ``webdataset`` or
``resumewds``, so the very same code runs on both. The code is ours; only
the sequence of webdataset calls, their arguments and the shape of the
user functions follow the client. Model-specific parts (tokenizers,
augmentations, feature extractors) are replaced by small deterministic
functions of the sample, so what comes out identifies what went in.

A builder returns a :class:`Client`: the iterable the training loop walks
once per epoch, and the hook the client calls at the start of an epoch.
``train=False`` is the client's evaluation form (no shuffle, no resampling,
partial batches), used to list every row the training form may deliver.
"""

from __future__ import annotations

import io
import json
import logging
import math
import os
import random
import re
import sys
import wave
from dataclasses import dataclass
from functools import partial
from itertools import islice
from multiprocessing import Value
from typing import Any, Callable, Dict, List, Optional

import numpy as np
import torch
from PIL import Image
from torch.utils.data import DataLoader, IterableDataset, get_worker_info

_log = logging.getLogger("clients")


@dataclass
class Client:
    """What the training loop sees: ``loader`` walked once per epoch."""

    loader: Any
    set_epoch: Optional[Callable[[int], None]] = None
    take: Optional[int] = None  # items per epoch the loop takes (infinite streams)
    batched: bool = True  # the loader yields batches (rows are compared after unbatching)
    dataset: Any = None  # the dataset under a torch DataLoader (its state_dict is the resume point)


# ---------------------------------------------------------------- shared helpers
class SharedEpoch:
    """open_clip's epoch shared with the DataLoader workers (a multiprocessing Value)."""

    def __init__(self, epoch: int = 0):
        self.shared_epoch = Value("i", epoch)

    def set_value(self, epoch: int) -> None:
        self.shared_epoch.value = epoch

    def get_value(self) -> int:
        return self.shared_epoch.value


def log_and_continue(exn: BaseException) -> bool:
    """open_clip / timm / k-diffusion's handler: log and go on."""
    _log.warning("Handling webdataset error (%r). Ignoring.", exn)
    return True


def to_tensor(img: Image.Image) -> torch.Tensor:
    """A stand-in for torchvision's ToTensor: CHW float in [0, 1]."""
    return torch.from_numpy(np.asarray(img, dtype=np.float32) / 255.0).permute(2, 0, 1).contiguous()


def tokenize(text: Any, length: int = 24) -> torch.Tensor:
    """A stand-in tokenizer: the utf-8 bytes, padded/cut to ``length`` (like CLIP's ``[1, 77]``)."""
    if isinstance(text, bytes):
        text = text.decode("utf-8")
    ids = list(text.encode("utf-8"))[:length]
    return torch.tensor([ids + [0] * (length - len(ids))], dtype=torch.long)


def identity(x: Any) -> Any:
    return x


def _worker() -> tuple:
    info = get_worker_info()
    return (0, 1) if info is None else (info.id, info.num_workers)


# ------------------------------------------------------------------- open_clip
# mlfoundations/open_clip, src/training/data.py (src/open_clip_train/data.py in
# recent versions): get_wds_dataset, detshuffle2, ResampledShards2,
# tarfile_to_samples_nothrow with its own group_by_keys_nothrow.
def _openclip_classes(wds: Any) -> Dict[str, Any]:
    class DetShuffle2(wds.PipelineStage):
        def __init__(self, bufsize=1000, initial=100, seed=0, epoch=-1):
            self.bufsize, self.initial, self.seed, self.epoch = bufsize, initial, seed, epoch

        def run(self, src):
            if isinstance(self.epoch, SharedEpoch):
                epoch = self.epoch.get_value()
            else:
                self.epoch += 1
                epoch = self.epoch
            rng = random.Random()
            rng.seed(self.seed + epoch)
            return wds.filters._shuffle(src, self.bufsize, self.initial, rng)

    class ResampledShards2(IterableDataset):
        def __init__(self, urls, nshards=sys.maxsize, deterministic=False, epoch=-1):
            super().__init__()
            self.urls = wds.shardlists.expand_urls(urls)
            self.nshards, self.deterministic, self.epoch = nshards, deterministic, epoch
            self.rng = random.Random()

        def __iter__(self):
            if isinstance(self.epoch, SharedEpoch):
                epoch = self.epoch.get_value()
            else:
                self.epoch += 1
                epoch = self.epoch
            if self.deterministic:
                info = get_worker_info()
                seed = (info.seed if info is not None else wds.utils.pytorch_worker_seed()) + epoch
                self.rng.seed(seed)
            for _ in range(self.nshards):
                yield dict(url=self.rng.choice(self.urls))

    def group_by_keys_nothrow(data, keys=wds.tariterators.base_plus_ext, lcase=True, suffixes=None, handler=None):
        current = None
        for filesample in data:
            if filesample == {}:
                # webdataset 1.0's end-of-shard marker (open_clip pins webdataset<=0.2.86, where
                # there is none; this is the one line a client adds to run on 1.0.2)
                if wds.tariterators.valid_sample(current):
                    yield current
                current = None
                continue
            fname, value = filesample["fname"], filesample["data"]
            prefix, suffix = keys(fname)
            if prefix is None:
                continue
            if lcase:
                suffix = suffix.lower()
            if current is None or prefix != current["__key__"] or suffix in current:
                if wds.tariterators.valid_sample(current):
                    yield current
                current = dict(__key__=prefix, __url__=filesample["__url__"])
            if suffixes is None or suffix in suffixes:
                current[suffix] = value
        if wds.tariterators.valid_sample(current):
            yield current

    def tarfile_to_samples_nothrow(src, handler=log_and_continue):
        streams = wds.tariterators.url_opener(src, handler=handler)
        files = wds.tariterators.tar_file_expander(streams, handler=handler)
        return group_by_keys_nothrow(files, handler=handler)

    return dict(detshuffle2=DetShuffle2, ResampledShards2=ResampledShards2,
                tarfile_to_samples_nothrow=tarfile_to_samples_nothrow)


def filter_no_caption_or_no_image(sample):
    has_caption = "txt" in sample
    has_image = "png" in sample or "jpg" in sample or "jpeg" in sample or "webp" in sample
    return has_caption and has_image


def openclip(wds, urls, workers=0, train=True, resampled=False, batch_size=8, num_samples=96, loader_kw=None, **_):
    """open_clip get_wds_dataset (v2.x: decode("pilrgb"), rename, map_dict, to_tuple)."""
    c = _openclip_classes(wds)
    shared_epoch = SharedEpoch(epoch=0)
    if train and resampled:
        pipeline = [c["ResampledShards2"](urls, deterministic=True, epoch=shared_epoch)]
    else:
        pipeline = [wds.SimpleShardList(urls)]
    if train:
        if not resampled:
            pipeline.extend([
                c["detshuffle2"](bufsize=8, initial=2, seed=0, epoch=shared_epoch),
                wds.split_by_node,
                wds.split_by_worker,
            ])
        pipeline.extend([
            c["tarfile_to_samples_nothrow"],
            wds.shuffle(bufsize=40, initial=10),
        ])
    else:
        pipeline.extend([
            wds.split_by_worker,
            wds.tarfile_to_samples(handler=log_and_continue),
        ])
    pipeline.extend([
        wds.select(filter_no_caption_or_no_image),
        wds.decode("pilrgb", handler=log_and_continue),
        wds.rename(image="jpg;png;jpeg;webp", text="txt"),
        wds.map_dict(image=to_tensor, text=lambda text: tokenize(text)[0]),
        wds.to_tuple("image", "text"),
        wds.batched(batch_size, partial=not train),
    ])
    dataset = wds.DataPipeline(*pipeline)
    if train:
        num_batches = math.ceil(num_samples / batch_size)
        num_workers = max(1, workers)
        num_worker_batches = math.ceil(num_batches / num_workers)
        dataset = dataset.with_epoch(num_worker_batches)
    loader = wds.WebLoader(dataset, batch_size=None, shuffle=False, num_workers=workers,
                           persistent_workers=workers > 0, **(loader_kw or {}))
    return Client(loader, set_epoch=shared_epoch.set_value)


# ------------------------------------------------------------------------ timm
# huggingface/pytorch-image-models, timm/data/readers/reader_wds.py: ReaderWds
# (_create_pipeline: SimpleShardList, detshuffle2, its own split-by-node-and-
# worker generator, tarfile_to_samples(handler=log_and_continue), shuffle with
# a seeded rng, map(_decode, handler=log_and_continue)), read by a torch
# IterableDataset under a plain DataLoader (timm/data/loader.py).
def _timm_decode(sample, image_key="jpg;png", target_key="cls"):
    class_label = int(sample[target_key])
    img = None
    for k in image_key.split(";"):
        if k in sample:
            img = sample[k]
            break
    with io.BytesIO(img) as b:  # no image: TypeError, logged and skipped
        img = Image.open(b)
        img.load()
    return dict(jpg=img.convert("RGB"), cls=class_label)


class _TimmDataset(IterableDataset):
    def __init__(self, wds, urls, train, seed=42):
        super().__init__()
        self.wds, self.urls, self.train, self.seed = wds, urls, train, seed
        self.epoch = SharedEpoch(0)

    def _split_by_node_and_worker(self, src):
        wid, nw = _worker()
        if nw > 1:
            yield from islice(src, wid, None, nw)
        else:
            yield from src

    def __iter__(self):
        wds = self.wds
        pipeline = [wds.SimpleShardList(self.urls)]
        if self.train:
            c = _openclip_classes(wds)
            pipeline.extend([
                c["detshuffle2"](8, seed=self.seed, epoch=self.epoch),
                self._split_by_node_and_worker,
                wds.tarfile_to_samples(handler=log_and_continue),
                wds.shuffle(30, rng=random.Random(self.seed + _worker()[0])),
            ])
        else:
            pipeline.extend([self._split_by_node_and_worker, wds.tarfile_to_samples(handler=log_and_continue)])
        pipeline.append(wds.map(partial(_timm_decode), handler=log_and_continue))
        for sample in wds.DataPipeline(*pipeline):
            yield to_tensor(sample["jpg"]), sample["cls"]


def timm(wds, urls, workers=0, train=True, **_):
    ds = _TimmDataset(wds, urls, train)
    loader = DataLoader(ds, batch_size=8, num_workers=workers, persistent_workers=workers > 0)
    return Client(loader, set_epoch=ds.epoch.set_value)


# ------------------------------------------------------------------ webdataset
# webdataset/webdataset README.md ("dataset = wds.WebDataset(url).shuffle(1000)
# .decode("torchrgb").to_tuple("png", "json")" then a torch DataLoader).
def wds_readme(wds, urls, workers=0, train=True, **_):
    ds = wds.WebDataset(urls, shardshuffle=False)
    if train:
        ds = ds.shuffle(1000)
    ds = ds.decode("torchrgb").to_tuple("jpg;png", "json")
    return Client(DataLoader(ds, num_workers=workers, batch_size=8), dataset=ds)


# webdataset/webdataset examples/train-resnet50-wds.ipynb / README "training":
# WebDataset(resampled=True, shardshuffle=True).shuffle(1000).decode("rgb")
# .to_tuple(...).map_tuple(transform, identity).batched(16), then
# WebLoader(batch_size=None).unbatched().shuffle(1000).batched(64).with_epoch(n).
def _hwc_to_chw(a):
    return torch.from_numpy(np.ascontiguousarray(a.transpose(2, 0, 1)))


def wds_train_example(wds, urls, workers=0, train=True, loader_kw=None, **_):
    if train:
        ds = wds.WebDataset(urls, resampled=True, shardshuffle=True).shuffle(1000)
    else:
        ds = wds.WebDataset(urls, shardshuffle=False)
    ds = ds.decode("rgb").to_tuple("png;jpg", "cls").map_tuple(_hwc_to_chw, identity).batched(16)
    loader = wds.WebLoader(ds, batch_size=None, num_workers=workers, **(loader_kw or {}))
    if train:
        return Client(loader.unbatched().shuffle(1000).batched(24).with_epoch(4))
    return Client(loader)


# webdataset/webdataset README.md, the DataPipeline form (SimpleShardList,
# split_by_worker, tarfile_to_samples, decode, to_tuple, map_tuple, batched)
# under a torch DataLoader(batch_size=None).
def wds_datapipeline(wds, urls, workers=0, train=True, **_):
    stages = [wds.SimpleShardList(urls)]
    if train:
        stages.append(wds.shuffle(100))
    stages += [wds.split_by_worker, wds.tarfile_to_samples()]
    if train:
        stages.append(wds.shuffle(1000))
    stages += [wds.decode("pil"), wds.to_tuple("jpg;png", "cls"), wds.map_tuple(to_tensor, identity),
               wds.batched(16)]
    pipeline = wds.DataPipeline(*stages)
    return Client(DataLoader(pipeline, batch_size=None, num_workers=workers), dataset=pipeline)


# --------------------------------------------------------------------- LAVIS
# salesforce/LAVIS, lavis/datasets/datasets/laion_dataset.py: LaionDataset
# (DataPipeline(ResampledShards, tarfile_to_samples(handler=warn_and_continue),
# shuffle(1000, handler=), decode("pilrgb", handler=), to_tuple("jpg", "json",
# handler=), map_tuple(vis_processor, handler=), map(to_dict, handler=))).
def _lavis_to_dict(sample):
    return {"image": sample[0], "text_input": sample[1]["caption"]}


def lavis(wds, urls, workers=0, train=True, **_):
    source = wds.ResampledShards(urls) if train else wds.SimpleShardList(urls)
    stages = [source, wds.tarfile_to_samples(handler=wds.warn_and_continue)]
    if train:
        stages.append(wds.shuffle(1000, handler=wds.warn_and_continue))
    stages += [
        wds.decode("pilrgb", handler=wds.warn_and_continue),
        wds.to_tuple("jpg", "json", handler=wds.warn_and_continue),
        wds.map_tuple(to_tensor, handler=wds.warn_and_continue),
        wds.map(_lavis_to_dict, handler=wds.warn_and_continue),
    ]
    inner = wds.DataPipeline(*stages)
    loader = DataLoader(inner, batch_size=8, num_workers=workers)
    return Client(loader, take=10 if train else None, dataset=inner)


# ------------------------------------------------------------- DALLE-pytorch
# lucidrains/DALLE-pytorch, train_dalle.py (the ENABLE_WEBDATASET branch):
# WebDataset(DATASET, handler=warn_and_continue).select(filter_dataset)
# .map_dict(**image_text_mapping).map_dict(**image_mapping).to_tuple(*columns)
# .batched(BATCH_SIZE, partial=True); WebLoader(ds, batch_size=None,
# shuffle=False, num_workers=...).
def _dalle_imagepreproc(data):
    return to_tensor(Image.open(io.BytesIO(data)).convert("RGB"))


def dalle(wds, urls, workers=0, train=True, loader_kw=None, **_):
    caption_key, image_key = "txt", "jpg"

    def filter_dataset(item):
        return caption_key in item and image_key in item

    image_text_mapping = {caption_key: lambda text: tokenize(text.decode("utf-8"))[0]}
    image_mapping = {image_key: _dalle_imagepreproc}
    ds = (wds.WebDataset(urls, shardshuffle=False, handler=wds.warn_and_continue)
          .select(filter_dataset)
          .map_dict(**image_text_mapping)
          .map_dict(**image_mapping)
          .to_tuple(caption_key, image_key)
          .batched(8, partial=True))
    return Client(wds.WebLoader(ds, batch_size=None, shuffle=False, num_workers=workers, **(loader_kw or {})))


# ------------------------------------------------------ Stable Diffusion (ldm)
# Stability-AI/stablediffusion (CompVis latent-diffusion lineage),
# ldm/data/laion.py: WebDataModuleFromConfig.make_loader: WebDataset(tars,
# nodesplitter=, shardshuffle=, handler=warn_and_continue).repeat()
# .shuffle(n).select(filter_keys).decode("pil", handler=).map_dict(**transforms,
# handler=).batched(bs, partial=False, collation_fn=dict_collation_fn);
# WebLoader(batch_size=None, shuffle=False, num_workers=).
def dict_collation_fn(samples, combine_tensors=True, combine_scalars=True):
    keys = set.intersection(*[set(s.keys()) for s in samples])
    batched = {k: [s[k] for s in samples] for k in keys}
    result = {}
    for k, v in batched.items():
        if isinstance(v[0], (int, float)) and combine_scalars:
            result[k] = np.array(list(v))
        elif isinstance(v[0], torch.Tensor) and combine_tensors:
            result[k] = torch.stack(list(v))
        elif isinstance(v[0], np.ndarray) and combine_tensors:
            result[k] = np.array(list(v))
        else:
            result[k] = list(v)
    return result


def stable_diffusion(wds, urls, workers=0, train=True, loader_kw=None, **_):
    keys = ["jpg", "txt"]
    dset = wds.WebDataset(urls, nodesplitter=wds.shardlists.split_by_node, shardshuffle=100 if train else False,
                          handler=wds.warn_and_continue)
    if train:
        dset = dset.repeat().shuffle(100)
    dset = (dset.select(lambda x: all(k in x for k in keys))
            .decode("pil", handler=wds.warn_and_continue)
            .map_dict(jpg=to_tensor, txt=identity, handler=wds.warn_and_continue)
            .batched(8, partial=not train, collation_fn=dict_collation_fn))
    loader = wds.WebLoader(dset, batch_size=None, shuffle=False, num_workers=workers, **(loader_kw or {}))
    return Client(loader, take=8 if train else None)


# -------------------------------------------------------------- clip-retrieval
# rom1504/clip-retrieval, clip_retrieval/clip_inference/reader.py:
# create_webdataset (WebDataset(urls, cache_dir=, cache_size=10**10,
# handler=warn_and_continue).select(filter_dataset).map(preprocess_dataset,
# handler=warn_and_continue)) read by DataLoader(batch_size=, shuffle=False,
# num_workers=) in WebdatasetReader.
def clip_retrieval(wds, urls, workers=0, train=True, cache_path=None, **_):
    caption_key, image_key = "txt", "jpg"
    dataset = wds.WebDataset(urls, cache_dir=cache_path, cache_size=10**10, shardshuffle=False,
                             handler=wds.handlers.warn_and_continue)

    def filter_dataset(item):
        return caption_key in item and image_key in item

    def preprocess_dataset(item):
        out = {"image_filename": item["__key__"],
               "image_tensor": to_tensor(Image.open(io.BytesIO(item[image_key])).convert("RGB")),
               "text": item[caption_key].decode("utf-8")}
        out["metadata"] = item["json"].decode("utf-8")
        return out

    ds = dataset.select(filter_dataset).map(preprocess_dataset, handler=wds.handlers.warn_and_continue)
    return Client(DataLoader(ds, batch_size=8, shuffle=False, num_workers=workers), dataset=ds)


# ------------------------------------------------- diffusion latents (.npy)
# tinygrad/tinygrad, examples/mlperf (Stable Diffusion training on the MLPerf
# "webdataset-moments-filtered" latents): WebDataset(urls=, resampled=True,
# cache_size=-1, cache_dir=None).shuffle(size=1000).decode().map(filter_fnx)
# .batched(BS, partial=False, collation_fn=collate_fnx); WebLoader(batch_size=
# None, shuffle=False, num_workers=, persistent_workers=True).
def _latent_collate(batch):
    arr = np.zeros((len(batch), 4, 4, 4), dtype=np.float32)
    for i, e in enumerate(batch):
        arr[i] = e["npy"]
    return {"moments": torch.from_numpy(arr), "txt": [e["txt"] for e in batch]}


def latents(wds, urls, workers=0, train=True, loader_kw=None, **_):
    keep_only_keys = {"npy", "txt"}

    def filter_fnx(sample):
        return {k: v for k, v in sample.items() if k in keep_only_keys}

    if train:
        ds = wds.WebDataset(urls=urls, resampled=True, cache_size=-1, cache_dir=None).shuffle(size=1000)
    else:
        ds = wds.WebDataset(urls=urls, shardshuffle=False, cache_size=-1, cache_dir=None)
    ds = ds.decode().map(filter_fnx).batched(8, partial=not train, collation_fn=_latent_collate)
    loader = wds.WebLoader(ds, batch_size=None, shuffle=False, num_workers=workers, persistent_workers=workers > 0,
                           **(loader_kw or {}))
    return Client(loader, take=8 if train else None)


# ------------------------------------------------------------- NeMo ASR audio
# NVIDIA/NeMo, nemo/collections/asr/data/audio_to_text.py:
# _TarredAudioToTextDataset (DataPipeline(SimpleShardList, its own
# split-by-workers, shuffle(shuffle_n), tarfile_to_samples(), rename(audio=
# VALID_FILE_FORMATS, key="__key__"), to_tuple("audio", "key"), self._filter
# (a generator keeping the manifest's files), map(self._build_sample))): the
# audio bytes are decoded by the user function, the transcript comes from the
# manifest; DataLoader(batch_size=, collate_fn=_speech_collate_fn).
VALID_FILE_FORMATS = "wav;mp3;flac"


def _decode_wav(data: bytes) -> torch.Tensor:
    with wave.open(io.BytesIO(data), "rb") as w:
        pcm = np.frombuffer(w.readframes(w.getnframes()), dtype="<i2")
    return torch.from_numpy(pcm.astype(np.float32) / 32768.0)


def _speech_collate(batch):
    audio, alen, tokens, tlen = zip(*batch)
    maxa, maxt = max(int(x) for x in alen), max(int(x) for x in tlen)
    a = torch.stack([torch.nn.functional.pad(x, (0, maxa - x.shape[0])) for x in audio])
    t = torch.stack([torch.nn.functional.pad(x, (0, maxt - x.shape[0])) for x in tokens])
    return a, torch.stack(list(alen)), t, torch.stack(list(tlen))


class _NemoDataset(IterableDataset):
    def __init__(self, wds, urls, shuffle_n):
        super().__init__()
        # the manifest: every file but one in nine has a transcript
        self.manifest = {f"aud{s:02d}_{i:04d}": f"transcript {s * 20 + i}"
                         for s in range(4) for i in range(20) if (s * 20 + i) % 9 != 4}
        stages = [wds.SimpleShardList(urls=urls), self._split_by_workers]
        if shuffle_n:
            stages.append(wds.shuffle(shuffle_n))
        stages += [wds.tarfile_to_samples(), wds.rename(audio=VALID_FILE_FORMATS, key="__key__"),
                   wds.to_tuple("audio", "key"), self._filter, wds.map(self._build_sample)]
        self._dataset = wds.DataPipeline(*stages)

    @staticmethod
    def _split_by_workers(src):
        wid, nw = _worker()
        yield from islice(src, wid, None, nw)

    def _filter(self, iterator):
        for audio_bytes, key in iterator:
            if key in self.manifest:
                yield audio_bytes, key

    def _build_sample(self, tup):
        audio_bytes, key = tup
        features = _decode_wav(audio_bytes)
        tokens = torch.tensor(list(self.manifest[key].encode()), dtype=torch.long)
        return features, torch.tensor(features.shape[0]).long(), tokens, torch.tensor(len(tokens)).long()

    def __iter__(self):
        return iter(self._dataset)


def nemo_audio(wds, urls, workers=0, train=True, **_):
    ds = _NemoDataset(wds, urls, shuffle_n=0)
    return Client(DataLoader(ds, batch_size=4, collate_fn=_speech_collate, num_workers=workers))


# ---------------------------------------------------------------- video2dataset
# iejMac/video2dataset, video2dataset/dataloader/dataloader.py: get_video_dataset
# with decoder_kwargs={} (read the bytes): WebDataset(urls, nodesplitter=
# split_by_node, shardshuffle=shuffle, handler=warn_and_continue).repeat(repeat)
# .shuffle(shuffle, initial=shuffle).map(UnusedKeyFilter, handler=).select(
# KeyFilter); examples/dataloader_example.py: WebLoader(dset, batch_size=None,
# num_workers=).
class _UnusedKeyFilter:
    def __init__(self, keys):
        self.keys = keys

    def __call__(self, sample):
        for key in self.keys:
            sample.pop(key, None)
        return sample


class _KeyFilter:
    def __init__(self, keys):
        self.keys = keys

    def __call__(self, sample):
        try:
            for key in self.keys:
                sample[key]
            return True
        except KeyError:
            return False


def video(wds, urls, workers=0, train=True, loader_kw=None, **_):
    shuffle, repeat = 0, 1
    dset = wds.WebDataset(urls, nodesplitter=wds.split_by_node, shardshuffle=shuffle, handler=wds.warn_and_continue)
    dset = dset.repeat(repeat).shuffle(shuffle, initial=shuffle)
    dset = dset.map(_UnusedKeyFilter(keys=["cls"]), handler=wds.warn_and_continue)
    dset = dset.select(_KeyFilter(["mp4", "txt"]))
    dset = dset.map(lambda s: dict(s, json=json.loads(s["json"])), handler=wds.warn_and_continue)
    return Client(wds.WebLoader(dset, batch_size=None, num_workers=workers, **(loader_kw or {})), batched=False)


# ------------------------------------------------------------------- open_lm
# mlfoundations/open_lm, open_lm/data.py: get_wds_dataset: per source a DataPipeline(SimpleShardList,
# detshuffle2(seed=), split_by_node, split_by_worker, its own tarfile_to_samples_nothrow, shuffle(rng=
# Random(seed + epoch)), map_dict(json=preprocess_json), to_tuple("json"), select(filter_lt_seqlen),
# batched(partial=not is_train)); webdataset.mix.RandomMix(datasets, probs=train_data_mix_weights,
# longest=True); then each source's .with_epoch(num_worker_batches) (after the mixture was made);
# WebLoader(dataset, batch_size=None, shuffle=False, num_workers=, persistent_workers=). open_lm's
# main seeds random and torch (random_seed(args.seed)) before it builds the data.
def _preprocess_json(text, vocab_size):
    return [x % vocab_size if isinstance(x, int) else 0 for x in json.loads(text.decode())]


def _filter_lt_seqlen(seq_len, x):
    return len(x[0]) > seq_len


def openlm(wds, urls, workers=0, train=True, loader_kw=None, **_):
    random.seed(0)
    torch.manual_seed(0)
    c = _openclip_classes(wds)
    shared_epoch = SharedEpoch(0)
    shards = wds.shardlists.expand_urls(urls)
    sources, weights, num_samples = [shards[:2], shards[2:]], [0.7, 0.3], [32, 32]
    datasets = []
    for input_shards in sources:
        pipeline = [wds.SimpleShardList(input_shards)]
        if train:
            pipeline.extend([c["detshuffle2"](bufsize=4, initial=2, seed=0, epoch=shared_epoch),
                             wds.split_by_node, wds.split_by_worker, c["tarfile_to_samples_nothrow"],
                             wds.shuffle(bufsize=20, initial=5, rng=random.Random(0 + shared_epoch.get_value()))])
        else:
            pipeline.extend([wds.split_by_worker, wds.tarfile_to_samples(handler=log_and_continue)])
        pipeline.extend([wds.map_dict(json=partial(_preprocess_json, vocab_size=40)), wds.to_tuple("json"),
                         wds.select(partial(_filter_lt_seqlen, 8)), wds.batched(4, partial=not train)])
        datasets.append(wds.DataPipeline(*pipeline))
    dataset = wds.mix.RandomMix(datasets, probs=weights if train else None, longest=True)
    if train:
        for ii in range(len(datasets)):
            num_batches = math.ceil(num_samples[ii] / 4)
            datasets[ii] = datasets[ii].with_epoch(math.ceil(num_batches / max(1, workers)))
    loader = wds.WebLoader(dataset, batch_size=None, shuffle=False, num_workers=workers,
                           persistent_workers=workers > 0, **(loader_kw or {}))
    return Client(loader, set_epoch=shared_epoch.set_value)


# ------------------------------------------------------------- DALLE2-pytorch
# lucidrains/DALLE2-pytorch, dalle2_pytorch/dataloaders/decoder_loader.py: ImageEmbeddingDataset(
# wds.DataPipeline, wds.compat.FluidInterface), whose __init__ calls super().__init__() and builds the
# pipeline with self.append(...): SimpleShardList, filters.shuffle(1000), skip_unassociated_shards (a
# pipelinefilter), tarfile_to_samples(handler=), decode("pilrgb", handler=), insert_embedding (a
# pipelinefilter reading each shard's embeddings), join_embeddings, key_verifier, map(self.preproc),
# to_tuple(*keys); create_image_embedding_dataloader: ds.shuffle(1000) when shuffle_num (a copy, unused)
# and DataLoader(ds, num_workers=, batch_size=, prefetch_factor=2, pin_memory=True, shuffle=False).
# The embeddings are a function of the key here (DALLE2 reads them from .npy files per shard).
def _dalle2_classes(wds):
    def unassociated_shard_skipper(tarfiles, embedding_shards, handler=wds.handlers.reraise_exception):
        for tarfile in tarfiles:
            try:
                if int(tarfile["url"].split("-")[-1].split(".")[0]) in embedding_shards:
                    yield tarfile
            except Exception as exn:
                if handler(exn):
                    continue
                break

    def embedding_inserter(samples, index_width, sample_key="npy", handler=wds.handlers.reraise_exception):
        for sample in samples:
            try:
                index = int(sample["__key__"][-index_width:])
                if index % 13 == 7:
                    raise RuntimeError(f"Webdataset had a sample, but no embedding was found: {sample['__key__']}")
                sample[sample_key] = torch.full((4,), float(index))
                yield sample
            except Exception as exn:
                if handler(exn):
                    continue
                break

    def join_embeddings(samples, handler=wds.handlers.reraise_exception):
        for sample in samples:
            sample["emb"] = {}
            if "img_emb" in sample:
                sample["emb"]["img"] = sample["img_emb"]
            yield sample

    def verify_keys(samples, required_keys, handler=wds.handlers.reraise_exception):
        for sample in samples:
            try:
                for key in required_keys:
                    if key not in sample:
                        raise KeyError(f"Sample {sample['__key__']} missing {key}. Has keys {sample.keys()}")
                yield sample
            except Exception as exn:
                if handler(exn):
                    continue
                break

    skip_unassociated_shards = wds.filters.pipelinefilter(unassociated_shard_skipper)
    insert_embedding = wds.filters.pipelinefilter(embedding_inserter)
    key_verifier = wds.filters.pipelinefilter(verify_keys)

    class ImageEmbeddingDataset(wds.DataPipeline, wds.compat.FluidInterface):
        def __init__(self, urls, img_embedding_shards=None, index_width=4, img_preproc=None, extra_keys=(),
                     handler=wds.handlers.reraise_exception, shuffle_shards=True):
            super().__init__()
            keys = ["jpg", "emb"] + list(extra_keys)
            self.img_preproc = img_preproc
            self.append(wds.SimpleShardList(urls))
            if shuffle_shards:
                self.append(wds.filters.shuffle(1000))
            if img_embedding_shards is not None:
                self.append(skip_unassociated_shards(embedding_shards=img_embedding_shards, handler=handler))
            self.append(wds.tarfile_to_samples(handler=handler))
            self.append(wds.decode("pilrgb", handler=handler))
            if img_embedding_shards is not None:
                self.append(insert_embedding(index_width=index_width, sample_key="img_emb", handler=handler))
            self.append(join_embeddings)
            self.append(key_verifier(required_keys=keys, handler=handler))
            self.append(wds.map(self.preproc))
            self.append(wds.to_tuple(*keys))

        def preproc(self, sample):
            if self.img_preproc is not None:
                sample["jpg"] = self.img_preproc(sample["jpg"])
            return sample

    return ImageEmbeddingDataset


def dalle2_decoder(wds, urls, workers=0, train=True, **_):
    ds = _dalle2_classes(wds)(urls, img_embedding_shards={0, 1, 2, 3, 4}, img_preproc=to_tensor,
                              extra_keys=["txt"], handler=wds.handlers.warn_and_continue, shuffle_shards=train)
    if train:
        ds.shuffle(1000)
    loader = DataLoader(ds, num_workers=workers, batch_size=8, prefetch_factor=2 if workers else None,
                        pin_memory=False, shuffle=False)
    return Client(loader)


# ------------------------------------------------------------------------ ml-4m
# apple/ml-4m, fourm/data/unified_datasets.py: build_wds_fm_pretraining_dataloader: DataPipeline(
# ResampledShards(path with [mod1,mod2] modality folders), partial(multi_tarfile_samples,
# modality_name_map=) (wds.tarfile_samples on each modality's tar, zipped into one sample),
# shuffle(n), decode(wds_decoder), wds.filters.compose(partial(repeat_fn, n_repeats=)), shuffle(n),
# map(remove_extensions), its own pipelinefilter map (filter_metadata, the transform),
# batched(bs, collation_fn=default_collate, partial=False)).with_epoch(n);
# WebLoader(datapipe, num_workers=, batch_size=None).
def _ml4m_classes(wds):
    import braceexpand
    from torch.utils.data._utils.collate import default_collate

    def _keyless_map(data, f, handler=wds.filters.reraise_exception):
        for sample in data:
            try:
                result = f(sample)
            except Exception as exn:
                if handler(exn):
                    continue
                break
            if result is None:
                continue
            yield result

    keyless_map = wds.filters.pipelinefilter(_keyless_map)

    def multi_tarfile_samples(src_iter, modality_name_map=None, handler=wds.handlers.warn_and_continue):
        for src in src_iter:
            multi_tar_urls = src["url"].translate(str.maketrans("[]", "{}"))
            match = re.search(r"\{([^}]*)\}", multi_tar_urls)
            modality_names = match.group(1).split(",") if match else [None]
            urls_ = list(braceexpand.braceexpand(multi_tar_urls)) if match else [multi_tar_urls]
            tar_iters = [wds.tarfile_samples([{"url": tar_url}]) for tar_url in urls_]
            try:
                for multi_tar_files in zip(*tar_iters):
                    merged = {"__key__": multi_tar_files[0]["__key__"], "__url__": src["url"]}
                    for modality_name, modality_dict in zip(modality_names, multi_tar_files):
                        key = modality_dict.pop("__key__")
                        modality_dict.pop("__url__")
                        if key != merged["__key__"]:
                            raise ValueError(f"Divergence detected! {key} vs {merged['__key__']}")
                        for k, v in modality_dict.items():
                            if len(modality_dict) > 1 or modality_name is None:
                                merged[k] = v
                            else:
                                name = (modality_name_map or {}).get(modality_name, modality_name)
                                merged[f"{name}.{k}"] = v
                    yield merged
            except Exception as e:
                if handler(e):
                    continue
                break

    def wds_decoder(key, value):
        if key.endswith(".jpg") or key == "jpg":
            return Image.open(io.BytesIO(value))
        return None

    def repeat_fn(src, n_repeats=5):
        for sample in src:
            for _ in range(n_repeats):
                yield sample

    def remove_extensions(sample):
        return {os.path.splitext(k)[0]: v for k, v in sample.items()}

    def filter_metadata(sample, metadata=("__key__", "__url__")):
        return {k: v for k, v in sample.items() if k not in metadata}

    def transform(sample):
        return {"rgb": to_tensor(sample["rgb"].convert("RGB")), "caption": tokenize(sample["caption"])[0]}

    return dict(keyless_map=keyless_map, multi_tarfile_samples=multi_tarfile_samples, wds_decoder=wds_decoder,
                repeat_fn=repeat_fn, remove_extensions=remove_extensions, filter_metadata=filter_metadata,
                transform=transform, default_collate=default_collate)


def ml4m(wds, urls, workers=0, train=True, loader_kw=None, **_):
    c = _ml4m_classes(wds)
    data_path = re.sub(r"/(modal(?:-bad)?)/", r"/\1_[rgb,caption]/", urls)  # one folder per modality
    n_repeats, batch_size = (2, 4) if train else (1, 4)
    stages = [wds.ResampledShards(data_path) if train else wds.SimpleShardList(data_path),
              partial(c["multi_tarfile_samples"], modality_name_map=None)]
    if train:
        stages.append(wds.shuffle(20))
    stages += [wds.decode(c["wds_decoder"]), wds.filters.compose(partial(c["repeat_fn"], n_repeats=n_repeats))]
    if train:
        stages.append(wds.shuffle(20))
    stages += [wds.map(c["remove_extensions"]), c["keyless_map"](c["filter_metadata"]),
               c["keyless_map"](c["transform"]),
               wds.batched(batch_size, collation_fn=c["default_collate"], partial=not train)]
    datapipe = wds.DataPipeline(*stages)
    if train:
        datapipe = datapipe.with_epoch(64 // (1 * max(1, workers) * batch_size))
    return Client(wds.WebLoader(datapipe, num_workers=workers, batch_size=None, **(loader_kw or {})))


# --------------------------------------------------------------- CLIP_benchmark
# LAION-AI/CLIP_benchmark, clip_benchmark/datasets/builder.py: build_wds_dataset: WebDataset(tar
# pattern, cache_dir=, nodesplitter=lambda src: src).decode(wds.autodecode.ImageHandler("pil",
# extensions=["webp", "png", "jpg", "jpeg"])).to_tuple(["webp", "png", "jpg", "jpeg"], "cls")
# .map_tuple(transform, None); clip_benchmark/cli.py: DataLoader(dataset.batched(batch_size),
# batch_size=None, shuffle=False, num_workers=).
def clip_benchmark(wds, urls, workers=0, train=True, **_):
    dataset = (wds.WebDataset(urls, cache_dir=None, nodesplitter=lambda src: src)
               .decode(wds.autodecode.ImageHandler("pil", extensions=["webp", "png", "jpg", "jpeg"]))
               .to_tuple(["webp", "png", "jpg", "jpeg"], "cls")
               .map_tuple(lambda img: to_tensor(img.convert("RGB")), None))
    batched = dataset.batched(8)
    return Client(DataLoader(batched, batch_size=None, shuffle=False, num_workers=workers), dataset=batched)


# ------------------------------------------------------------------------- CLAP
# LAION-AI/CLAP, src/laion_clap/training/data.py: get_wds_dataset: DataPipeline(SimpleShardList,
# detshuffle(bufsize, initial, seed=args.seed), split_by_node, split_by_worker,
# tarfile_to_samples(handler=log_and_continue), shuffle(bufsize, initial, rng=random.Random(args.seed)),
# decode(wds.torch_audio), batched(batch_size, partial=False, collation_fn=partial(
# collate_fn_with_preprocess, ...))).with_epoch(num_worker_batches); WebLoader(dataset,
# batch_size=None, shuffle=False, num_workers=, pin_memory=True, prefetch_factor=). torch_audio needs
# torchaudio: a decoder of the same form reads the wav here.
def _clap_audio(key, data):
    extension = re.sub(r".*[.]", "", key)  # webdataset's torch_audio: the key is ".wav"
    if extension not in "flac mp3 sox wav m4a ogg wma".split():
        return None
    return _decode_wav(data)[None], 8000  # torch_audio's (waveform [channels, n], sample rate)


def _clap_collate(batch, max_len=64):
    out = []
    for sample in batch:
        audio, _sr = sample["wav"]
        audio = audio[0][:max_len]
        audio = torch.nn.functional.pad(audio, (0, max_len - audio.shape[0]))
        out.append({"__key__": sample["__key__"], "waveform": audio, "text": tokenize(sample["txt"])[0],
                    "longer": torch.tensor([False])})
    return {k: (torch.stack([s[k] for s in out]) if isinstance(out[0][k], torch.Tensor) else [s[k] for s in out])
            for k in out[0]}


def clap(wds, urls, workers=0, train=True, loader_kw=None, **_):
    seed, batch_size, num_samples = 3, 8, 48  # --train-num-samples below the data's 80: an epoch is a part of it
    pipeline = [wds.SimpleShardList(urls)]
    if train:
        pipeline.extend([wds.detshuffle(bufsize=8, initial=2, seed=seed), wds.split_by_node, wds.split_by_worker,
                         wds.tarfile_to_samples(handler=log_and_continue),
                         wds.shuffle(bufsize=40, initial=10, rng=random.Random(seed))])
    else:
        pipeline.extend([wds.split_by_worker, wds.tarfile_to_samples(handler=log_and_continue)])
    pipeline.append(wds.decode(_clap_audio))
    pipeline.append(wds.batched(batch_size, partial=not train, collation_fn=_clap_collate))
    dataset = wds.DataPipeline(*pipeline)
    if train:
        num_batches = math.ceil(num_samples / batch_size)
        dataset = dataset.with_epoch(math.ceil(num_batches / max(1, workers)))
    loader = wds.WebLoader(dataset, batch_size=None, shuffle=False, num_workers=workers, pin_memory=False,
                           prefetch_factor=2 if workers else None, **(loader_kw or {}))
    return Client(loader)


# ------------------------------------------------------------- a smoke test
# webdataset/webdataset, examples/train-resnet50-wds.ipynb: "images, classes = next(iter(trainloader))"
# (a look at one batch) before the training loop walks the loader; WebLoader(batch_size=None) over
# WebDataset(...).batched(b), and the re-batching chain .unbatched().batched(m).with_epoch(k).
def smoke_next(wds, urls, workers=0, train=True, chain=False, loader_kw=None, **_):
    ds = (wds.WebDataset(urls, shardshuffle=False).decode("pil").to_tuple("jpg;png", "cls")
          .map_tuple(to_tensor, identity).batched(16))
    loader = wds.WebLoader(ds, batch_size=None, num_workers=workers, **(loader_kw or {}))
    if chain:
        loader = loader.unbatched().batched(24).with_epoch(5)  # 5 batches: the 120 samples of an epoch
    if train:
        images, classes = next(iter(loader))  # the smoke test
        assert images.ndim == 4
    return Client(loader)


# ------------------------------------------------------------------ registry
@dataclass
class Spec:
    name: str
    build: Callable[..., Client]
    layout: str
    mode: str  # "ordered", "multiset" or "sample" (see test_pipelines.compare)
    source: str
    workers: tuple = (0, 2)
    kw: Optional[dict] = None
    epochs: int = 2
    bad_ext: str = "jpg"
    repeats: bool = False  # also compare which epochs repeat the first one's rows ("sample" mode)
    # its training pipeline draws shards with unseeded randomness (webdataset's ResampledShards
    # without deterministic=True): whether an epoch meets a damaged sample is chance on both
    # sides, so the damaged copy is read through its evaluation pipeline, which meets it every time
    unseeded: bool = False


SPECS: List[Spec] = [
    Spec("openclip_train", openclip, "imgtxt", "sample",
         "mlfoundations/open_clip src/training/data.py get_wds_dataset"),
    Spec("openclip_eval", openclip, "imgtxt", "ordered",
         "mlfoundations/open_clip src/training/data.py get_wds_dataset (is_train=False)", kw={"train": False}),
    Spec("openclip_resampled", partial(openclip, resampled=True), "imgtxt", "sample",
         "mlfoundations/open_clip src/training/data.py ResampledShards2 (--dataset-resampled)"),
    Spec("timm_train", timm, "imgcls", "ordered", "huggingface/pytorch-image-models timm/data/readers/reader_wds.py"),
    Spec("timm_eval", timm, "imgcls", "ordered",
         "huggingface/pytorch-image-models timm/data/readers/reader_wds.py (is_training=False)",
         kw={"train": False}),
    Spec("wds_readme", wds_readme, "imgcls", "multiset", "webdataset/webdataset README.md"),
    Spec("wds_train_example", wds_train_example, "imgcls", "sample",
         "webdataset/webdataset examples/train-resnet50-wds.ipynb"),
    Spec("wds_datapipeline", wds_datapipeline, "imgcls", "ordered",
         "webdataset/webdataset README.md (DataPipeline form)", kw={"train": False}),
    Spec("lavis_laion", lavis, "imgcls", "sample", "salesforce/LAVIS lavis/datasets/datasets/laion_dataset.py"),
    Spec("dalle_pytorch", dalle, "imgtxt", "ordered", "lucidrains/DALLE-pytorch train_dalle.py"),
    Spec("stable_diffusion", stable_diffusion, "imgtxt", "sample", "Stability-AI/stablediffusion ldm/data/laion.py"),
    Spec("clip_retrieval", clip_retrieval, "imgtxt", "ordered",
         "rom1504/clip-retrieval clip_retrieval/clip_inference/reader.py"),
    Spec("latents_npy", latents, "latent", "sample", "tinygrad/tinygrad examples/mlperf (SD latents)", bad_ext="npy"),
    Spec("nemo_audio", nemo_audio, "audio", "ordered", "NVIDIA/NeMo nemo/collections/asr/data/audio_to_text.py",
         bad_ext="wav"),
    Spec("video2dataset", video, "video", "ordered", "iejMac/video2dataset video2dataset/dataloader/dataloader.py",
         bad_ext="json"),
    Spec("openlm_mix", openlm, "tokens", "ordered", "mlfoundations/open_lm open_lm/data.py get_wds_dataset",
         bad_ext="json"),
    Spec("dalle2_decoder", dalle2_decoder, "imgtxt", "multiset",
         "lucidrains/DALLE2-pytorch dalle2_pytorch/dataloaders/decoder_loader.py"),
    Spec("ml4m_modalities", ml4m, "modal", "sample",
         "apple/ml-4m fourm/data/unified_datasets.py build_wds_fm_pretraining_dataloader", unseeded=True),
    Spec("clip_benchmark", clip_benchmark, "imgcls", "ordered",
         "LAION-AI/CLIP_benchmark clip_benchmark/datasets/builder.py build_wds_dataset"),
    Spec("clap", clap, "audio", "sample", "LAION-AI/CLAP src/laion_clap/training/data.py get_wds_dataset",
         bad_ext="wav", epochs=3, repeats=True),
    Spec("smoke_next", smoke_next, "imgcls", "ordered", "webdataset/webdataset examples/train-resnet50-wds.ipynb"),
    Spec("smoke_next_chain", partial(smoke_next, chain=True), "imgcls", "ordered",
         "webdataset/webdataset examples/train-resnet50-wds.ipynb (re-batching chain)"),
]

SPEC = {s.name: s for s in SPECS}
