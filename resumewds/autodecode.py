"""Decoders with webdataset 1.0.2's specs, handlers and protocol.

A *handler* is ``handler(key, data) -> value``, None (not mine) or
:class:`Continue` (a new ``(key, data)``, as ``*.gz`` members are handed on);
``key`` is the extension with a leading dot (``".seg.png"``), and also equals
its dotless form.  A :class:`Decoder` tries ``pre`` (``[gzfilter]``), its
handlers, then ``post`` (``[basichandlers]``); an unclaimed member stays bytes.

Image specs (strings given to ``decode``) are webdataset's:

=========================  ===============================================
spec                       result
=========================  ===============================================
``l8 rgb8 rgba8``          numpy uint8, HW / HWC
``l rgb rgba``             numpy float32 in [0, 1]
``torchl8 torchrgb8``      torch uint8, HW / CHW
``torchrgba8``
``torchl torchrgb torch``  torch float32 in [0, 1]
``torchrgba``
``pil pilrgb``             ``PIL.Image`` converted to RGB
``pill`` / ``pilrgba``     ``PIL.Image`` converted to L / RGBA
=========================  ===============================================

The other members ``basichandlers`` decodes are in :data:`decoders`.

Security (unlike webdataset): ``pkl pickle pyd`` need ``allow_pickle=True``,
and ``pth`` loads with ``weights_only=True`` without it; ``WDS_SECURE=1``
refuses all of them.

Example:
    >>> d = Decoder(["rgb8"])
    >>> d({"__key__": "k", "cls": b"3", "txt": b"hi"})["cls"]
    3
    >>> basichandlers(".json", b'{"a": 1}')
    {'a': 1}
"""

from __future__ import annotations

import io
import json
import os
import pickle
import tempfile
from functools import partial as _partial
from typing import Any, Callable, Dict, Iterable, List, Optional, Sequence, Union

from . import _lazy, config
from .errors import DecodeError, UnsafeSourceError
from .sources import _urls as urls
from .tenbin import decode_buffer

__all__ = ["Continue", "Decoder", "DecodingError", "IMAGE_EXTENSIONS", "ImageHandler",
           "basichandlers", "cbor_loads", "decode_image", "decoders", "gzfilter",
           "handle_extension", "imagehandler", "imagespecs", "install_hint", "msgpack_loads", "npy_loads",
           "npz_loads", "pytorch_weights_only", "tenbin_loads", "torch_audio", "torch_loads", "torch_video",
           "unpickle_loads"]

Handler = Callable[[str, bytes], Any]

# webdataset's list (PIL.Image.EXTENSION entries PIL can open)
IMAGE_EXTENSIONS: List[str] = (
    "blp bmp dib bufr cur pcx dcx dds ps eps fit fits fli flc ftc ftu gbr gif grib h5 hdf "
    "png apng jp2 j2k jpc jpf jpx j2c icns ico im iim tif tiff jfif jpe jpg jpeg mpg mpeg "
    "msp pcd pxr pbm pgm ppm pnm psd bw rgb rgba sgi ras tga icb vda vst webp wmf emf xbm "
    "xpm").split()

PICKLE_EXTS = frozenset({"pkl", "pickle", "pyd"})

DecodingError = DecodeError  # webdataset's name for a failed decode
EnforcedSecurityError = urls.EnforcedSecurityError  # refused under enforce_security (a ValueError)


class _Key(str):
    """webdataset's ``"." + extension`` key that also equals the dotless form."""

    __slots__ = ()

    def __eq__(self, other: object) -> bool:
        if isinstance(other, str):
            return str.__eq__(self, other) or str.__eq__(self[1:], other)
        return NotImplemented

    def __ne__(self, other: object) -> bool:
        r = self.__eq__(other)
        return r if r is NotImplemented else not r

    __hash__ = str.__hash__


def _ext(key: str) -> str:
    """The last dot-component (webdataset: ``re.sub(r".*[.]", "", key)``)."""
    return key.rsplit(".", 1)[-1]


# ---- basic data types -------------------------------------------------------

def _security_check(what: str) -> None:
    if urls.secure():
        raise EnforcedSecurityError(what)


#: webdataset's switch: ``torch_loads`` with ``weights_only=True``; ``WDS_PYTORCH_WEIGHTS_ONLY=1``
#: at import sets it, and so may your code (``wds.autodecode.pytorch_weights_only = True``)
pytorch_weights_only: bool = bool(config.value("pytorch_weights_only"))


def torch_loads(data: bytes) -> Any:
    """``torch.load`` of a member (``weights_only`` when :data:`pytorch_weights_only` is set, or
    ``WDS_PYTORCH_WEIGHTS_ONLY=1``); EnforcedSecurityError under ``enforce_security``."""
    return _torch_weights(data, pytorch_weights_only or bool(config.value("pytorch_weights_only")))


def _torch_weights(data: bytes, weights_only: bool = True) -> Any:
    _security_check("torch.loads is not allowed for security reasons when enforce_security is set.")
    import torch

    return torch.load(io.BytesIO(data), weights_only=weights_only, map_location="cpu")


def unpickle_loads(data: bytes) -> Any:
    """``pickle.loads`` (runs code from the data); EnforcedSecurityError under ``enforce_security``."""
    _security_check("Unpickling is not allowed for security reasons when enforce_security is set.")
    return pickle.loads(data)


def npy_loads(data: bytes) -> Any:
    """A ``.npy`` array (never unpickles object arrays)."""
    import numpy.lib.format

    return numpy.lib.format.read_array(io.BytesIO(data), allow_pickle=False)


def npz_loads(data: bytes) -> Dict[str, Any]:
    """A ``.npz`` archive as a dict of arrays."""
    import numpy as np

    with np.load(io.BytesIO(data), allow_pickle=False) as z:
        return dict(z)


def msgpack_loads(data: bytes) -> Any:
    """A msgpack value (needs the ``msgpack`` package)."""
    import msgpack

    return msgpack.unpackb(data)


def cbor_loads(data: bytes) -> Any:
    """A CBOR value (``cbor2``, from the ``formats`` extra; webdataset reads the same bytes with ``cbor``)."""
    import cbor2

    return cbor2.loads(data)


def tenbin_loads(data: bytes) -> List[Any]:
    """webdataset's tenbin format (``.ten``): a list of numpy arrays (see :mod:`resumewds.tenbin`)."""
    return decode_buffer(data)


def _text(data: bytes) -> str:
    return data.decode("utf-8")


decoders: Dict[str, Callable[[bytes], Any]] = {
    "txt": _text, "text": _text, "transcript": _text,
    "cls": int, "cls2": int, "index": int, "inx": int, "id": int,
    "json": json.loads, "jsn": json.loads,
    "pkl": unpickle_loads, "pickle": unpickle_loads, "pyd": unpickle_loads,
    "pth": torch_loads, "pt": torch_loads,
    "ten": tenbin_loads, "tb": tenbin_loads,
    "mp": msgpack_loads, "msg": msgpack_loads, "msgpack": msgpack_loads,
    "npy": npy_loads, "npz": npz_loads,
    "cbor": cbor_loads,
}
"""webdataset's extension -> loader table used by :func:`basichandlers`."""


def basichandlers(key: str, data: bytes) -> Any:
    """Decode the basic types by the key's last extension (see :data:`decoders`).

    A :class:`Decoder` uses a variant that applies its ``allow_pickle`` rule.

    Example:
        >>> basichandlers(".cls", b"7"), basichandlers(".png", b"..")
        (7, None)
    """
    f = decoders.get(_ext(key))
    return None if f is None else f(data)


class _SafeBasic:
    """:func:`basichandlers` under a Decoder's ``allow_pickle`` rule."""

    def __init__(self, allow_pickle: bool):
        self.allow_pickle = allow_pickle

    def __call__(self, key: str, data: bytes) -> Any:
        ext = _ext(key)
        f = decoders.get(ext)
        if f is None:
            return None
        if not self.allow_pickle:
            if ext in PICKLE_EXTS:
                raise UnsafeSourceError(
                    f"member {key} would be unpickled, which can run code from the shard; "
                    "pass allow_pickle=True to decode() if you trust the data")
            if f is torch_loads:
                f = _torch_weights
        return f(data)


def call_extension_handler(key: str, data: bytes, f: Callable[[bytes], Any],
                           extensions: Sequence[str]) -> Any:
    """Call ``f(data)`` if the key ends with one of ``extensions`` (dotted ones allowed)."""
    parts = key.lower().split(".")
    for target in extensions:
        t = target.split(".")
        if len(t) <= len(parts) and parts[-len(t):] == t:
            return f(data)
    return None


def handle_extension(extensions: str, f: Callable[[bytes], Any]) -> Handler:
    """A handler that calls ``f(data)`` for members with one of ``extensions``.

    ``extensions``: space-separated, case-insensitive; ``"seg.jpg"`` matches only ``*.seg.jpg``.

    Example:
        >>> h = handle_extension("txt text", lambda b: b.decode().upper())
        >>> h(".txt", b"hi"), h(".cls", b"1")
        ('HI', None)
    """
    return _partial(call_extension_handler, f=f, extensions=extensions.lower().split())


# ---- images -----------------------------------------------------------------

imagespecs: Dict[str, tuple] = {
    "l8": ("numpy", "uint8", "l"), "rgb8": ("numpy", "uint8", "rgb"),
    "rgba8": ("numpy", "uint8", "rgba"), "l": ("numpy", "float", "l"),
    "rgb": ("numpy", "float", "rgb"), "rgba": ("numpy", "float", "rgba"),
    "torchl8": ("torch", "uint8", "l"), "torchrgb8": ("torch", "uint8", "rgb"),
    "torchrgba8": ("torch", "uint8", "rgba"), "torchl": ("torch", "float", "l"),
    "torchrgb": ("torch", "float", "rgb"), "torch": ("torch", "float", "rgb"),
    "torchrgba": ("torch", "float", "rgba"), "pill": ("pil", None, "l"),
    "pil": ("pil", None, "rgb"), "pilrgb": ("pil", None, "rgb"), "pilrgba": ("pil", None, "rgba"),
}
"""spec -> (array type, element type, colour mode), as in webdataset."""


_PIL_CHANNELS = {"L": 0, "RGB": 3, "RGBA": 4}  # 8-bit modes packed by _pil_array (0: no channel axis)


def _pil_array(img: Any) -> Any:
    """``numpy.asarray(img)`` without its second copy (Pillow's ``tobytes`` joins 64 KB pieces;
    one piece of the whole image is one copy fewer); other modes take ``numpy.asarray``."""
    import numpy as np

    ch = _PIL_CHANNELS.get(img.mode)
    w, h = img.size
    if ch is None or w == 0 or h == 0:
        return np.asarray(img)
    try:
        import PIL.Image

        enc = PIL.Image._getencoder(img.mode, "raw", img.mode)
        try:
            enc.setimage(img.im, (0, 0, w, h))
            n = w * h * (ch or 1)
            _, err, data = enc.encode(n + 1)
        finally:
            enc.cleanup()
    except (AttributeError, TypeError, ValueError, OSError):
        return np.asarray(img)
    if err == 0 or len(data) != n:  # not done in one piece: let Pillow do it its way
        return np.asarray(img)
    return np.frombuffer(data, np.uint8).reshape((h, w, ch) if ch else (h, w))


def decode_image(spec: str, data: bytes) -> Any:
    """Decode image bytes with PIL into the form named by ``spec`` (:data:`imagespecs`; else ValueError)."""
    try:
        atype, etype, mode = imagespecs[spec]
    except KeyError:
        raise ValueError(f"unknown image spec {spec!r}; choose one of {sorted(imagespecs)}") from None
    import PIL.Image

    with PIL.Image.open(io.BytesIO(data)) as img:
        img.load()
        # a convert() to the same mode is a plain copy: only "pil" needs it (a plain Image)
        if atype == "pil" or img.mode != mode.upper():
            img = img.convert(mode.upper())
    if atype == "pil":
        return img
    import numpy as np

    arr = _pil_array(img)
    if etype == "float":
        arr = arr.astype(np.float32) / 255.0
    if atype == "numpy":
        return arr
    import torch

    if arr.ndim == 3:
        return torch.from_numpy(arr.transpose(2, 0, 1).copy())
    return torch.from_numpy(arr.copy())


class ImageHandler:
    """Decode images with extension in ``extensions`` by an image spec.

    ``imagespec`` is one of :data:`imagespecs` (else ValueError); ``extensions``
    defaults to :data:`IMAGE_EXTENSIONS`.

    Example:
        >>> ImageHandler("rgb8")(".cls", b"1") is None
        True
    """

    def __init__(self, imagespec: str, extensions: Iterable[str] = IMAGE_EXTENSIONS):
        if imagespec not in imagespecs:
            raise ValueError(f"unknown image spec {imagespec!r}; choose one of {sorted(imagespecs)}")
        self.imagespec = imagespec.lower()
        self.extensions = frozenset(e.lower() for e in extensions)

    def __call__(self, key: str, data: bytes) -> Any:
        if _ext(key).lower() not in self.extensions:
            return None
        return decode_image(self.imagespec, data)


def imagehandler(imagespec: str, extensions: Iterable[str] = IMAGE_EXTENSIONS) -> ImageHandler:
    """Lower-case alias of :class:`ImageHandler` (webdataset's name)."""
    return ImageHandler(imagespec, extensions)


# ---- audio / video (optional libraries) ---------------------------------------

def _via_tempfile(ext: str, data: bytes, load: Callable[[str], Any]) -> Any:
    with tempfile.TemporaryDirectory() as d:
        fname = os.path.join(d, f"file.{ext}")
        with open(fname, "wb") as f:
            f.write(data)
        return load(fname)


def torch_video(key: str, data: bytes) -> Any:
    """Decode video members with ``torchvision.io.read_video`` (needs torchvision)."""
    ext = _ext(key)
    if ext not in ("mp4", "ogv", "mjpeg", "avi", "mov", "h264", "mpg", "webm", "wmv"):
        return None
    import torchvision.io

    return _via_tempfile(ext, data, lambda f: torchvision.io.read_video(f, pts_unit="sec"))


def torch_audio(key: str, data: bytes) -> Any:
    """Decode audio members with ``torchaudio.load`` (needs torchaudio)."""
    ext = _ext(key)
    if ext not in ("flac", "mp3", "sox", "wav", "m4a", "ogg", "wma"):
        return None
    import torchaudio

    return _via_tempfile(ext, data, torchaudio.load)


# ---- continuing ---------------------------------------------------------------

class Continue:
    """Returned by a handler to go on decoding ``data`` as ``key``.

    Example:
        >>> def unzip(key, data):
        ...     return Continue(key[:-3], gzip.decompress(data)) if key.endswith(".gz") else None
    """

    def __init__(self, key: str, data: bytes):
        self.key, self.data = key, data


def gzfilter(key: str, data: bytes) -> Optional[Continue]:
    """Decompress ``*.gz`` members and go on with the inner extension."""
    if not key.endswith(".gz"):
        return None
    import gzip

    return Continue(key[:-3], gzip.decompress(data))


default_pre_handlers: List[Handler] = [gzfilter]
default_post_handlers: List[Handler] = [basichandlers]


# ---- decoding whole samples -----------------------------------------------------

_BYTES = (bytes, bytearray, memoryview)


class Decoder:
    """Decode the members of a sample with a chain of handlers.

    Args:
        handlers: image specs (``"rgb8"``...) and/or handlers
            ``(key, data) -> value | None | Continue``.
        pre: handlers tried first (default ``[gzfilter]``).
        post: handlers tried last (default ``[basichandlers]``).
        only: extensions to decode (a list or a space-separated string).
        partial: leave members that are not bytes as they are (else an error).
        allow_pickle: decode pkl/pickle/pyd and ``pth`` without ``weights_only``.

    Raises (when called):
        DecodeError: naming shard, sample and member (``url``, ``key``, ``k``).
        UnsafeSourceError: a pickle member without ``allow_pickle``.

    Example:
        >>> Decoder([handle_extension("txt", lambda b: b[::-1])])({"__key__": "a", "txt": b"ab"})
        {'__key__': 'a', 'txt': b'ba'}
    """

    def __init__(self, handlers: Sequence[Union[str, Handler]] = (), pre: Optional[Sequence[Handler]] = None,
                 post: Optional[Sequence[Handler]] = None, only: Union[str, Iterable[str], None] = None,
                 partial: bool = False, allow_pickle: bool = False):
        if isinstance(handlers, (str, bytes)) or callable(handlers):
            handlers = [handlers]
        main: List[Handler] = []
        for h in handlers:
            if isinstance(h, str):
                main.append(ImageHandler(h))
            elif callable(h):
                main.append(h)
            else:
                raise TypeError(f"decode handler must be an image spec string or a callable, got {h!r}")
        pre_l = list(default_pre_handlers if pre is None else pre)
        post_l = list(default_post_handlers if post is None else post)
        for h in pre_l + post_l:
            if not callable(h):
                raise TypeError(f"decode handler must be callable, got {h!r}")
        safe = _SafeBasic(allow_pickle)
        self.handlers: List[Handler] = [safe if h is basichandlers else h for h in pre_l + main + post_l]
        if isinstance(only, str):
            only = only.split()
        self.only = None if only is None else frozenset(only)
        self.partial = partial
        self.allow_pickle = allow_pickle

    def decode1(self, key: str, data: bytes) -> Any:
        """Decode one member (``key`` without the leading dot, e.g. ``"jpg"``)."""
        k: str = _Key("." + key)
        for f in self.handlers:
            r = f(k, data)
            if r is None:
                continue
            if isinstance(r, Continue):
                k, data = _Key(r.key), r.data
                continue
            return r
        return data

    def __call__(self, sample: Dict[str, Any]) -> Dict[str, Any]:
        if not isinstance(sample, dict):
            raise DecodeError(f"decode expects a dict sample, got {type(sample).__name__} "
                              "(decode before to_tuple)")
        out: Dict[str, Any] = {}
        only = self.only
        for k, v in sample.items():
            if k[:2] == "__":
                if isinstance(v, bytes):
                    try:
                        v = v.decode("utf-8")
                    except UnicodeDecodeError:
                        pass
                out[k] = v
                continue
            if only is not None and k not in only:
                out[k] = v
                continue
            if not isinstance(v, _BYTES):
                if self.partial:
                    out[k] = v
                    continue
                raise self._error(sample, k, TypeError(
                    f"member is {type(v).__name__}, not bytes (already decoded? pass partial=True)"))
            try:
                out[k] = self.decode1(k, v if type(v) is bytes else bytes(v))
            except UnsafeSourceError as exc:
                raise type(exc)(f"{sample.get('__url__')}: sample {sample.get('__key__')}: {exc}") from None
            except Exception as exc:
                raise self._error(sample, k, exc) from exc
        return out

    @staticmethod
    def _error(sample: Dict[str, Any], k: str, exc: BaseException) -> DecodeError:
        err = DecodeError(f"{sample.get('__url__')}: sample {sample.get('__key__')}: "
                          f"cannot decode .{k}: {type(exc).__name__}: {exc}{install_hint(exc)}")
        err.url, err.key, err.k = sample.get("__url__"), sample.get("__key__"), k  # type: ignore[attr-defined]
        return err


#: what to install for a module a decoder imports (the extras of pyproject.toml)
INSTALL_HINTS = {
    "PIL": "pip install 'resumewds[image]'",
    "numpy": "pip install 'resumewds[image]' (or numpy)",
    "msgpack": "pip install 'resumewds[formats]'",
    "cbor2": "pip install 'resumewds[formats]'",
    "zstandard": "pip install 'resumewds[formats]'",
    "yaml": "pip install 'resumewds[formats]'",
    "torchvision": "pip install torchvision",
    "torchaudio": "pip install torchaudio",
}


def install_hint(exc: BaseException) -> str:
    """``"; pip install ..."`` when ``exc`` is a missing module a decoder needs, else "".

    Example:
        >>> install_hint(ModuleNotFoundError("No module named 'PIL'", name="PIL"))
        " (install it: pip install 'resumewds[image]')"
        >>> install_hint(ValueError("bad"))
        ''
    """
    if not isinstance(exc, ImportError):
        return ""
    hint = INSTALL_HINTS.get((exc.name or "").split(".")[0])
    return f" (install it: {hint})" if hint else ""


default_decoder = Decoder([])


def __getattr__(name: str) -> Any:
    """webdataset's ``autodecode.utils``, forwarded by the package's face."""
    return _lazy.forwarded(__name__, name)
