"""``profctx ls DIR``: a table of the captures of a run, from its manifest."""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from ._common import (
    FINDINGS,
    OK,
    Style,
    add_filters,
    guarded,
    open_run,
    seconds,
    select,
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
    profiled = open_run(args.dir)
    records = select(profiled.records, args)
    for where in profiled.damaged:
        print(f"profctx ls: skipped an unreadable manifest line ({where}), likely cut by a crash", file=sys.stderr)
    failed = any(r.get("status") == "failed" for r in records)
    if args.json:
        json.dump(records, sys.stdout, indent=1, default=str)
        sys.stdout.write("\n")
        return FINDINGS if failed else OK
    if not records:
        print("no captures" + (" match the filters" if profiled.records else " recorded"))
        return OK
    style = Style(sys.stdout)
    runs = sorted({str(r.get("run")) for r in records})
    headers = ["STEP", "ROLE", "RANK", "SOURCE", "STATUS", "FILES", "SIZE", "DURATION", "NOTE"]
    if len(runs) > 1:
        headers.insert(0, "RUN")
    rows = []
    for record in records:
        row = [
            steps_text(record),
            str(record.get("role") or "step"),
            who_text(record),
            source_text(record),
            str(record.get("status")),
            str(len(record.get("files") or [])),
            size(record.get("bytes")) if record.get("files") else "-",
            seconds(record.get("duration_s")),
            note(record),
        ]
        if len(runs) > 1:
            row.insert(0, str(record.get("run")))
        rows.append(row)
    status_col = headers.index("STATUS")
    right = {headers.index(h) for h in ("STEP", "RANK", "FILES", "SIZE", "DURATION")}

    def paint(column: int, cell: str) -> str:
        return style.status(cell.strip()) + cell[len(cell.strip()):] if column == status_col else cell

    print(table(headers, rows, right=right, paint=paint))
    counts: dict[str, int] = {}
    for record in records:
        counts[str(record.get("status"))] = counts.get(str(record.get("status")), 0) + 1
    files = sum(len(r.get("files") or []) for r in records)
    total = sum(int(r.get("bytes") or 0) for r in records)
    summary = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
    print(style(f"{len(records)} captures ({summary}), {files} files, {size(total)}", "dim"))
    return FINDINGS if failed else OK


def note(record: dict[str, Any]) -> str:
    """Return why a capture is not plainly ok: its reason, error, or notes."""
    status = record.get("status")
    if status == "skipped":
        return str(record.get("reason") or "skipped")
    if status == "failed":
        return str(record.get("error") or "failed")
    if status == "open":
        return "started, never finished (still running, or the process died)"
    notes = record.get("notes") or []
    return "; ".join(str(n) for n in notes)
