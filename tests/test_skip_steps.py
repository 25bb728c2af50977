"""Loss-spike recovery: rewind to a checkpoint's step and skip the data of the
next K steps (``WebLoader.skip_steps``), journaled, at another worker count
and another world size.  Whole sequences are compared with an uninterrupted
run minus exactly the skipped steps."""

from __future__ import annotations

import pytest

import resumewds as rw
from resumewds.journal import format_status
from resumewds.journal._status import status
from resumewds.plan._plan import Layout
from resumewds.run._skipping import advance

EPOCHS = 2
BATCH = 8


def _ds(shards):
    return rw.WebDataset(shards, seed=3, shuffle=True)


def _steps(loader, epochs=EPOCHS, commit=False, stop_at=None):
    """Every step's keys until ``epochs`` epochs are done (or step ``stop_at``)."""
    out = []
    while loader.epoch < epochs:
        for b in loader:
            step = loader.steps_done if commit else len(out)
            out.append(tuple(b["__key__"]))
            if commit:
                loader.commit(step)
            if stop_at is not None and step >= stop_at:
                return out
    return out


@pytest.fixture
def data(make_shards):
    return make_shards(shards=5, samples=37)  # 185 samples: 24 steps of 8 per epoch (the last of 1)


def test_advance_crosses_epoch_ends():
    lay = Layout(batch_size=4)
    assert advance(lay, lambda e: 10, 0, 0, 0) == (0, 0)
    assert advance(lay, lambda e: 10, 0, 0, 2) == (0, 8)
    assert advance(lay, lambda e: 10, 0, 0, 3) == (0, 10)  # the epoch's last step (2 samples): its end
    assert advance(lay, lambda e: 10, 0, 0, 4) == (1, 4)
    assert advance(lay, lambda e: 10, 0, 8, 1) == (0, 10)
    assert advance(lay, lambda e: 10, 0, 10, 1) == (1, 4)  # from an epoch's end
    assert advance(lay, lambda e: 10, 0, 4, 7) == (2, 8)  # 2 steps left in epoch 0, 3 in epoch 1
    with pytest.raises(ValueError):
        advance(lay, lambda e: 10, 0, 0, -1)


@pytest.mark.parametrize("first,k", [(5, 3), (20, 6)], ids=["mid-epoch", "across-the-epoch-end"])
def test_skip_k_steps_at_another_worker_count(data, tmp_path, first, k):
    ref = _steps(rw.WebLoader(_ds(data), batch_size=BATCH, num_workers=0))
    journal = str(tmp_path / "run.db")
    # the run trains past the spike, then is rewound to the checkpoint of step first - 1
    run = rw.WebLoader(_ds(data), batch_size=BATCH, num_workers=0, journal=journal)
    before = _steps(run, commit=True, stop_at=first + k + 2)
    run.close()
    assert before == ref[:first + k + 3]
    again = rw.WebLoader(_ds(data), batch_size=BATCH, num_workers=2, journal=journal, resume=first - 1)
    assert again.steps_done == first
    detail = again.skip_steps(k, reason="loss spike")
    assert detail["first_step"] == first and detail["steps"] == k
    assert again.steps_done == first + k
    after = _steps(again, commit=True)
    again.close()
    assert ref[:first] + after == ref[:first] + ref[first + k:]
    assert after == ref[first + k:]
    st = status(journal)
    assert [(s["first_step"], s["steps"], s["reason"]) for s in st["skipped_steps"]] == [(first, k, "loss spike")]
    assert st["counts"]["step_skips"] == 1
    assert f"skipped  steps {first}..{first + k - 1} on purpose" in format_status(st)


def test_a_crash_right_after_the_skip_resumes_after_it(data, tmp_path):
    ref = _steps(rw.WebLoader(_ds(data), batch_size=BATCH, num_workers=0))
    journal = str(tmp_path / "run.db")
    run = rw.WebLoader(_ds(data), batch_size=BATCH, journal=journal)
    _steps(run, commit=True, stop_at=9)
    run.close()
    again = rw.WebLoader(_ds(data), batch_size=BATCH, journal=journal, resume=3)
    again.skip_steps(4)
    again.close()  # "killed" before any step of its own: the skip is committed
    last = rw.WebLoader(_ds(data), batch_size=BATCH, num_workers=1, journal=journal, resume=True)
    assert last.steps_done == 8
    assert _steps(last, commit=True) == ref[8:]
    last.close()


def test_skip_at_another_world_size(data, tmp_path):
    """World 1 with batch 8 steps as world 2 with batch 4: skip K steps after an
    elastic resume at world size 2, every rank the same K."""
    ref = _steps(rw.WebLoader(_ds(data), batch_size=BATCH))
    journal = str(tmp_path / "run.db")
    run = rw.WebLoader(_ds(data), batch_size=BATCH, journal=journal)
    _steps(run, commit=True, stop_at=12)
    run.close()
    first, k = 7, 5
    ranks = []
    for r in range(2):
        loader = rw.WebLoader(_ds(data), batch_size=BATCH // 2, rank=r, world_size=2, num_workers=r,
                              journal=journal, resume=first - 1)
        assert loader.steps_done == first
        loader.skip_steps(k)
        steps = []
        while loader.epoch < EPOCHS:
            for b in loader:
                pads = b.get("__pad__")
                steps.append(tuple(key for i, key in enumerate(b["__key__"]) if pads is None or not bool(pads[i])))
        loader.close()
        ranks.append(steps)
    assert [a + b for a, b in zip(*ranks)] == ref[first + k:]


def test_skip_without_a_journal_moves_the_state(data):
    ref = _steps(rw.WebLoader(_ds(data), batch_size=BATCH))
    a = rw.WebLoader(_ds(data), batch_size=BATCH)
    _steps(a, stop_at=3)
    state = a.state_dict()
    b = rw.WebLoader(_ds(data), batch_size=BATCH, num_workers=2)
    b.load_state_dict(state)
    b.skip_steps(2)
    assert b.state_dict()["steps_done"] == state["steps_done"] + 2
    assert _steps(b) == ref[6:]
    with pytest.raises(ValueError):
        b.skip_steps(-1)


@pytest.mark.parametrize("layout", [Layout(4), Layout(4, remainder="drop"), Layout(3, world_size=2, remainder="pad"),
                                    Layout(5, world_size=4, rank=3, nodes=2)], ids=str)
def test_whole_epochs_counted_at_once_agree_with_walking_them(layout):
    """``same_epochs`` counts the epochs skipped with one division; it lands where
    walking them one by one does, from any position, for every step count."""
    for total in (10, 37, 40):
        per = layout.num_steps(total, 0)
        for start in sorted({0, 1, layout.step_size, total - 1, total}):
            for steps in range(3 * per + 3):
                walked = advance(layout, lambda e, t=total: t, 2, start, steps)
                assert advance(layout, lambda e, t=total: t, 2, start, steps, same_epochs=True) == walked, \
                    (total, start, steps)


@pytest.mark.parametrize("k", [2.7, True, "3", None, -1])
def test_skip_steps_refuses_what_is_not_a_step_count(data, k):
    loader = rw.WebLoader(_ds(data), batch_size=BATCH)
    _steps(loader, stop_at=2)
    before = loader.state_dict()
    with pytest.raises(ValueError if k == -1 else TypeError, match=r"skip_steps\(") as ei:
        loader.skip_steps(k)
    assert "non-negative int" in str(ei.value) or "negative number" in str(ei.value)
    assert loader.state_dict() == before  # nothing moved


# skips 10**12 steps and prints where the loader stands (a subprocess: walking the
# epochs one by one would take days, the test gives it two minutes)
HUGE_SKIP = """
import sys, resumewds as rw
shuffle, journal = sys.argv[1], sys.argv[2]
ds = rw.WebDataset(sys.argv[3:], seed=3, shuffle=shuffle)
loader = rw.WebLoader(ds, batch_size=8, journal=journal)
try:
    d = loader.skip_steps(10 ** 12)
    print(d["to"][0], d["to"][1], loader.steps_done)
except ValueError as exc:
    print("refused:", exc)
loader.close()
"""


@pytest.mark.parametrize("shuffle", ["window", "resampled"])
def test_a_huge_skip_is_arithmetic_or_refused(data, tmp_path, shuffle):
    import subprocess
    import sys

    from conftest import subprocess_env

    journal = str(tmp_path / "run.db")
    res = subprocess.run([sys.executable, "-c", HUGE_SKIP, shuffle, journal, *data], env=subprocess_env(),
                         capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    if shuffle == "window":  # 185 samples: 24 steps of 8 per epoch, the same every epoch
        whole, rest = divmod(10 ** 12, 24)
        assert res.stdout.split() == [str(whole), str(rest * 8), str(10 ** 12)]
        assert status(journal)["latest"]["step"] == 10 ** 12 - 1
    else:  # resampled shards: each epoch's steps differ, each would have to be laid out
        assert res.stdout.startswith("refused: skip_steps: ")
        assert "cross more than 1000 epochs whose steps differ" in res.stdout
