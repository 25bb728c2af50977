"""Mixtures through WebLoader: exact resume at any step, worker count and world size.

Real shards, real DataLoader worker processes, real SQLite journals, a real
HTTP server and real kill -9 of a training script (examples/curriculum.py).
Determinism is equality of whole sequences against an uninterrupted run.
"""

from __future__ import annotations

import os
import random
from typing import Any, Dict, List, Optional, Sequence, Tuple

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import resumewds as rw
from resumewds.errors import JournalConfigMismatch
from resumewds.synth import write_shards

pytestmark = pytest.mark.usefixtures("cache_dir")

# sources of very different sizes: 3, 10, 222, 33 and 200 samples
SHAPES = [(1, 3), (2, 5), (6, 37), (3, 11), (10, 20)]


@pytest.fixture(scope="module")
def data_root(tmp_path_factory) -> str:
    root = str(tmp_path_factory.mktemp("mixdata"))
    for i, (n, m) in enumerate(SHAPES):
        write_shards(os.path.join(root, f"src{i}"), shards=n, samples=m, size_range=(5, 60), seed=i)
    return root


def _sources(root: str, k: int) -> List[List[str]]:
    d = [os.path.join(root, f"src{i}") for i in range(k)]
    return [sorted(os.path.join(x, f) for f in os.listdir(x) if f.endswith(".tar")) for x in d]


def _ident(x: Dict[str, Any]) -> Tuple:
    return (x["__epoch__"], x["__index__"], x["__source__"], x["__shard__"], x["__key__"],
            bool(x.get("__pad__", False)))


def _collate(batch: List[Dict[str, Any]]) -> List[Tuple]:
    return [_ident(x) for x in batch]


class Mix:
    """A factory of identical mixed datasets (a fresh one per loader, as a new process has)."""

    def __init__(self, root: str, k: int, weights: Optional[Sequence[float]], resampled: Any = False,
                 epoch_size: Optional[int] = 60, phases: Any = None, seed: int = 3, **kw: Any):
        self.paths = _sources(root, k)
        self.k, self.weights, self.resampled = k, weights, resampled
        self.epoch_size, self.phases, self.seed, self.kw = epoch_size, phases, seed, kw

    def __call__(self, **over: Any) -> rw.MixedDataset:
        kw = dict(weights=self.weights, resampled=self.resampled, epoch_size=self.epoch_size,
                  phases=self.phases, seed=self.seed, names=[f"s{i}" for i in range(self.k)])
        kw.update(self.kw)
        kw.update(over)
        ds = [rw.WebDataset(p, seed=10 + i, shuffle=[True, "shards", False][i % 3], shuffle_window=2)
              for i, p in enumerate(self.paths)]
        return rw.MixedDataset(ds, **kw)


def _run(mk: Mix, batch: Optional[int], workers: int, world: int, epochs: int, state: Optional[dict] = None,
         steps: Optional[int] = None, remainder: str = "keep"
         ) -> Tuple[Dict[Tuple[int, int], Tuple], List[Tuple], dict]:
    """Run every rank of a world (one after another, in this process).

    Returns the delivered samples by (epoch, index), the padding samples, and
    rank 0's state after ``steps`` steps (or at the end).
    """
    got: Dict[Tuple[int, int], Tuple] = {}
    pads: List[Tuple] = []
    final = None
    for r in range(world):
        ld = rw.WebLoader(mk(), batch_size=batch, num_workers=workers, rank=r, world_size=world,
                          collate_fn=_collate, remainder=remainder)
        if state is not None:
            ld.load_state_dict(state)
        n = 0
        try:
            while ld.epoch < epochs and (steps is None or n < steps):
                for b in ld:
                    for x in (b if batch is not None else [_ident(b)]):
                        if x[5]:
                            pads.append(x)
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
    return got, pads, final


def _reference(mk: Mix, epochs: int) -> Dict[Tuple[int, int], Tuple]:
    """The uninterrupted order, by direct iteration of the mixture (no loader)."""
    out = {}
    for e in range(epochs):
        ds = mk()
        ds.epoch = e
        for x in ds:
            out[(x["__epoch__"], x["__index__"])] = _ident(x)
    return out


def test_loader_equals_direct_iteration_and_sources_keep_their_streams(data_root):
    mk = Mix(data_root, 3, [1, 1, 1], epoch_size=90)
    ref = _reference(mk, 3)
    got, pads, _ = _run(mk, 8, 2, 1, 3)
    assert got == ref and not pads
    # every source is an endless stream: within its own epoch no sample twice
    per: Dict[str, List[Tuple]] = {}
    for key in sorted(ref):
        x = ref[key]
        per.setdefault(x[2], []).append((x[3], x[4]))
    assert len(per["s0"]) == 90 and len(set(per["s0"][:3])) == 3  # 3 samples: 30 passes
    assert len(set(per["s2"])) == 90  # 222 samples: nothing repeated in 90 draws


@settings(max_examples=8, deadline=None, suppress_health_check=list(HealthCheck))
@given(k=st.integers(2, 5), data=st.data())
def test_resume_at_any_step_any_workers_any_world(data_root, k, data):
    weights = data.draw(st.lists(st.integers(1, 9), min_size=k, max_size=k))
    resampled = data.draw(st.sampled_from([False, True, [True, False, True, False, True][:k]]))
    batch = data.draw(st.integers(1, 9))
    w1, w2 = data.draw(st.sampled_from([(1, 1), (1, 2), (2, 3), (3, 1)]))
    nw1, nw2 = data.draw(st.sampled_from([(0, 2), (2, 0), (1, 3), (0, 0)]))
    rem = data.draw(st.sampled_from(["keep", "pad"]))
    mk = Mix(data_root, k, weights, resampled=resampled, epoch_size=data.draw(st.integers(20, 70)),
             block=data.draw(st.sampled_from([1, 1, 16])))
    epochs = 2
    ref = _reference(mk, epochs)
    total = mk().mixplan.epoch_size * epochs
    stop = data.draw(st.integers(1, max(1, total // (batch * w1) - 1)))
    first, pads1, state = _run(mk, batch, nw1, w1, epochs, steps=stop, remainder=rem)
    rest, pads2, _ = _run(mk, batch, nw2, w2, epochs, state=state, remainder=rem)
    assert not set(first) & set(rest), "a position delivered before and after the resume"
    both = dict(first)
    both.update(rest)
    assert both == ref
    for p in pads1 + pads2:  # padding: a real sample of its epoch's start, flagged
        assert p[1] < batch * max(w1, w2)


def test_unbatched_loader_yields_the_mixture_sample_by_sample(data_root):
    mk = Mix(data_root, 4, [1, 5, 2, 2], resampled=True, epoch_size=45)
    ref = _reference(mk, 2)
    got, pads, _ = _run(mk, None, 2, 1, 2)
    assert got == ref and not pads
    first, _, state = _run(mk, None, 0, 1, 2, steps=50)
    rest, _, _ = _run(mk, None, 3, 1, 2, state=state)
    assert len(first) == 50 and {**first, **rest} == ref and not set(first) & set(rest)


def test_resampled_mixture_draws_shards_with_replacement(data_root):
    mk = Mix(data_root, 5, [1, 1, 1, 1, 4], resampled=[False, False, False, False, True], epoch_size=400)
    ref = _reference(mk, 1)
    big = [(x[3], x[4]) for x in ref.values() if x[2] == "s4"]
    # one resampled epoch of the 200-sample source: 10 shard draws with replacement
    assert len(big) == 200 and len(set(big)) < 200 and len({s for s, _ in big}) < 10
    plain = _reference(Mix(data_root, 5, [1, 1, 1, 1, 4], epoch_size=400), 1)
    assert len({(x[3], x[4]) for x in plain.values() if x[2] == "s4"}) == 200
    assert [x[2] for x in plain.values()] == [x[2] for x in ref.values()]  # same interleave


def test_stats_report_delivered_against_requested(data_root):
    mk = Mix(data_root, 3, [5, 3, 2], epoch_size=100)
    ld = rw.WebLoader(mk(), batch_size=10, num_workers=0, collate_fn=_collate)
    seen = {"s0": 0, "s1": 0, "s2": 0}
    for i, b in enumerate(ld):
        for x in b:
            seen[x[2]] += 1
        if i == 4:
            break
    mx = ld.stats()["mixture"]
    ld.close()
    assert mx["global_position"] == 50
    for s in mx["sources"]:
        assert s["delivered"] == seen[s["name"]]
        assert abs(s["deviation"]) < s["bound"]
    assert [round(s["requested_fraction"], 3) for s in mx["sources"]] == [0.5, 0.3, 0.2]


def _journal_run(mk: Mix, journal: str, steps: Optional[int], epochs: int, batch: int = 6,
                 workers: int = 0, **over: Any) -> List[List[Tuple]]:
    ld = rw.WebLoader(mk(**over), batch_size=batch, num_workers=workers, collate_fn=_collate,
                      journal=journal, resume=True)
    out: List[List[Tuple]] = []
    step = ld.steps_done
    try:
        while ld.epoch < epochs and (steps is None or len(out) < steps):
            for b in ld:
                out.append(b)
                ld.commit(step)
                step += 1
                if steps is not None and len(out) >= steps:
                    break
    finally:
        ld.close()
    return out


def test_curriculum_phase_declared_at_resume_is_recorded_and_exact(data_root, tmp_path):
    w0, w1 = [3, 1, 0], [1, 1, 2]  # source 2 is added by the second phase
    at = 9 * 6  # step 9 at batch 6, one rank
    planned = Mix(data_root, 3, w0, phases=[(at, w1)], epoch_size=50)
    ref = _journal_run(planned, str(tmp_path / "ref.db"), None, 3)

    j = str(tmp_path / "run.db")
    mk0 = Mix(data_root, 3, w0, epoch_size=50)
    a = _journal_run(mk0, j, 7, 3)  # phase 0 only, stopped at step 6
    assert all(x[2] != "s2" for b in a for x in b)
    with pytest.raises(JournalConfigMismatch, match="mixture_phases"):
        _journal_run(Mix(data_root, 3, [2, 1, 0], epoch_size=50), j, 1, 3)  # weights changed silently
    with pytest.raises(JournalConfigMismatch, match="mixture_phases"):
        _journal_run(Mix(data_root, 3, w0, phases=[(5 * 6, w1)], epoch_size=50), j, 1, 3)  # in the past
    with pytest.raises(JournalConfigMismatch, match="mixture_sources"):
        _journal_run(Mix(data_root, 4, w0 + [0], epoch_size=50), j, 1, 3)  # a source added silently
    b = _journal_run(planned, j, 10, 3, workers=2)  # the declared phase, at a later step
    c = _journal_run(planned, j, None, 3, workers=1)  # and a plain resume after it
    assert a + b + c == ref
    from resumewds.journal import Journal

    with Journal(j) as jr:
        changes = [e for e in jr.events("config_change") if e["detail"]["key"] == "mixture_phases"]
        assert jr.config()["mixture_phases"] == [[0, [3, 1, 0]], [at, [1, 1, 2]]]
    assert len(changes) == 1 and changes[0]["detail"]["old"] == [[0, [3, 1, 0]]]


def test_random_mix_signature(data_root):
    paths = _sources(data_root, 2)
    a = rw.WebDataset(paths[0], seed=1)
    b = rw.WebDataset(paths[1], seed=2)
    mix = rw.RandomMix([a, b], probs=[0.5, 0.5])
    assert mix.mixplan.epoch_size == 6  # source 0 has 3 samples: it runs out after 6 positions
    xs = list(mix)
    assert [x["__source__"] for x in xs].count(mix.names[0]) == 3
    longest = rw.RandomMix([rw.WebDataset(paths[0]), rw.WebDataset(paths[1])], longest=True)
    ys = list(longest)
    assert len(ys) == 13 and len({(x["__source__"], x["__key__"]) for x in ys}) == 13
    with pytest.raises(ValueError, match="probs"):
        rw.RandomMix([a, b], probs=[1.0])
    with pytest.raises(TypeError, match="not a resumewds.WebDataset"):
        rw.MixedDataset([a, [1, 2]])
    with pytest.raises(ValueError, match="batched"):
        rw.MixedDataset([rw.WebDataset(paths[0]).batched(2), b])


def _names(batch: List[Any]) -> List[str]:
    """A batch stage: each sample's source and key (the mapped batch)."""
    return [f"{x.get('__source__', '-')}/{x['__key__']}" for x in batch]


@pytest.mark.parametrize("partial", [True, False])
def test_a_batched_mapped_mixture_iterated_directly_runs_its_stages(data_root, partial):
    """``mix.batched(5, collation_fn=None).map(f)`` iterated directly: batches of 5 of the mixed
    stream, each through ``f``, as a single data set's ``.batched(5, collation_fn=None).map(f)``
    (both compared whole against their unbatched streams); the same under a WebLoader, and from
    a loader's state after two batches."""
    paths = _sources(data_root, 4)

    def mix(batched: bool = True) -> Any:
        m = rw.RandomMix([rw.WebDataset(paths[1], seed=1), rw.WebDataset(paths[2], seed=2)],
                         probs=[0.5, 0.5]).with_epoch(23)
        return m.batched(5, collation_fn=None, partial=partial).map(_names) if batched else m

    def single(batched: bool = True) -> Any:
        ds = rw.WebDataset(paths[3], seed=2, shuffle=True)  # 33 samples
        return ds.batched(5, collation_fn=None, partial=partial).map(_names) if batched else ds

    for make, n in ((single, 33), (mix, 23)):
        items = [_names([x])[0] for x in make(batched=False)]
        assert len(items) == n
        want = [items[i:i + 5] for i in range(0, n, 5) if partial or i + 5 <= n]
        assert list(make()) == want, make.__name__
    # under a WebLoader (its remainder rules the last batch), and resumed after two batches
    ld = rw.WebLoader(mix(), batch_size=None, remainder="keep" if partial else "drop")
    assert list(ld) == want
    ld = rw.WebLoader(mix(), batch_size=None, remainder="keep" if partial else "drop")
    it = iter(ld)
    head = [next(it), next(it)]
    state = ld.state_dict()
    again = rw.WebLoader(mix(), batch_size=None, remainder="keep" if partial else "drop")
    again.load_state_dict(state)
    assert head + list(again) == want


# ---- kill -9 of a training script over HTTP with faults ---------------------------------

@pytest.mark.slow
def test_curriculum_script_survives_kill9_over_http(tmp_path):
    """examples/curriculum.py killed 5 times (restarts with 0, 3, 1 workers), faults injected."""
    from chaos.mixcrash import campaign

    rep = campaign(str(tmp_path), 5, random.Random(7), faults="mixed:0.08")
    assert not rep.errors, rep.errors
    assert len(rep.expected) == 40 and rep.kills == 5 and rep.runs >= 6
    assert sum(rep.faults.values()) >= 5, rep.faults  # the 5 scripted ones at least
    assert rep.committed == rep.expected


def test_state_dict_refuses_other_sources_or_first_weights(data_root):
    mk = Mix(data_root, 2, [1, 1], epoch_size=30)
    ld = rw.WebLoader(mk(), batch_size=4, collate_fn=_collate)
    next(iter(ld))
    state = ld.state_dict()
    ld.close()
    for other in (Mix(data_root, 2, [1, 2], epoch_size=30), Mix(data_root, 3, [1, 1, 0], epoch_size=30),
                  Mix(data_root, 2, [1, 1], epoch_size=30, seed=4)):
        fresh = rw.WebLoader(other(), batch_size=4, collate_fn=_collate)
        with pytest.raises(rw.StateError, match="manifest"):
            fresh.load_state_dict(state)
        fresh.close()
    same = rw.WebLoader(mk(), batch_size=4, num_workers=2, collate_fn=_collate)
    same.load_state_dict(state)
    assert same.position == 4
    same.close()


def test_status_shows_the_mixture_from_the_journal_alone(data_root, tmp_path):
    from resumewds.journal._status import status
    from resumewds.mixing import format_mixture, mixture_status

    mk = Mix(data_root, 3, [1, 1, 0], phases=[(24, {2: 1.0, 0: 1.0})], epoch_size=80)
    j = str(tmp_path / "st.db")
    ld = rw.WebLoader(mk(), batch_size=4, num_workers=0, collate_fn=_collate, journal=j)
    for step, _ in enumerate(ld):
        ld.commit(step)
        if step == 11:
            break
    live = ld.stats()["mixture"]
    ld.close()
    st = status(j)
    assert st["config"]["mixture_phases"] == [[0, [1, 1, 0]], [24, [1, 0, 1]]]
    got = mixture_status(st["config"], st["latest"]["epoch"], st["latest"]["position"])
    assert got == live and got["phase"] == 1 and got["global_position"] == 48
    assert [s["delivered"] for s in got["sources"]] == [24, 12, 12]
    text = format_mixture(got)
    assert "s2  12 samples (0.250), requested 0.500" in text
    assert mixture_status({"samples": 10}, 0, 0) is None
