"""Rows of ``python -m chaos run`` for servers that answer ranges wrongly and send odd bodies.

Each row runs ``resumewds cat`` against a :class:`chaos.faultserver.FaultServer`
and expects the exact output of the local run:

* ``200 with Content-Range tail, no manifest`` -- every shard's first GET is
  cut at a sample boundary; the resume (``Range``) is answered 200 with
  ``Content-Range`` and only the tail, which is a complete tar by itself:
  it must never be published as the shard;
* ``40% corrupted responses, ranged reads`` -- a v3 manifest (sample
  digests), a cache too small to prefetch: every sample starts as a ranged
  read, 40% of the responses have a flipped byte;
* ``416 to Range`` -- a v3 manifest; every Range request (every sample
  starts as a ranged read) is answered 416;
* ``partial 200 to Range`` -- a manifest with sizes; whole GETs are cut, and
  every resume (``Range``) is answered 200 with only the requested bytes;
* ``HTML 5xx bodies (30%)`` -- single-process runs; 30% of the responses
  are an HTML 502 page, an HTML page with 200, or a gzip-encoded body.

Example:
    >>> [r.label for r in fetch_fault_rows()][0]
    '200 with Content-Range tail, no manifest'
"""

from __future__ import annotations

import os
import tarfile
from typing import List, Optional

from chaos.crash import cat_cmd, child_env, run
from chaos.harness import BOUND, Row, Scenario, Suite, labelled, shard_paths
from chaos.netrows import hardening

__all__ = ["fetch_fault_rows", "html_bodies", "tail_200_no_manifest", "v3_range_fault"]


def _cut_at_a_sample(path: str) -> str:
    """A ``truncate@f`` fault cutting ``path``'s body at the first header of a sample near its middle."""
    with tarfile.open(path) as tf:
        members = tf.getmembers()
    keys = [m.name.split(".", 1)[0] for m in members]
    i = len(members) // 2
    while i > 1 and keys[i] == keys[i - 1]:
        i -= 1
    return f"truncate@{(members[i].offset + 0.5) / os.path.getsize(path)!r}"


def tail_200_no_manifest(s: Suite) -> Row:
    """Every resume answered 200 with ``Content-Range`` and only the tail: never published as the shard."""
    row = Row("200 with Content-Range tail, no manifest", "exact")
    d = s.tmp("tail200")
    srv = s.server_without_manifest("", range_fault="range200_tail")
    try:
        for path in shard_paths(s.data):
            srv.script("/" + os.path.basename(path), [_cut_at_a_sample(path)])
        p = run(cat_cmd(s.brace_source(srv.url), cache_dir=os.path.join(d, "cache"), epochs=1), bound=BOUND)
        s.judge(row, p)
        row.faults += sum(srv.faults.values())
        if srv.faults["range200_tail"] == 0:
            row.bad_exits.append("no resume met the fault")
    finally:
        srv.stop()
    return row


def v3_range_fault(label: str, faults: str, *, range_fault: Optional[str] = None, max_per_path: int = 100000,
                   cache_size: str = "1") -> Scenario:
    """A v3 manifest, ``faults`` on every request and ``range_fault`` on every Range request."""
    def scenario(s: Suite) -> Row:
        row = Row(label, "exact")
        d = s.tmp("v3range")
        srv = s.v3_server(d, faults, max_faults_per_path=max_per_path, range_fault=range_fault)
        try:
            env = dict(child_env(), RESUMEWDS_CACHE_SIZE=cache_size)
            p = run(cat_cmd(srv.url + "manifest.json", cache_dir=os.path.join(d, "cache"), epochs=1),
                    env=env, bound=BOUND)
            s.judge(row, p)
            row.faults += sum(srv.faults.values())
            reqs = sum(n for k, n in srv.requests.items() if k.endswith(".tar"))
            row.note = f"{reqs} shard requests, faults {dict(srv.faults)}"
            if row.faults == 0:
                row.bad_exits.append("no fault injected")
        finally:
            srv.stop()
        return row

    return labelled(label, scenario)


def html_bodies(s: Suite) -> Row:
    """30% of the responses an HTML 502 page, an HTML page with 200, or gzip; single-process runs."""
    label = "HTML 5xx bodies (30%)"
    row = Row(label, "exact")
    runs = 1 if s.quick else 3
    for i in range(runs):
        srv = s.server("html502=0.15,html200=0.05,gzip=0.1", max_faults_per_path=3, seed=s.seed * 100 + i)
        try:
            d = s.tmp("html5xx")
            p = run(cat_cmd(srv.url + "manifest.json", cache_dir=os.path.join(d, "cache"), epochs=1, workers=0),
                    bound=BOUND)
            s.judge(row, p)
            row.faults += sum(srv.faults.values())
        finally:
            srv.stop()
    return row


def fetch_fault_rows() -> List[Scenario]:
    """The rows above, for :func:`chaos.run.matrix` (after :func:`chaos.netrows.hardening_rows`)."""
    return [
        labelled("200 with Content-Range tail, no manifest", tail_200_no_manifest),
        v3_range_fault("40% corrupted responses, ranged reads", "flip_data=0.4"),
        v3_range_fault("416 to Range", "", range_fault="range416"),
        hardening("partial 200 to Range", "truncate=0.6", expect="exact", max_per_path=2,
                  range_fault="range200_partial"),
        labelled("HTML 5xx bodies (30%)", html_bodies),
    ]
