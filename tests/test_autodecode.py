"""Tests for resumewds.autodecode: webdataset 1.0.2's specs, handlers and member types.

Results are compared with the real webdataset package's decoders on the same bytes.
"""

from __future__ import annotations

import gzip
import io
import json
import pickle

import numpy as np
import PIL.Image
import pytest
import torch
import webdataset as real_wds
from webdataset import autodecode as real_ad
from webdataset import tenbin as real_tenbin

import resumewds as rw
import resumewds.utils
from conftest import tar_bytes
from resumewds import autodecode as ad
from resumewds.errors import DecodeError, UnsafeSourceError

pytestmark = pytest.mark.usefixtures("cache_dir")


def _img(mode: str, fmt: str) -> bytes:
    rng = np.random.default_rng(0)
    shape = {"L": (6, 7), "RGB": (6, 7, 3), "RGBA": (6, 7, 4)}[mode]
    arr = rng.integers(0, 256, size=shape, dtype=np.uint8)
    out = io.BytesIO()
    PIL.Image.fromarray(arr, mode).save(out, format=fmt)
    return out.getvalue()


IMAGES = {"png_l": _img("L", "PNG"), "png_rgb": _img("RGB", "PNG"), "png_rgba": _img("RGBA", "PNG"),
          "jpg": _img("RGB", "JPEG")}


def _same(a, b) -> None:
    if isinstance(a, PIL.Image.Image):
        assert isinstance(b, PIL.Image.Image) and a.mode == b.mode and a.size == b.size
        assert a.tobytes() == b.tobytes()
    elif isinstance(a, torch.Tensor):
        assert isinstance(b, torch.Tensor) and a.dtype == b.dtype and a.shape == b.shape
        assert torch.equal(a, b)
    else:
        assert type(a) is type(b) and a.dtype == b.dtype and a.shape == b.shape
        assert np.array_equal(a, b)


@pytest.mark.parametrize("spec", sorted(real_ad.imagespecs))
def test_every_image_spec_matches_webdataset(spec):
    assert set(ad.imagespecs) == set(real_ad.imagespecs)
    ours, theirs = ad.ImageHandler(spec), real_ad.ImageHandler(spec)
    for name, data in IMAGES.items():
        ext = ".jpg" if name == "jpg" else ".png"
        _same(ours(ext, data), theirs(ext, data))
    assert ours(".cls", b"1") is None
    # the string form through a Decoder (what .decode("rgb8") does)
    s = {"__key__": "a", "png": IMAGES["png_rgb"]}
    _same(ad.Decoder([spec])(s)["png"], real_ad.Decoder([real_ad.imagehandler(spec)])(s)["png"])


def test_unknown_spec_is_a_value_error():
    with pytest.raises(ValueError, match="unknown image spec"):
        ad.Decoder(["rgb9"])
    with pytest.raises(ValueError):
        rw.imagehandler("nonsense")


def _members() -> dict:
    arr = np.arange(12, dtype=np.float32).reshape(3, 4)
    npz = io.BytesIO()
    np.savez(npz, a=arr, b=np.arange(3))
    npy = io.BytesIO()
    np.save(npy, arr)
    import cbor2
    import msgpack

    return {
        "txt": "héllo".encode(), "text": b"t", "transcript": b"tr", "cls": b" 7\n", "cls2": b"2",
        "index": b"3", "inx": b"4", "id": b"5", "json": json.dumps({"a": [1, 2]}).encode(),
        "jsn": b"[1]", "npy": npy.getvalue(), "npz": npz.getvalue(),
        "ten": bytes(real_tenbin.encode_buffer([arr, np.arange(5, dtype=np.int16)])),
        "mp": msgpack.packb({"x": 1}), "msgpack": msgpack.packb([1, 2]),
        "cbor": cbor2.dumps({"c": 3}), "json.gz": gzip.compress(b'{"z": 9}'),
        "txt.gz": gzip.compress(b"zipped"), "bin": b"\x00\x01",
    }


def _eq(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(_eq(a[k], b[k]) for k in a)
    if isinstance(a, list):
        return len(a) == len(b) and all(_eq(x, y) for x, y in zip(a, b))
    if isinstance(a, np.ndarray):
        return a.dtype == b.dtype and np.array_equal(a, b)
    return a == b


def test_basic_members_match_webdataset():
    m = _members()
    sample = {"__key__": "k", "__url__": "u", **m}
    ours = ad.Decoder([])(sample)
    real = dict(sample)
    del real["msgpack"]  # webdataset 1.0.2 knows mp/msg only (ours adds msgpack)
    del real["cbor"]  # webdataset imports the old `cbor` package (not installed); checked below
    theirs = real_ad.Decoder([])(real)
    for k in real:
        assert _eq(ours[k], theirs[k]), k
    assert ours["msgpack"] == [1, 2] and ours["cbor"] == {"c": 3}
    assert ours["json.gz"] == {"z": 9} and ours["txt.gz"] == "zipped" and ours["bin"] == b"\x00\x01"
    assert [a.tolist() for a in ours["ten"]] == [np.arange(12).reshape(3, 4).tolist(), list(range(5))]
    assert ours["cls"] == 7 and ours["txt"] == "héllo"


def test_custom_handler_gets_webdatasets_key_and_continue():
    seen = []

    def spy(key, data):
        seen.append(key)
        return None

    ad.Decoder([spy])({"__key__": "k", "seg.png": b"x", "json.gz": gzip.compress(b"1")})
    theirs = []
    real_ad.Decoder([lambda k, d: theirs.append(k)])({"__key__": "k", "seg.png": b"x",
                                                       "json.gz": gzip.compress(b"1")})
    assert seen == theirs == [".seg.png", ".json"]
    # a handler written for resumewds 0.1 (dotless extension) still matches
    assert ad.Decoder([lambda ext, d: "yes" if ext == "seg.png" else None])({"seg.png": b""})["seg.png"] == "yes"

    def rot(key, data):
        return ad.Continue(key[:-4], data[::-1]) if key.endswith(".rev") else None

    assert ad.Decoder([rot])({"__key__": "k", "txt.rev": b"olleh"})["txt.rev"] == "hello"


def test_handle_extension_and_order():
    up = rw.handle_extension("seg.png", lambda b: "seg")
    assert up(".seg.png", b"") == "seg" and up(".png", b"") is None and up(".SEG.PNG", b"") == "seg"
    d = ad.Decoder([rw.handle_extension("cls", lambda b: -1), "rgb8"])
    out = d({"__key__": "a", "cls": b"3", "png": IMAGES["png_rgb"]})
    assert out["cls"] == -1 and out["png"].dtype == np.uint8


def test_only_and_partial():
    s = {"__key__": b"k", "txt": b"a", "cls": b"1"}
    out = ad.Decoder([], only="cls")(s)
    assert out == {"__key__": "k", "txt": b"a", "cls": 1}
    with pytest.raises(DecodeError) as ei:
        ad.Decoder([])({"__key__": "k", "__url__": "u.tar", "cls": 3})
    assert "partial=True" in str(ei.value) and ei.value.k == "cls" and ei.value.key == "k"
    assert ad.Decoder([], partial=True)({"__key__": "k", "cls": 3, "txt": b"x"}) == \
        {"__key__": "k", "cls": 3, "txt": "x"}


def test_pickle_rule_and_enforce_security(tmp_path):
    pk = pickle.dumps({"x": 1})
    buf = io.BytesIO()
    torch.save({"w": torch.ones(2)}, buf)
    pth = buf.getvalue()
    with pytest.raises(UnsafeSourceError, match="allow_pickle"):
        ad.Decoder([])({"__key__": "k", "pyd": pk})
    assert ad.Decoder([], allow_pickle=True)({"__key__": "k", "pyd": pk})["pyd"] == {"x": 1}
    assert torch.equal(ad.Decoder([])({"__key__": "k", "pth": pth})["pth"]["w"], torch.ones(2))
    # the stock basichandlers given explicitly still obeys allow_pickle
    with pytest.raises(UnsafeSourceError):
        ad.Decoder([ad.basichandlers])({"__key__": "k", "pickle": pk})
    p = str(tmp_path / "p.tar")
    with open(p, "wb") as f:
        f.write(tar_bytes([("a.pkl", pk), ("a.pth", pth)]))
    assert list(rw.WebDataset(p).decode(allow_pickle=True))[0]["pkl"] == {"x": 1}
    old = resumewds.utils.enforce_security
    try:
        resumewds.utils.enforce_security = True
        with pytest.raises(ValueError, match="Unpickling is not allowed"):
            ad.unpickle_loads(pk)
        with pytest.raises(ValueError, match="torch.loads is not allowed"):
            ad.torch_loads(pth)
        with pytest.raises(UnsafeSourceError, match="enforce_security"):
            ad.Decoder([], allow_pickle=True)({"__key__": "k", "pyd": pk})
        with pytest.raises(UnsafeSourceError):
            list(rw.WebDataset(p).decode(allow_pickle=True))
    finally:
        resumewds.utils.enforce_security = old
    assert ad.unpickle_loads(pk) == {"x": 1}


def test_decode_in_a_dataset_matches_webdataset(tmp_path):
    members = []
    for i in range(4):
        members += [(f"s{i}.png", IMAGES["png_rgb"]), (f"s{i}.cls", str(i).encode()),
                    (f"s{i}.json.gz", gzip.compress(json.dumps({"i": i}).encode()))]
    p = str(tmp_path / "d.tar")
    with open(p, "wb") as f:
        f.write(tar_bytes(members))
    ours = list(rw.WebDataset(p).decode("torchrgb").to_tuple("png", "cls", "json.gz"))
    theirs = list(real_wds.WebDataset(p, shardshuffle=False).decode("torchrgb").to_tuple("png", "cls", "json.gz"))
    assert len(ours) == len(theirs) == 4
    for a, b in zip(ours, theirs):
        _same(a[0], b[0])
        assert a[1:] == b[1:]


def test_pipeline_reexport_is_the_new_decoder():
    from resumewds.pipeline import Decoder, decode_image

    assert Decoder is ad.Decoder and decode_image is ad.decode_image
    assert rw.Decoder is ad.Decoder


def test_optional_av_handlers_ignore_other_members():
    assert ad.torch_video(".cls", b"1") is None and ad.torch_audio(".txt", b"") is None


@pytest.mark.parametrize("mode", ["L", "RGB", "RGBA", "1", "P", "I;16", "F", "LA", "CMYK", "I"])
@pytest.mark.parametrize("size", [(1, 1), (37, 5), (300, 211), (1024, 70)])
def test_pil_array_is_numpy_asarray(mode, size):
    """The one-piece pixel copy gives exactly ``np.asarray(img)``: dtype, shape,
    values and (read-only) flags, for the modes it packs and the ones it leaves to numpy."""
    rng = np.random.default_rng(hash((mode, size)) & 0xFFFF)
    img = PIL.Image.fromarray(rng.integers(0, 256, (size[1], size[0], 3), dtype=np.uint8)).convert(mode)
    got, want = ad._pil_array(img), np.asarray(img)
    assert got.dtype == want.dtype and got.shape == want.shape
    assert np.array_equal(got, want)
    assert got.flags.writeable == want.flags.writeable


def test_rgb8_decode_matches_webdataset_on_jpeg_and_png():
    for fmt in ("JPEG", "PNG"):
        data = _img("RGB", fmt)
        ours = ad.decode_image("rgb8", data)
        theirs = real_ad.imagehandler("rgb8")("x." + ("jpg" if fmt == "JPEG" else "png"), data)
        assert ours.dtype == theirs.dtype and np.array_equal(ours, theirs)
