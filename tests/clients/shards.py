"""Synthetic shards in the layouts the client pipelines of this corpus read.

Every sample's content encodes its key (the caption says it, the image's
pixels, the latent and the waveform are functions of the sample index), so a
delivered item can be traced back to its sample even after ``to_tuple``
dropped ``__key__``. The same arguments always give the same bytes.
"""

from __future__ import annotations

import io
import json
import os
import tarfile
import wave
from typing import Callable, Dict, List, Tuple

import numpy as np
from PIL import Image

Member = Tuple[str, bytes]


def _tar(path: str, samples: List[List[Member]]) -> None:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.USTAR_FORMAT) as tf:
        for members in samples:
            for name, data in members:
                ti = tarfile.TarInfo(name)
                ti.size = len(data)
                ti.mtime = 1_700_000_000
                tf.addfile(ti, io.BytesIO(data))
    with open(path, "wb") as f:
        f.write(buf.getvalue())


def image_bytes(idx: int, fmt: str) -> bytes:
    """An 8x8 RGB image whose pixels are a function of ``idx`` (PNG: lossless)."""
    arr = np.full((8, 8, 3), 0, np.uint8)
    arr[..., 0] = idx % 251
    arr[..., 1] = (idx * 7) % 251
    arr[:4, :, 2] = 200
    out = io.BytesIO()
    Image.fromarray(arr).save(out, format=fmt)
    return out.getvalue()


def wav_bytes(idx: int, n: int = 80, rate: int = 8000) -> bytes:
    """A mono 16-bit PCM wav of ``n`` frames (a ramp offset by ``idx``)."""
    pcm = ((np.arange(n, dtype=np.int32) * 37 + idx * 101) % 20000 - 10000).astype("<i2")
    out = io.BytesIO()
    with wave.open(out, "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(pcm.tobytes())
    return out.getvalue()


def npy_bytes(idx: int) -> bytes:
    out = io.BytesIO()
    np.save(out, (np.arange(4 * 4 * 4, dtype=np.float32).reshape(4, 4, 4) + idx) / 16.0)
    return out.getvalue()


def _imgtxt(shard: int, i: int, idx: int) -> List[Member]:
    key = f"img{shard:02d}_{i:04d}"
    members: List[Member] = []
    if idx % 11 != 5:  # a few samples have no image
        fmt, ext = ("PNG", "png") if idx % 3 == 0 else ("JPEG", "jpg")
        members.append((f"{key}.{ext}", image_bytes(idx, fmt)))
    members.append((f"{key}.cls", str(idx % 10).encode()))
    members.append((f"{key}.json", json.dumps({"key": key, "idx": idx, "caption": f"json caption {idx}"}).encode()))
    if idx % 7 != 3:  # a few samples have no caption
        members.append((f"{key}.txt", f"a photo number {idx} ({key})".encode()))
    return members


def _imgcls(shard: int, i: int, idx: int) -> List[Member]:
    key = f"cls{shard:02d}_{i:04d}"
    fmt, ext = ("PNG", "png") if idx % 4 == 1 else ("JPEG", "jpg")
    return [(f"{key}.cls", str(idx % 10).encode()), (f"{key}.{ext}", image_bytes(idx, fmt)),
            (f"{key}.json", json.dumps({"caption": f"caption {idx}", "idx": idx}).encode())]


def _latent(shard: int, i: int, idx: int) -> List[Member]:
    key = f"lat{shard:02d}_{i:04d}"
    return [(f"{key}.cls", str(idx % 10).encode()), (f"{key}.npy", npy_bytes(idx)),
            (f"{key}.txt", f"latent caption {idx}".encode())]


def _audio(shard: int, i: int, idx: int) -> List[Member]:
    key = f"aud{shard:02d}_{i:04d}"
    return [(f"{key}.json", json.dumps({"duration": 0.01, "speaker": idx % 4}).encode()),
            (f"{key}.txt", f"transcript {idx}".encode()), (f"{key}.wav", wav_bytes(idx))]


def _video(shard: int, i: int, idx: int) -> List[Member]:
    key = f"vid{shard:02d}_{i:04d}"
    rnd = np.random.default_rng(idx).integers(0, 256, 96 + idx % 13, dtype=np.uint8).tobytes()
    members = [(f"{key}.cls", str(idx % 5).encode()),
               (f"{key}.json", json.dumps({"fps": 10 + idx % 3, "frames": 8, "caption": f"clip {idx}"}).encode()),
               (f"{key}.mp4", b"\x00\x00\x00\x18ftypmp42" + rnd)]
    if idx % 9 != 4:  # a few clips have no caption
        members.append((f"{key}.txt", f"clip {idx}".encode()))
    return members


def _tokens(shard: int, i: int, idx: int) -> List[Member]:
    """A pre-tokenized text (open_lm's json list of token ids), 6 to 29 tokens long."""
    key = f"tok{shard:02d}_{i:04d}"
    ids = [(idx * 31 + j * 7) % 50 for j in range(6 + (idx * 5) % 24)]
    return [(f"{key}.json", json.dumps(ids).encode()), (f"{key}.txt", repr(ids).encode())]


def _modal(shard: int, i: int, idx: int) -> List[Member]:
    """One sample of every modality (each also written to a tar of its own: :data:`MODALITIES`)."""
    key = f"mod{shard:02d}_{i:04d}"
    return [(f"{key}.jpg", image_bytes(idx, "JPEG")), (f"{key}.txt", f"a caption of {idx}".encode())]


LAYOUTS: Dict[str, Tuple[Callable[[int, int, int], List[Member]], int, int]] = {
    # name: (sample maker, shards, samples per shard)
    "imgtxt": (_imgtxt, 6, 22),
    "imgcls": (_imgcls, 5, 24),
    "latent": (_latent, 4, 20),
    "audio": (_audio, 4, 20),
    "video": (_video, 4, 20),
    "tokens": (_tokens, 4, 24),
    "modal": (_modal, 4, 16),
}

#: layouts also written one modality per tar (ml-4m's shard_root_<modality>/ directories):
#: layout -> {modality: member extension}; ``<dir>_<modality>/`` holds that modality's shards
MODALITIES: Dict[str, Dict[str, str]] = {"modal": {"rgb": "jpg", "caption": "txt"}}


def write_layout(directory: str, layout: str) -> List[str]:
    """Write the shards of ``layout`` under ``directory``; return their paths.

    A layout of :data:`MODALITIES` is also written one modality per tar, in
    ``<directory>_<modality>/`` (same shard names, same keys, same order).
    """
    make, nshards, per = LAYOUTS[layout]
    os.makedirs(directory, exist_ok=True)
    paths = []
    for s in range(nshards):
        path = os.path.join(directory, f"{layout}-{s:06d}.tar")
        samples = [make(s, i, s * per + i) for i in range(per)]
        _tar(path, samples)
        paths.append(path)
        for modality, ext in MODALITIES.get(layout, {}).items():
            os.makedirs(f"{directory}_{modality}", exist_ok=True)
            _tar(os.path.join(f"{directory}_{modality}", os.path.basename(path)),
                 [[m for m in members if m[0].endswith("." + ext)] for members in samples])
    return paths


def modality_paths(paths: List[str], modality: str) -> List[str]:
    """The paths of one modality's shards of a layout written by :func:`write_layout`."""
    return [os.path.join(os.path.dirname(p) + "_" + modality, os.path.basename(p)) for p in paths]


def corrupt_copy(src: List[str], directory: str, bad_member_ext: str) -> List[str]:
    """Copies of ``src`` with three kinds of damage, the ones a crawl produces.

    * shard 1 is not a tar at all (an HTML error page saved as ``.tar``);
    * shard 2 is cut short in the middle of a member's data, past the middle;
    * in shard 0, the ``bad_member_ext`` member of sample 4 is garbage bytes
      (same size), so the client's decoder fails on that one sample.
    """
    os.makedirs(directory, exist_ok=True)
    out = []
    for n, path in enumerate(src):
        dst = os.path.join(directory, os.path.basename(path))
        with open(path, "rb") as f:
            raw = f.read()
        if n == 1:
            raw = b"<html><body>503 Service Unavailable</body></html>\n" * 40
        elif n == 2:
            raw = _cut_in_member(raw)
        elif n == 0:
            raw = _garble_member(raw, 4, bad_member_ext)
        with open(dst, "wb") as f:
            f.write(raw)
        out.append(dst)
    return out


def _members(raw: bytes) -> List[tarfile.TarInfo]:
    with tarfile.open(fileobj=io.BytesIO(raw)) as tf:
        return tf.getmembers()


def _cut_in_member(raw: bytes) -> bytes:
    members = _members(raw)
    m = members[len(members) * 2 // 3]
    return raw[: m.offset_data + max(1, m.size // 2)]


def _garble_member(raw: bytes, sample: int, ext: str) -> bytes:
    keys: List[str] = []
    for m in _members(raw):
        key, e = m.name.split(".", 1)
        if not keys or keys[-1] != key:
            keys.append(key)
        if len(keys) - 1 == sample and e == ext:
            junk = bytes((i * 89 + 13) % 256 for i in range(m.size))
            return raw[: m.offset_data] + junk + raw[m.offset_data + m.size:]
    raise ValueError(f"no .{ext} member in sample {sample}")
