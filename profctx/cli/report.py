"""``profctx report DIR``: a self-contained HTML page of a run: timeline, phases, stragglers, top operators."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any

from ..analysis import summarize_records
from ..analysis._parallel import AUTO
from ..analysis._report import render
from ..manifest import drivers
from ..records._job import hole, of_records
from ..util._files import sweep
from ..util._fs import walk
from ._common import FINDINGS, OK, Progress, UsageError, add_filters, guarded, open_run, size, stream_run, terminable
from .analyse import jobs_option, left_out_note


def register(subparsers: Any) -> None:
    """Add the ``report`` subcommand."""
    parser = subparsers.add_parser(
        "report",
        help="write a self-contained HTML report of a run",
        description="Write one HTML file (no network needed to view it): a timeline of every capture on a time "
                    "axis (one row per process), phase shares per step, a processes x roles heat map with "
                    "stragglers marked, top operators per role, and per capture its files, errors and top "
                    "operations. Traces are streamed. Exit code 1 when a capture failed.",
    )
    parser.add_argument("dir", metavar="DIR", help="the save_path of the run")
    parser.add_argument("-o", "--output", metavar="FILE", help="output file (default DIR/report.html)")
    parser.add_argument("--ops", type=int, default=10, metavar="N",
                        help="operations listed per capture and role (default 10; 0 reads no trace, for speed)")
    parser.add_argument("--straggler-ratio", type=float, default=1.2, metavar="R",
                        help="name a straggler when max/median over processes exceeds R (default 1.2)")
    parser.add_argument("--jobs", type=jobs_option, metavar="N",
                        help="processes reading traces (default: one per CPU when there are enough traces to gain)")
    parser.add_argument("--progress", action=argparse.BooleanOptionalAction, default=None,
                        help="show a progress bar while traces are read (default: when stderr is a terminal)")
    add_filters(parser, run_default="latest")
    parser.set_defaults(func=guarded(run))


def run(args: argparse.Namespace) -> int:
    """Write the report of ``args.dir``; return 1 when a reported capture failed."""
    if args.ops < 0:
        raise UsageError(f"--ops {args.ops}: must be 0 or more")
    if args.straggler_ratio <= 1:
        raise UsageError(f"--straggler-ratio {args.straggler_ratio}: must be greater than 1")
    latest = args.run == "latest"
    if args.run == "all":
        args.run = None
    profiled = open_run(args.dir, args)
    records = profiled.records
    # Filtered by group, the records alone cannot tell the driver: look at the whole run.
    driver = drivers(stream_run(args.dir, run=args.run, lean=True)[2]) if args.group else None
    show = sys.stderr.isatty() if args.progress is None else args.progress
    bar = Progress(sys.stderr, "reading traces", show)
    try:
        readable = records if args.ops else []
        summary = summarize_records(profiled.path, readable, run=args.run, top=max(args.ops, 1),
                                    straggler_ratio=args.straggler_ratio, progress=bar.update, driver=driver,
                                    jobs=args.jobs or AUTO)
    finally:
        bar.close()
    # Filtered by rank or group, the records lack the others by request: nothing to say then.
    lacking = None if args.rank or args.group else hole([m.name() for m in of_records(records)], "capture record")
    summary.problems[:0] = [*profiled.repeats, *([lacking] if lacking else [])]
    page = render(summary, records, damaged=profiled.damaged, driver=driver)
    output = Path(args.output) if args.output else profiled.path / "report.html"
    try:  # the run folder (or the user's --output folder) held: the page is written by descriptor
        with walk(output.parent) as folder, terminable():
            sweep(folder)
            folder.write(output.name, page.encode("utf-8"))
    except OSError as exc:
        raise UsageError(f"cannot write {output}: {exc.strerror or exc}") from None
    failed = sum(1 for r in records if r.status == "failed")
    print(f"wrote {output} ({size(output.stat().st_size)}): {len(records)} captures"
          + (f", {failed} failed" if failed else ""))
    for line in profiled.repeats:
        print(line, file=sys.stderr)
    if lacking:
        print(lacking)
    note = left_out_note(args.dir, records[0].run if records else None) if latest else None
    if note:
        print(note)
    return FINDINGS if failed else OK
