"""The demo's driver: a PPO-shaped loop over Ray actors, profiled from one ``configure()`` call."""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import profctx
from profctx.records import _manifest


@dataclass(frozen=True)
class DemoOptions:
    """What ``profctx demo`` runs; the CLI flags map one to one."""

    steps: int = 4
    window: str | list[int] = "2:4"
    mode: str = "role"
    ranks: str = "all"
    save_path: str = "./profctx-demo"
    rollouts: int = 2
    tool: str = "torch"
    prompts: int = 32
    new_tokens: int = 24


def run(options: DemoOptions, say: Callable[[str], None] = print) -> list[dict[str, Any]]:
    """Start a local Ray cluster, run the loop, shut Ray down; return the captures from the manifest.

    Raise :class:`profctx.ConfigError` for invalid options before Ray starts. Ray is shut
    down on every exit path, ``KeyboardInterrupt`` included.
    """
    import ray

    save_path = Path(options.save_path).expanduser().absolute()
    profctx.configure(steps=options.window, mode=options.mode, ranks=options.ranks, save_path=str(save_path),
                      tool=options.tool, contents=["cpu"])
    say(f"profctx demo: steps 1..{options.steps}, window {options.window!r}, mode {options.mode!r}, "
        f"ranks {options.ranks!r}, tool {options.tool!r}")
    started = time.perf_counter()
    ray.init(num_cpus=2, include_dashboard=False, logging_level=logging.WARNING, log_to_driver=False,
             configure_logging=False)
    try:
        say(f"  ray started in {time.perf_counter() - started:.1f} s")
        _loop(options, say)
    finally:
        ray.shutdown()
        profctx.flush()
        profctx.reset()
    return _manifest.read(save_path)


def _loop(options: DemoOptions, say: Callable[[str], None]) -> None:
    import ray

    from profctx import ray as pray

    from ._actors import Rollout, Trainer

    rollouts = [Rollout.remote(100 + i) for i in range(options.rollouts)]  # type: ignore[attr-defined]
    trainers = [Trainer.remote(7) for _ in range(2)]  # type: ignore[attr-defined]
    # Worker groups: each actor learns its group and rank (its position), and from now on
    # enters every profiled step with the driver.
    started = time.perf_counter()
    groups = [pray.group("rollout", rollouts), pray.group("actor", trainers)]  # both groups join at once
    for grp in groups:
        grp.members  # noqa: B018 - waits for the joins: the workers' start and warm-up stay out of step 1
    say(f"  {len(rollouts) + len(trainers)} workers joined in {time.perf_counter() - started:.1f} s")
    window = profctx.get_config().steps  # type: ignore[union-attr]
    for step in range(1, options.steps + 1):
        t0 = time.perf_counter()
        with profctx.profile_step(step):
            # Rollout: one call per rollout actor, concurrently.
            batches = pray.fan_out([(r, "generate") for r in rollouts], (options.prompts, options.new_tokens))
            sequences = [seq for batch in batches for seq in batch]
            shards = [sequences[i::len(trainers)] for i in range(len(trainers))]
            # Reference log-probs and the update: plain .remote() calls; the workers already
            # know the step (their driver entered it with them) and their group and rank.
            ref_logp = ray.get([t.ref_log_prob.remote(s) for t, s in zip(trainers, shards, strict=True)])
            stats = ray.get([t.update.remote(s, lp) for t, s, lp in zip(trainers, shards, ref_logp, strict=True)])
        loss = sum(s["loss"] for s in stats) / len(stats)
        mark = "profiled" if window is not None and step in window else ""
        say(f"  step {step}: {len(sequences)} sequences, loss {loss:+.4f}, {time.perf_counter() - t0:.2f} s {mark}")
    # Workers write traces on a background thread: wait for them before Ray goes away.
    pray.flush()
