"""Fuzz the tar reader with malformed shards (hypothesis).

Each case starts from a valid WebDataset shard (ustar, GNU long names or
pax, chosen by hypothesis) and applies a few mutations: flipped bytes,
truncation, inserted or deleted bytes, header fields rewritten (size, type
flag, checksum, name), blocks duplicated or zeroed.  A second family
(:func:`size_attack_shards`) targets the sizes the framer advances by: after
the last sample, between samples or in place of one, it plants entries
whose size comes from a pax ``size`` record (``0``, negative, huge, not a
number) and/or a header size field in GNU base-256 (negative, huge) or in
octal that Python's ``int`` would take but tar does not (``-1``, ``1_0``),
all with valid checksums so the size is parsed (a pax ``size=0``
then a negative base-256 size after the last sample looped forever in
``index`` and ``cat``).  The result goes through
every entry point of :mod:`resumewds.tar` (``scan_buffer``,
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
    >>> t = crafted_size_tar()          # the issue-12 shard: must end, and read like tarfile
    >>> [k for k in (s["__key__"] for s in tario.iter_samples_bytes(t, "c.tar"))]
    ['s0000', 's0001', 's0002']
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

from hypothesis import HealthCheck, given, settings
from hypothesis import seed as hseed
from hypothesis import strategies as st

from resumewds.errors import ShardFormatError
from resumewds.tar import _io as tario


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


def base256(v: int, width: int = 12) -> bytes:
    """A GNU base-256 numeric field (0x80 marks positive, 0xff negative)."""
    if v >= 0:
        return b"\x80" + v.to_bytes(width - 1, "big")
    return b"\xff" + (v + (1 << (8 * (width - 1)))).to_bytes(width - 1, "big")


def raw_header(name: bytes, size_field: bytes, typeflag: bytes = b"0") -> bytes:
    """One ustar header block with any raw size field and a valid checksum."""
    b = bytearray(512)
    b[0:len(name[:100])] = name[:100]
    b[100:108] = b"0000644\0"
    b[108:116] = b"0000000\0"
    b[116:124] = b"0000000\0"
    b[124:136] = size_field[:12].ljust(12, b"\0")
    b[136:148] = b"14644000000\0"
    b[156:157] = typeflag
    b[257:263] = b"ustar\0"
    b[263:265] = b"00"
    b[148:156] = b" " * 8
    b[148:156] = f"{sum(b):06o}\0 ".encode()
    return bytes(b)


def pax_block(records: Sequence[Tuple[str, str]]) -> bytes:
    """A pax extended header (typeflag ``x``) holding ``records``, padded."""
    body = b""
    for k, v in records:
        rec = f" {k}={v}\n".encode()
        n = len(rec) + 1
        while len(str(n)) + len(rec) != n:
            n = len(str(n)) + len(rec)
        body += str(n).encode() + rec
    return raw_header(b"././@PaxHeader", _octal(len(body), 12), b"x") + body + bytes(-len(body) % 512)


def crafted_size_tar(samples: int = 3, pax_size: Optional[str] = "0",
                     size_field: Optional[bytes] = None, typeflag: bytes = b"5",
                     where: str = "after") -> bytes:
    """A valid shard plus one entry whose size is an attack.

    The default is this shard: after the last sample, a pax
    header ``size=0`` and then a directory entry whose header size is -1 in
    GNU base-256 (the pax record wins: tarfile reads it as 3 samples).

    Args:
        samples: samples in the base shard.
        pax_size: the pax ``size`` record, or None for no pax header.
        size_field: the entry's raw 12-byte size field (default base-256 -1).
        typeflag: the entry's type (``5`` directory, ``0`` regular...).
        where: ``"after"`` the last sample, ``"between"`` samples 0 and 1,
            or ``"first"``.
    """
    base = base_shard(samples, tarfile.USTAR_FORMAT, False, 0)
    # the members' end: strip the end-of-archive zeros, keep block alignment
    body = base.rstrip(b"\0")
    body += bytes(-len(body) % 512)
    ents = []
    if pax_size is not None:
        ents.append(pax_block([("size", pax_size)]))
    ents.append(raw_header(b"zz-crafted" if typeflag == b"5" else b"zz-crafted.bin",
                           base256(-1) if size_field is None else size_field, typeflag))
    entry = b"".join(ents)
    if where == "after" or samples == 0:
        out = body + entry
    else:
        heads = [h for h in range(0, len(body), 512) if body[h + 257:h + 263] == b"ustar\0"
                 and body[h + 156:h + 157] in (b"0", b"\0")]
        cut = 0 if where == "first" else heads[min(2, len(heads) - 1)]  # 2 members per sample
        out = body[:cut] + entry + body[cut:]
    return out + bytes(1024)


_SIZE_VALUES = ["0", "-1", "-512", "7", "1_0", " 5", "+3", "x", "", "99999999999999999999", str(2 ** 63),
                "0x10"]


@st.composite
def size_attack_shards(draw: Any) -> bytes:
    """Valid shards with one entry whose size (pax and/or header field) is hostile."""
    pax = draw(st.one_of(st.none(), st.sampled_from(_SIZE_VALUES),
                         st.integers(-(2 ** 70), 2 ** 70).map(str)))
    field = draw(st.one_of(
        st.integers(-(2 ** 87), 2 ** 87 - 1).map(base256),
        st.sampled_from([b"-1", b"-0000001\0", b"1_0", b"+17", b" 1 2", b"\xc0" + bytes(11),
                         b"\xbf" * 12, b"77777777777\0", b"00000001000\0"]),
        st.integers(0, 8 ** 11 - 1).map(lambda v: _octal(v, 12))))
    return crafted_size_tar(samples=draw(st.integers(0, 3)), pax_size=pax, size_field=field,
                            typeflag=draw(st.sampled_from([b"5", b"0", b"2", b"g"])),
                            where=draw(st.sampled_from(["after", "between", "first"])))


def fuzz_inputs() -> Any:
    """Every shard family the fuzzer draws from."""
    return st.one_of(mutated_shards(), size_attack_shards())


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


def _check_index(offsets: Sequence[int], keys: Sequence[str], n: int) -> None:
    """An index the framer returns must be usable: monotonic, inside the data."""
    if len(offsets) != len(keys) + 1:
        raise AssertionError(f"{len(offsets)} offsets for {len(keys)} samples")
    if any(b < a for a, b in zip(offsets, offsets[1:])) or offsets[0] < 0 or offsets[-1] > n:
        raise AssertionError(f"offsets not monotonic inside [0, {n}]: {list(offsets)[:8]}...")


def check_case(data: bytes, tmpdir: str) -> str:
    """Feed one shard to every reader; return "data" or "format" (raise anything else)."""
    name = "fuzz.tar"
    outcome = "data"
    try:
        offsets, keys, end = tario.scan_buffer(data, name)
        _check_index(offsets, keys, len(data))
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
    @given(fuzz_inputs())
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
