"""One rule, several copies: the block fast paths agree with the general path they stand for.

``profile_step.__enter__`` writes out ``Runtime.opens_nothing`` and ``Scope.child`` (no Python
call per block), and ``@profiled`` skips the block object for a role that only joins the scope
(``_block.enter_role``). Each copy is an optimisation, so switching it off must change nothing
a user can see: the captures (steps, role, status, ranges, markers) and every scope a block
body reads with ``profctx.current()``.
"""

from __future__ import annotations

import functools
import sys
from collections.abc import Callable, Iterator
from typing import Any

import pytest
from hypothesis import HealthCheck, example, given, settings
from hypothesis import strategies as st

import profctx
from profctx import Scope, profile_step, profiled
from profctx.process._owner import OWNER
from profctx.process._runtime import Runtime
from profctx.testing import Captured, RecordingBackend, RoleBlock, capture
from profctx.testing import strategies as pst

SETTINGS = settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow,
                                                                             HealthCheck.function_scoped_fixture])
NAMES = ["rollout", "gen", "train"]
TAGS = st.dictionaries(st.sampled_from(["a", "b"]), st.integers(0, 3), max_size=2)


@st.composite
def configs(draw: st.DrawFn) -> dict[str, Any]:
    """Configurations across what the fast paths read: window, mode, contiguity, role filter, rank."""
    mode = draw(st.sampled_from(["step", "role"]))
    return {
        "steps": draw(pst.windows(12, 6)),
        "mode": mode,
        "contiguous": mode == "step" and draw(st.booleans()),
        "roles": draw(st.sampled_from([(), ("gen",), ("rollout",)])),
        "ranks": [0],
        "rank": draw(st.sampled_from([0, 0, 1])),
        "world_size": 2,
    }


class _NoFastPath(frozenset):  # type: ignore[type-arg]
    """The window's steps, except that ``profile_step.__enter__``'s own test finds every step in it.

    So no block takes the fast path; everything else (``Runtime.role_block``...) reads the window.
    """

    def __contains__(self, item: object) -> bool:
        return sys._getframe(1).f_code is _ENTER or super().__contains__(item)


_ENTER = profile_step.__enter__.__code__


def _run(config: dict[str, Any], steps: list[int], blocks: tuple[RoleBlock, ...],
         enter: Callable[[RoleBlock, list[str]], None], slow: bool) -> tuple[list[tuple[Any, ...]], list[str]]:
    """Run the loop; return the captures and the scopes block bodies saw (``slow``: no fast path)."""
    seen: list[str] = []
    RecordingBackend.clear()
    with capture(**config) as got:
        runtime = OWNER.runtime
        assert runtime is not None
        if slow:
            runtime.in_window = _NoFastPath(runtime.in_window)
        for step in steps:
            with profile_step(step):
                seen.append(_seen())
                for block in blocks:
                    enter(block, seen)
    return _captures(got), seen


def _captures(got: list[Captured]) -> list[tuple[Any, ...]]:
    return [(c.kind, c.steps, c.role, c.status, c.ranges, c.markers) for c in got]


def _seen() -> str:
    """What a block body can see: its scope, and how many captures are recording around it."""
    live = sum(1 for item in RecordingBackend.log if item.stopped is None)
    return f"{profctx.current()!r} live={live}"


def _with(block: RoleBlock, seen: list[str]) -> None:
    with profile_step(role=block.role):
        seen.append(_seen())
        for child in block.children:
            _with(child, seen)


@functools.cache
def _decorated(role: str) -> Callable[[tuple[RoleBlock, ...], list[str]], None]:
    @profiled(role=role)
    def call(children: tuple[RoleBlock, ...], seen: list[str]) -> None:
        seen.append(_seen())
        for child in children:
            _decorated(child.role)(child.children, seen)
    return call


def _call(block: RoleBlock, seen: list[str]) -> None:
    _decorated(block.role)(block.children, seen)


@pytest.fixture(autouse=True)
def _clean() -> Iterator[None]:
    yield
    profctx.reset()


@SETTINGS
@given(config=configs(), steps=pst.step_sequences(12, 12, repeats=True), blocks=pst.role_trees(names=NAMES))
# A contiguous run left by a step out of the window: that step block must close it.
@example(config={"steps": "2:5", "mode": "step", "contiguous": True, "roles": (), "ranks": [0], "rank": 0,
                 "world_size": 2}, steps=[2, 9, 3], blocks=(RoleBlock("rollout"),))
def test_the_block_fast_path_changes_nothing_a_user_sees(
    config: dict[str, Any], steps: list[int], blocks: tuple[RoleBlock, ...]
) -> None:
    # The fast path's test is Runtime.opens_nothing written out: with it unable to fire, every
    # block goes through Session and Runtime.open, and the captures and scopes are the same.
    assert _run(config, steps, blocks, _with, slow=False) == _run(config, steps, blocks, _with, slow=True)


@SETTINGS
@given(config=configs(), steps=pst.step_sequences(12, 12, repeats=True), blocks=pst.role_trees(names=NAMES))
def test_profiled_and_role_blocks_record_the_same(
    config: dict[str, Any], steps: list[int], blocks: tuple[RoleBlock, ...]
) -> None:
    # @profiled(role=r) and `with profile_step(role=r)` are one rule: same captures, same scopes
    # (a @profiled call goes straight through only where the role would show in no capture).
    with_blocks, scopes = _run(config, steps, blocks, _with, slow=False)
    calls, call_scopes = _run(config, steps, blocks, _call, slow=False)
    assert calls == with_blocks
    # Out of every capture a @profiled call does not set its role (it costs one C call): the
    # role appears in current() wherever the block path shows it inside an in-window step.
    assert len(call_scopes) == len(scopes)


@settings(max_examples=200, deadline=None)
@given(
    parent=st.builds(Scope, st.none() | st.integers(0, 9), st.lists(st.sampled_from(NAMES), max_size=2).map(tuple),
                     TAGS),
    step=st.none() | st.integers(0, 9),
    role=st.none() | st.sampled_from(["gen", "a/b", "train"]),
    tags=TAGS,
    state=st.sampled_from(["unconfigured", "out", "unselected"]),
)
def test_the_scope_a_fast_block_builds_is_the_child_scope(
    parent: Scope, step: int | None, role: str | None, tags: dict[str, int], state: str
) -> None:
    # profile_step.__enter__ and _block.enter_role fill the child scope themselves: it must be
    # exactly Scope.child's, and the parent must be ambient again after the block.
    if state != "unconfigured":
        window = [100] if state == "out" else list(range(10))
        profctx.configure(steps=window, tool="noop", warmup=False, ranks=[0], rank=1, world_size=2,
                          save_path="/tmp/profctx-fast-path", exit_hooks=False)
    with profctx.adopt({"v": 1, "scope": parent.to_dict()}):
        ambient = profctx.current()
        assert ambient == parent
        with profile_step(step, role, **tags) as got:
            assert got == parent.child(step, role, tags) == profctx.current()
            assert type(got) is Scope and hash(got) == hash(parent.child(step, role, tags))
        assert profctx.current() == parent
        if role is not None:
            call = profiled(role=role)(profctx.current)
            inside = call()
            assert inside in (parent, parent.child(None, role, {}))
    profctx.reset()


def test_opens_nothing_is_what_the_block_fast_path_asks() -> None:
    # The method the fast path writes out answers like the runtime does, for each case it names.
    profctx.configure(steps=[3, 4], tool="noop", warmup=False, contiguous=True, save_path="/tmp/profctx-fast-path",
                      exit_hooks=False)
    runtime = OWNER.runtime
    assert isinstance(runtime, Runtime)
    assert runtime.opens_nothing(1, True) and runtime.opens_nothing(None, False)
    assert not runtime.opens_nothing(3, False)
    with profile_step(3):
        pass
    assert runtime.run is not None  # a contiguous run waits for a step block to close it
    assert not runtime.opens_nothing(7, True) and runtime.opens_nothing(7, False)
    with profile_step(7):
        pass
    assert runtime.run is None and runtime.opens_nothing(7, True)
