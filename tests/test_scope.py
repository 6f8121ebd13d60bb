"""The ambient scope: nesting, isolation between asyncio tasks and threads, value behaviour."""

from __future__ import annotations

import asyncio
import threading
from pathlib import Path

import pytest

import profctx
from profctx import Scope


def test_scope_values() -> None:
    scope = Scope(3, ("train", "actor_update"), {"b": 2, "a": 1})
    assert scope.role == "actor_update" and scope.path == "train/actor_update"
    assert Scope.from_dict(scope.to_dict()) == scope
    assert hash(Scope.from_dict(scope.to_dict())) == hash(scope)
    assert dict(scope.tags) == {"a": 1, "b": 2}
    assert Scope().role is None and Scope().path == ""


def test_each_task_sees_its_own_scope() -> None:
    seen: dict[int, list[object]] = {}

    async def task(i: int) -> None:
        async with profctx.profile_step(i, role=f"r{i}"):
            for _ in range(5):
                await asyncio.sleep(0)
                cur = profctx.current()
                seen.setdefault(i, []).append((cur.step, cur.path))

    async def main() -> None:
        async with profctx.profile_step(role="driver"):
            await asyncio.gather(*(task(i) for i in range(8)))
            assert profctx.current().path == "driver"

    asyncio.run(main())
    for i, values in seen.items():
        assert values == [(i, f"driver/r{i}")] * 5
    assert profctx.current() == Scope()


def test_threads_do_not_share_scopes() -> None:
    barrier = threading.Barrier(4)
    results: dict[int, tuple[int | None, str]] = {}

    def worker(i: int) -> None:
        with profctx.profile_step(i, role=f"t{i}"):
            barrier.wait(5)
            cur = profctx.current()
            results[i] = (cur.step, cur.path)

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert results == {i: (i, f"t{i}") for i in range(4)}


def test_inner_step_overrides_and_restores() -> None:
    with profctx.profile_step(1, role="a"):
        with profctx.profile_step(2):
            assert profctx.current().step == 2 and profctx.current().path == "a"
        assert profctx.current().step == 1


def _check_block_scopes() -> None:
    with profctx.profile_step(7, run="a") as outer, profctx.profile_step(role="train/fwd", k=1) as inner:
        expected = ((outer, Scope(7, (), {"run": "a"})), (inner, Scope(7, ("train", "fwd"), {"run": "a", "k": 1})))
        for scope, same in expected:
            assert type(scope) is Scope and isinstance(scope, Scope)
            assert scope == same and hash(scope) == hash(same) and repr(scope) == repr(same)
            for name in ("step", "roles", "new"):
                with pytest.raises(AttributeError, match="immutable"):
                    setattr(scope, name, 1)
        assert profctx.current() is inner
        with profctx.profile_step(role="x") as plain:
            assert plain == Scope(7, ("train", "fwd", "x"), {"run": "a", "k": 1})
    with pytest.raises(ValueError, match="role"), profctx.profile_step(role="/"):
        pass
    assert profctx.current() == Scope()


def test_scopes_of_blocks_that_open_nothing_are_scope_values(tmp_path: Path) -> None:
    # Not configured, then configured with the block's step out of the window: the scope a
    # block hands out and makes ambient is a real, frozen Scope equal to the one constructed.
    _check_block_scopes()
    profctx.configure(steps=[1000], save_path=str(tmp_path), tool="noop", warmup=False)
    _check_block_scopes()


def test_a_scope_pickles_and_copies_as_an_equal_frozen_scope() -> None:
    import copy
    import pickle

    with profctx.profile_step(3, role="train/update", seed=7) as scope:
        pass
    for twin in (pickle.loads(pickle.dumps(scope)), copy.copy(scope), copy.deepcopy(scope)):
        assert twin == scope and hash(twin) == hash(scope) and type(twin) is Scope
        assert (twin.step, twin.roles, dict(twin.tags)) == (3, ("train", "update"), {"seed": 7})
        with pytest.raises(AttributeError):
            twin.step = 4  # type: ignore[misc]
