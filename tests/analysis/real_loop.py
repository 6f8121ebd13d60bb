"""A small training-shaped loop profiled for real: the corpus of ``test_real_traces.py``.

``--modes step,contiguous,role`` runs the loop once per mode in one process (saving a torch
import per mode), each into ``--save``/MODE.

Run as a script (a process of its own: torch's profiler is process-global), alone or under
``python -m torch.distributed.run``. Steps 1-4, profiled window 2:4. Each step runs roles of
real torch operators with a sleep inside (so role times stand well above the profiler's noise),
a user ``record_function`` inside a role and one outside every role; under torchrun a ``sync``
role all-reduces over gloo, and ``--straggler`` seconds are added to rank 1's ``actor_update``.
The time of each role's body, measured with ``time.perf_counter`` inside the ``with`` block, and of
the whole ``with`` statement, measured around it, are written as JSON lines under ``--timers``/MODE
(one file per rank): ``{"step", "role", "rank", "seconds", "around"}``.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

import torch

import profctx

#: Role -> seconds slept inside it (on top of its operators).
SLEEPS = {"rollout": 0.030, "actor_update": 0.015}
#: Seconds slept in a user range that is inside the step but in no role.
OUTSIDE = 0.005


def main() -> None:
    """Run the loop described in the module docstring."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--save", required=True)
    parser.add_argument("--timers", required=True)
    parser.add_argument("--modes", default="step", help="comma-separated: step, contiguous, role")
    parser.add_argument("--dist", action="store_true")
    parser.add_argument("--straggler", type=float, default=0.0)
    args = parser.parse_args()
    rank = 0
    if args.dist:
        import torch.distributed as dist

        dist.init_process_group("gloo")
        rank = dist.get_rank()
    for mode in args.modes.split(","):
        profctx.configure(steps="2:4", mode="role" if mode == "role" else "step", contiguous=mode == "contiguous",
                          ranks="all", save_path=Path(args.save) / mode)
        timers = run(args.dist, rank, args.straggler)
        profctx.flush(60)
        profctx.reset()
        out = Path(args.timers) / mode
        out.mkdir(parents=True, exist_ok=True)
        (out / f"rank{rank}-{os.getpid()}.jsonl").write_text("".join(json.dumps(t) + "\n" for t in timers))
    if args.dist:
        torch.distributed.destroy_process_group()


def run(dist: bool, rank: int, straggler: float) -> list[dict[str, object]]:
    """Run steps 1-4; return the timers of every role's body."""
    x = torch.randn(96, 96)
    timers: list[dict[str, object]] = []
    for step in range(1, 5):
        with profctx.profile_step(step):
            with torch.profiler.record_function("user_data_loading"):  # inside the step, in no role
                time.sleep(OUTSIDE)
            for role, nap in SLEEPS.items():
                before = time.perf_counter()
                with profctx.profile_step(role=role):
                    t0 = time.perf_counter()
                    with torch.profiler.record_function("user_inner"):  # a user range inside a role
                        for _ in range(10):
                            x = torch.tanh(x @ x)
                    time.sleep(nap + (straggler if role == "actor_update" and rank == 1 else 0.0))
                    seconds = time.perf_counter() - t0
                timers.append({"step": step, "role": role, "rank": rank, "seconds": seconds,
                               "around": time.perf_counter() - before})
            if dist:
                before = time.perf_counter()
                with profctx.profile_step(role="sync"):
                    t0 = time.perf_counter()
                    total = torch.ones(4096)
                    torch.distributed.all_reduce(total)
                    seconds = time.perf_counter() - t0
                timers.append({"step": step, "role": "sync", "rank": rank, "seconds": seconds,
                               "around": time.perf_counter() - before})
    return timers


if __name__ == "__main__":
    main()
