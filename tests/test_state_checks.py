"""A loader state that was changed after it was taken is refused (its checksum,
resumewds.run), and a rotation that no run can stand at is refused
naming its field (resumewds.wds._rotation); states as earlier versions wrote them
(no checksum) and states that went through a checkpoint's round trip (JSON,
pickle, torch.save) load and resume exactly.

Whole sequences are compared with an uninterrupted run; real DataLoader
workers, a real SQLite journal.
"""

from __future__ import annotations

import io
import json
import pickle
import sqlite3
import warnings

import pytest
import torch

import resumewds as rw
from resumewds.errors import StateError
from resumewds.multi import MultiLoader
from resumewds.run import seal

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning")

EDITED = "was changed after it was taken"


def _quiet(f, *a, **kw):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return f(*a, **kw)


def _keep(s):
    return (int(s["__key__"][1:7]) * 7 + int(s["__key__"][-6:]) * 5) % 9 not in (1, 4, 6)


@pytest.fixture
def data(make_shards):
    return make_shards(shards=5, samples=23)  # 115 samples


# ---- every loader's state: (make, take n items and the state, the rest) ---------------------------

def _items(it, n=None):
    out = []
    for x in it:
        out.append(x)
        if n is not None and len(out) == n:
            break
    return out


def _key(x):
    if isinstance(x, dict):
        k = x["__key__"]
        return tuple(k) if isinstance(k, list) else k
    if isinstance(x, (list, tuple)):
        first = x[0]
        return tuple(first) if isinstance(first, (list, tuple)) else first
    return x


def _webloader(data):
    return rw.WebLoader(rw.WebDataset(data, seed=5, shuffle=True), batch_size=8, num_workers=0)


def _chain(data):
    ds = rw.WebDataset(data, shardshuffle=False).to_tuple("__key__", "cls").batched(4)
    return _quiet(rw.WebLoader, ds, batch_size=None, num_workers=0).with_epoch(20)


def _rotation(data):
    ds = _quiet(rw.WebDataset, data, shardshuffle=False).select(_keep).to_tuple("__key__", "cls")
    return _quiet(rw.WebLoader, ds, batch_size=None, num_workers=2)


def _pipeline(data):
    return rw.DataPipeline(rw.SimpleShardList(data), rw.tarfile_to_samples(),
                               rw.to_tuple("__key__", "cls"))


def _multi(data):
    return MultiLoader(rw.WebDataset(data, seed=5, shuffle=True).to_tuple("__key__"), workers=2)


def _direct(data):
    return rw.WebDataset(data, seed=5, shuffle=True).to_tuple("__key__")


FORMS = {"webloader": _webloader, "chain": _chain, "rotation": _rotation, "datapipeline": _pipeline,
         "multiloader": _multi, "dataset": _direct}


def _taken(make, data, n=5):
    """(the first n items' keys, the state after them, the rest of the epoch's keys)."""
    src = make(data)
    it = iter(src)
    head = [_key(x) for x in _items(it, n)]
    state = src.state_dict()
    rest = [_key(x) for x in it]
    if hasattr(src, "kill"):
        src.kill()
    return head, state, rest


def _resumed(make, data, state):
    dst = make(data)
    dst.load_state_dict(state)
    out = [_key(x) for x in _quiet(list, dst)]
    if hasattr(dst, "kill"):
        dst.kill()
    return out


def _edit(state):
    """The state with its place moved within range, its checksum kept."""
    out = dict(state)
    if "rotation" in out:
        rot = dict(out["rotation"])
        s = list(rot["streams"])
        s[0], s[1] = s[0] + 1, s[1] - 1  # the same position, another place in the streams
        out["rotation"] = dict(rot, streams=s)
    elif "served" in out:
        out["served"] = int(out["served"]) + 1
    elif "skip" in out:
        out["skip"] = int(out["skip"]) + 1
    else:
        out["position"] = int(out["position"]) - 1
    return out


@pytest.mark.parametrize("form", sorted(FORMS))
def test_an_edited_state_is_refused_and_the_state_as_taken_resumes_exactly(data, form):
    make = FORMS[form]
    head, state, rest = _taken(make, data)
    assert isinstance(state.get("checksum"), str) and state["checksum"].startswith("xxh3_64:")
    edited = _edit(state)
    assert edited != state
    with pytest.raises(StateError, match=EDITED):
        make(data).load_state_dict(edited)
    assert _resumed(make, data, state) == rest  # the state as taken: exactly the rest


@pytest.mark.parametrize("form", ["webloader", "rotation"])
def test_a_state_without_checksum_loads_as_earlier_versions_wrote_it(data, form):
    make = FORMS[form]
    head, state, rest = _taken(make, data)
    old = {k: v for k, v in state.items() if k != "checksum"}
    assert _resumed(make, data, old) == rest


@pytest.mark.parametrize("trip", ["json", "pickle", "torch"])
def test_a_state_survives_a_checkpoints_round_trip(data, trip):
    head, state, rest = _taken(_rotation, data)
    if trip == "json":  # as transformers.Trainer's checkpoint folder holds it
        back = json.loads(json.dumps(state))
    elif trip == "pickle":
        back = pickle.loads(pickle.dumps(state))
    else:
        buf = io.BytesIO()
        torch.save(state, buf)
        buf.seek(0)
        back = torch.load(buf, weights_only=True)
    assert _resumed(_rotation, data, back) == rest


# ---- a rotation no run can stand at ---------------------------------------------------------------

def _rotation_state(data, n=50):
    """A rotation state late in the epoch (stream 0 has 69 samples, stream 1 46)."""
    head, state, rest = _taken(_rotation, data, n)
    assert state["position"] > 46, state
    return state


@pytest.mark.parametrize("sealed", [False, True], ids=["no-checksum", "resealed"])
@pytest.mark.parametrize("rotation,field", [
    ("negative", r"rotation\.streams must be a list of each stream's position"),
    ("past-the-stream", r"rotation\.streams \[0, \d+\]: stream 1 stands at sample \d+ of its 46"),
    ("a-list", r"its rotation must be a dict .*got a list"),
    ("next", r"rotation\.next must be the stream whose turn is next \(0 to 1\), got 2"),
    ("workers", r"rotation\.workers must be a count of workers, got '2'"),
])
def test_an_impossible_rotation_is_refused_naming_its_field(data, rotation, field, sealed):
    state = _rotation_state(data)
    pos, rot = state["position"], state["rotation"]
    bad = {"negative": dict(rot, streams=[-7, pos + 7]),  # they add up to the position
           "past-the-stream": dict(rot, streams=[0, pos]),
           "a-list": [2, rot["streams"], rot["next"]],
           "next": dict(rot, next=2),
           "workers": dict(rot, workers="2")}[rotation]
    state = dict(state, rotation=bad)
    if sealed:  # a tool that rewrote the checksum: the rotation itself is still checked
        state = seal(state)
    else:
        del state["checksum"]
    with pytest.raises(StateError, match=field):
        _rotation(data).load_state_dict(state)


def test_a_rotation_given_to_a_loader_without_one_is_refused(data):
    state = _rotation_state(data)
    state = {k: v for k, v in state.items() if k != "checksum"}
    state["rotation"] = [2, [0, 0], 0]
    plain = rw.WebLoader(_quiet(rw.WebDataset, data, shardshuffle=False), batch_size=4)
    with pytest.raises(StateError, match="rotation of"):
        plain.load_state_dict(state)


def test_an_impossible_rotation_in_a_journal_commit_is_refused(data, tmp_path):
    journal = str(tmp_path / "run.db")
    ds = _quiet(rw.WebDataset, data, shardshuffle=False).select(_keep).to_tuple("__key__", "cls")
    loader = _quiet(rw.WebLoader, ds, batch_size=None, num_workers=2, journal=journal)
    for i, _ in enumerate(loader):
        if i == 29:
            loader.commit(29)
            break
    loader.close()
    with sqlite3.connect(journal) as conn:  # the commit's place, damaged: [-7, position + 7]
        (place,) = conn.execute("SELECT place FROM commits WHERE step = 29").fetchone()
        place = json.loads(place)
        pos = sum(place["rotation"]["streams"])
        place["rotation"]["streams"] = [-7, pos + 7]
        conn.execute("UPDATE commits SET place = ? WHERE step = 29", (json.dumps(place),))
    ds = _quiet(rw.WebDataset, data, shardshuffle=False).select(_keep).to_tuple("__key__", "cls")
    with pytest.raises(StateError, match=r"the commit of step 29 in .*run\.db: its rotation\.streams must be"):
        _quiet(rw.WebLoader, ds, batch_size=None, num_workers=2, journal=journal, resume=True)
