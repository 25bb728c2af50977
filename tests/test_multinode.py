"""Real multi-node torchrun on one machine: per-node bytes, exactly once, kill, elastic resume.

Two ``torchrun --nnodes 2 --node_rank 0/1 --master_addr 127.0.0.1``
invocations, 2 ranks each, are two nodes: each node has its own cache
directory and reads the data set from its own HTTP server (one port per
node, chaos/faultserver.py counting bytes and requests per path), so the
bytes a server sent are the bytes that node fetched.  The checks:

* each node fetches about its share of the data set (target <= 1.1 x
  ``data set bytes / nodes``; here exactly its 8 of 16 shards), each shard
  once per node (its two ranks share the cache), and nothing more in the
  second epoch (the partitions are fixed for the run, the cache keeps them);
* the union over both nodes of every epoch is every sample exactly once, in
  the plan's order (each step a contiguous range of positions), with equal
  batch counts on every rank;
* both nodes SIGKILLed at the same instant mid-epoch, the journal resumed at
  1 node (2 ranks) and at 3 nodes (3 invocations, 6 ranks): the committed
  prefix plus what the resumed ranks deliver is exactly the uninterrupted
  sequence; the run's 2 partitions are kept (3 nodes do not divide 2, so
  there each node reads every shard: the printed elastic cost).

The uninterrupted run (about 20 s) is not marked slow; the kill/resume test
is.  Run with ``-s`` to see the figures (the README's multi-node table).
"""

from __future__ import annotations

import os
import shutil
import sys
from typing import List

import pytest

import resumewds as rw
from resumewds.journal import resolve_resume
from resumewds.plan._plan import Layout, Plan
from resumewds.synth import write_shards

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from test_distributed import DRIVER, Job, delivered, free_port, full_sequence, kill_all, read_log, wait_for

torch = pytest.importorskip("torch")
dist = pytest.importorskip("torch.distributed")

pytestmark = [
    pytest.mark.skipif(not dist.is_available() or sys.platform == "win32",
                       reason="needs torch.distributed and POSIX signals"),
    pytest.mark.timeout(600),
]

SHARDS, SAMPLES, SEED, WINDOW, BATCH, PER_NODE = 16, 24, 3, 2, 4, 2


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> str:
    d = str(tmp_path_factory.mktemp("mn-data"))
    # equal-size samples: equal-size shards, so a node's share of bytes is exact
    write_shards(d, shards=SHARDS, samples=SAMPLES, size_range=(200, 200), seed=5)
    from resumewds.cache import ShardStore

    with ShardStore(cache_dir=os.path.join(d, ".index-cache")) as store:
        rw.build_manifest(os.path.join(d, f"shard-{{000000..{SHARDS - 1:06d}}}.tar"),
                          os.path.join(d, "manifest.json"), store=store)
    return d


def launch(n_nodes: int, args: List[str], servers: List, tmp: str, tag: str, workers: int) -> List[Job]:
    """One torchrun invocation per node, each with its own cache and server."""
    port = free_port()
    return [Job(PER_NODE, DRIVER, ["--data", servers[n].url + "manifest.json", "--tag", tag,
                                   "--workers", str(workers), *args],
                os.path.join(tmp, f"cache-{tag}-node{n}"), os.path.join(tmp, f"{tag}-node{n}.log"),
                nnodes=n_nodes, node_rank=n, master_port=port)
            for n in range(n_nodes)]


def tar_bytes(srv) -> int:
    return sum(v for p, v in srv.bytes_by_path.items() if p.endswith(".tar"))


@pytest.fixture(scope="module")
def servers(data):
    from chaos.faultserver import FaultServer

    srvs = [FaultServer(data).start() for _ in range(3)]  # one port per node
    yield srvs
    for s in srvs:
        s.stop()


@pytest.fixture
def setup(data, servers, tmp_path):
    for s in servers:
        s.reset_counters()
    out = os.path.join(str(tmp_path), "out")
    os.makedirs(os.path.join(out, "j"))
    dataset_bytes = sum(os.path.getsize(os.path.join(data, n)) for n in os.listdir(data)
                        if n.endswith(".tar"))
    plan = Plan(rw.WebDataset(os.path.join(data, "manifest.json")).manifest.counts, seed=SEED,
                shuffle="window", window=WINDOW, partitions=2)
    common = ["--out", out, "--epochs", "2", "--batch", str(BATCH), "--seed", str(SEED),
              "--window", str(WINDOW)]
    return out, dataset_bytes, full_sequence(plan, SHARDS * SAMPLES, 2), common


def test_two_nodes_fetch_their_share_exactly_once(servers, setup, tmp_path):
    """2 nodes x 2 ranks, 2 epochs, uninterrupted: bytes per node / share,
    each shard once per node, the union is every sample once per epoch in
    the plan's order, equal batch counts."""
    out, dataset_bytes, full, common = setup
    tmp, total, epochs = str(tmp_path), SHARDS * SAMPLES, 2
    os.makedirs(os.path.join(out, "ref"))
    jobs = launch(2, common + ["--journal", os.path.join(out, "ref", "run.db")], servers, tmp,
                  "ref", workers=1)
    for j in jobs:
        j.wait(300)
    lines = read_log(out, "ref")
    assert sorted(lines) == list(range(2 * PER_NODE))
    assert {(ln["node"], ln["nodes"], ln["partitions"]) for ls in lines.values() for ln in ls} \
        == {(0, 2, 2), (1, 2, 2)}
    steps = {len(ls) for ls in lines.values()}
    assert steps == {epochs * Layout(BATCH, 2 * PER_NODE, 0).num_steps(total, 0)}  # equal batches
    assert delivered(lines, by_position=True) == full  # exactly once, in the plan's order
    ratios = []
    for n in (0, 1):
        got = tar_bytes(servers[n])
        share = dataset_bytes / 2
        ratios.append(got / share)
        reqs = {p: c for p, c in servers[n].requests.items() if p.endswith(".tar")}
        assert set(reqs.values()) == {1}, reqs  # each shard once per node, over both epochs
        print(f"2 nodes x {PER_NODE} ranks, {epochs} epochs: node {n} fetched {got:,} B "
              f"= {got / share:.2f} x its share ({share:,.0f} B of {dataset_bytes:,} B); "
              f"{len(reqs)} of {SHARDS} shards, each once")
    assert max(ratios) <= 1.1, ratios
    keys = [k for _, _, k in delivered(lines, by_position=True)]
    print(f"union over both nodes: {len(keys):,} samples = {epochs} x {total} "
          f"({len(set(keys))} distinct), every sample once per epoch")
    assert len(set(keys)) == total and len(keys) == epochs * total


@pytest.mark.slow
def test_kill_both_nodes_and_resume_at_one_and_three_nodes(servers, setup, tmp_path):
    """Both nodes SIGKILLed at once mid-epoch 1; the journal resumed at 1 node
    (2 ranks) and at 3 nodes (6 ranks) delivers exactly the rest of the
    uninterrupted sequence, with the run's 2 partitions."""
    out, dataset_bytes, full, common = setup
    tmp, total = str(tmp_path), SHARDS * SAMPLES
    journal = os.path.join(out, "j", "run.db")
    jobs = launch(2, common + ["--journal", journal, "--step-sleep", "0.05"], servers, tmp, "a",
                  workers=1)
    kill_at = Layout(BATCH, 2 * PER_NODE, 0).num_steps(total, 0) + 8

    def reached() -> bool:
        return any(ln["step"] >= kill_at for ln in read_log(out, "a").get(0, []))

    wait_for(reached, 240, f"step {kill_at}", jobs[0])
    kill_all(jobs)
    point = resolve_resume(journal)
    assert point is not None and point["world_size"] == 2 * PER_NODE
    s, e, p = point["step"], point["epoch"], point["position"]
    assert e == 1 and 0 < p < total, point
    assert delivered(read_log(out, "a"), last_step=s, by_position=True) == full[:e * total + p]
    for n_nodes in (1, 3):
        for s_ in servers:
            s_.reset_counters()
        jdir = os.path.join(out, f"j{n_nodes}")
        shutil.copytree(os.path.dirname(journal), jdir)
        jobs = launch(n_nodes, common + ["--journal", os.path.join(jdir, "run.db"), "--resume"],
                      servers, tmp, f"n{n_nodes}", workers=0 if n_nodes == 1 else 1)
        for j in jobs:
            j.wait(300)
        lines = read_log(out, f"n{n_nodes}")
        assert sorted(lines) == list(range(n_nodes * PER_NODE))
        assert {ln["partitions"] for ls in lines.values() for ln in ls} == {2}  # the run's
        assert {ln["nodes"] for ls in lines.values() for ln in ls} == {n_nodes}
        assert len({len(ls) for ls in lines.values()}) == 1
        assert delivered(lines, by_position=True) == full[e * total + p:], \
            f"{n_nodes} node(s): resumed sequence differs"
        left = (total - p) / total  # the fraction of epoch 1 still to deliver
        per_node = [tar_bytes(servers[n]) for n in range(n_nodes)]
        share = dataset_bytes / n_nodes
        print(f"resumed at {n_nodes} node(s) at epoch {e} position {p} ({left:.0%} of the epoch "
              f"left), partitions kept at 2: per-node bytes / share = "
              + ", ".join(f"{b / share:.2f}" for b in per_node)
              + ("  (2 partitions over 3 nodes: no locality)" if n_nodes == 3 else "")
              + "; sequence == uninterrupted")
        if n_nodes == 1:
            assert per_node[0] <= dataset_bytes
