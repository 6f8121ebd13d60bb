"""Ray benchmark: what a worker group costs where nothing is profiled, and what a frozen member costs.

On a local Ray cluster (2 CPUs, no dashboard), actors from ``_ray_actors.Probe`` (``num_cpus=0``):

- ``register``: ``profctx.ray.group`` of ``--workers`` fresh actors with ``tool="torch"`` when no
  member is selected (``ranks={"other": [0]}``), against Ray's own cost of one no-op
  ``__ray_call__`` to every actor (the same actors, just before); and the resident memory of a
  member after joining against the same actor before it joined (``/proc/self/statm``), and
  whether it imported torch.
- ``first``: a group of 2 sync actors, ``tool="torch"``, both selected: how long ``group()``
  takes (their warm-up), then the wall time of each of ``--steps`` in-window steps.
- ``frozen``: a group of 2 threaded actors (``max_concurrency=2``), ``control_timeout`` of
  ``--timeout`` seconds, one of them stopped with SIGSTOP; the wall time of each of ``--steps``
  in-window steps (step mode, ``noop`` backend), each serving one call of the other actor.

Run: ``PYTHONPATH=. python benchmarks/bench_ray_faults.py [--only register,first,frozen] [--workers 16]``.
"""

from __future__ import annotations

import argparse
import logging
import os
import signal
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import ray

import profctx
import profctx.ray

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from _ray_actors import Probe, nothing  # noqa: E402 - the folder is on sys.path only from here


def rss_mb(actor: Any) -> tuple[float, bool]:
    """Run through ``__ray_call__``: this process's resident memory (MB) and whether torch is imported."""
    with open("/proc/self/statm") as statm:
        pages = int(statm.read().split()[1])
    return pages * os.sysconf("SC_PAGE_SIZE") / 2**20, "torch" in sys.modules


def bench_register(save: str, workers: int, rounds: int) -> None:
    ray_ms, group_ms, before_mb, after_mb, torch_seen = [], [], [], [], []
    for round_ in range(rounds):
        actors = [Probe.remote() for _ in range(workers)]  # type: ignore[attr-defined]
        ray.get([a.plain.remote() for a in actors])  # processes up
        ray.get([a.__ray_call__.remote(nothing) for a in actors])
        t0 = time.perf_counter()
        ray.get([a.__ray_call__.remote(nothing) for a in actors])
        ray_ms.append((time.perf_counter() - t0) * 1e3)
        before_mb.append(statistics.mean(m for m, _ in ray.get([a.__ray_call__.remote(rss_mb) for a in actors])))
        profctx.configure(steps="1:10", mode="step", ranks={"other": [0]}, tool="torch", save_path=save,
                          run_id=f"register-{round_}")
        t0 = time.perf_counter()
        _joined = profctx.ray.group("actor", actors).members  # once joined: group() only sends
        group_ms.append((time.perf_counter() - t0) * 1e3)
        seen = ray.get([a.__ray_call__.remote(rss_mb) for a in actors])
        after_mb.append(statistics.mean(m for m, _ in seen))
        torch_seen.append(sum(t for _, t in seen))
        profctx.reset()
        for a in actors:
            ray.kill(a)
    ray_med, group_med = statistics.median(ray_ms), statistics.median(group_ms)
    print(f"\n## register: {workers} actors, tool='torch', no member selected; median of {rounds} rounds")
    print("| what | ms | x Ray's round |")
    print("|---|---:|---:|")
    print(f"| Ray: one no-op __ray_call__ to every actor | {ray_med:.1f} | 1.00 |")
    print(f"| profctx.ray.group(...) | {group_med:.1f} | {group_med / ray_med:.2f} |")
    print(f"\nmember RSS before join {statistics.median(before_mb):.1f} MB, "
          f"after {statistics.median(after_mb):.1f} MB; members that imported torch: {max(torch_seen)} of {workers}")


def bench_first(save: str, steps: int) -> None:
    profctx.configure(steps=f"1:{steps + 1}", mode="step", ranks="all", profile_driver=False, tool="torch",
                      save_path=save, compress=False)
    actors = [Probe.remote() for _ in range(2)]  # type: ignore[attr-defined]
    ray.get([a.plain.remote() for a in actors])
    t0 = time.perf_counter()
    _joined = profctx.ray.group("actor", actors).members  # once joined: group() only sends
    joined = time.perf_counter() - t0
    times = []
    for step in range(1, steps + 1):
        t0 = time.perf_counter()
        with profctx.profile_step(step):
            ray.get([a.plain.remote() for a in actors])
        times.append(time.perf_counter() - t0)
    profctx.ray.flush(actors)
    profctx.reset()
    for a in actors:
        ray.kill(a)
    print(f"\n## first: 2 sync actors, tool='torch', both selected; group() took {joined:.2f} s (their warm-up)")
    print("| step | wall (ms) |")
    print("|---:|---:|")
    for step, t in enumerate(times, 1):
        print(f"| {step} | {t * 1e3:.1f} |")


def bench_frozen(save: str, steps: int, timeout: float) -> None:
    profctx.configure(steps=f"1:{steps + 1}", mode="step", ranks="all", profile_driver=False, tool="noop",
                      save_path=save, warmup=False)
    actors = [Probe.options(max_concurrency=2).remote() for _ in range(2)]  # type: ignore[attr-defined]
    grp = profctx.ray.group("actor", actors, control_timeout=timeout)
    pid = grp.members[1].pid
    assert pid is not None
    times = []
    os.kill(pid, signal.SIGSTOP)
    try:
        for step in range(1, steps + 1):
            t0 = time.perf_counter()
            with profctx.profile_step(step):
                ray.get(actors[0].plain.remote())
            times.append(time.perf_counter() - t0)
    finally:
        os.kill(pid, signal.SIGCONT)
    profctx.ray.flush(actors)
    profctx.reset()
    for a in actors:
        ray.kill(a)
    print(f"\n## frozen: 2 threaded actors, one stopped (SIGSTOP), control_timeout={timeout:g}s")
    print("| step | wall (s) |")
    print("|---:|---:|")
    for step, t in enumerate(times, 1):
        print(f"| {step} | {t:.3f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--only", default="register,first,frozen")
    parser.add_argument("--workers", type=int, default=16)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--timeout", type=float, default=2.0)
    args = parser.parse_args()
    ray.init(num_cpus=2, include_dashboard=False, logging_level=logging.WARNING, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join(
                 p for p in (str(HERE), os.environ.get("PYTHONPATH", "")) if p)}})
    try:
        with tempfile.TemporaryDirectory() as save:
            only = set(args.only.split(","))
            if "register" in only:
                bench_register(save, args.workers, args.rounds)
            if "first" in only:
                bench_first(save, args.steps)
            if "frozen" in only:
                bench_frozen(save, args.steps, args.timeout)
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
