"""Generate small, reproducible WebDataset shards (for the demo, tests, benches).

Example:
    >>> write_shards("d", shards=2, samples=3)
    ['d/shard-000000.tar', 'd/shard-000001.tar']
"""

from __future__ import annotations

import io
import os
import random
import tarfile
from typing import List, Tuple


def _jpeg(rng: random.Random, side: int) -> bytes:
    import numpy as np
    import PIL.Image

    base = rng.randrange(256)
    arr = (np.arange(side * side * 3, dtype=np.uint32).reshape(side, side, 3) * (base + 1) % 251).astype("uint8")
    noise = np.frombuffer(rng.randbytes(side * side * 3), dtype=np.uint8).reshape(side, side, 3)
    img = PIL.Image.fromarray((arr // 2 + noise // 2).astype("uint8"))
    out = io.BytesIO()
    img.save(out, format="JPEG", quality=90)
    return out.getvalue()


def write_shards(directory: str, shards: int = 4, samples: int = 100,
                 size_range: Tuple[int, int] = (200, 2000), seed: int = 0,
                 images: bool = False, image_side: int = 64, prefix: str = "shard",
                 fmt: int = tarfile.USTAR_FORMAT) -> List[str]:
    """Write ``shards`` tar files of ``samples`` samples each; return their paths.

    Each sample (key ``s{shard:06d}_{sample:06d}``) has ``.bin`` (random bytes,
    length in ``size_range``; a ``.jpg`` of ``image_side`` pixels if
    ``images``), ``.cls`` and ``.txt``; shards are ``{prefix}-000000.tar``
    and up, in tarfile format ``fmt``.  The same arguments give the same bytes.

    Example:
        >>> paths = write_shards("d", shards=1, samples=2, images=True, image_side=8)
        >>> import tarfile
        >>> tarfile.open(paths[0]).getnames()  # doctest: +NORMALIZE_WHITESPACE
        ['s000000_000000.jpg', 's000000_000000.cls', 's000000_000000.txt',
         's000000_000001.jpg', 's000000_000001.cls', 's000000_000001.txt']
    """
    os.makedirs(directory, exist_ok=True)
    rng = random.Random(seed)
    paths = []
    for s in range(shards):
        path = os.path.join(directory, f"{prefix}-{s:06d}.tar")
        tmp = path + ".tmp"
        # one large write at a time, as TarWriter does (resumewds.writer.WRITE_BUFFER)
        with open(tmp, "wb", buffering=4 << 20) as f, tarfile.open(fileobj=f, mode="w", format=fmt) as tar:
            for i in range(samples):
                key = f"s{s:06d}_{i:06d}"
                members = []
                if images:
                    members.append(("jpg", _jpeg(rng, image_side)))
                else:
                    members.append(("bin", rng.randbytes(rng.randint(*size_range))))
                members.append(("cls", str(rng.randrange(10)).encode()))
                members.append(("txt", f"sample {key}".encode()))
                for ext, data in members:
                    ti = tarfile.TarInfo(f"{key}.{ext}")
                    ti.size = len(data)
                    ti.mtime = 1_700_000_000
                    tar.addfile(ti, io.BytesIO(data))
        os.replace(tmp, path)
        paths.append(path)
    return paths
