"""``profctx ls DIR``: a table of the captures of a run, from its manifest."""

from __future__ import annotations

import argparse
import gc
import json
import sys
from collections.abc import Iterable, Iterator
from typing import Any

from ..manifest import DRIVER, CaptureRecord, ManifestReader
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
    rows: list[tuple[float, int, tuple[str, ...], tuple[str, str | None, int | None] | None]] = []
    counts: dict[str, int] = {}
    runs: set[str] = set()
    # Runs with a worker group, and the processes (run, host, pid) outside every group: the driver
    # is the only one of its run. Each process's key is one shared tuple, held by its rows.
    grouped: set[str] = set()
    ungrouped: dict[tuple[str, str | None, int | None], tuple[str, str | None, int | None]] = {}
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
        process = None
        if record.is_engine:
            replica = record.replica
            who = f"r{'?' if replica is None else replica}"
            source = source_text(record)
        else:
            group = record.group
            who = "-" if rank is None else str(rank)
            if group is None:
                key = (run_id, record.host, record.pid)
                process = ungrouped.setdefault(key, key)
            elif group == DRIVER:
                who = DRIVER
            else:
                who = f"{group}:{who}"
                grouped.add(run_id)
            source = record.backend or "-"
        row = (run_id, steps_text(record), record.role or "step", who, source, status,
               str(listed), shown if listed else "-", seconds(record.duration_s),
               note(record) if status != "ok" or record.notes else "")
        rows.append((record.begin, -1 if rank is None else rank, tuple(map(intern, row, row)), process))
    for where in damaged:
        print(f"profctx ls: skipped an unreadable manifest line ({where}), likely cut by a crash", file=sys.stderr)
    if not rows:
        print("no captures match the filters" if _filtered(args) else "no captures recorded")
        return OK
    # Filters hide processes: then the run's layout comes from its shards, one per process.
    drivers = _drivers(args) if _filtered(args) else _alone(grouped, ungrouped)
    if drivers:
        for index, (begin, order, shown_row, process) in enumerate(rows):
            if process is not None and process in drivers:
                rows[index] = (begin, order, (*shown_row[:3], DRIVER, *shown_row[4:]), process)
    rows.sort(key=lambda item: (item[0], item[1]))
    style = Style(sys.stdout)
    headers = ["RUN", "STEP", "ROLE", "RANK", "SOURCE", "STATUS", "FILES", "SIZE", "DURATION", "NOTE"]
    first = 0 if len(runs) > 1 else 1
    status_col = headers.index("STATUS") - first
    right = {headers.index(h) - first for h in ("STEP", "RANK", "FILES", "SIZE", "DURATION")}

    def paint(column: int, cell: str) -> str:
        return style.status(cell.strip()) + cell[len(cell.strip()):] if column == status_col else cell

    print(table(headers[first:], [row[first:] for _, _, row, _ in rows], right=right,
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


def _alone(grouped: set[str], ungrouped: Iterable[tuple[str, str | None, int | None]],
           ) -> set[tuple[str, str | None, int | None]]:
    """Return the (run, host, pid) of each run's driver: in a run with groups, its one process outside them."""
    per_run: dict[str, list[tuple[str, str | None, int | None]]] = {}
    for key in ungrouped:
        per_run.setdefault(key[0], []).append(key)
    return {keys[0] for run_id, keys in per_run.items() if run_id in grouped and len(keys) == 1}


def _drivers(args: argparse.Namespace) -> set[tuple[str, str | None, int | None]]:
    """Return the (run, host, pid) of the drivers of ``args.dir``, whatever the filters (read from its shards)."""
    grouped: set[str] = set()
    ungrouped: list[tuple[str, str | None, int | None]] = []
    for run_id, host, pid, group in ManifestReader(args.dir).shard_processes():
        if group is None:
            ungrouped.append((run_id, host, pid))
        elif group != DRIVER:
            grouped.add(run_id)
    return _alone(grouped, ungrouped)


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
