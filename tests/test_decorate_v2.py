"""@profiled goes through the same path as profile_step: engines, foreign callables, methods, Scope.

Engines are driven by a real :class:`profctx.engines.EngineAdapter` subclass whose engine
calls append to a log, so the order "engine start, body, engine stop" is observed directly.
"""

from __future__ import annotations

import asyncio
import functools
import operator
from collections.abc import AsyncIterator, Iterator
from typing import Any

import pytest

import profctx
from profctx import Scope, profiled
from profctx.engines import EngineAdapter, detach
from profctx.engines._base import EngineRequest, Outcome
from profctx.testing import Captured, capture

LOG: list[str] = []


class LoggingEngine(EngineAdapter):
    """An engine whose profiler start and stop append to :data:`LOG`."""

    engine = "logging"

    async def _start(self, request: EngineRequest) -> Outcome:
        LOG.append(f"engine start {request.step} {'/'.join(request.roles)}")
        return Outcome()

    async def _stop(self, request: EngineRequest) -> Outcome:
        LOG.append(f"engine stop {request.step} {'/'.join(request.roles)}")
        return Outcome()


@pytest.fixture(autouse=True)
def _engine() -> Iterator[LoggingEngine]:
    LOG.clear()
    yield LoggingEngine()
    detach()


@profiled(role="rollout")
def generate(n: int) -> Iterator[int]:
    for i in range(n):
        LOG.append(f"body {profctx.current().path}")
        yield i


@profiled(role="rollout")
async def agenerate(n: int) -> AsyncIterator[int]:
    for i in range(n):
        await asyncio.sleep(0)
        LOG.append(f"body {profctx.current().path}")
        yield i


def test_generator_starts_and_stops_attached_engines_like_a_role_block(_engine: LoggingEngine) -> None:
    with capture(steps=[1]) as got:
        profctx.attach(_engine)
        with profctx.profile_step(1):
            assert list(generate(2)) == [0, 1]
        LOG.append("after step")
        with profctx.profile_step(2):  # out of the window: no engine
            assert list(generate(1)) == [0]
    assert LOG == ["engine start 1 rollout", "body rollout", "body rollout", "engine stop 1 rollout",
                   "after step", "body "]
    assert [(c.kind, c.steps, c.role, c.ranges) for c in got] == [
        ("engine", (1,), "rollout", []), ("step", (1,), None, ["rollout"])]


def test_async_generator_starts_and_stops_attached_engines_like_a_role_block(_engine: LoggingEngine) -> None:
    async def loop() -> list[int]:
        with profctx.profile_step(1):
            return [i async for i in agenerate(2)]

    with capture(steps=[1]) as got:
        profctx.attach(_engine)
        assert asyncio.run(loop()) == [0, 1]
    assert LOG == ["engine start 1 rollout", "body rollout", "body rollout", "engine stop 1 rollout"]
    assert [(c.kind, c.steps, c.role, c.ranges) for c in got] == [
        ("engine", (1,), "rollout", []), ("step", (1,), None, ["rollout"])]


def test_generator_and_profile_step_drive_engines_identically(_engine: LoggingEngine) -> None:
    def by_block() -> list[int]:
        with profctx.profile_step(role="rollout"):
            out = []
            for i in range(2):
                LOG.append(f"body {profctx.current().path}")
                out.append(i)
            return out

    runs: list[tuple[list[str], list[tuple[Any, ...]]]] = []
    for body in (by_block, lambda: list(generate(2))):
        LOG.clear()
        with capture(steps=[1], mode="role") as got:
            profctx.attach(_engine)
            with profctx.profile_step(1):
                assert body() == [0, 1]
        detach()
        runs.append((list(LOG), sorted((c.kind or "", c.steps, c.role, c.status) for c in got)))
    assert runs[0] == runs[1]
    assert runs[0] == (["engine start 1 rollout", "body rollout", "body rollout", "engine stop 1 rollout"],
                       [("engine", (1,), "rollout", "ok"), ("role", (1,), "rollout", "ok")])


@pytest.mark.parametrize("config", [{"roles": ["update"]}, {"roles": ["nothing"], "engines": {"roles": ["update"]}}],
                         ids=["range", "engine"])
def test_a_role_given_as_a_path_is_matched_by_its_parts_as_a_block_is(
    _engine: LoggingEngine, config: dict[str, Any]
) -> None:
    """``@profiled(role="train/update")`` ends in ``update``, like ``profile_step(role="train/update")``:
    the role filter and the engine roles select it by its last name in both forms."""
    @profiled(role="train/update")
    def update() -> None:
        LOG.append(f"body {profctx.current().path}")

    def by_block() -> None:
        with profctx.profile_step(role="train/update"):
            LOG.append(f"body {profctx.current().path}")

    runs: list[tuple[list[str], list[tuple[Any, ...]]]] = []
    for body in (by_block, update):
        LOG.clear()
        with capture(steps=[1], **config) as got:
            profctx.attach(_engine)
            with profctx.profile_step(1):
                body()
        detach()
        runs.append((list(LOG), sorted((c.kind or "", c.steps, c.role or "", tuple(c.ranges)) for c in got)))
    assert runs[0] == runs[1]
    if "engines" in config:
        assert runs[1][0] == ["engine start 1 train/update", "body train/update", "engine stop 1 train/update"]
    else:
        assert runs[1] == (["body train/update"], [("step", (1,), "", ("update",))])


def test_an_abandoned_generator_still_stops_the_engine(_engine: LoggingEngine) -> None:
    with capture(steps=[1]):
        profctx.attach(_engine)
        with profctx.profile_step(1):
            gen = generate(5)
            assert next(gen) == 0
            gen.close()
    assert LOG == ["engine start 1 rollout", "body rollout", "engine stop 1 rollout"]


# -- callables that are not plain functions ------------------------------------------------------


class Scaler:
    def __init__(self, k: int) -> None:
        self.k = k

    def __call__(self, x: int) -> tuple[int, str]:
        return x * self.k, profctx.current().path


def roles_seen(got: list[Captured]) -> list[list[str]]:
    return [c.ranges for c in got]


FOREIGN: list[tuple[str, Any, tuple[Any, ...], Any]] = [
    ("len", len, ([1, 2, 3],), 3),
    ("partial", functools.partial(int, base=2), ("101",), 5),
    ("itemgetter", operator.itemgetter(1), (("a", "b"),), "b"),
    ("instance", Scaler(3), (2,), (6, "")),
]


@pytest.mark.parametrize(("label", "target", "args", "result"), FOREIGN, ids=[f[0] for f in FOREIGN])
def test_foreign_callables_work_idle_and_open_their_role_in_a_step(
    label: str, target: Any, args: tuple[Any, ...], result: Any
) -> None:
    wrapped = profiled(role=label)(target)
    assert wrapped(*args) == result  # idle: straight through
    with capture(steps=[1], mode="role") as got:
        with profctx.profile_step(1):
            inside = wrapped(*args)
        with profctx.profile_step(2):
            assert wrapped(*args) == result  # out of the window: no capture
    if label == "instance":
        assert inside == (6, "instance")  # the role is ambient while the instance runs
    else:
        assert inside == result
    assert [(c.steps, c.role, c.status) for c in got] == [((1,), label, "ok")]


def test_default_role_of_foreign_callables_is_a_readable_name() -> None:
    with capture(steps=[1], mode="role") as got, profctx.profile_step(1):
        profiled(len)([1])
        profiled(functools.partial(int, base=2))("1")
        profiled(Scaler(1))(1)
    assert [c.role for c in got] == ["len", "int", "Scaler"]


def test_non_callables_are_refused_at_decoration() -> None:
    for bad in (3, None, 1.5, [len]):
        with pytest.raises(TypeError, match="not callable"):
            profiled(role="x")(bad)


# -- methods --------------------------------------------------------------------------------------


class Trainer:
    def __init__(self) -> None:
        self.updates = 0

    @profiled(role="actor_update")
    def update(self, batch: list[int]) -> tuple[int, str]:
        self.updates += 1
        return sum(batch), profctx.current().path


def test_method_called_normally_while_idle_returns_its_value_unprofiled() -> None:
    trainer = Trainer()
    with capture(steps=[5]) as got:
        assert trainer.update([1, 2]) == (3, "")  # profctx configured but no step is running
        with profctx.profile_step(4):
            assert trainer.update([1]) == (1, "actor_update")  # out of the window: named and timed, not captured
    assert trainer.updates == 2
    assert got == []


def test_method_called_normally_inside_an_in_window_step_is_profiled() -> None:
    trainer = Trainer()
    with capture(steps=[5], mode="role") as got, profctx.profile_step(5):
        assert trainer.update([1, 2]) == (3, "actor_update")
    with capture(steps=[5], mode="step") as in_step, profctx.profile_step(5):
        assert trainer.update([4]) == (4, "actor_update")
    assert trainer.updates == 2
    assert [(c.steps, c.role, c.status) for c in got] == [((5,), "actor_update", "ok")]
    assert [(c.steps, c.ranges) for c in in_step] == [((5,), ["actor_update"])]


# -- Scope -----------------------------------------------------------------------------------------


def test_scope_is_frozen() -> None:
    scope = Scope(3, ("train",), {"run": "a"})
    for name, value in (("step", 4), ("roles", ()), ("tags", {}), ("new", 1)):
        with pytest.raises(AttributeError, match="immutable"):
            setattr(scope, name, value)
    with pytest.raises(AttributeError, match="immutable"):
        del scope.step
    with pytest.raises(TypeError):
        scope.tags["run"] = "b"  # type: ignore[index]
    assert (scope.step, scope.roles, dict(scope.tags)) == (3, ("train",), {"run": "a"})


def test_scope_with_list_tags_is_hashable_and_equal_scopes_hash_alike() -> None:
    a = Scope(1, ("rollout",), {"batch": [1, 2], "meta": {"k": [3]}})
    b = Scope(1, ("rollout",), {"meta": {"k": [3]}, "batch": [1, 2]})
    assert a == b and hash(a) == hash(b)
    assert len({a, b, Scope(1, ("rollout",), {"batch": [1, 3]})}) == 2
    with profctx.profile_step(1, batch=[1, 2]):
        assert isinstance(hash(profctx.current()), int)
        assert {profctx.current(): "ok"}[profctx.current()] == "ok"


# -- plain functions: a real function with the same parameters ---------------------------------------


_SHARED: list[int] = []


def _shapes(a: int, b: int = 2, /, c: int = 3, *rest: int, d: int, e: list[int] = _SHARED, **extra: Any) -> Any:
    return a, b, c, rest, d, e, extra, profctx.current().path


shapes = profiled(role="shapes")(_shapes)


def test_a_decorated_function_takes_arguments_exactly_as_the_undecorated_one() -> None:
    undecorated = _shapes
    calls = [((1,), {"d": 4}), ((1, 2, 3, 4, 5), {"d": 6, "z": 7}), ((1,), {"c": 9, "d": 0, "e": [1]})]
    for args, kwargs in calls:
        assert shapes(*args, **kwargs)[:-1] == undecorated(*args, **kwargs)[:-1]
    assert shapes(1, d=4)[5] is _SHARED  # the same default object, not a copy
    for bad_args, bad_kwargs in [((), {"d": 1}), ((1,), {}), ((1, 2, 3), {"c": 1, "d": 1})]:
        with pytest.raises(TypeError) as theirs:
            undecorated(*bad_args, **bad_kwargs)
        with pytest.raises(TypeError) as ours:
            shapes(*bad_args, **bad_kwargs)
        assert str(ours.value) == str(theirs.value).replace(undecorated.__qualname__, shapes.__qualname__)
    with capture(steps=[1], mode="role") as got, profctx.profile_step(1):
        assert shapes(1, 2, 3, 4, d=5, z=6) == (1, 2, 3, (4,), 5, _SHARED, {"z": 6}, "shapes")
    assert [(c.steps, c.role) for c in got] == [((1,), "shapes")]


def test_parameters_named_like_the_wrappers_own_still_work() -> None:
    @profiled(role="odd")
    def odd(_profctx_switch: int, _profctx_fn: int = 2) -> tuple[int, int, str]:
        return _profctx_switch, _profctx_fn, profctx.current().path

    assert odd(1) == (1, 2, "")
    with capture(steps=[1], mode="role") as got, profctx.profile_step(1):
        assert odd(1, _profctx_fn=3) == (1, 3, "odd")
    assert [c.role for c in got] == ["odd"]


class Bound:
    @profiled(role="bound")
    def work(self, x: int) -> str:
        return f"{x}:{profctx.current().path}"

    @profiled(role="abound")
    async def awork(self, x: int) -> str:
        await asyncio.sleep(0)
        return f"{x}:{profctx.current().path}"


def test_a_method_bound_before_configure_is_captured_later() -> None:
    profctx.reset()
    work, awork = Bound().work, Bound().awork  # bound while nothing can be captured
    assert work(1) == "1:" and asyncio.run(awork(1)) == "1:"
    with capture(steps=[1], mode="role") as got, profctx.profile_step(1):
        assert work(2) == "2:bound"
        assert asyncio.run(awork(2)) == "2:abound"
    assert [(c.steps, c.role) for c in got] == [((1,), "bound"), ((1,), "abound")]
    assert asyncio.iscoroutinefunction(Bound.awork) and asyncio.iscoroutinefunction(awork)


def test_a_switch_unpickles_as_the_receiving_processes_switch() -> None:
    import pickle

    from profctx.process._owner import OWNER

    switch = OWNER.switch("pickled-role")
    assert pickle.loads(pickle.dumps(switch)) is switch


def test_a_by_value_copy_in_another_process_is_still_profiled(tmp_path: Any) -> None:
    cloudpickle = pytest.importorskip("ray.cloudpickle")
    import subprocess
    import sys

    class Local:  # defined in a function: cloudpickle copies it, its methods and their closures by value
        @profiled(role="copied")
        def work(self, x: int) -> str:
            return f"{x}:{profctx.current().path}"

        @profiled(role="acopied")
        async def awork(self, x: int) -> str:
            return f"{x}:{profctx.current().path}"

    blob = tmp_path / "local.pkl"
    blob.write_bytes(cloudpickle.dumps(Local))
    script = f"""
import asyncio, pickle, profctx
from profctx.testing import capture
Local = pickle.loads(open({str(blob)!r}, "rb").read())
with capture(steps=[1], mode="role") as got:
    with profctx.profile_step(1):
        print(Local().work(1), asyncio.run(Local().awork(1)))
    print(Local().work(2), asyncio.run(Local().awork(2)))
print(*[f"{{c.steps[0]}}:{{c.role}}" for c in got])
"""
    out = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    assert out.stdout.split() == ["1:copied", "1:acopied", "2:", "2:", "1:copied", "1:acopied"]


@profiled(role="outer")
def outer_sync(fail: bool) -> str:
    inner_sync()
    if fail:
        raise KeyError("from the body")
    return profctx.current().path


@profiled(role="gen")
def inner_sync() -> None:
    LOG.append(f"body {profctx.current().path}")


@profiled(role="outer")
async def outer_async(fail: bool) -> str:
    await inner_async()
    if fail:
        raise KeyError("from the body")
    return profctx.current().path


@profiled(role="gen")
async def inner_async() -> None:
    await asyncio.sleep(0)
    LOG.append(f"body {profctx.current().path}")


@pytest.mark.parametrize("form", ["function", "coroutine"])
def test_a_role_the_filter_leaves_out_still_names_the_role_capture_it_holds(form: str) -> None:
    """Role mode: ``outer`` is filtered out and opens nothing, yet the capture of ``gen`` inside it
    is ``outer/gen`` (as with blocks), the scope is restored after it, and its exceptions pass
    through unchanged."""
    def calls() -> None:
        assert outer_sync(False) == "outer"
        with pytest.raises(KeyError) as raised:
            outer_sync(True)
        assert raised.value.args == ("from the body",)
        assert profctx.current().path == ""

    async def acalls() -> None:  # one task: a scope left behind would show in it
        assert await outer_async(False) == "outer"
        with pytest.raises(KeyError) as raised:
            await outer_async(True)
        assert raised.value.args == ("from the body",)
        assert profctx.current().path == ""

    with capture(steps=[1], mode="role", roles=["gen"]) as got, profctx.profile_step(1):
        if form == "function":
            calls()
        else:
            asyncio.run(acalls())
    assert LOG == ["body outer/gen", "body outer/gen"]
    assert [(c.kind, c.steps, c.role, c.status) for c in got] == [("role", (1,), "outer/gen", "ok")] * 2


def test_a_generator_proxy_is_told_apart_without_importing_its_module_by_name() -> None:
    # A Ray worker names the methods that lost their @profiled wrapper; a generator's wrapper is a
    # wrapt proxy, which it recognises by asking the process layer (no sys.modules look-up).
    from profctx.process._decorate import is_proxy
    from profctx.ray import _worker

    def bare(self: object) -> None: ...

    bare.__profctx_role__ = "lost"  # type: ignore[attr-defined]

    class Copied:
        lost = bare

        @profiled(role="kept")
        def kept(self) -> Iterator[int]:
            yield 1

    assert is_proxy(vars(Copied)["kept"]) and not is_proxy(bare) and not is_proxy(vars(Copied)["kept"].__wrapped__)
    assert _worker._undecorated(Copied) == ["lost"]
