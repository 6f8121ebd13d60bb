"""``profctx merge DIR``: one Chrome/Perfetto trace of every rank, role and engine of some steps of a run.

``--hta`` writes the same captures laid out as Holistic Trace Analysis loads a job instead: a
folder of one file per rank (:mod:`profctx.analysis._hta`). It is an option of ``merge``, not a command of
its own, because it is the same merge (the same choice of run, steps and groups, the same clock
alignment, streaming and damage reports) cut into one file per rank.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from ..analysis._hta import Layout, LayoutError, lay_out
from ..analysis._merge import merge, plan
from ..core._layout import safe
from ..manifest import DRIVER, drivers, in_groups
from ..util._fs import Folder, walk
from ._common import FINDINGS, OK, Progress, Style, UsageError, escape, guarded, open_run, size, terminable


def _merged_folder(run: Path) -> Folder:
    """Return ``run/merged``, held open, made without following a link planted where it belongs."""
    try:
        return walk(run, "merged")
    except OSError as exc:
        raise UsageError(f"cannot write into {run / 'merged'}: {exc.strerror or exc}") from None


def _output_folder(output: str) -> Folder:
    """Return the folder of the ``--output`` the user named, held open (created if missing)."""
    try:
        return walk(Path(output).parent)
    except OSError as exc:
        raise UsageError(f"--output {output}: cannot write into its folder: {exc.strerror or exc}") from None


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
                        help="output file, .json.gz (default) or .json; default DIR/merged/RUN-STEPS.trace.json.gz "
                             "(with --hta: a new folder, default DIR/merged/RUN-STEPS.hta)")
    parser.add_argument("--hta", action="store_true",
                        help="lay the traces out as Holistic Trace Analysis loads them: a folder with one file per "
                             "rank (a folder per worker group), each naming its rank and its steps (ProfilerStep#N); "
                             "load it with TraceAnalysis(trace_dir=FOLDER, include_last_profiler_step=True)")
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
    if args.hta:
        return _hta(args, profiled.path, profiled.runs, records, steps, driver)
    inputs, notes = plan(profiled.path, records, steps)
    if not inputs:
        known = sorted({s for r in records if r.files or r.is_engine for s in r.steps})
        listed = ", ".join(str(s) for s in known[:20]) + (" ..." if len(known) > 20 else "")
        what = f"step {', '.join(map(str, steps))}" if steps else "any step"
        raise UsageError(f"no trace files for {what} in {args.dir} (steps with captures: {listed or 'none'})")
    if args.output and not args.output.endswith((".json", ".json.gz")):
        raise UsageError(f"--output {args.output}: the name must end in .json.gz or .json")
    folder = _output_folder(args.output) if args.output else _merged_folder(profiled.path)
    output = Path(args.output) if args.output else folder.path / _default_name(profiled.runs, steps)
    show = sys.stderr.isatty() if args.progress is None else args.progress
    bar = Progress(sys.stderr, "merging", show)
    started = time.perf_counter()
    try:
        with folder, terminable():
            result = merge(inputs, output, steps=steps, compress_level=args.compress_level, progress=bar.update,
                           driver=driver, at=folder)
    finally:
        bar.close()
    style = Style(sys.stdout)
    elapsed = time.perf_counter() - started
    span = _steps_text(result.steps)
    print(f"wrote {output} ({size(output.stat().st_size)}): {span}, {result.inputs} traces, "
          f"{result.processes} processes, {result.events} events in {elapsed:.1f} s")
    for note in notes:
        print(style(f"note: {note}", "dim"))
    for line in profiled.repeats:  # records the manifest reader left out: their files are merged once
        print(style(f"note: {escape(line)}", "yellow"))
    for path in result.approximate:
        print(style(f"note: {path} has no clock base; aligned its first event to the capture's start time", "yellow"))
    for line in result.dropped:
        print(style(f"note: {line} (a damaged event; every other event kept)", "yellow"))
    for problem in result.problems:
        print(style(f"problem: {problem}", "red"), file=sys.stderr)
    return FINDINGS if result.problems else OK


def _hta(args: argparse.Namespace, save_path: Path, runs: list[str], records: list[Any], steps: list[int] | None,
         driver: set[tuple[str, ...]]) -> int:
    """Write the HTA layout of the chosen captures; return 1 when an input was missing or damaged."""
    if len(runs) > 1:
        raise UsageError(f"--hta lays out one job, and --run {args.run} selects {len(runs)} runs "
                         f"({', '.join(runs[:5])}): pick one with --run ID")
    folder = _output_folder(args.output) if args.output else _merged_folder(save_path)
    output = Path(args.output) if args.output else folder.path / _default_name(runs, steps).replace(
        ".trace.json.gz", ".hta")
    show = sys.stderr.isatty() if args.progress is None else args.progress
    bar = Progress(sys.stderr, "laying out", show)
    started = time.perf_counter()
    try:
        with folder, terminable():
            layout = lay_out(save_path, records, output, steps=steps, driver=driver,
                             compress_level=args.compress_level, progress=bar.update, at=folder)
    except LayoutError as exc:
        raise UsageError(f"--output {exc}") from None
    finally:
        bar.close()
    style = Style(sys.stdout)
    _hta_lines(layout, time.perf_counter() - started, style)
    for problem in layout.problems:
        print(style(f"problem: {problem}", "red"), file=sys.stderr)
    if not layout.folders:
        what = f"step {', '.join(map(str, steps))}" if steps else "any step"
        raise UsageError(f"no rank traces for {what} in {args.dir}: " + "; ".join(layout.notes or ["no captures"]))
    return FINDINGS if layout.problems else OK


def _hta_lines(layout: Layout, elapsed: float, style: Style) -> None:
    ranks = sum(len(f.ranks) for f in layout.folders)
    print(f"wrote {layout.root}: {_steps_text(layout.steps)}, {layout.inputs} traces as {ranks} rank file(s) "
          f"in {len(layout.folders)} folder(s), in {elapsed:.1f} s")
    for folder in layout.folders:
        numbers = ", ".join(str(r.rank) for r in folder.ranks)
        of = f" of {folder.world_size}" if folder.world_size else ""
        group = f"group {folder.group}: " if folder.group else ""
        noun = "rank" if len(folder.ranks) == 1 else "ranks"
        print(f"  {group}{noun} {numbers}{of}: TraceAnalysis(trace_dir={str(folder.path)!r}, "
              "include_last_profiler_step=True)")
    for note in layout.notes:
        print(style(f"note: {note}", "dim"))


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
