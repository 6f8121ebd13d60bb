"""On-demand capture: the request rules (Hypothesis), configuration, and a live run triggered from another process."""

from __future__ import annotations

import contextlib
import json
import math
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import profctx
from profctx.core._ondemand import (
    AHEAD_S,
    AHEAD_STEPS,
    MAX_REQUEST_STEPS,
    AutoCapture,
    Progress,
    Request,
    RequestError,
    admit,
    at_step,
    first_step,
    parse,
)

ROOT = Path(__file__).resolve().parents[1]

# -- the request rules --------------------------------------------------------------------------

names = st.text(alphabet="abcdefghij0123456789._-", min_size=1, max_size=20)
requests = st.builds(
    Request,
    id=names,
    first=st.integers(0, 10**6),
    count=st.integers(1, MAX_REQUEST_STEPS),
    mode=st.sampled_from([None, "step", "role"]),
    roles=st.none() | st.lists(st.sampled_from(["rollout", "actor_*", "a/b"]), min_size=1, max_size=3).map(tuple),
    group=st.none() | names,
    ranks=st.none() | st.lists(st.integers(0, 64), min_size=1, max_size=4).map(tuple),
    origin=st.sampled_from(["trigger", "anomaly"]),
    reason=st.none() | st.text(max_size=50),
    user=st.none() | st.text(max_size=20),
    uid=st.none() | st.integers(0, 2**31),
    pid=st.none() | st.integers(0, 2**22),
    time=st.none() | st.floats(0, 2e9),
)


@given(requests)
def test_a_request_reads_back_from_its_file_form(request: Request) -> None:
    assert parse(json.loads(json.dumps(request.to_dict()))) == request


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20)


@given(json_values)
def test_anything_that_is_not_a_request_raises_request_error_only(value: Any) -> None:
    with contextlib.suppress(RequestError):
        parse(value)


@given(requests, st.sampled_from(["first", "count", "id", "mode", "ranks"]),
       st.sampled_from([-1, "3", None, 1.5, [], MAX_REQUEST_STEPS + 1, "../x"]))
def test_a_bad_value_is_refused(request: Request, key: str, value: Any) -> None:
    data = {**request.to_dict(), key: value}
    try:
        parsed = parse(data)
    except RequestError:
        return
    assert getattr(parsed, key) in (value, None, tuple(value) if isinstance(value, list) else value)


progresses = st.lists(st.builds(Progress, step=st.integers(0, 10**5),
                                period=st.none() | st.floats(1e-4, 100.0),
                                time=st.floats(0, 100.0)), min_size=1, max_size=8)


@given(progresses, st.floats(0, 100.0))
def test_the_first_step_lies_ahead_of_every_process_by_two_steps_and_two_seconds(
        progress: list[Progress], now: float) -> None:
    first = first_step(progress, now)
    assert first is not None
    for p in progress:
        projected = p.step + (int(max(0.0, now - p.time) / p.period) if p.period else 0)
        assert first >= projected + AHEAD_STEPS
        if p.period:  # the fastest process needs at least AHEAD_S seconds to get there
            assert (first - projected) * p.period >= AHEAD_S - 1e-9 or first - projected >= 10**6


@given(st.integers(0, 1000), st.floats(0.001, 10.0))
def test_ranks_one_step_apart_get_the_same_first_step_ahead_of_both(step: int, period: float) -> None:
    both = [Progress(step, period, 0.0), Progress(step + 1, period, 0.0)]
    first = first_step(both, 0.0)
    assert first is not None and first > step + 1
    assert first_step([], 0.0) is None


@given(requests, st.none() | st.integers(0, 10**6), st.integers(0, 20), st.integers(0, 20), st.booleans())
def test_admission(request: Request, last: int | None, accepted: int, cap: int, known: bool) -> None:
    outcome = admit(request, last, accepted, cap, known)
    if known:
        assert outcome == "known"
    elif last is not None and request.first <= last:
        assert outcome == "passed"
    elif accepted >= cap:
        assert outcome == "cap"
    else:
        assert outcome == "schedule"


@given(requests, st.lists(st.integers(0, 50), min_size=1, max_size=60).map(lambda xs: sorted(set(xs))))
@settings(max_examples=200)
def test_a_request_captures_all_its_steps_or_none(request: Request, entered: list[int]) -> None:
    request = Request(id="r", first=request.first % 40, count=min(request.count, 10))
    started = False
    captured: list[int] = []
    passed = False
    for step in entered:
        what = at_step(step, request, started)
        if what == "start":
            started = True
        if what in ("start", "within"):
            captured.append(step)
        if what == "passed":
            passed = True
            break
        if what == "done":
            break
    wanted = [s for s in entered if s in request.steps]
    if request.first in entered:
        assert captured == wanted and not passed
    else:
        assert captured == [] and passed == any(s > request.first for s in entered)


def test_request_selection() -> None:
    base = Request(id="r", first=5)
    assert base.selects(None, 3, True) and not base.selects(None, 3, False)
    grouped = Request(id="r", first=5, group="actor", ranks=(1,))
    assert grouped.selects("actor", 1, False) and not grouped.selects("actor", 0, True)
    assert not grouped.selects(None, 1, True)
    ranked = Request(id="r", first=5, ranks=(0, 1))
    assert ranked.selects(None, 1, False) and not ranked.selects(None, 2, True)


# -- configuration ------------------------------------------------------------------------------


def test_on_demand_needs_no_window(tmp_path: Path) -> None:
    config = profctx.configure(save_path=tmp_path, on_demand=True)
    assert config is not None and config.active and config.steps is None
    assert config.on_demand_max_captures == 10
    again = profctx.ProfilerConfig.from_mapping(config.to_dict())
    assert again == config


@pytest.mark.parametrize(("fields", "field"), [
    ({"on_demand": "sometimes"}, "on_demand"),
    ({"on_demand": True, "on_demand_max_captures": -1}, "on_demand_max_captures"),
    ({"on_demand": True, "on_demand_max_captures": True}, "on_demand_max_captures"),
    ({"auto_capture": {"factor": 1.0}}, "auto_capture.factor"),
    ({"auto_capture": {"window": 2}}, "auto_capture.window"),
    ({"auto_capture": {"max_captures": 0}}, "auto_capture.max_captures"),
    ({"auto_capture": {"role": "a/b"}}, "auto_capture.role"),
    ({"auto_capture": {"median": 3}}, "auto_capture.median"),
    ({"auto_capture": "yes"}, "auto_capture"),
])
def test_bad_on_demand_settings_name_the_field(tmp_path: Path, fields: dict[str, Any], field: str) -> None:
    with pytest.raises(profctx.ConfigError) as info:
        profctx.configure(save_path=tmp_path, **fields)
    assert info.value.field == field


def test_on_demand_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROFCTX_ON_DEMAND", "1")
    monkeypatch.setenv("PROFCTX_SAVE_PATH", str(tmp_path))
    config = profctx.configure()
    assert config is not None and config.on_demand
    monkeypatch.setenv("PROFCTX_ON_DEMAND", "maybe")
    with pytest.raises(profctx.ConfigError, match="PROFCTX_ON_DEMAND"):
        profctx.configure()


def test_auto_capture_defaults() -> None:
    assert AutoCapture.of(True) == AutoCapture(2.0, 20, 3, None)
    assert AutoCapture.of(None) is None and AutoCapture.of(False) is None
    assert not math.isnan(AutoCapture.of({"factor": 3}).factor)  # type: ignore[union-attr]
