"""The event protocol: one table, every kind produced
somewhere in the package and consumed by at least one consumer."""

from __future__ import annotations

import ast
import json
import logging
import os
import re

import pytest

from resumewds import events, journal
from resumewds.events import EVENTS, EventKind
from resumewds.run import _stats as stats

PKG = os.path.join(os.path.dirname(os.path.dirname(os.path.abspath(__file__))), "resumewds")


def _source(module: str) -> str:
    """The source of ``resumewds.<module>``: its file, or every file of its package."""
    path = os.path.join(PKG, *module.split("."))
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
    assert events.event_record(EventKind.SKIP, "u", {})["kind"].__class__ is str


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
    for name in events.stats_counters().values():
        assert name in stats.COUNTERS
    for state, _ in events.shard_effects().values():
        assert state is None or state in journal.SHARD_STATES
    # the report's timeline lanes (report.py keeps its colours per kind)
    from resumewds.report._rundata import TIMELINE_KINDS

    assert set(events.timeline_kinds()) == set(TIMELINE_KINDS)


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


#: the calls that emit an event: ``emit(kind, url, ...)``, ``on_event(kind, ...)``, ``event_record(kind, ...)``
_EMITTERS = {"emit", "_emit", "on_event", "_on_event", "event_record"}


def _emissions():
    """``(file:line, kind argument)`` of every event emitted in the package's code."""
    for dirpath, _, names in os.walk(PKG):
        for name in sorted(n for n in names if n.endswith(".py")):
            path = os.path.join(dirpath, name)
            with open(path) as f:
                tree = ast.parse(f.read())
            for node in ast.walk(tree):
                if not isinstance(node, ast.Call) or not node.args:
                    continue
                fn = node.func
                called = fn.attr if isinstance(fn, ast.Attribute) else getattr(fn, "id", None)
                if called in _EMITTERS:
                    yield f"{os.path.relpath(path, PKG)}:{node.lineno}", node.args[0]


def test_every_event_is_emitted_by_its_kind_in_the_table():
    """No event kind is a string literal (one that is not in the table would bypass every
    consumer, silently): each emission names an :class:`EventKind`."""
    found = list(_emissions())
    literals = [(where, arg.value) for where, arg in found
                if isinstance(arg, ast.Constant) and isinstance(arg.value, str)]
    assert literals == []
    by_name = [where for where, arg in found if isinstance(arg, ast.Attribute)
               and getattr(arg.value, "id", None) in ("EventKind", "K") and arg.attr in EventKind.__members__]
    assert len(by_name) >= 20  # (the scan sees the package's emissions)
