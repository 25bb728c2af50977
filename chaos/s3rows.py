"""Rows of ``python -m chaos run`` over ``s3://``: the transport faults and the fetch hardening again.

moto's S3 server runs on 127.0.0.1 (started once per process), behind
:class:`chaos.s3proxy.S3FaultProxy`, which injects the faults; the rows are
named ``s3: ...`` and SKIP when ``boto3`` or ``moto[server]`` is missing.

Example:
    >>> s3_rows(True)[0].label
    's3: 503 SlowDown (throttling)'
"""

from __future__ import annotations

import logging
import os
import random
import threading
from typing import Any, Dict, List, Optional

from chaos.crash import cat_cmd, child_env, committed_samples, compare, run
from chaos.harness import BOUND, Row, Scenario, Suite, labelled, last_line
from chaos.s3proxy import S3FaultProxy

__all__ = ["S3_CREDS", "s3_bucket", "s3_client", "s3_endpoint", "s3_missing_object", "s3_net", "s3_ready", "s3_rows"]

S3_CREDS = {"AWS_ACCESS_KEY_ID": "chaos", "AWS_SECRET_ACCESS_KEY": "chaos", "AWS_DEFAULT_REGION": "us-east-1",
             "AWS_EC2_METADATA_DISABLED": "true", "AWS_CONFIG_FILE": os.devnull,
             "AWS_SHARED_CREDENTIALS_FILE": os.devnull}
_S3_LOCK = threading.Lock()
_S3_SERVER: List[str] = []  # the moto endpoint, started once per process


def s3_endpoint() -> str:
    """moto's server mode on 127.0.0.1 (started on first use, stopped at exit)."""
    with _S3_LOCK:
        if not _S3_SERVER:
            from moto.server import ThreadedMotoServer  # lazy: moto[server] is a test extra

            logging.getLogger("werkzeug").setLevel(logging.ERROR)
            srv = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
            srv.start()
            host, port = srv.get_host_and_port()
            _S3_SERVER.append(f"http://{host}:{port}")
        return _S3_SERVER[0]


def s3_client(endpoint: str) -> Any:
    """A boto3 client of the moto server at ``endpoint`` (straight, not through a proxy)."""
    import boto3  # lazy: the optional s3 extra

    return boto3.client("s3", endpoint_url=endpoint, aws_access_key_id="chaos", aws_secret_access_key="chaos",
                        region_name="us-east-1")


def s3_bucket(s: Suite, endpoint: str, name: str, root: Optional[str] = None) -> str:
    """A new bucket holding the files of ``root`` (default: the suite's data) under ``data/``."""
    root = root or s.data.root
    bucket = f"chaos-{name}-{s.seed}-{random.Random().getrandbits(32):08x}"
    c = s3_client(endpoint)
    c.create_bucket(Bucket=bucket)
    for fn in sorted(os.listdir(root)):
        if os.path.isfile(os.path.join(root, fn)):
            c.upload_file(os.path.join(root, fn), bucket, "data/" + fn)
    return bucket


def s3_ready(row: Row) -> bool:
    try:
        import boto3  # noqa: F401  # lazy: the optional s3 extra
        import moto.server  # noqa: F401  # lazy: moto[server] is a test extra
    except ImportError as exc:
        row.skip = f"needs boto3 and moto[server]: {exc}"
        return False
    return True


def s3_net(name: str, faults: str, *, max_per_path: int = 2, kills: int = 0,
           expect: str = "exact", env: Optional[Dict[str, str]] = None, workers: int = 2,
           within: float = BOUND, says: str = "", max_requests: Optional[int] = None,
           **proxy_kw: Any) -> Scenario:
    """``cat s3://bucket/data/manifest.json`` through the fault proxy (faults hit shards);
    with ``kills``, runs with a journal are SIGKILLed ``kills`` times and rerun.  Without:
    the run must end within ``within`` s, an error must say ``says``, and no shard may
    get more than ``max_requests`` GETs (the fetch hardening's checks)."""
    def scenario(s: Suite) -> Row:
        row = Row(name, "resume" if kills else expect)
        if not s3_ready(row):
            return row
        endpoint = s3_endpoint()
        bucket = s3_bucket(s, endpoint, "k" if kills else "n")
        px = S3FaultProxy(endpoint, faults=faults, seed=s.seed, max_faults_per_path=max_per_path,
                          stall_seconds=3.0, bytes_per_second=1.5e6 if kills else None, **proxy_kw).start()
        px.script(f"/{bucket}/data/manifest.json", [None] * 1000)
        try:
            d = s.tmp("s3")
            env_ = child_env(AWS_ENDPOINT_URL=px.url, **S3_CREDS, **(env or {}))
            src = f"s3://{bucket}/data/manifest.json"
            if not kills:
                p = run(cat_cmd(src, cache_dir=os.path.join(d, "cache"), epochs=1, workers=workers), env=env_,
                        bound=BOUND)
                s.judge(row, p)
                if not p.hung and p.seconds > within:
                    row.bad_exits.append(f"took {p.seconds:.0f}s (bound {within:.0f}s)")
                if says and p.rc and says not in p.err:
                    row.bad_exits.append(f"error does not say {says!r}: {last_line(p.err)}")
                if max_requests is not None:
                    worst = max((n for path, n in px.requests.items() if path.endswith(".tar")), default=0)
                    if worst > max_requests:
                        row.bad_exits.append(f"a shard got {worst} GETs (budget {max_requests})")
            else:
                journal = os.path.join(d, "run.db")
                cmd = cat_cmd(src, journal=journal, cache_dir=os.path.join(d, "cache"), epochs=1)
                rng = random.Random(f"{s.seed}:s3kill")
                kept: List[str] = []
                made = 0
                while True:
                    before = committed_samples(journal)
                    kill_at = rng.uniform(1.0, 5.0) if made < kills else None
                    p = run(cmd, env=env_, kill_after=kill_at, bound=BOUND, cache_dir=os.path.join(d, "cache"))
                    row.runs += 1
                    after = committed_samples(journal)
                    kept.extend(p.lines[: max(0, after - before)])
                    if p.hung:
                        row.hung += 1
                        break
                    if p.killed:
                        made += 1
                        row.faults += 1
                        continue
                    if p.rc != 0:
                        row.bad_exits.append(f"exit {p.rc}: {last_line(p.err)}")
                    break
                row.tally.add(compare(s.ref, kept, s.data.digests))
                row.note = f"{made} kills"
            row.faults += sum(px.faults.values())
        finally:
            px.stop()
        return row
    return labelled(name, scenario)


def s3_missing_object(s: Suite) -> Row:
    """A shard the manifest lists is not in the bucket: NoSuchKey, a clear error, no retries
    (at most one GET per reader: 2 workers and their prefetch threads)."""
    row = Row("s3: object missing from the bucket (NoSuchKey)", "error")
    if not s3_ready(row):
        return row
    endpoint = s3_endpoint()
    bucket = s3_bucket(s, endpoint, "m")
    shards = sorted(n for n in os.listdir(s.data.root) if n.endswith(".tar"))
    s3_client(endpoint).delete_object(Bucket=bucket, Key="data/" + shards[len(shards) // 2])
    px = S3FaultProxy(endpoint).start()
    try:
        d = s.tmp("s3missing")
        env = child_env(AWS_ENDPOINT_URL=px.url, **S3_CREDS)
        s.judge(row, run(cat_cmd(f"s3://{bucket}/data/manifest.json", cache_dir=os.path.join(d, "cache"),
                                 epochs=1), env=env, bound=BOUND))
        row.faults = 1
        gets = px.requests.get(f"/{bucket}/data/{shards[len(shards) // 2]}", 0)
        # each reader (2 workers, their prefetch threads) asks once; none retries a permanent error
        if gets > 6:
            row.bad_exits.append(f"NoSuchKey was asked {gets} times")
    finally:
        px.stop()
    return row


def s3_rows(quick: bool) -> List[Scenario]:
    """The s3 rows, in the order the matrix runs them."""
    return [
        s3_net("s3: 503 SlowDown (throttling)", "slowdown=0.6"),
        s3_net("s3: body cut by a connection reset", "reset=0.6"),
        s3_net("s3: HTTP 500 InternalError", "500=0.6"),
        s3_net("s3: stalled body (read timeout)", "stall=0.3", max_per_path=1),
        s3_net("s3: mixed faults, 30%/request", "mixed:0.3", max_per_path=3),
        s3_net(f"s3: SIGKILL x{2 if quick else 6} of cat --journal (mixed faults)", "mixed:0.1", max_per_path=1,
               kills=2 if quick else 6),
        labelled("s3: object missing from the bucket (NoSuchKey)", s3_missing_object),
        # the fetch hardening, over s3
        s3_net("s3: body trickles at 200 B/s (min rate)", "trickle=1.0", max_per_path=1,
               env={"RESUMEWDS_FETCH_MIN_RATE": "2000", "RESUMEWDS_FETCH_RATE_WINDOW": "1"},
               trickle_bytes_per_second=200.0),
        s3_net("s3: SlowDown with Retry-After 86400s", "slowdown=1.0", max_per_path=100000, expect="error",
               within=20, says="beyond what is left", max_requests=6, retry_after=86400),
        s3_net("s3: dead object: one budget for prefetch + reader", "500=1.0", max_per_path=100000,
               expect="error", workers=0, env={"RESUMEWDS_FETCH_ATTEMPTS": "4"}, max_requests=4),
    ]

