"""``profctx timeline DIR``: every step's wall time and its top-level roles', anomalies and stragglers marked."""

from __future__ import annotations

import argparse
import statistics
import sys
from collections.abc import Iterable, Iterator
from pathlib import Path
from typing import Any

from ..analysis._timeline import (
    ANOMALY_FACTOR,
    ANOMALY_WINDOW,
    MIN_HISTORY,
    STRAGGLER_RATIO,
    Rules,
    StepRow,
    Timelines,
    dump_json,
    files,
    flags,
    iter_rows,
    read,
)
from ..records._job import Member, hole, missing
from ._common import FINDINGS, OK, Style, UsageError, guarded, shard_members, table
from .analyse import seconds

#: Roles shown as columns at most; the others are summed in one column.
MAX_ROLE_COLUMNS = 6


def register(subparsers: Any) -> None:
    """Add the ``timeline`` subcommand."""
    parser = subparsers.add_parser(
        "timeline",
        help="every step's wall time and its roles', anomalies and stragglers marked (no profiler needed)",
        description="Read the step timelines every process writes beside the manifest (timeline=True, the "
                    "default) and print one row per step: its time (median over processes), the slowest process "
                    "and its time, each top-level role's time (median over processes), and the marks. A step is "
                    "an ANOMALY when its time exceeds --factor times the median of the --window steps before it "
                    f"(at least {MIN_HISTORY}). The processes are lined up on one clock: the STRAGGLER of a step is "
                    "the process the others waited for, named with the segment (a role, or the time before the "
                    "step) where its lag accrued, when its work there exceeds --straggler-ratio times the median "
                    "of the other processes' (waiting is not work); lags under --min-ms (10 ms at least) or a "
                    "tenth of the step are never marked. "
                    "--json prints the versioned 'profctx.timeline' document. Exit code 1 when the folder holds "
                    "no timeline.",
    )
    parser.add_argument("dir", metavar="DIR", help="the save_path of the run")
    parser.add_argument("--run", default="latest", metavar="ID", help="run id, 'latest' (default) or 'all'")
    parser.add_argument("--steps", type=_span, metavar="A-B", help="only steps A to B (inclusive; 'A-' or '-B' open)")
    parser.add_argument("--rows", type=int, default=60, metavar="N",
                        help="at most N rows: more steps are shown in bins of consecutive steps, the marked steps "
                             "listed after the table (default 60; 0: every step)")
    parser.add_argument("--factor", type=float, default=ANOMALY_FACTOR, metavar="F",
                        help="anomaly: a step over F times the median of the previous steps (default "
                             f"{ANOMALY_FACTOR:g})")
    parser.add_argument("--window", type=int, default=ANOMALY_WINDOW, metavar="N",
                        help=f"anomaly: how many previous steps the median is taken over (default {ANOMALY_WINDOW})")
    parser.add_argument("--straggler-ratio", type=float, default=STRAGGLER_RATIO, metavar="R",
                        help="straggler: a process whose work in a segment is over R times the median of the other "
                             "processes' (default "
                             f"{STRAGGLER_RATIO:g})")
    parser.add_argument("--min-ms", type=float, default=1.0, metavar="MS",
                        help="never mark a difference under MS milliseconds (default 1)")
    parser.add_argument("--json", action="store_true", help="print the JSON document instead of the table")
    parser.set_defaults(func=guarded(run))


def _span(text: str) -> tuple[int | None, int | None]:
    """Parse ``--steps``: ``A-B``, ``A-``, ``-B`` or ``A``."""
    first, dash, last = text.partition("-")
    try:
        a = int(first) if first.strip() else None
        b = (int(last) if last.strip() else None) if dash else a
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: steps as A-B, A-, -B or A (integers)") from None
    if a is not None and b is not None and b < a:
        raise argparse.ArgumentTypeError(f"{text!r}: the last step is before the first")
    return a, b


def run(args: argparse.Namespace) -> int:
    """Print the timeline of ``args.dir``; return 1 when it holds none."""
    folder = Path(args.dir).expanduser()
    if not folder.is_dir():
        raise UsageError(f"{args.dir}: no such folder" if not folder.exists() else f"{args.dir}: not a folder")
    if args.factor <= 1 or args.straggler_ratio <= 1:
        raise UsageError("--factor and --straggler-ratio must be greater than 1")
    if args.window < 1 or args.rows < 0 or args.min_ms < 0:
        raise UsageError("--window must be 1 or more, --rows and --min-ms 0 or more")
    if not files(folder):
        print(f"profctx timeline: {args.dir}: no step timeline here (each process configured with this save_path "
              "writes .profctx/*.timeline once it has marked steps, unless timeline=False)", file=sys.stderr)
        return FINDINGS
    timelines = read(folder, None if args.run == "all" else args.run)
    if not timelines.processes:
        known = ", ".join(timelines.runs) or "none readable"
        print(f"profctx timeline: {args.dir}: no timeline of run {args.run} (runs: {known})", file=sys.stderr)
        return FINDINGS
    rules = Rules(args.factor, args.window, min(MIN_HISTORY, args.window), args.straggler_ratio, args.min_ms / 1000)
    found = _Rows(timelines, rules, args.steps)  # the marks come from the whole run, whatever --steps shows
    # Every process writes a timeline, selected or not: each rank of W is expected, of the processes
    # whose timelines are here and of those whose capture shards are (collected from other hosts).
    shown_run = timelines.processes[0].run
    lacks = [m.name("timeline") for m in missing(
        (Member(p.run, p.group, p.rank, p.world_size) for p in timelines.processes if p.run == shown_run),
        others=shard_members(folder, shown_run))]
    if args.json:
        dump_json(timelines, found, rules, sys.stdout, {"missing": lacks})  # the steps one at a time
        sys.stdout.write("\n")
        return OK
    print(render(timelines.processes[0].run, [p.name for p in timelines.processes], found, args.rows,
                 Style(sys.stdout), dropped=sum(p.dropped for p in timelines.processes)))
    line = hole(lacks, "timeline")
    if line:
        print(line)
    for problem in timelines.damaged[:10]:
        print(f"unreadable: {problem}", file=sys.stderr)
    if len(timelines.damaged) > 10:
        print(f"unreadable: {len(timelines.damaged) - 10} more", file=sys.stderr)
    if timelines.truncated:
        print("note: the timelines are larger than this command reads at once; later steps are left out",
              file=sys.stderr)
    if len(timelines.runs) > 1 and args.run == "latest":
        print(f"note: {len(timelines.runs) - 1} other run(s) in this folder left out (--run all, or --run ID)")
    return OK


def render(run_id: str, processes: list[str], found: Iterable[StepRow], max_rows: int, style: Style,
           dropped: int = 0) -> str:
    """Return the timeline as a table: a row per step (or per bin of steps), then the marked steps.

    ``found`` is walked twice (a list, or rows made afresh each time: then no more than a bin's rows are held).
    """
    count, first, last, anomalous, straggling, flagged = 0, 0, 0, 0, 0, 0
    totals: dict[str, float] = {}
    segments: set[str] = set()
    marked: list[list[str]] = []  # the first 40 marked steps' cells
    for row in found:
        first, last = (row.step if count == 0 else first), row.step
        count += 1
        for name, spent in row.roles.items():
            totals[name] = totals.get(name, 0.0) + spent
        anomalous += row.anomaly is not None
        straggling += bool(row.stragglers)
        flagged += row.anomaly is not None or bool(row.stragglers)
        if row.stragglers and row.stragglers[0].segment is not None:
            segments.add(row.stragglers[0].segment)
        if (row.anomaly is not None or row.stragglers) and len(marked) < 40:
            marked.append([str(row.step), seconds(row.time_s), seconds(row.max_s), row.slowest, flags(row)])
    if not count:
        return f"run {run_id}: no step in the range asked for"
    roles = sorted(totals, key=lambda n: (-totals[n], n))
    shown, rest = roles[:MAX_ROLE_COLUMNS], roles[MAX_ROLE_COLUMNS:]
    shown_names = ", ".join(processes[:8]) + (f" and {len(processes) - 8} more" if len(processes) > 8 else "")
    head = (f"run {run_id}: {count} steps ({first}-{last}), {len(processes)} process"
            f"{'es' if len(processes) != 1 else ''} ({shown_names}); "
            f"{anomalous} anomalous, "
            f"{straggling} with stragglers")
    out = [style(head, "bold")]
    headers = ["STEP", "TIME", "MAX", "SLOWEST", *shown, *(["(other roles)"] if rest else []), "MARKS"]
    binned = bool(max_rows and count > max_rows)
    size = -(-count // max_rows) if binned else 1
    lines = []
    group: list[StepRow] = []
    for row in found:
        if size > 1:
            row.alignment = None  # a bin's cells do not read it
        group.append(row)
        if len(group) == size:
            lines.append(_cells(group, shown, rest))
            group = []
    if group:
        lines.append(_cells(group, shown, rest))
    out.append(table(headers, lines, right=set(range(1, len(headers) - 1)) - {3}))
    if segments & set(shown) and not binned:
        out[0] += style(" (a role cell marked ! is the straggler's own time there; other cells are medians)", "dim")
    if binned:
        out.append(f"(bins of {size} steps: TIME is the median of the bin's steps, MAX the slowest process in the "
                   "bin, roles the median; --rows 0 shows every step, --steps A-B a range)")
    if binned and marked:
        out += ["", style("Marked steps", "bold")]
        out.append(table(["STEP", "TIME", "MAX", "SLOWEST", "MARKS"], marked, right={1, 2}))
        if flagged > 40:
            out.append(f"... and {flagged - 40} more marked steps (--json lists them all)")
    if dropped:
        out.append(style(f"{dropped} step(s) not recorded: a process's writer fell behind or could not write",
                         "yellow"))
    return "\n".join(out)


class _Rows:
    """The rows of a run, made afresh each time they are walked (the marks from the whole run), those of
    ``span`` yielded."""

    def __init__(self, timelines: Timelines, rules: Rules, span: tuple[int | None, int | None] | None) -> None:
        self.timelines, self.rules, self.span = timelines, rules, span

    def __iter__(self) -> Iterator[StepRow]:
        a, b = self.span if self.span is not None else (None, None)
        for row in iter_rows(self.timelines, self.rules):
            if (a is None or row.step >= a) and (b is None or row.step <= b):
                yield row


def _cells(group: list[StepRow], shown: list[str], rest: list[str]) -> list[str]:
    if len(group) == 1:
        row = group[0]
        label = str(row.step)
        time_s, max_s, slowest = row.time_s, row.max_s, row.slowest
        role_times = row.roles
        marks = flags(row)
    else:
        label = f"{group[0].step}-{group[-1].step}"
        time_s = statistics.median(r.time_s for r in group)
        worst = max(group, key=lambda r: r.max_s)
        max_s, slowest = worst.max_s, f"{worst.slowest} @{worst.step}"
        names = {n for r in group for n in r.roles}
        role_times = {n: statistics.median(r.roles.get(n, 0.0) for r in group) for n in names}
        anomalous = sum(1 for r in group if r.anomaly is not None)
        straggling = sum(1 for r in group if r.stragglers)
        marks = "; ".join(x for x in (f"{anomalous} anomalous" if anomalous else "",
                                      f"{straggling} with stragglers" if straggling else "") if x)
    cells = [label, seconds(time_s), seconds(max_s), slowest]
    cells += [seconds(role_times[n]) if n in role_times else "-" for n in shown]
    lagged = group[0].stragglers[0] if len(group) == 1 and group[0].stragglers else None
    if lagged is not None and lagged.segment in shown:  # the straggler's own time, not the median that hides it
        own = group[0].alignment.processes[lagged.process] if group[0].alignment is not None else []
        spent = sum(s.time_s for s in own if s.name == lagged.segment)
        cells[4 + shown.index(lagged.segment)] = f"{seconds(spent)} !"
    if rest:
        other = sum(role_times.get(n, 0.0) for n in rest)
        cells.append(seconds(other) if other else "-")
    cells.append(marks)
    return cells
