"""@profiled on every kind of callable: roles captured, signatures kept, off path bypassed."""

from __future__ import annotations

import asyncio
import functools
import inspect
from collections.abc import AsyncIterator, Iterator

import pytest

import profctx
from profctx import profiled
from profctx.testing import capture


@profiled
def plain(x: int, *, y: int = 2) -> int:
    """Add."""
    return x + y + len(profctx.current().roles)


@profiled(role="gen")
def numbers(n: int) -> Iterator[int]:
    for i in range(n):
        yield i * 10 + len(profctx.current().roles)
    return


@profiled(role="agen")
async def anumbers(n: int) -> AsyncIterator[str]:
    for i in range(n):
        await asyncio.sleep(0)
        yield f"{i}:{profctx.current().path}"


@profiled(role="coro")
async def coro(x: int) -> str:
    await asyncio.sleep(0)
    return f"{x}:{profctx.current().path}"


class Worker:
    def __init__(self) -> None:
        self.calls = 0

    @profiled(role="actor_update")
    def update(self, batch: list[int]) -> int:
        self.calls += 1
        return sum(batch)

    @profiled
    def default_role(self) -> str:
        return profctx.current().path

    @profiled(role="cm")
    @classmethod
    def make(cls, n: int) -> str:
        return f"{cls.__name__}:{n}:{profctx.current().path}"

    @profiled(role="sm")
    @staticmethod
    def helper(n: int) -> str:
        return f"{n}:{profctx.current().path}"

    @classmethod
    @profiled(role="cm2")
    def make2(cls) -> str:
        return f"{cls.__name__}:{profctx.current().path}"


def test_signatures_and_metadata_are_kept() -> None:
    assert plain.__name__ == "plain" and plain.__doc__ == "Add."
    assert str(inspect.signature(plain)) == "(x: 'int', *, y: 'int' = 2) -> 'int'"
    assert list(inspect.signature(Worker.update).parameters) == ["self", "batch"]
    assert list(inspect.signature(Worker().update).parameters) == ["batch"]
    assert list(inspect.signature(Worker.make).parameters) == ["n"]
    assert inspect.iscoroutinefunction(coro)
    assert inspect.isgeneratorfunction(numbers)
    assert inspect.isasyncgenfunction(anumbers)
    assert functools.wraps(plain)(lambda: None).__wrapped__ is plain  # type: ignore[attr-defined]
    assert inspect.unwrap(plain).__name__ == "plain"


def test_off_path_calls_through_without_setting_a_role() -> None:
    assert plain(1) == 3
    assert list(numbers(2)) == [0, 10]
    with profctx.profile_step(1):
        assert plain(1) == 3  # unconfigured: no role set


def test_every_kind_captures_in_role_mode() -> None:
    worker = Worker()
    with capture(steps=[1], mode="role") as got:
        with profctx.profile_step(1):
            assert plain(1, y=0) == 2
            assert list(numbers(3)) == [1, 11, 21]
            assert asyncio.run(coro(5)) == "5:coro"
            assert asyncio.run(_collect(anumbers(2))) == ["0:agen", "1:agen"]
            assert worker.update([1, 2]) == 3
            assert worker.default_role() == "Worker.default_role"
            assert Worker.make(2) == "Worker:2:cm"
            assert worker.make(3) == "Worker:3:cm"
            assert Worker.helper(4) == "4:sm"
            assert Worker.make2() == "Worker:cm2"
        with profctx.profile_step(2):
            assert plain(1) == 4  # out of the window: the role is set (and timed for the timeline), no capture
        assert plain(1) == 3  # outside any step: straight through
    assert [c.role for c in got] == ["plain", "gen", "coro", "agen", "actor_update", "Worker.default_role",
                                     "cm", "cm", "sm", "cm2"]
    assert all(c.steps == (1,) and c.status == "ok" for c in got)
    assert worker.calls == 1


async def _collect(agen: AsyncIterator[str]) -> list[str]:
    return [item async for item in agen]


def test_generator_scope_does_not_leak_between_resumes() -> None:
    with capture(steps=[1], mode="role") as got:
        with profctx.profile_step(1):
            gen = numbers(3)
            assert next(gen) == 1
            assert profctx.current().roles == ()  # the caller's scope between resumes
            assert next(gen) == 11
            gen.close()
        assert profctx.current() == profctx.Scope()
    assert [(c.role, c.status) for c in got] == [("gen", "ok")]


def test_user_exceptions_pass_through_unchanged() -> None:
    error = KeyError("boom")

    @profiled(role="fails")
    def fails() -> None:
        raise error

    @profiled(role="afails")
    async def afails() -> None:
        raise error

    @profiled(role="gfails")
    def gfails() -> Iterator[int]:
        yield 1
        raise error

    with capture(steps=[1], mode="role") as got, profctx.profile_step(1):
        with pytest.raises(KeyError) as info:
            fails()
        assert info.value is error
        assert info.traceback[-1].name == "fails"
        with pytest.raises(KeyError) as info:
            asyncio.run(afails())
        assert info.value is error
        with pytest.raises(KeyError) as info:
            list(gfails())
        assert info.value is error
    assert [(c.role, c.status) for c in got] == [("fails", "ok"), ("afails", "ok"), ("gfails", "ok")]


def test_generator_send_and_throw_are_forwarded() -> None:
    @profiled(role="echo")
    def echo() -> Iterator[object]:
        received: object = None
        while True:
            try:
                received = yield received
            except ValueError as exc:
                received = f"caught {exc}"

    with capture(steps=[1], mode="role") as got, profctx.profile_step(1):
        gen = echo()
        assert next(gen) is None
        assert gen.send("a") == "a"
        assert gen.throw(ValueError("x")) == "caught x"
        gen.close()
    assert [c.role for c in got] == ["echo"]


def test_decorator_arguments_are_checked() -> None:
    with pytest.raises(TypeError, match="keyword"):
        profiled("role")  # type: ignore[call-overload]
    with pytest.raises(TypeError, match="not callable"):
        profiled(42)  # type: ignore[call-overload]
