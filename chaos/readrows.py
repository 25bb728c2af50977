"""Rows of ``python -m chaos run`` for the read path under named fault profiles, over http and s3.

Every row runs ``resumewds cat <manifest url> --seed 2 --shuffle`` over 8
shards x 200 samples with a cold cache and the package's default settings
(no ``RESUMEWDS_*`` variable set: the retry policy, timeouts, ranged reads
and sparse downloads are what a user gets), against a
:class:`~chaos.faultserver.FaultServer` (``http: ...``) or moto's S3 server
behind an :class:`~chaos.s3proxy.S3FaultProxy` (``s3: ...``) injecting a named
profile of :data:`chaos.loopback.PROFILES` into every shard request: whole
downloads, download pieces and ranged reads alike (the manifest itself is
served clean).  It must print exactly what the same command prints over the
local files (:func:`profile_row`), in three modes:

``plain``    no DataLoader workers;
``workers``  ``--workers 2``;
``kill``     ``--workers 2 --journal``, killed with SIGKILL (the whole process
             group) once 400 of the 1,600 samples are committed, then run
             again until it ends: the committed output over the runs must
             equal the local output.

Each with two manifests: ``v3`` (``manifest.json``, per-sample digests:
ranged reads, sparse downloads in pieces) and ``v1`` (``manifest-v1.json``,
offsets without digests: the whole-shard download).

:func:`replaced_row`: one shard's object is replaced on the server (new
bytes of the same size, a new ETag) between the first and the second request
of it (the first is cut at half its body, so a second one is needed).  The
manifest's xxh3_64 (and, with v3, every sample's digest) make the old bytes
the only right ones, and the server no longer has them: the run must end
with a clear error (exit 1, ``Error: ...``, no traceback) naming the shard
and saying that the object changed on the server; what it printed before is
a correct prefix of the local output; a sample of the new bytes, or a mix of
the two versions, is never delivered.

Example:
    >>> [r.label for r in read_rows(True)][0]
    'http: mixed30 (v3)'
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import signal
import subprocess
import threading
import time
from typing import Any, Callable, Dict, Iterator, List, Optional

import resumewds as rw
from chaos.crash import PY, Dataset, child_env, committed_samples, compare, make_dataset, run
from chaos.faultserver import FaultServer, tar_layout
from chaos.harness import Row, Scenario, Suite, labelled, last_line, strict_error, tar_paths
from chaos.loopback import PROFILES
from chaos.s3proxy import S3FaultProxy
from chaos.s3rows import S3_CREDS, s3_bucket, s3_client, s3_endpoint, s3_ready

__all__ = ["CHANGED_WORDS", "FULL_RUNS", "KILL_AT", "MANIFESTS", "MODES", "READ_BOUND", "ROW_PROFILES", "ReadData",
           "changed_bytes", "kill_when_committed", "profile_row", "read_cmd", "read_data", "read_env", "read_rows",
           "replaced_row", "says_changed", "served"]

#: the data set: shards x samples (2-20 kB samples: about 2.8 MB a shard)
SHARDS, SAMPLES = 8, 200
#: the manifests served beside the shards: per-sample digests (v3) and none (v1)
MANIFESTS = {"v3": "manifest.json", "v1": "manifest-v1.json"}
#: the three ways each profile is run (see the module docstring)
MODES = {"plain": "", "workers": ", 2 workers", "kill": ", kill -9 + resume"}
#: ``kill`` mode: SIGKILL once this many samples are committed (of 1,600)
KILL_AT = 400
#: seconds a run may take before it counts as hung (a bound on hangs, not a speed target)
READ_BOUND = 180.0
#: a replaced object's error says one of these (case-insensitive)
CHANGED_WORDS = ("changed", "replaced", "modified", "etag")
#: the shard whose object is replaced on the server
VICTIM = "shard-000003.tar"


@dataclasses.dataclass
class ReadData:
    """The rows' data set, its two manifests and the local output.

    Attributes:
        data: the shards (``data.root``), ``data.manifest`` (v3) and every sample's digest.
        ref: what ``resumewds cat <local manifest> --seed 2 --shuffle`` prints (the
            same with both manifests).
    """

    data: Dataset
    ref: List[str]

    @property
    def root(self) -> str:
        return self.data.root

    @property
    def nbytes(self) -> int:
        """The bytes of the shards."""
        return sum(os.path.getsize(p) for p in tar_paths(self.root))


def read_cmd(source: str, cache_dir: str, workers: int = 0, journal: Optional[str] = None) -> List[str]:
    """``resumewds cat SOURCE --seed 2 --shuffle`` with a cache (and workers, a journal)."""
    cmd = [PY, "-m", "resumewds", "cat", source, "--seed", "2", "--shuffle", "--cache-dir", cache_dir]
    if workers:
        cmd += ["--workers", str(workers)]
    if journal:
        cmd += ["--journal", journal, "--commit-every", "50"]
    return cmd


def read_env(**extra: str) -> Dict[str, str]:
    """:func:`chaos.crash.child_env` without any ``RESUMEWDS_*`` variable: the package's defaults."""
    env = {k: v for k, v in child_env().items() if not k.startswith("RESUMEWDS_")}
    env.update(extra)
    return env


def read_data(s: Suite) -> ReadData:
    """The rows' data set, made once per suite (8 x 200 samples, both manifests, the local output)."""
    def make() -> ReadData:
        data = make_dataset(os.path.join(s.work, "readdata"), shards=SHARDS, samples=SAMPLES, seed=s.seed + 3)
        paths = tar_paths(data.root)
        rw.build_manifest(paths, os.path.join(data.root, MANIFESTS["v1"]), digests=False)
        rw.build_manifest(paths, os.path.join(data.root, MANIFESTS["v3"]), digests=True)
        outs = {}
        for version, name in MANIFESTS.items():
            p = run(read_cmd(os.path.join(data.root, name), os.path.join(s.work, "readdata-cache")),
                    env=read_env(), bound=READ_BOUND)
            if p.rc != 0 or len(p.lines) != SHARDS * SAMPLES:
                raise RuntimeError(f"local reference run ({version}) failed: exit {p.rc}: {p.err[-2000:]}")
            outs[version] = p.lines
        if outs["v1"] != outs["v3"]:
            raise RuntimeError("the local outputs with the v1 and v3 manifests differ")
        return ReadData(data, outs["v3"])
    return s.shared("readrows", make)


class _Served:
    """What a row needs of its server: the manifest's url, the environment, the counters."""

    def __init__(self, url: Callable[[str], str], env: Dict[str, str], server: Any):
        self.url = url
        self.env = env
        self.server = server

    @property
    def faults(self) -> int:
        return sum(self.server.faults.values())

    def shard_bytes(self) -> int:
        """The bytes of ``.tar`` objects the server sent (2xx bodies)."""
        return sum(n for p, n in self.server.bytes_by_path.items() if p.endswith(".tar"))


@contextlib.contextmanager
def served(s: Suite, transport: str, root: str, profile: Optional[str], bucket: Optional[str] = None,
           seed: int = 0) -> Iterator[_Served]:
    """The files of ``root`` over ``transport`` (``"http"``, or ``"s3"``: in ``bucket``
    under ``data/``), shard requests hit by ``profile``; the manifests are served clean."""
    if transport == "http":
        srv = FaultServer(root, profile=profile, seed=seed).start()
        for name in MANIFESTS.values():
            srv.script("/" + name, [None] * 100000)
        try:
            yield _Served(lambda name: srv.url + name, {}, srv)
        finally:
            srv.stop()
        return
    endpoint = s3_endpoint()
    px = S3FaultProxy(endpoint, profile=profile, seed=seed).start()
    for name in MANIFESTS.values():
        px.script(f"/{bucket}/data/{name}", [None] * 100000)
    try:
        yield _Served(lambda name: f"s3://{bucket}/data/{name}", dict(AWS_ENDPOINT_URL=px.url, **S3_CREDS), px)
    finally:
        px.stop()


def _shared_bucket(s: Suite, rd: ReadData) -> str:
    """One bucket with the rows' data set, for every s3 row that does not change it."""
    return s.shared("readrows-bucket", lambda: s3_bucket(s, s3_endpoint(), "read", root=rd.root))


def kill_when_committed(journal: str, n: int, hit: List[int]) -> Callable[[subprocess.Popen], None]:
    """An ``on_start`` for :func:`chaos.crash.run`: SIGKILL the run's process group
    once its journal has ``n`` samples committed; the pid goes to ``hit``."""
    def on_start(p: subprocess.Popen) -> None:
        def watch() -> None:
            while p.poll() is None:
                try:
                    done = committed_samples(journal) if os.path.exists(journal) else 0
                except Exception:  # a journal being created: look again
                    done = 0
                if done >= n:
                    try:
                        os.killpg(p.pid, signal.SIGKILL)
                        hit.append(p.pid)
                    except ProcessLookupError:
                        pass
                    return
                time.sleep(0.02)
        threading.Thread(target=watch, daemon=True).start()
    return on_start


def _kill_and_resume(row: Row, rd: ReadData, src: str, d: str, env: Dict[str, str]) -> None:
    journal = os.path.join(d, "run.db")
    cmd = read_cmd(src, os.path.join(d, "cache"), workers=2, journal=journal)
    kept: List[str] = []
    killed = False
    for _ in range(4):  # the first run is killed; the next must finish
        before = committed_samples(journal) if os.path.exists(journal) else 0
        hit: List[int] = []
        p = run(cmd, env=env, bound=READ_BOUND, on_start=None if killed else kill_when_committed(journal, KILL_AT, hit))
        row.runs += 1
        after = committed_samples(journal) if os.path.exists(journal) else 0
        kept.extend(p.lines[:max(0, after - before)])
        if p.hung:
            row.hung += 1
            row.bad_exits.append(f"hung > {READ_BOUND:.0f}s")
            break
        if hit:
            killed = True
            row.faults += 1
            continue
        if p.rc != 0:
            row.bad_exits.append(f"exit {p.rc}{' (before the kill)' if not killed else ''}: {last_line(p.err)}")
        elif not killed:
            row.bad_exits.append(f"the run ended before {KILL_AT} samples were committed: not killed mid-epoch")
        break
    row.tally.add(compare(rd.ref, kept, rd.data.digests))


def profile_row(transport: str, profile: str, version: str, mode: str, runs: int = 1) -> Scenario:
    """``cat`` over ``transport`` with ``profile`` on every shard request, manifest
    ``version``, in ``mode`` (see the module docstring): exactly the local output;
    ``runs`` times, the server seeded ``seed``, ``seed + 1``, ... (another fault
    sequence each time)."""
    label = f"{transport}: {profile} ({version}{MODES[mode]})"

    def scenario(s: Suite) -> Row:
        row = Row(label, "resume" if mode == "kill" else "exact")
        if transport == "s3" and not s3_ready(row):
            return row
        rd = read_data(s)
        bucket = _shared_bucket(s, rd) if transport == "s3" else None
        sent: List[str] = []
        i = 0
        # a seed whose run met no fault tested nothing (a few requests can all be lucky):
        # the row goes on with the next seeds, up to three more, until one does
        while i < runs or (row.faults == 0 and i < runs + 3):
            i += 1
            with served(s, transport, rd.root, profile, bucket, seed=s.seed + i - 1) as srv:
                d = s.tmp("read")
                src = srv.url(MANIFESTS[version])
                env = read_env(**srv.env)
                if mode == "kill":
                    _kill_and_resume(row, rd, src, d, env)
                else:
                    p = run(read_cmd(src, os.path.join(d, "cache"), workers=2 if mode == "workers" else 0),
                            env=env, bound=READ_BOUND)
                    s.judge(row, p, data=rd.data, ref=rd.ref)
                row.faults += srv.faults
                sent.append(f"{srv.shard_bytes() / rd.nbytes:.2f}x")
        row.note = f"{PROFILES[profile].doc}; the shards' bytes sent: {', '.join(sent)} ({len(sent)} seeds)"
        return row

    return labelled(label, scenario)


def changed_bytes(path: str) -> bytes:
    """The tar at ``path`` as another version of it: the same size and members,
    the first byte of every member's data flipped."""
    with open(path, "rb") as f:
        data = bytearray(f.read())
    for a, _ in tar_layout(bytes(data)).data:
        data[a] ^= 0xFF
    return bytes(data)


def _replace_file(path: str, data: bytes) -> None:
    """Replace ``path`` by a new file holding ``data`` (a new inode, mtime and ETag)."""
    old = os.stat(path)
    tmp = path + ".new"
    with open(tmp, "wb") as f:
        f.write(data)
    os.utime(tmp, ns=(old.st_atime_ns, old.st_mtime_ns + 1_000_000_000))
    os.replace(tmp, path)


def says_changed(message: str) -> bool:
    """Whether ``message`` says (outside its urls and paths) that an object changed.

    Example:
        >>> says_changed("Error: s3://b-replaced/a.tar: xxh3_64 mismatch"), says_changed("a.tar changed on the server")
        (False, True)
    """
    words = " ".join(w for w in message.lower().split() if "://" not in w and "/" not in w)
    return any(w in words for w in CHANGED_WORDS)


def replaced_row(transport: str, version: str, workers: int) -> Scenario:
    """One shard's object replaced on the server between two requests of it: a clear
    error naming the shard and the change, never a sample of the new bytes."""
    label = (f"{transport}: shard replaced on the server between two requests "
             f"({version}{', 2 workers' if workers else ''})")

    def scenario(s: Suite) -> Row:
        row = Row(label, "error")
        if transport == "s3" and not s3_ready(row):
            return row
        rd = read_data(s)
        d = s.tmp("replaced")
        v2 = changed_bytes(os.path.join(rd.root, VICTIM))
        bucket = None
        if transport == "http":
            root = os.path.join(d, "srv")
            shutil.copytree(rd.root, root)
            path = "/" + VICTIM

            def replace() -> None:
                _replace_file(os.path.join(root, VICTIM), v2)
        else:
            root = rd.root
            endpoint = s3_endpoint()
            bucket = s3_bucket(s, endpoint, "swap", root=rd.root)
            path = f"/{bucket}/data/{VICTIM}"

            def replace() -> None:
                s3_client(endpoint).put_object(Bucket=bucket, Key="data/" + VICTIM, Body=v2)
        try:
            with served(s, transport, root, None, bucket, seed=s.seed) as srv:
                srv.server.script(path, ["truncate@0.5"])  # the first request ends at half its body...
                srv.server.at_request(path, 1, replace)  # ... and the second finds the new version
                p = run(read_cmd(srv.url(MANIFESTS[version]), os.path.join(d, "cache"), workers=workers),
                        env=read_env(**srv.env), bound=READ_BOUND)
                s.judge(row, p, data=rd.data, ref=rd.ref)
                row.faults += 1
                if srv.server.requests.get(path, 0) < 2:
                    row.bad_exits.append(f"{VICTIM} was asked for {srv.server.requests.get(path, 0)} time(s): "
                                         "never replaced between two requests")
                if p.rc and p.rc > 0 and not (strict_error(p, VICTIM) and says_changed(last_line(p.err))):
                    row.bad_exits.append(f"the error does not name {VICTIM} and say that it changed on the server: "
                                         f"{last_line(p.err)}")
        finally:
            if bucket is not None:
                c = s3_client(s3_endpoint())
                for key in c.list_objects_v2(Bucket=bucket).get("Contents", []):
                    c.delete_object(Bucket=bucket, Key=key["Key"])
                c.delete_bucket(Bucket=bucket)
        return row

    return labelled(label, scenario)


#: the profiles every transport, manifest and mode runs under
ROW_PROFILES = ("mixed30", "flip40", "cut50", "firsttry", "flipheader40", "flipdata40")


#: server seeds per row in the full matrix (a profile's faults land elsewhere with each)
FULL_RUNS = {"plain": 3, "workers": 1, "kill": 1}


def read_rows(quick: bool) -> List[Scenario]:
    """The rows in matrix order: the quick matrix runs the three main profiles over
    http with a v3 manifest, one over s3, and the replaced object; the full one every
    profile, transport, manifest and mode (plain: three server seeds)."""
    if quick:
        return [*(profile_row("http", p, "v3", "plain") for p in ("mixed30", "flip40", "cut50")),
                profile_row("s3", "mixed30", "v3", "plain"),
                replaced_row("http", "v3", 0)]
    rows: List[Scenario] = []
    for transport in ("http", "s3"):
        for version in MANIFESTS:
            for prof in ROW_PROFILES:
                rows += [profile_row(transport, prof, version, mode, FULL_RUNS[mode]) for mode in MODES]
            rows += [replaced_row(transport, version, w) for w in (0, 2)]
    return rows
