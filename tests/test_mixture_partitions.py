"""Node-local mixtures and the one resampling routine.

Pure plan properties (hypothesis) and real loader runs (real shards, real
DataLoader worker processes, several ranks of a world in one process):

* one partition is the order of earlier versions: a digest of mixture and
  resampled sequences recorded before partitions and ``plan.draw_shards``
  existed is unchanged;
* with ``P`` partitions every prefix of the mixed stream holds each source
  within ``P d_i`` of its weight (``d_i`` the one-partition bound), a node's
  positions within ``(P / N) d_i``; each partition of a source is its own
  endless stream (a permutation of the partition per source epoch; with
  resampling, draws from the partition's shards only);
* a node (positions ``p % N == n``, ``N`` dividing ``P``) reads only the
  shards of its partitions of every source;
* a loader run interrupted at any step and resumed at other worker counts,
  world sizes and node counts equals the uninterrupted run (the plan's
  sequence), with and without resampling, 2-5 sources of very different
  sizes;
* single data sets: resampled and ``.shuffle(n)``-in-manifest-order plans
  accept partitions (they raised TypeError with 2+ nodes).
"""

from __future__ import annotations

import hashlib
import os
from typing import Any, Dict, List, Optional, Sequence, Tuple

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import resumewds as rw
from resumewds.mixing._plan import MixPlan, SourceStream, resampled_epoch
from resumewds.plan import Plan, draw_shards, mix
from resumewds.plan._epoch import cut_partitions
from resumewds.plan._keyed import permutation
from resumewds.plan._plan import resampled_shards
from resumewds.synth import write_shards

# recorded with the code before partitions and draw_shards (commit edace4e)
PINNED = "1a4da764e6d6e8b32ff35e12b0ab967c8248508b36d4f670976cdf58f3ce1de3"


def _pinned_digest() -> str:
    h = hashlib.sha256()
    cases = [([100, 10], [3, 1], {}), ([5, 77, 300], [1, 2, 3], {"block": 16}),
             ([3, 10, 222, 33, 200], [1, 5, 2, 2, 7], {"phases": [(50, [0, 1, 1, 0, 2]), (140, {0: 1})]}),
             ([10, 20], None, {"choose": [5, None], "repeat": [None, 2]})]
    for sizes, w, kw in cases:
        mp = MixPlan(sizes, w, seed=7, **kw)
        h.update(repr([mp.locate_global(g) for g in range(500)]).encode())
        h.update(repr([mp.delivered_global(g) for g in (0, 17, 499, 10**9)]).encode())
    for counts, sh, res in [([3, 5, 7], True, False), ([3, 5, 7], "shards", True), ([3, 5, 7], True, True),
                            ([2, 0, 9, 4], False, True)]:
        s = SourceStream(counts, seed=5, shuffle=sh, window=2, resampled=res)
        h.update(repr([s.at(q) for q in range(150)]).encode())
    h.update(repr([resampled_shards(n, s, e) for n in (1, 4, 9) for s in (0, 3) for e in (0, 1, 5)]).encode())
    h.update(repr([resampled_epoch([3, 0, 5, 2], 9, e, sh)[1] for e in range(4) for sh in (True, False)]).encode())
    for algo in ("resampled", "resampled_window"):
        ep = Plan([3, 5, 7, 2], seed=4, shuffle=algo, window=2).epoch(1)
        h.update(repr([ep.sample_at(i) for i in range(len(ep))]).encode())
    return h.hexdigest()


def test_one_partition_keeps_every_recorded_sequence():
    assert _pinned_digest() == PINNED


def test_draw_shards_is_both_resampling_routines():
    # single data sets: n draws, xxh3 of the draw keyed by the epoch's key
    key = mix(3, 1, 0x524553414D50)
    assert resampled_shards(6, 3, 1) == draw_shards(6, key)[0]
    # mixtures: draws until the epoch holds the data set's size, empty shards skipped
    draws, taken = draw_shards(4, 99, sizes=[3, 0, 5, 2], scheme="mixed")
    assert sum(taken) == 10 and 1 not in draws and all(t <= [3, 0, 5, 2][d] for d, t in zip(draws, taken))
    with pytest.raises(ValueError, match="draw scheme"):
        draw_shards(3, 1, scheme="other")


# ---- pure plan properties ---------------------------------------------------

sizes_st = st.lists(st.integers(8, 5000), min_size=2, max_size=5)


@settings(max_examples=40, deadline=None)
@given(sizes=sizes_st, data=st.data(), seed=st.integers(0, 2**63))
def test_partitioned_prefixes_stay_within_p_times_the_bound(sizes, data, seed):
    k = len(sizes)
    P = data.draw(st.sampled_from([2, 3, 4, 8]))
    weights = data.draw(st.lists(st.integers(1, 1000), min_size=k, max_size=k))
    L = data.draw(st.integers(P, 3000))
    mp = MixPlan(sizes, weights, seed=seed, epoch_size=L, partitions=P)
    one = MixPlan(sizes, weights, seed=seed, epoch_size=L)
    w = [x / sum(mp.phase_weights[0]) for x in mp.phase_weights[0]]
    d = one.bounds()
    assert mp.bounds() == [P * x for x in d]
    N = data.draw(st.sampled_from([n for n in (1, 2, 4) if P % n == 0]))
    e0 = data.draw(st.integers(0, 10**9))  # any epoch, far into the run too
    c = mp.delivered(e0, 0)
    node = [[0] * k for _ in range(N)]
    seen = [0] * N
    for p in range(min(L, 1200)):
        src, r, q = mp.where(e0, p)
        assert r == p % P
        c[src] += 1
        node[p % N][src] += 1
        seen[p % N] += 1
        n = e0 * L + p + 1
        for i in range(k):
            assert abs(c[i] - n * w[i]) < mp.bounds()[i] or d[i] == 0
            for m in range(N):  # a node's own positions: its P/N partitions
                assert abs(node[m][i] - seen[m] * w[i]) < (P // N) * d[i] or d[i] == 0
    assert c == mp.delivered(e0, min(L, 1200))


@settings(max_examples=40, deadline=None)
@given(counts=st.lists(st.integers(0, 40), min_size=1, max_size=9).filter(lambda c: sum(c) >= 4),
       seed=st.integers(0, 2**32), shuffle=st.sampled_from([True, "shards", False]),
       P=st.sampled_from([2, 3, 4]))
def test_each_partition_of_a_source_is_its_own_endless_stream(counts, seed, shuffle, P):
    s = SourceStream(counts, seed=seed, shuffle=shuffle, window=2, partitions=P)
    everything = {(i, j) for i, n in enumerate(counts) for j in range(n)}
    parts = []
    for r in range(P):
        m = s.part_sizes[r]
        first = [s.at(q, r) for q in range(m)]
        assert len(set(first)) == m  # a source epoch of the partition: each sample once
        assert {s.at(q, r) for q in range(m, 2 * m)} == set(first)  # the next epoch: the same samples
        parts.append(set(first))
    assert set().union(*parts) == everything and sum(map(len, parts)) == len(everything)
    # resampled: draws with replacement, only from the partition's own shards
    res = SourceStream(counts, seed=seed, shuffle=shuffle, window=2, resampled=True, partitions=P)
    cut = cut_partitions(counts, permutation(len(counts), mix(seed, 0x5041525453)), P)
    for r in range(P):
        allowed = {(sh, f + j) for sh, f, n in cut[r] for j in range(n)}
        assert {res.at(q, r) for q in range(3 * res.part_sizes[r])} <= allowed


@settings(max_examples=30, deadline=None)
@given(sizes=sizes_st, data=st.data(), seed=st.integers(0, 2**32))
def test_a_phase_keeps_the_past_of_every_partition(sizes, data, seed):
    """A curriculum phase at global position g (declared at a resume): every
    position before g maps as without it, and each partition's source stream
    continues (no index twice, none skipped)."""
    k = len(sizes)
    P = data.draw(st.sampled_from([2, 3, 4]))
    block = data.draw(st.sampled_from([1, 1, 4]))
    w0 = data.draw(st.lists(st.integers(1, 9), min_size=k, max_size=k))
    w1 = data.draw(st.lists(st.integers(0, 9), min_size=k, max_size=k).filter(any))
    L = data.draw(st.integers(P, 300))
    at = data.draw(st.integers(1, 3 * L))
    plain = MixPlan(sizes, w0, seed=seed, epoch_size=L, partitions=P, block=block)
    staged = MixPlan(sizes, w0, seed=seed, epoch_size=L, partitions=P, block=block, phases=[(at, w1)])
    seen: Dict[Tuple[int, int], set] = {}
    for g in range(at + 2 * L):
        e, p = divmod(g, L)
        got = staged.where(e, p)
        if g < at:
            assert got == plain.where(e, p)
        key = (got[0], got[1])
        assert got[2] not in seen.setdefault(key, set())
        seen[key].add(got[2])
    if block == 1:  # without blocks each partition's stream is a prefix at every position
        assert all(q == set(range(len(q))) for q in seen.values())


def test_a_source_smaller_than_the_partitions_is_a_clear_error():
    with pytest.raises(ValueError, match="3 samples cannot be cut into partitions=4"):
        SourceStream([3], partitions=4)
    with pytest.raises(ValueError, match="epoch of 3 positions cannot feed partitions=4"):
        MixPlan([10, 10], [1, 1], epoch_size=3, partitions=4)


@settings(max_examples=30, deadline=None)
@given(counts=st.lists(st.integers(1, 30), min_size=2, max_size=12), seed=st.integers(0, 2**32),
       algo=st.sampled_from(["resampled", "resampled_window", "manifest_window"]), P=st.sampled_from([2, 3]))
def test_single_data_sets_resampled_and_windowed_orders_take_partitions(counts, seed, algo, P):
    if sum(counts) < P:
        return
    ep = Plan(counts, seed=seed, shuffle=algo, window=2, partitions=P).epoch(1)
    assert len(ep) == sum(counts)  # partitions of c or c + 1 samples: the data set's size
    order = range(len(counts)) if algo == "manifest_window" else permutation(len(counts), mix(seed, 0x5041525453))
    cut = cut_partitions(counts, order, P)
    for r in range(P):
        allowed = {(sh, f + j) for sh, f, n in cut[r] for j in range(n)}
        got = [ep.sample_at(p) for p in range(r, len(ep), P)]
        assert set(got) <= allowed
        if algo == "manifest_window":
            assert set(got) == allowed


# ---- real loaders -----------------------------------------------------------

pytestmark = pytest.mark.usefixtures("cache_dir")
SHAPES = [(1, 8), (2, 5), (6, 37), (3, 11), (10, 20)]  # 8, 10, 222, 33, 200 samples


@pytest.fixture(scope="module")
def data_root(tmp_path_factory) -> str:
    root = str(tmp_path_factory.mktemp("mixparts"))
    for i, (n, m) in enumerate(SHAPES):
        write_shards(os.path.join(root, f"src{i}"), shards=n, samples=m, size_range=(5, 60), seed=i)
    return root


def _mk(root: str, k: int, weights: Sequence[int], resampled: Any, epoch_size: int,
        partitions: Optional[int]) -> rw.MixedDataset:
    ds = []
    for i in range(k):
        d = os.path.join(root, f"src{i}")
        paths = sorted(os.path.join(d, f) for f in os.listdir(d) if f.endswith(".tar"))
        ds.append(rw.WebDataset(paths, seed=10 + i, shuffle=[True, "shards", False][i % 3], shuffle_window=2))
    return rw.MixedDataset(ds, weights=list(weights), resampled=resampled, epoch_size=epoch_size, seed=3,
                           names=[f"s{i}" for i in range(k)], partitions=partitions)


def _ident(x: Dict[str, Any]) -> Tuple:
    return (x["__epoch__"], x["__index__"], x["__source__"], x["__shard__"], x["__key__"],
            bool(x.get("__pad__", False)))


def _collate(batch: List[Dict[str, Any]]) -> List[Tuple]:
    return [_ident(x) for x in batch]


def _run(mk, batch: int, workers: int, world: int, nodes: int, epochs: int, state: Optional[dict] = None,
         steps: Optional[int] = None) -> Tuple[Dict[Tuple[int, int], Tuple], Dict[int, set], dict, int]:
    """Every rank of a world, one after another; returns samples by (epoch, index),
    the (source, shard) pairs each node read, rank 0's state, and the partitions used."""
    got: Dict[Tuple[int, int], Tuple] = {}
    read: Dict[int, set] = {}
    final: dict = {}
    parts = 0
    for r in range(world):
        ld = rw.WebLoader(mk(), batch_size=batch, num_workers=workers, rank=r, world_size=world,
                          nodes=nodes, collate_fn=_collate)
        if state is not None:
            ld.load_state_dict(state)
        parts = ld.dataset.plan_partitions
        n = 0
        try:
            while ld.epoch < epochs and (steps is None or n < steps):
                for b in ld:
                    for x in b:
                        read.setdefault(ld.world.node, set()).add((x[2], x[3]))
                        if x[5]:
                            continue
                        assert (x[0], x[1]) not in got, f"position {x[:2]} delivered twice"
                        got[(x[0], x[1])] = x
                    n += 1
                    if steps is not None and n >= steps:
                        break
        finally:
            ld.close()
        if r == 0:
            final = ld.state_dict()
    return got, read, final, parts


def _reference(mk, epochs: int, partitions: int) -> Dict[Tuple[int, int], Tuple]:
    out = {}
    for e in range(epochs):
        ds = mk()
        ds.use_partitions(partitions)
        ds.epoch = e
        for x in ds:
            out[(x["__epoch__"], x["__index__"])] = _ident(x)
    return out


def test_a_node_reads_only_its_partitions_of_every_source(data_root):
    mk = lambda: _mk(data_root, 3, [2, 1, 3], [False, True, False], 120, None)
    ref = _reference(mk, 2, 2)
    got, read, _, parts = _run(mk, 3, 1, 4, 2, 2)
    assert parts == 2 and got == ref  # partitions default to the node count
    for n in (0, 1):
        want = {(x[2], x[3]) for (e, p), x in ref.items() if p % 2 == n}
        assert read[n] == want
    # source s2 (6 shards x 37 samples, manifest order): the cut at 111 samples is a shard edge
    s2 = [{sh for s, sh in read[n] if s == "s2"} for n in (0, 1)]
    assert s2[0] <= {f"shard-00000{i}.tar" for i in (0, 1, 2)} and s2[1] <= {f"shard-00000{i}.tar" for i in (3, 4, 5)}
    # one partition (an explicit partitions=1): a node reads shards of every part of the data
    got1, read1, _, parts1 = _run(lambda: _mk(data_root, 3, [2, 1, 3], [False, True, False], 120, 1),
                                  3, 0, 4, 2, 1)
    assert parts1 == 1 and got1 == _reference(lambda: _mk(data_root, 3, [2, 1, 3], [False, True, False], 120, 1),
                                              1, 1)
    both = [{sh for s, sh in read1[n] if s == "s2"} for n in (0, 1)]
    assert len(both[0] & both[1]) >= 2  # no locality: the nodes read the same shards


@settings(max_examples=10, deadline=None, suppress_health_check=list(HealthCheck))
@given(k=st.integers(2, 5), data=st.data())
def test_partitioned_resume_at_any_step_workers_world_and_nodes(data_root, k, data):
    weights = data.draw(st.lists(st.integers(1, 9), min_size=k, max_size=k))
    resampled = data.draw(st.sampled_from([False, True, [True, False, True, False, True][:k]]))
    batch = data.draw(st.integers(1, 6))
    (w1, n1), (w2, n2) = data.draw(st.sampled_from([((2, 2), (1, 1)), ((4, 2), (3, 3)), ((1, 1), (4, 2)),
                                                    ((2, 2), (6, 3)), ((4, 4), (2, 1))]))
    nw1, nw2 = data.draw(st.sampled_from([(0, 2), (2, 0), (1, 0)]))
    P = n1  # a new run takes the node count; the resume keeps it, whatever the new world
    mk = lambda: _mk(data_root, k, weights, resampled, 48, None)
    epochs = 2
    ref = _reference(mk, epochs, P)
    total = 48 * epochs
    stop = data.draw(st.integers(1, max(1, total // (batch * w1) - 1)))
    first, _, state, p1 = _run(mk, batch, nw1, w1, n1, epochs, steps=stop)
    rest, _, _, p2 = _run(mk, batch, nw2, w2, n2, epochs, state=state)
    assert p1 == p2 == P
    assert not set(first) & set(rest), "a position delivered before and after the resume"
    both = dict(first)
    both.update(rest)
    assert both == ref
    # the delivered proportions: within the stated bound P d_i of the weights
    mp = mk().mixplan if P == 1 else MixPlan([1] * k, weights, epoch_size=48, seed=3, partitions=P)
    for i in range(k):
        c = sum(1 for x in both.values() if x[2] == f"s{i}")
        assert abs(c - total * weights[i] / sum(weights)) < max(mp.bounds()[i], 1e-9)


def test_an_explicit_other_partition_count_is_refused_at_resume(data_root, tmp_path):
    journal = str(tmp_path / "run.db")
    for r in (0, 1):
        ld = rw.WebLoader(_mk(data_root, 2, [1, 1], False, 40, None), batch_size=4, rank=r, world_size=2,
                          nodes=2, journal=journal)
        for step, _ in enumerate(ld):
            ld.commit(step)
            if step == 2:
                break
        ld.close()
        assert ld.config.get("partitions") == 2
    with pytest.raises(rw.errors.JournalConfigMismatch, match="partitions"):
        rw.WebLoader(_mk(data_root, 2, [1, 1], False, 40, 3), batch_size=4, rank=0, world_size=2,
                     nodes=2, journal=journal, resume=True)
    # the default (None) adopts the run's 2 partitions, at another node count
    ld = rw.WebLoader(_mk(data_root, 2, [1, 1], False, 40, None), batch_size=4, rank=0, world_size=1,
                      journal=journal, resume=True)
    assert ld.dataset.plan_partitions == 2 and (ld.epoch, ld.position) == (0, 24)
    # status/report compute the mixture from the journal's config alone, partitions included
    from resumewds.mixing import mixture_status

    mx = ld.stats()["mixture"]
    assert mixture_status(ld.config, 0, 24) == mx and [s["delivered"] for s in mx["sources"]] == [12, 12]
    assert [s["bound"] for s in mx["sources"]] == [2.0, 2.0]  # P d = 2 x 1
    ld.close()


def _corrupt_keep_mtime(path: str, at: int) -> None:
    """Flip one byte at ``at`` (inside a sample's payload: the tar stays readable)."""
    s = os.stat(path)
    with open(path, "r+b") as f:
        f.seek(at)
        b = f.read(1)
        f.seek(at)
        f.write(bytes([b[0] ^ 0xFF]))
    os.utime(path, ns=(s.st_atime_ns, s.st_mtime_ns))


def test_each_source_keeps_its_own_verification_over_http_on_its_node(tmp_path):
    """A node of a partitioned mixture: source a (verify="always") repairs a
    corrupted cached shard by fetching it again, source b (verify="never")
    trusts its cache, as the same settings do for one data set; neither
    fetches a shard outside the node's partitions."""
    from chaos.faultserver import FaultServer
    from resumewds.cache import ShardStore

    root = str(tmp_path / "data")
    for i, name in enumerate("ab"):
        d = os.path.join(root, name)
        write_shards(d, shards=4, samples=6, size_range=(100, 100), seed=i)
        with ShardStore(cache_dir=str(tmp_path / "index")) as store:
            rw.build_manifest(os.path.join(d, "shard-{000000..000003}.tar"), os.path.join(d, "manifest.json"),
                              store=store)
    srv = FaultServer(root).start()
    cache = str(tmp_path / "node0-cache")
    try:
        def mk(cache: str = cache) -> rw.MixedDataset:
            a = rw.WebDataset(srv.url + "a/manifest.json", seed=1, shuffle=True, shuffle_window=2,
                              verify="always", cache_dir=cache)
            b = rw.WebDataset(srv.url + "b/manifest.json", seed=2, shuffle="shards", verify="never",
                              cache_dir=cache)
            return rw.MixedDataset([a, b], weights=[1, 1], epoch_size=48, seed=5, names=["a", "b"])

        def run(epoch: int) -> Dict[Tuple[int, int], Tuple]:
            ld = rw.WebLoader(mk(), batch_size=3, num_workers=0, rank=0, world_size=2, nodes=2,
                              collate_fn=_collate)
            ld.epoch = epoch
            out = {}
            for b in ld:  # one epoch
                out.update({(x[0], x[1]): x for x in b if not x[5]})
            ld.close()
            return out

        ref = _reference(lambda: mk(str(tmp_path / "ref-cache")), 2, 2)  # reads everything
        srv.reset_counters()
        got0 = run(0)
        assert got0 == {k: v for k, v in ref.items() if k[0] == 0 and k[1] % 2 == 0}
        first = {p: c for p, c in srv.requests.items() if p.endswith(".tar")}
        mine = {f"/{x[2]}/{x[3]}" for x in got0.values()}
        assert set(first) == mine and set(first.values()) == {1}  # only node 0's shards, once
        assert len({p for p in mine if p.startswith("/a/")}) == 2  # its partition: 2 of 4 shards
        # corrupt every cached shard of both sources (same size, mtime kept)
        probe = mk()
        for ds in probe.datasets:
            for sh in ds.manifest.shards:
                if f"/{'ab'[probe.datasets.index(ds)]}/{sh.name}" in mine:
                    _corrupt_keep_mtime(ds.store.ensure(sh), sh.sample_range(0)[0] + 512 + 10)
        probe.close()
        srv.reset_counters()
        got1 = run(1)
        assert got1 == {k: v for k, v in ref.items() if k[0] == 1 and k[1] % 2 == 0}
        again = {p: c for p, c in srv.requests.items() if p.endswith(".tar")}
        # "always": each corrupted shard of a caught and fetched again, once; "never": b trusted
        assert set(again) == {p for p in mine if p.startswith("/a/")} and set(again.values()) == {1}
    finally:
        srv.stop()


def test_a_resampled_data_set_on_two_nodes_reads_only_its_partitions(data_root):
    """WebDataset(resampled=True) under 2 nodes (a TypeError before): each node's
    draws come from its own partition's shards; the union is the plan's epoch."""
    d = os.path.join(data_root, "src2")
    paths = sorted(os.path.join(d, f) for f in os.listdir(d) if f.endswith(".tar"))
    cut = cut_partitions([37] * 6, permutation(6, mix(3, 0x5041525453)), 2)
    got = {}
    for r in (0, 1):
        ld = rw.WebLoader(rw.WebDataset(paths, seed=3, resampled=True).shuffle(40), batch_size=4,
                          rank=r, world_size=2, nodes=2, num_workers=1)
        plan = ld.dataset.plan
        assert plan.algo == "resampled_window" and plan.partitions == 2
        for b in ld:
            for i, key in zip(b["__index__"], b["__key__"]):
                got[int(i)] = key
                s, j = plan.epoch(0).sample_at(int(i))
                assert s in {sh for sh, _, _ in cut[r]}, (r, i, s)
        ld.close()
    ep = plan.epoch(0)
    assert got == {i: "s{:06d}_{:06d}".format(*ep.sample_at(i)) for i in range(len(ep))}


def test_each_source_keeps_its_own_cache_budget_in_its_own_cache_dir(tmp_path):
    """cache_size is the budget of a cache directory (resumewds.cache): a
    source with its own cache_dir and a small cache_size stays within it,
    evicting and fetching again, while the other source (its own directory,
    no budget) fetches each of its node's shards once over two epochs."""
    from chaos.faultserver import FaultServer
    from resumewds.cache import ShardStore

    root = str(tmp_path / "data")
    for i, (name, n) in enumerate((("a", 4), ("b", 8))):
        d = os.path.join(root, name)
        write_shards(d, shards=n, samples=6, size_range=(300, 300), seed=i)
        with ShardStore(cache_dir=str(tmp_path / "index")) as store:
            rw.build_manifest(os.path.join(d, f"shard-{{000000..{n - 1:06d}}}.tar"),
                              os.path.join(d, "manifest.json"), store=store)
    shard_bytes = os.path.getsize(os.path.join(root, "b", "shard-000000.tar"))
    budget = int(2.5 * shard_bytes)
    srv = FaultServer(root).start()
    try:
        def mk(where: str = "node0") -> rw.MixedDataset:
            a = rw.WebDataset(srv.url + "a/manifest.json", seed=1, shuffle=True, shuffle_window=2,
                              cache_dir=str(tmp_path / where / "cache-a"))
            b = rw.WebDataset(srv.url + "b/manifest.json", seed=2, shuffle="shards",
                              cache_dir=str(tmp_path / where / "cache-b"), cache_size=budget)
            return rw.MixedDataset([a, b], weights=[1, 2], epoch_size=72, seed=5, names=["a", "b"])

        ref = _reference(lambda: mk("ref"), 2, 2)
        srv.reset_counters()
        got = {}
        ld = rw.WebLoader(mk(), batch_size=3, num_workers=0, rank=0, world_size=2, nodes=2,
                          collate_fn=_collate)
        while ld.epoch < 2:
            for b in ld:
                got.update({(x[0], x[1]): x for x in b if not x[5]})
        ld.close()
        assert got == {k: v for k, v in ref.items() if k[1] % 2 == 0}
        reqs = {p: c for p, c in srv.requests.items() if p.endswith(".tar")}
        a_reqs = {p: c for p, c in reqs.items() if p.startswith("/a/")}
        b_reqs = {p: c for p, c in reqs.items() if p.startswith("/b/")}
        assert len(a_reqs) == 2 and set(a_reqs.values()) == {1}  # its partition, once, no budget
        assert len(b_reqs) == 4 and max(b_reqs.values()) > 1  # its partition; evicted, fetched again
        cached_b = sum(os.path.getsize(os.path.join(dp, f)) for dp, _, fs in os.walk(tmp_path / "node0" / "cache-b")
                       for f in fs if f.endswith(".tar") or "." not in f)
        assert 0 < cached_b <= budget, (cached_b, budget)
    finally:
        srv.stop()
