"""Propagation: carriers, adopt, carried config, threads, the reserved keyword, pickling by value."""

from __future__ import annotations

import asyncio
import inspect
import json
import logging
import os
import pickle
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

import profctx
from profctx.process import _propagate
from profctx.process._owner import OWNER
from profctx.process._propagate import CARRIER_KEY
from profctx.records import _manifest


def _configure(tmp_path: Path, **fields: Any) -> None:
    base: dict[str, Any] = dict(steps="1:3", mode="role", ranks="all", save_path=str(tmp_path), tool="recording",
                                warmup=False, exit_hooks=False, run_id="run-prop")
    base.update(fields)
    profctx.configure(**base)


# -- carriers -----------------------------------------------------------------------------------


@pytest.mark.parametrize("kind", ["dict", "env", "headers"])
def test_inject_extract_round_trip(tmp_path: Path, kind: Any) -> None:
    _configure(tmp_path)
    carrier: dict[str, Any] = {}
    with profctx.profile_step(2, role="rollout", tag="a"):
        profctx.inject(carrier, kind, rank=3, world_size=4)
    assert json.loads(json.dumps(carrier)) == carrier  # JSON-safe in every form
    if kind == "headers":
        carrier = {k.upper(): v for k, v in carrier.items()}  # header names are case-insensitive
    snap = profctx.extract(carrier, kind)
    assert snap is not None
    assert snap["scope"] == {"step": 2, "roles": ["rollout"], "tags": {"tag": "a"}}
    assert (snap["rank"], snap["world_size"]) == (3, 4)
    assert snap["config"]["run_id"] == "run-prop" and snap["config"]["rank"] is None


def test_extract_from_empty_carriers_gives_none() -> None:
    assert profctx.extract({}) is None
    assert profctx.extract({}, "env") is None
    assert profctx.extract({"other": "x"}, "headers") is None


def test_incompatible_version_is_an_error_logged_once(caplog: pytest.LogCaptureFixture) -> None:
    future = {CARRIER_KEY: {"v": 99, "scope": {"step": 1}}}
    with caplog.at_level(logging.ERROR, logger="profctx"):
        assert profctx.extract(future) is None
        assert profctx.extract(future) is None
    errors = [r for r in caplog.records if "version 99" in r.getMessage()]
    assert len(errors) == 1
    with profctx.adopt({"v": 99, "scope": {}}) as scope:  # the block runs, unprofiled
        assert scope == profctx.Scope()


def test_unreadable_env_carrier_is_refused(caplog: pytest.LogCaptureFixture) -> None:
    with caplog.at_level(logging.ERROR, logger="profctx"):
        assert profctx.extract({"PROFCTX_CONTEXT": "{not json"}, "env") is None
    assert any("PROFCTX_CONTEXT is not JSON" in r.getMessage() for r in caplog.records)


def test_inject_refuses_unknown_kind() -> None:
    with pytest.raises(ValueError, match="kind: 'grpc'"):
        profctx.inject({}, "grpc")  # type: ignore[arg-type]


# -- adopt and the carried config ---------------------------------------------------------------------


def test_adopt_in_a_spawned_process_uses_the_carried_config(tmp_path: Path) -> None:
    _configure(tmp_path)
    env = dict(os.environ)
    with profctx.profile_step(1, role="rollout"):
        profctx.inject(env, "env", rank=1, world_size=2)
    child = textwrap.dedent("""
        import os, profctx
        assert not profctx.is_configured()
        with profctx.adopt(profctx.extract(os.environ)) as scope:
            with profctx.profile_step(role="engine"):
                print(profctx.current().path, scope.step)
    """)
    out = subprocess.run([sys.executable, "-c", child], env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["rollout/engine", "1"]
    records = [r for r in _manifest.read(tmp_path) if r["pid"] != os.getpid()]
    assert len(records) == 1
    (child_capture,) = records
    assert child_capture["status"] == "ok"
    assert child_capture["run"] == "run-prop"
    assert (child_capture["rank"], child_capture["world_size"]) == (1, 2)
    assert child_capture["role"] == "rollout/engine"
    assert (tmp_path / child_capture["files"][0]["path"]).is_file()


def test_adopt_in_step_mode_opens_a_step_capture(tmp_path: Path) -> None:
    _configure(tmp_path, mode="step")
    with profctx.profile_step(2):
        snap = _propagate.snapshot()
    profctx.reset()
    with profctx.adopt(snap):
        assert profctx.current().step == 2
    profctx.flush()
    records = _manifest.read(tmp_path)
    assert len(records) == 2  # the sender's step capture, then the adopting block's own
    assert all(r["status"] == "ok" and r["step"] == 2 and r["role"] is None for r in records)


def test_carried_config_is_not_rebuilt_for_the_same_config(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    _configure(tmp_path)
    with profctx.profile_step(1):
        no_rank = _propagate.snapshot()
        rank1 = _propagate.snapshot(rank=1, world_size=2)
        rank0 = _propagate.snapshot(rank=0, world_size=2)
    profctx.reset()
    with profctx.adopt(no_rank):
        first = OWNER.runtime
    with profctx.adopt(no_rank):
        assert OWNER.runtime is first
    with profctx.adopt(rank1):  # a rank arrives: the identity is set
        ranked = OWNER.runtime
        assert ranked is not first and ranked is not None and ranked.identity().rank == 1
    with caplog.at_level(logging.WARNING, logger="profctx"), profctx.adopt(rank0):
        assert OWNER.runtime is ranked  # one process is one rank: the first one named sticks
    assert any("a call named it rank 0 of 2" in r.getMessage() for r in caplog.records)


def test_own_config_wins_over_the_carried_one(tmp_path: Path) -> None:
    _configure(tmp_path)
    with profctx.profile_step(1):
        snap = _propagate.snapshot()
    _configure(tmp_path / "own", run_id="own-run")
    with profctx.adopt(snap):
        assert profctx.get_config() is not None
        assert profctx.get_config().run_id == "own-run"  # type: ignore[union-attr]


# -- the reserved keyword on @profiled ----------------------------------------------------------------


@profctx.profiled(role="update")
def update(x: int) -> tuple[Any, ...]:
    scope = profctx.current()
    return x, scope.step, scope.path


@profctx.profiled(role="gen")
def numbers(n: int) -> Iterator[tuple[int, Any]]:
    for i in range(n):
        yield i, profctx.current().path


@profctx.profiled(role="coro")
async def coro(x: int) -> tuple[int, Any]:
    return x, profctx.current().path


def test_signature_is_unchanged() -> None:
    def plain(self: Any, x: int, *, y: int = 2) -> None: ...

    assert inspect.signature(profctx.profiled(plain)) == inspect.signature(plain)


# -- threads ----------------------------------------------------------------------------------------


def test_scope_in_tasks_threads_and_pools(tmp_path: Path) -> None:
    def where() -> tuple[Any, str]:
        scope = profctx.current()
        return scope.step, scope.path

    async def main() -> dict[str, Any]:
        loop = asyncio.get_running_loop()
        with ThreadPoolExecutor(1) as plain, profctx.ScopedThreadPoolExecutor(1) as scoped:
            return {
                "create_task": await asyncio.create_task(asyncio.sleep(0, where())),
                "to_thread": await asyncio.to_thread(where),
                "submit": plain.submit(where).result(),
                "submit_bound": plain.submit(profctx.bind(where)).result(),
                "submit_scoped": scoped.submit(where).result(),
                "run_in_executor": await loop.run_in_executor(plain, where),
                "run_in_executor_bound": await loop.run_in_executor(plain, profctx.bind(where)),
                "run_in_executor_scoped": await loop.run_in_executor(scoped, where),
            }

    async def in_step() -> dict[str, Any]:
        async with profctx.profile_step(2, role="rollout"):
            return await main()

    seen = asyncio.run(in_step())
    inside = (2, "rollout")
    assert seen["create_task"] == asyncio.run(asyncio.sleep(0, inside))
    assert seen["to_thread"] == inside
    assert seen["submit"] == (None, "") and seen["run_in_executor"] == (None, "")  # the gap profctx fills
    for key in ("submit_bound", "submit_scoped", "run_in_executor_bound", "run_in_executor_scoped"):
        assert seen[key] == inside, key


def test_bound_callable_sees_the_scope_of_where_it_was_bound() -> None:
    with profctx.profile_step(4):
        bound = profctx.bind(lambda: profctx.current().step)
    assert bound() == 4
    assert profctx.current().step is None


# -- pickling by value ----------------------------------------------------------------------------------


def test_a_by_value_copy_of_a_profiled_method_is_still_profiled(tmp_path: Path) -> None:
    cloudpickle = pytest.importorskip("ray.cloudpickle")  # Ray's own copy: what pickles actor classes

    class Local:  # defined in a function: cloudpickle pickles it by value
        @profctx.profiled(role="work")
        def work(self, x: int) -> tuple[int, str]:
            return x + 1, profctx.current().path

        @profctx.profiled(role="agen")
        async def agen(self, n: int) -> Any:
            for i in range(n):
                yield i, profctx.current().path

    # Ray keeps class-accessed (bound) wrappers in closures it pickles, too.
    bound = Local.work
    signature = inspect.signature(Local.__dict__["work"])
    assert str(signature) == "(self, x: 'int') -> 'tuple[int, str]'"  # the user's, not a trampoline's
    # (In the process that pickled it, cloudpickle updates the same class: ``copy is Local``.)
    copy, bound_copy = pickle.loads(cloudpickle.dumps((Local, bound)))
    assert copy.work.__name__ == "work" and copy.work.__qualname__.endswith("Local.work")
    _configure(tmp_path)
    assert copy().work(1) == (2, "")  # out of any step: straight through
    with profctx.profile_step(1):
        assert copy().work(1) == (2, "work")
        assert bound_copy(copy(), 2) == (3, "work")

        async def drain() -> list[Any]:
            return [item async for item in copy().agen(2)]

        assert asyncio.run(drain()) == [(0, "agen"), (1, "agen")]
    profctx.flush()
    assert sorted(r["role"] for r in _manifest.read(tmp_path)) == ["agen", "work", "work"]
