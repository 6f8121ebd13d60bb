"""Property tests of the capture plan: which steps and roles are captured, in every mode."""

from __future__ import annotations

import fnmatch
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import profctx
from profctx import StepWindow
from profctx.testing import RecordingBackend, capture
from profctx.testing import strategies as pst
from profctx.testing.strategies import RoleTree

SETTINGS = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
PATTERNS = st.sampled_from([(), ("rollout",), ("actor_*",), ("gen", "reward"), ("rollout/*",)])


def enter(tree: RoleTree) -> None:
    with profctx.profile_step(role=tree.role):
        for child in tree.children:
            enter(child)


def run_loop(steps: list[int], trees: tuple[RoleTree, ...]) -> None:
    for step in steps:
        with profctx.profile_step(step):
            for tree in trees:
                enter(tree)


def matches(path: tuple[str, ...], patterns: tuple[str, ...]) -> bool:
    if not patterns:
        return True
    return any(fnmatch.fnmatchcase(path[-1], p) or fnmatch.fnmatchcase("/".join(path), p) for p in patterns)


def preorder(trees: tuple[RoleTree, ...], prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    out: list[tuple[str, ...]] = []
    for tree in trees:
        out.extend(tree.paths(prefix))
    return out


def expected_role_mode(step: int, trees: tuple[RoleTree, ...], patterns: tuple[str, ...]) -> list[Any]:
    out: list[Any] = []

    def walk(node: RoleTree, prefix: tuple[str, ...]) -> None:
        path = (*prefix, node.role)
        if matches(path, patterns):
            inner = [p[-1] for p in preorder(node.children, path)]
            out.append(((step,), "/".join(path), inner))
        else:
            for child in node.children:
                walk(child, path)

    for tree in trees:
        walk(tree, ())
    return out


def summary(got: list[profctx.testing.Captured]) -> list[Any]:
    return [(c.steps, c.role, c.ranges) for c in got]


def assert_balanced() -> None:
    assert RecordingBackend.max_live <= 1
    assert all(item.stopped is not None for item in RecordingBackend.log)


@SETTINGS
@given(window=pst.windows(30), steps=pst.step_sequences(30), trees=pst.role_trees(), patterns=PATTERNS)
def test_step_mode_captures_exactly_the_in_window_steps(
    window: StepWindow, steps: list[int], trees: tuple[RoleTree, ...], patterns: tuple[str, ...]
) -> None:
    RecordingBackend.clear()
    with capture(steps=window, mode="step", roles=patterns) as got:
        run_loop(steps, trees)
    names = [p[-1] for p in preorder(trees) if matches(p, patterns)]
    assert summary(got) == [((s,), None, names) for s in steps if s in window]
    assert all(c.status == "ok" for c in got)
    assert_balanced()


@SETTINGS
@given(window=pst.windows(30), steps=pst.step_sequences(30), trees=pst.role_trees())
def test_contiguous_captures_follow_runs(window: StepWindow, steps: list[int], trees: tuple[RoleTree, ...]) -> None:
    RecordingBackend.clear()
    with capture(steps=window, mode="step", contiguous=True) as got:
        run_loop(steps, trees)
    expected: list[tuple[int, ...]] = []
    for step in steps:
        run = window.run_of(step)
        if run is not None and (not expected or expected[-1] != run):
            expected.append(run)
    assert [c.steps for c in got] == expected
    assert set(expected) <= set(window.runs())
    names = [p[-1] for p in preorder(trees)]
    for c in got:
        entered = [s for s in steps if s in c.steps]
        assert c.ranges == names * len(entered)
    assert_balanced()


@SETTINGS
@given(window=pst.windows(30), steps=pst.step_sequences(30), trees=pst.role_trees(), patterns=PATTERNS)
def test_role_mode_captures_outermost_matching_roles(
    window: StepWindow, steps: list[int], trees: tuple[RoleTree, ...], patterns: tuple[str, ...]
) -> None:
    RecordingBackend.clear()
    with capture(steps=window, mode="role", roles=patterns) as got:
        run_loop(steps, trees)
    expected = [e for s in steps if s in window for e in expected_role_mode(s, trees, patterns)]
    assert summary(got) == expected
    assert_balanced()


@SETTINGS
@given(ranks=pst.rank_lists(4), rank=st.integers(0, 3), steps=pst.step_sequences(10))
def test_only_selected_ranks_capture(ranks: Any, rank: int, steps: list[int]) -> None:
    with capture(steps="0:11", ranks=ranks, rank=rank, world_size=4) as got:
        run_loop(steps, ())
    selected = ranks == "all" or rank in ranks
    assert [c.steps for c in got] == ([(s,) for s in steps] if selected else [])
    assert all(c.rank == rank for c in got)


class BoomError(Exception):
    pass


@SETTINGS
@given(
    window=pst.windows(10),
    trees=pst.role_trees(),
    mode=st.sampled_from(["step", "role"]),
    fail_at=st.integers(0, 30),
)
def test_scope_after_an_exception_equals_the_scope_before(
    window: StepWindow, trees: tuple[RoleTree, ...], mode: str, fail_at: int
) -> None:
    counter = [0]

    def enter_failing(tree: RoleTree) -> None:
        with profctx.profile_step(role=tree.role, depth=counter[0]):
            counter[0] += 1
            if counter[0] == fail_at:
                raise BoomError
            for child in tree.children:
                enter_failing(child)

    RecordingBackend.clear()
    with capture(steps=window, mode=mode) as got, profctx.profile_step(role="outer", run="x"):
        before = profctx.current()
        for step in range(11):
            counter[0] = 0
            try:
                with profctx.profile_step(step):
                    for tree in trees:
                        enter_failing(tree)
            except BoomError:
                pass
            assert profctx.current() == before
    assert_balanced()
    assert all(c.status == "ok" for c in got)


def test_nested_step_blocks_and_tags() -> None:
    with capture(steps=[3], mode="role") as got:
        with profctx.profile_step(3, run="a"), profctx.profile_step(role="train", phase="x") as scope:
            assert scope.step == 3 and scope.path == "train"
            assert dict(scope.tags) == {"run": "a", "phase": "x"}
            with profctx.profile_step(role="update/inner"):
                assert profctx.current().roles == ("train", "update", "inner")
        assert profctx.current() == profctx.Scope()
    assert summary(got) == [((3,), "train", ["inner"])]


def test_block_objects_are_single_use() -> None:
    block = profctx.profile_step(1)
    with block, pytest.raises(RuntimeError, match="one per with-block"), block:
        pass


@pytest.mark.parametrize(("step", "role"), [("3", None), (True, None), (None, ""), (None, 5)])
def test_bad_block_arguments(step: Any, role: Any) -> None:
    with pytest.raises(ValueError, match=r"step|role"):
        profctx.profile_step(step, role).__enter__()
