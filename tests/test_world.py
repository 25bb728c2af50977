"""resumewds.plan (rank / node identity) and the node-local plan through WebLoader.

The in-process loader tests run every rank of a world one after another in
this process (explicit ``rank=``/``world_size=``/``nodes=``, no process
group): a rank's batches depend only on the plan and the layout, so the
union of the ranks' outputs is what a real job delivers (the real torchrun
runs are in tests/test_multinode.py and tests/test_distributed.py).
"""

from __future__ import annotations

import logging
import subprocess
import sys
from typing import Dict, List, Optional, Tuple

import pytest

import resumewds as rw
from conftest import subprocess_env
from resumewds.plan import detect_world, resolve_partitions
from resumewds.plan._world import World, nodes_from_keys

TORCHRUN = {"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4",
            "GROUP_RANK": "1"}


def test_world_module_does_not_import_torch():
    code = ("import sys, resumewds.plan._world as w\n"
            "w.detect_world(env={'RANK': '1', 'WORLD_SIZE': '2', 'LOCAL_WORLD_SIZE': '1'})\n"
            "print(sum(m == 'torch' or m.startswith('torch.') for m in sys.modules))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True,
                         env=subprocess_env())
    assert out.stdout.strip() == "0"


def test_detect_world_from_torchrun_variables():
    w = detect_world(env=TORCHRUN)
    assert (w.rank, w.world_size, w.node, w.nodes, w.local_rank, w.source) == (5, 8, 1, 2, 1, "env")
    assert detect_world(env={**TORCHRUN, "GROUP_RANK": "", "NODE_RANK": "1"}).node == 1
    # one node: only the local variables, or LOCAL_WORLD_SIZE == WORLD_SIZE
    assert detect_world(env={"LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2"}) == World(1, 2, 0, 1)
    assert detect_world(env={"RANK": "1", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "2"}).nodes == 1
    assert detect_world(env={}) == World(0, 1)


def test_explicit_arguments_win_and_are_checked():
    assert detect_world(3, 4, nodes=2, env=TORCHRUN) == World(3, 4, 1, 2, "args")
    # an explicit world that is not the environment's: the environment's nodes do not apply
    assert detect_world(1, 4, env=TORCHRUN).nodes == 1
    with pytest.raises(ValueError, match="does not divide"):
        detect_world(0, 6, nodes=4, env={})
    with pytest.raises(ValueError, match="not in a world"):
        detect_world(4, 4, env={})
    with pytest.raises(ValueError, match="LOCAL_WORLD_SIZE"):
        detect_world(env={**TORCHRUN, "LOCAL_WORLD_SIZE": "x"})


def test_ranks_not_node_major_fall_back_to_one_node(caplog):
    with caplog.at_level(logging.WARNING, logger="resumewds"):
        w = detect_world(env={**TORCHRUN, "GROUP_RANK": "0"})  # rank 5 on node 0: round-robin
    assert (w.nodes, w.node) == (1, 0) and w.source.startswith("fallback")
    assert "one node" in caplog.text
    assert detect_world(env={**TORCHRUN, "LOCAL_WORLD_SIZE": "3"}).nodes == 1
    # torchrun with nodes of 2 and 6 ranks: both kinds of node fall back, consistently
    small = {"RANK": "1", "WORLD_SIZE": "8", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2",
             "GROUP_RANK": "0", "GROUP_WORLD_SIZE": "2"}
    big = {**small, "RANK": "7", "LOCAL_RANK": "5", "LOCAL_WORLD_SIZE": "6", "GROUP_RANK": "1"}
    assert detect_world(env=small).nodes == detect_world(env=big).nodes == 1
    assert detect_world(env={**TORCHRUN, "GROUP_WORLD_SIZE": "2"}).nodes == 2


def test_nodes_from_keys():
    assert nodes_from_keys(["h:a"] * 4, 3) == (0, 1, "")
    assert nodes_from_keys(["x", "x", "y", "y", "z", "z"], 5) == (2, 3, "")
    assert nodes_from_keys(["x", "y", "y"], 0)[1:] == (1, "nodes have different numbers of ranks")
    assert nodes_from_keys(["x", "y", "x", "y"], 0)[2].startswith("ranks of one cache")


def test_detect_world_with_a_process_group(tmp_path, monkeypatch):
    """Without LOCAL_WORLD_SIZE, an initialized group is asked (one all-gather)."""
    dist = pytest.importorskip("torch.distributed")
    for v in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK"):
        monkeypatch.delenv(v, raising=False)
    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'pg'}", rank=0, world_size=1)
    try:
        assert detect_world() == World(0, 1)
        assert detect_world(nodes=1).source == "args"
    finally:
        dist.destroy_process_group()


def test_resolve_partitions():
    assert resolve_partitions(None, 3) == 3
    assert resolve_partitions(6, 3, {"partitions": 2}) == 6
    assert resolve_partitions(None, 3, {"partitions": 2}) == 2
    assert resolve_partitions(None, 3, {"seed": 0}) == 1  # a run recorded before partitions


# ---------------------------------------------------------------------------
# the node-local plan through WebLoader (in process)
# ---------------------------------------------------------------------------

def _collate(samples):
    return [(s["__index__"], s["__key__"], bool(s.get("__pad__", False))) for s in samples]


def run_world(path: str, world: int, nodes: int, *, batch: int = 3, epochs: int = 1,
              state: Optional[dict] = None, partitions: Optional[int] = None,
              stop_after: Optional[int] = None) -> Tuple[Dict[int, List[list]], List[rw.WebLoader]]:
    """Every rank's batches (a list per step), ranks run one after another."""
    out: Dict[int, List[list]] = {}
    loaders = []
    for r in range(world):
        ds = rw.WebDataset(path, seed=5, shuffle=True, shuffle_window=2, partitions=partitions)
        ld = rw.WebLoader(ds, batch_size=batch, collate_fn=_collate, rank=r, world_size=world,
                          nodes=nodes)
        if state is not None:
            ld.load_state_dict(state)
        steps: List[list] = []
        while ld.epoch < epochs and (stop_after is None or len(steps) < stop_after):
            for b in ld:
                steps.append(b)
                if stop_after is not None and len(steps) >= stop_after:
                    break
        out[r] = steps
        loaders.append(ld)
    return out, loaders


def per_step_positions(out: Dict[int, List[list]]) -> List[List[int]]:
    n = {len(v) for v in out.values()}
    assert len(n) == 1, f"unequal batch counts per rank: {n}"
    steps = []
    for k in range(n.pop()):
        steps.append(sorted(i for r in out for i, _, pad in out[r][k] if not pad))
    return steps


def test_node_local_plan_exactly_once_and_local(tmp_path, make_shards):
    paths = make_shards(shards=12, samples=10, size_range=(50, 50))
    ds = rw.WebDataset(paths, seed=5, shuffle=True, shuffle_window=2)
    m = rw.build_manifest(paths, str(tmp_path / "m.json"), store=ds.store)
    path = str(tmp_path / "m.json")
    total = 120
    out, loaders = run_world(path, world=4, nodes=2)
    assert loaders[0].dataset.plan.partitions == 2  # auto: one partition per node
    assert loaders[0].config["partitions"] == 2
    steps = per_step_positions(out)
    # each step is a contiguous range of positions; together: every position once
    flat = [p for s in steps for p in s]
    assert flat == list(range(total))
    # each node's samples come from its own partition's shards (6 of 12)
    ep = loaders[0].dataset.plan.epoch(0)
    for node in (0, 1):
        keys = {k for r in (2 * node, 2 * node + 1) for b in out[r] for _, k, pad in b if not pad}
        shards = {k.split("_")[0] for k in keys}
        want = {m.shards[s].name.split(".")[0] for s in ep.partition_shards(node)}
        assert len(shards) == 6
        assert {f"s{int(n.split('-')[-1]):06d}" for n in want} == shards
    # one node, same data: today's order (one partition), rank slices in order
    single, ld1 = run_world(path, world=2, nodes=1)
    assert "partitions" not in ld1[0].config
    assert [p for s in per_step_positions(single) for p in s] == list(range(total))
    plan1 = rw.Plan(m.counts, seed=5, shuffle=True, window=2).epoch(0)
    got = [key for k in range(len(single[0])) for r in (0, 1) for _, key, pad in single[r][k] if not pad]
    assert got == ["s%06d_%06d" % plan1.sample_at(i) for i in range(total)]


def test_state_resume_at_other_node_counts_keeps_partitions(tmp_path, make_shards):
    paths = make_shards(shards=8, samples=9)
    ds = rw.WebDataset(paths, seed=5, shuffle=True, shuffle_window=2)
    rw.build_manifest(paths, str(tmp_path / "m.json"), store=ds.store)
    path = str(tmp_path / "m.json")
    total = 72
    full, _ = run_world(path, world=4, nodes=2, epochs=2)
    ref = [p for s in per_step_positions(full) for p in s]
    assert ref == list(range(total)) * 2
    keys = {}  # (epoch, position) -> key of the uninterrupted run
    k_epoch = len(per_step_positions(full)) // 2
    for r in full:
        for k, b in enumerate(full[r]):
            for i, key, pad in b:
                if not pad:
                    keys[(k // k_epoch, i)] = key
    part, lds = run_world(path, world=4, nodes=2, epochs=2, stop_after=5)
    state = lds[0].state_dict()
    assert state["config"]["partitions"] == 2 and state["position"] == 5 * 12
    for world, nodes in ((1, 1), (6, 3)):
        rest, rl = run_world(path, world=world, nodes=nodes, epochs=2, state=state)
        assert rl[0].dataset.plan.partitions == 2  # adopted from the state
        assert rl[0].layout.nodes == nodes
        seq = [(0, p) for s in per_step_positions(part) for p in s]
        e = 0
        for k in range(len(rest[0])):
            got = sorted((i, key) for r in rest for i, key, pad in rest[r][k] if not pad)
            if seq[-1][1] == total - 1:
                e += 1
            seq.extend((e, i) for i, _ in got)
            assert all(keys[(e, i)] == key for i, key in got), f"world {world}: step {k} differs"
        assert seq == [(e, p) for e in (0, 1) for p in range(total)]
    # an explicit, different partition count is refused
    ds2 = rw.WebDataset(path, seed=5, shuffle=True, shuffle_window=2, partitions=3)
    ld = rw.WebLoader(ds2, batch_size=3, rank=0, world_size=3, nodes=3, collate_fn=_collate)
    with pytest.raises(rw.StateError, match="partitions"):
        ld.load_state_dict(state)


def test_journal_records_partitions_and_refuses_a_change(tmp_path, make_shards):
    paths = make_shards(shards=6, samples=5)
    jp = str(tmp_path / "j" / "run.db")
    import os

    os.makedirs(os.path.dirname(jp))
    for r in range(2):
        ds = rw.WebDataset(paths, seed=1, shuffle=True, shuffle_window=2)
        ld = rw.WebLoader(ds, batch_size=2, rank=r, world_size=2, nodes=2, journal=jp)
        it = iter(ld)
        next(it)
        ld.commit(0)
        ld.close()
    from resumewds.journal import Journal

    with Journal(jp, rank=0, world_size=2) as j:
        assert j.config()["partitions"] == 2
    # resumed on one node (auto): the run's 2 partitions are kept
    ds = rw.WebDataset(paths, seed=1, shuffle=True, shuffle_window=2)
    ld = rw.WebLoader(ds, batch_size=2, rank=0, world_size=1, journal=jp, resume=True)
    assert ld.dataset.plan.partitions == 2 and ld.position == 4
    ld.close()
    # resumed on 3 nodes: a rank new to the run (no journal file of its own) keeps them too
    ds = rw.WebDataset(paths, seed=1, shuffle=True, shuffle_window=2)
    ld = rw.WebLoader(ds, batch_size=2, rank=2, world_size=3, nodes=3, journal=jp, resume=True)
    assert ld.dataset.plan.partitions == 2 and ld.layout.nodes == 3
    ld.close()
    ds = rw.WebDataset(paths, seed=1, shuffle=True, shuffle_window=2, partitions=1)
    with pytest.raises(rw.JournalConfigMismatch, match="partitions"):
        rw.WebLoader(ds, batch_size=2, rank=0, world_size=1, journal=jp, resume=True)


_PG = """
import os, sys, json
import torch.distributed as dist
from resumewds.plan import detect_world
dist.init_process_group("gloo", init_method=sys.argv[1], rank=int(sys.argv[2]), world_size=int(sys.argv[3]))
w = detect_world()
print(json.dumps([w.rank, w.world_size, w.node, w.nodes, w.source]))
dist.destroy_process_group()
"""


@pytest.mark.parametrize("caches,want", [(["a", "a", "b", "b"], [0, 0, 1, 1]),
                                         pytest.param(["a", "a", "a", "a"], [0, 0, 0, 0], marks=pytest.mark.slow)])
def test_nodes_from_a_real_process_group(tmp_path, caches, want):
    """4 gloo processes without torchrun's variables: ranks that share a cache
    directory (here: per process RESUMEWDS_CACHE_DIR) are one node."""
    pytest.importorskip("torch.distributed")
    import json

    env = subprocess_env()
    for v in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK"):
        env.pop(v, None)
    env["OMP_NUM_THREADS"] = "1"
    init = f"file://{tmp_path / 'pg'}"
    procs = [subprocess.Popen([sys.executable, "-c", _PG, init, str(r), "4"],
                              env={**env, "RESUMEWDS_CACHE_DIR": str(tmp_path / caches[r])},
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in range(4)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    got = [json.loads(o.strip().splitlines()[-1]) for o, _ in outs]
    nodes = len(set(caches))
    assert [g[2] for g in got] == want
    assert {g[3] for g in got} == {nodes}
    assert {g[4] for g in got} == {"torch.distributed"}


_PG_LOADER = """
import sys, json
import torch.distributed as dist
import resumewds as rw
dist.init_process_group("gloo", init_method=sys.argv[1], rank=int(sys.argv[2]), world_size=int(sys.argv[3]))
ld = rw.WebLoader(rw.WebDataset(sys.argv[4], cache_dir=sys.argv[5]), batch_size=2)
print(json.dumps([ld.world.node, ld.world.nodes, ld.dataset.plan.partitions]))
dist.destroy_process_group()
"""


def test_ranks_with_their_own_cache_dir_are_nodes(tmp_path, shards):
    """2 gloo processes on one host with one RESUMEWDS_CACHE_DIR, each data set with its own
    ``cache_dir=``: they share no cache, so they are 2 nodes (each its partition)."""
    pytest.importorskip("torch.distributed")
    import json

    env = subprocess_env()
    for v in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "GROUP_RANK", "NODE_RANK"):
        env.pop(v, None)
    env.update(OMP_NUM_THREADS="1", RESUMEWDS_CACHE_DIR=str(tmp_path / "shared"))
    init = f"file://{tmp_path / 'pg'}"
    procs = [subprocess.Popen([sys.executable, "-c", _PG_LOADER, init, str(r), "2", shards[0],
                               str(tmp_path / f"cache{r}")],
                              env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for r in range(2)]
    outs = [p.communicate(timeout=120) for p in procs]
    assert all(p.returncode == 0 for p in procs), outs
    assert [json.loads(o.strip().splitlines()[-1]) for o, _ in outs] == [[0, 2, 2], [1, 2, 2]]


def test_bad_partitions_are_refused(shards):
    for bad in (0, -2, True, "3", 2.0):
        with pytest.raises(ValueError, match="partitions must be an integer"):
            rw.WebDataset(shards, partitions=bad)
