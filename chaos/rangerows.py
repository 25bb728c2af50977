"""Rows of ``python -m chaos run`` for sample digests and ranged reads (v3 manifests).

Sample digests: a download that fails its whole-shard check is repaired by
re-fetching only the failing samples' byte ranges (:func:`sample_digest_rows`).

Ranged reads: samples of shards not cached yet come by HTTP Range, each
verified against its digest before delivery.  With a cache smaller than one
shard nothing is prefetched, so every sample of the run is a ranged read and
every injected fault hits one (:func:`ranged_read_rows`).

Example:
    >>> [r.label for r in sample_digest_rows()][0]
    'flipped byte repaired by range'
"""

from __future__ import annotations

import os
import random
from typing import List

import resumewds as rw
from chaos.crash import Harness, cat_cmd, child_env, run
from chaos.harness import BOUND, Row, Scenario, Suite, labelled, shard_paths, tar_paths

__all__ = ["crash_ranged", "flipped_byte_repaired_by_range", "ranged_read_rows", "ranged_reads",
           "sample_digest_rows"]


def flipped_byte_repaired_by_range(faults: str, label: str, max_per_path: int) -> Scenario:
    """A v3 manifest; downloads with flipped bytes are repaired by range, not fetched whole again."""
    def scenario(s: Suite) -> Row:
        row = Row(label, "exact")
        d = s.tmp("digests")
        srv = s.v3_server(d, faults, max_faults_per_path=max_per_path)
        try:
            paths = tar_paths(srv.root_dir)
            total = sum(os.path.getsize(p) for p in paths)
            p = run(cat_cmd(srv.url + "manifest.json", cache_dir=os.path.join(d, "cache"), epochs=1), bound=BOUND)
            s.judge(row, p)
            row.faults += sum(srv.faults.values())
            sent = srv.bytes_sent - srv.bytes_by_path.get("/manifest.json", 0)
            row.note = f"sent {sent} bytes for {total} bytes of shards ({sent / total:.2f}x)"
            if srv.faults.get("flip_data", 0) < len(paths):
                row.bad_exits.append(f"only {srv.faults.get('flip_data', 0)} of {len(paths)} downloads flipped")
            # a whole-shard refetch of every flipped download would send >= 2x (the
            # ranged reads of a cold start add their own ranges on top: < 0.5x here)
            if sent >= 1.9 * total and max_per_path == 1:
                row.bad_exits.append(f"repairs were not by range: {row.note}")
        finally:
            srv.stop()
        return row

    return labelled(label, scenario)


def sample_digest_rows() -> List[Scenario]:
    """Flipped bytes repaired by range, alone and among resets and truncations."""
    return [
        flipped_byte_repaired_by_range("flip_data=1.0", "flipped byte repaired by range", 1),
        flipped_byte_repaired_by_range("flip_data=0.5,reset=0.3,truncate=0.2",
                                       "flipped bytes + resets during ranged reads", 3),
    ]


def ranged_reads(faults: str, label: str, max_per_path: int, cache_size: str = "1") -> Scenario:
    """A v3 manifest and a cache too small to prefetch: every sample is a ranged read."""
    def scenario(s: Suite) -> Row:
        row = Row(label, "exact")
        d = s.tmp("ranged")
        srv = s.v3_server(d, faults, max_faults_per_path=max_per_path)
        try:
            paths = tar_paths(srv.root_dir)
            env = dict(child_env(), RESUMEWDS_CACHE_SIZE=cache_size)
            p = run(cat_cmd(srv.url + "manifest.json", cache_dir=os.path.join(d, "cache"), epochs=1),
                    env=env, bound=BOUND)
            s.judge(row, p)
            row.faults += sum(srv.faults.values())
            shard_requests = sum(n for k, n in srv.requests.items() if k.endswith(".tar"))
            row.note = f"{shard_requests} shard requests (ranges) for {len(paths)} shards"
            if shard_requests <= 2 * len(paths):
                row.bad_exits.append(f"not read by range: {row.note}")
        finally:
            srv.stop()
        return row

    return labelled(label, scenario)


def crash_ranged(kills: int) -> Scenario:
    """SIGKILL ``cat`` while it reads a v3 manifest by range and from partial downloads
    (a killed run leaves partials with torn tails: each sample is verified before use)."""
    def scenario(s: Suite) -> Row:
        row = Row(f"SIGKILL x{kills} during ranged reads (v3 manifest, 2 workers)", "resume")
        h = Harness(s.tmp("crash-ranged"), seed=s.seed, shards=6, samples=80)
        try:
            rw.build_manifest(shard_paths(h.data), h.data.manifest, digests=True)  # version 3
            rep = h.crash_cat(kills, random.Random(f"{s.seed}:ranged"), bound=BOUND)
            shard_requests = sum(n for k, n in h.server.requests.items() if k.endswith(".tar"))
        finally:
            h.close()
        row.runs, row.faults, row.tally, row.hung = rep.runs, rep.kills, rep.tally, rep.hung
        row.bad_exits = list(rep.errors)
        row.note = (f"{rep.kills_in_download} kills mid-download, {shard_requests} shard requests "
                    f"(whole + ranges) for 6 shards")
        return row
    return labelled("crash_ranged", scenario)


def ranged_read_rows() -> List[Scenario]:
    """Flipped bytes, resets and truncations during ranged reads, and kills during them."""
    return [
        ranged_reads("flip_data=0.4,flip_header=0.2", "flipped bytes in ranged reads (never delivered)", 4),
        ranged_reads("reset=0.3,truncate=0.2", "resets + truncations during ranged reads", 4),
        crash_ranged(4),
    ]
