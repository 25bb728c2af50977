"""Fuzz the tar reader with malformed shards (hypothesis).

Each case starts from a valid WebDataset shard (ustar, GNU long names or
pax, chosen by hypothesis) and applies a few mutations: flipped bytes,
truncation, inserted or deleted bytes, header fields rewritten (size, type
flag, checksum, name), blocks duplicated or zeroed.  The result goes through
every entry point of :mod:`resumewds.tario` (``scan_buffer``,
``iter_samples_bytes``, ``scan_file`` and, when the scan succeeds,
``read_sample`` of every indexed sample).  Every case must end in data or a
:class:`~resumewds.errors.ShardFormatError` within ``bound`` seconds; any
other exception, or a slower case, is a failure with its reproducing bytes
kept in ``FuzzResult.failures``.

Run::

    python -m chaos.fuzz --cases 2000 --seed 1

Example:
    >>> r = fuzz_tar_reader(cases=20, seed=0)
    >>> r.cases, r.failures
    (20, [])
"""

from __future__ import annotations

import argparse
import dataclasses
import io
import os
import signal
import sys
import tarfile
import tempfile
import time
from typing import Any, List, Optional, Sequence, Tuple

from hypothesis import HealthCheck, given, seed as hseed, settings, strategies as st

from resumewds import tario
from resumewds.errors import ShardFormatError


@dataclasses.dataclass
class FuzzResult:
    cases: int = 0
    data: int = 0           # cases that parsed (possibly different) data
    format_errors: int = 0  # cases that raised ShardFormatError
    failures: List[Tuple[str, bytes]] = dataclasses.field(default_factory=list)
    slowest: float = 0.0
    seconds: float = 0.0


class _Timeout(Exception):
    pass


def _alarm(signum: int, frame: Any) -> None:
    raise _Timeout()


def base_shard(samples: int, fmt: int, long_names: bool, payload: int) -> bytes:
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=fmt) as tf:
        for i in range(samples):
            key = ("d" * 120 + "/" if long_names else "") + f"s{i:04d}"
            for ext, data in (("txt", f"sample {i}".encode() * (1 + payload // 10)), ("cls", str(i % 10).encode())):
                ti = tarfile.TarInfo(f"{key}.{ext}")
                ti.size = len(data)
                ti.mtime = 1_700_000_000
                tf.addfile(ti, io.BytesIO(data))
    return buf.getvalue()


_FIELDS = {"name": (0, 100), "mode": (100, 8), "size": (124, 12), "chksum": (148, 8), "type": (156, 1),
           "magic": (257, 6), "prefix": (345, 155)}


def _octal(v: int, width: int) -> bytes:
    digits = format(v, "o").rjust(max(1, width - 1), "0")[: max(1, width - 1)]
    return digits.encode().ljust(width, b"\0")


@st.composite
def mutated_shards(draw: Any) -> bytes:
    fmt = draw(st.sampled_from([tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT]))
    data = bytearray(base_shard(draw(st.integers(0, 4)), fmt, draw(st.booleans()), draw(st.integers(0, 1500))))
    for _ in range(draw(st.integers(1, 4))):
        op = draw(st.sampled_from(["flip", "truncate", "insert", "delete", "field", "dup", "zero"]))
        n = len(data)
        if n == 0:
            break
        if op == "flip":
            i = draw(st.integers(0, n - 1))
            data[i] ^= draw(st.integers(1, 255))
        elif op == "truncate":
            del data[draw(st.integers(0, n - 1)):]
        elif op == "insert":
            i = draw(st.integers(0, n))
            data[i:i] = draw(st.binary(min_size=1, max_size=600))
        elif op == "delete":
            i = draw(st.integers(0, n - 1))
            del data[i:i + draw(st.integers(1, 600))]
        elif op in ("field", "dup", "zero"):
            blocks = n // 512
            if blocks == 0:
                continue
            b = draw(st.integers(0, blocks - 1)) * 512
            if op == "field":
                off, width = _FIELDS[draw(st.sampled_from(sorted(_FIELDS)))]
                val = draw(st.one_of(st.binary(min_size=width, max_size=width),
                                     st.integers(0, 8 ** 11 - 1).map(lambda v, w=width: _octal(v, w))))
                data[b + off:b + off + width] = val[:width]
                if draw(st.booleans()):  # keep the checksum valid so the bad field gets parsed
                    blk = bytes(data[b:b + 512])
                    blk = blk[:148] + b" " * 8 + blk[156:]
                    data[b + 148:b + 156] = f"{sum(blk):06o}\0 ".encode()
            elif op == "dup":
                data[b:b] = data[b:b + 512]
            else:
                data[b:b + 512] = bytes(512)
    return bytes(data)


def check_case(data: bytes, tmpdir: str) -> str:
    """Feed one shard to every reader; return "data" or "format" (raise anything else)."""
    name = "fuzz.tar"
    outcome = "data"
    try:
        offsets, keys, end = tario.scan_buffer(data, name)
    except ShardFormatError:
        outcome = "format"
        offsets = None
    try:
        list(tario.iter_samples_bytes(data, name))
    except ShardFormatError:
        outcome = "format"
    path = os.path.join(tmpdir, name)
    with open(path, "wb") as f:
        f.write(data)
    try:
        idx = tario.scan_file(path, name)
        offsets = list(idx.offsets)
    except ShardFormatError:
        outcome = "format"
    if offsets:
        fd = os.open(path, os.O_RDONLY)
        try:
            for j in range(len(offsets) - 1):
                try:
                    tario.read_sample(fd, int(offsets[j]), int(offsets[j + 1]), name)
                except ShardFormatError:
                    outcome = "format"
        finally:
            os.close(fd)
    return outcome


def fuzz_tar_reader(cases: int = 500, seed: int = 0, bound: float = 2.0) -> FuzzResult:
    """Run ``cases`` hypothesis-generated malformed shards through the tar reader."""
    res = FuzzResult()
    tmpdir = tempfile.mkdtemp(prefix="resumewds-fuzz-")
    t_start = time.monotonic()
    use_alarm = hasattr(signal, "setitimer") and _main_thread()
    old = signal.signal(signal.SIGALRM, _alarm) if use_alarm else None

    @hseed(seed)
    @settings(max_examples=cases, database=None, deadline=None, derandomize=False,
              suppress_health_check=list(HealthCheck), )
    @given(mutated_shards())
    def one(data: bytes) -> None:
        res.cases += 1
        t0 = time.monotonic()
        try:
            if use_alarm:
                signal.setitimer(signal.ITIMER_REAL, bound)
            kind = check_case(data, tmpdir)
            if kind == "data":
                res.data += 1
            else:
                res.format_errors += 1
        except _Timeout:
            res.failures.append((f"no result within {bound}s", data))
        except Exception as exc:  # the point: anything but ShardFormatError is a bug
            res.failures.append((f"{type(exc).__name__}: {exc}", data))
        finally:
            if use_alarm:
                signal.setitimer(signal.ITIMER_REAL, 0)
        dt = time.monotonic() - t0
        res.slowest = max(res.slowest, dt)
        if dt > bound and not any(m.startswith("no result") for m, d in res.failures if d is data):
            res.failures.append((f"took {dt:.2f}s > {bound}s", data))

    try:
        one()
    finally:
        if use_alarm:
            signal.signal(signal.SIGALRM, old)
        import shutil

        shutil.rmtree(tmpdir, ignore_errors=True)
    res.seconds = time.monotonic() - t_start
    return res


def _main_thread() -> bool:
    import threading

    return threading.current_thread() is threading.main_thread()


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m chaos.fuzz", description=__doc__.split("\n\n")[0])
    p.add_argument("--cases", type=int, default=1000)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--bound", type=float, default=2.0, help="Seconds allowed per case.")
    a = p.parse_args(argv)
    r = fuzz_tar_reader(a.cases, a.seed, a.bound)
    print(f"{r.cases} cases in {r.seconds:.1f}s: {r.data} parsed, {r.format_errors} ShardFormatError, "
          f"{len(r.failures)} failures; slowest {r.slowest * 1000:.0f} ms")
    for msg, data in r.failures[:10]:
        print(f"  FAIL {msg} ({len(data)} bytes: {data[:64]!r}...)")
    return 1 if r.failures else 0


if __name__ == "__main__":
    sys.exit(main())
