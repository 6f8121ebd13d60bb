"""Fan-out benchmark: start and stop a capture on N Ray actors, sequential ``ray.get`` loop vs ``fan_out``.

Each round is one in-window ``@profiled`` call per actor (the actor starts its capture, runs an
empty body, stops it and files a manifest record). Backend ``noop`` by default so the figure is
profctx + Ray, not the device profiler; ``--tool torch`` for torch.profiler (slower to start).
Run: ``python benchmarks/bench_ray.py [--rounds 10] [--sizes 1,4,16]``.
"""

from __future__ import annotations

import argparse
import logging
import statistics
import tempfile
import time
from typing import Any

import ray

import profctx
import profctx.ray


@ray.remote(num_cpus=0)
class Probe:
    """An actor whose profiled method does nothing: the cost measured is starting and stopping."""

    @profctx.profiled(role="bench")
    def tick(self) -> int:
        return 1


def _median_ms(fn: Any, rounds: int) -> float:
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        fn()
        times.append((time.perf_counter() - t0) * 1e3)
    return statistics.median(times)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=10)
    parser.add_argument("--sizes", default="1,4,16")
    parser.add_argument("--tool", default="noop")
    args = parser.parse_args()
    sizes = [int(s) for s in args.sizes.split(",")]
    ray.init(num_cpus=2, include_dashboard=False, logging_level=logging.WARNING, log_to_driver=False)
    results = []
    with tempfile.TemporaryDirectory() as save:
        profctx.configure(steps="1:100000", mode="role", ranks="all", save_path=save, tool=args.tool)
        step = 0
        for n in sizes:
            # A fresh group per N: idle actors left over from a larger N would slow a smaller one.
            group = [Probe.remote() for _ in range(n)]  # type: ignore[attr-defined]
            ray.get([a.tick.remote() for a in group])  # processes up, configured from the carrier

            def sequential(group: list[Any] = group) -> None:
                for actor in group:
                    ray.get(actor.tick.remote())

            def fanned(group: list[Any] = group) -> None:
                profctx.ray.fan_out([(a, "tick") for a in group])

            def submit_only(group: list[Any] = group) -> None:
                profctx.ray.submit([(a, "tick") for a in group])

            rows = {}
            for name, fn in (("sequential", sequential), ("fan_out", fanned), ("submit", submit_only)):
                def one(fn: Any = fn) -> None:
                    nonlocal step
                    step += 1
                    with profctx.profile_step(step):
                        fn()
                for _ in range(3):
                    one()  # warm-up
                rows[name] = _median_ms(one, args.rounds)
            profctx.ray.flush(group)
            results.append((n, rows["sequential"], rows["fan_out"], rows["submit"]))
            for actor in group:
                ray.kill(actor)
        profctx.reset()
    ray.shutdown()
    base_seq, base_fan = results[0][1], results[0][2]
    print(f"tool {args.tool}, median of {args.rounds} rounds; one round = one in-window capture per actor")
    print("| N actors | sequential ray.get loop (ms) | x N=1 | fan_out (ms) | x N=1 | of which submitting (ms) |")
    print("|---:|---:|---:|---:|---:|---:|")
    for n, seq, fan, sub in results:
        print(f"| {n} | {seq:.1f} | {seq / base_seq:.1f} | {fan:.1f} | {fan / base_fan:.1f} | {sub:.1f} |")


if __name__ == "__main__":
    main()
