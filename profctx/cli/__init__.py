"""The ``profctx`` command line. Each subcommand lives in its own module with ``register(subparsers)``.

Exit codes: 0 success, 1 findings or failures, 2 usage errors.
"""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

#: Subcommand -> module defining ``register(subparsers)``; imported when the CLI starts.
COMMANDS: dict[str, str] = {
    "demo": "profctx.cli.demo",
    "ls": "profctx.cli.ls",
    "merge": "profctx.cli.merge",
    "report": "profctx.cli.report",
    "summary": "profctx.cli.analyse",
    "diff": "profctx.cli.analyse",
    "check": "profctx.cli.analyse",
    "doctor": "profctx.cli.doctor",
    "nsys-command": "profctx.cli.nsys",
    "verl-convert": "profctx.cli.verl_convert",
    "trigger": "profctx.cli.trigger",
    "timeline": "profctx.cli.timeline",
}


def build_parser(command: str | None = None) -> argparse.ArgumentParser:
    """Return the argument parser with every available subcommand, or only the module of ``command`` when known.

    A command line that names its subcommand first needs only that module: the others (and
    what they import) are left unimported, which ``profctx ls`` of a large run notices.
    """
    parser = argparse.ArgumentParser(prog="profctx", description="Step- and role-aware profiling for RL training.")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND")
    modules = [COMMANDS[command]] if command in COMMANDS else COMMANDS.values()
    for module_name in dict.fromkeys(modules):  # one module may define several subcommands
        try:
            module = importlib.import_module(module_name)
        except ImportError:  # a subcommand whose module is absent in this build
            continue
        module.register(subparsers)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; return the exit code."""
    given = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser(given[0] if given else None)
    args = parser.parse_args(given)
    func = getattr(args, "func", None)
    if func is None:
        parser.print_help(sys.stderr)
        return 2
    code: int = func(args)
    return code
