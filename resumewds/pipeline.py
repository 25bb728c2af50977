"""WebDataset-style stages and decoders.

Stages are plain callables applied to one sample (a dict, or a tuple after
``to_tuple``) or, after ``batched``, to one batch.  They run inside the
DataLoader workers; every one of them is deterministic given the sample, so
resuming never depends on what a stage saw before.  A stage that wants
randomness should seed it from ``sample["__index__"]`` and
``sample["__epoch__"]`` (the sample's global position), which are the same
in every run and every layout.

Decoders map ``(extension, bytes)`` to a value.  The extension's last
dot-component picks the decoder (``seg.png`` decodes as ``png``).  Built in:

===================  =====================================================
extensions           result
===================  =====================================================
txt, text            ``str`` (UTF-8)
cls, cls2, index,    ``int``
inx, id
json, jsn            parsed JSON
npy                  ``numpy.ndarray`` (``allow_pickle=False``)
pth, pt              ``torch.load(..., weights_only=True)``
pkl, pickle, pyd     only with ``allow_pickle=True``: a shard from elsewhere
                     must not run code here
jpg, jpeg, png, ...  images through PIL; the image spec picks the form:
                     ``"pil"`` (``PIL.Image``), ``"rgb8"`` / ``"l8"``
                     (uint8 numpy HWC / HW), ``"rgb"`` / ``"l"`` (float
                     numpy in [0, 1]), ``"torchrgb8"``, ``"torchrgb"``,
                     ``"torchl8"``, ``"torchl"`` (CHW tensors)
===================  =====================================================

Example:
    >>> d = Decoder(["rgb8"])
    >>> d({"__key__": "k", "cls": b"3", "txt": b"hi"})["cls"]
    3
"""

from __future__ import annotations

import io
import json
from typing import Any, Callable, Dict, List, Optional, Sequence, Tuple, Union

from .errors import DecodeError, UnsafeSourceError

IMAGE_EXTS = {"jpg", "jpeg", "png", "ppm", "pgm", "pbm", "pnm", "webp", "bmp", "gif", "tif", "tiff"}
IMAGE_SPECS = {"pil", "rgb8", "l8", "rgb", "l", "rgba8", "rgba",
               "torchrgb8", "torchrgb", "torchl8", "torchl", "torchrgba8", "torchrgba"}
PICKLE_EXTS = {"pkl", "pickle", "pyd"}


def _text(data: bytes) -> str:
    return data.decode("utf-8")


def _int(data: bytes) -> int:
    return int(data.decode("ascii").strip())


def _json(data: bytes) -> Any:
    return json.loads(data)


def _npy(data: bytes) -> Any:
    import numpy as np

    return np.load(io.BytesIO(data), allow_pickle=False)


def _torch(data: bytes) -> Any:
    import torch

    return torch.load(io.BytesIO(data), weights_only=True)


def _pickle(data: bytes) -> Any:
    import pickle

    return pickle.loads(data)


BASIC: Dict[str, Callable[[bytes], Any]] = {
    "txt": _text, "text": _text,
    "cls": _int, "cls2": _int, "index": _int, "inx": _int, "id": _int,
    "json": _json, "jsn": _json,
    "npy": _npy,
    "pth": _torch, "pt": _torch,
}


def decode_image(spec: str, data: bytes) -> Any:
    """Decode image bytes with PIL into the form named by ``spec``."""
    import PIL.Image

    with PIL.Image.open(io.BytesIO(data)) as img:
        img.load()
        if spec == "pil":
            return img.copy()
        mode = "L" if spec.endswith(("l8", "l")) and not spec.endswith("rgba") else (
            "RGBA" if "rgba" in spec else "RGB")
        img = img.convert(mode)
    import numpy as np

    arr = np.asarray(img)
    if spec in ("rgb8", "l8", "rgba8"):
        return arr
    if spec in ("rgb", "l", "rgba"):
        return arr.astype("float32") / 255.0
    import torch

    t = torch.from_numpy(np.array(arr))
    if t.ndim == 3:
        t = t.permute(2, 0, 1)
    if spec.endswith("8"):
        return t
    return t.float() / 255.0


Handler = Callable[[str, bytes], Any]


class Decoder:
    """Decode the raw members of a sample.

    Args:
        handlers: image specs (``"pil"``, ``"rgb8"``, ``"torchrgb"``...) and/or
            callables ``(extension, data) -> value or None``; a callable that
            returns None passes the member on to the next handler.
        allow_pickle: decode pkl/pickle/pyd (off by default: unpickling runs
            code from the shard).

    Members with no decoder stay bytes.  Errors raise
    :class:`~resumewds.errors.DecodeError` naming the sample and extension.
    """

    def __init__(self, handlers: Sequence[Union[str, Handler]] = (), allow_pickle: bool = False):
        self.image_spec: Optional[str] = None
        self.custom: List[Handler] = []
        for h in handlers:
            if isinstance(h, str):
                if h not in IMAGE_SPECS:
                    raise ValueError(f"unknown image spec {h!r}; choose one of {sorted(IMAGE_SPECS)}")
                self.image_spec = h
            elif callable(h):
                self.custom.append(h)
            else:
                raise TypeError(f"decode handler must be a string or callable, got {h!r}")
        self.allow_pickle = allow_pickle

    def decode_one(self, ext: str, data: bytes) -> Any:
        for h in self.custom:
            r = h(ext, data)
            if r is not None:
                return r
        last = ext.rsplit(".", 1)[-1]
        f = BASIC.get(last)
        if f is not None:
            return f(data)
        if last in IMAGE_EXTS and self.image_spec is not None:
            return decode_image(self.image_spec, data)
        if last in PICKLE_EXTS:
            if not self.allow_pickle:
                raise UnsafeSourceError(
                    f"member .{ext} would be unpickled, which can run code from the shard; "
                    "pass allow_pickle=True to decode() if you trust the data")
            return _pickle(data)
        return data

    def __call__(self, sample: Dict[str, Any]) -> Dict[str, Any]:
        out: Dict[str, Any] = {}
        for k, v in sample.items():
            if k.startswith("__") or not isinstance(v, (bytes, bytearray)):
                out[k] = v
                continue
            try:
                out[k] = self.decode_one(k, bytes(v))
            except UnsafeSourceError as exc:
                raise UnsafeSourceError(f"{sample.get('__url__')}: sample {sample.get('__key__')}: {exc}") from None
            except Exception as exc:
                raise DecodeError(f"{sample.get('__url__')}: sample {sample.get('__key__')}: "
                                  f"cannot decode .{k}: {type(exc).__name__}: {exc}") from exc
        return out


class ToTuple:
    """Pick fields into a tuple; ``"jpg;png"`` takes the first present."""

    def __init__(self, *specs: str, missing_is_error: bool = True):
        self.specs = [s.split(";") for s in specs]
        self.missing_is_error = missing_is_error

    def __call__(self, sample: Dict[str, Any]) -> Tuple[Any, ...]:
        out = []
        for alts in self.specs:
            for a in alts:
                if a in sample:
                    out.append(sample[a])
                    break
            else:
                if self.missing_is_error:
                    raise DecodeError(f"{sample.get('__url__')}: sample {sample.get('__key__')} has none of "
                                      f"{';'.join(alts)} (it has {sorted(k for k in sample if not k.startswith('__'))})")
                out.append(None)
        return tuple(out)


class MapDict:
    def __init__(self, **fns: Callable[[Any], Any]):
        self.fns = fns

    def __call__(self, sample: Dict[str, Any]) -> Dict[str, Any]:
        out = dict(sample)
        for k, f in self.fns.items():
            if k in out:
                out[k] = f(out[k])
        return out


class MapTuple:
    def __init__(self, *fns: Optional[Callable[[Any], Any]]):
        self.fns = fns

    def __call__(self, t: Tuple[Any, ...]) -> Tuple[Any, ...]:
        if len(t) != len(self.fns):
            raise DecodeError(f"map_tuple got {len(self.fns)} functions for a tuple of {len(t)}")
        return tuple(x if f is None else f(x) for f, x in zip(self.fns, t))


class Rename:
    """``rename(image="jpg;png", label="cls")``: new names from the first present old one."""

    def __init__(self, keep: bool = False, **kw: str):
        self.map = {new: old.split(";") for new, old in kw.items()}
        self.keep = keep

    def __call__(self, sample: Dict[str, Any]) -> Dict[str, Any]:
        out = dict(sample)
        used = set()
        for new, alts in self.map.items():
            for a in alts:
                if a in sample:
                    out[new] = sample[a]
                    used.add(a)
                    break
            else:
                raise DecodeError(f"{sample.get('__url__')}: sample {sample.get('__key__')}: "
                                  f"rename: none of {';'.join(alts)} present")
        if not self.keep:
            for a in used:
                if a not in self.map:
                    out.pop(a, None)
        return out


class Select:
    """Keep samples for which the predicate is true (others are filtered out)."""

    def __init__(self, predicate: Callable[[Any], bool]):
        self.predicate = predicate

    def __call__(self, sample: Any) -> Any:
        return sample if self.predicate(sample) else None


def default_collate(samples: List[Any]) -> Any:
    """torch's default_collate (strings and bytes become lists)."""
    from torch.utils.data import default_collate as dc

    return dc(samples)


def list_collate(samples: List[Any]) -> List[Any]:
    """No collation: the batch is the list of samples."""
    return list(samples)


from .autodecode import Decoder, decode_image  # noqa: E402,F401,F811  (H4b: webdataset-compatible decoders replace the ones above)
