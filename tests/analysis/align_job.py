"""A GRPO-shaped loop under ``torchrun`` (gloo, CPU) with a lag the test injects: the corpus of ``test_align.py``.

Each step runs ``rollout`` (with ``generate`` nested in it: 20 ms of its sleep), ``ref`` and
``actor_update`` (a DDP model's forward, backward — DDP's all-reduce — and optimizer step).
``--slow ROLE:RANK:SECONDS:STEPS`` sleeps that long inside ``ROLE`` on ``RANK`` in those steps
(comma-separated); ``--late RANK:SECONDS:STEPS`` sleeps before the step block opens (where a data
loader sits). Steps 1..``--steps``; ``--window`` (comma-separated steps) is profiled in step mode on
every rank.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel

import profctx


def _parse(text: str, fields: int) -> tuple[list[str], list[int]]:
    parts = text.split(":")
    if len(parts) != fields:
        raise SystemExit(f"bad value {text!r}")
    return parts[:-1], [int(s) for s in parts[-1].split(",")]


def main() -> None:
    """Run the loop the module docstring describes."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--save", required=True)
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--window", default="")
    parser.add_argument("--slow", default="")
    parser.add_argument("--late", default="")
    parser.add_argument("--fsdp", action="store_true")
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    slow: dict[tuple[str, int], float] = {}
    if args.slow:
        (role, who, seconds), steps = _parse(args.slow, 4)
        if int(who) == rank:
            slow.update({(role, s): float(seconds) for s in steps})
    late: dict[int, float] = {}
    if args.late:
        (who, seconds), steps = _parse(args.late, 3)
        if int(who) == rank:
            late.update({s: float(seconds) for s in steps})
    torch.manual_seed(0)
    model: torch.nn.Module = torch.nn.Sequential(torch.nn.Linear(64, 64), torch.nn.Tanh(), torch.nn.Linear(64, 1))
    if args.fsdp:
        from torch.distributed.fsdp import fully_shard

        fully_shard(model)
    else:
        model = DistributedDataParallel(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    # Out of the window, the timeline alone (a window past the end when none is asked for).
    window = [int(s) for s in args.window.split(",")] if args.window else [10_000]
    profctx.configure(steps=window, ranks="all", save_path=args.save, warmup=False)
    x = torch.randn(32, 64)
    for step in range(1, args.steps + 1):
        time.sleep(late.get(step, 0.0))  # before the step: a data loader's time
        with profctx.profile_step(step):
            with profctx.profile_step(role="rollout"):
                batch = torch.tanh(x @ x.T) @ x
                with profctx.profile_step(role="generate"):  # a nested role: shown under rollout
                    time.sleep(0.02 + slow.get(("rollout", step), 0.0))
            with profctx.profile_step(role="ref"):
                with torch.no_grad():
                    ref = model(batch)
                time.sleep(0.02 + slow.get(("ref", step), 0.0))
            with profctx.profile_step(role="actor_update"):
                loss = ((model(batch) - ref) ** 2).mean() + model(batch).mean()
                loss.backward()
                opt.step()
                opt.zero_grad()
                time.sleep(slow.get(("actor_update", step), 0.0))
    profctx.flush(60)
    profctx.reset()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
