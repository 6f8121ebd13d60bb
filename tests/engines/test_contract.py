"""The engine adapter contract, written once and run against every adapter kind and version."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from profctx import Scope, profile_step
from profctx.engines import attach, attached, detach

from .conftest import Kit, configure, engine_records, make_kit, run


def _rollout_sync() -> None:
    with profile_step(1), profile_step(role="rollout"):
        pass


async def _rollout_async() -> None:
    async with profile_step(1), profile_step(role="rollout"):
        await asyncio.sleep(0)


def test_sync_with_starts_once_stops_once_and_records(kit: Kit, tmp_path: Path) -> None:
    configure(tmp_path, ranks=[3])  # engines are driven from the attaching process whatever its rank
    attach(kit.adapter)
    seen: list[bool] = []
    with profile_step(1), profile_step(role="rollout"):
        seen.append(kit.active())
    assert seen == [True]
    assert (kit.starts(), kit.stops(), kit.active()) == (1, 1, False)
    [record] = engine_records(tmp_path)
    assert record["status"] == "ok", record
    assert record["engine"] == kit.adapter.engine
    assert (record["replica"], record["step"], record["role"]) == (0, 1, "rollout")
    assert record["folder"].endswith(kit.folder_tail)
    assert record["start_time"] <= record["end_time"]
    assert record["error"] is None


def test_async_with_starts_once_stops_once_and_records(kit: Kit, tmp_path: Path) -> None:
    configure(tmp_path)
    attach(kit.adapter)
    run(_rollout_async())
    assert (kit.starts(), kit.stops(), kit.active()) == (1, 1, False)
    assert [r["status"] for r in engine_records(tmp_path)] == ["ok"]


def test_plain_with_inside_a_running_loop_works(kit: Kit, tmp_path: Path) -> None:
    configure(tmp_path)
    attach(kit.adapter)

    async def main() -> None:
        _rollout_sync()  # a plain `with` in async code: runs on profctx's private loop

    run(main())
    assert (kit.starts(), kit.stops()) == (1, 1)
    assert [r["status"] for r in engine_records(tmp_path)] == ["ok"]


def test_other_roles_and_steps_outside_the_window_start_nothing(kit: Kit, tmp_path: Path) -> None:
    configure(tmp_path, steps=[2])
    attach(kit.adapter)
    with profile_step(1), profile_step(role="rollout"):
        pass
    with profile_step(2), profile_step(role="actor_update"):
        pass
    assert kit.starts() == 0
    assert engine_records(tmp_path) == []


def test_overlapping_matching_roles_start_the_engine_once(kit: Kit, tmp_path: Path) -> None:
    configure(tmp_path, engines={"roles": ["rollout*"]})
    attach(kit.adapter)

    async def task() -> None:
        async with profile_step(role="rollout_generate"):
            await asyncio.sleep(0.05)

    async def main() -> None:
        async with profile_step(1), profile_step(role="rollout"):
            await asyncio.gather(task(), task())

    run(main())
    assert (kit.starts(), kit.stops()) == (1, 1)
    assert len(engine_records(tmp_path)) == 1


def test_only_the_first_replica_profiles_by_default(tmp_path: Path, kit: Kit) -> None:
    second = make_kit(kit.name, tmp_path, replica=1)
    try:
        configure(tmp_path)
        attach(kit.adapter, second.adapter)
        _rollout_sync()
        assert (kit.starts(), second.starts()) == (1, 0)
        configure(tmp_path, engines={"replicas": "all"})
        _rollout_sync()
        assert second.starts() == 1
        assert sorted(r["replica"] for r in engine_records(tmp_path)) == [0, 0, 1]
    finally:
        for close in second.closers:
            close()


def test_direct_use_and_idempotent_stop(kit: Kit, tmp_path: Path) -> None:
    configure(tmp_path)
    scope = Scope(1, ("rollout",))
    assert kit.adapter.start_sync(scope) is True
    assert kit.adapter.start_sync(scope) is False  # never two starts
    kit.adapter.stop_sync()
    kit.adapter.stop_sync()
    assert (kit.starts(), kit.stops()) == (1, 1)
    assert [r["status"] for r in engine_records(tmp_path)] == ["ok"]


def test_unconfigured_adapter_does_nothing(kit: Kit) -> None:
    assert kit.adapter.start_sync(Scope(1, ("rollout",))) is False
    kit.adapter.stop_sync()
    assert kit.starts() == 0


def test_attach_is_idempotent_and_detach_removes(kit: Kit, tmp_path: Path) -> None:
    configure(tmp_path)
    attach(kit.adapter)
    attach(kit.adapter)
    assert attached() == (kit.adapter,)
    _rollout_sync()
    detach(kit.adapter)
    _rollout_sync()
    assert kit.starts() == 1


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_user_exception_passes_through_and_engine_stops(kit: Kit, tmp_path: Path, mode: str) -> None:
    configure(tmp_path)
    attach(kit.adapter)
    error = KeyError("user")

    async def body() -> None:
        async with profile_step(1), profile_step(role="rollout"):
            raise error

    with pytest.raises(KeyError) as info:
        if mode == "sync":
            with profile_step(1), profile_step(role="rollout"):
                raise error
        else:
            run(body())
    assert info.value is error
    assert (kit.starts(), kit.stops()) == (1, 1)
