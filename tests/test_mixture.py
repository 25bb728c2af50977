"""The mixing plan (resumewds/mixing/_plan.py): bound, exact counts, phases, streams.

Pure functions only (no I/O, no torch): property tests with hypothesis.
The stated bound: for source i at tree depth d_i (<= ceil(log2 K)), every
prefix of n positions of a phase holds c_i(n) with |c_i(n) - n w_i| < d_i.
"""

from __future__ import annotations

import math
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from resumewds.mixing._plan import MixPlan, SourceStream, Splitter, integer_weights, resampled_epoch

sizes_st = st.lists(st.integers(1, 5000), min_size=2, max_size=5)


def _walk(mp: MixPlan, n: int, start: int = 0):
    """Per-source counts after each position, checking q is the running count."""
    c = list(mp.delivered_global(start))
    for g in range(start, start + n):
        src, q = mp.locate_global(g)
        assert q == c[src], (g, src, q, c)
        c[src] += 1
        yield g + 1, c


@settings(max_examples=60, deadline=None)
@given(sizes=sizes_st, data=st.data(), seed=st.integers(0, 2**63))
def test_prefix_deviation_is_below_the_stated_bound(sizes, data, seed):
    k = len(sizes)
    weights = data.draw(st.lists(st.one_of(st.integers(1, 1000), st.floats(0.01, 100.0)),
                                 min_size=k, max_size=k))
    mp = MixPlan(sizes, weights, seed=seed)
    iw = mp.phase_weights[0]
    w = [x / sum(iw) for x in iw]
    bounds = mp.bounds()
    assert max(bounds) <= math.ceil(math.log2(k))
    start = data.draw(st.integers(0, 10**12))  # any prefix, also far into the run
    base = mp.delivered_global(start)
    for n, c in _walk(mp, 1500, start):
        for i in range(k):
            assert abs(c[i] - n * w[i]) < bounds[i], (i, n, c, w)
        for i in range(k):  # and relative to the prefix start too
            assert abs((c[i] - base[i]) - (n - start) * w[i]) < 2 * bounds[i]
    assert mp.delivered_global(start + 1500) == c


def test_two_sources_never_a_whole_sample_off_and_iid_drifts():
    mp = MixPlan([10**6, 10**6], [0.7, 0.3], seed=11)
    rnd = random.Random(0)
    iid = worst = worst_iid = 0.0
    for n, c in _walk(mp, 200_000):
        worst = max(worst, abs(c[0] - 0.7 * n))
        iid += rnd.random() < 0.7
        worst_iid = max(worst_iid, abs(iid - 0.7 * n))
    print(f"max |c - n w| over 200,000 positions: stratified {worst:.3f}, i.i.d. {worst_iid:.1f}")
    assert worst < 1.0
    assert worst_iid > 20  # what webdataset's RandomMix-style draws give


@settings(max_examples=40, deadline=None)
@given(sizes=sizes_st, data=st.data(), seed=st.integers(0, 2**32))
def test_repeat_and_choose_give_exact_counts_every_epoch(sizes, data, seed):
    k = len(sizes)
    kind = data.draw(st.lists(st.sampled_from(["repeat", "choose", "none"]), min_size=k, max_size=k))
    repeat = [data.draw(st.sampled_from([0.5, 1, 2, 3])) if t == "repeat" else None for t in kind]
    choose = [data.draw(st.integers(1, 300)) if t == "choose" else None for t in kind]
    mp = MixPlan(sizes, repeat=repeat, choose=choose, seed=seed)
    want = [int(r * s) if r is not None else (c if c is not None else s)
            for r, c, s in zip(repeat, choose, sizes)]
    if any(int(r * s) != r * s for r, s in zip(repeat, sizes) if r is not None):
        return  # a fractional count per epoch: exact only on average
    assert mp.epoch_size == sum(want)
    for e in (0, 1, 7):
        a, b = mp.delivered(e, 0), mp.delivered(e + 1, 0)
        assert [y - x for x, y in zip(a, b)] == want


def test_weights_share_the_rest_of_an_epoch_beside_absolute_counts():
    mp = MixPlan([100, 50, 20], [1, 3, None], choose=[None, None, 20], epoch_size=120)
    assert mp.phase_weights[0] == [5, 15, 4]  # 25 / 75 / 20 per 120
    assert [b - a for a, b in zip(mp.delivered(0, 0), mp.delivered(1, 0))] == [25, 75, 20]


@settings(max_examples=30, deadline=None)
@given(sizes=sizes_st, data=st.data(), seed=st.integers(0, 2**32))
def test_a_phase_keeps_the_past_and_continues_every_stream(sizes, data, seed):
    k = len(sizes)
    w0 = data.draw(st.lists(st.integers(1, 9), min_size=k, max_size=k))
    w1 = data.draw(st.lists(st.integers(0, 9), min_size=k, max_size=k).filter(any))
    at = data.draw(st.integers(1, 3000))
    plain = MixPlan(sizes, w0, seed=seed, epoch_size=777)
    staged = MixPlan(sizes, w0, seed=seed, epoch_size=777, phases=[(at, w1)])
    for g in range(at):
        assert staged.locate_global(g) == plain.locate_global(g)
    seen = [set() for _ in range(k)]
    c = [0] * k
    for g in range(at + 2000):
        src, q = staged.locate_global(g)
        assert q == c[src] and q not in seen[src]  # no index twice, none skipped
        seen[src].add(q)
        c[src] += 1
        if g >= at:
            assert w1[src] > 0  # a source with weight 0 gets nothing from then on
    b1 = staged.bounds(1)  # the new phase's own bound holds from its start
    w1n = [x / sum(w1) for x in w1]
    base = staged.delivered_global(at)
    for n in range(0, 2000, 37):
        d = staged.delivered_global(at + n)
        for i in range(k):
            dev = abs(d[i] - base[i] - n * w1n[i])
            assert dev < b1[i] if b1[i] else dev < 1e-9  # bound 0: exact (alone, or weight 0)


def test_a_zero_weight_source_changes_nothing():
    a = MixPlan([10, 20, 30], [1, 2, 3], seed=5)
    b = MixPlan([10, 20, 30, 40], [1, 2, 3, 0], seed=5)
    assert [a.locate_global(g) for g in range(500)] == [b.locate_global(g) for g in range(500)]


def test_locate_is_o1_far_into_the_run():
    mp = MixPlan([10**6, 3, 77, 10**4, 5], [5, 1, 1, 2, 1], seed=3, phases=[(10**14, [1, 1, 1, 1, 1])])
    g = 10**15 + 12345
    src, q = mp.locate_global(g)
    assert 0 <= src < 5 and q <= g
    assert sum(mp.delivered_global(g)) == g


def test_seed_changes_the_interleave_not_the_counts():
    a, b = MixPlan([50, 50], [1, 3], seed=1), MixPlan([50, 50], [1, 3], seed=2)
    sa = [a.locate_global(g)[0] for g in range(400)]
    sb = [b.locate_global(g)[0] for g in range(400)]
    assert sa != sb and sa.count(0) == sb.count(0) == 100


def test_integer_weights_and_bad_input():
    assert integer_weights([0.3, 0.7]) == [3, 7]
    assert integer_weights([2, 4, 0]) == [1, 2, 0]
    for bad in ([0, 0], [-1, 2], [float("nan"), 1], [float("inf"), 1]):
        with pytest.raises(ValueError):
            integer_weights(bad)
    with pytest.raises(ValueError, match="one of weight, repeat, choose"):
        MixPlan([5, 5], [1, 1], choose=[3, None])
    with pytest.raises(ValueError, match="more than the epoch size"):
        MixPlan([5, 5], [1, None], choose=[None, 50], epoch_size=10)
    with pytest.raises(ValueError, match="increasing"):
        MixPlan([5, 5], [1, 1], phases=[(10, [1, 0]), (10, [0, 1])])
    with pytest.raises(ValueError, match="unknown sources"):
        MixPlan([5, 5], [1, 1], phases=[(10, {3: 1.0})])
    with pytest.raises(ValueError, match="has no samples"):
        MixPlan([5, 0], [1, 1])
    with pytest.raises(ValueError, match="2 weights for 3"):
        MixPlan([5, 5, 5], [1, 1, 1], phases=[(4, [1, 2])])


def test_splitter_counts_match_locate():
    sp = Splitter([3, 0, 5, 1, 8], key=9)
    c = [0] * 5
    for j in range(2000):
        s, i = sp.locate(j)
        assert i == c[s]
        c[s] += 1
        if j % 97 == 0:
            assert sp.counts(j + 1) == c
    assert c[1] == 0


# ---- per-source endless streams -------------------------------------------------

@settings(max_examples=30, deadline=None)
@given(counts=st.lists(st.integers(0, 40), min_size=1, max_size=12).filter(lambda c: sum(c) > 0),
       seed=st.integers(0, 2**32), shuffle=st.sampled_from([True, False, "shards"]))
def test_a_source_stream_is_each_epoch_a_permutation(counts, seed, shuffle):
    st_ = SourceStream(counts, seed=seed, shuffle=shuffle, window=3)
    n = sum(counts)
    want = sorted((s, j) for s, c in enumerate(counts) for j in range(c))
    for r in (0, 1, 5):
        assert sorted(st_.at(r * n + o) for o in range(n)) == want


@settings(max_examples=30, deadline=None)
@given(counts=st.lists(st.integers(1, 40), min_size=1, max_size=12),
       seed=st.integers(0, 2**32), shuffle=st.sampled_from([True, False]))
def test_resampled_epochs_have_the_data_set_size_and_draw_with_replacement(counts, seed, shuffle):
    n = sum(counts)
    ep, draws = resampled_epoch(counts, seed, 3, shuffle, 4)
    assert len(ep) == n
    st_ = SourceStream(counts, seed=seed, shuffle=shuffle, window=4, resampled=True)
    got = [st_.at(3 * n + o) for o in range(n)]
    assert all(0 <= s < len(counts) and 0 <= j < counts[s] for s, j in got)
    again = SourceStream(counts, seed=seed, shuffle=shuffle, window=4, resampled=True)
    assert [again.at(3 * n + o) for o in range(n)] == got  # pure: a fresh object agrees


def test_resampling_repeats_shards_within_an_epoch():
    counts = [5] * 50
    _, draws = resampled_epoch(counts, 1, 0, True, 8)
    assert len(draws) == 50 and len(set(draws)) < 45  # ~ 1 - 1/e distinct, not all
    _, other = resampled_epoch(counts, 1, 1, True, 8)
    assert draws != other


# ---- block jitter: a random-looking pattern, still a deterministic bound ----------------

@settings(max_examples=40, deadline=None)
@given(sizes=sizes_st, data=st.data(), seed=st.integers(0, 2**32), block=st.integers(2, 96))
def test_blocks_keep_a_deterministic_bound_and_every_stream_exact(sizes, data, seed, block):
    k = len(sizes)
    w0 = data.draw(st.lists(st.integers(1, 20), min_size=k, max_size=k))
    w1 = data.draw(st.lists(st.integers(0, 20), min_size=k, max_size=k).filter(any))
    at = data.draw(st.integers(1, 1500))
    mp = MixPlan(sizes, w0, seed=seed, block=block, phases=[(at, w1)])
    at = mp.phase_starts[1]
    assert at % block == 0  # snapped to the next block boundary
    wn = [x / sum(mp.phase_weights[0]) for x in mp.phase_weights[0]]
    pb = mp.prefix_bounds(0)
    seen = [set() for _ in range(k)]
    c = [0] * k
    for g in range(at + 1500):
        src, q = mp.locate_global(g)
        assert q not in seen[src]
        seen[src].add(q)
        c[src] += 1
        if g + 1 <= at:
            for i in range(k):
                assert abs(c[i] - (g + 1) * wn[i]) < pb[i] + 1e-9
        if (g + 1) % block == 0 or g + 1 == at:  # exact at block boundaries: a prefix of each stream
            assert all(s == set(range(n)) for s, n in zip(seen, c))
            assert mp.delivered_global(g + 1) == c
    assert mp.delivered_global(at + 700) == [sum(1 for g in range(at + 700) if mp.locate_global(g)[0] == i)
                                            for i in range(k)]


def test_blocks_break_the_regular_pattern():
    plain = MixPlan([100, 100], [1, 1], seed=1)
    jit = MixPlan([100, 100], [1, 1], seed=1, block=32)
    p = [plain.locate_global(g)[0] for g in range(64)]
    j = [jit.locate_global(g)[0] for g in range(64)]
    runs = sum(1 for a, b in zip(j, j[1:]) if a == b)
    assert sum(1 for a, b in zip(p, p[1:]) if a == b) == 0 and runs > 10
    assert j.count(0) == 32  # still exact per block
