"""What the always-on step timeline costs the training thread, and its writer per step.

Measured as ratios within one run (absolute times drift on a shared machine), in the training
thread's own CPU time, timeline on and off timed in alternation, best of many short runs:

- an out-of-window ``with profile_step(step)`` block with one ``with profile_step(role=...)`` block
  inside (the target: at most 1.2 times the same with ``timeline=False``);
- the step block alone, and the role block alone inside an out-of-window step;
- ``Steps.begin``/``end`` around one ``begin_role``/``end_role``;
- the writer thread's work per step (folding, the totals, JSON, the append), timed apart;
- ``--instructions``: the first case's instructions on the training thread alone, on and off (valgrind's
  callgrind, one file per thread; the difference of a 12,000- and a 2,000-iteration run): a count the
  machine's load does not move, and without the writer thread, which in this loop of some 250,000 steps
  a second is busy all the time and contends for the GIL as no real training loop makes it.

Run by hand: ``PYTHONPATH=. python benchmarks/bench_timeline.py [--quick] [--instructions]``. Prints a
Markdown table.
"""

from __future__ import annotations

import argparse
import logging
import os
import platform
import shutil
import subprocess
import sys
import tempfile
import time
import timeit
from typing import Any

import profctx
from profctx.process._owner import OWNER
from profctx.process._timeline import FLUSH_EVENTS

CASES = {
    "out-of-window step block with one role block inside":
        "with profile_step(7):\n    with profile_step(role='rollout'):\n        pass",
    "out-of-window step block alone": "with profile_step(7):\n    pass",
    "`Steps.begin`/`end` around `begin_role`/`end_role`, out of window":
        "steps.begin(7)\nsteps.begin_role('rollout')\nsteps.end_role('rollout')\nsteps.end()",
}
#: The role block alone is timed inside an open out-of-window step.
ROLE_ALONE = "role block alone, inside an out-of-window step"


def per_call_ns(stmt: str, env: dict[str, Any], number: int) -> float:
    """Return the per-execution thread CPU time of one short run of ``stmt``, in nanoseconds."""
    return timeit.timeit(stmt, number=number, globals=env, timer=time.thread_time) / number * 1e9


def configure(save_path: str, timeline: bool) -> None:
    profctx.configure(steps=[10**6], save_path=save_path, tool="noop", warmup=False, timeline=timeline)


def compare(stmt: str, save_path: str, number: int, rounds: int, inside_step: bool = False) -> tuple[float, float]:
    """Return the best ns per execution of ``stmt`` with the timeline off and on, timed in alternation."""
    best = {False: float("inf"), True: float("inf")}
    env: dict[str, Any] = {"profile_step": profctx.profile_step}
    for _ in range(rounds):
        for timeline in (False, True):
            configure(save_path, timeline)
            env["steps"] = profctx.Steps()
            if inside_step:
                with profctx.profile_step(7):
                    best[timeline] = min(best[timeline], per_call_ns(stmt, env, number))
            else:
                best[timeline] = min(best[timeline], per_call_ns(stmt, env, number))
    profctx.reset()
    return best[False], best[True]


def writer_per_step(save_path: str, steps: int) -> float:
    """Return the writer thread's CPU time per step of two roles, in nanoseconds (one batch folded and written)."""
    configure(save_path, True)
    runtime = OWNER.runtime
    assert runtime is not None and runtime.timeline is not None
    timeline = runtime.timeline
    best = float("inf")
    for _ in range(5):
        for step in range(steps):
            timeline.events.append(("rollout", 1.0, 1.01))
            timeline.events.append(("train/backward", 1.01, 1.03))
            timeline.events.append((step, 1.0, 1.05))
        t0 = time.thread_time()
        timeline.flush()
        best = min(best, (time.thread_time() - t0) / steps * 1e9)
    profctx.reset()
    return best


LOOP = """
import os, sys, tempfile, logging, profctx
logging.getLogger("profctx").setLevel(logging.ERROR)
profctx.configure(steps=[10**6], save_path=tempfile.mkdtemp(), tool="noop", warmup=False, timeline=sys.argv[1] == "on")
ps = profctx.profile_step
for _ in range(int(sys.argv[2])):
    with ps(7):
        with ps(role="rollout"):
            pass
os._exit(0)
"""


def instructions() -> tuple[float, float] | None:
    """Return the training thread's instructions per step block with a role block inside, timeline off and on."""
    if shutil.which("valgrind") is None:
        return None
    counts = {}
    with tempfile.TemporaryDirectory() as tmp:
        for mode in ("off", "on"):
            totals = []
            for n in (2_000, 12_000):
                out = os.path.join(tmp, f"cg.{mode}.{n}")
                subprocess.run(["valgrind", "--tool=callgrind", "--separate-threads=yes", f"--callgrind-out-file={out}",
                                sys.executable, "-c", LOOP, mode, str(n)], check=True, capture_output=True)
                with open(out + "-01") as handle:  # thread 1: the main (training) thread
                    totals.append(next(int(line.split()[1]) for line in handle if line.startswith("totals:")))
            counts[mode] = (totals[1] - totals[0]) / 10_000
    return counts["off"], counts["on"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds (a smoke run)")
    parser.add_argument("--instructions", action="store_true", help="also count instructions with valgrind")
    args = parser.parse_args()
    logging.getLogger("profctx").setLevel(logging.ERROR)  # "nothing was captured": true, and beside the point
    number, rounds = (2_000, 5) if args.quick else (20_000, 25)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for label, stmt in CASES.items():
            off, on = compare(stmt, tmp, number, rounds)
            rows.append((label, off, on))
        off, on = compare("with profile_step(role='rollout'):\n    pass", tmp, number, rounds, inside_step=True)
        rows.append((ROLE_ALONE, off, on))
        writer = writer_per_step(tmp, FLUSH_EVENTS)
    print(f"Python {platform.python_version()}, {number} executions x {rounds} rounds per figure, thread CPU time\n")
    print("| what (training thread) | timeline off, ns | timeline on, ns | on / off | target |")
    print("|---|---:|---:|---:|---|")
    for label, off, on in rows:
        target = "<= 1.20" if label.startswith("out-of-window step block with") else ""
        verdict = (" — met" if on / off <= 1.2 else " — **missed**") if target else ""
        print(f"| {label} | {off:.0f} | {on:.0f} | {on / off:.2f} | {target}{verdict} |")
    print(f"\nwriter thread, per step of two roles (fold, JSON, append): {writer:.0f} ns")
    if args.instructions:
        counted = instructions()
        if counted is None:
            print("instructions: valgrind not found")
        else:
            off, on = counted
            print(f"instructions on the training thread, step block with a role block: {off:.0f} off, {on:.0f} on, "
                  f"{on / off:.2f}x")


if __name__ == "__main__":
    main()
