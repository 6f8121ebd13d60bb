"""Integrations (issue 24): what the begin/end form and the framework adapters cost per step out of the window.

The contract: per step outside the window, the Hugging Face callback and the Lightning profiler
cost no more than one ``with profile_step(step)`` block. Each is timed here as the calls its
framework makes in one training step (the callback's four events with gradient accumulation 1;
the profiler's start/stop pairs of one automatic-optimisation batch), against that block, in
alternation, in one run.

Run by hand: ``python benchmarks/bench_integrations.py [--quick]``. Prints a Markdown table;
absolute times drift on shared machines, ratios taken in one run do not.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import timeit
from typing import Any

import profctx

#: The start/stop actions of one Lightning training batch (automatic optimisation), in order.
LIGHTNING_BATCH = [
    ("start", "run_training_batch"), ("start", "[LightningModule]Net.optimizer_step"),
    ("start", "[Strategy]SingleDeviceStrategy.training_step"), ("stop", "[Strategy]SingleDeviceStrategy.training_step"),
    ("start", "[LightningModule]Net.optimizer_zero_grad"), ("stop", "[LightningModule]Net.optimizer_zero_grad"),
    ("start", "[Strategy]SingleDeviceStrategy.backward"), ("start", "[LightningModule]Net.on_before_backward"),
    ("stop", "[LightningModule]Net.on_before_backward"), ("stop", "[Strategy]SingleDeviceStrategy.backward"),
    ("stop", "[LightningModule]Net.optimizer_step"), ("stop", "run_training_batch"),
]


def per_call_ns(stmt: str, env: dict[str, Any], number: int) -> float:
    return min(timeit.repeat(stmt, number=number, repeat=1, globals=env, timer=time.thread_time)) / number * 1e9


def paired(stmt: str, base: str, env: dict[str, Any], number: int, rounds: int) -> tuple[float, float]:
    """Best per-step ns of ``stmt`` and of ``base``, timed in alternation (the same quiet moments)."""
    best = best_base = float("inf")
    for _ in range(rounds):
        best_base = min(best_base, per_call_ns(base, env, number))
        best = min(best, per_call_ns(stmt, env, number))
    return best, best_base


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds (a smoke run)")
    options = parser.parse_args()
    number, rounds = (2_000, 5) if options.quick else (20_000, 25)

    profctx.configure(steps="1000000:1000002", tool="noop", save_path=tempfile.mkdtemp(prefix="profctx-bench-"),
                      exit_hooks=False, warmup=False)
    env: dict[str, Any] = {"profctx": profctx, "steps": profctx.Steps(), "n": 0}
    rows: list[tuple[str, float, float]] = []
    base = "with profctx.profile_step(3): pass"

    rows.append(("Steps.begin(3); Steps.end()", *paired("steps.begin(3); steps.end()", base, env, number, rounds)))
    rows.append(("Steps: step + two roles (the callback's marks)", *paired(
        "steps.begin(3); steps.begin_role('training_step'); steps.end_role('training_step'); "
        "steps.begin_role('optimizer_step'); steps.end_role('optimizer_step'); steps.end()",
        base, env, number, rounds)))

    try:
        from transformers import TrainerControl, TrainerState, TrainingArguments

        from profctx.integrations.transformers import ProfctxCallback
    except ImportError:
        print("transformers not installed: the callback's row is left out", file=sys.stderr)
    else:
        env.update(cb=ProfctxCallback(), state=TrainerState(global_step=2), control=TrainerControl(),
                   args=TrainingArguments(output_dir=tempfile.mkdtemp(), report_to=[], use_cpu=True))
        rows.append(("ProfctxCallback: one step's four events", *paired(
            "cb.on_step_begin(args, state, control); cb.on_pre_optimizer_step(args, state, control); "
            "cb.on_optimizer_step(args, state, control); cb.on_step_end(args, state, control)",
            base, env, number, rounds)))

    try:
        from profctx.integrations.lightning import ProfctxProfiler
    except ImportError:
        print("lightning not installed: the profiler's row is left out", file=sys.stderr)
    else:
        for with_summary in (True, False):
            profiler = ProfctxProfiler(summary=with_summary)
            profiler.setup("fit")
            env["profiler"] = profiler
            stmt = "; ".join(f"profiler.{kind}({name!r})" for kind, name in LIGHTNING_BATCH)
            rows.append((f"ProfctxProfiler (summary={with_summary}): one batch's {len(LIGHTNING_BATCH) // 2} "
                         "start/stop pairs", *paired(stmt, base, env, number // 4, rounds)))

        from lightning.pytorch.profilers import SimpleProfiler

        simple = SimpleProfiler()
        simple.setup("fit")
        env["simple"] = simple
        stmt = "; ".join(f"simple.{kind}({name!r})" for kind, name in LIGHTNING_BATCH)
        rows.append(("Lightning's own SimpleProfiler (its summary), the same pairs, for comparison",
                     *paired(stmt, base, env, number // 4, rounds)))

    print("| per step, out of the window | ns | one `with profile_step` block, ns | ratio |")
    print("|---|---:|---:|---:|")
    for name, value, block in rows:
        print(f"| {name} | {value:.0f} | {block:.0f} | {value / block:.2f} |")
    profctx.reset()


if __name__ == "__main__":
    main()
