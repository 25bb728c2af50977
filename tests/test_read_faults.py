"""The read path on a bad network, and the cases around it that must never lose data in silence.

Everything runs against real servers on 127.0.0.1 (:class:`chaos.faultserver.FaultServer`,
moto's S3 server behind :class:`chaos.s3proxy.S3FaultProxy`, a TLS server with a
certificate nobody trusts, a server that accepts connections and never answers),
real ``resumewds cat`` processes with the package's default settings (no
``RESUMEWDS_*`` variable: what a user gets), real DataLoader workers, real SIGKILL.

* The chaos rows of :mod:`chaos.readrows`: ``cat --seed 2 --shuffle`` over 8 x 200
  samples under a named fault profile prints exactly what it prints over the local
  files (also with 2 workers, and killed mid-epoch then resumed); a shard replaced on
  the server between two requests ends the run with an error that names it.
* A manifest that lists the first 100 of a shard's 200 samples is refused, naming the
  shard and the manifest, whatever path reads it (also one found beside shards named
  one by one); an error caused by a manifest found beside the shards names it.
* A full cache disk during a sparse fill falls back and stays exact.
* No presigned signature anywhere in what an uncaught fetch error prints.
* A fork by the user's code after a data set was built over a silent server returns at
  once, and the child's garbage collector is not frozen.
* A TLS verification failure is not retried.
* A cold epoch asks the server for at most 1.02x the data set's bytes, with 0, 2 and 3
  workers and over three kills.

The default run has one case of each rule; ``-m slow`` runs the rest.  By hand:
``python -m chaos run --only "http: mixed30"`` (see chaos/readrows.py).
"""

from __future__ import annotations

import datetime
import ipaddress
import json
import os
import shutil
import socket
import ssl
import subprocess
import sys
import textwrap
import threading
from typing import Dict, List, Optional

import pytest

import resumewds as rw
from chaos import diskfaults
from chaos.crash import Dataset, Proc, committed_samples, make_dataset, run
from chaos.faultserver import FaultServer
from chaos.harness import Row, Suite, last_line, strict_error, tar_paths
from chaos.readrows import (
    FULL_RUNS,
    MANIFESTS,
    MODES,
    ROW_PROFILES,
    kill_when_committed,
    profile_row,
    read_cmd,
    read_env,
    replaced_row,
)
from chaos.run import format_table
from http_fixtures import tar_bytes_sent

BOUND = 120.0  # seconds one run may take before it counts as hung (not a speed target)
HALF = 100  # samples a "half" manifest lists of a shard's 200
SHORT_SHARD = 2  # ... of this shard


# ---------------------------------------------------------------------------
# data
# ---------------------------------------------------------------------------
class Small:
    """8 shards x 200 samples of 0.5-3 kB (each shard under 1 MB), a v3 and a v1
    manifest, and what ``cat --seed 2 --shuffle`` prints over the local files."""

    def __init__(self, root: str):
        self.data: Dataset = make_dataset(root, shards=8, samples=200, size_range=(500, 3000), seed=5)
        self.root = root
        paths = tar_paths(root)
        rw.build_manifest(paths, os.path.join(root, MANIFESTS["v1"]), digests=False)
        rw.build_manifest(paths, os.path.join(root, MANIFESTS["v3"]), digests=True)
        p = run(read_cmd(os.path.join(root, MANIFESTS["v3"]), os.path.join(root, "..", "ref-cache")),
                env=read_env(), bound=BOUND)
        assert p.rc == 0 and len(p.lines) == 1600, p.err[-2000:]
        self.ref: List[str] = p.lines
        self.nbytes = sum(os.path.getsize(q) for q in paths)

    def shard_names(self) -> List[str]:
        return [os.path.basename(q) for q in tar_paths(self.root)]

    def copy(self, dest: str, manifests: bool = True) -> str:
        """The shards (and the manifests) in ``dest``."""
        os.makedirs(dest)
        for name in os.listdir(self.root):
            if name.endswith(".tar") or (manifests and name in MANIFESTS.values()):
                shutil.copy(os.path.join(self.root, name), dest)
        return dest


@pytest.fixture(scope="module")
def small(tmp_path_factory) -> Small:
    return Small(str(tmp_path_factory.mktemp("small") / "data"))


@pytest.fixture(scope="module")
def suite(tmp_path_factory) -> Suite:
    return Suite(str(tmp_path_factory.mktemp("readrows")), seed=0, quick=False)


def _cat(src: str, cache: str, workers: int = 0, env: Optional[Dict[str, str]] = None, **kw) -> Proc:
    return run(read_cmd(src, cache, workers=workers), env=env or read_env(), bound=BOUND, **kw)


def format_row(row: Row) -> str:
    return format_table([row])


def _exact(p: Proc, ref: List[str]) -> None:
    assert not p.hung, "hung"
    assert p.rc == 0, f"exit {p.rc}: {last_line(p.err)}"
    differ = sum(a != b for a, b in zip(p.lines, ref))
    assert p.lines == ref, f"{len(p.lines)} lines, {differ} differ from the local run"


def _half_listed(src: str, dst: str, shard: int = SHORT_SHARD, keep: int = HALF) -> None:
    """``src`` with shard ``shard`` listing its first ``keep`` samples only (its size and
    xxh3_64 and those samples' offsets and digests right)."""
    with open(src) as f:
        m = json.load(f)
    s = m["shards"][shard]
    s["samples"] = keep
    s["offsets"] = s["offsets"][:keep + 1]
    if "sample_xxh3_64" in s:
        s["sample_xxh3_64"] = s["sample_xxh3_64"][:16 * keep]
    with open(dst, "w") as f:
        json.dump(m, f)


# ---------------------------------------------------------------------------
# the chaos rows: named profiles over http and s3
# ---------------------------------------------------------------------------
def _row_params():
    out = []
    for transport in ("http", "s3"):
        for version in MANIFESTS:
            for prof in ROW_PROFILES:
                for mode in MODES:
                    key = (transport, prof, version, mode)
                    if key == ("http", "mixed30", "v3", "plain"):  # the default run's case: one seed
                        out.append(pytest.param(*key, 1, id="-".join(key)))
                    else:
                        out.append(pytest.param(*key, FULL_RUNS[mode], id="-".join(key), marks=pytest.mark.slow))
    return out


@pytest.mark.timeout(1500)  # a bound on hangs: up to 3 runs (or 4 with kills) of READ_BOUND each
@pytest.mark.parametrize("transport,profile,version,mode,runs", _row_params())
def test_a_fault_profile_changes_nothing_in_the_output(suite, transport, profile, version, mode, runs):
    """``cat --seed 2 --shuffle`` under the profile prints exactly the local output
    (mode ``kill``: the committed output over a SIGKILL and the rerun), with each of
    ``runs`` server seeds."""
    row = profile_row(transport, profile, version, mode, runs)(suite)
    if row.verdict == "SKIP":
        pytest.skip(row.skip)
    assert row.verdict == "PASS", format_row(row)
    assert row.faults > 0


@pytest.mark.parametrize("transport,version,workers", [
    ("http", "v3", 0),
    *(pytest.param(t, v, w, marks=pytest.mark.slow) for t in ("http", "s3") for v in MANIFESTS for w in (0, 2)
      if (t, v, w) != ("http", "v3", 0)),
])
def test_a_shard_replaced_on_the_server_ends_the_run_naming_it(suite, transport, version, workers):
    """The manifest's checksums make the old bytes the only right ones and the server
    lost them: an error that names the shard and says it changed; never its new bytes."""
    row = replaced_row(transport, version, workers)(suite)
    if row.verdict == "SKIP":
        pytest.skip(row.skip)
    assert row.verdict == "PASS", format_row(row)


# ---------------------------------------------------------------------------
# a manifest that lists half a shard
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("transport,version,workers", [
    ("http", "v3", 0),
    pytest.param("http", "v1", 0, marks=pytest.mark.slow),
    pytest.param("http", "v3", 2, marks=pytest.mark.slow),
    pytest.param("s3", "v3", 0, marks=pytest.mark.slow),
])
def test_a_remote_manifest_listing_half_a_shard_is_refused(small, tmp_path, transport, version, workers):
    """The local files with this manifest are refused (samplecheck.check_end); over the
    network too, whatever path reads the shard, naming the shard and the manifest."""
    root = small.copy(str(tmp_path / "srv"))
    _half_listed(os.path.join(root, MANIFESTS[version]), os.path.join(root, "half.json"))
    shard = small.shard_names()[SHORT_SHARD]
    if transport == "http":
        with FaultServer(root) as srv:
            url = srv.url + "half.json"
            p = _cat(url, str(tmp_path / "cache"), workers)
    else:
        pytest.importorskip("moto.server")
        from chaos.s3rows import S3_CREDS, s3_bucket, s3_endpoint

        endpoint = s3_endpoint()
        bucket = s3_bucket(Suite(str(tmp_path), 0, True), endpoint, "half", root=root)
        url = f"s3://{bucket}/data/half.json"
        p = _cat(url, str(tmp_path / "cache"), workers, env=read_env(AWS_ENDPOINT_URL=endpoint, **S3_CREDS))
    assert p.rc != 0, f"exit 0 with {len(p.lines)} of 1600 samples and no message: {HALF} of {shard}'s 200 dropped"
    assert strict_error(p, shard, url), f"the error does not name {shard} and {url}: {last_line(p.err)}"
    # what was printed before the refusal: true samples (the order is that of the half-listed data set), once each
    seen = [tuple(line.split("\t")) for line in p.lines]
    assert all(small.data.digests[(name, key)] == dig for name, key, dig in seen)
    assert len(set(seen)) == len(seen)


def _one_by_one(srv: FaultServer) -> str:
    """The shards of :class:`Small` named one by one (a brace pattern), no manifest."""
    return srv.url + "shard-{000000..000007}.tar"


def _named_or_ignored(p: Proc, ref: List[str], manifest_url: str) -> None:
    """A manifest found beside the shards that does not fit them is either ignored (the
    output is exact) or named in the error."""
    assert not p.hung, "hung"
    if p.rc == 0:
        assert p.lines == ref, (f"exit 0 with {len(p.lines)} samples where the shards hold {len(ref)}"
                                f" ({sum(a != b for a, b in zip(p.lines, ref))} differ): {manifest_url} was "
                                "used although it does not fit the shards, and nothing said so")
    else:
        assert strict_error(p, manifest_url), f"the error does not name {manifest_url}: {last_line(p.err)}"


def test_a_manifest_beside_shards_named_one_by_one_listing_half_a_shard(small, tmp_path):
    """The user never named that manifest: it lists half of a shard, so it is refused
    by name (or ignored, and every sample of the shards delivered)."""
    root = small.copy(str(tmp_path / "srv"), manifests=False)
    _half_listed(os.path.join(small.root, MANIFESTS["v3"]), os.path.join(root, "manifest.json"))
    with FaultServer(root) as srv:
        p = _cat(_one_by_one(srv), str(tmp_path / "cache"))
        _named_or_ignored(p, small.ref, srv.url + "manifest.json")


def _stale_digest(m: dict) -> None:
    s = m["shards"][SHORT_SHARD]
    d = s["sample_xxh3_64"]
    s["sample_xxh3_64"] = d[:16 * 10] + format(int(d[160:176], 16) ^ 0x5A5A, "016x") + d[176:]


def _wrong_offsets(m: dict) -> None:
    s = m["shards"][SHORT_SHARD]
    s["offsets"][10] += 512


@pytest.mark.parametrize("damage", [_stale_digest, pytest.param(_wrong_offsets, marks=pytest.mark.slow)],
                         ids=["stale-digest", "wrong-offsets"])
def test_an_error_a_manifest_beside_the_shards_causes_names_it(small, tmp_path, damage):
    """A stale digest or a wrong offset in the manifest found beside the shards: the
    error points at that manifest, not at the shards (or it is ignored, exactly)."""
    root = small.copy(str(tmp_path / "srv"), manifests=False)
    with open(os.path.join(small.root, MANIFESTS["v3"])) as f:
        m = json.load(f)
    damage(m)
    with open(os.path.join(root, "manifest.json"), "w") as f:
        json.dump(m, f)
    with FaultServer(root) as srv:
        p = _cat(_one_by_one(srv), str(tmp_path / "cache"))
        _named_or_ignored(p, small.ref, srv.url + "manifest.json")


# ---------------------------------------------------------------------------
# a full cache disk
# ---------------------------------------------------------------------------
def test_a_full_cache_disk_during_a_sparse_fill_falls_back_exactly(small, tmp_path):
    """A cache on a tmpfs a third of the data's size: the run stays exact (the samples
    it cannot keep are read over the network), as every ENOSPC in the read path."""
    mnt = str(tmp_path / "mnt")
    with FaultServer(small.root) as srv:
        try:
            with diskfaults.tmpfs(mnt, f"{small.nbytes // 3 // 1024}k"):
                p = _cat(srv.url + MANIFESTS["v3"], os.path.join(mnt, "cache"))
        except diskfaults.MountUnavailable as exc:
            pytest.skip(str(exc))
    _exact(p, small.ref)


# ---------------------------------------------------------------------------
# secrets in what an error prints
# ---------------------------------------------------------------------------
SECRET = "Zq9SECRETSIGNATURE7f3e"
SIGNED = f"?X-Amz-Algorithm=AWS4-HMAC-SHA256&X-Amz-Credential=AKIAEXAMPLE&X-Amz-Signature={SECRET}"
_UNCAUGHT = textwrap.dedent("""
    import sys
    import resumewds as rw
    ds = rw.WebDataset(sys.argv[1], cache_dir=sys.argv[2])
    for sample in ds:   # the fetch error is not caught: Python prints the whole chain
        pass
""")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.parametrize("case", ["refused-shard", *(pytest.param(c, marks=pytest.mark.slow) for c in (
    "403-shard", "reset-shard", "refused-manifest", "500-manifest"))])
def test_an_uncaught_fetch_error_never_prints_a_presigned_signature(small, tmp_path, case):
    """Everything Python prints for the uncaught error (the exception, its causes and
    contexts: requests' and urllib3's own exceptions) and every log line is redacted."""
    kind, what = case.split("-")
    srv = FaultServer(small.root, faults="" if kind == "refused" else f"{kind}=1.0").start()
    try:
        base = f"http://127.0.0.1:{_free_port()}/" if kind == "refused" else srv.url
        url = base + ("shard-{000000..000001}.tar" if what == "shard" else "manifest.json") + SIGNED
        env = read_env(RESUMEWDS_FETCH_ATTEMPTS="2", RESUMEWDS_FETCH_BACKOFF_INITIAL="0.01",
                       RESUMEWDS_FETCH_BACKOFF_MAX="0.05", RESUMEWDS_VERBOSE="1")
        p = subprocess.run([sys.executable, "-c", _UNCAUGHT, url, str(tmp_path / "cache")], env=env,
                           capture_output=True, text=True, timeout=BOUND)
    finally:
        srv.stop()
    assert p.returncode != 0 and "Traceback" in p.stderr, p.stderr[-2000:]
    assert "127.0.0.1" in p.stderr  # the error is about that url...
    leaks = [ln for ln in (p.stderr + p.stdout).splitlines() if SECRET in ln]
    assert not leaks, f"{len(leaks)} printed lines carry the signature, e.g. {leaks[0][:300]}"


# ---------------------------------------------------------------------------
# a fork by the user's code
# ---------------------------------------------------------------------------
class SilentServer:
    """Accepts connections on 127.0.0.1 and never answers (holds them until stopped)."""

    def __init__(self) -> None:
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.conns: List[socket.socket] = []
        self._t = threading.Thread(target=self._accept, daemon=True)
        self._t.start()

    def _accept(self) -> None:
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            self.conns.append(c)

    def stop(self) -> None:
        self.sock.close()
        for c in self.conns:
            c.close()


_FORK = textwrap.dedent("""
    import gc, os, sys, time
    import resumewds as rw
    t0 = time.monotonic()
    ds = rw.WebDataset(sys.argv[1])
    print("built", time.monotonic() - t0, flush=True)
    r, w = os.pipe()
    t0 = time.monotonic()
    pid = os.fork()   # the user's own fork (a multiprocessing pool, a subprocess helper...)
    if pid == 0:
        os.write(w, str(gc.get_freeze_count()).encode())
        os._exit(0)
    took = time.monotonic() - t0
    os.close(w)
    frozen = os.read(r, 64).decode()
    os.waitpid(pid, 0)
    print("forked", took, "child_freeze_count", frozen, flush=True)
    os._exit(0)
""")


def _fork_in_child(url: str, env: Dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", _FORK, url], env=env, capture_output=True, text=True, timeout=30)


def _forked(p: subprocess.CompletedProcess) -> tuple:
    """(seconds the fork took, the child's ``gc.get_freeze_count()``)."""
    assert p.returncode == 0, p.stderr[-2000:]
    words = p.stdout.split()
    return float(words[words.index("forked") + 1]), int(words[words.index("child_freeze_count") + 1])


def test_a_child_the_user_forks_has_nothing_frozen(small, tmp_path):
    """After ``WebDataset(url)`` (a server that answers), the user's own fork gets a
    child whose garbage collector is the user's: ``gc.get_freeze_count() == 0``."""
    with FaultServer(small.root) as srv:
        _, frozen = _forked(_fork_in_child(srv.url + MANIFESTS["v3"],
                                           read_env(RESUMEWDS_CACHE_DIR=str(tmp_path / "cache"))))
    assert frozen == 0, f"the child the user forked has {frozen} objects frozen by gc.freeze()"


def test_a_fork_after_a_data_set_over_a_silent_server_returns_at_once(tmp_path):
    """The user's ``os.fork()`` waits for nothing of ours, and the child's garbage
    collector is the user's: nothing frozen."""
    srv = SilentServer()
    try:
        env = read_env(RESUMEWDS_CACHE_DIR=str(tmp_path / "cache"))
        try:
            p = _fork_in_child(f"http://127.0.0.1:{srv.port}/manifest.json", env)
        except subprocess.TimeoutExpired as exc:
            out = exc.stdout.decode() if isinstance(exc.stdout, bytes) else (exc.stdout or "")
            where = "os.fork()" if "built" in out else "WebDataset(...)"
            pytest.fail(f"{where} over a server that never answers did not return within 30 s ({out!r})")
    finally:
        srv.stop()
    took, frozen = _forked(p)
    assert took < 5.0, f"os.fork() took {took:.1f} s"
    assert frozen == 0, f"the child the user forked has {frozen} objects frozen by gc.freeze()"


# ---------------------------------------------------------------------------
# TLS
# ---------------------------------------------------------------------------
def _self_signed(d: str) -> tuple:
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - datetime.timedelta(days=1))
            .not_valid_after(now + datetime.timedelta(days=1))
            .add_extension(x509.SubjectAlternativeName([x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
                           critical=False)
            .sign(key, hashes.SHA256()))
    cpath, kpath = os.path.join(d, "cert.pem"), os.path.join(d, "key.pem")
    with open(cpath, "wb") as f:
        f.write(cert.public_bytes(serialization.Encoding.PEM))
    with open(kpath, "wb") as f:
        f.write(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                  serialization.NoEncryption()))
    return cpath, kpath


class TLSServer:
    """An https server on 127.0.0.1 with a self-signed certificate; counts connections."""

    def __init__(self, d: str) -> None:
        cert, key = _self_signed(d)
        self.ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        self.ctx.load_cert_chain(cert, key)
        self.sock = socket.create_server(("127.0.0.1", 0))
        self.port = self.sock.getsockname()[1]
        self.connections = 0
        threading.Thread(target=self._serve, daemon=True).start()

    def _serve(self) -> None:
        while True:
            try:
                c, _ = self.sock.accept()
            except OSError:
                return
            self.connections += 1
            try:
                with self.ctx.wrap_socket(c, server_side=True) as tls:  # the client gives up in the handshake
                    tls.recv(1)
            except (OSError, ssl.SSLError):
                pass
            finally:
                c.close()

    def stop(self) -> None:
        self.sock.close()


def test_a_tls_verification_failure_fails_at_once_without_retry(tmp_path):
    """A certificate nobody trusts does not heal by retrying: one connection, a clear error."""
    pytest.importorskip("cryptography")
    srv = TLSServer(str(tmp_path))
    try:
        env = read_env(RESUMEWDS_FETCH_BACKOFF_INITIAL="0.01", RESUMEWDS_FETCH_BACKOFF_MAX="0.05")
        p = _cat(f"https://127.0.0.1:{srv.port}/manifest.json", str(tmp_path / "cache"), env=env)
    finally:
        srv.stop()
    assert p.rc not in (0, None) and p.clear_error, f"exit {p.rc}: {p.err[-2000:]}"
    assert "certificate" in p.err.lower(), last_line(p.err)
    assert srv.connections == 1, f"{srv.connections} connections: a TLS verification failure was retried"


# ---------------------------------------------------------------------------
# egress: each byte once
# ---------------------------------------------------------------------------
@pytest.mark.parametrize("workers", [pytest.param(0, marks=pytest.mark.slow), 2,
                                     pytest.param(3, marks=pytest.mark.slow)])
def test_a_cold_epoch_asks_for_each_byte_once(small, tmp_path, workers):
    """``cat --seed 2 --shuffle`` with a cold cache: the server sends at most 1.02x the
    shards' bytes (per connection at an object store's stream rate, 4 MB/s)."""
    with FaultServer(small.root, bytes_per_second=4e6) as srv:
        p = _cat(srv.url + MANIFESTS["v3"], str(tmp_path / "cache"), workers)
        sent = tar_bytes_sent(srv)
    _exact(p, small.ref)
    assert sent <= 1.02 * small.nbytes, f"{sent} bytes sent for {small.nbytes} ({sent / small.nbytes:.3f}x)"


@pytest.mark.slow
def test_three_kills_on_small_shards_fetch_each_byte_once(small, tmp_path):
    """``cat --workers 2 --journal`` killed with SIGKILL three times mid-epoch (shards
    under 1 MB), then run to its end: the committed output is exact and the server
    sent at most 1.02x the shards' bytes over all four runs."""
    journal, cache = str(tmp_path / "run.db"), str(tmp_path / "cache")
    kept: List[str] = []
    kills = 0
    with FaultServer(small.root, bytes_per_second=4e6) as srv:
        cmd = read_cmd(srv.url + MANIFESTS["v3"], cache, workers=2, journal=journal)
        for at in (300, 700, 1100, None):
            before = committed_samples(journal) if os.path.exists(journal) else 0
            hit: List[int] = []
            p = run(cmd, env=read_env(), bound=BOUND,
                    on_start=kill_when_committed(journal, at, hit) if at is not None else None)
            after = committed_samples(journal)
            kept.extend(p.lines[:after - before])
            assert not p.hung
            if at is not None:
                assert hit, f"the run ended (exit {p.rc}) before {at} samples were committed: {last_line(p.err)}"
                kills += 1
            else:
                assert p.rc == 0, f"exit {p.rc}: {last_line(p.err)}"
        sent = tar_bytes_sent(srv)
    assert kills == 3
    assert kept == small.ref
    assert sent <= 1.02 * small.nbytes, (f"{sent} bytes sent over 3 kills for {small.nbytes} "
                                         f"({sent / small.nbytes:.3f}x)")
