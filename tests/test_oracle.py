"""Decision and effect agree: the real runtime captures exactly what the plan says it will.

``expected_captures`` runs the pure plan with no profiler; ``capture()`` + ``replay`` run the
same loop through real ``profile_step`` blocks and the real runtime (recording backend). For
random configs, loops with retried and resumed steps and role trees, the two must match
capture for capture: steps, role, status, ranges and markers, in order.
"""

from __future__ import annotations

import functools
import itertools
from collections.abc import Callable
from typing import Any

import pytest
from hypothesis import HealthCheck, example, find, given, settings
from hypothesis import strategies as st

from profctx import ConfigError, profile_step, profiled
from profctx.testing import Captured, Expected, RecordingBackend, RoleBlock, capture, expected_captures, replay
from profctx.testing import strategies as pst

SETTINGS = settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.too_slow])
NAMES = ["rollout", "gen", "train", "actor_update"]
PATTERNS = st.sampled_from([(), ("rollout",), ("actor_*",), ("gen", "train"), ("train/*",), ("rollout/gen",)])


@st.composite
def configs(draw: st.DrawFn) -> dict[str, Any]:
    """Configuration keywords across every field the plan reads."""
    mode = draw(st.sampled_from(["step", "role"]))
    ranks = draw(pst.rank_lists(4))
    # Mostly a selected rank (an unselected one captures nothing, so it is tried less often).
    mine = list(range(4)) if ranks == "all" else ranks
    rank = draw(st.sampled_from(mine) if draw(st.sampled_from([True, True, True, False])) else st.integers(0, 3))
    return {
        "steps": draw(pst.windows(20, 8)),
        "mode": mode,
        "contiguous": mode == "step" and draw(st.booleans()),
        "roles": draw(PATTERNS),
        "ranks": ranks,
        "rank": rank,
        "world_size": 4,
    }


@st.composite
def cases(draw: st.DrawFn) -> tuple[dict[str, Any], list[int]]:
    """A config and a step sequence with retries and resumes; two thirds of them stay near the window.

    Steps that jump from one run of the window straight into another, or step out and come
    back, are what contiguous captures must get right; uniform sequences rarely do that.
    """
    config = draw(configs())
    near = sorted({s + d for s in config["steps"] for d in (-1, 0, 1) if s + d >= 0})
    near_loops = st.lists(st.sampled_from(near), min_size=1, max_size=20)
    steps = draw(st.one_of(pst.step_sequences(20, 30, repeats=True), near_loops, near_loops))
    return config, steps


def seen(got: list[Captured]) -> list[tuple[Any, ...]]:
    return [(c.kind, c.steps, c.role, c.status, c.ranges, c.markers) for c in got]


def planned(expected: list[Expected]) -> list[tuple[Any, ...]]:
    return [(e.key.kind, e.steps, e.role, e.status, e.ranges, e.markers) for e in expected]


@functools.cache
def decorated(role: str) -> Callable[[tuple[RoleBlock, ...]], None]:
    """The role block ``role`` as a ``@profiled`` function that enters the blocks nested in it."""
    @profiled(role=role)
    def block(children: tuple[RoleBlock, ...]) -> None:
        for child in children:
            decorated(child.role)(child.children)
    return block


def replay_decorated(steps: list[int], blocks: tuple[RoleBlock, ...]) -> None:
    """``replay`` with every role block a ``@profiled`` call instead of a ``with`` block."""
    for step in steps:
        with profile_step(step):
            for block in blocks:
                decorated(block.role)(block.children)


def run_real(
    config: dict[str, Any], steps: list[int], blocks: tuple[RoleBlock, ...], run: Callable[..., None] = replay
) -> list[Captured]:
    RecordingBackend.clear()
    with capture(**config) as got:
        run(steps, blocks)
    assert RecordingBackend.max_live <= 1, "two captures were live at once"
    assert all(item.stopped is not None for item in RecordingBackend.log), "a capture was never stopped"
    return got


@SETTINGS
@given(case=cases(), blocks=pst.role_trees(names=NAMES))
# A retried step inside a contiguous run, then a resume behind the run.
@example(
    case=({"steps": "2:5", "mode": "step", "contiguous": True, "roles": (), "ranks": "all", "rank": 0,
           "world_size": 4}, [2, 3, 3, 4, 2, 3, 5]),
    blocks=(RoleBlock("rollout", (RoleBlock("gen"),)), RoleBlock("train")),
)
# A step outside the window ends the run; coming back into it opens a new capture.
@example(
    case=({"steps": "2:5", "mode": "step", "contiguous": True, "roles": ("gen",), "ranks": "all", "rank": 0,
           "world_size": 4}, [2, 3, 9, 3, 4]),
    blocks=(RoleBlock("rollout", (RoleBlock("gen"),)),),
)
# Role mode: a non-matching role holding a matching one, a retried step.
@example(
    case=({"steps": [1, 2], "mode": "role", "contiguous": False, "roles": ("gen",), "ranks": [0], "rank": 0,
           "world_size": 4}, [1, 1, 2]),
    blocks=(RoleBlock("rollout", (RoleBlock("gen", (RoleBlock("train"),)),)),),
)
def test_runtime_captures_what_the_plan_expects(
    case: tuple[dict[str, Any], list[int]], blocks: tuple[RoleBlock, ...]
) -> None:
    config, steps = case
    expected = expected_captures(config, steps, blocks)
    assert seen(run_real(config, steps, blocks)) == planned(expected)


@SETTINGS
@given(case=cases(), blocks=pst.role_trees(names=NAMES))
# A role the filter leaves out holds one it selects: the capture's path still names both.
@example(
    case=({"steps": [1], "mode": "role", "contiguous": False, "roles": ("gen",), "ranks": "all", "rank": 0,
           "world_size": 4}, [1]),
    blocks=(RoleBlock("rollout", (RoleBlock("gen"),)),),
)
# fnmatch's "*" crosses "/": "actor_*" selects "actor_update/rollout" by its whole path.
@example(
    case=({"steps": [0], "mode": "step", "contiguous": False, "roles": ("actor_*",), "ranks": "all", "rank": 0,
           "world_size": 4}, [0]),
    blocks=(RoleBlock("actor_update", (RoleBlock("rollout"),)),),
)
def test_profiled_functions_capture_what_the_plan_expects(
    case: tuple[dict[str, Any], list[int]], blocks: tuple[RoleBlock, ...]
) -> None:
    config, steps = case
    expected = expected_captures(config, steps, blocks)
    assert seen(run_real(config, steps, blocks, replay_decorated)) == planned(expected)


def test_the_oracle_sees_a_retried_step_as_one_more_capture() -> None:
    # Pins the comparison itself to concrete captures, so an oracle and runtime that both
    # broke the same way (say, capturing nothing) cannot agree silently.
    config = {"steps": [3, 4], "mode": "step", "roles": ("gen",)}
    blocks = (RoleBlock("rollout", (RoleBlock("gen"),)),)
    expected = expected_captures(config, [2, 3, 3, 4, 9], blocks)
    assert planned(expected) == [
        ("step", (3,), None, "ok", ["gen"], ["ProfilerStep#3"]),
        ("step", (3,), None, "ok", ["gen"], ["ProfilerStep#3"]),
        ("step", (4,), None, "ok", ["gen"], ["ProfilerStep#4"]),
    ]
    assert seen(run_real(config, [2, 3, 3, 4, 9], blocks)) == planned(expected)


def test_the_oracle_keeps_a_contiguous_capture_open_across_a_retry() -> None:
    config = {"steps": "3:6", "mode": "step", "contiguous": True}
    blocks = (RoleBlock("train"),)
    steps = [3, 4, 4, 5, 3]
    expected = expected_captures(config, steps, blocks)
    assert planned(expected) == [
        ("step", (3, 4, 5), None, "ok", ["train"] * 4,
         ["ProfilerStep#3", "ProfilerStep#4", "ProfilerStep#4", "ProfilerStep#5"]),
        ("step", (3, 4, 5), None, "ok", ["train"], ["ProfilerStep#3"]),
    ]
    assert seen(run_real(config, steps, blocks)) == planned(expected)


def test_the_oracle_captures_nothing_on_an_unselected_rank() -> None:
    config = {"steps": [1], "ranks": [0], "rank": 1, "world_size": 2}
    assert expected_captures(config, [1], (RoleBlock("train"),)) == []
    assert run_real(config, [1], (RoleBlock("train"),)) == []


def test_the_oracle_rejects_a_bad_config_like_configure() -> None:
    with pytest.raises(ConfigError, match="contiguous"):
        expected_captures({"steps": [1], "mode": "role", "contiguous": True}, [1])


# -- the strategies that feed the oracle ---------------------------------------------------------


@settings(max_examples=50, deadline=None)
@given(blocks=pst.role_trees(names=["gen", "train"]))
def test_role_trees_speak_the_callers_vocabulary(blocks: tuple[RoleBlock, ...]) -> None:
    assert all(isinstance(b, RoleBlock) for b in blocks)
    assert {path[-1] for b in blocks for path in b.paths()} <= {"gen", "train"}


def test_role_trees_keep_the_older_name_and_refuse_bad_names() -> None:
    assert pst.RoleTree is RoleBlock
    assert RoleBlock("a", (RoleBlock("b"),)).paths() == [("a",), ("a", "b")]
    for bad in ([], ["a/b"], [""]):
        with pytest.raises(ValueError, match="names"):
            pst.role_trees(names=bad)


def test_step_sequences_with_repeats_draw_retries_and_resumes() -> None:
    loops = pst.step_sequences(20, 30, repeats=True)
    retried = find(loops, lambda s: any(a == b for a, b in itertools.pairwise(s)))
    resumed = find(loops, lambda s: any(b < a for a, b in itertools.pairwise(s)))
    skipped = find(loops, lambda s: any(b > a + 1 for a, b in itertools.pairwise(s)))
    assert retried and resumed and skipped


@settings(max_examples=50, deadline=None)
@given(steps=pst.step_sequences(20, 12, repeats=True), plain=pst.step_sequences(20, 12))
def test_step_sequences_stay_in_bounds_and_ascend_without_repeats(steps: list[int], plain: list[int]) -> None:
    assert len(steps) <= 12 and all(0 <= s <= 20 for s in steps)
    assert len(plain) <= 12 and all(0 <= s <= 20 for s in plain)
    assert all(a < b for a, b in itertools.pairwise(plain))
