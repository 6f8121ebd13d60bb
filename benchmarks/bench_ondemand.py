"""What on-demand capture and the anomaly watch cost the blocks of a run that captures nothing (issue 27).

Each row is a ratio: the same block, out of the window, with the feature on over the feature off,
timed in alternation in this one process (thread CPU time, best of many short runs), so the
machine's load moves both alike. ``on_demand=True`` costs the training thread nothing per block
(its poll thread adds a request's steps to the window the block fast path already tests); the
anomaly watch (``auto_capture``) reads the clock and keeps a median once per step block.

Run by hand: ``python benchmarks/bench_ondemand.py [--quick]``. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import timeit
from typing import Any

import profctx

#: A window far ahead: every block measured is out of it, as in most steps of a run.
FAR = [10**9]


def best(stmt: str, env: dict[str, Any], number: int) -> float:
    return min(timeit.repeat(stmt, number=number, repeat=1, globals=env, timer=time.thread_time)) / number * 1e9


def paired(stmt: str, on: dict[str, Any], off: dict[str, Any], save: str, number: int,
           rounds: int) -> tuple[float, float]:
    """Best ns of ``stmt`` configured with ``on`` and with ``off``, in alternation (``rounds`` short runs each)."""
    env: dict[str, Any] = {"profile_step": profctx.profile_step, "counter": iter(range(10**12))}
    with_on, with_off = float("inf"), float("inf")
    for _ in range(rounds):
        profctx.configure(save_path=save, tool="noop", steps=FAR, **off)
        with_off = min(with_off, best(stmt, env, number))
        profctx.configure(save_path=save, tool="noop", steps=FAR, **on)
        with_on = min(with_on, best(stmt, env, number))
    profctx.reset()
    return with_on, with_off


def rows(number: int, rounds: int) -> list[tuple[str, float, float, float]]:
    step = "with profile_step(next(counter)): pass"
    nested = ("with profile_step(next(counter)):\n"
              "    with profile_step(role='rollout'): pass\n"
              "    with profile_step(role='train'): pass")
    role = "with profile_step(role='rollout'): pass"
    out = []
    with tempfile.TemporaryDirectory() as save:
        for label, stmt, on in (
            ("step block, on_demand=True vs off", step, {"on_demand": True}),
            ("step with two role blocks, on_demand=True vs off", nested, {"on_demand": True}),
            ("role block, on_demand=True vs off", role, {"on_demand": True}),
            ("step block, auto_capture on vs off", step, {"auto_capture": {"window": 20}}),
            ("step with two role blocks, auto_capture on vs off", nested, {"auto_capture": {"window": 20}}),
        ):
            t_on, t_off = paired(stmt, on, {}, save, number, rounds)
            out.append((label, t_on, t_off, t_on / t_off))
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer and shorter runs (noisier)")
    args = parser.parse_args(argv)
    import logging

    logging.getLogger("profctx").setLevel(logging.ERROR)  # every run here captures nothing, on purpose
    number, rounds = (2_000, 5) if args.quick else (20_000, 15)
    print(f"python {sys.version.split()[0]}, {number} blocks per run, best of {rounds} runs each\n")
    print("| block (out of the window) | on, ns | off, ns | on / off |")
    print("|---|---:|---:|---:|")
    for label, t_on, t_off, ratio in rows(number, rounds):
        print(f"| {label} | {t_on:.0f} | {t_off:.0f} | {ratio:.2f} |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
