"""Tests for resumewds.plan: the pure order and the world layout (hypothesis)."""

from __future__ import annotations

from collections import Counter
from typing import List

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from resumewds.plan import Layout, Plan, mix, worker_steps
from resumewds.plan._keyed import permutation
from resumewds.plan._layout import REMAINDERS
from resumewds.plan._plan import ORDERS

counts_st = st.lists(st.integers(0, 30), min_size=1, max_size=12)


def order(plan: Plan, epoch: int) -> List[tuple]:
    ep = plan.epoch(epoch)
    return [ep.sample_at(i) for i in range(len(ep))]


def all_pairs(counts: List[int]) -> List[tuple]:
    return [(s, j) for s, c in enumerate(counts) for j in range(c)]


@settings(max_examples=150, deadline=None)
@given(counts=counts_st, seed=st.integers(0, 2**64 - 1), window=st.integers(1, 6),
       epoch=st.integers(0, 1000), algo=st.sampled_from([True, "window", "shards", False, "none"]))
def test_every_epoch_is_a_permutation(counts, seed, window, epoch, algo):
    plan = Plan(counts, seed=seed, shuffle=algo, window=window)
    seq = order(plan, epoch)
    assert len(seq) == plan.total == sum(counts)
    assert sorted(seq) == all_pairs(counts)
    ep = plan.epoch(epoch)
    with pytest.raises(IndexError):
        ep.sample_at(len(ep))
    with pytest.raises(IndexError):
        ep.sample_at(-1)
    # random access agrees with sequential access (cache eviction included)
    for i in reversed(range(0, len(seq), 7)):
        assert ep.sample_at(i) == seq[i]


@settings(max_examples=100, deadline=None)
@given(counts=counts_st, seed=st.integers(0, 2**32), window=st.integers(1, 6),
       epoch=st.integers(0, 50))
def test_windows_hold_their_shards_and_shards_mode_keeps_sample_order(counts, seed, window, epoch):
    plan = Plan(counts, seed=seed, shuffle=True, window=window)
    ep = plan.epoch(epoch)
    for i in range(len(ep)):
        s, _ = ep.sample_at(i)
        assert s in ep.window_shards(ep.window_of(i))
    seq = order(Plan(counts, seed=seed, shuffle="shards"), epoch)
    for s in range(len(counts)):
        assert [j for (t, j) in seq if t == s] == list(range(counts[s]))
    # shards stay contiguous in "shards" mode
    firsts = [t for k, (t, _) in enumerate(seq) if k == 0 or seq[k - 1][0] != t]
    assert len(firsts) == len(set(firsts))


@settings(max_examples=60, deadline=None)
@given(counts=st.lists(st.integers(5, 30), min_size=3, max_size=10), seed=st.integers(0, 2**32),
       window=st.integers(1, 4), epoch=st.integers(0, 100))
def test_epochs_and_seeds_differ(counts, seed, window, epoch):
    plan = Plan(counts, seed=seed, shuffle=True, window=window)
    assert order(plan, epoch) != order(plan, epoch + 1)
    assert order(plan, epoch) != order(Plan(counts, seed=seed + 1, shuffle=True, window=window), epoch)


@settings(max_examples=60, deadline=None)
@given(counts=counts_st, seed=st.integers(0, 2**32), epoch=st.integers(0, 100))
def test_no_shuffle_is_manifest_order(counts, seed, epoch):
    assert order(Plan(counts, seed=seed, shuffle=False), epoch) == all_pairs(counts)
    assert order(Plan(counts, seed=seed, shuffle="none"), epoch) == all_pairs(counts)


@settings(max_examples=40, deadline=None)
@given(counts=counts_st, seed=st.integers(0, 2**64 - 1), window=st.integers(1, 6),
       epoch=st.integers(0, 1000))
def test_deterministic_across_instances(counts, seed, window, epoch):
    a = Plan(counts, seed=seed, shuffle=True, window=window)
    b = Plan(counts, seed=seed, shuffle=True, window=window)
    for e in (epoch, epoch + 1, epoch):  # the epoch cache must not change anything
        assert order(a, e) == order(b, e)


def test_pinned_orders():
    """Known values: a change of algorithm that silently changes the order
    every existing run and journal depends on must fail here."""
    p = Plan([3, 2, 4], seed=7, shuffle=True, window=2)
    assert order(p, 0) == [(1, 0), (1, 1), (0, 0), (0, 1), (0, 2), (2, 0), (2, 1), (2, 3), (2, 2)]
    assert order(p, 1) == [(1, 0), (0, 0), (0, 1), (1, 1), (0, 2), (2, 2), (2, 1), (2, 0), (2, 3)]
    q = Plan([10000] * 100, seed=1, shuffle=True, window=8).epoch(0)
    assert [q.sample_at(i) for i in range(4)] == [(2, 6282), (94, 1776), (94, 6416), (45, 2642)]
    p = Plan([3, 2, 4], seed=7, shuffle="shards")
    assert order(p, 0) == [(1, 0), (1, 1), (0, 0), (0, 1), (0, 2), (2, 0), (2, 1), (2, 2), (2, 3)]
    assert mix(1, 2) == 571542372673154031
    assert permutation(10, 5) == [9, 0, 8, 1, 4, 3, 5, 2, 6, 7]


def test_plan_argument_validation():
    with pytest.raises(ValueError):
        Plan([1], shuffle="bogus")
    with pytest.raises(ValueError):
        Plan([1], window=0)
    assert {"window", "shards", "none"} <= set(ORDERS)  # + the WebDataset drop-in orders
    assert Plan([1, 2], seed=3, shuffle=True, window=4).describe() == \
        {"seed": 3, "shuffle": "window", "shuffle_window": 4}
    assert Plan([1], shuffle="shards").describe()["shuffle_window"] is None


def test_shards_from():
    ep = Plan([3, 2, 4, 1], seed=1, shuffle=True, window=2).epoch(0)
    need = ep.shards_from(0, 10)
    assert sorted(need) == [0, 1, 2, 3]
    assert need[:2] == ep.window_shards(0)
    assert ep.shards_from(len(ep), 3) == []


# ---------------------------------------------------------------------------
# Layout
# ---------------------------------------------------------------------------

@settings(max_examples=300, deadline=None)
@given(total=st.integers(1, 80), batch=st.integers(1, 9), world=st.integers(1, 4),
       remainder=st.sampled_from(REMAINDERS), data=st.data())
def test_layout_covers_each_position_once(total, batch, world, remainder, data):
    start = data.draw(st.integers(0, total), label="start")
    layouts = [Layout(batch, world, r, remainder) for r in range(world)]
    nsteps = layouts[0].num_steps(total, start)
    assert all(lay.num_steps(total, start) == nsteps for lay in layouts)
    real = Counter()
    step_size = batch * world
    for k in range(nsteps):
        per_rank = [lay.slots(total, start, k) for lay in layouts]
        for r, slots in enumerate(per_rank):
            assert slots, f"rank {r} has an empty batch at step {k}"  # same number of batches
            assert len(slots) <= batch
            for pos, pad in slots:
                assert 0 <= pos < total
                if pad:
                    assert remainder in ("keep", "pad") and k == nsteps - 1
                else:
                    real[pos] += 1
        # positions of a step are consecutive, rank by rank
        flat_real = [p for slots in per_rank for p, pad in slots if not pad]
        assert flat_real == sorted(flat_real)
        if remainder == "pad" or (k < nsteps - 1):
            assert all(len(s) == batch for s in per_rank)
        # the position after step k is where step k+1 starts (or the end)
        after = layouts[0].position_after(total, start, k)
        assert after == (total if k == nsteps - 1 else start + (k + 1) * step_size)
    covered = sorted(real)
    assert all(v == 1 for v in real.values())
    if remainder == "drop":
        full = (total - start) // step_size
        assert covered == list(range(start, start + full * step_size))
    else:
        assert covered == list(range(start, total))
    assert layouts[0].slots(total, start, nsteps) == []


def test_layout_pads_are_flagged_examples():
    # keep: 2 samples left for 4 ranks -> ranks 2, 3 get one pad each
    got = [Layout(3, 4, r, "keep").slots(14, 12, 0) for r in range(4)]
    assert got == [[(12, False)], [(13, False)], [(0, True)], [(1, True)]]
    # pad: fill the last step from the start of the epoch
    got = [Layout(2, 2, r, "pad").slots(5, 4, 0) for r in range(2)]
    assert got == [[(4, False), (0, True)], [(1, True), (2, True)]]
    # keep, enough left: contiguous parts whose sizes differ by at most one
    got = [Layout(4, 3, r, "keep").slots(12 + 7, 12, 0) for r in range(3)]
    assert [[p for p, _ in s] for s in got] == [[12, 13, 14], [15, 16], [17, 18]]
    assert Layout(4, 3, 0, "drop").num_steps(19, 12) == 0


def test_layout_validation_and_worker_steps():
    with pytest.raises(ValueError):
        Layout(0)
    with pytest.raises(ValueError):
        Layout(1, world_size=2, rank=2)
    with pytest.raises(ValueError):
        Layout(1, remainder="odd")
    assert list(worker_steps(7, 1, 3)) == [1, 4]
    assert list(worker_steps(3, 0, 0)) == [0, 1, 2]
    parts = [list(worker_steps(11, w, 4)) for w in range(4)]
    assert sorted(x for p in parts for x in p) == list(range(11))


# ---------------------------------------------------------------------------
# partitions (node-local plan) and node layouts
# ---------------------------------------------------------------------------

@settings(max_examples=150, deadline=None)
@given(counts=counts_st, seed=st.integers(0, 2**64 - 1), window=st.integers(1, 6),
       epoch=st.integers(0, 1000), parts=st.integers(1, 7),
       algo=st.sampled_from(["window", "shards", "none"]))
def test_partitioned_epochs_are_permutations_and_partitions_are_fixed(counts, seed, window, epoch,
                                                                      parts, algo):
    plan = Plan(counts, seed=seed, shuffle=algo, window=window, partitions=parts)
    seq = order(plan, epoch)
    assert sorted(seq) == all_pairs(counts)
    ep = plan.epoch(epoch)
    for i in reversed(range(0, len(seq), 5)):
        assert ep.sample_at(i) == seq[i]
        assert ep.position(ep.local(i)) == i
    # a step's lookups at once: any run of positions, in any order
    assert ep.samples_at(range(len(seq))) == seq
    back = list(range(len(seq)))[::-3]
    assert ep.samples_at(back) == [seq[p] for p in back]
    with pytest.raises(IndexError):
        ep.samples_at([0, len(seq)])
    # partition q holds the positions p % P == q, and the same samples every epoch
    nxt = order(plan, epoch + 1)
    for q in range(parts):
        mine = {seq[p] for p in range(q, len(seq), parts)}
        assert mine == {nxt[p] for p in range(q, len(nxt), parts)}
        assert {s for s, _ in mine} <= set(ep.partition_shards(q))
        # a position's window belongs to its partition
        for p in range(q, len(seq), parts):
            assert ep.partition_of_window(ep.window_of(p)) == q
            assert seq[p][0] in ep.window_shards(ep.window_of(p))
    if algo == "none":
        c, rem = divmod(len(seq), parts)
        runs = [all_pairs(counts)[q * c + min(q, rem):(q + 1) * c + min(q + 1, rem)] for q in range(parts)]
        assert [seq[p] for p in range(0, len(seq), parts)] == runs[0]


def test_one_partition_is_the_unpartitioned_order():
    for algo in ("window", "shards", "none"):
        for counts in ([3, 0, 5, 2, 7], [10000] * 20):
            a = Plan(counts, seed=11, shuffle=algo, window=3)
            b = Plan(counts, seed=11, shuffle=algo, window=3, partitions=1)
            assert order(a, 4) == order(b, 4)


def test_cut_partitions_splits_at_most_one_shard_per_boundary():
    from resumewds.plan._epoch import cut_partitions

    counts = [7, 0, 3, 9, 1, 4]
    parts = cut_partitions(counts, [3, 1, 0, 5, 2, 4], 4)
    assert [sum(n for _, _, n in p) for p in parts] == [6, 6, 6, 6]
    pieces = Counter(s for p in parts for s, _, n in p if n)
    assert sum(v - 1 for v in pieces.values()) <= 3
    for s in range(len(counts)):  # each shard's pieces cover it exactly once
        got = sorted((f, n) for p in parts for t, f, n in p if t == s and n)
        pos = 0
        for f, n in got:
            assert f == pos
            pos += n
        assert pos == counts[s]
    assert cut_partitions([2], [0], 3) == [[(0, 0, 1)], [(0, 1, 1)], []]


def test_pinned_partitioned_order():
    """Known values of the two-partition order (see test_pinned_orders)."""
    p = Plan([3, 2, 4], seed=7, shuffle=True, window=2, partitions=2)
    assert order(p, 0) == [(1, 0), (1, 1), (2, 0), (0, 0), (2, 1), (0, 2), (2, 2), (0, 1), (2, 3)]
    assert p.describe() == {"seed": 7, "shuffle": "window", "shuffle_window": 2, "partitions": 2}
    with pytest.raises(ValueError, match="partitions"):
        Plan([1], partitions=0)


def test_shards_from_stays_in_its_partition():
    ep = Plan([5] * 12, seed=3, shuffle=True, window=2, partitions=3).epoch(1)
    for p in range(3):
        need = ep.shards_from(p, 100)
        assert set(need) == set(ep.partition_shards(p % 3))
        assert need[:2] == ep.window_shards(ep.window_of(p))


@settings(max_examples=300, deadline=None)
@given(total=st.integers(1, 90), batch=st.integers(1, 6), nodes=st.integers(1, 4),
       per_node=st.integers(1, 3), remainder=st.sampled_from(REMAINDERS), data=st.data())
def test_node_layout_covers_each_position_once_with_equal_batches(total, batch, nodes, per_node,
                                                                  remainder, data):
    world = nodes * per_node
    start = data.draw(st.integers(0, total), label="start")
    layouts = [Layout(batch, world, r, remainder, nodes=nodes) for r in range(world)]
    flat = Layout(batch, world, 0, remainder)
    nsteps = flat.num_steps(total, start)
    real = Counter()
    for k in range(nsteps):
        per_rank = [lay.slots(total, start, k) for lay in layouts]
        step_real = []
        for r, slots in enumerate(per_rank):
            assert slots and len(slots) <= batch
            n = r // per_node
            for pos, pad in slots:
                assert 0 <= pos < total
                if not pad:
                    real[pos] += 1
                    step_real.append(pos)
                    assert pos % nodes == n  # the node's own positions
                elif remainder == "keep":
                    assert pos % nodes == n or total < world  # no wrap-around
        # the same set of positions per step as without nodes: a contiguous range
        flat_pos = sorted(p for r in range(world) for p, pad in flat.slots(total, start, k, r) if not pad)
        assert sorted(step_real) == flat_pos
        if remainder == "pad" or k < nsteps - 1:
            assert all(len(s) == batch for s in per_rank)
        elif remainder == "keep":  # the short step: sizes differ by at most one
            sizes = [len(s) for s in per_rank]
            assert max(sizes) - min(sizes) <= 1
    assert all(v == 1 for v in real.values())
    if nodes == 1:
        assert [lay.slots(total, start, k) for lay in layouts for k in range(nsteps)] == \
            [flat.slots(total, start, k, r) for r in range(world) for k in range(nsteps)]


@settings(max_examples=40, deadline=None)
@given(shards=st.integers(8, 40), samples=st.integers(1, 30), nodes=st.sampled_from([1, 2, 3, 4]),
       mult=st.integers(1, 3), batch=st.integers(1, 5), seed=st.integers(0, 2**32))
def test_a_node_reads_only_its_partitions(shards, samples, nodes, mult, batch, seed):
    """nodes | partitions: the shards a node's ranks touch are its partitions'
    shards, at most ~1/nodes of the data plus one split shard per boundary."""
    parts = nodes * mult
    counts = [samples] * shards
    plan = Plan(counts, seed=seed, shuffle=True, window=3, partitions=parts)
    ep = plan.epoch(2)
    total, L = len(ep), 2
    touched = {n: set() for n in range(nodes)}
    for r in range(nodes * L):
        lay = Layout(batch, nodes * L, r, "keep", nodes=nodes)
        for k in range(lay.num_steps(total, 0)):
            for pos, _pad in lay.slots(total, 0, k):
                touched[r // L].add(ep.sample_at(pos)[0])
    for n, got in touched.items():
        allowed = {s for q in range(n, parts, nodes) for s in ep.partition_shards(q)}
        assert got <= allowed
        assert len(got) <= -(-shards // nodes) + 2 * mult


@settings(max_examples=120, deadline=None)
@given(counts=st.lists(st.integers(0, 25), min_size=1, max_size=10), parts=st.integers(1, 6),
       seed=st.integers(0, 2**32), data=st.data())
def test_elastic_schedule_continues_exactly(counts, parts, seed, data):
    """Runs that change batch size, node count and ranks per node at step
    boundaries (resumes from the committed position) deliver the epoch's
    sequence exactly once, in order, with the run's partitions."""
    ep = Plan(counts, seed=seed, shuffle=True, window=2, partitions=parts).epoch(3)
    total = len(ep)
    pos, got = 0, []
    while pos < total:
        batch = data.draw(st.integers(1, 4), label="batch")
        nodes = data.draw(st.integers(1, 3), label="nodes")
        per = data.draw(st.integers(1, 3), label="ranks per node")
        lays = [Layout(batch, nodes * per, r, "keep", nodes=nodes) for r in range(nodes * per)]
        n = lays[0].num_steps(total, pos)
        run = data.draw(st.integers(1, n), label="steps before the next change")
        for k in range(run):
            step = sorted(p for lay in lays for p, pad in lay.slots(total, pos, k) if not pad)
            got.extend(step)
        pos = lays[0].position_after(total, pos, run - 1)
    assert got == list(range(total))
    assert [ep.sample_at(p) for p in got] == order(Plan(counts, seed=seed, shuffle=True, window=2,
                                                        partitions=parts), 3)


def _feistel_reference(m: int, key: int, i: int) -> int:
    """FeistelPermutation's definition, written out: 4 rounds of xxh3_64 of
    one half (packed as 8 little-endian bytes, keyed per round), cycle-walked."""
    import struct

    import xxhash

    bits = max(2, (m - 1).bit_length())
    a = bits // 2
    b = bits - a
    keys = [mix(key, r) for r in range(4)]
    x = i
    while True:
        left, right = x >> b, x & ((1 << b) - 1)
        for r, k in enumerate(keys):
            width = a if r % 2 == 0 else b
            left, right = right, left ^ (xxhash.xxh3_64_intdigest(struct.pack("<Q", right), k) & ((1 << width) - 1))
        x = (left << b) | right
        if x < m:
            return x


@pytest.mark.parametrize("m", [2, 3, 5, 17, 100, 1000, 4097, 70_000])
@pytest.mark.parametrize("key", [0, 7, 2**63 + 5])
def test_tabulated_feistel_is_the_hashed_one(m, key):
    """The round functions looked up in tables (halves of up to TABLE_BITS
    bits) give the very permutation the definition hashes for."""
    from resumewds.plan._plan import FeistelPermutation

    class Hashed(FeistelPermutation):
        __slots__ = ()
        TABLE_BITS = -1  # never tabulated

    p, q = FeistelPermutation(m, key), Hashed(m, key)
    got = [p[i] for i in range(m)]
    assert got == [q[i] for i in range(m)]
    assert sorted(got) == list(range(m))
    assert all(got[i] == _feistel_reference(m, key, i) for i in range(0, m, max(1, m // 200)))


def test_large_feistel_is_hashed_per_lookup_as_defined():
    from resumewds.plan._plan import FeistelPermutation

    m = (1 << 30) + 12345  # halves of 15 and 16 bits: above TABLE_BITS
    p = FeistelPermutation(m, 11)
    assert [p[i] for i in (0, 1, 999_999, m - 1)] == [_feistel_reference(m, 11, i) for i in (0, 1, 999_999, m - 1)]
