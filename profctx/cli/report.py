"""``profctx report DIR``: a self-contained HTML page of a run: timeline, captures, top operations."""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import Any

from .._layout import temporary
from .._report import render
from ._common import FINDINGS, OK, UsageError, add_filters, guarded, open_run, size


def register(subparsers: Any) -> None:
    """Add the ``report`` subcommand."""
    parser = subparsers.add_parser(
        "report",
        help="write a self-contained HTML report of a run",
        description="Write one HTML file (no network needed to view it) with a timeline of every capture "
                    "(steps x roles x ranks, skipped and failed marked) and, per capture, its files, errors "
                    "and top operations by self time read from its trace. Exit code 1 when a capture failed.",
    )
    parser.add_argument("dir", metavar="DIR", help="the save_path of the run")
    parser.add_argument("-o", "--output", metavar="FILE", help="output file (default DIR/report.html)")
    parser.add_argument("--ops", type=int, default=10, metavar="N",
                        help="operations listed per capture (default 10; 0 reads no trace, for speed)")
    parser.add_argument("--max-trace-mb", type=float, default=200.0, metavar="MB",
                        help="do not read traces larger than this on disk (default 200)")
    add_filters(parser)
    parser.set_defaults(func=guarded(run))


def run(args: argparse.Namespace) -> int:
    """Write the report of ``args.dir``; return 1 when a reported capture failed."""
    if args.ops < 0:
        raise UsageError(f"--ops {args.ops}: must be 0 or more")
    profiled = open_run(args.dir, args)
    records = [r.as_dict() for r in profiled.records]
    page = render(profiled.path, records, damaged=profiled.damaged, ops=args.ops,
                  max_trace_bytes=int(args.max_trace_mb * 1e6))
    output = Path(args.output) if args.output else profiled.path / "report.html"
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp = temporary(output)
    tmp.write_text(page, encoding="utf-8")
    os.replace(tmp, output)
    failed = sum(1 for r in records if r.get("status") == "failed")
    print(f"wrote {output} ({size(output.stat().st_size)}): {len(records)} captures"
          + (f", {failed} failed" if failed else ""))
    return FINDINGS if failed else OK
