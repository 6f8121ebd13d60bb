"""``profctx merge DIR --step S``: one Chrome/Perfetto trace of every rank, role and engine of a step."""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any, TextIO

from .._merge import merge, plan
from ._common import FINDINGS, OK, Style, UsageError, guarded, open_run, size


def register(subparsers: Any) -> None:
    """Add the ``merge`` subcommand."""
    parser = subparsers.add_parser(
        "merge",
        help="merge every trace of one step into one Chrome/Perfetto trace",
        description="Merge the traces of every rank, role and engine replica that cover step S into one "
                    "Chrome trace (open it in https://ui.perfetto.dev or chrome://tracing). Each capture "
                    "becomes a labelled process; clocks are aligned to wall-clock time. Inputs are streamed: "
                    "memory stays near one read buffer. Exit code 1 when an input was missing or damaged.",
    )
    parser.add_argument("dir", metavar="DIR", help="the save_path of the run")
    parser.add_argument("--step", type=int, required=True, metavar="S", help="the global step to merge")
    parser.add_argument("-o", "--output", metavar="FILE",
                        help="output file, .json.gz (default) or .json; default DIR/stepSSSSSS/merged.trace.json.gz")
    parser.add_argument("--compress-level", type=int, default=1, choices=range(1, 10), metavar="1-9",
                        help="gzip level of a .gz output (default 1: fastest, about 4%% larger than 3)")
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                        help="show a progress bar (default: when stderr is a terminal)")
    parser.set_defaults(func=guarded(run))


def run(args: argparse.Namespace) -> int:
    """Merge step ``args.step`` of ``args.dir``; return 1 when an input was missing or damaged."""
    profiled = open_run(args.dir)
    inputs, notes = plan(profiled.path, profiled.records, args.step)
    if not inputs:
        steps = sorted({s for r in profiled.records for s in (r.get("steps") or [])})
        known = ", ".join(str(s) for s in steps[:20]) + (" ..." if len(steps) > 20 else "")
        raise UsageError(f"no trace files for step {args.step} in {args.dir} (steps with captures: {known or 'none'})")
    output = Path(args.output) if args.output else profiled.path / f"step{args.step:06d}" / "merged.trace.json.gz"
    if not output.name.endswith((".json", ".json.gz")):
        raise UsageError(f"--output {output}: the name must end in .json.gz or .json")
    show = sys.stderr.isatty() if args.progress is None else args.progress
    bar = Progress(sys.stderr) if show else None
    started = time.perf_counter()
    result = merge(inputs, output, step=args.step, compress_level=args.compress_level,
                   progress=bar.update if bar else None)
    if bar:
        bar.close()
    style = Style(sys.stdout)
    elapsed = time.perf_counter() - started
    print(f"wrote {output} ({size(output.stat().st_size)}): {result.inputs} traces, {result.processes} processes, "
          f"{result.events} events in {elapsed:.1f} s")
    for note in notes:
        print(style(f"note: {note}", "dim"))
    for path in result.approximate:
        print(style(f"note: {path} has no clock base; aligned its first event to the capture's start time", "yellow"))
    for problem in result.problems:
        print(style(f"problem: {problem}", "red"), file=sys.stderr)
    return FINDINGS if result.problems else OK


class Progress:
    """A one-line progress bar on a terminal stream, redrawn at most ten times a second."""

    def __init__(self, stream: TextIO, width: int = 30) -> None:
        self.stream = stream
        self.width = width
        self._last = 0.0

    def update(self, done: int, total: int) -> None:
        """Redraw for ``done`` of ``total`` bytes."""
        now = time.monotonic()
        if now - self._last < 0.1 and done < total:
            return
        self._last = now
        fraction = done / total if total else 1.0
        filled = int(self.width * fraction)
        bar = "#" * filled + "-" * (self.width - filled)
        self.stream.write(f"\rmerging [{bar}] {fraction:4.0%} {size(done)} of {size(total)}")
        self.stream.flush()

    def close(self) -> None:
        """End the bar's line."""
        self.stream.write("\n")
        self.stream.flush()
