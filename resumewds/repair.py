"""Block repair: fix a corrupt shard copy by re-fetching only its bad samples.

A cached entry (or a finished download) whose whole-shard xxh3_64 fails is
checked sample by sample against the manifest's sample digests
(:mod:`resumewds.digests`, checked by :mod:`resumewds.samplecheck`); the byte ranges of the samples that fail, plus
the few bytes no digest covers (before the first sample, and the
end-of-archive marker after the last), are fetched with HTTP ``Range``
requests (neighbours coalesced into one request), each fetched sample is
checked against its digest, written in place, and the whole-shard check
runs again.  One flipped byte in a 32 MB shard then costs one sample's range
plus the tar trailer, not the shard.

The requests go through :mod:`resumewds.fetch`'s machinery: the same
timeouts (connect/read, shortened to the fetch deadline), the same retry
policy drawn from the same :class:`~resumewds.fetch.FetchBudget` as the
whole-shard fetch, and the same error mapping.

The caller falls back to a whole-shard fetch (returns None) when:

* the shard has no sample digests or offsets, or is not http(s);
* more than ``max_fraction`` of the shard fails (a whole fetch is cheaper);
* the server ignores ``Range`` (HTTP 200) or sends another range;
* a fetched sample does not match its digest (the server holds other
  bytes), or the repaired file still fails the whole-shard check.

State of one repair: ``CORRUPT -> (ranges fetched, each sample verified) ->
WHOLE CHECK -> OK`` or ``-> FALLBACK`` (whole-shard refetch by the caller).

Example:
    >>> r = repair_file("/cache/ab12.tar", shard, config=cfg)   # doctest: +SKIP
    >>> r.ok, r.bytes_fetched, [b.index for b in r.samples]      # doctest: +SKIP
    (True, 14336, [17])
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, List, Optional, Tuple

import xxhash

from . import tario
from .errors import CacheError, ChecksumMismatch, FetchError, IntegrityError, TransientFetchError
from .fetch import FetchBudget, is_remote_url, new_session
from .fetch.attempt import _Pace
from .fetch.errormap import _status_error, _translate
from .fetch.http import _CONTENT_RANGE
from .fetch.retry import _retry
from .samplecheck import BadSample, bad_samples
from .storeapi import StoreAPI

__all__ = ["RangeRepair", "coalesce", "fetch_range", "read_samples_by_range", "repair_download", "repair_entry",
           "repair_file"]

#: above this fraction of the shard failing, a whole-shard fetch is used instead
MAX_FRACTION = 0.25
#: neighbouring ranges closer than this are fetched in one request
COALESCE_GAP = 64 * 1024
#: a ranged fetch into a sink (a sparse download) hands it pieces of at most this many bytes
SINK_CHUNK = 256 * 1024


class RangeIgnored(FetchError):
    """The server answered a Range request with something other than that range."""


@dataclass
class RangeRepair:
    """What :func:`repair_file` did.

    Attributes:
        ok: the file now passes its whole-shard check.
        samples: the samples that failed their digests (and were re-fetched).
        ranges: the byte ranges requested, ``[(start, end)]``.
        bytes_fetched: body bytes received.
        xxh3_64: the repaired file's digest.
    """

    ok: bool
    samples: List[BadSample] = field(default_factory=list)
    ranges: List[Tuple[int, int]] = field(default_factory=list)
    bytes_fetched: int = 0
    xxh3_64: Optional[str] = None


def coalesce(ranges: List[Tuple[int, int]], gap: int = COALESCE_GAP) -> List[Tuple[int, int]]:
    """Merge sorted ``[start, end)`` ranges that touch or are closer than ``gap``.

    Example:
        >>> coalesce([(0, 10), (12, 20), (1000, 1010)], gap=5)
        [(0, 20), (1000, 1010)]
    """
    out: List[Tuple[int, int]] = []
    for a, b in sorted(r for r in ranges if r[1] > r[0]):
        if out and a - out[-1][1] <= gap:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def fetch_range(url: str, start: int, end: int, *, config: Any, budget: Any, session: Any = None,
                on_event: Any = None, sink: Optional[Callable[[int, bytes], None]] = None) -> bytes:
    """GET bytes ``[start, end)`` of ``url`` with a Range request, retried.

    Every request draws one attempt from ``budget`` (given back when it
    succeeds): a range costs what a whole-shard attempt costs, and the
    retries stop when the shard's budget is spent.

    With ``sink``, the body is not kept: ``sink(offset, chunk)`` receives
    it as it arrives (a sparse partial download writes it in place), a
    retry asks only for the bytes not sunk yet, and ``b""`` is returned.

    Raises:
        RangeIgnored: the server sent the whole file (200), another range, or
            416 (read the shard whole instead).
        TransientFetchError / PermanentFetchError: as :func:`resumewds.fetch.fetch_to_file`.

    Example:
        >>> fetch_range("http://127.0.0.1:8000/a.tar", 0, 512, config=cfg, budget=b)[:5]  # doctest: +SKIP
        b'./a.t'
    """
    done = _Done(start, sink)
    if url.startswith("s3://"):
        return _fetch_s3_range(url, start, end, config=config, budget=budget, on_event=on_event, done=done)

    def attempt() -> bytes:
        start = done.at  # a retry with a sink asks only for what it has not sunk yet
        pace = _Pace(url, config, budget, what=f"range {start}-{end - 1}")
        try:
            sess = session or new_session()
            sess.max_redirects = config.max_redirects
            resp = sess.get(url, headers={"Range": f"bytes={start}-{end - 1}", "Accept-Encoding": "identity"},
                            stream=True, allow_redirects=True,
                            timeout=(pace.timeout(config.connect_timeout), pace.timeout(config.read_timeout)))
            with resp:
                if resp.status_code == 200:
                    raise RangeIgnored(f"{url}: the server ignored Range (HTTP 200)", url, 200)
                if resp.status_code == 416:  # a plain GET may well serve it: read the shard whole
                    raise RangeIgnored(f"{url}: HTTP 416 for bytes {start}-{end - 1} (Content-Range "
                                       f"{resp.headers.get('Content-Range')!r})", url, 416)
                if resp.status_code != 206:
                    raise _status_error(url, resp)
                _check_range(url, "Content-Range", resp.headers.get("Content-Range"), start, end)
                enc = (resp.headers.get("Content-Encoding") or "").strip().lower()
                if enc not in ("", "identity"):
                    raise RangeIgnored(f"{url}: {enc}-encoded range body", url, 206)
                # into a sink (a download): larger pieces, fewer Python steps per byte
                return _range_body(url, resp.iter_content(SINK_CHUNK if sink else 1 << 16), start, end, pace,
                                   done)
        except (FetchError, CacheError):  # CacheError: the sink cannot write (the destination's fault)
            raise
        except Exception as exc:
            raise _translate(exc, url) from exc
        finally:
            if session is None and "sess" in locals():
                sess.close()

    return _retry_range(config, url, on_event, budget, attempt)


def _retry_range(config: Any, url: str, on_event: Any, budget: Any, attempt: Callable[[], bytes]) -> bytes:
    """``attempt`` under the retry policy, each try drawing from ``budget``
    (:func:`_budgeted`); a :class:`RangeIgnored` is no failure of the shard's
    (the budget's last error stays what it was)."""

    before = budget.last_error
    try:
        return _retry(config, url, on_event, budget, _budgeted(url, budget, attempt))
    except RangeIgnored:
        budget.last_error = before
        raise


def _budgeted(url: str, budget: Any, attempt: Callable[[], bytes]) -> Callable[[], bytes]:
    """``attempt`` drawing one attempt from ``budget`` (the shard's, shared with
    its whole-shard download), given back when the request succeeds or the
    server merely does not serve ranges (:class:`RangeIgnored`): only failed
    requests stay spent, and no more requests are in flight than attempts left."""
    def run() -> bytes:
        if not budget.hold():  # waits while other requests of the shard hold the attempts left
            if budget.fetched:  # downloaded whole meanwhile: read it there
                raise RangeIgnored(f"{url}: downloaded whole meanwhile; reading it from the cache", url)
            raise budget.exhausted_error(url)
        try:
            data = attempt()
        except RangeIgnored:
            budget.refund()
            raise
        except BaseException as exc:
            if isinstance(exc, FetchError):
                budget.last_error = exc
            budget.spend()
            raise
        budget.refund()
        return data

    return run


def _check_range(url: str, field: str, got: Optional[str], start: int, end: int) -> None:
    """Refuse an answer whose ``Content-Range`` (http) or ``ContentRange`` (s3)
    is not exactly bytes ``start``..``end - 1``."""

    m = _CONTENT_RANGE.match(got or "")
    if not m or int(m.group(1)) != start or int(m.group(2)) != end - 1:
        raise RangeIgnored(f"{url}: asked for bytes {start}-{end - 1}, got {field} {got!r}", url, 206)


class _Done:
    """Where a ranged fetch with a sink has got to (its retries resume there)."""

    def __init__(self, at: int, sink: Optional[Callable[[int, bytes], None]]):
        self.at = at
        self.sink = sink


def _range_body(url: str, chunks: Iterable[bytes], start: int, end: int, pace: Any,
                done: Optional[_Done] = None) -> bytes:
    """The body of a ranged answer, exactly ``end - start`` bytes: a longer one
    is refused (the server ignored the range), a shorter one is transient.
    With ``done.sink``, each chunk goes there as it arrives (``b""`` is returned)."""
    out: List[bytes] = []
    n = 0
    sink = done.sink if done is not None else None
    for chunk in chunks:
        n += len(chunk)
        pace.tick(len(chunk))
        if n > end - start:
            raise RangeIgnored(f"{url}: range body longer than {end - start} bytes", url, 206)
        if sink is not None:
            assert done is not None
            sink(done.at, chunk)
            done.at += len(chunk)
        else:
            out.append(chunk)
    if n < end - start:
        raise TransientFetchError(f"{url}: short range body: got {n} of {end - start} bytes "
                                  f"(range {start}-{end - 1})", url, 206)
    return b"".join(out)


def _fetch_s3_range(url: str, start: int, end: int, *, config: Any, budget: Any, on_event: Any = None,
                    done: Optional[_Done] = None) -> bytes:
    """:func:`fetch_range` for ``s3://``: a ranged GetObject through the s3 transport's
    client (its timeouts near the deadline, its error map), our retry policy and budget."""
    from .fetch import s3  # lazy: the s3 transport imports urllib3; local repairs never do

    bucket, key = s3.parse_s3_url(url)
    start0 = start

    def attempt() -> bytes:
        start = done.at if done is not None else start0
        pace = _Pace(url, config, budget, what=f"range {start}-{end - 1}")
        body = None
        try:
            client = s3.client_for(url, config, (pace.timeout(config.connect_timeout),
                                                 pace.timeout(config.read_timeout)))
            resp = client.get_object(Bucket=bucket, Key=key, Range=f"bytes={start}-{end - 1}")
            body = resp["Body"]
            status = int(resp["ResponseMetadata"]["HTTPStatusCode"])
            if status != 206:
                raise RangeIgnored(f"{url}: S3 answered a Range GetObject with HTTP {status}", url, status)
            _check_range(url, "ContentRange", resp.get("ContentRange"), start, end)
            return _range_body(url, iter(lambda: body.read(1 << 16), b""), start, end, pace, done)
        except (FetchError, CacheError):
            raise
        except Exception as exc:
            err = s3.translate_s3_error(exc, url)
            if getattr(err, "status", None) == 416:  # a whole GetObject may well serve it
                raise RangeIgnored(f"{err} (bytes {start}-{end - 1})", url, 416) from exc
            raise err from exc
        finally:
            if body is not None:
                body.close()

    return _retry_range(config, url, on_event, budget, attempt)


def _hash_file(path: str) -> str:
    h = xxhash.xxh3_64()
    with open(path, "rb") as f:
        for b in iter(lambda: f.read(1 << 20), b""):
            h.update(b)
    return h.hexdigest()


def repair_file(path: str, shard: Any, *, config: Any, budget: Any = None, session: Any = None,
                on_event: Any = None, max_fraction: float = MAX_FRACTION,
                before_fetch: Any = None) -> Optional[RangeRepair]:
    """Repair the local copy ``path`` of the remote ``shard`` in place, by range.

    Args:
        path: the corrupt copy (written in place: pass a private copy).
        shard: its :class:`~resumewds.manifest.ShardInfo`, with ``size``,
            ``xxh3_64``, ``offsets`` and ``sample_digests``.
        config: the :class:`~resumewds.fetch.FetchConfig`.
        budget: the :class:`~resumewds.fetch.FetchBudget` to draw from.
        session: a requests session.
        on_event: ``on_event(kind, url, **detail)``: ``range_repair`` per
            bad sample (index, key, start, end).
        max_fraction: repair by range only when at most this fraction of
            the shard fails.
        before_fetch: called once the ranges are known, before any is fetched.

    Returns:
        A :class:`RangeRepair` (``ok`` True when the file now passes), or
        None when the caller must fetch the whole shard instead.

    Raises:
        PermanentFetchError: the server refuses the shard (404...): a whole
            fetch would fail too.
    """

    if (shard.sample_digests is None or shard.offsets is None or shard.size is None
            or shard.xxh3_64 is None or not is_remote_url(shard.url)):
        return None
    budget = budget or FetchBudget(config)
    size = int(shard.size)
    offsets = [int(x) for x in shard.offsets]
    if offsets[-1] > size:
        return None
    try:
        with open(path, "r+b") as f:
            if os.fstat(f.fileno()).st_size != size:
                f.truncate(size)  # a truncated (or overlong) copy: its missing samples fail below
        bads = bad_samples(path, shard)
    except OSError:
        return None
    # bytes no sample digest covers: before the first sample, and the tar trailer
    uncovered = [(0, offsets[0]), (offsets[-1], size)]
    wanted = [(b.start, b.end) for b in bads] + uncovered
    if sum(b - a for a, b in wanted) > max_fraction * size:
        return None
    ranges = coalesce(wanted)
    result = RangeRepair(ok=False, samples=bads, ranges=ranges)
    if before_fetch is not None:
        before_fetch()
    for b in bads:
        if on_event is not None:
            on_event("range_repair", shard.url, sample=b.index, key=b.key, start=b.start, end=b.end)
    try:
        fd = os.open(path, os.O_RDWR)
    except OSError:
        return None
    try:
        for a, z in ranges:
            try:
                data = fetch_range(shard.url, a, z, config=config, budget=budget, session=session,
                                   on_event=on_event)
            except (FetchError, IntegrityError):
                # the server ignores Range, answers 416, resets..., or the shard's budget is
                # spent (its last error): the caller's whole-shard fetch reports what is wrong
                return None
            result.bytes_fetched += len(data)
            for bad in bads:  # each fetched sample must match its digest before use
                if a <= bad.start and bad.end <= z:
                    got = xxhash.xxh3_64_intdigest(memoryview(data)[bad.start - a:bad.end - a])
                    if got != int(shard.sample_digests[bad.index]):
                        return None  # the server holds other bytes than the manifest says
            os.pwrite(fd, data, a)
        os.fsync(fd)
    finally:
        os.close(fd)
    result.xxh3_64 = _hash_file(path)
    result.ok = result.xxh3_64 == shard.xxh3_64.lower()
    return result if result.ok else None


# ---- the hooks the ShardStore calls when it fills an entry -----------------------------

def _run(store: StoreAPI, shard: Any, path: str, budget: Any, download: bool) -> Optional[RangeRepair]:
    def before_fetch() -> None:
        # the journal's shard states: (downloaded ->) corrupt -> downloading -> verified
        if download:
            store.emit("verify_fail", shard.url, expected=shard.xxh3_64, actual="a corrupt download")
        store.emit("repair", shard.url, attempt=1, ranged=True)

    r = repair_file(path, shard, config=store.fetch, budget=budget, session=store.session(),
                    on_event=store.emit, before_fetch=before_fetch)
    if r is not None:
        store.emit("range_repair_done", shard.url, bytes=r.bytes_fetched, samples=len(r.samples),
                    ranges=len(r.ranges))
    return r


def repair_entry(store: StoreAPI, shard: Any, base: str, budget: Any) -> bool:
    """Repair the corrupt cache entry ``base`` by range (under its download lock).

    The entry is repaired in a private copy that replaces it atomically, so
    a reader holding the old file keeps reading the old inode.

    Returns:
        True if the entry is now verified (meta written); False: fetch it whole.
    """
    if shard.sample_digests is None or not shard.indexed:
        return False
    tmp = base + ".repair.tmp"  # ".tmp": not an entry to the cache's scan; a leftover is overwritten here
    try:
        shutil.copyfile(base, tmp)
        r = _run(store, shard, tmp, budget, download=False)
        if r is None:
            return False
        os.replace(tmp, base)
    except OSError:
        return False
    finally:
        try:
            os.unlink(tmp)
        except OSError:
            pass
    store.write_meta(base, shard.url, r.xxh3_64, synced=True)
    store.emit("verify_ok", shard.url)
    return True


def repair_download(store: StoreAPI, shard: Any, partial: str, budget: Any) -> Optional[str]:
    """Repair a finished download ``partial`` that failed its whole-shard check.

    Returns:
        The file's xxh3_64 once it passes, or None (fetch it whole again).
    """
    if shard.sample_digests is None or not shard.indexed:
        return None
    r = _run(store, shard, partial, budget, download=True)
    return r.xxh3_64 if r is not None else None


# ---- verified ranged reads of one run of samples (the loader reads through resumewds.reading.prepare) ----

def read_samples_by_range(shard: Any, first: int, last: int, *, config: Any, budget: Any = None,
                          session: Any = None, on_event: Any = None) -> List[Any]:
    """Fetch samples ``first..last`` (inclusive) of a remote shard with one Range
    request, verify each against its digest, and parse them.

    A sample is never returned before its bytes match its digest: a range
    whose samples fail is fetched once more (a corrupt response), then
    :class:`~resumewds.errors.ChecksumMismatch` names the sample.

    Args:
        shard: a remote :class:`~resumewds.manifest.ShardInfo` with offsets
            and sample digests.
        first, last: sample indices in the shard.
        config, budget, session, on_event: as :func:`fetch_range`.

    Returns:
        The parsed samples (``{"__key__": ..., ext: bytes}``), in order.

    Raises:
        ValueError: the shard has no digests or offsets, or bad indices.
        RangeIgnored: the server does not serve ranges (read the shard whole).
        ChecksumMismatch: a sample still fails its digest on the second fetch.

    Example:
        >>> [s["__key__"] for s in read_samples_by_range(shard, 10, 11, config=cfg)]  # doctest: +SKIP
        ['s0010', 's0011']
    """

    if shard.sample_digests is None or shard.offsets is None:
        raise ValueError(f"{shard.url}: no sample digests in the manifest: cannot verify a ranged read")
    if not 0 <= first <= last < int(shard.samples):
        raise ValueError(f"{shard.url}: samples {first}..{last} are not in 0..{int(shard.samples) - 1}")
    budget = budget or FetchBudget(config)
    lo, hi = int(shard.offsets[first]), int(shard.offsets[last + 1])
    bad: Optional[Tuple[int, int, int]] = None
    for _ in range(2):
        data = fetch_range(shard.url, lo, hi, config=config, budget=budget, session=session, on_event=on_event)
        mv = memoryview(data)
        bad = None
        for i in range(first, last + 1):
            a, b = int(shard.offsets[i]) - lo, int(shard.offsets[i + 1]) - lo
            got = xxhash.xxh3_64_intdigest(mv[a:b])
            if got != int(shard.sample_digests[i]):
                bad = (i, got, int(shard.sample_digests[i]))
                break
        if bad is None:
            return [tario.parse_sample(data, shard.url, base=int(shard.offsets[i]),  # digests checked above
                                       start=int(shard.offsets[i]) - lo, end=int(shard.offsets[i + 1]) - lo,
                                       verified=True)
                    for i in range(first, last + 1)]
        if on_event is not None:
            on_event("verify_fail", shard.url, sample=bad[0], expected=format(bad[2], "016x"),
                     actual=format(bad[1], "016x"))
    assert bad is not None
    a, b = shard.sample_range(bad[0])
    raise ChecksumMismatch(f"{shard.url} sample {bad[0]} (bytes {a}-{b}, ranged read)", format(bad[2], "016x"),
                           format(bad[1], "016x"))
