"""Start/stop latency of a real vLLM engine's profiler: direct calls vs through profctx's adapters.

Run by hand in the real-vLLM environment (``requirements-vllm.txt``)::

    .venv-vllm/bin/python benchmarks/bench_engines.py [--pairs 15]

It builds the tiny test model, starts one ``LLM`` and one ``AsyncLLM`` (20-100 s each on a
small CPU machine), then times interleaved pairs of start+stop: the engine's own calls, and
the same through ``VLLMAdapter`` / ``VLLMAsyncAdapter`` (``start_sync``/``stop_sync``, manifest
records included). Prints medians and the difference in one Markdown table.
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests"))


def _time(func: Any) -> float:
    t0 = time.perf_counter()
    func()
    return (time.perf_counter() - t0) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--pairs", type=int, default=15)
    args = parser.parse_args()

    import os

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")
    from engines.vllm_real import model
    from vllm import LLM
    from vllm.config import ProfilerConfig
    from vllm.engine.arg_utils import AsyncEngineArgs
    from vllm.v1.engine.async_llm import AsyncLLM

    import profctx
    from profctx import Scope
    from profctx.engines import VLLMAdapter, VLLMAsyncAdapter, launch_settings

    work = Path(tempfile.mkdtemp(prefix="bench-engines-"))
    model_dir = model.build(work / "model")
    kwargs = {"model": str(model_dir), "dtype": "bfloat16", "max_model_len": 128, "enforce_eager": True,
              "max_num_seqs": 4}
    config = profctx.ProfilerConfig(steps=[1], save_path=str(work / "save"), tool="noop")
    rows = []

    llm = LLM(**kwargs, profiler_config=dict(launch_settings(config, trace_dir=str(work / "t1")).profiler_config
                                             or {}))
    profctx.configure(steps=[1], save_path=str(work / "save"), tool="noop", exit_hooks=False, warmup=False)
    adapter = VLLMAdapter(llm, trace_dir=str(work / "t1"))
    direct, through = [], []
    for i in range(args.pairs):
        direct.append(_time(lambda i=i: (llm.start_profile(f"direct{i}"), llm.stop_profile())))
        through.append(_time(lambda: (adapter.start_sync(Scope(1, ("rollout",))), adapter.stop_sync())))
    rows.append(("LLM", direct, through))
    llm.llm_engine.engine_core.shutdown()

    loop = asyncio.new_event_loop()
    threading.Thread(target=loop.run_forever, daemon=True).start()
    settings = launch_settings(config, trace_dir=str(work / "t2"))

    async def make() -> Any:
        engine_args = AsyncEngineArgs(**kwargs, profiler_config=ProfilerConfig(**dict(settings.profiler_config or {})))
        return AsyncLLM.from_engine_args(engine_args)

    engine = asyncio.run_coroutine_threadsafe(make(), loop).result()

    async def pair(i: int) -> None:
        await engine.start_profile(f"direct{i}")
        await engine.stop_profile()

    aadapter = VLLMAsyncAdapter(engine, loop=loop, trace_dir=str(work / "t2"))
    direct, through = [], []
    for i in range(args.pairs):
        direct.append(_time(lambda i=i: asyncio.run_coroutine_threadsafe(pair(i), loop).result()))
        through.append(_time(lambda: (aadapter.start_sync(Scope(1, ("rollout",))), aadapter.stop_sync())))
    rows.append(("AsyncLLM", direct, through))
    engine.shutdown()

    print("| engine | direct start+stop, median ms | through profctx, median ms | profctx adds, ms | pairs |")
    print("|---|---:|---:|---:|---:|")
    for name, d, t in rows:
        md, mt = statistics.median(d), statistics.median(t)
        print(f"| {name} | {md:.1f} | {mt:.1f} | {mt - md:+.1f} | {len(d)} |")


if __name__ == "__main__":
    main()
