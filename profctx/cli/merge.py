"""``profctx merge DIR``: one Chrome/Perfetto trace of every rank, role and engine of some steps of a run."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from .._files import make_folders
from .._layout import safe
from .._merge import merge, plan
from ..manifest import DRIVER, drivers, in_groups
from ._common import FINDINGS, OK, Progress, Style, UsageError, guarded, open_run, size


def _merged_folder(run: Path) -> Path:
    """Return ``run/merged``, made without following a link planted where it belongs."""
    try:
        return make_folders(run, "merged")
    except OSError as exc:
        raise UsageError(f"cannot write into {run / 'merged'}: {exc.strerror or exc}") from None


def register(subparsers: Any) -> None:
    """Add the ``merge`` subcommand."""
    parser = subparsers.add_parser(
        "merge",
        help="merge the traces of some steps (or a whole run) into one Chrome/Perfetto trace",
        description="Merge the traces of every rank, role and engine replica covering the chosen steps of a run "
                    "into one Chrome trace (open it in https://ui.perfetto.dev or chrome://tracing). One process "
                    "per worker process or engine replica; a 'steps' process marks each step; clocks are aligned "
                    "to wall-clock time. Inputs are streamed: memory stays near one read buffer. Exit code 1 when "
                    "an input was missing or damaged (the events read before the damage are kept).",
    )
    parser.add_argument("dir", metavar="DIR", help="the save_path of the run")
    parser.add_argument("--step", type=int, action="append", metavar="S",
                        help="a global step to merge (repeatable); default every step of the run")
    parser.add_argument("--run", metavar="ID", default="latest",
                        help="the run to merge: an id, 'latest' (default: the run that started last) or 'all'")
    parser.add_argument("--group", action="append", metavar="NAME",
                        help="only processes of worker group NAME ('driver': those outside every group; repeatable)")
    parser.add_argument("-o", "--output", metavar="FILE",
                        help="output file, .json.gz (default) or .json; default DIR/merged/RUN-STEPS.trace.json.gz")
    parser.add_argument("--compress-level", type=int, default=1, choices=range(1, 10), metavar="1-9",
                        help="gzip level of a .gz output (default 1: fastest, about 4%% larger than 3)")
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                        help="show a progress bar (default: when stderr is a terminal)")
    parser.set_defaults(func=guarded(run))


def run(args: argparse.Namespace) -> int:
    """Merge the chosen steps of ``args.dir``; return 1 when an input was missing or damaged."""
    profiled = open_run(args.dir, run=None if args.run == "all" else args.run)
    steps = sorted(set(args.step)) if args.step else None
    records = profiled.records
    driver = drivers(records)
    if args.group:
        records = [r for r in records if in_groups(r, args.group)]
        if not records:
            groups = sorted({r.group or DRIVER for r in profiled.records})
            raise UsageError(f"--group {' '.join(args.group)}: no captures (groups: {', '.join(groups)})")
    inputs, notes = plan(profiled.path, records, steps)
    if not inputs:
        known = sorted({s for r in records if r.files or r.is_engine for s in r.steps})
        listed = ", ".join(str(s) for s in known[:20]) + (" ..." if len(known) > 20 else "")
        what = f"step {', '.join(map(str, steps))}" if steps else "any step"
        raise UsageError(f"no trace files for {what} in {args.dir} (steps with captures: {listed or 'none'})")
    output = Path(args.output) if args.output else _merged_folder(profiled.path) / _default_name(profiled.runs, steps)
    if not output.name.endswith((".json", ".json.gz")):
        raise UsageError(f"--output {output}: the name must end in .json.gz or .json")
    show = sys.stderr.isatty() if args.progress is None else args.progress
    bar = Progress(sys.stderr, "merging", show)
    started = time.perf_counter()
    try:
        result = merge(inputs, output, steps=steps, compress_level=args.compress_level, progress=bar.update,
                       driver=driver)
    finally:
        bar.close()
    style = Style(sys.stdout)
    elapsed = time.perf_counter() - started
    span = _steps_text(result.steps)
    print(f"wrote {output} ({size(output.stat().st_size)}): {span}, {result.inputs} traces, "
          f"{result.processes} processes, {result.events} events in {elapsed:.1f} s")
    for note in notes:
        print(style(f"note: {note}", "dim"))
    for path in result.approximate:
        print(style(f"note: {path} has no clock base; aligned its first event to the capture's start time", "yellow"))
    for line in result.dropped:
        print(style(f"note: {line} (a damaged event; every other event kept)", "yellow"))
    for problem in result.problems:
        print(style(f"problem: {problem}", "red"), file=sys.stderr)
    return FINDINGS if result.problems else OK


def _steps_text(steps: list[int]) -> str:
    if len(steps) == 1:
        return f"step {steps[0]}"
    return f"{len(steps)} steps ({steps[0]}-{steps[-1]})" if steps else "no step"


def _default_name(runs: list[str], steps: list[int] | None) -> str:
    run = safe(runs[0]) if len(runs) == 1 else "runs"
    if steps is None:
        part = "all"
    elif len(steps) == 1:
        part = f"step{steps[0]:06d}"
    else:
        part = f"steps{steps[0]:06d}-{steps[-1]:06d}"
    return f"{run}-{part}.trace.json.gz"
