"""The ranged reads' fetches: one coalesced range of a shard, verified, under the shard's budget.

:func:`resumewds.reading.prepare` fetches the samples of shards that are
not cached yet by HTTP/S3 ``Range`` (:func:`resumewds.repair.fetch_range`);
this module holds the rules those fetches follow:

* **one budget per shard and read** (:func:`shard_budget`): the ranged
  reads of a shard draw from the same :class:`~resumewds.fetch.FetchBudget`
  as its whole-shard download (prefetch thread and reader), so a server
  that never answers costs ``RESUMEWDS_FETCH_ATTEMPTS`` requests of that
  shard in all, not that many per range and per step; the read ends (and
  the next one has a budget of its own) when the shard fails or the
  iteration ends (:func:`end_budget`);
* **a corrupt range falls back** (:func:`fetch_group`): a range whose bytes
  fail the digest of a sample the step needs costs one attempt of that
  budget, then the shard is read the whole-shard way (downloaded, checked
  whole, repaired) -- :class:`RangeCorrupt`, which
  :func:`~resumewds.reading.prepare` treats like a server that ignores
  ``Range``; only when the budget is spent does the mismatch end the read;
* **a final error caused by a ranged read says so** (:func:`blame_ranged`):
  it names ``RESUMEWDS_RANGED_READS=0``, which reads whole shards only.

Example:
    >>> "RESUMEWDS_RANGED_READS=0" in RANGED_HINT
    True
"""

from __future__ import annotations

from typing import Any, Dict, List, Optional, TypeVar

import xxhash

from . import tario
from .cache import sparse
from .errors import ChecksumMismatch, ResumeWDSError
from .fetch import FetchBudget
from .manifest import ShardInfo
from .repair import RangeIgnored, fetch_range

__all__ = ["RANGED_HINT", "RangeCorrupt", "blame_ranged", "end_budget", "fetch_group", "parse_in", "shard_budget",
           "verified_in"]

_E = TypeVar("_E", bound=BaseException)

#: appended to a final error a ranged read caused
RANGED_HINT = " (a ranged read; RESUMEWDS_RANGED_READS=0 reads whole shards only)"


class RangeCorrupt(RangeIgnored):
    """A range's bytes failed a sample digest: read this shard whole instead.

    Attributes:
        mismatch: the :class:`~resumewds.errors.ChecksumMismatch` of the sample.
    """

    def __init__(self, msg: str = "", url: str = "", status: Optional[int] = None,
                 mismatch: Optional[ChecksumMismatch] = None, **fields: Any):
        super().__init__(msg, url, status, **fields)
        self.mismatch = mismatch


def shard_budget(store: Any, url: str, config: Any, used: Dict[str, Any]) -> Any:
    """The budget the ranged reads of ``url`` draw from: the store's budget for
    this read of the shard (shared with its prefetch and whole-shard reads),
    or, for a store without one, a budget of their own; kept in ``used``
    (per url) for :func:`end_budget`."""
    budget_for = getattr(store, "_budget_for", None)
    if callable(budget_for):
        b = budget_for(url)
    else:
        b = used.get(url)
        if b is None or b.exhausted:
            b = FetchBudget(config)
    used[url] = b
    return b


def end_budget(store: Any, url: str, used: Dict[str, Any]) -> None:
    """This read of ``url`` is over (it failed, or the iteration ends): the
    next read of the shard starts with a budget of its own, as after a
    reader's whole-shard read."""
    b = used.pop(url, None)
    done = getattr(store, "_budget_done", None)
    if b is not None and callable(done):
        done(url, b, False, True)


def blame_ranged(err: _E) -> _E:
    """``err`` (one of ours), its message naming the ranged read and
    ``RESUMEWDS_RANGED_READS=0``, when a ranged read caused it (a range's
    digest mismatch or a range-specific failure); else ``err`` as it is."""
    if not isinstance(err, ResumeWDSError) or not err.args:
        return err
    msg = str(err)
    if RANGED_HINT in msg or not (isinstance(err, (ChecksumMismatch, RangeIgnored)) or "range" in msg.lower()):
        return err
    err.args = (msg + RANGED_HINT,) + tuple(err.args[1:])
    return err


def fetch_group(rr: Any, on_event: Any, shard: Any, lo: int, hi: int, js: List[int], config: Any, budget: Any,
                needed: Optional[set] = None) -> Dict[int, Dict[str, Any]]:
    """Fetch bytes ``[lo, hi)`` of ``shard`` and return its samples ``js``, each verified.

    A sample read ahead (not in ``needed``) that fails its digest is left
    out; one the step needs costs one attempt of ``budget`` and raises
    :class:`RangeCorrupt` (read the shard whole), or, with the budget
    spent, its :class:`~resumewds.errors.ChecksumMismatch`.
    """
    def fetch(a: int, b: int) -> bytes:
        data = fetch_range(shard.url, a, b, config=config, budget=budget, session=rr.session(), on_event=on_event)
        with rr.lock:
            rr.counters["range_requests"] += 1
            rr.counters["range_bytes"] += len(data)
        return data

    # what the shard's sparse partial holds (or this process's download is writing) is not fetched again
    # (the first step, the first batch, waits only for a download about as close as its own request)
    def keep(data: bytes) -> None:
        # the verified samples go into the shard's sparse partial (while the range is still
        # claimed: the download never asks for them): never downloaded again
        ok = {j for j in js if verified_in(data, lo, shard, j)}
        kept = sparse.keep_verified(rr.store, shard, lo, data, sparse.verified_spans(shard, lo, hi, data, ok))
        if kept:
            with rr.lock:
                rr.counters["range_kept"] += kept

    # (the first step's ranges are written there once delivered: the first batch comes first)
    data = sparse.fetch_around(rr.store, shard, lo, hi, fetch, patient=rr.steps > 0, keep=keep)
    bads = [j for j in js if not verified_in(data, lo, shard, j)]
    for j in bads:
        a, b = shard.sample_range(j)
        on_event("range_verify_fail", shard.url, sample=j, start=a, end=b)
    bad = next((j for j in bads if needed is None or j in needed), None)
    if bad is None:
        with rr.lock:
            rr.counters["range_dropped"] += len(bads)
        return {j: parse_in(data, lo, shard, j) for j in js if j not in bads}
    a, b = shard.sample_range(bad)
    assert shard.sample_digests is not None
    got = xxhash.xxh3_64_intdigest(memoryview(data)[a - lo:b - lo])
    err = blame_ranged(ChecksumMismatch(f"{shard.url} sample {bad} (bytes {a}-{b}, ranged read)",
                                        format(int(shard.sample_digests[bad]), "016x"), format(got, "016x")))
    with rr.lock:
        rr.counters["range_refetches"] += 1
    spent = not budget.take()  # the corrupt answer is a failed attempt of the shard's budget
    budget.last_error = err
    if spent:
        raise err
    raise RangeCorrupt(f"{shard.url}: sample {bad} of a ranged read failed its digest; reading the shard whole",
                       shard.url, 206, mismatch=err)


def verified_in(buf: Any, lo: int, shard: ShardInfo, j: int) -> bool:
    """Whether sample ``j`` of ``shard``, within ``buf`` (which starts at byte ``lo``), matches its digest."""
    assert shard.offsets is not None and shard.sample_digests is not None
    a, b = int(shard.offsets[j]) - lo, int(shard.offsets[j + 1]) - lo
    return xxhash.xxh3_64_intdigest(memoryview(buf)[a:b]) == int(shard.sample_digests[j])


def parse_in(buf: bytes, lo: int, shard: ShardInfo, j: int) -> Dict[str, Any]:
    """Sample ``j`` of ``shard`` parsed out of ``buf`` (which starts at byte ``lo``; its digest checked)."""
    assert shard.offsets is not None
    a, b = int(shard.offsets[j]), int(shard.offsets[j + 1])
    sample = tario.parse_sample(buf, shard.url, base=a, start=a - lo, end=b - lo, verified=True)  # digest checked
    sample["__url__"] = shard.url
    return sample
