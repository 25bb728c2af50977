"""The event protocol: one table, every kind produced
somewhere in the package and consumed by at least one consumer."""

from __future__ import annotations

import json
import logging
import os
import re

import pytest

from resumewds import events, journal, stats
from resumewds.events import EVENTS, EventKind

PKG = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "resumewds")


def _source(module: str) -> str:
    """The source of ``resumewds.<module>``: its file, or every file of its package."""
    path = os.path.join(PKG, module)
    if os.path.isdir(path):
        files = sorted(os.path.join(path, n) for n in os.listdir(path) if n.endswith(".py"))
    else:
        files = [path + ".py"]
    text = []
    for name in files:
        with open(name) as f:
            text.append(f.read())
    return "\n".join(text)


def test_the_table_covers_every_kind():
    assert set(EVENTS) == set(EventKind)


def test_kinds_are_strings_for_old_comparisons():
    assert EventKind.SKIP == "skip" and "fail" == EventKind.FAIL
    assert json.dumps({"kind": EventKind.RETRY}) == '{"kind": "retry"}'
    assert stats.event_record(EventKind.SKIP, "u", {})["kind"].__class__ is str


@pytest.mark.parametrize("kind", list(EventKind), ids=lambda k: k.value)
def test_every_kind_is_produced_by_its_module(kind):
    src = _source(EVENTS[kind].producer)
    by_name = f"EventKind.{kind.name}" in src or f"K.{kind.name}" in src
    by_literal = re.search(r'(_emit|on_event|_on_event|event_record)\(\s*"' + kind.value + '"', src)
    assert by_name or by_literal, f"{kind.value} is never emitted by {EVENTS[kind].producer}.py"


@pytest.mark.parametrize("kind", list(EventKind), ids=lambda k: k.value)
def test_every_kind_is_consumed(kind):
    s = EVENTS[kind]
    assert (s.counter or s.shard_state or s.shard_counter or s.lane is not None or s.error
            or s.level >= logging.INFO), f"{kind.value}: nobody consumes it"


def test_consumers_derive_from_the_table():
    assert stats.EVENT_COUNTERS == events.stats_counters()
    assert journal.ERROR_EVENT_KINDS == events.error_kinds()
    assert journal._EVENT_SHARD_EFFECT == events.shard_effects()
    for name in events.stats_counters().values():
        assert name in stats.COUNTERS
    for state, _ in events.shard_effects().values():
        assert state is None or state in journal.SHARD_STATES
    # the report's timeline lanes (report.py keeps its colours per kind)
    from resumewds import report

    assert set(events.timeline_kinds()) == set(report.TIMELINE_KINDS)


def test_counted_kinds_move_their_counter():
    for kind, name in events.stats_counters().items():
        s = stats.Stats()
        s.events([{"kind": kind, "url": "u"}])
        assert s.snapshot()[name] == 1, kind


def test_shard_effects_reach_the_journal(tmp_path):
    with journal.Journal(str(tmp_path / "j.db")) as j:
        for kind, (state, counter) in events.shard_effects().items():
            url = f"http://h/{kind}.tar"
            j.update_shards(journal.shard_updates_from_events([{"kind": kind, "url": url}]))
            row = j.shard(url)
            if state:
                assert row["state"] == state, kind
            if counter:
                assert row[counter] == 1, kind


def test_literal_producers_left():
    """fetch.py and cache.py (another owner) still emit literals: listed here
    so the conversion is tracked; each literal must be a known kind."""
    for module in ("fetch", "cache"):
        for lit in re.findall(r'(?:_emit|on_event)\(\s*"([a-z_]+)"', _source(module)):
            EventKind(lit)
