"""Engines in Ray actors: the driver-side adapter calls the actor-side mixin on every replica concurrently."""

from __future__ import annotations

import asyncio
import os
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from profctx import profile_step
from profctx.engines import VLLMAsyncAdapter, attach
from profctx.engines.ray import EngineProfilingMixin, ray_adapters

from .conftest import configure, engine_records

ray = pytest.importorskip("ray")
pytestmark = pytest.mark.ray

_TESTS = str(Path(__file__).resolve().parents[1])


@pytest.fixture(scope="module", autouse=True)
def _cluster() -> Iterator[None]:
    started = not ray.is_initialized()
    if started:
        path = os.pathsep.join([_TESTS, os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False,
                 runtime_env={"env_vars": {"PYTHONPATH": path}})
    yield
    if started:
        ray.shutdown()


@ray.remote(num_cpus=0)
class RolloutServer(EngineProfilingMixin):
    """An engine server actor owning an in-process AsyncLLM (the vLLM 0.33 double)."""

    def __init__(self, trace_dir: str) -> None:
        from engines.doubles import vllm as vd

        self.engine = vd.AsyncLLM_0_33(trace_dir, start_delay=0.5)
        self.profctx_adapter = VLLMAsyncAdapter(self.engine, trace_dir=trace_dir)

    async def state(self) -> dict[str, Any]:
        await asyncio.sleep(0)
        return {"starts": len(self.engine.start_calls), "stops": self.engine.stop_calls,
                "files": list(self.engine.files), "prefix": [c["profile_prefix"] for c in self.engine.start_calls]}


def test_replicas_in_actors_start_concurrently_and_are_recorded(tmp_path: Path) -> None:
    actors = [RolloutServer.remote(str(tmp_path / f"trace{i}")) for i in range(2)]
    ray.get([a.state.remote() for a in actors])
    configure(tmp_path, engines={"replicas": "all"})
    attach(*ray_adapters(actors, engine="vllm"))

    async def main() -> float:
        async with profile_step(1):
            t0 = time.monotonic()
            async with profile_step(role="rollout"):
                elapsed = time.monotonic() - t0
        return elapsed

    elapsed = asyncio.run(main())
    assert elapsed < 0.95  # two 0.5 s starts, concurrently
    states = ray.get([a.state.remote() for a in actors])
    assert [(s["starts"], s["stops"], len(s["files"])) for s in states] == [(1, 1, 1), (1, 1, 1)]
    assert states[1]["prefix"] == ["step000001-rollout-replica1"]
    records = sorted(engine_records(tmp_path), key=lambda r: r["replica"])
    assert [(r["replica"], r["status"], r["engine"]) for r in records] == [(0, "ok", "vllm"), (1, "ok", "vllm")]
    assert records[1]["folder"] == str(tmp_path / "trace1")


def test_actor_failure_comes_back_as_a_record(tmp_path: Path) -> None:
    actor = RolloutServer.remote(str(tmp_path / "t"))
    ray.get(actor.state.remote())
    configure(tmp_path)
    [adapter] = ray_adapters([actor], engine="vllm")
    attach(adapter)
    ray.get(actor.profctx_start_profile.remote({"capture": "x", "step": 0, "roles": ["other"], "replica": 0,
                                                "engine": "vllm", "folder": "/tmp/x", "name": "x"}))
    with profile_step(1), profile_step(role="rollout"):  # the actor's adapter is busy: skipped, not started twice
        pass
    [record] = engine_records(tmp_path)
    assert record["status"] == "skipped"
    assert ray.get(actor.state.remote())["starts"] == 1
