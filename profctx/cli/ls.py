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
    seconds,
    size,
    source_text,
    steps_text,
    stream_run,
    table,
    who_text,
)

try:
    import orjson as _orjson

    def _encode(data: Any) -> bytes:
        return _orjson.dumps(data, default=str, option=_orjson.OPT_INDENT_2)
except ImportError:  # pragma: no cover - the cli extra is absent

    def _encode(data: Any) -> bytes:
        return json.dumps(data, default=str, indent=2).encode()


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
    _, reader, records = stream_run(args.dir, args)
    if args.json:
        return _json(records, reader.damaged)
    # Rows are built as records stream in and their cells interned, so a run of 100,000 captures
    # holds one small tuple per capture, not its record.
    cells: dict[str, str] = {}
    sizes: dict[int | None, str] = {}
    rows: list[tuple[float, int, tuple[str, ...]]] = []
    runs: set[str] = set()
    counts: dict[str, int] = {}
    files = total = 0
    failed = False
    for record in records:
        status = record.status
        failed = failed or status == "failed"
        counts[status] = counts.get(status, 0) + 1
        listed = record.file_count
        files += listed
        written = record.bytes
        total += written or 0
        run_id = str(record.run)
        runs.add(run_id)
        shown = sizes.get(written)
        if shown is None:
            shown = sizes[written] = size(written)
        row = (run_id, steps_text(record), record.role or "step", who_text(record), source_text(record), status,
               str(listed), shown if listed else "-", seconds(record.duration_s),
               note(record) if status != "ok" or record.notes else "")
        rank = record.rank
        rows.append((record.begin, -1 if rank is None else rank, tuple(map(cells.setdefault, row, row))))
    for where in reader.damaged:
        print(f"profctx ls: skipped an unreadable manifest line ({where}), likely cut by a crash", file=sys.stderr)
    if not rows:
        print("no captures match the filters" if _filtered(args) else "no captures recorded")
        return OK
    rows.sort(key=lambda item: (item[0], item[1]))
    style = Style(sys.stdout)
    headers = ["RUN", "STEP", "ROLE", "RANK", "SOURCE", "STATUS", "FILES", "SIZE", "DURATION", "NOTE"]
    first = 0 if len(runs) > 1 else 1
    status_col = headers.index("STATUS") - first
    right = {headers.index(h) - first for h in ("STEP", "RANK", "FILES", "SIZE", "DURATION")}

    def paint(column: int, cell: str) -> str:
        return style.status(cell.strip()) + cell[len(cell.strip()):] if column == status_col else cell

    print(table(headers[first:], [row[first:] for _, _, row in rows], right=right,
                paint=paint if style.enabled else None))
    summary = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
    print(style(f"{len(rows)} captures ({summary}), {files} files, {size(total)}", "dim"))
    return FINDINGS if failed else OK


def _json(records: Any, damaged: list[str]) -> int:
    encoded: list[tuple[float, int, bytes]] = []
    failed = False
    for record in records:
        failed = failed or record.status == "failed"
        data = record.as_dict()
        try:
            text = _encode(data)
        except TypeError:  # a value orjson refuses (an integer beyond 64 bits): the standard library takes it
            text = json.dumps(data, default=str, indent=2).encode()
        rank = record.rank
        encoded.append((record.begin, -1 if rank is None else rank, text))
    for where in damaged:
        print(f"profctx ls: skipped an unreadable manifest line ({where}), likely cut by a crash", file=sys.stderr)
    encoded.sort(key=lambda item: (item[0], item[1]))
    out = sys.stdout
    out.write("[")
    for index, (_, _, text) in enumerate(encoded):
        out.write((",\n" if index else "") + text.decode())
    out.write("]\n")
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
