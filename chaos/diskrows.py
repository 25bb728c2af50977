"""Rows of ``python -m chaos run`` for the shard cache's disk: full, read-only, damaged, crashed.

* a cache on a tmpfs smaller than the data (ENOSPC mid-download) and a
  read-only cache directory: clear errors (SKIP where tmpfs needs root);
* cache files corrupted, truncated or deleted between runs (with kills) and
  while runs read them: reruns with a journal finish exactly;
* stale ``.partial`` files with a valid ETag sidecar, leftover lock files;
* a machine crash: unsynced cache pages lost under an unchanged size and mtime.

Example:
    >>> cache_damage_between(3).label
    'cache_damage_between'
"""

from __future__ import annotations

import json
import os
import random
import threading
from typing import List, Optional

from chaos import diskfaults
from chaos.crash import Harness, cat_cmd, committed_samples, compare, run
from chaos.harness import BOUND, Row, Scenario, Suite, labelled, last_line, shard_paths
from resumewds.cache import ShardStore
from resumewds.fetch import boot_id

__all__ = ["cache_damage_between", "cache_damage_during", "disk_rows", "readonly_cache", "reboot",
           "stale_partials", "tmpfs_full"]


def tmpfs_full(s: Suite) -> Row:
    """ENOSPC mid-download: the cache on a tmpfs smaller than the data."""
    row = Row("cache on a full tmpfs (ENOSPC mid-download)", "error")
    d = s.tmp("enospc")
    mnt = os.path.join(d, "mnt")
    total = sum(os.path.getsize(p) for p in shard_paths(s.data))
    srv = s.server()
    try:
        with diskfaults.tmpfs(mnt, f"{max(64, total // 3 // 1024)}k"):
            p = run(cat_cmd(srv.url + "manifest.json", cache_dir=os.path.join(mnt, "cache"), epochs=1), bound=BOUND)
            s.judge(row, p)
            row.faults = 1
            if p.rc and "space" not in p.err:
                row.bad_exits.append(f"error does not say the disk is full: {last_line(p.err)}")
    except diskfaults.MountUnavailable as exc:
        row.skip = str(exc)
    finally:
        srv.stop()
    return row


def readonly_cache(s: Suite) -> Row:
    """The cache directory on a read-only mount: a clear error."""
    row = Row("read-only cache directory", "error")
    d = s.tmp("rocache")
    mnt = os.path.join(d, "mnt")
    srv = s.server()
    try:
        with diskfaults.tmpfs(mnt, "4m", readonly=True):
            p = run(cat_cmd(srv.url + "manifest.json", cache_dir=mnt, epochs=1), bound=BOUND)
            s.judge(row, p)
            row.faults = 1
    except diskfaults.MountUnavailable as exc:
        row.skip = str(exc)
    finally:
        srv.stop()
    return row


def cache_damage_between(kills: int) -> Scenario:
    """Cache files damaged between ``kills`` SIGKILLed runs of ``cat --journal``."""
    def scenario(s: Suite) -> Row:
        row = Row("cache corrupted/truncated/deleted between runs (+kills)", "resume")
        h = Harness(s.tmp("damage"), seed=s.seed, shards=6, samples=80)
        injected = [0]

        def between(cache: str, rng: random.Random) -> int:
            n = diskfaults.damage_cache(cache, rng, count=3)
            injected[0] += n
            return n
        try:
            rep = h.crash_cat(kills, random.Random(f"{s.seed}:damage"), bound=BOUND, between=between)
        finally:
            h.close()
        row.runs, row.tally, row.hung, row.bad_exits = rep.runs, rep.tally, rep.hung, list(rep.errors)
        row.faults = injected[0] + rep.kills
        row.note = f"{injected[0]} damaged files, {rep.kills} kills"
        return row
    return labelled("cache_damage_between", scenario)


def cache_damage_during(s: Suite) -> Row:
    """Files deleted, truncated or replaced by a corrupt copy while a run reads them:
    each run ends exactly or with a clear error; reruns with the journal finish exactly."""
    row = Row("cache damaged during runs (delete/truncate/replace)", "resume")
    srv = s.server(bytes_per_second=4e6)
    d = s.tmp("during")
    cache = os.path.join(d, "cache")
    journal = os.path.join(d, "run.db")
    cmd = cat_cmd(srv.url + "manifest.json", journal=journal, cache_dir=cache, epochs=2, commit_every=5)
    rng = random.Random(f"{s.seed}:during")
    stop = threading.Event()
    count = [0]

    def vandal() -> None:
        while not stop.wait(rng.uniform(0.05, 0.3)):
            for path in diskfaults.cache_entries(cache)[:1]:
                kind = rng.choice(["delete", "truncate", "replace"])
                try:
                    if kind == "delete":
                        os.unlink(path)
                    elif kind == "truncate":
                        os.truncate(path, rng.randrange(max(1, os.path.getsize(path))))
                    else:
                        with open(path, "rb") as f:
                            b = bytearray(f.read())
                        if b:
                            b[rng.randrange(len(b))] ^= 0xFF
                        with open(path + ".vandal", "wb") as f:
                            f.write(b)
                        os.replace(path + ".vandal", path)
                    count[0] += 1
                except OSError:
                    pass

    kept: List[str] = []
    full: Optional[List[str]] = None
    t = threading.Thread(target=vandal, daemon=True)
    t.start()
    try:
        for attempt in range(12):
            if attempt >= 8:
                stop.set()
            before = committed_samples(journal)
            p = run(cmd, bound=BOUND)
            row.runs += 1
            after = committed_samples(journal)
            kept.extend(p.lines[: after - before])
            if p.hung:
                row.hung += 1
                row.bad_exits.append("hung")
                break
            if p.rc == 0:
                break
            if p.clear_error:
                row.clear_errors += 1
            else:
                row.bad_exits.append(f"unclear exit {p.rc}: {last_line(p.err)}")
                break
        stop.set()
        t.join(5)
        full = run(cat_cmd(s.data.manifest, epochs=2, workers=0), bound=BOUND).lines
        row.tally.add(compare(full, kept, s.data.digests))
        row.faults = count[0]
        row.note = f"{count[0]} files damaged under running readers"
    finally:
        stop.set()
        srv.stop()
    return row


def stale_partials(s: Suite) -> Row:
    """Garbage .partial files whose .etag matches the server, and leftover .lock files."""
    row = Row("stale partials (garbage + valid ETag) and lock files", "exact")
    srv = s.server()
    try:
        d = s.tmp("stale")
        cache = os.path.join(d, "cache")
        rng = random.Random(s.seed)
        paths = shard_paths(s.data)
        urls = [srv.url + os.path.basename(p) for p in paths]
        row.faults = diskfaults.plant_stale(cache, urls, rng)
        store = ShardStore(cache_dir=cache)
        for i, (url, path) in enumerate(zip(urls, paths)):
            # the sidecar as this version writes it (this boot's id: trusted),
            # and in the older plain-text form
            side = diskfaults.server_etag(path)
            if i % 2 == 0:
                side = json.dumps({"validator": side, "boot": boot_id()})
            with open(store.entry_path(url) + ".partial.etag", "w") as f:
                f.write(side)
        p = run(cat_cmd(srv.url + "manifest.json", cache_dir=cache, epochs=1), bound=BOUND)
        s.judge(row, p)
    finally:
        srv.stop()
    return row


def reboot(s: Suite) -> Row:
    """A machine crash: unsynced cache entries (sync="boot", the default) from
    the previous boot, some with zeroed pages under an unchanged size and
    mtime.  ``verify="once"`` alone would trust them; the boot id makes the
    next run hash them again (and fetch the damaged ones anew)."""
    row = Row("machine crash: unsynced cache pages lost (size/mtime kept)", "exact")
    srv = s.server()
    try:
        d = s.tmp("reboot")
        cache = os.path.join(d, "cache")
        url = srv.url + "manifest.json"
        first = run(cat_cmd(url, cache_dir=cache, epochs=1), bound=BOUND)
        s.judge(row, first)
        row.faults = diskfaults.simulate_reboot(cache, random.Random(s.seed), count=3)
        p = run(cat_cmd(url, cache_dir=cache, epochs=1), bound=BOUND)
        s.judge(row, p)
        row.note = f"{row.faults} entries with zeroed pages under unchanged stat, rerun after the 'reboot'"
    finally:
        srv.stop()
    return row



def disk_rows(quick: bool) -> List[Scenario]:
    """The rows above, in the order the matrix runs them."""
    return [tmpfs_full, readonly_cache, cache_damage_between(3 if quick else 8), cache_damage_during,
            stale_partials, reboot]
