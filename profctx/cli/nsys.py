"""``profctx nsys-command``: the ``nsys profile`` line, or the Ray ``nsight`` options per worker group."""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from typing import Any

from ..backends import nsys
from ..core._config import ProfilerConfig, load_config
from ..core._vocab import MODES, assert_never
from ..util._errors import ConfigError

OK = 0
USAGE = 2


def register(subparsers: Any) -> None:
    """Add the ``nsys-command`` subcommand."""
    parser = subparsers.add_parser(
        "nsys-command",
        help="print the nsys command line (or, per worker group, Ray nsight options) matching a profctx config",
        description="Print the 'nsys profile' command whose --capture-range-end=repeat:N matches the number of "
                    "capture ranges a selected rank opens under the config (mode, window, contiguous, roles); "
                    "with on-demand or anomaly captures, which no config can count, repeat without N. "
                    "With --ray, print one entry per worker group (and the driver): the ranks the config selects "
                    "there, their range count and the runtime_env['nsight'] options. The config comes from "
                    "--config (YAML), the options below and PROFCTX_* variables; tool='nsys' is assumed. "
                    "No GPU is needed to run this.",
    )
    parser.add_argument("--config", metavar="FILE", help="a profctx YAML config file")
    parser.add_argument("--steps", help="the step window, e.g. '3:6' or '1,2,5'")
    parser.add_argument("--mode", choices=MODES, help="one capture per step, or per role")
    parser.add_argument("--contiguous", action="store_true", default=None,
                        help="consecutive steps share one capture (mode=step)")
    parser.add_argument("--roles", help="role filter, comma-separated fnmatch patterns")
    parser.add_argument("--ranks", action="append", metavar="[GROUP=]RANKS",
                        help="ranks to profile, e.g. '0,1' or 'all'; GROUP=RANKS (repeatable) sets one worker "
                             "group's ranks, e.g. --ranks actor=0,1 --ranks rollout=all")
    parser.add_argument("--group", action="append", metavar="NAME",
                        help="--ray: also list this worker group (repeatable); groups of the config are listed anyway")
    parser.add_argument("--save-path", help="where profctx files go; the report defaults to SAVE_PATH/nsys/")
    per_step = parser.add_mutually_exclusive_group()
    per_step.add_argument("--roles-per-step", action="append", metavar="[GROUP=]K",
                          help="mode=role: how many matching roles open a capture in each step; GROUP=K "
                               "(repeatable) for one worker group ('driver' for the driver, '*' for any other)")
    per_step.add_argument("--step-roles", action="append", metavar="[GROUP=]PATHS",
                          help="mode=role: the role paths one step enters, comma-separated "
                               "(e.g. 'rollout,train,train/actor_update'); profctx counts those that open a capture. "
                               "GROUP=PATHS (repeatable): the roles a worker of that group enters per step")
    parser.add_argument("--output", help="nsys --output (default SAVE_PATH/nsys/%%h_%%p)")
    parser.add_argument("--ray", action="store_true",
                        help="print, per worker group and for the driver, the ranks, range count and "
                             "runtime_env['nsight'] options, as JSON")
    parser.add_argument("program", nargs=argparse.REMAINDER, help="-- then the program and its arguments")
    parser.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    """Print the command or the per-group Ray options; return 2 on a config that cannot be used."""
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
    program = list(args.program)
    if program[:1] == ["--"]:
        program = program[1:]
    try:
        plain_ranks, group_ranks = _split("ranks", args.ranks or [])
        if plain_ranks is not None:
            overrides["ranks"] = _ranks(plain_ranks)
        roles_per_step = _roles_per_step(args)
        config = load_config(args.config, **overrides)
        if config is None:
            raise ConfigError("steps", None, "give --config FILE, --steps or PROFCTX_STEPS")
        if config.tool != "nsys":  # the command is for an nsys run, whatever the file's default tool
            config = config.replace(tool="nsys")
        if group_ranks:
            groups: dict[str, dict[str, Any]] = {name: {"ranks": g.ranks, "contents": g.contents}
                                                 for name, g in config.groups.items()}
            for name, value in group_ranks.items():
                groups.setdefault(name, {})["ranks"] = _ranks(value)
            config = config.replace(groups=groups)
        if args.ray:
            rows = nsys.group_ranges(config, roles_per_step, args.group or ())
            entries = _ray_rows(config, rows, program, roles_per_step, args.output)
            out = "{\n" + ",\n".join(f" {json.dumps(k)}: {json.dumps(v)}" for k, v in entries.items()) + "\n}"
            notes = [f"{row.group}: {_describe_row(row)}" for row in rows] + [_describe(config)]
        else:
            out = nsys.command_line(nsys.nsys_command(config, program, roles_per_step, args.output))
            if nsys.open_ended(config):
                notes = ["on-demand or anomaly captures open ranges no config can count: nsys repeats without "
                         f"a limit and writes its reports at exit: {_describe(config)}"]
            else:
                count = nsys.capture_ranges(config, roles_per_step)
                notes = [f"{count} capture range(s) per selected rank: {_describe(config)}"]
    except (ConfigError, ValueError) as exc:
        print(f"profctx nsys-command: {exc}", file=sys.stderr)
        return USAGE
    print(out)
    for note in notes:
        print(f"# {note}", file=sys.stderr)
    return OK


def _ray_rows(config: ProfilerConfig, rows: Sequence[nsys.GroupRanges], program: Sequence[str],
              roles_per_step: nsys.RolesPerStep, output: str | None) -> dict[str, Any]:
    """Return the JSON of ``--ray``: per row the selected ranks, the range count and the options."""
    out: dict[str, Any] = {}
    for row in rows:
        entry: dict[str, Any] = {"ranks": row.ranks if row.ranks == "all" else list(row.ranks),
                                 "capture_ranges": row.ranges}
        if row.group == nsys.DRIVER:
            # The driver is the process the user launches: it runs under the nsys command itself.
            entry["command"] = (nsys.command_line(nsys.nsys_command(config, program, roles_per_step, output))
                                if row.options is not None else None)
        else:
            entry["nsight"] = row.nsight()
        out[row.group] = entry
    return out


def _describe_row(row: nsys.GroupRanges) -> str:
    if row.options is None:
        return "no capture range (not profiled): run it without nsys"
    ranks = "all ranks" if row.ranks == "all" else f"ranks {list(row.ranks)}"
    if row.options.get("capture-range-end") == "repeat":
        return f"{ranks}, {row.ranges} capture range(s) each from the window, and any on-demand or anomaly capture"
    return f"{ranks}, {row.ranges} capture range(s) each"


def _split(option: str, values: Sequence[str]) -> tuple[str | None, dict[str, str]]:
    """Split repeated ``[GROUP=]VALUE`` options into the plain value (at most one) and the per-group ones."""
    plain: str | None = None
    per_group: dict[str, str] = {}
    for value in values:
        name, sep, rest = value.partition("=")
        if sep:
            if not name.strip():
                raise ConfigError(option, value, "GROUP=VALUE with a group name before '='")
            per_group[name.strip()] = rest
        elif plain is not None:
            raise ConfigError(option, value, f"one plain --{option.replace('_', '-')} (more with GROUP=VALUE)")
        else:
            plain = value
    return plain, per_group


def _ranks(value: str) -> str | list[int]:
    text = value.strip()
    if text == "all":
        return "all"
    try:
        return [int(r) for r in text.split(",") if r.strip()]
    except ValueError:
        raise ConfigError("ranks", value, "'all' or comma-separated integers such as '0,1'") from None


def _roles_per_step(args: argparse.Namespace) -> nsys.RolesPerStep:
    """Return the roles per step the options give: a count, role paths, or a mapping of group to either."""
    if args.roles_per_step:
        option, values = "roles_per_step", args.roles_per_step
    elif args.step_roles:
        option, values = "step_roles", args.step_roles
    else:
        return None
    plain, entries = _split(option, values)
    if plain is not None:
        entries["*"] = plain
    given: dict[str, int | list[str]] = {}
    for name, value in entries.items():
        if option == "step_roles":
            given[name] = [r.strip() for r in value.split(",") if r.strip()]
            continue
        try:
            given[name] = int(value)
        except ValueError:
            raise ConfigError("roles_per_step", value, "a count such as 2") from None
    if list(given) == ["*"]:
        return given["*"]
    return _mapping(given)


def _mapping(values: Mapping[str, Any]) -> dict[str, Any]:
    """A plain value with per-group ones applies to the driver and every group not named."""
    out = dict(values)
    if "*" in out:
        out.setdefault(nsys.DRIVER, out["*"])
    return out


def _describe(config: ProfilerConfig) -> str:
    window = config.steps
    steps = window.describe() if window is not None else "no steps"
    mode = config.mode
    if mode == "step":
        return f"mode=step{' contiguous' if config.contiguous else ''}, steps {steps}"
    elif mode == "role":
        return f"mode=role, steps {steps}, roles {list(config.roles) or 'all'}"
    else:
        assert_never(mode)
