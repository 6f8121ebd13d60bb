"""``profctx demo``: run a miniature profiled RL loop on a local Ray cluster and list its captures."""

from __future__ import annotations

import argparse
import sys
from typing import Any

from ..core._vocab import MODES
from ..util._errors import ConfigError
from ._common import FINDINGS, OK, USAGE, size, table


def register(subparsers: Any) -> None:
    """Add the ``demo`` subcommand."""
    parser = subparsers.add_parser(
        "demo",
        help="run a small PPO-shaped loop on a local Ray cluster and show what was profiled",
        description="Start a local Ray cluster (2 CPUs) with 2 training-worker actors and rollout actors, run a "
                    "PPO-shaped loop on CPU torch, profile the steps of --window, then print a table of every "
                    "capture read from the manifest. Needs the 'demo' extra: pip install 'profctx[demo]'. "
                    "Exit code 1 when a capture failed.",
    )
    parser.add_argument("--steps", type=int, default=4, help="number of loop steps (default 4)")
    parser.add_argument("--window", default="2:4", help="steps to profile, e.g. '2:4' or '1,3' (default 2:4)")
    parser.add_argument("--mode", default="role", choices=MODES,
                        help="one capture per role block, or per step (default role)")
    parser.add_argument("--ranks", default="all", help="ranks to profile: 'all' or e.g. '0' (default all)")
    parser.add_argument("--save-path", default="./profctx-demo", help="where traces go (default ./profctx-demo)")
    parser.add_argument("--rollouts", type=int, default=2, choices=(1, 2), help="rollout actors (default 2)")
    parser.add_argument("--tool", default="torch", help="profiling backend (default torch)")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Run the demo; return 0 when every capture succeeded."""
    if args.steps < 1:
        print(f"profctx demo: --steps {args.steps} is not valid; give an integer >= 1", file=sys.stderr)
        return USAGE
    window = _window(args.window)
    if window is None:
        print(f"profctx demo: --window {args.window!r} is not valid; give a slice 'START:STOP' (e.g. '2:4') "
              "or steps separated by commas (e.g. '1,3')", file=sys.stderr)
        return USAGE
    try:
        import ray  # noqa: F401
        import torch  # noqa: F401
    except ImportError as exc:
        print(f"profctx demo needs torch and ray: pip install 'profctx[demo]' ({exc})", file=sys.stderr)
        return USAGE
    from ..demo import DemoOptions
    from ..demo import run as run_demo

    options = DemoOptions(steps=args.steps, window=window, mode=args.mode, ranks=args.ranks,
                          save_path=args.save_path, rollouts=args.rollouts, tool=args.tool)
    try:
        records = run_demo(options)
    except ConfigError as exc:
        print(f"profctx demo: {exc}", file=sys.stderr)
        return USAGE
    except KeyboardInterrupt:
        print("profctx demo: interrupted; Ray was shut down", file=sys.stderr)
        return 130
    rows = [
        [str(r.get("step", "-")), str(r.get("role") or "(step)"), str(r.get("group") or "driver"),
         str(r.get("rank", "-")), str(r.get("status")), str(len(r.get("files") or [])), size(r.get("bytes")),
         str(r.get("reason") or r.get("error") or "")]
        for r in records
    ]
    print()
    print(table(["step", "role", "group", "rank", "status", "files", "size", "note"], rows, right=(0, 3, 5, 6)))
    print()
    print(f"{len(records)} captures; traces and manifest under {options.save_path}")
    print(f"next: profctx ls {options.save_path}")
    print(f"      profctx report {options.save_path}        (HTML: phases, stragglers, top operators)")
    profiled = sorted({int(r["step"]) for r in records if isinstance(r.get("step"), int)})
    a, b = (profiled[0], profiled[-1]) if len(profiled) > 1 else ("A", "B")
    print(f"      profctx diff {options.save_path} --steps {a} {b}   (what changed between two steps)")
    print(f"      profctx timeline {options.save_path}      (every step's time and phases, profiled or not)")
    return OK if records and all(r.get("status") == "ok" for r in records) else FINDINGS


def _window(text: str) -> str | list[int] | None:
    """Return the window as ``profctx.configure`` takes it, or ``None`` when ``text`` is not one."""
    text = text.strip()
    if ":" in text:
        return text  # configure() checks the slice and raises ConfigError naming what is wrong
    try:
        steps = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        return None
    return steps or None
