"""Tests for resumewds.pipeline: decoders, stages, batching, DataLoader kwargs."""

from __future__ import annotations

import io
import json
import os
import pickle

import numpy as np
import PIL.Image
import pytest
import torch

import resumewds as rw
from conftest import tar_bytes
from resumewds.errors import DecodeError, UnsafeSourceError
from resumewds.pipeline import Decoder, MapDict, MapTuple, Rename, Select, ToTuple

pytestmark = pytest.mark.usefixtures("cache_dir")

PIXELS = np.arange(4 * 5 * 3, dtype=np.uint8).reshape(4, 5, 3) * 4


def _png() -> bytes:
    out = io.BytesIO()
    PIL.Image.fromarray(PIXELS).save(out, format="PNG")
    return out.getvalue()


def _jpg() -> bytes:
    out = io.BytesIO()
    PIL.Image.fromarray(PIXELS).save(out, format="JPEG", quality=95)
    return out.getvalue()


def _npy(arr) -> bytes:
    out = io.BytesIO()
    np.save(out, arr)
    return out.getvalue()


def _pth(obj) -> bytes:
    out = io.BytesIO()
    torch.save(obj, out)
    return out.getvalue()


class NotAWeight:
    """An arbitrary object: torch.load(weights_only=True) must refuse it."""


@pytest.fixture
def mixed_shard(tmp_path) -> str:
    """Six samples: the first three have .jpg, the last three .png."""
    members = []
    for i in range(6):
        k = f"m{i}"
        members += [
            (f"{k}.{'jpg' if i < 3 else 'png'}", _jpg() if i < 3 else _png()),
            (f"{k}.cls", str(i).encode()),
            (f"{k}.txt", f"text {i} é".encode()),
            (f"{k}.json", json.dumps({"i": i, "l": [1, 2]}).encode()),
            (f"{k}.npy", _npy(np.full((2, 3), i, dtype=np.int16))),
            (f"{k}.pth", _pth({"w": torch.full((2,), float(i))})),
            (f"{k}.seg.png", _png()),
            (f"{k}.bin", bytes([i]) * 3),
        ]
    p = str(tmp_path / "mixed.tar")
    with open(p, "wb") as f:
        f.write(tar_bytes(members))
    return p


def test_basic_decoders(mixed_shard):
    out = list(rw.WebDataset(mixed_shard).decode())
    assert [s["__key__"] for s in out] == [f"m{i}" for i in range(6)]
    for i, s in enumerate(out):
        assert s["cls"] == i
        assert s["txt"] == f"text {i} é"
        assert s["json"] == {"i": i, "l": [1, 2]}
        assert s["npy"].dtype == np.int16 and (s["npy"] == i).all() and s["npy"].shape == (2, 3)
        assert torch.equal(s["pth"]["w"], torch.full((2,), float(i)))
        assert s["bin"] == bytes([i]) * 3  # no decoder: bytes
        assert isinstance(s["seg.png"], bytes)  # no image spec: images stay bytes
        assert s["__url__"] == mixed_shard


def test_image_specs(mixed_shard):
    pil = list(rw.WebDataset(mixed_shard).decode("pil"))
    assert all(isinstance(s["seg.png"], PIL.Image.Image) for s in pil)
    assert pil[0]["jpg"].size == (5, 4)
    rgb8 = list(rw.WebDataset(mixed_shard).decode("rgb8"))
    assert rgb8[3]["png"].dtype == np.uint8 and (rgb8[3]["png"] == PIXELS).all()
    assert (rgb8[0]["seg.png"] == PIXELS).all()  # last dot-component picks the decoder
    assert rgb8[0]["jpg"].shape == (4, 5, 3)
    t = list(rw.WebDataset(mixed_shard).decode("torchrgb"))
    x = t[4]["png"]
    assert x.dtype == torch.float32 and x.shape == (3, 4, 5)
    assert torch.allclose(x, torch.from_numpy(PIXELS).permute(2, 0, 1).float() / 255)
    assert float(x.max()) <= 1.0
    t8 = list(rw.WebDataset(mixed_shard).decode("torchrgb8"))
    assert t8[4]["png"].dtype == torch.uint8
    l8 = list(rw.WebDataset(mixed_shard).decode("l8"))
    assert l8[4]["png"].shape == (4, 5)
    with pytest.raises(ValueError):
        Decoder(["nonsense"])


def test_custom_handler_first_then_builtins(mixed_shard):
    def upper_txt(ext, data):
        return data.decode().upper() if ext == "txt" else None

    s = next(iter(rw.WebDataset(mixed_shard).decode(upper_txt)))
    assert s["txt"] == "TEXT 0 É" and s["cls"] == 0


def test_pickle_refused_unless_allowed(tmp_path):
    p = str(tmp_path / "p.tar")
    with open(p, "wb") as f:
        f.write(tar_bytes([("a.pkl", pickle.dumps({"x": 1})), ("a.cls", b"1")]))
    with pytest.raises(UnsafeSourceError) as ei:
        list(rw.WebDataset(p).decode())
    assert "allow_pickle" in str(ei.value) and "a" in str(ei.value)
    assert list(rw.WebDataset(p).decode(allow_pickle=True))[0]["pkl"] == {"x": 1}
    assert list(rw.WebDataset(p, allow_pickle=True).decode())[0]["pkl"] == {"x": 1}
    # pth goes through weights_only: arbitrary objects are refused
    q = str(tmp_path / "q.tar")
    with open(q, "wb") as f:
        f.write(tar_bytes([("b.pth", _pth(NotAWeight()))]))
    with pytest.raises(DecodeError):
        list(rw.WebDataset(q).decode())


def test_decode_error_names_sample(tmp_path):
    p = str(tmp_path / "bad.tar")
    with open(p, "wb") as f:
        f.write(tar_bytes([("good.cls", b"1"), ("bad.cls", b"not-an-int")]))
    with pytest.raises(DecodeError) as ei:
        list(rw.WebDataset(p).decode())
    assert "bad" in str(ei.value) and ".cls" in str(ei.value) and p in str(ei.value)


def test_to_tuple_alternatives_and_missing(mixed_shard):
    out = list(rw.WebDataset(mixed_shard).decode("rgb8").to_tuple("jpg;png", "cls", "txt"))
    assert [c for _, c, _ in out] == list(range(6))
    assert all(img.shape == (4, 5, 3) for img, _, _ in out)
    with pytest.raises(DecodeError):
        list(rw.WebDataset(mixed_shard).to_tuple("webp"))
    assert ToTuple("x;y", "a", missing_is_error=False)({"y": 1}) == (1, None)
    assert ToTuple("x;y")({"x": 0, "y": 1}) == (0,)


def test_map_dict_map_tuple_rename_select(mixed_shard):
    ds = (rw.WebDataset(mixed_shard).decode()
          .map_dict(cls=lambda c: c * 10)
          .select(lambda s: s["cls"] % 20 == 0)
          .rename(label="cls", image="jpg;png"))
    out = list(ds)
    assert [s["label"] for s in out] == [0, 20, 40]
    assert all("cls" not in s and "jpg" not in s and "png" not in s for s in out)
    assert isinstance(out[0]["image"], bytes)
    # webdataset's semantics: keep=True (the default) drops the renamed fields and keeps
    # the others; keep=False keeps only the new fields
    kept = list(rw.WebDataset(mixed_shard).rename(keep=True, label="cls"))
    assert kept[0]["label"] == b"0" and "cls" not in kept[0] and "txt" in kept[0]
    only = list(rw.WebDataset(mixed_shard).rename(keep=False, label="cls", t="txt"))
    assert set(only[0]) == {"label", "t"}
    with pytest.raises(DecodeError):
        list(rw.WebDataset(mixed_shard).rename(x="nope"))
    t = list(rw.WebDataset(mixed_shard).decode().to_tuple("cls", "txt").map_tuple(lambda c: -c, None))
    assert t[2] == (-2, "text 2 é")
    assert MapTuple(str)((1, 2)) == ("1", 2)  # webdataset: the first min(len) fields
    assert MapDict(a=str)({"a": 1, "b": 2}) == {"a": "1", "b": 2}
    with pytest.raises(KeyError):
        MapDict(c=str)({"a": 1})
    assert Select(bool)(0) is None
    assert Rename(x="a")({"a": 1, "__key__": "k"}) == {"x": 1, "__key__": "k"}


def test_map_gets_position_metadata(shards):
    ds = rw.WebDataset(shards[:2], seed=1, shuffle=True).map(lambda s: (s["__epoch__"], s["__index__"],
                                                                       s["__shard__"]))
    out = list(ds)
    assert [i for _, i, _ in out] == list(range(74))
    assert {e for e, _, _ in out} == {0}
    assert {sh for _, _, sh in out} == {os.path.basename(p) for p in shards[:2]}


def test_batched_with_loader_batch_size_none(shards):
    ds = (rw.WebDataset(shards[:2], seed=3, shuffle=True).decode().to_tuple("cls", "txt")
          .batched(16).map(lambda b: (b[0] * 2, b[1])))
    loader = rw.WebLoader(ds, batch_size=None, num_workers=0)
    batches = list(loader)
    assert [len(b[0]) for b in batches] == [16, 16, 16, 16, 10]
    # webdataset's default collation gives numpy, and WebLoader(batch_size=None) is a DataLoader
    # without automatic batching: torch's default_convert makes it a tensor (as webdataset's WebLoader)
    assert isinstance(batches[0][0], torch.Tensor)
    ref = [c for c, _ in rw.WebDataset(shards[:2], seed=3, shuffle=True).decode().to_tuple("cls", "txt")]
    assert np.concatenate([b[0] for b in batches]).tolist() == [2 * c for c in ref]
    assert loader.epoch == 1 and loader.position == 0
    with pytest.raises(ValueError):
        rw.WebLoader(ds, batch_size=8)
    lst = rw.WebDataset(shards[:1]).batched(10, collation_fn=None)
    assert [len(b) for b in rw.WebLoader(lst)] == [10, 10, 10, 7]
    with pytest.raises(ValueError):  # selecting batches: a stream stage WebLoader refuses
        rw.WebLoader(rw.WebDataset(shards[:1]).batched(4).select(bool))
    with pytest.raises(ValueError):
        rw.WebDataset(shards[:1]).batched(0)


def test_loader_collates_dicts_and_keeps_strings(shards):
    loader = rw.WebLoader(rw.WebDataset(shards[:1]).decode(), batch_size=8)
    b = next(iter(loader))
    assert isinstance(b["cls"], torch.Tensor) and b["cls"].shape == (8,)
    assert b["__key__"] == [f"s000000_{i:06d}" for i in range(8)]
    loader = rw.WebLoader(rw.WebDataset(shards[:1]), batch_size=5, collate_fn=list)
    first = next(iter(loader))
    assert isinstance(first, list) and len(first) == 5 and first[0]["__key__"] == "s000000_000000"


def test_dataloader_kwargs_pass_through(shards, tmp_path):
    flag = tmp_path / "worker-init"

    def init(worker_id, path=str(flag)):
        with open(f"{path}-{worker_id}", "w") as f:
            f.write("ok")

    ds = rw.WebDataset(shards[:1]).to_tuple("cls")
    loader = rw.WebLoader(ds, batch_size=8, num_workers=1, pin_memory=False, timeout=30,
                          worker_init_fn=init, prefetch_factor=2, persistent_workers=False)
    assert sum(len(b[0]) for b in loader) == 37
    assert os.path.exists(f"{flag}-0")
    # prefetch_factor is dropped for num_workers=0 (torch would refuse it)
    assert sum(len(b[0]) for b in rw.WebLoader(ds, batch_size=8, prefetch_factor=2)) == 37
    # a bad value reaches torch's DataLoader and is rejected there
    with pytest.raises(ValueError):
        list(rw.WebLoader(ds, batch_size=8, timeout=-1))
    for bad in ("shuffle", "sampler", "batch_sampler"):
        with pytest.raises(ValueError):
            rw.WebLoader(ds, batch_size=8, **{bad: True})
    # drop_last maps to remainder="drop"
    assert [len(b[0]) for b in rw.WebLoader(ds, batch_size=8, drop_last=True)] == [8, 8, 8, 8]
    with pytest.raises(TypeError):
        rw.WebLoader(object(), batch_size=1)


def test_to_tuple_fast_path_is_the_general_path():
    """One name per field is picked with itemgetter; every outcome (present,
    missing, None, a dict subclass, a non-dict) is the general path's."""
    import collections

    both = ToTuple("a", "b")
    general = both._general
    assert both({"a": 1, "b": 2, "c": 3}) == general({"a": 1, "b": 2}) == (1, 2)
    with pytest.raises(ValueError, match="none of b"):
        both({"a": 1})
    with pytest.raises(ValueError, match="got a None field"):
        both({"a": 1, "b": None})
    lax = ToTuple("a", "b", missing_is_error=False)
    assert lax({"a": 1}) == (1, None)
    # a defaultdict: "in" says missing, [] would invent a value; the general path decides
    dd = collections.defaultdict(int, a=1)
    assert lax(dd) == (1, None) and "b" not in dd
    assert ToTuple("a")({"a": 1}) == (1,)  # one field: still a tuple
    import pickle

    again = pickle.loads(pickle.dumps(both))
    assert again({"a": 1, "b": 2}) == (1, 2)
