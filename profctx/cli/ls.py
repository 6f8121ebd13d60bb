"""``profctx ls DIR``: a table of the captures of a run, from its manifest."""

from __future__ import annotations

import argparse
import gc
import json
import sys
from collections.abc import Iterator
from typing import Any, Final

from ..manifest import DRIVER, CaptureRecord
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
)

try:
    import orjson as _orjson

    def _encode(data: Any) -> bytes:
        return _orjson.dumps(data, default=str, option=_orjson.OPT_INDENT_2)
except ImportError:  # pragma: no cover - the cli extra is absent

    def _encode(data: Any) -> bytes:
        return json.dumps(data, default=str, indent=2).encode()


#: First characters of the RANK cell of a process outside any worker group (a rank, or "-").
_UNGROUPED: Final = frozenset("-0123456789")


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
    _, reader, records = stream_run(args.dir, args, lean=not args.json)
    # The loop creates no reference cycles; without this the cyclic collector would walk every
    # row held so far again and again (a quarter of the time of a 100,000-capture listing).
    collecting = gc.isenabled()
    gc.disable()
    try:
        if args.json:
            return _json(records, reader.damaged)
        return _table(args, records, reader.damaged)
    finally:
        if collecting:
            gc.enable()


def _table(args: argparse.Namespace, records: Iterator[CaptureRecord], damaged: list[str]) -> int:
    # Rows are built as records stream in and their cells interned, so a run of 100,000 captures
    # holds one small tuple per capture, not its record.
    cells: dict[str, str] = {}
    sizes: dict[int | None, str] = {}
    rows: list[tuple[float, int, tuple[str, ...]]] = []
    counts: dict[str, int] = {}
    runs: set[str] = set()
    # Per run: whether any process belongs to a worker group, and the processes that belong to none.
    grouped: set[str] = set()
    ungrouped: dict[str, set[tuple[str | None, int | None]]] = {}
    files = total = 0
    failed = False
    intern = cells.setdefault
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
        rank = record.rank
        if record.is_engine:
            replica = record.replica
            who = f"r{'?' if replica is None else replica}"
            source = source_text(record)
        else:
            group = record.group
            who = "-" if rank is None else str(rank)
            if group is None:
                ungrouped.setdefault(run_id, set()).add((record.host, record.pid))
            elif group == DRIVER:
                who = DRIVER
            else:
                who = f"{group}:{who}"
                grouped.add(run_id)
            source = record.backend or "-"
        row = (run_id, steps_text(record), record.role or "step", who, source, status,
               str(listed), shown if listed else "-", seconds(record.duration_s),
               note(record) if status != "ok" or record.notes else "")
        rows.append((record.begin, -1 if rank is None else rank, tuple(map(intern, row, row))))
    for where in damaged:
        print(f"profctx ls: skipped an unreadable manifest line ({where}), likely cut by a crash", file=sys.stderr)
    if not rows:
        print("no captures match the filters" if _filtered(args) else "no captures recorded")
        return OK
    # In a run with worker groups, the one process outside every group is the driver.
    drivers = {run_id for run_id in grouped if len(ungrouped.get(run_id, ())) == 1}
    if drivers:
        for index, (begin, order, shown_row) in enumerate(rows):
            if shown_row[0] in drivers and shown_row[3][:1] in _UNGROUPED:
                rows[index] = (begin, order, (*shown_row[:3], DRIVER, *shown_row[4:]))
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


def _json(records: Iterator[CaptureRecord], damaged: list[str]) -> int:
    """Print the records as a JSON array, one shard (process) at a time, each by start time.

    Only the current shard's records are held (the reader holds them anyway until the shard
    is read), so memory does not grow with the run.
    """
    failed = False
    out = sys.stdout
    out.write("[")
    first = True
    batch: list[CaptureRecord] = []
    shard = None

    def flush() -> None:
        nonlocal first
        batch.sort(key=lambda r: (r.begin, -1 if r.rank is None else r.rank))
        for record in batch:
            data = record.as_dict()
            try:
                text = _encode(data)
            except TypeError:  # a value orjson refuses (an integer beyond 64 bits): the standard library takes it
                text = json.dumps(data, default=str, indent=2).encode()
            out.write(("" if first else ",\n") + text.decode())
            first = False
        batch.clear()

    for record in records:
        failed = failed or record.status == "failed"
        if record.shard != shard:
            flush()
            shard = record.shard
        batch.append(record)
    flush()
    out.write("]\n")
    for where in damaged:
        print(f"profctx ls: skipped an unreadable manifest line ({where}), likely cut by a crash", file=sys.stderr)
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
