"""Chaos row: a local shard corrupted in place (size kept), v3 manifest, ``--on-error skip``.

    shard corrupted in place, on_error=skip, v3    exact: the reference without the
                                                   damaged sample, every run

The rule (docs/DIGESTS.md, "Local shards: each sample its own"): each sample
of a local shard with per-sample digests is delivered once its own bytes
match its digest, so the damaged sample alone is skipped, and the shard's
other samples are delivered.  Every run starts on a fresh cache
(the shards' first use on this machine): 0 and 2 workers, twice each, and a
run stopped by ``--limit`` and resumed from its journal (0 and 2 workers),
its committed lines followed by the rerun's compared whole with the
reference.

The row is registered in :func:`chaos.run.matrix` (``skip_rows``).
"""

from __future__ import annotations

import os
import shutil
from typing import List

import resumewds as rw
from chaos.crash import cat_cmd, committed_samples, compare, run
from chaos.diskfaults import flip_byte
from chaos.harness import BOUND, Row, Scenario, Suite, labelled, last_line, shard_paths
from resumewds.tar._io import read_sample

__all__ = ["NAME", "corrupted_in_place", "skip_rows"]

NAME = "shard corrupted in place, on_error=skip, v3"


def corrupted_in_place(s: Suite) -> Row:
    """Flip one byte inside a sample of the third shard of a v3 copy of the data set."""
    row = Row(NAME, "exact")
    d = s.tmp("skipsample")
    root = os.path.join(d, "data")
    os.makedirs(root)
    paths = []
    for path in shard_paths(s.data):
        paths.append(shutil.copy2(path, os.path.join(root, os.path.basename(path))))
    manifest = os.path.join(root, "manifest.json")
    rw.build_manifest(paths, manifest, digests=True)  # version 3: per-sample digests + whole-file xxh3_64
    skip = ["--on-error", "skip"]
    good = run(cat_cmd(manifest, cache_dir=os.path.join(d, "c0"), workers=0, epochs=1, extra=skip), bound=BOUND)
    if good.rc != 0 or good.lines != s.ref:
        row.bad_exits.append(f"the v3 copy does not read as the reference: exit {good.rc} {last_line(good.err)}")
        return row
    bad = os.path.basename(paths[2])
    shard = rw.WebDataset(manifest).manifest.shards[2]
    mid = len(shard.offsets) // 2
    with open(paths[2], "rb") as f:
        key = read_sample(f.fileno(), int(shard.offsets[mid]), int(shard.offsets[mid + 1]), paths[2])["__key__"]
    flip_byte(paths[2], int(shard.offsets[mid]) + 600)  # inside a middle sample's data
    want = [ln for ln in s.ref if ln.split("\t")[:2] != [bad, key]]
    if len(want) != len(s.ref) - 1:
        row.bad_exits.append(f"sample {key} of {bad} is not in the reference once")
        return row
    row.faults = 1
    n = 0

    def cache() -> str:
        nonlocal n
        n += 1
        return os.path.join(d, f"c{n}")

    for workers in (0, 2, 0, 2):
        p = run(cat_cmd(manifest, cache_dir=cache(), workers=workers, epochs=1, extra=skip), bound=BOUND)
        row.runs += 1
        row.tally.add(compare(want, p.lines, s.data.digests))
        if p.rc != 0 or p.hung:
            row.bad_exits.append(f"{workers} workers: exit {p.rc}: {last_line(p.err)}")
        elif f"skipping sample {paths[2]}: sample {mid} " not in p.err or "skipped shard" in p.err:
            row.bad_exits.append(f"{workers} workers: the skip of sample {mid} of {bad} was not reported alone")
    for workers in (0, 2):
        journal = os.path.join(d, f"run{workers}.db")
        first = run(cat_cmd(manifest, journal=journal, cache_dir=cache(), workers=workers, epochs=1,
                            extra=skip + ["--limit", str(len(want) // 2)]), bound=BOUND)
        second = run(cat_cmd(manifest, journal=journal, cache_dir=cache(), workers=workers, epochs=1, extra=skip),
                     bound=BOUND)
        row.runs += 2
        got = first.lines[:committed_samples(journal)] + second.lines
        row.tally.add(compare(want, got, s.data.digests))
        for p in (first, second):
            if p.rc != 0 or p.hung:
                row.bad_exits.append(f"resume, {workers} workers: exit {p.rc}: {last_line(p.err)}")
    row.note = f"sample {mid} of {bad} skipped alone ({len(s.ref) - len(want)} sample) in {row.runs} runs"
    return row


def skip_rows() -> List[Scenario]:
    return [labelled(NAME, corrupted_in_place)]
