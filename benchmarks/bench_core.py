"""Core performance contract: the off path of @profiled and profile_step, capture body overhead,
first-step start latency, and how long the training loop is blocked at the end of a capture.

Run by hand: ``python benchmarks/bench_core.py [--quick]``. Prints a Markdown table of ratios to a
baseline measured in the same run (absolute times drift on shared machines).
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
import timeit
from collections.abc import Callable
from typing import Any

import profctx


def per_call_ns(stmt: Callable[[], Any], number: int, repeat: int) -> float:
    """Return the best per-call time in nanoseconds over ``repeat`` runs of ``number`` calls."""
    return min(timeit.repeat(stmt, number=number, repeat=repeat)) / number * 1e9


def bare() -> int:
    return 1


@profctx.profiled(role="bench")
def decorated() -> int:
    return 1


class Model:
    def method(self) -> int:
        return 1

    @profctx.profiled(role="bench_method")
    def decorated_method(self) -> int:
        return 1


async def abare() -> int:
    return 1


@profctx.profiled(role="abench")
async def adecorated() -> int:
    return 1


def await_ns(fn: Callable[[], Any], number: int, repeat: int) -> float:
    async def loop() -> float:
        t0 = time.perf_counter()
        for _ in range(number):
            await fn()
        return time.perf_counter() - t0

    return min(asyncio.run(loop()) for _ in range(repeat)) / number * 1e9


def off_path(number: int, repeat: int) -> list[tuple[str, float, float, str]]:
    rows: list[tuple[str, float, float, str]] = []
    model = Model()
    base = per_call_ns(bare, number, repeat)
    base_method = per_call_ns(model.method, number, repeat)
    base_await = await_ns(abare, number // 4, repeat)
    rows.append(("bare function call", base, 1.0, ""))
    profctx.reset()
    t = per_call_ns(decorated, number, repeat)
    rows.append(("@profiled sync function, profiling not configured", t, t / base, "<= 4x"))
    t = per_call_ns(model.decorated_method, number, repeat)
    rows.append(("@profiled method, not configured (vs bare method)", t, t / base_method, ""))
    t = await_ns(adecorated, number // 4, repeat)
    rows.append(("@profiled coroutine, not configured (vs bare await)", t, t / base_await, "<= 3x"))

    with tempfile.TemporaryDirectory() as tmp:
        profctx.configure(steps=[10**6], save_path=tmp, tool="noop", warmup=False)
        with profctx.profile_step(1):  # a step outside the window is ambient
            t = per_call_ns(decorated, number, repeat)
            rows.append(("@profiled sync function, step outside the window", t, t / base, "<= 4x"))
            t = per_call_ns(model.decorated_method, number, repeat)
            rows.append(("@profiled method, step outside the window (vs bare method)", t, t / base_method, ""))
            t = await_ns(adecorated, number // 4, repeat)
            rows.append(("@profiled coroutine, step outside the window (vs bare await)", t, t / base_await, "<= 3x"))

        def block() -> None:
            with profctx.profile_step(2):
                pass

        def role_block() -> None:
            with profctx.profile_step(role="rollout"):
                pass

        t = per_call_ns(block, number // 10, repeat)
        rows.append(("with profile_step(step) outside the window", t, t / base, "report"))
        with profctx.profile_step(1):
            t = per_call_ns(role_block, number // 10, repeat)
        rows.append(("with profile_step(role=...) in an out-of-window step", t, t / base, "report"))
        profctx.reset()
    t = per_call_ns(block, number // 10, repeat)
    rows.append(("with profile_step(step), not configured", t, t / base, "report"))
    return rows


def body_overhead(repeat: int) -> tuple[float, float]:
    """Return (profctx capture body seconds, raw torch.profiler body seconds), best of ``repeat`` each."""
    import torch
    from torch.profiler import ProfilerActivity, profile

    x = torch.randn(256, 256)

    def workload() -> None:
        y = x
        for _ in range(40):
            y = torch.relu(y @ x) / 256

    def timed(body: Callable[[], None]) -> float:
        t0 = time.perf_counter()
        body()
        return time.perf_counter() - t0

    ours: list[float] = []
    raw: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        profctx.configure(steps="0:1000", save_path=tmp, compress=False)
        for i in range(repeat):
            with profctx.profile_step(i):
                ours.append(timed(workload))
            profctx.flush()  # the background export is measured apart (write_s in the manifest)
            with profile(activities=[ProfilerActivity.CPU]):
                raw.append(timed(workload))
        profctx.flush()
        profctx.reset()
    return min(ours), min(raw)


FIRST_STEP = """
import sys, tempfile, time
import torch
import profctx
x = torch.randn(64, 64)
with tempfile.TemporaryDirectory() as tmp:
    profctx.configure(steps=[3], save_path=tmp)
    for step in range(1, 4):
        t0 = time.perf_counter()
        block = profctx.profile_step(step)
        block.__enter__()
        entered = time.perf_counter() - t0
        x @ x
        block.__exit__(None, None, None)
    print(entered)
    profctx.reset()
"""

RAW_FIRST = """
import time, torch
from torch.profiler import profile, ProfilerActivity
p = profile(activities=[ProfilerActivity.CPU])
t0 = time.perf_counter(); p.start(); print(time.perf_counter() - t0); p.stop()
"""


def first_step_latency() -> tuple[float, float]:
    """Return (profctx first in-window step entry seconds, raw first torch profile.start seconds), fresh processes."""
    env = {**os.environ, "PYTHONWARNINGS": "ignore"}

    def run(code: str) -> float:
        out = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                             env=env, check=True)
        return float(out.stdout.strip().splitlines()[-1])

    return run(FIRST_STEP), run(RAW_FIRST)


def blocked_at_end(repeat: int) -> tuple[float, float]:
    """Return (profctx blocked seconds, torch tensorboard_trace_handler(use_gzip=True) blocked seconds)."""
    import torch
    from torch.profiler import ProfilerActivity, profile, tensorboard_trace_handler

    x = torch.randn(128, 128)

    def workload() -> None:
        y = x
        for _ in range(400):
            y = torch.relu(y @ x) / 128

    ours: list[float] = []
    theirs: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        profctx.configure(steps="0:1000", save_path=tmp)
        for i in range(repeat):
            block = profctx.profile_step(i)
            block.__enter__()
            workload()
            t0 = time.perf_counter()
            block.__exit__(None, None, None)
            ours.append(time.perf_counter() - t0)
            profctx.flush()
            prof = profile(activities=[ProfilerActivity.CPU],
                           on_trace_ready=tensorboard_trace_handler(os.path.join(tmp, "tb"), use_gzip=True))
            prof.start()
            workload()
            t0 = time.perf_counter()
            prof.stop()
            theirs.append(time.perf_counter() - t0)
        profctx.reset()
    return statistics.median(ours), statistics.median(theirs)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--quick", action="store_true", help="fewer iterations")
    args = parser.parse_args()
    number, repeat = (20_000, 3) if args.quick else (200_000, 7)

    print(f"Python {sys.version.split()[0]}, {os.cpu_count()} cores\n")
    print("| what | ns per call | x baseline | target |")
    print("|---|---:|---:|---|")
    for name, ns, ratio, target in off_path(number, repeat):
        print(f"| {name} | {ns:.0f} | {ratio:.2f} | {target} |")

    print("\n| what | profctx | baseline | ratio | target |")
    print("|---|---:|---:|---:|---|")
    ours, raw = body_overhead(5 if args.quick else 15)
    print(f"| capture body (CPU workload) vs raw torch.profiler | {ours * 1e3:.1f} ms | {raw * 1e3:.1f} ms "
          f"| {ours / raw:.3f} | <= 1.05 |")
    first, raw_first = first_step_latency()
    print(f"| first profiled step entry, fresh process (baseline: raw first profile.start) | {first * 1e3:.1f} ms "
          f"| {raw_first * 1e3:.1f} ms | {first / raw_first:.3f} | <= 50 ms |")
    ours, theirs = blocked_at_end(3 if args.quick else 7)
    print(f"| loop blocked at capture end vs tensorboard_trace_handler(use_gzip=True) | {ours * 1e3:.1f} ms "
          f"| {theirs * 1e3:.1f} ms | {ours / theirs:.3f} | <= 0.5 |")


if __name__ == "__main__":
    main()
