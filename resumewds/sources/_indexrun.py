"""Indexing a data set at scale: shards in parallel processes, and a journal that survives a kill.

What ``resumewds index`` runs (:func:`run_index`):

1. Each shard not indexed yet is fetched (remote ones through the verified
   cache), scanned and hashed in a worker process (``jobs`` of them, each with
   :data:`THREADS` shards at once), checked against what its source declared,
   and its index file written into ``<output>.index/``.
2. The parent appends one JSON line per finished shard to ``<output>.indexing``,
   flushed at once: after a kill the same command continues with the others
   (a record counts only if it still matches: see :func:`_read_journal`).
3. When every shard is done, the manifest is written (with the ``created``
   time of the first start) and the journal removed: a resumed run's output
   equals a clean run's.

A failing shard does not stop the others: the run ends with an error listing
them and keeps the rest.  With ``counts_only`` nothing is read: the manifest
gets the counts the sources declare (:class:`resumewds.manifest.RecordBook`).

Example:
    >>> from resumewds.sources import resolve_sources
    >>> m = run_index(resolve_sources("data/shard-{000000..000003}.tar"), "/tmp/m.json", jobs=2)  # doctest: +SKIP
"""

from __future__ import annotations

import itertools
import json
import multiprocessing
import os
import shutil
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, ThreadPoolExecutor, as_completed, wait
from typing import Any, Callable, Dict, Iterator, List, Optional, Set, Tuple

import xxhash

from ..cache import ShardStore
from ..errors import ResumeWDSError, SourceError
from ..fetch import is_remote_url
from ..manifest import (
    Counted,
    IndexDigests,
    IndexOffsets,
    IndexRef,
    IndexSet,
    Manifest,
    ShardInfo,
    index_bytes,
    scan_to_index,
    write_index,
)

__all__ = ["JOURNAL_FORMAT", "THREADS", "default_jobs", "index_batch", "index_one", "journal_path", "run_index"]

JOURNAL_FORMAT = "resumewds.indexing"
#: seconds between two fsyncs of the journal (every line is flushed at once)
SYNC_EVERY = 2.0

Record = Dict[str, Any]


def journal_path(output: str) -> str:
    """Where the run that writes ``output`` keeps what it has done."""
    return output + ".indexing"


def default_jobs() -> int:
    """Worker processes by default: this process's CPUs, at most 8."""
    try:
        n = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        n = os.cpu_count() or 1
    return max(1, min(8, n))


def index_one(task: Tuple[Any, ...]) -> Record:
    """Index one shard (in a worker process): fetch it if remote, scan it, write
    its index file.  Never raises: a failure is a record with ``error``.

    ``task``: ``(i, url, size, xxh3_64, samples, md5, source, digests, index_dir, store_kwargs)``.
    """
    i, url, size, xxh, samples, md5, source, digests, index_dir, store_kwargs = task
    try:
        if is_remote_url(url):
            with ShardStore(**store_kwargs) as store:  # downloads through the fetch core, verified
                path = store.ensure(ShardInfo(url=url, size=size, xxh3_64=xxh))
        else:
            path = url[7:] if url.startswith("file://") else url
        buf, idx = scan_to_index(path, url, samples=samples, size=size, xxh3_64=xxh, md5=md5, source=source,
                                 digests=digests)
        name = write_index(index_dir, buf)
    except (ResumeWDSError, OSError) as exc:
        return {"i": i, "url": url, "error": f"{type(exc).__name__}: {exc}"}
    return {"i": i, "url": url, "size": idx.size, "xxh3_64": idx.xxh3_64, "samples": idx.samples,
            "index_xxh3_64": name, "digests": digests}


def _read_journal(path: str, shards: List[ShardInfo], index_dir: str, digests: bool) -> Tuple[Dict[int, Record], str]:
    """The shards a journal holds as done, and its start time.  A record counts
    when it is of the same shard (position and url), agrees with the sources
    now, was made with the same ``digests``, and its index file is whole.

    Raises:
        SourceError: the file is not an indexing journal.
    """
    with open(path, "rb") as f:
        lines = f.read().split(b"\n")
    try:
        head = json.loads(lines[0])
    except ValueError:
        head = None
    if not isinstance(head, dict) or head.get("format") != JOURNAL_FORMAT:
        raise SourceError(f"{path}: not an indexing journal; remove it to start the index again")
    done: Dict[int, Record] = {}
    for raw in lines[1:]:
        try:
            rec = json.loads(raw)
            i = rec["i"]
            s = shards[i] if isinstance(i, int) and i >= 0 else None
            if s is None:
                continue
            size, xxh, samples = _declared(s)[:3]
            ok = (rec["url"] == s.url and rec["digests"] == digests and size in (None, rec["size"])
                  and xxh in (None, rec["xxh3_64"]) and samples in (None, rec["samples"]))
            if ok:  # the index file is whole (written before its line, but maybe not yet on disk)
                with open(os.path.join(index_dir, rec["index_xxh3_64"] + ".idx"), "rb") as f:
                    buf = f.read()
                ok = len(buf) == index_bytes(int(rec["samples"]), digests and not s.compressed) and \
                    xxhash.xxh3_64_hexdigest(buf) == rec["index_xxh3_64"]
        except (ValueError, KeyError, IndexError, TypeError, OSError):
            continue  # the line a kill cut short, or an index file since removed
        if ok:
            done[i] = rec
    return done, str(head.get("created") or "")


#: shards a worker process indexes at once, on threads of its own (hashing and reads overlap the
#: Python framing of the others, as build_manifest's threads do)
THREADS = 4


def index_batch(tasks: List[Tuple[Any, ...]]) -> List[Record]:
    """:func:`index_one` of each task, up to :data:`THREADS` at once (in a worker process)."""
    if len(tasks) == 1:
        return [index_one(tasks[0])]
    with ThreadPoolExecutor(min(THREADS, len(tasks)), thread_name_prefix="resumewds-index") as pool:
        return list(pool.map(index_one, tasks))


def _batches(tasks: Iterator[Tuple[Any, ...]], size: int) -> Iterator[List[Tuple[Any, ...]]]:
    while batch := list(itertools.islice(tasks, size)):
        yield batch


def _results(tasks: Iterator[Tuple[Any, ...]], jobs: int) -> Iterator[Record]:
    """Each task's record as its batch finishes (``jobs`` processes, or this one for 1)."""
    if jobs <= 1:
        for batch in _batches(tasks, THREADS):
            yield from index_batch(batch)
        return
    # fork (cheap: no new interpreter importing the package) only when this process runs no other
    # thread, whose locks a forked child could inherit held; else spawn
    ctx = multiprocessing.get_context("fork" if threading.active_count() == 1 else "spawn")
    with ProcessPoolExecutor(jobs, mp_context=ctx) as pool:
        running: Set[Future] = set()
        for batch in _batches(tasks, THREADS):
            running.add(pool.submit(index_batch, batch))
            if len(running) >= 2 * jobs:
                done, running = wait(running, return_when=FIRST_COMPLETED)
                for fut in done:
                    yield from fut.result()
        for fut in as_completed(running):
            yield from fut.result()


def run_index(manifest: Manifest, output: str, *, jobs: int = 1, offsets: str = "auto", digests: bool = True,
              cache_dir: Optional[str] = None, cache_size: Any = None, fetch: Any = None,
              counts_only: bool = False, progress: Optional[Callable[[int], None]] = None,
              on_resume: Optional[Callable[[int, int], None]] = None) -> Manifest:
    """Index ``manifest``'s shards into ``output`` (see the module docstring).

    Args:
        manifest: the shards (resolved sources); completed in place.
        jobs: worker processes (1: in this process).
        offsets: as for :meth:`Manifest.save`.
        cache_dir, cache_size, fetch: the cache and fetch settings for remote shards.
        counts_only: read nothing; write the counts the sources declare (version 4).
        progress: called with the number of shards done, as they finish.
        on_resume: ``on_resume(done, total)`` when an interrupted run is continued.

    Raises:
        SourceError: some shards could not be indexed (the message lists them),
            or ``counts_only`` with a shard whose count is unknown.
    """
    shards = manifest.shards
    index_dir = output + ".index"
    if counts_only:
        missing = [s.url for s in shards if s.samples is None]
        if missing:
            raise SourceError(f"{missing[0]}: no sample count to write with --counts-only (a wids shard index, "
                              f"img2dataset's *_stats.json or a manifest gives them; {len(missing)} shard(s))")
        manifest.save(output, offsets="index", digests=digests)
        return manifest
    # shards not indexed yet, and (for digests) those whose index has no sample digests
    todo = [i for i, s in enumerate(shards)
            if not s.indexed or (digests and s.sample_digests is None and not s.compressed)]
    jpath = journal_path(output)
    done: Dict[int, Record] = {}
    created = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    if os.path.exists(jpath):
        done, created = _read_journal(jpath, shards, index_dir, digests)
        done = {i: r for i, r in done.items() if i in set(todo)}
        if on_resume is not None:
            on_resume(len(done), len(todo))
    else:
        with open(jpath, "w") as f:
            f.write(json.dumps({"format": JOURNAL_FORMAT, "version": 1, "created": created}) + "\n")
    if progress is not None and done:
        progress(len(done))
    store_kwargs = {"cache_dir": cache_dir, "cache_size": cache_size, "fetch": fetch}
    tasks = ((i, s.url, *_declared(s), digests, index_dir, store_kwargs) for i in todo if i not in done
             for s in (shards[i],))
    failed: List[Record] = []
    with open(jpath, "a") as jf:
        synced = time.monotonic()
        for rec in _results(tasks, jobs):
            if "error" in rec:
                failed.append(rec)
            else:
                jf.write(json.dumps(rec, separators=(",", ":")) + "\n")
                jf.flush()
                done[rec["i"]] = rec
                if time.monotonic() - synced > SYNC_EVERY:
                    os.fsync(jf.fileno())
                    synced = time.monotonic()
            if progress is not None:
                progress(1)
    if failed:
        failed.sort(key=lambda r: r["i"])
        which = "; ".join(f"{r['url']}: {r['error']}" for r in failed[:5])
        more = f"; and {len(failed) - 5} more" if len(failed) > 5 else ""
        # one line, as every error of the CLI (its last stderr line names the shards)
        raise SourceError(f"{len(failed)} of {len(shards)} shards could not be indexed: {which}{more} (the "
                          f"{len(done)} indexed are kept in {jpath}: fix these and run the same command again)")
    _adopt(shards, done, IndexSet(index_dir, digests=digests))
    manifest._starts = None
    written = manifest.save(output, offsets=offsets, digests=digests, created=created)
    os.remove(jpath)
    if written != "index":  # the index files were the run's own scratch
        shutil.rmtree(index_dir, ignore_errors=True)
    return manifest


def _declared(s: ShardInfo) -> Tuple[Any, ...]:
    """``(size, xxh3_64, samples, md5, source)`` a source declared of shard ``s``."""
    c = s.index if isinstance(s.index, Counted) else None
    if c is not None:
        return c.size, c.xxh3_64, s.samples, c.md5, c.source
    return s.size, s.xxh3_64, s.samples, None, "the manifest"


def _adopt(shards: List[ShardInfo], done: Dict[int, Record], iset: IndexSet) -> None:
    """Give each indexed shard its record and a lazy view of its index file."""
    for i, rec in done.items():
        s = shards[i]
        s.size, s.xxh3_64, s.samples = rec["size"], rec["xxh3_64"], rec["samples"]
        ref = IndexRef(iset, rec["index_xxh3_64"], s)
        s.index, s.offsets = ref, IndexOffsets(ref)
        s.sample_digests = IndexDigests(ref) if iset.digests and not s.compressed else None
