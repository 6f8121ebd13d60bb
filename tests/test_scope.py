"""The ambient scope: nesting, isolation between asyncio tasks and threads, value behaviour."""

from __future__ import annotations

import asyncio
import threading

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
