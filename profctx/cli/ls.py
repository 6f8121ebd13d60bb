"""``profctx ls DIR``: a table of the captures of a run, from its manifest."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ..manifest import CaptureRecord
from ._common import (
    FINDINGS,
    OK,
    Style,
    add_filters,
    guarded,
    open_run,
    seconds,
    size,
    source_text,
    steps_text,
    table,
    who_text,
)


def register(subparsers: Any) -> None:
    """Add the ``ls`` subcommand."""
    parser = subparsers.add_parser(
        "ls",
        help="list the captures of a profiled run",
        description="List every capture recorded in DIR's manifest: step(s), role, rank, backend or engine, "
                    "status, files, size, duration. Skipped and failed captures show their reason. "
                    "Exit code 1 when a listed capture failed.",
    )
    parser.add_argument("dir", metavar="DIR", help="the save_path of the run")
    add_filters(parser)
    parser.add_argument("--json", action="store_true", help="print the capture records as a JSON array")
    parser.set_defaults(func=guarded(run))


def run(args: argparse.Namespace) -> int:
    """List the captures of ``args.dir``; return 1 when any listed capture failed."""
    profiled = open_run(args.dir, args)
    records = profiled.records
    for where in profiled.damaged:
        print(f"profctx ls: skipped an unreadable manifest line ({where}), likely cut by a crash", file=sys.stderr)
    failed = any(r.status == "failed" for r in records)
    if args.json:
        json.dump([r.as_dict() for r in records], sys.stdout, indent=1, default=str)
        sys.stdout.write("\n")
        return FINDINGS if failed else OK
    if not records:
        print("no captures match the filters" if _filtered(args) else "no captures recorded")
        return OK
    style = Style(sys.stdout)
    runs = profiled.runs
    headers = ["STEP", "ROLE", "RANK", "SOURCE", "STATUS", "FILES", "SIZE", "DURATION", "NOTE"]
    if len(runs) > 1:
        headers.insert(0, "RUN")
    rows = []
    for record in records:
        row = [
            steps_text(record),
            record.role or "step",
            who_text(record),
            source_text(record),
            record.status,
            str(len(record.files)),
            size(record.bytes) if record.files else "-",
            seconds(record.duration_s),
            note(record),
        ]
        if len(runs) > 1:
            row.insert(0, str(record.run))
        rows.append(row)
    status_col = headers.index("STATUS")
    right = {headers.index(h) for h in ("STEP", "RANK", "FILES", "SIZE", "DURATION")}

    def paint(column: int, cell: str) -> str:
        return style.status(cell.strip()) + cell[len(cell.strip()):] if column == status_col else cell

    print(table(headers, rows, right=right, paint=paint))
    counts: dict[str, int] = {}
    for record in records:
        counts[record.status] = counts.get(record.status, 0) + 1
    files = sum(len(r.files) for r in records)
    total = sum(r.bytes or 0 for r in records)
    summary = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
    print(style(f"{len(records)} captures ({summary}), {files} files, {size(total)}", "dim"))
    return FINDINGS if failed else OK


def _filtered(args: argparse.Namespace) -> bool:
    return any(getattr(args, name, None) for name in ("run", "step", "role", "rank", "group", "status"))


def note(record: CaptureRecord) -> str:
    """Return why a capture is not plainly ok: its reason, error, or notes."""
    status = record.status
    if status == "skipped":
        return record.reason or "skipped"
    if status == "failed":
        return record.error or "failed"
    if status == "open":
        return "started, never finished (still running, or the process died)"
    if status == "interrupted":
        return record.error or record.reason or "interrupted (the process was stopped during the capture)"
    return "; ".join(record.notes)
