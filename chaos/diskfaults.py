"""Disk faults for chaos runs: small and read-only filesystems, damaged cache files.

Filesystems are tmpfs mounts (``mount -t tmpfs -o size=...``), which needs
root (or CAP_SYS_ADMIN).  :func:`tmpfs` raises :class:`MountUnavailable` with
the reason when mounting is not possible, so callers can skip and say why.

Cache damage works on a :class:`resumewds.cache.ShardStore` directory
(``<cache>/shards/<hash>-<name>`` plus ``.meta``, ``.partial``, ``.etag``,
``.lock`` side files).  Every function returns how many faults it injected.

Example:
    >>> import random, tempfile
    >>> damage_cache(tempfile.mkdtemp(), random.Random(0), ["flip"])
    0
"""

from __future__ import annotations

import contextlib
import glob
import json
import os
import random
import subprocess
from typing import Iterator, List, Sequence

DAMAGE_KINDS = ("flip", "truncate", "delete", "delete_meta", "garbage_meta")


class MountUnavailable(RuntimeError):
    """A tmpfs could not be mounted here (not root, no CAP_SYS_ADMIN, no mount(8))."""


@contextlib.contextmanager
def tmpfs(path: str, size: str, readonly: bool = False) -> Iterator[str]:
    """Mount a tmpfs of ``size`` (e.g. ``"2m"``) at ``path`` for the ``with`` block.

    Raises:
        MountUnavailable: mounting failed; the message has mount's reason.
    """
    os.makedirs(path, exist_ok=True)
    opts = f"size={size},mode=0755" + (",ro" if readonly else "")
    try:
        r = subprocess.run(["mount", "-t", "tmpfs", "-o", opts, "tmpfs", path],
                           capture_output=True, text=True, timeout=20)
    except (OSError, subprocess.SubprocessError) as exc:
        raise MountUnavailable(f"mount not runnable: {exc}") from exc
    if r.returncode != 0:
        raise MountUnavailable(f"mount -t tmpfs failed: {(r.stderr or r.stdout).strip() or r.returncode}")
    try:
        yield path
    finally:
        subprocess.run(["umount", "-l", path], capture_output=True, timeout=20)


def remount(path: str, readonly: bool) -> None:
    """Switch a mounted tmpfs between read-only and read-write."""
    r = subprocess.run(["mount", "-o", "remount," + ("ro" if readonly else "rw"), path],
                       capture_output=True, text=True, timeout=20)
    if r.returncode != 0:
        raise MountUnavailable(f"remount failed: {r.stderr.strip()}")


def fill(path: str, leave: int = 0) -> str:
    """Fill the filesystem holding ``path`` until ``leave`` bytes are free; return the filler file."""
    filler = os.path.join(path, "filler.bin")
    st = os.statvfs(path)
    free = st.f_bavail * st.f_frsize
    want = max(0, free - leave)
    with open(filler, "wb") as f:
        chunk = b"\0" * (1 << 16)
        while want > 0:
            try:
                n = f.write(chunk[: min(len(chunk), want)])
            except OSError:
                break
            want -= n
    return filler


def cache_entries(cache_dir: str) -> List[str]:
    """Published shard files in a cache (no side files)."""
    out = []
    for p in glob.glob(os.path.join(cache_dir, "shards", "*")):
        if not p.endswith((".partial", ".etag", ".meta", ".lock", ".tmp")) and os.path.isfile(p):
            out.append(p)
    return sorted(out)


def flip_byte(path: str, at: int, mask: int = 0xFF) -> None:
    """XOR the byte at offset ``at`` of ``path`` with ``mask``, in place (size and
    everything else unchanged)."""
    with open(path, "r+b") as f:
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ mask]))


def damage_cache(cache_dir: str, rng: random.Random, kinds: Sequence[str] = DAMAGE_KINDS,
                 count: int = 2) -> int:
    """Damage up to ``count`` cached shards, each with one of ``kinds``.

    flip: one byte flipped in place; truncate: cut to a random length in
    place; delete: the shard file removed (meta stays); delete_meta: its
    ``.meta`` removed; garbage_meta: ``.meta`` overwritten with junk.
    """
    entries = cache_entries(cache_dir)
    rng.shuffle(entries)
    n = 0
    for path in entries[:count]:
        kind = rng.choice(list(kinds))
        try:
            if kind == "flip":
                size = os.path.getsize(path)
                if size == 0:
                    continue
                flip_byte(path, rng.randrange(size))
            elif kind == "truncate":
                os.truncate(path, rng.randrange(max(1, os.path.getsize(path))))
            elif kind == "delete":
                os.unlink(path)
            elif kind == "delete_meta":
                os.unlink(path + ".meta")
            elif kind == "garbage_meta":
                with open(path + ".meta", "wb") as f:
                    f.write(rng.randbytes(40))
        except OSError:
            continue
        n += 1
    return n


def plant_stale(cache_dir: str, urls: Sequence[str], rng: random.Random) -> int:
    """Leave what a killed downloader leaves, made worse: for each url a
    ``.partial`` of random bytes with an ``.etag`` that the server will accept
    (so a naive Range resume would append real bytes to garbage), and a
    ``.lock`` file.  Returns the number of planted entries.
    """
    from resumewds.cache import ShardStore

    store = ShardStore(cache_dir=cache_dir)
    os.makedirs(store.shards_dir, exist_ok=True)
    n = 0
    for url in urls:
        base = store.entry_path(url)
        with open(base + ".partial", "wb") as f:
            f.write(rng.randbytes(rng.randrange(1000, 20000)))
        with open(base + ".lock", "wb"):
            pass
        n += 1
    return n


def server_etag(path: str) -> str:
    """The ETag the fault server sends for a file (so planted partials look resumable)."""
    st = os.stat(path)
    return f'"{st.st_size:x}-{st.st_mtime_ns:x}"'


def simulate_reboot(cache_dir: str, rng: random.Random, count: int = 2) -> int:
    """Leave the cache as a machine crash might, seen from the next boot.

    Every unsynced entry's meta and every partial's sidecar is rewritten to
    name another boot (what they look like after a reboot), and ``count``
    unsynced entries get bytes zeroed in place with their size and mtime kept
    (pages the crash never wrote back: nothing in the file's stat shows it).
    Returns the number of damaged entries.
    """
    for side in glob.glob(os.path.join(cache_dir, "shards", "*.partial.etag")):
        try:
            with open(side) as f:
                d = json.loads(f.read())
            if isinstance(d, dict):
                d["boot"] = "the-boot-before"
                with open(side, "w") as f:
                    f.write(json.dumps(d))
        except (OSError, ValueError):
            continue
    unsynced = []
    for path in cache_entries(cache_dir):
        try:
            with open(path + ".meta") as f:
                meta = json.loads(f.read())
        except (OSError, ValueError):
            continue
        if meta.get("synced") is False:
            meta["boot"] = "the-boot-before"
            with open(path + ".meta", "w") as f:
                f.write(json.dumps(meta))
            unsynced.append(path)
    rng.shuffle(unsynced)
    n = 0
    for path in unsynced[:count]:
        st = os.stat(path)
        if st.st_size < 2:
            continue
        off = rng.randrange(st.st_size // 2)
        with open(path, "r+b") as f:
            f.seek(off)
            f.write(b"\0" * min(4096, st.st_size - off))
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))
        n += 1
    return n

