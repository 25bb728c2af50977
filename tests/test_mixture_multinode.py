"""Mixtures on real multi-node torchrun: each node fetches only its share of every source.

Two ``torchrun --nnodes 2 --node_rank 0/1 --master_addr 127.0.0.1``
invocations of 2 ranks each are two nodes.  Each node has its own cache
directory and reads both sources of the mixture from its own HTTP server
(chaos/faultserver.py, one port per node, counting requests and bytes per
path), so what a server sent is what that node fetched.  The driver is
tests/mix_dist_driver.py.  Source ``a``: 8 shards x 24 samples, source ``b``:
4 shards x 12 samples (4:1 weights, an epoch of 240 positions: one pass over
each source per epoch).

The checks:

* the mixture's default partitions are the node count (2); each node
  fetched exactly the shards of its partitions of *each* source (predicted
  from the plan: the shards of the positions ``p % 2 == node``), each once
  (its two ranks share the cache), 1.00 x its share of each source's bytes,
  and nothing in the second epoch;
* the union over both nodes is the plan's sequence (a pure function of the
  manifests, weights, seeds, epoch and position), every position once;
* (slow) with source ``b`` resampled, both nodes SIGKILLed at the same
  instant in epoch 1, the journal resumed at 1 node (2 ranks) and at 3
  nodes (6 ranks): committed prefix + resumed run == the uninterrupted
  sequence, with the run's 2 partitions kept.

Run with ``-s`` to see the per-node figures.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import sys
from typing import Dict, List, Optional, Tuple

import pytest

import resumewds as rw
from resumewds.journal import resolve_resume
from resumewds.plan._plan import Layout
from resumewds.synth import write_shards

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_distributed import Job, free_port, kill_all, wait_for

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

pytestmark = [
    pytest.mark.skipif(not dist.is_available() or sys.platform == "win32",
                       reason="needs torch.distributed and POSIX signals"),
    pytest.mark.timeout(900),
    pytest.mark.usefixtures("cache_dir"),
]

DRIVER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "mix_dist_driver.py")
SOURCES = {"a": (8, 24), "b": (4, 12)}  # shards, samples per shard
EPOCH, BATCH, PER_NODE, SEED, WINDOW = 240, 4, 2, 3, 2
Seq = List[Tuple[int, int, str, str, str]]  # (epoch, position, source, shard, key)


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> str:
    root = str(tmp_path_factory.mktemp("mixmn-data"))
    from resumewds.cache import ShardStore

    for i, (name, (n, m)) in enumerate(SOURCES.items()):
        d = os.path.join(root, name)
        # equal-size samples: equal-size shards, so a node's share of bytes is exact
        write_shards(d, shards=n, samples=m, size_range=(200, 200), seed=i)
        with ShardStore(cache_dir=os.path.join(root, ".index-cache")) as store:
            rw.build_manifest(os.path.join(d, f"shard-{{000000..{n - 1:06d}}}.tar"),
                              os.path.join(d, "manifest.json"), store=store)
    return root


@pytest.fixture(scope="module")
def servers(data):
    from chaos.faultserver import FaultServer

    srvs = [FaultServer(data).start() for _ in range(3)]  # one port per node
    yield srvs
    for s in srvs:
        s.stop()


def driver_args(resampled: bool) -> argparse.Namespace:
    return argparse.Namespace(seed=SEED, window=WINDOW, resampled=resampled, verify=None, cache_size=None,
                              weights="4,1", epoch_size=EPOCH, partitions=None)


def reference(data: str, resampled: bool, epochs: int, partitions: int = 2) -> Seq:
    """The uninterrupted sequence, from the plan alone (no reading, no loader)."""
    from mix_dist_driver import build

    args = driver_args(resampled)
    args.data = [os.path.join(data, n, "manifest.json") for n in SOURCES]
    mixed = build(args)
    mixed.use_partitions(partitions)
    names = list(SOURCES)
    out = []
    for e in range(epochs):
        for p in range(EPOCH):
            src, shard, j = mixed.locate(e, p)
            out.append((e, p, names[src], mixed.datasets[src].manifest.shards[shard].name,
                        f"s{shard:06d}_{j:06d}"))
    return out


def launch(n_nodes: int, args: List[str], servers, tmp: str, tag: str, workers: int) -> List[Job]:
    port = free_port()
    return [Job(PER_NODE, DRIVER, [*(a for n in SOURCES for a in ("--data", servers[k].url + f"{n}/manifest.json")),
                                   "--tag", tag, "--workers", str(workers), *args],
                os.path.join(tmp, f"cache-{tag}-node{k}"), os.path.join(tmp, f"{tag}-node{k}.log"),
                nnodes=n_nodes, node_rank=k, master_port=port)
            for k in range(n_nodes)]


def read_log(out: str, tag: str) -> Dict[int, List[dict]]:
    runs: Dict[int, List[dict]] = {}
    pat = re.compile(rf"^{re.escape(tag)}\.rank(\d+)\.jsonl$")
    for name in os.listdir(out):
        m = pat.match(name)
        if m:
            with open(os.path.join(out, name)) as f:
                runs[int(m.group(1))] = [json.loads(line) for line in f if line.endswith("\n")]
    return dict(sorted(runs.items()))


def delivered(lines: Dict[int, List[dict]], last_step: Optional[int] = None) -> Seq:
    """Non-padding samples of every step (all ranks logged it), in position order."""
    by_step: Dict[int, Dict[int, dict]] = {}
    for r, ls in lines.items():
        for ln in ls:
            by_step.setdefault(ln["step"], {})[r] = ln
    seq: Seq = []
    for k in sorted(by_step):
        if last_step is not None and k > last_step:
            continue
        assert sorted(by_step[k]) == sorted(lines), f"step {k} logged by ranks {sorted(by_step[k])}"
        step = []
        for ln in by_step[k].values():
            step.extend((ln["epoch"], i, s, sh, key) for i, s, sh, key, pad
                        in zip(ln["idx"], ln["src"], ln["shard"], ln["keys"], ln["pads"]) if not pad)
        seq.extend(sorted(step))
    return seq


def fetched(srv) -> Dict[str, Dict[str, int]]:
    """``{source: {shard name: requests}}`` of one node's server."""
    out: Dict[str, Dict[str, int]] = {n: {} for n in SOURCES}
    for path, c in srv.requests.items():
        if path.endswith(".tar"):
            src, name = path.strip("/").split("/")[-2:]
            out[src][name] = c
    return out


def source_bytes(data: str, name: str) -> int:
    d = os.path.join(data, name)
    return sum(os.path.getsize(os.path.join(d, f)) for f in os.listdir(d) if f.endswith(".tar"))


def test_two_nodes_fetch_their_share_of_every_source(data, servers, tmp_path):
    for s in servers:
        s.reset_counters()
    tmp = str(tmp_path)
    out = os.path.join(tmp, "out")
    epochs = 2
    full = reference(data, False, epochs)
    jobs = launch(2, ["--out", out, "--epochs", str(epochs), "--batch", str(BATCH), "--seed", str(SEED),
                      "--window", str(WINDOW), "--weights", "4,1", "--epoch-size", str(EPOCH),
                      "--journal", os.path.join(out, "ref.db")], servers, tmp, "ref", workers=1)
    for j in jobs:
        j.wait(400)
    lines = read_log(out, "ref")
    assert sorted(lines) == list(range(2 * PER_NODE))
    assert {(ln["node"], ln["nodes"], ln["partitions"]) for ls in lines.values() for ln in ls} \
        == {(0, 2, 2), (1, 2, 2)}
    assert {len(ls) for ls in lines.values()} == {epochs * Layout(BATCH, 2 * PER_NODE).num_steps(EPOCH, 0)}
    assert delivered(lines) == full  # the plan's sequence, every position once
    for n in (0, 1):
        got = fetched(servers[n])
        mine = [x for x in full if x[1] % 2 == n]  # the node's positions
        for src in SOURCES:
            want = {x[3] for x in mine if x[2] == src}
            assert set(got[src]) == want, (n, src, sorted(got[src]), sorted(want))
            assert set(got[src].values()) == {1}, got[src]  # once per node, over both epochs
            nbytes = sum(v for p, v in servers[n].bytes_by_path.items() if f"/{src}/" in p and p.endswith(".tar"))
            share = source_bytes(data, src) / 2
            print(f"2 nodes x {PER_NODE} ranks, {epochs} epochs: node {n} source {src}: fetched "
                  f"{nbytes:,} B = {nbytes / share:.2f} x its share; {len(got[src])} of "
                  f"{SOURCES[src][0]} shards, each once")
            assert nbytes == share  # equal shards, cuts on shard edges: exactly the share
    # the partitions of the two nodes are disjoint (whole shards: the cuts fall on shard edges here)
    f0, f1 = fetched(servers[0]), fetched(servers[1])
    assert all(not set(f0[s]) & set(f1[s]) for s in SOURCES)
    done = json.load(open(os.path.join(out, "ref.rank0.done")))
    srcs = done["mixture"]["sources"]
    assert [s["delivered"] for s in srcs] == [2 * 192, 2 * 48]  # 4:1 exactly, over both epochs
    assert all(abs(s["deviation"]) < s["bound"] for s in srcs)


@pytest.mark.slow
def test_kill_both_nodes_resume_at_one_and_three_nodes_resampled(data, servers, tmp_path):
    for s in servers:
        s.reset_counters()
    tmp = str(tmp_path)
    out = os.path.join(tmp, "out")
    epochs = 2
    full = reference(data, True, epochs)
    common = ["--out", out, "--epochs", str(epochs), "--batch", str(BATCH), "--seed", str(SEED),
              "--window", str(WINDOW), "--weights", "4,1", "--epoch-size", str(EPOCH), "--resampled"]
    journal = os.path.join(out, "j", "run.db")
    os.makedirs(os.path.dirname(journal))
    jobs = launch(2, common + ["--journal", journal, "--step-sleep", "0.1"], servers, tmp, "a", workers=1)
    kill_at = Layout(BATCH, 2 * PER_NODE).num_steps(EPOCH, 0) + 4

    def reached() -> bool:
        return any(ln["step"] >= kill_at for ln in read_log(out, "a").get(0, []))

    wait_for(reached, 400, f"step {kill_at}", jobs[0])
    kill_all(jobs)
    point = resolve_resume(journal)
    assert point is not None and point["world_size"] == 2 * PER_NODE
    s, e, p = point["step"], point["epoch"], point["position"]
    assert e == 1 and 0 < p < EPOCH, point
    assert delivered(read_log(out, "a"), last_step=s) == full[:e * EPOCH + p]
    for n_nodes in (1, 3):
        for srv in servers:
            srv.reset_counters()
        jdir = os.path.join(out, f"j{n_nodes}")
        shutil.copytree(os.path.dirname(journal), jdir)
        jobs = launch(n_nodes, common + ["--journal", os.path.join(jdir, "run.db"), "--resume"],
                      servers, tmp, f"n{n_nodes}", workers=0 if n_nodes == 1 else 2)
        for j in jobs:
            j.wait(400)
        lines = read_log(out, f"n{n_nodes}")
        assert sorted(lines) == list(range(n_nodes * PER_NODE))
        assert {ln["partitions"] for ls in lines.values() for ln in ls} == {2}  # the run's
        assert {ln["nodes"] for ls in lines.values() for ln in ls} == {n_nodes}
        assert delivered(lines) == full[e * EPOCH + p:], f"{n_nodes} node(s): resumed sequence differs"
        per_node = [sum(fetched(servers[k])[x].__len__() for x in SOURCES) for k in range(n_nodes)]
        print(f"resumed at {n_nodes} node(s) at epoch {e} position {p}, partitions kept at 2: "
              f"shards fetched per node {per_node}; sequence == uninterrupted")
