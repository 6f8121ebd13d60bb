"""Nesting a thread's events: the vectorised pass (numpy) and the loop give the same figures, to the bit."""

from __future__ import annotations

import json
from array import array
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from profctx.analysis import _nesting, _trace, read_figures
from profctx.analysis._nesting import MARK, OP, ROLE, STEP_MARKER, nest_loop, nest_vectorised, step_at

pytest.importorskip("numpy")

#: Names a thread's events take: operators, roles, step markers (torch's and older profctx's), others.
NAMES = ["aten::mm", "aten::add", "rollout", "actor_update", "ProfilerStep#3", "ProfilerStep#4", "step 7",
         "gloo:all_reduce", "my_range"]
#: Starts and durations on a coarse grid (equal starts are common), some just inside torch's 1 ns slack.
_TIME = st.builds(lambda whole, slack: whole * 0.5 + slack, st.integers(0, 60),
                  st.sampled_from([0.0, 4e-4, 1e-3, 2e-3]))
_DUR = st.one_of(st.just(0.0), st.builds(lambda whole, slack: whole * 0.5 + slack, st.integers(0, 40),
                                         st.sampled_from([0.0, 4e-4, 1e-3])))
_EVENT = st.tuples(_TIME, _DUR, st.integers(0, len(NAMES) - 1), st.integers(0, 1))


def _thread(events: list[tuple[float, float, int, int]]) -> tuple[array[float], array[float], array[int], bytearray]:
    return (array("d", [e[0] for e in events]), array("d", [e[1] for e in events]),
            array("l", [e[2] for e in events]), bytearray(e[3] for e in events))


def _kinds(drawn: set[str] | None) -> bytes:
    """What a range of each name is, as the trace reader classifies it."""
    return bytes(MARK if STEP_MARKER.fullmatch(n) else ROLE if drawn is None or n in drawn else OP for n in NAMES)


def _marks(events: list[tuple[float, float, int, int]]) -> list[tuple[float, float, int]]:
    found = []
    for ts, dur, name, kind in events:
        marker = STEP_MARKER.fullmatch(NAMES[name])
        if kind and marker:
            found.append((ts, ts + dur, int(marker[1])))
    return found


#: Roles lent to events in no role of their thread: (step, index of the role's name in NAMES).
LENDERS = [(3, 2), (None, 3), (4, 2), (7, 7)]


def _both(events: list[tuple[float, float, int, int]], drawn: set[str] | None,
          codes: list[int] | None = None) -> tuple[Any, Any]:
    ts, dur, name, kind = _thread(events)
    args = (NAMES, _kinds(drawn), _marks(events), drawn is not None)
    lent = None if codes is None else (array("l", (codes * len(events))[:len(events)]), LENDERS)
    loop = nest_loop(ts, dur, name, kind, *args, lent)
    vector = nest_vectorised(ts, dur, name, kind, *args, lent)
    return loop, vector


def _ordered(figures: tuple[dict[Any, list[Any]], dict[Any, list[Any]], list[Any]]) -> list[Any]:
    ops, roles, spans = figures
    return [list(ops.items()), list(roles.items()), spans]


@settings(max_examples=300, deadline=None)
@given(st.lists(_EVENT, max_size=80), st.sampled_from([None, {"rollout", "actor_update"}, {"rollout"}]),
       st.booleans(), st.one_of(st.none(), st.lists(st.integers(-1, len(LENDERS) - 1), min_size=1, max_size=7)))
def test_the_vectorised_nesting_gives_the_loops_figures(events: list[tuple[float, float, int, int]],
                                                        drawn: set[str] | None, in_order: bool,
                                                        codes: list[int] | None) -> None:
    if in_order:
        events = sorted(events, key=lambda e: e[0])  # a thread in time order is taken in file order
    loop, vector = _both(events, drawn, codes)
    assert _ordered(vector) == _ordered(loop)  # same keys, same order, same floats
    for table in vector[:2]:
        for values in table.values():
            assert all(type(v) is type(w) for v, w in zip(values, table[next(iter(table))], strict=True))


@settings(max_examples=100, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 5), st.integers(0, 40), st.integers(0, 200), st.integers(0, 3)),
                max_size=60))
def test_deep_and_wide_nesting_agree(shape: list[tuple[int, int, int, int]]) -> None:
    """Ranges nested many levels deep (a tree drawn depth first), siblings many wide, with ties."""
    events: list[tuple[float, float, int, int]] = []
    clock = 0.0
    open_ends: list[float] = []
    for depth, length, gap, name in shape:
        while len(open_ends) > depth:
            clock = max(clock, open_ends.pop())
        span = float(length)
        if open_ends:
            span = min(span, open_ends[-1] - clock)
        events.append((clock, max(span, 0.0), name, 1 if name < 3 else 0))
        open_ends.append(clock + max(span, 0.0))
        clock += gap / 100
    events = [(t, d, n + 2 if k else n, k) for t, d, n, k in events]
    loop = nest_loop(*_thread(events), NAMES, _kinds(None), _marks(events), False)
    with pytest.MonkeyPatch.context() as patched:  # every event ends within its parent: no fallback to the loop
        patched.setattr(_nesting, "nest_loop", None)
        vector = nest_vectorised(*_thread(events), NAMES, _kinds(None), _marks(events), False)
    assert _ordered(vector) == _ordered(loop)


def test_overlapping_events_nest_as_the_stack_sees_them() -> None:
    # A [0, 10], B [5, 15] starts inside A and ends after it; C [11, 12] starts after A ended, inside B.
    events = [(0.0, 10.0, 0, 0), (5.0, 10.0, 1, 0), (11.0, 1.0, 0, 0)]
    loop, vector = _both(events * 30, None)  # repeated: the later copies nest in the first B, which never ends
    assert _ordered(vector) == _ordered(loop)
    loop, vector = _both(events, None)
    assert _ordered(vector) == _ordered(loop)
    assert loop[0] == {(None, None, "aten::mm"): [0.0 + 1.0, 11.0, 2], (None, None, "aten::add"): [9.0, 10.0, 1]}


def test_a_role_without_a_marker_above_takes_the_marker_it_lies_in() -> None:
    marks = [(0.0, 100.0, 3), (100.0, 200.0, 4)]
    events = [(150.0, 20.0, 2, 1), (151.0, 5.0, 0, 0)]
    ts, dur, name, kind = _thread(events)
    for nested in (nest_loop, nest_vectorised):
        ops, roles, spans = nested(ts, dur, name, kind, NAMES, _kinds(None), marks, False)
        assert roles == {(4, "rollout"): [20.0, 1, 5.0]} and ops == {(4, "rollout", "aten::mm"): [5.0, 5.0, 1]}
        assert spans == [(150.0, 170.0, 4, 2)]
    # Within 1 ns of the next marker: the first marker in file order that holds it.
    assert step_at(marks, 99.9995) == 3 and step_at(marks[::-1], 99.9995) == 4


def test_many_threads_read_the_same_with_and_without_numpy(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    events: list[dict[str, Any]] = []
    for tid in range(40):
        size = 3 if tid % 2 else 200  # small threads take the loop, large ones numpy
        events.append({"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#2", "pid": 1, "tid": tid,
                       "ts": 0.0, "dur": 10_000.0})
        events.append({"ph": "X", "cat": "user_annotation", "name": "rollout", "pid": 1, "tid": tid,
                       "ts": 1.0, "dur": 5_000.0})
        for i in range(size):
            events.append({"ph": "X", "cat": "cpu_op", "name": f"aten::op{i % 7}", "pid": 1, "tid": tid,
                           "ts": 2.0 + i * 3 + tid * 0.1, "dur": 2.5 if i % 3 else 7.0})
    # The first event of a thread is one that is not nested (torch's whole-capture span): the threads still
    # come in the order of their first nested event, whether a batch is taken in C or event by event.
    events.append({"ph": "X", "cat": "Trace", "name": "PyTorch Profiler", "pid": 1, "tid": 0, "ts": 0.0, "dur": 1e5})
    path = tmp_path / "t.pt.trace.json"
    path.write_text(json.dumps({"traceEvents": events[::-1], "profctxRanges": {"roles": ["rollout"]}}))

    def figures() -> tuple[Any, ...]:
        got = read_figures(path)
        return list(got.ops.items()), list(got.roles.items()), got.span_us, got.events, got.steps

    fast = figures()
    assert dict(fast[1])[(2, "rollout")][1] == 40
    with monkeypatch.context() as patched:
        patched.setattr(_trace, "_batch", lambda *args: None)
        assert figures() == fast
    monkeypatch.setattr(_nesting, "_np", None)
    assert figures() == fast
    with pytest.raises(RuntimeError):
        nest_vectorised(array("d"), array("d"), array("l"), bytearray(), NAMES, b"", [], False)


def test_operators_in_no_role_take_the_role_lent_to_them_and_roles_keep_their_times() -> None:
    # A thread that draws no role: an operator (with a child) lent actor_update of step 4, one lent nothing.
    events = [(10.0, 6.0, 7, 0), (11.0, 2.0, 0, 0), (30.0, 1.0, 1, 0)]
    ts, dur, name, kind = _thread(events)
    lent = (array("l", [1, 1, -1]), [(3, 2), (4, 3)])
    for nested in (nest_loop, nest_vectorised):
        ops, roles, spans = nested(ts, dur, name, kind, NAMES, _kinds(None), [], False, lent)
        assert ops == {(None, None, "aten::add"): [1.0, 1.0, 1], (4, "actor_update", "aten::mm"): [2.0, 2.0, 1],
                       (4, "actor_update", "gloo:all_reduce"): [4.0, 6.0, 1]}
        assert roles == {} and spans == []
