"""Writing shards: webdataset's ``TarWriter`` / ``ShardWriter``, plus the manifest.

The tar bytes are webdataset 1.0.2's (with the same ``mtime=``,
byte-identical).  The writers also record what ``resumewds index`` would
(size, xxh3_64, sample offsets), so a fresh data set needs no index pass::

    with ShardWriter("out/shard-%06d.tar", maxcount=1000) as sink:
        for sample in samples:
            sink.write(sample)
    ds = resumewds.WebDataset("out/manifest.json")

Crash safety (unlike webdataset): a local shard is written to
``<name>.partial`` and renamed once complete and synced; its manifest entry
is dropped before and added after the rename (under a lock: several writers
may share a manifest), so a killed writer never leaves an entry that does not
describe the complete file.  ``.tar.gz``: the compressed file's size and
checksum, the uncompressed stream's offsets.

Example:
    >>> import tempfile, os
    >>> d = tempfile.mkdtemp()
    >>> with TarWriter(os.path.join(d, "a.tar"), mtime=0, manifest=os.path.join(d, "manifest.json")) as w:
    ...     _ = w.write({"__key__": "s0", "txt": "hello", "cls": 3})
    >>> w.shard_info.samples, w.shard_info.offsets
    (1, [0, 2048])
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import gzip
import importlib
import io
import json
import os
import pickle
import re
import subprocess
import tarfile
import time
from typing import Any, Callable, Dict, List, Optional, Tuple, Union, cast

import xxhash

from .manifest import Manifest, ShardInfo, load_manifest
from .sources import _urls as urls
from .tar import _io as tario
from .tenbin import encode_buffer

__all__ = ["ShardWriter", "TarWriter", "add_handlers", "bytestr", "encode_based_on_extension",
           "imageencoder", "make_encoder", "make_handlers", "numpy_dumps", "torch_dumps"]

#: bytes a shard file is written in: large writes leave large page-cache folios,
#: from which a ``pread`` of a sample costs half (a fresh shard is read from that cache)
WRITE_BUFFER = 4 << 20


# ---- encoders (webdataset's defaults) -----------------------------------------

def imageencoder(image: Any, format: str = "PNG") -> bytes:
    """Encode a PIL image or a uint8/float numpy array (values in [0, 1], else ValueError) as image bytes."""
    import numpy as np
    import PIL.Image

    if isinstance(image, np.ndarray):
        if image.dtype in (np.dtype("f"), np.dtype("d")):
            if np.amin(image) <= -0.001 or np.amax(image) >= 1.001:
                raise ValueError(f"image values out of range {np.amin(image)} {np.amax(image)}")
            image = np.array(np.clip(image, 0.0, 1.0) * 255.0, "uint8")
        if image.ndim not in (2, 3) or (image.ndim == 3 and image.shape[2] not in (1, 3)):
            raise ValueError(f"cannot encode an image array of shape {image.shape}")
        image = PIL.Image.fromarray(image)
    elif not isinstance(image, PIL.Image.Image):
        raise ValueError(f"cannot encode {type(image).__name__} as an image")
    if format.upper() == "JPG":
        format = "JPEG"
    elif format.upper() in ("IMG", "IMAGE"):
        format = "PPM"
    opts = {"quality": 100} if format in ("JPEG", "tiff") else {}
    with io.BytesIO() as out:
        image.save(out, format=format, **opts)
        return out.getvalue()


def bytestr(data: Any) -> bytes:
    """bytes as they are; anything else as ASCII ``str(data)``."""
    if isinstance(data, bytes):
        return data
    if isinstance(data, str):
        return data.encode("ascii")
    return str(data).encode("ascii")


def torch_dumps(data: Any) -> bytes:
    """``torch.save`` into bytes."""
    import torch

    out = io.BytesIO()
    torch.save(data, out)
    return out.getvalue()


def numpy_dumps(data: Any) -> bytes:
    """A numpy array as ``.npy`` bytes."""
    import numpy.lib.format

    out = io.BytesIO()
    numpy.lib.format.write_array(out, data)
    return out.getvalue()


def numpy_npz_dumps(data: Dict[str, Any]) -> bytes:
    """A dict of numpy arrays as compressed ``.npz`` bytes."""
    import numpy as np

    if not isinstance(data, dict) or not all(isinstance(k, str) and isinstance(v, np.ndarray)
                                             for k, v in data.items()):
        raise ValueError("npz members must be a dict of str -> numpy array")
    out = io.BytesIO()
    np.savez_compressed(out, **data)
    return out.getvalue()


def tenbin_dumps(x: Any) -> bytes:
    """A numpy array, or a list of them, in webdataset's tenbin format (``.ten``)."""
    return encode_buffer(x if isinstance(x, list) else [x])


def cbor_dumps(x: Any) -> bytes:
    """CBOR bytes (``cbor2``, or webdataset's ``cbor``)."""
    import cbor2

    return cbor2.dumps(x)


def mp_dumps(x: Any) -> bytes:
    """msgpack bytes (needs ``msgpack``)."""
    import msgpack

    return msgpack.packb(x)


def _handlers() -> Dict[str, Callable[[Any], bytes]]:
    h: Dict[str, Callable[[Any], bytes]] = {}

    def add(keys: str, f: Callable[[Any], bytes]) -> None:
        for k in keys.split():
            h[k] = f

    add("cls cls2 class count index inx id", lambda x: str(x).encode("ascii"))
    add("txt text transcript html htm", lambda x: x.encode("utf-8"))
    add("pyd pickle", pickle.dumps)
    add("pth", torch_dumps)
    add("npy", numpy_dumps)
    add("npz", numpy_npz_dumps)
    add("ten tenbin tb", tenbin_dumps)
    add("json jsn", lambda x: json.dumps(x).encode("utf-8"))
    add("mp msgpack msg", mp_dumps)
    add("cbor", cbor_dumps)
    add("jpg jpeg img image", lambda x: imageencoder(x, "jpg"))
    for fmt in ("png", "pbm", "pgm", "ppm"):
        add(fmt, functools.partial(imageencoder, format=fmt))
    add("tiff tif", lambda x: imageencoder(x, "tiff"))
    return h


default_handlers = _handlers()


def add_handlers(d: Dict[str, Callable[[Any], bytes]], keys: Union[str, List[str]],
                 value: Callable[[Any], bytes]) -> None:
    """Register encoder ``value`` for each extension in ``keys`` (space-separated or a list).

    Example:
        >>> h = make_handlers(); add_handlers(h, "lbl label", lambda x: str(x).encode())
        >>> h["label"](3)
        b'3'
    """
    for k in keys.split() if isinstance(keys, str) else keys:
        d[k] = value


def make_handlers() -> Dict[str, Callable[[Any], bytes]]:
    """A fresh copy of the default extension -> encoder table (webdataset's ``make_handlers``)."""
    return dict(default_handlers)


def encode_based_on_extension1(data: Any, tname: str, handlers: Dict[str, Callable[[Any], bytes]]) -> Any:
    """Encode one value by its extension (``*.gz`` extensions are gzipped)."""
    if tname[0] == "_":
        if not isinstance(data, str):
            raise ValueError("the values of metadata must be of string type")
        return data
    compress = tname.endswith(".gz")
    if compress:
        tname = tname[:-3]
    ext = re.sub(r".*\.", "", tname).lower()
    if isinstance(data, bytes):
        result = data
    elif isinstance(data, str):
        result = data.encode("utf-8")
    else:
        f = handlers.get(ext)
        if f is None:
            raise ValueError(f"no handler found for {ext}")
        result = f(data)
    return gzip.compress(result) if compress else result


def encode_based_on_extension(sample: Dict[str, Any],
                              handlers: Dict[str, Callable[[Any], bytes]]) -> Dict[str, Any]:
    """Encode every field of ``sample`` by its extension (webdataset's function).

    Example:
        >>> encode_based_on_extension({"__key__": "a", "cls": 3}, make_handlers())["cls"]
        b'3'
    """
    return {k: encode_based_on_extension1(v, k, handlers) for k, v in list(sample.items())}


def make_encoder(spec: Union[bool, None, Dict[str, Callable[[Any], bytes]], Callable[[Dict], Dict]]
                 ) -> Callable[[Dict[str, Any]], Dict[str, Any]]:
    """``True``: default encoders; ``False``/None: none; a dict: ext -> encoder; or a callable (else ValueError)."""
    if spec is False or spec is None:
        return lambda x: x
    if spec is True:
        spec = default_handlers
    if isinstance(spec, dict):
        handlers = spec
        return lambda sample: {k: encode_based_on_extension1(v, k, handlers) for k, v in sample.items()}
    if callable(spec):
        return spec
    raise ValueError(f"{spec}: unknown encoder spec")


# ---- the output stream ---------------------------------------------------------

class _DigestTap:
    """Wraps the tar stream's file object: hashes each sample's uncompressed
    bytes (:mod:`resumewds.sources`) as tarfile writes them."""

    def __init__(self, inner: Any):
        self.inner = inner
        self.h: Any = None
        self.digests: List[int] = []

    def start(self) -> None:
        """A new sample starts at the current offset."""
        self.end()
        self.h = xxhash.xxh3_64()

    def end(self) -> None:
        if self.h is not None:
            self.digests.append(self.h.intdigest())
            self.h = None

    def write(self, b: Any) -> Any:
        if self.h is not None:
            self.h.update(b)
        return self.inner.write(b)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


class _Tee:
    """File-like sink that counts and hashes what goes through to ``out``."""

    def __init__(self, out: Any):
        self.out = out
        self.nbytes = 0
        self.h = xxhash.xxh3_64()

    def write(self, b: Any) -> int:
        self.out.write(b)
        self.h.update(b)
        self.nbytes += len(b)
        return len(b)

    def flush(self) -> None:
        self.out.flush()


def _local_path(url: str) -> Optional[str]:
    if url.startswith("file://"):
        return url[7:]
    if url.startswith("file:"):
        return url[5:]
    if url.startswith("pipe:") or "://" in url or url == "-":
        return None
    return url


def _fsync_dir(path: str) -> None:
    try:
        fd = os.open(os.path.dirname(os.path.abspath(path)) or ".", os.O_RDONLY)
    except OSError:
        return
    try:
        with contextlib.suppress(OSError):
            os.fsync(fd)
    finally:
        os.close(fd)


def update_manifest(manifest: str, info: Optional[ShardInfo], drop: Optional[str] = None) -> None:
    """Add ``info`` to (or drop the entry ``drop`` from) the manifest file, under a lock.

    Entries are matched by absolute url, sorted by url; an unreadable manifest starts empty.
    """
    os.makedirs(os.path.dirname(os.path.abspath(manifest)) or ".", exist_ok=True)
    lock = os.open(manifest + ".lock", os.O_RDWR | os.O_CREAT | getattr(os, "O_CLOEXEC", 0), 0o666)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX)
        shards: List[ShardInfo] = []
        if os.path.exists(manifest):
            try:
                shards = list(load_manifest(manifest).shards)
            except Exception:  # a foreign/corrupt file: rebuilt from what we write
                shards = []
        key = os.path.abspath(drop if drop is not None else info.url)  # type: ignore[union-attr]
        kept = [s for s in shards if os.path.abspath(s.url) != key]
        if drop is not None and len(kept) == len(shards):
            return  # nothing to drop: leave the file alone
        if info is not None:
            kept.append(info)
        kept.sort(key=lambda s: s.url)
        Manifest(kept).save(manifest)
        _fsync_dir(manifest)
    finally:
        os.close(lock)


class TarWriter:
    """Write samples (dicts) into one tar archive, as webdataset does.

    Args:
        fileobj: a path (``.tgz``/``.tar.gz`` compresses), ``pipe:cmd``, or a
            writable binary stream.
        user, group, mode: owner names and mode of each member.
        compress: True / ``"gz"`` / ``"bz2"`` / ``"xz"``, False for none;
            None picks by the file name.
        encoder: as :func:`make_encoder` (True: the default encoders by extension).
        keep_meta: also write ``_``-prefixed fields.
        mtime: members' mtime (fix it for reproducible files; default now).
        format: ignored, as webdataset 1.0.2 does (archives are PAX).
        manifest: a manifest.json to add this shard to when it is closed
            (local paths only).

    After :meth:`close`, ``shard_info`` is the shard's
    :class:`~resumewds.manifest.ShardInfo`, also for a stream or pipe.

    Raises:
        EnforcedSecurityError: a path or ``pipe:`` output under
            ``enforce_security`` (as webdataset's gopen); a stream is accepted.

    Example:
        >>> buf = io.BytesIO()
        >>> with TarWriter(buf, encoder=False, mtime=0) as w:
        ...     w.write({"__key__": "a", "txt": b"hi"})
        2
    """

    def __init__(self, fileobj: Any, user: str = "bigdata", group: str = "bigdata", mode: int = 0o0444,
                 compress: Optional[Union[bool, str]] = None, encoder: Any = True, keep_meta: bool = False,
                 mtime: Optional[float] = None, format: Any = None, manifest: Optional[str] = None):
        # as in webdataset 1.0.2, not passed to tarfile
        self.format = getattr(tarfile, format, format) if format else tarfile.USTAR_FORMAT
        self.mtime = mtime
        tarmode = self.tarmode(fileobj, compress)
        self.url: Optional[str] = None
        self.path: Optional[str] = None
        self._tmp: Optional[str] = None
        self._proc: Optional[subprocess.Popen] = None
        self.own_fileobj: Any = None
        if isinstance(fileobj, str):
            urls.check_source_allowed(fileobj)  # webdataset's gopen(fileobj, "wb") under enforce_security
            self.url = fileobj
            path = _local_path(fileobj)
            if path is not None:
                self.path = os.path.abspath(path)
                self._tmp = self.path + ".partial"
                self.own_fileobj = open(self._tmp, "wb", buffering=WRITE_BUFFER)
            elif fileobj.startswith("pipe:"):
                self._proc = subprocess.Popen(fileobj[5:], shell=True, stdin=subprocess.PIPE)
                self.own_fileobj = self._proc.stdin
            else:
                raise ValueError(f"{fileobj}: TarWriter writes to local paths, pipe: commands or streams")
            fileobj = self.own_fileobj
        if manifest is not None and self.path is None:
            raise ValueError("manifest= needs a local output path")
        self.manifest = manifest
        self.encoder = make_encoder(encoder)
        self.keep_meta = keep_meta
        self._tee = _Tee(fileobj)
        self.stream = fileobj
        self.tarstream = tarfile.open(fileobj=cast(Any, self._tee), mode=cast(Any, tarmode))
        # per-sample digests of uncompressed shards (compressed ones get none)
        self._tap: Optional[_DigestTap] = None
        if tarmode == "w|":
            self._tap = _DigestTap(self.tarstream.fileobj)
            self.tarstream.fileobj = self._tap
        self.user, self.group, self.mode, self.compress = user, group, mode, compress
        self.offsets: List[int] = []
        self._key: Optional[str] = None
        self._exts: set = set()
        self.shard_info: Optional[ShardInfo] = None
        self._closed = False

    @staticmethod
    def tarmode(fileobj: Any, compress: Optional[Union[bool, str]] = None) -> str:
        """The ``tarfile`` stream mode for ``fileobj`` / ``compress``."""
        named = isinstance(fileobj, str)
        if compress is False:
            return "w|"
        if compress is True or compress == "gz" or (named and fileobj.endswith("gz")):
            return "w|gz"
        if compress == "bz2" or (named and fileobj.endswith("bz2")):
            return "w|bz2"
        if compress == "xz" or (named and fileobj.endswith("xz")):
            return "w|xz"
        return "w|"

    def __enter__(self) -> TarWriter:
        return self

    def __exit__(self, exc_type: Any, exc: Any, tb: Any) -> None:
        if exc_type is not None and self._tmp is not None:
            self.abort()
            return
        self.close()

    def _plan_members(self, names: List[str]) -> Tuple[List[bool], Optional[str], set]:
        """Mirror the reader's grouping (:func:`resumewds.tar._io._group`) for these
        member names: which of them starts a new sample, and the key and extensions after them.

        Raises:
            ValueError: a repeated extension (readers refuse such a shard), before any is written.
        """
        key, exts = self._key, set(self._exts)
        starts = []
        for name in names:
            new = False
            skip = ("/" not in name and name.startswith("__") and name.endswith("__")) or \
                tario._META_RE.match(name)
            k, ext = (None, None) if skip else tario.split_key(name)
            if k is not None:
                ext = ext.lower()  # type: ignore[union-attr]
                if k != key:
                    key, exts, new = k, set(), True
                if ext in exts:
                    raise ValueError(f"{self.url or 'stream'}: sample {k!r} would have the extension "
                                     f"{ext!r} twice ({name}); readers refuse such a shard")
                exts.add(ext)
            starts.append(new)
        return starts, key, exts

    def write(self, obj: Dict[str, Any]) -> int:
        """Encode and write one sample; returns the bytes of member data written.

        Raises:
            ValueError: no ``__key__``, a value not bytes after encoding, or a repeated extension.
        """
        obj = self.encoder(obj)
        if "__key__" not in obj:
            raise ValueError("object must contain a __key__")
        for k, v in obj.items():
            if k[0] != "_" and not isinstance(v, (bytes, bytearray, memoryview)):
                raise ValueError(f"{k} doesn't map to a bytes after encoding ({type(v)})")
        key = obj["__key__"]
        fields = [k for k in sorted(obj) if k != "__key__" and (self.keep_meta or k[0] != "_")]
        names = [key + "." + k for k in fields]
        starts, last_key, last_exts = self._plan_members(names)
        total = 0
        for k, name, new in zip(fields, names, starts):
            v = obj[k]
            if isinstance(v, str):
                v = v.encode("utf-8")
            if not isinstance(v, (bytes, bytearray, memoryview)):
                raise ValueError(f"converter didn't yield bytes: {k}, {type(v)}")
            ti = tarfile.TarInfo(name)
            ti.size = len(v)
            ti.mtime = self.mtime if self.mtime is not None else time.time()
            ti.mode, ti.uname, ti.gname = self.mode, self.user, self.group
            if new:
                self.offsets.append(self.tarstream.offset)
                if self._tap is not None:
                    self._tap.start()
            self.tarstream.addfile(ti, io.BytesIO(v))
            total += ti.size
        self._key, self._exts = last_key, last_exts
        return total

    def close(self) -> None:
        """Finish the archive; publish the file and its manifest entry."""
        if self._closed:
            return
        self._closed = True
        end = self.tarstream.offset
        if self._tap is not None:
            self._tap.end()
        self.tarstream.close()
        offsets = self.offsets + [end]
        self.shard_info = ShardInfo(url=self.path or self.url or "stream", size=self._tee.nbytes,
                                    xxh3_64=self._tee.h.hexdigest(), samples=len(self.offsets),
                                    offsets=offsets,
                                    sample_digests=self._tap.digests if self._tap is not None else None)
        f = self.own_fileobj
        if f is not None:
            self.own_fileobj = None
            if self._tmp is not None:
                f.flush()
                os.fsync(f.fileno())
                f.close()
                if self.manifest is not None:
                    update_manifest(self.manifest, None, drop=self.path)
                os.replace(self._tmp, self.path)  # type: ignore[arg-type]
                _fsync_dir(self.path)  # type: ignore[arg-type]
                if self.manifest is not None:
                    update_manifest(self.manifest, self.shard_info)
            else:
                f.close()
                if self._proc is not None:
                    rc = self._proc.wait()
                    if rc != 0:
                        raise OSError(f"{self.url}: command exited with status {rc}")

    def abort(self) -> None:
        """Stop without publishing: the partial file is removed."""
        self._closed = True
        f, self.own_fileobj = self.own_fileobj, None
        if f is not None:
            f.close()
        if self._tmp is not None:
            with contextlib.suppress(OSError):
                os.unlink(self._tmp)
        if self._proc is not None:
            self._proc.wait()


class ShardWriter:
    """Write samples into a numbered series of tar shards, as webdataset does.

    Args:
        pattern: ``%``-format for the shard names (``"out/shard-%06d.tar"``).
        maxcount: samples per shard at most.
        maxsize: member bytes per shard at most (closed once it reaches this).
        post: called with each finished shard's name.
        opener: ``opener(name) -> stream`` to open shards yourself (no manifest).
        manifest: default ``manifest.json`` next to the shards (local
            paths); a path; or False for none.
        **kw: passed to :class:`TarWriter`.

    Example:
        >>> import tempfile, os
        >>> d = tempfile.mkdtemp()
        >>> with ShardWriter(os.path.join(d, "s-%03d.tar"), maxcount=2, verbose=0) as sink:
        ...     for i in range(5):
        ...         sink.write({"__key__": f"k{i}", "cls": i})
        >>> sorted(os.listdir(d))[:4]
        ['manifest.json', 'manifest.json.lock', 's-000.tar', 's-001.tar']
    """

    def __init__(self, pattern: str, maxcount: int = 100000, maxsize: float = 3e9,
                 post: Optional[Callable[[str], Any]] = None, start_shard: int = 0, verbose: int = 1,
                 opener: Optional[Callable[[str], Any]] = None, manifest: Union[None, bool, str] = None,
                 **kw: Any):
        self.verbose = verbose
        self.kw = kw
        self.maxcount = maxcount
        self.maxsize = maxsize
        self.post = post
        self.tarstream: Optional[TarWriter] = None
        self.shard = start_shard
        self.pattern = pattern
        self.total = 0
        self.count = 0
        self.size = 0
        self.fname: Optional[str] = None
        self.opener = opener
        first = _local_path(pattern % start_shard)
        if manifest is None or manifest is True:
            manifest = None if (opener is not None or first is None) else \
                os.path.join(os.path.dirname(os.path.abspath(first)), "manifest.json")
        elif manifest is False or opener is not None:
            manifest = None
        self.manifest: Optional[str] = manifest
        self.shards: List[ShardInfo] = []
        self.next_stream()

    def next_stream(self) -> None:
        """Close the current shard and open the next one."""
        self.finish()
        self.fname = self.pattern % self.shard
        if self.verbose:
            print("# writing", self.fname, self.count, "%.1f GB" % (self.size / 1e9), self.total)
        self.shard += 1
        if self.opener:
            self.tarstream = TarWriter(self.opener(self.fname), **self.kw)
        else:
            self.tarstream = TarWriter(self.fname, manifest=self.manifest, **self.kw)
        self.count = 0
        self.size = 0

    def write(self, obj: Dict[str, Any]) -> None:
        """Write one sample, starting a new shard when the current one is full."""
        if self.tarstream is None or self.count >= self.maxcount or self.size >= self.maxsize:
            self.next_stream()
        assert self.tarstream is not None
        self.size += self.tarstream.write(obj)
        self.count += 1
        self.total += 1

    def finish(self) -> None:
        """Finish the current shard (use :meth:`close`)."""
        if self.tarstream is not None:
            self.tarstream.close()
            if self.tarstream.shard_info is not None:
                self.shards.append(self.tarstream.shard_info)
            if callable(self.post) and self.fname is not None:
                self.post(self.fname)
            self.tarstream = None

    def close(self) -> None:
        """Finish the last shard."""
        self.finish()

    def __enter__(self) -> ShardWriter:
        return self

    def __exit__(self, *args: Any) -> None:
        self.close()


def __getattr__(name: str) -> Any:
    """webdataset's ``writer.gopen``: :func:`resumewds.gopen`, found on first use."""
    if name == "gopen":
        return importlib.import_module("resumewds.gopen").gopen
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
