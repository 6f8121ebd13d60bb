"""Engines in Ray actors: the driver-side adapter calls the actor-side mixin on every replica concurrently."""

from __future__ import annotations

import asyncio
import functools
import os
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

    def __init__(self, trace_dir: str, arrivals: str | None = None) -> None:
        from engines.doubles import vllm as vd

        self.engine = vd.AsyncLLM_0_33(trace_dir)
        if arrivals is not None:  # its start answers once every replica's start has arrived
            start = self.engine.start_profile

            @functools.wraps(start)  # the adapter reads the engine's capabilities from this signature
            async def start_once_all_arrived(*args: Any, **kwargs: Any) -> None:
                await _arrive(arrivals, parties=2)
                await start(*args, **kwargs)

            self.engine.start_profile = start_once_all_arrived  # type: ignore[method-assign]
        self.profctx_adapter = VLLMAsyncAdapter(self.engine, trace_dir=trace_dir)

    async def state(self) -> dict[str, Any]:
        await asyncio.sleep(0)
        return {"starts": len(self.engine.start_calls), "stops": self.engine.stop_calls,
                "files": list(self.engine.files), "prefix": [c["profile_prefix"] for c in self.engine.start_calls]}


async def _arrive(folder: str, parties: int) -> None:
    """Note this start in ``folder`` and wait until ``parties`` starts have (a minute at most, then raise)."""
    Path(folder, str(os.getpid())).touch()
    for _ in range(6000):
        if len(os.listdir(folder)) >= parties:
            return
        await asyncio.sleep(0.01)
    raise RuntimeError("the other replica's start never arrived: the starts were not sent concurrently")


def test_replicas_in_actors_start_concurrently_and_are_recorded(tmp_path: Path) -> None:
    # Each replica's start answers only once both were asked: sent one after the other, the first
    # would wait for a second that never comes, fail after a minute, and be recorded failed.
    # Concurrency is what passes; a loaded machine only makes it slower.
    arrivals = tmp_path / "arrivals"
    arrivals.mkdir()
    actors = [RolloutServer.remote(str(tmp_path / f"trace{i}"), str(arrivals)) for i in range(2)]
    ray.get([a.state.remote() for a in actors])
    configure(tmp_path, engines={"replicas": "all"})
    attach(*ray_adapters(actors, engine="vllm"))

    async def main() -> None:
        async with profile_step(1), profile_step(role="rollout"):
            pass

    asyncio.run(main())
    assert len(os.listdir(arrivals)) == 2
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
