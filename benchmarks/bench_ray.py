"""Ray benchmark: actor calls out of the window, step-boundary control of worker groups, fan-out.

Three sections (``--only calls,control,fanout``), each on a local Ray cluster (2 CPUs, no
dashboard), actors from ``_ray_actors.Probe`` (``num_cpus=0``, tiny: no torch), backend
``noop`` so the figures are profctx plus Ray, not a device profiler:

- ``calls``: 1,000 calls of a ``@profiled`` actor method inside an out-of-window step against
  1,000 calls of its undecorated twin on the same actor; sequential (``ray.get`` each, the two
  methods alternating call by call) and pipelined (submit all, then one ``ray.get``; a batch of
  each in turn). The ratio is the median of the per-round ratios. The cost added inside the
  actor process (``self.tick()`` against ``self.plain()``, 100,000 calls) is printed too.
- ``control``: a worker group of ``--workers`` actors. The time of an empty
  ``with profctx.profile_step(step):`` in the driver, entry and exit apart: not configured;
  configured with the group registered and the step out of the window; in the window in step
  mode (every worker opens and closes a noop capture; then only rank 0 of the group) and role
  mode (every worker holds the step and opens nothing); and, for scale, Ray alone: two rounds
  of a no-op ``__ray_call__`` to every worker. Each worker counts the control calls it runs
  (``_ray_actors``).
- ``fanout``: a fresh group of N actors for each N in ``--sizes``; one in-window step (role
  mode) in which every actor serves one ``@profiled`` call (its own noop capture): the whole
  step, and the ``fan_out`` inside it; against N = 1.

Run: ``PYTHONPATH=. python benchmarks/bench_ray.py [--only ...] [--rounds 7] [--workers 16]``.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import ray

import profctx
import profctx.ray
from profctx.records._manifest import read

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _ray_actors import Probe, nothing  # noqa: E402 - the folder is on sys.path only from here

OUT_OF_WINDOW = 10**6  # steps from here on are outside every window this benchmark configures


def _configure(save: str, **fields: Any) -> None:
    base: dict[str, Any] = {"steps": "1:100000", "mode": "step", "ranks": "all", "tool": "noop",
                            "save_path": save, "warmup": False}
    base.update(fields)
    profctx.configure(**base)


def _actors(n: int) -> list[Any]:
    actors = [Probe.remote() for _ in range(n)]  # type: ignore[attr-defined]
    ray.get([a.plain.remote() for a in actors])  # processes up
    return actors


def _control_calls(actors: Sequence[Any]) -> int:
    return sum(sum(c.values()) for c in ray.get([a.control_calls.remote() for a in actors]))


# -- calls -------------------------------------------------------------------------------------


def bench_calls(save: str, calls: int, rounds: int) -> None:
    _configure(save, steps="1:3")
    (actor,) = _actors(1)
    _joined = profctx.ray.group("bench", [actor]).members  # once joined: group() only sends
    tick, plain = actor.tick, actor.plain

    def sequential() -> tuple[float, float]:
        """One call of each, alternating, ``calls`` times: drift hits both alike."""
        spent = {"tick": 0.0, "plain": 0.0}
        for i in range(calls):
            for name, method in ((("tick", tick), ("plain", plain)) if i % 2 else (("plain", plain), ("tick", tick))):
                t0 = time.perf_counter()
                ray.get(method.remote())
                spent[name] += time.perf_counter() - t0
        return spent["tick"], spent["plain"]

    def pipelined() -> tuple[float, float]:
        """``calls`` calls submitted at once, then one ``ray.get``; one batch of each, in turn."""
        spent = {}
        for name, method in (("tick", tick), ("plain", plain)):
            t0 = time.perf_counter()
            ray.get([method.remote() for _ in range(calls)])
            spent[name] = time.perf_counter() - t0
        return spent["tick"], spent["plain"]

    rows = []
    with profctx.profile_step(OUT_OF_WINDOW):
        before = _control_calls([actor])
        # A pipelined batch is over in a third of the time, and noisier: three times the rounds.
        for name, run, repeat in (("sequential", sequential, rounds), ("pipelined", pipelined, 3 * rounds)):
            run()  # warm-up
            ratios, ticks, plains = [], [], []
            for _ in range(repeat):
                t, p = run()
                ticks.append(t)
                plains.append(p)
                ratios.append(t / p)
            rows.append((name, statistics.median(plains), statistics.median(ticks), statistics.median(ratios),
                         min(ratios), max(ratios)))
        during = _control_calls([actor]) - before
        local_tick, local_plain = ray.get(actor.local_cost.remote(100_000))
    print(f"\n## calls: {calls} calls of a @profiled actor method in an out-of-window step vs its plain twin, "
          f"{rounds} rounds sequential, {3 * rounds} pipelined")
    print(f"control calls the worker received during these calls: {during}")
    print("| calls | plain (ms per 1,000) | @profiled (ms per 1,000) | ratio (median of rounds) | min | max |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, p, t, ratio, low, high in rows:
        scale = 1000 / calls * 1e3
        print(f"| {name} | {p * scale:.1f} | {t * scale:.1f} | {ratio:.3f} | {low:.3f} | {high:.3f} |")
    seq_plain_ns = rows[0][1] / calls * 1e9
    added = local_tick - local_plain
    print(f"inside the actor: self.tick() {local_tick:.0f} ns, self.plain() {local_plain:.0f} ns per call: "
          f"{added:.0f} ns added, {added / seq_plain_ns:.5f} of a sequential Ray call ({seq_plain_ns / 1e3:.0f} us)")
    ray.kill(actor)
    profctx.reset()


# -- control -----------------------------------------------------------------------------------


def _step_times(steps: Sequence[int]) -> tuple[float, float]:
    """Return the median entry and exit times (ms) of an empty step block over ``steps``."""
    enters, exits = [], []
    for step in steps:
        block = profctx.profile_step(step)
        t0 = time.perf_counter()
        block.__enter__()
        t1 = time.perf_counter()
        block.__exit__(None, None, None)
        t2 = time.perf_counter()
        enters.append((t1 - t0) * 1e3)
        exits.append((t2 - t1) * 1e3)
    return statistics.median(enters), statistics.median(exits)


def bench_control(save: str, workers: int, rounds: int) -> None:
    actors = _actors(workers)
    steps_per_case = max(rounds * 5, 20)
    rows: list[tuple[str, float, float, float]] = []
    counts: list[tuple[str, int, int]] = []

    def case(name: str, first: int) -> None:
        steps = list(range(first, first + steps_per_case))
        _step_times(steps[:3])  # warm-up (and any re-sent configuration)
        before = _control_calls(actors)
        enter, exit_ = _step_times(steps[3:])
        counts.append((name, _control_calls(actors) - before, len(steps) - 3))
        rows.append((name, enter, exit_, enter + exit_))
        profctx.ray.flush(actors)

    def floor() -> None:
        """Two rounds (entry, exit) of one no-op ``__ray_call__`` per worker, each round awaited with ``ray.wait``."""
        for _ in range(2):
            refs = [a.__ray_call__.remote(nothing) for a in actors]
            ray.wait(refs, num_returns=len(refs))

    profctx.reset()
    floor()
    floor_ms = _median_ms(floor, steps_per_case)
    _step_times(range(OUT_OF_WINDOW, OUT_OF_WINDOW + 3))
    enter, exit_ = _step_times(range(OUT_OF_WINDOW, OUT_OF_WINDOW + steps_per_case))
    rows.append(("not configured (baseline)", enter, exit_, enter + exit_))
    _configure(save, steps="1:100000", mode="step")
    _joined = profctx.ray.group("bench", actors).members  # once joined: group() only sends
    case("configured, step out of the window", OUT_OF_WINDOW)
    case("in the window, mode=step (each worker opens a noop capture)", 1)
    _configure(save, steps="1:100000", mode="role")
    case("in the window, mode=role (each worker holds the step, opens nothing)", 1000)
    _configure(save, steps="1:100000", mode="step", ranks={"bench": [0]})
    case("in the window, mode=step, only rank 0 of the group captures", 2000)
    profctx.ray.flush(actors)
    profctx.reset()
    for a in actors:
        ray.kill(a)
    base = rows[0][3]
    print(f"\n## control: an empty step block in the driver, {workers} workers in one group; "
          f"median of {steps_per_case - 3} steps")
    print("| case | enter (ms) | exit (ms) | enter + exit (ms) | added vs not configured (ms) |")
    print("|---|---:|---:|---:|---:|")
    for name, enter, exit_, total in rows:
        print(f"| {name} | {enter:.3f} | {exit_:.3f} | {total:.3f} | {total - base:+.3f} |")
    print(f"| Ray alone: two rounds of a no-op __ray_call__ to each worker, awaited (the floor) | | | "
          f"{floor_ms:.3f} | |")
    print("\n| case | control calls received by the workers | steps | per step |")
    print("|---|---:|---:|---:|")
    for name, received, steps in counts:
        print(f"| {name} | {received} | {steps} | {received / steps:.1f} |")


# -- fan-out -----------------------------------------------------------------------------------


def _median_ms(fn: Callable[[], None], rounds: int) -> float:
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def bench_fanout(save: str, sizes: Sequence[int], rounds: int) -> None:
    results = []
    step = 0
    for n in sizes:
        # A fresh group per N: idle actors left over from a larger N would slow a smaller one.
        profctx.reset()
        _configure(save, mode="role")
        actors = _actors(n)
        _joined = profctx.ray.group(f"bench{n}", actors).members  # once joined: group() only sends
        inner: list[float] = []

        def one_step(actors: list[Any] = actors, inner: list[float] = inner) -> None:
            nonlocal step
            step += 1
            with profctx.profile_step(step):
                t0 = time.perf_counter()
                profctx.ray.fan_out([(a, "tick") for a in actors])
                inner.append((time.perf_counter() - t0) * 1e3)

        def empty_step() -> None:
            nonlocal step
            step += 1
            with profctx.profile_step(step):
                pass

        for _ in range(3):
            one_step()  # warm-up
        inner.clear()
        whole = _median_ms(one_step, rounds)
        fan = statistics.median(inner)
        control = _median_ms(empty_step, rounds)
        profctx.ray.flush(actors)
        pids = {m.pid for m in profctx.ray.groups()[f"bench{n}"].members}
        captured = sum(1 for r in read(save) if r.get("pid") in pids and r.get("role") == "bench"
                       and r.get("status") == "ok")
        print(f"N={n}: the actors recorded {captured} 'bench' captures in {rounds + 3} steps "
              f"(expected {n * (rounds + 3)})")
        results.append((n, whole, fan, control))
        for a in actors:
            ray.kill(a)
    profctx.reset()
    base_whole, base_fan, base_control = results[0][1], results[0][2], results[0][3]
    print(f"\n## fanout: one in-window step (mode=role), each actor serves one @profiled call (its own noop "
          f"capture); median of {rounds} steps")
    print("| N actors | whole step (ms) | x N=1 | fan_out inside it (ms) | x N=1 | empty step: control only (ms) "
          "| x N=1 |")
    print("|---:|---:|---:|---:|---:|---:|---:|")
    for n, whole, fan, control in results:
        print(f"| {n} | {whole:.1f} | {whole / base_whole:.1f} | {fan:.1f} | {fan / base_fan:.1f} | "
              f"{control:.1f} | {control / base_control:.1f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default="calls,control,fanout")
    parser.add_argument("--calls", type=int, default=1000)
    parser.add_argument("--rounds", type=int, default=7)
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--sizes", default="1,4,16")
    args = parser.parse_args()
    only = set(args.only.split(","))
    path = os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH", "")) if p)
    ray.init(num_cpus=2, include_dashboard=False, logging_level=logging.WARNING, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": path}})
    print(f"Ray {ray.__version__}, Python {sys.version.split()[0]}, {os.cpu_count()} CPUs, "
          f"load average {os.getloadavg()[0]:.1f}")
    try:
        with tempfile.TemporaryDirectory() as save:
            if "calls" in only:
                bench_calls(save, args.calls, args.rounds)
            if "control" in only:
                bench_control(save, args.workers, args.rounds)
            if "fanout" in only:
                bench_fanout(save, [int(s) for s in args.sizes.split(",")], args.rounds)
    finally:
        profctx.reset()
        ray.shutdown()


if __name__ == "__main__":
    main()
