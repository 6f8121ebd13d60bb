"""Integrations (issue 24): what the begin/end form and the framework adapters cost per step out of the window.

The contract: per step outside the window, the Hugging Face callback and the Lightning profiler
cost no more than one ``with profile_step(step)`` block, against the same training step without
them. Timed here, in alternation with that block, in one run:

- ``profctx.Steps``: the marks the adapters make;
- the callback: its events of one step (gradient accumulation 1), called with the arguments the
  ``Trainer`` passes, and through the ``Trainer``'s own ``CallbackHandler`` against the same handler
  without it and with a callback that does nothing (what the ``Trainer`` spends on any callback);
- the Lightning profiler: one real training batch's actions, recorded from a real ``fit()`` of a
  default ``Trainer`` (its callbacks included) and replayed as the nested ``with
  profiler.profile(action)`` blocks Lightning runs, against Lightning's default profiler
  (``PassThroughProfiler``, what a ``Trainer`` without ``profiler=`` calls). The replay steps
  the Trainer's optimizer-step count once per batch, as the optimizer does, so each batch is a
  new step read from the real ``trainer.global_step``.

Run by hand: ``python benchmarks/bench_integrations.py [--quick]``. Prints a Markdown table;
absolute times drift on shared machines, ratios taken in one run do not.
"""

from __future__ import annotations

import argparse
import logging
import sys
import tempfile
import time
import timeit
import weakref
from typing import Any

import profctx

#: One row: what, its ns per step, the ns of the same step without it (``None``: compared with nothing).
Row = tuple[str, float, float | None]


def per_call_ns(stmt: str, env: dict[str, Any], number: int) -> float:
    return min(timeit.repeat(stmt, number=number, repeat=1, globals=env, timer=time.thread_time)) / number * 1e9


def timed(stmts: dict[str, str], env: dict[str, Any], number: int, rounds: int) -> dict[str, float]:
    """Best per-call ns of each statement, all timed in alternation (the same quiet moments)."""
    best = dict.fromkeys(stmts, float("inf"))
    for _ in range(rounds):
        for name, stmt in stmts.items():
            best[name] = min(best[name], per_call_ns(stmt, env, number))
    return best


def lightning_batch(tmp: str) -> tuple[list[tuple[str, str]], Any, Any]:
    """The actions of one training batch of a real default ``Trainer.fit``, with its module and trainer."""
    import torch
    from lightning.pytorch import LightningModule, Trainer
    from lightning.pytorch.profilers import Profiler

    logging.getLogger("lightning").setLevel(logging.ERROR)
    log: list[tuple[str, str]] = []

    class Recorder(Profiler):  # type: ignore[misc]
        def start(self, action_name: str) -> None:
            log.append(("start", action_name))

        def stop(self, action_name: str) -> None:
            log.append(("stop", action_name))

    class Net(LightningModule):  # type: ignore[misc]
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Linear(4, 1)

        def training_step(self, batch: Any, index: int) -> Any:
            return self.layer(batch[0]).pow(2).mean()

        def configure_optimizers(self) -> Any:
            return torch.optim.SGD(self.parameters(), lr=0.1)

    net = Net()
    data = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(torch.randn(16, 4)), batch_size=2)
    trainer = Trainer(max_steps=3, profiler=Recorder(), accelerator="cpu", logger=False, default_root_dir=tmp,
                        enable_progress_bar=True)
    trainer.fit(net, data)
    begun = [i for i, entry in enumerate(log) if entry == ("start", "run_training_batch")]
    return log[begun[1]:begun[2]], net, trainer  # the second batch to the third: one batch and what runs between


def replay_source(actions: list[tuple[str, str]]) -> str:
    """A function running ``actions`` as nested ``with p.profile(name):`` blocks (``tick()`` in the optimizer step)."""
    lines = ["def batch(p, tick):"]
    depth = 1
    for kind, name in actions:
        if kind == "start":
            lines.append("    " * depth + f"with p.profile({name!r}):")
            depth += 1
            if name.endswith(".optimizer_step"):
                lines.append("    " * depth + "tick()")
        else:
            lines.append("    " * depth + "pass")
            depth -= 1
    assert depth == 1, "the recorded actions do not nest"
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rounds (a smoke run)")
    options = parser.parse_args()
    number, rounds = (2_000, 5) if options.quick else (20_000, 25)

    profctx.configure(steps="1000000:1000002", tool="noop", save_path=tempfile.mkdtemp(prefix="profctx-bench-"),
                      exit_hooks=False, warmup=False)
    env: dict[str, Any] = {"profctx": profctx, "steps": profctx.Steps()}
    block = "with profctx.profile_step(3): pass"
    rows: list[Row] = []
    blocks: list[float] = []

    got = timed({"block": block, "pair": "steps.begin(3); steps.end()",
                 "roles": "steps.begin(3); steps.begin_role('training_step'); steps.end_role('training_step'); "
                          "steps.begin_role('optimizer_step'); steps.end_role('optimizer_step'); steps.end()"},
                env, number, rounds)
    blocks.append(got["block"])
    rows += [("`profctx.Steps`: begin and end", got["pair"], None),
             ("`profctx.Steps`: a step and two roles (the callback's marks)", got["roles"], None)]

    try:
        from transformers import TrainerCallback, TrainerControl, TrainerState, TrainingArguments
        from transformers.trainer_callback import CallbackHandler, DefaultFlowCallback

        from profctx.integrations.transformers import ProfctxCallback
    except ImportError:
        print("transformers not installed: the callback's rows are left out", file=sys.stderr)
    else:
        events = ("on_step_begin", "on_pre_optimizer_step", "on_optimizer_step", "on_step_end")
        #: What the Trainer's handler passes to every callback at every event.
        keywords = ", ".join(f"{name}=None" for name in ("model", "processing_class", "optimizer", "lr_scheduler",
                                                          "train_dataloader", "eval_dataloader"))
        callback = ProfctxCallback()
        env.update(cb=callback, state=TrainerState(global_step=2), control=TrainerControl(),
                   args=TrainingArguments(output_dir=tempfile.mkdtemp(), report_to=[], use_cpu=True),
                   bare=CallbackHandler([DefaultFlowCallback], None, None, None, None),
                   with_cb=CallbackHandler([DefaultFlowCallback, callback], None, None, None, None),
                   with_idle=CallbackHandler([DefaultFlowCallback, TrainerCallback()], None, None, None, None))
        got = timed({"block": block,
                     "direct": "; ".join(f"cb.{e}(args, state, control, {keywords})" for e in events),
                     "bare": "; ".join(f"bare.{e}(args, state, control)" for e in events),
                     "handled": "; ".join(f"with_cb.{e}(args, state, control)" for e in events),
                     "idle": "; ".join(f"with_idle.{e}(args, state, control)" for e in events)},
                    env, number, rounds)
        blocks.append(got["block"])
        rows += [("`ProfctxCallback`: one step's four events, called as the `Trainer`'s handler calls them",
                  got["direct"], None),
                 ("`ProfctxCallback` through the `Trainer`'s `CallbackHandler`", got["handled"], got["bare"]),
                 ("a `TrainerCallback` that does nothing, through the same handler (the `Trainer`'s dispatch)",
                  got["idle"], got["bare"]),
                 ("`ProfctxCallback` through the handler, over the callback that does nothing", got["handled"],
                  got["idle"])]

    try:
        from lightning.pytorch.profilers import PassThroughProfiler, SimpleProfiler

        from profctx.integrations.lightning import ProfctxProfiler
    except ImportError:
        print("lightning not installed: the profiler's rows are left out", file=sys.stderr)
    else:
        actions, net, trainer = lightning_batch(tempfile.mkdtemp(prefix="profctx-bench-fit-"))
        namespace: dict[str, Any] = {}
        exec(compile(replay_source(actions), "<batch>", "exec"), namespace)  # nested with-blocks, from replay_source
        progress = trainer.fit_loop.epoch_loop.automatic_optimization.optim_progress.optimizer.step
        env.update(batch=namespace["batch"], tick=progress.increment_completed)
        stmts = {"block": block}
        for name, profiler in (("none", PassThroughProfiler()), ("profctx", ProfctxProfiler(summary=False)),
                               ("profctx+summary", ProfctxProfiler(summary=True)), ("simple", SimpleProfiler())):
            profiler._lightning_module = weakref.proxy(net)  # as the Trainer does before setup
            profiler.setup("fit")
            key = "profiler_" + name.replace("+", "_")
            env[key] = profiler
            stmts[name] = f"batch({key}, tick)"
        got = timed(stmts, env, max(number // 20, 50), rounds)
        blocks.append(got["block"])
        pairs = len(actions) // 2
        rows += [(f"`ProfctxProfiler(summary=False)`: one batch ({pairs} actions)", got["profctx"], got["none"]),
                 (f"`ProfctxProfiler()` (with its summary): one batch ({pairs} actions)", got["profctx+summary"],
                  got["none"]),
                 ("Lightning's own `SimpleProfiler` on the same batch, for comparison", got["simple"], got["none"]),
                 ("Lightning's default `PassThroughProfiler` (a `Trainer` without `profiler=`)", got["none"], None)]

    one = min(blocks)
    print(f"One `with profile_step` block out of the window: {one:.0f} ns (best of {len(blocks)} series).\n")
    print("| per step, out of the window | ns | without it, ns | added, ns | added, x one block | all, x one block |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, value, without in rows:
        if without is None:
            print(f"| {name} | {value:.0f} | | | | {value / one:.2f} |")
        else:
            print(f"| {name} | {value:.0f} | {without:.0f} | {value - without:.0f} | {(value - without) / one:.2f} "
                  f"| {value / one:.2f} |")
    profctx.reset()


if __name__ == "__main__":
    main()
