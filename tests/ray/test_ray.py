"""Scope and config reach Ray actors; fan-out from sync and async code; failures; ``__main__`` classes."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest

import profctx
from profctx import _manifest

ray = pytest.importorskip("ray")
pray = pytest.importorskip("profctx.ray")
from _actors import Worker  # noqa: E402 - after the skip: needs ray

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def workers(ray_cluster: Any) -> list[Any]:
    """Two actors shared by the module's tests (actor processes are slow to start here)."""
    return [Worker.remote() for _ in range(2)]  # type: ignore[attr-defined]


def _configure(save_path: Path, **fields: Any) -> None:
    profctx.configure(steps="1:3", mode="role", ranks="all", save_path=str(save_path), tool="recording",
                      warmup=False, **fields)


def _captures(save_path: Path, pids: set[int]) -> list[dict[str, Any]]:
    return [r for r in _manifest.read(save_path) if r.get("pid") in pids]


def test_scope_and_config_reach_the_actors(workers: list[Any], tmp_path: Path) -> None:
    _configure(tmp_path, run_id="run-ray")
    with profctx.profile_step(1, role="train"):
        seen = pray.fan_out([(w, "work") for w in workers])
        assert ray.get(workers[0].plain.remote(1)) == 2  # unprofiled methods get no extra keyword
    with profctx.profile_step(5, role="train"):  # outside the window: scope arrives, nothing captured
        late = ray.get(workers[0].work.remote())
    assert [(s["step"], s["path"]) for s in seen] == [(1, "train/work"), (1, "train/work")]
    assert [(s["rank"], s["world_size"]) for s in seen] == [(0, 2), (1, 2)]
    assert {s["run_id"] for s in seen} == {"run-ray"}
    assert (late["step"], late["path"]) == (5, "train/work")
    assert pray.flush(workers) == [True, True]
    remote = _captures(tmp_path, {s["pid"] for s in seen})
    assert sorted((r["rank"], r["world_size"], r["step"], r["role"], r["status"]) for r in remote) == [
        (0, 2, 1, "train/work", "ok"), (1, 2, 1, "train/work", "ok")]
    for record in remote:
        assert (tmp_path / record["files"][0]["path"]).is_file()


def test_plain_calls_carry_the_scope_and_as_rank_sets_the_identity(ray_cluster: Any, tmp_path: Path) -> None:
    _configure(tmp_path)
    fresh = Worker.remote()  # type: ignore[attr-defined]
    with profctx.profile_step(2, role="rollout"), pray.as_rank(3, 4):
        seen = ray.get(fresh.async_work.remote())
    with profctx.profile_step(2, role="rollout"), pray.as_rank(0, 4):
        again = ray.get(fresh.async_work.remote())
    assert (seen["step"], seen["path"], seen["rank"], seen["world_size"]) == (2, "rollout/async_work", 3, 4)
    assert (again["rank"], again["world_size"]) == (3, 4)  # one actor process is one rank
    ray.kill(fresh)


def test_a_worker_that_resets_profctx_still_receives_carried_calls(ray_cluster: Any, tmp_path: Path) -> None:
    _configure(tmp_path)
    fresh = Worker.remote()  # type: ignore[attr-defined]
    assert ray.get(fresh.reset.remote())
    with profctx.profile_step(1, role="train"):
        seen = ray.get(fresh.work.remote())  # the reserved keyword is still removed, not passed on
    assert (seen["step"], seen["path"]) == (1, "train/work")
    ray.kill(fresh)


def test_fan_out_from_sync_and_async_callers_at_once(workers: list[Any], tmp_path: Path) -> None:
    _configure(tmp_path)

    async def main() -> tuple[list[Any], list[Any], float]:
        with pytest.raises(RuntimeError, match="fan_out_async"):
            pray.fan_out([(w, "work") for w in workers])  # a blocking ray.get has no place in a loop
        async with profctx.profile_step(2, role="async"):
            t0 = time.perf_counter()
            from_async, from_thread = await asyncio.gather(
                pray.fan_out_async([w.async_work for w in workers], (0.4,)),
                asyncio.to_thread(pray.fan_out, [(w, "async_work") for w in workers], (0.4,)),
            )
            return from_async, from_thread, time.perf_counter() - t0

    from_async, from_thread, elapsed = asyncio.run(main())
    assert [(s["step"], s["path"], s["rank"]) for s in from_async] == [(2, "async/async_work", 0),
                                                                      (2, "async/async_work", 1)]
    assert [(s["path"], s["rank"], s["world_size"]) for s in from_thread] == [("async/async_work", 0, 2),
                                                                             ("async/async_work", 1, 2)]
    assert elapsed < 1.2, f"4 calls of 0.4 s on 2 async actors took {elapsed:.2f} s: not concurrent"


def test_a_dying_and_a_raising_actor_do_not_stop_the_others(workers: list[Any], tmp_path: Path) -> None:
    _configure(tmp_path)
    raising = Worker.remote("raise")  # type: ignore[attr-defined]
    dying = Worker.remote("die")  # type: ignore[attr-defined]
    ok_pid = ray.get(workers[0].work.remote())["pid"]
    with profctx.profile_step(1, role="train"):
        with pytest.raises(ValueError, match="boom from the worker") as info:
            pray.fan_out([(workers[0], "work"), (raising, "work"), (dying, "work")], (0.5,))
        errors = pray.fan_out([(workers[0], "work"), (raising, "work")], return_exceptions=True)
    assert isinstance(info.value, ray.exceptions.RayTaskError)  # what ray.get raises, unchanged
    assert isinstance(errors[1], ValueError) and errors[0]["pid"] == ok_pid
    assert pray.flush([workers[0], raising, dying]) == [True, True, False]
    records = _manifest.read(tmp_path)
    ok = [r for r in records if r.get("pid") == ok_pid and r.get("kind") == "role"]
    assert [r["status"] for r in ok] == ["ok", "ok"]  # the slow worker stopped and wrote its trace
    assert all((tmp_path / r["files"][0]["path"]).is_file() for r in ok)
    remote = sorted((r["rank"], r["status"], r["reason"]) for r in records if r.get("kind") == "remote")
    assert remote == [(1, "failed", "the actor call work raised"), (1, "failed", "the actor call work raised"),
                      (2, "failed", "the actor running work died")]
    died = [r for r in records if r.get("kind") == "role" and r.get("rank") == 2]
    assert [r["status"] for r in died] == ["open"]  # started, never finished: the process died


MAIN_SCRIPT = textwrap.dedent("""
    import json, sys
    import ray
    import profctx, profctx.ray

    @ray.remote(num_cpus=0)
    class Local:
        @profctx.profiled(role="update")
        def update(self, x):
            scope = profctx.current()
            return [x, scope.step, scope.path]

        @profctx.profiled
        async def generate(self):
            return profctx.current().path

    if __name__ == "__main__":
        ray.init(address=sys.argv[2], logging_level="WARNING", log_to_driver=False)
        profctx.configure(steps=[3], mode="role", ranks="all", save_path=sys.argv[1], tool="recording")
        actors = [Local.remote() for _ in range(2)]
        with profctx.profile_step(3, role="train"):
            out = profctx.ray.fan_out([(a, "update") for a in actors], (7,))
            out.append(ray.get(actors[0].generate.remote()))
        profctx.ray.flush(actors)
        print(json.dumps(out))
""")


def test_actor_class_defined_in_a_driver_script_still_profiles(ray_cluster: Any, tmp_path: Path) -> None:
    script = tmp_path / "driver.py"
    script.write_text(MAIN_SCRIPT)
    save = tmp_path / "out"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    done = subprocess.run([sys.executable, str(script), str(save), ray_cluster.address_info["gcs_address"]],
                          capture_output=True, text=True, timeout=120, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out == [[7, 3, "train/update"], [7, 3, "train/update"], "train/Local.generate"]
    remote = [r for r in _manifest.read(save) if r.get("world_size") == 2]
    assert sorted((r["rank"], r["role"], r["status"]) for r in remote) == [
        (0, "train/Local.generate", "ok"), (0, "train/update", "ok"), (1, "train/update", "ok")]
