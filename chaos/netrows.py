"""Rows of ``python -m chaos run`` for transport faults and the fetch hardening.

``resumewds cat`` against a :class:`chaos.faultserver.FaultServer` on
127.0.0.1 that resets, cuts, flips, stalls, throttles or goes down
(:func:`transport_rows`), and one that answers in ways a fetch must bound
or refuse: a Retry-After a day ahead, a trickling body, gzip, an HTML page,
a redirect loop, a dead shard, an ignored If-Range (:func:`hardening_rows`).

Example:
    >>> [r.label for r in hardening_rows()][0]
    'Retry-After 86400s (429)'
"""

from __future__ import annotations

import json
import os
import shutil
from typing import Any, Dict, List, Optional

from chaos.crash import cat_cmd, child_env, make_dataset, run
from chaos.harness import BOUND, Row, Scenario, Suite, labelled, last_line, serve, shard_paths

__all__ = ["changed_file_ignoring_if_range", "hardening", "hardening_rows", "net",
           "remote_manifest_names_local_file", "transport_rows"]


def net(name: str, faults: str, *, max_per_path: int = 2, runs: int = 1, down: float = 0.0,
        no_manifest: bool = False, expect: str = "exact", **srv_kw: Any) -> Scenario:
    """``cat`` over a server injecting ``faults`` (``runs`` times, new seeds)."""
    def scenario(s: Suite) -> Row:
        row = Row(name, expect)
        for i in range(runs):
            make = s.server_without_manifest if no_manifest else s.server
            srv = make(faults, max_faults_per_path=max_per_path, seed=s.seed * 100 + i, **srv_kw)
            try:
                d = s.tmp("net")
                if no_manifest:
                    src = s.brace_source(srv.url)
                    srv.script("/" + os.path.basename(shard_paths(s.data)[0]), [])
                else:
                    src = srv.url + "manifest.json"
                if down:
                    srv.set_down(down)
                p = run(cat_cmd(src, cache_dir=os.path.join(d, "cache"), epochs=1), bound=BOUND)
                s.judge(row, p)
                row.faults += sum(srv.faults.values())
            finally:
                srv.stop()
        return row
    return labelled(name, scenario)


def transport_rows(quick: bool) -> List[Scenario]:
    """Resets, 5xx, 429, cut and flipped bodies, stalls, a server down, a mixture."""
    return [
        net("reset mid-body", "reset=0.6"),
        net("HTTP 500", "500=0.6"),
        net("HTTP 503 + Retry-After", "503=0.6"),
        net("HTTP 429 + Retry-After", "429=0.6"),
        net("truncated body (Content-Length)", "truncate=0.6"),
        net("truncated, no Content-Length, at sample boundary", "truncate_nolen=0.6"),
        net("truncated at sample boundary, no manifest", "truncate_nolen=0.6", no_manifest=True, expect="either"),
        net("flipped byte in member data (repaired)", "flip_data=0.6"),
        net("flipped byte in a tar header (repaired)", "flip_header=0.6"),
        net("stall past the read timeout", "stall=0.3", max_per_path=1),
        net("server down 3s, then back", "", down=3.0),
        net("mixed transport faults, 30%/request", "mixed:0.3", max_per_path=3, runs=1 if quick else 3),
    ]


# ---------------------------------------------------------------------------
# fetch hardening (bounded waits, one budget, clear errors)
# ---------------------------------------------------------------------------
def hardening(name: str, faults: str, *, expect: str, max_per_path: int = 1, no_manifest: bool = False,
              env: Optional[Dict[str, str]] = None, workers: int = 2, within: float = BOUND,
              says: str = "", max_requests: Optional[int] = None, **srv_kw: Any) -> Scenario:
    """A fetch fault that must end (``within`` s) as ``expect``; an error must
    say ``says``; no shard may get more than ``max_requests`` requests."""
    def scenario(s: Suite) -> Row:
        row = Row(name, expect)
        srv = (s.server_without_manifest if no_manifest else s.server)(faults, max_faults_per_path=max_per_path,
                                                                       **srv_kw)
        try:
            d = s.tmp("hard")
            src = s.brace_source(srv.url) if no_manifest else srv.url + "manifest.json"
            p = run(cat_cmd(src, cache_dir=os.path.join(d, "cache"), epochs=1, workers=workers),
                    env=child_env(**(env or {})), bound=BOUND)
            s.judge(row, p)
            row.faults += sum(srv.faults.values())
            if not p.hung and p.seconds > within:
                row.bad_exits.append(f"took {p.seconds:.0f}s (bound {within:.0f}s)")
            if says and p.rc and says not in p.err:
                row.bad_exits.append(f"error does not say {says!r}: {last_line(p.err)}")
            if max_requests is not None:
                worst = max((n for path, n in srv.requests.items() if path.endswith(".tar")), default=0)
                if worst > max_requests:
                    row.bad_exits.append(f"a shard got {worst} requests (budget {max_requests})")
        finally:
            srv.stop()
        return row
    return labelled(name, scenario)


def remote_manifest_names_local_file(s: Suite) -> Row:
    """A manifest served over http whose shard URL is a local path: refused, naming it."""
    row = Row("remote manifest names a local file", "error")
    d = s.tmp("remotelocal")
    with open(s.data.manifest) as f:
        m = json.load(f)
    m["shards"][1]["url"] = shard_paths(s.data)[1]  # an absolute local path
    with open(os.path.join(d, "manifest.json"), "w") as f:
        json.dump(m, f)
    for name in os.listdir(s.data.root):
        if name.endswith(".tar"):
            shutil.copy(os.path.join(s.data.root, name), d)
    srv = serve(d, seed=s.seed)
    try:
        p = run(cat_cmd(srv.url + "manifest.json", cache_dir=os.path.join(d, "cache"), epochs=1), bound=BOUND)
        s.judge(row, p)
        row.faults = 1
        if p.rc and "local file" not in p.err:
            row.bad_exits.append(f"error does not name the local file: {last_line(p.err)}")
    finally:
        srv.stop()
    return row


def changed_file_ignoring_if_range(s: Suite) -> Row:
    """No manifest; a cut download is resumed from a server that ignores
    If-Range while the file was replaced: the 206 is of the new version."""
    row = Row("file replaced mid-download, If-Range ignored, no manifest", "exact")
    d = s.tmp("splice")
    v2 = make_dataset(os.path.join(d, "v2"), shards=6, samples=60, size_range=(1000, 12000), seed=s.seed + 977)
    root = os.path.join(d, "srv")
    shutil.copytree(s.data.root, root)
    os.unlink(os.path.join(root, "manifest.json"))  # shards named one by one, indexed from their bytes
    for path in shard_paths(v2):
        shutil.copy(path, os.path.join(root, os.path.basename(path) + ".v2"))
    srv = serve(root, "truncate=1.0", seed=s.seed, max_faults_per_path=1, honour_if_range=False,
                range_variant=".v2")
    try:
        p = run(cat_cmd(s.brace_source(srv.url), cache_dir=os.path.join(d, "cache"), epochs=1), bound=BOUND)
        s.judge(row, p)
        row.faults += sum(srv.faults.values())
    finally:
        srv.stop()
    return row


def hardening_rows() -> List[Scenario]:
    """The fetch hardening rows (``chaos.fetchrows`` has the wrong answers to Range that follow them)."""
    slow = {"RESUMEWDS_FETCH_MIN_RATE": "2000", "RESUMEWDS_FETCH_RATE_WINDOW": "1"}
    return [
        # every request is answered so (ranged reads included): with one fault per
        # shard a ranged read could serve the data first, and the verdict would
        # depend on which request came first
        hardening("Retry-After 86400s (429)", "retry_after_huge=1.0", expect="error", within=20,
                  max_per_path=100000, says="beyond what is left"),
        hardening("Retry-After as an HTTP date a day ahead (503)", "retry_after_date=1.0", expect="error",
                  max_per_path=100000, within=20, says="beyond what is left"),
        hardening("body trickles 1 byte/0.5s (min rate)", "trickle=1.0", expect="exact", env=slow,
                  trickle_seconds=0.5),
        hardening("gzip Content-Encoding", "gzip=1.0", expect="error", max_per_path=100000, within=20,  # retried:
                  says="gzip-encoded", env={"RESUMEWDS_FETCH_ATTEMPTS": "3"}),  # a small budget, then the error
        hardening("HTML 200 error page, no manifest", "html200=1.0", expect="error", no_manifest=True,
                  max_per_path=100000, within=20, says="HTML page"),
        hardening("redirect loop", "redirect_loop=1.0", expect="error", max_per_path=100000, within=20,
                  says="redirect"),
        hardening("dead shard: one budget for prefetch + reader", "500=1.0", expect="error",
                  max_per_path=100000, workers=0, env={"RESUMEWDS_FETCH_ATTEMPTS": "4"}, max_requests=4),
        hardening("server ignores If-Range, truncated bodies", "truncate=0.6", expect="exact", max_per_path=2,
                  honour_if_range=False),
        labelled("remote manifest names a local file", remote_manifest_names_local_file),
        labelled("file replaced mid-download, If-Range ignored, no manifest", changed_file_ignoring_if_range),
    ]
