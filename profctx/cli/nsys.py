"""``profctx nsys-command``: the ``nsys profile`` line (or Ray ``nsight`` options) a config needs."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from .._config import ProfilerConfig, load_config
from .._errors import ConfigError
from ..backends import nsys

OK = 0
USAGE = 2


def register(subparsers: Any) -> None:
    """Add the ``nsys-command`` subcommand."""
    parser = subparsers.add_parser(
        "nsys-command",
        help="print the nsys command line (or Ray nsight options) matching a profctx config",
        description="Print the 'nsys profile' command whose --capture-range-end=repeat:N matches the number of "
                    "capture ranges a selected rank opens under the config (mode, window, contiguous, roles). "
                    "The config comes from --config (YAML), the options below and PROFCTX_* variables; tool='nsys' "
                    "is assumed. No GPU is needed to run this.",
    )
    parser.add_argument("--config", metavar="FILE", help="a profctx YAML config file")
    parser.add_argument("--steps", help="the step window, e.g. '3:6' or '1,2,5'")
    parser.add_argument("--mode", choices=("step", "role"), help="one capture per step, or per role")
    parser.add_argument("--contiguous", action="store_true", default=None,
                        help="consecutive steps share one capture (mode=step)")
    parser.add_argument("--roles", help="role filter, comma-separated fnmatch patterns")
    parser.add_argument("--save-path", help="where profctx files go; the report defaults to SAVE_PATH/nsys/")
    per_step = parser.add_mutually_exclusive_group()
    per_step.add_argument("--roles-per-step", type=int, metavar="K",
                          help="mode=role: how many matching roles open a capture in each step")
    per_step.add_argument("--step-roles", metavar="PATHS",
                          help="mode=role: the role paths one step enters, comma-separated "
                               "(e.g. 'rollout,train,train/actor_update'); profctx counts those that open a capture")
    parser.add_argument("--output", help="nsys --output (default SAVE_PATH/nsys/%%h_%%p)")
    parser.add_argument("--ray", action="store_true", help="print the runtime_env['nsight'] dict as JSON instead")
    parser.add_argument("program", nargs=argparse.REMAINDER, help="-- then the program and its arguments")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Print the command or the Ray options; return 2 on a config that cannot be used."""
    overrides: dict[str, Any] = {}
    if args.steps is not None:
        overrides["steps"] = args.steps
    if args.mode is not None:
        overrides["mode"] = args.mode
    if args.contiguous:
        overrides["contiguous"] = True
    if args.roles is not None:
        overrides["roles"] = [r.strip() for r in args.roles.split(",") if r.strip()]
    if args.save_path is not None:
        overrides["save_path"] = args.save_path
    roles_per_step: int | list[str] | None = args.roles_per_step
    if args.step_roles is not None:
        roles_per_step = [r.strip() for r in args.step_roles.split(",") if r.strip()]
    program = list(args.program)
    if program[:1] == ["--"]:
        program = program[1:]
    try:
        config = load_config(args.config, **overrides)
        if config is None:
            raise ConfigError("steps", None, "give --config FILE, --steps or PROFCTX_STEPS")
        if config.tool != "nsys":  # the command is for an nsys run, whatever the file's default tool
            config = config.replace(tool="nsys")
        count = nsys.capture_ranges(config, roles_per_step)
        if args.ray:
            print(json.dumps(nsys.ray_nsight(config, roles_per_step), indent=1))
        else:
            print(nsys.command_line(nsys.nsys_command(config, program, roles_per_step, args.output)))
    except (ConfigError, ValueError) as exc:
        print(f"profctx nsys-command: {exc}", file=sys.stderr)
        return USAGE
    print(f"# {count} capture range(s) per selected rank: {_describe(config)}", file=sys.stderr)
    return OK


def _describe(config: ProfilerConfig) -> str:
    window = config.steps
    steps = window.describe() if window is not None else "no steps"
    if config.mode == "step":
        return f"mode=step{' contiguous' if config.contiguous else ''}, steps {steps}"
    return f"mode=role, steps {steps}, roles {list(config.roles) or 'all'}"
