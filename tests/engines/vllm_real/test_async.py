"""profctx against a real in-process ``AsyncLLM`` with profctx's own torch backend in the same process."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import profctx
from profctx import profile_step
from profctx.engines import VLLMAsyncAdapter, attach, launch_settings
from profctx.engines._loop import run_sync
from profctx.records import _manifest

from ..conftest import configure, engine_records
from . import model
from .conftest import LoopThread, engine_kwargs

_ids = itertools.count()


@pytest.fixture(scope="module")
def trace_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("vllm-async-traces")


@pytest.fixture(scope="module")
def engine(vllm: Any, tiny_model: Path, trace_dir: Path) -> Iterator[tuple[Any, LoopThread]]:
    """One AsyncLLM for the module, living in its own loop thread, launched with profctx's settings."""
    from vllm.config import ProfilerConfig
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    config = profctx.ProfilerConfig(steps=[1], save_path=str(trace_dir.parent), tool="noop")
    settings = launch_settings(config, trace_dir=str(trace_dir))
    args = AsyncEngineArgs(**engine_kwargs(tiny_model),
                           profiler_config=ProfilerConfig(**dict(settings.profiler_config or {})))
    lt = LoopThread()

    async def make() -> Any:
        return AsyncLLM.from_engine_args(args)

    llm = lt.run(make())
    yield llm, lt
    llm.shutdown()
    lt.close()


def _generate(engine: tuple[Any, LoopThread], tokens: int = 4) -> None:
    from vllm import SamplingParams

    llm, lt = engine

    async def go() -> None:
        async for _ in llm.generate(model.prompt(), SamplingParams(max_tokens=tokens, ignore_eos=True),
                                    request_id=f"r{next(_ids)}"):
            pass

    lt.run(go())


@pytest.mark.parametrize("mode", ["step", "role"])
def test_profctx_torch_backend_and_the_engine_in_one_process(engine: tuple[Any, LoopThread], trace_dir: Path,
                                                             tmp_path: Path, mode: str) -> None:
    llm, lt = engine
    configure(tmp_path, steps=[1, 2], tool="torch", mode=mode)
    attach(VLLMAsyncAdapter(llm, loop=lt.loop, trace_dir=str(trace_dir)))
    for step in (1, 2):
        with profile_step(step):
            with profile_step(role="rollout"):
                _generate(engine)
            with profile_step(role="actor_update"):
                pass
    assert profctx.flush(120)  # profctx writes its own traces on a background thread
    records = _manifest.read(tmp_path)
    engines = [r for r in records if r.get("kind") == "engine"]
    own = [r for r in records if r.get("kind") != "engine"]
    assert [(r["step"], r["status"]) for r in engines] == [(1, "ok"), (2, "ok")]
    assert all(r["files"] for r in engines)
    assert len(own) == (2 if mode == "step" else 4)
    assert all(r["status"] == "ok" and r["files"] for r in own), own
    # No frontend trace: launch_settings switched vLLM's second torch profiler off.
    assert not [p for p in trace_dir.iterdir() if "async_llm" in p.name.lower()]


def test_a_stop_timeout_does_not_leave_the_session_flag_set(engine: tuple[Any, LoopThread], trace_dir: Path,
                                                            tmp_path: Path) -> None:
    llm, lt = engine
    configure(tmp_path, steps=[1, 2], engines={"stop_timeout": 1e-6})
    adapter = VLLMAsyncAdapter(llm, loop=lt.loop, trace_dir=str(trace_dir))
    attach(adapter)
    with profile_step(1), profile_step(role="rollout"):
        _generate(engine)
    run_sync(lambda: adapter.settle(120))
    profctx.configure(steps=[2], tool="noop", save_path=str(tmp_path), exit_hooks=False, warmup=False)
    with profile_step(2), profile_step(role="rollout"):
        _generate(engine)
    statuses = {r["step"]: r["status"] for r in engine_records(tmp_path)}
    assert statuses == {1: "ok", 2: "ok"}  # step 2 was not skipped as "already active"


def test_a_start_timeout_leaves_the_engine_stopped(engine: tuple[Any, LoopThread], trace_dir: Path,
                                                   tmp_path: Path) -> None:
    llm, lt = engine
    configure(tmp_path, engines={"start_timeout": 1e-6})
    adapter = VLLMAsyncAdapter(llm, loop=lt.loop, trace_dir=str(trace_dir))
    attach(adapter)
    with profile_step(1), profile_step(role="rollout"):
        _generate(engine)
    run_sync(lambda: adapter.settle(120))
    [record] = engine_records(tmp_path)
    assert record["status"] == "failed" and "profctx stopped the engine" in record["error"]

    async def probe() -> None:
        await llm.start_profile("probe")
        await llm.stop_profile()

    lt.run(probe())  # would raise ProfilerAlreadyActiveError if the session were left open
