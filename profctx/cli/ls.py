"""``profctx ls DIR``: a table of the captures of a run, from its manifest."""

from __future__ import annotations

import argparse
import gc
import json
import sys
from collections.abc import Iterable, Iterator, Sequence
from operator import itemgetter
from pathlib import Path
from typing import Any

from ..manifest import DRIVER, CaptureRecord, ManifestReader
from ..records._listing import GROUPED, UNGROUPED, Indexed, fast_row, read_index
from ._common import (
    FINDINGS,
    OK,
    Style,
    add_filters,
    check_folder,
    escape,
    guarded,
    lacking,
    no_capture_yet,
    size,
    stream_merged,
    stream_run,
    table,
    tell_repeats,
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
    # The loop creates no reference cycles; without this the cyclic collector would walk every
    # row held so far again and again (a quarter of the time of a 100,000-capture listing).
    empty = no_capture_yet(Path(args.dir).expanduser())
    if empty is not None:  # an answer, not a usage error: nothing to list yet
        print("[]" if args.json else f"{args.dir}: {empty}")
        return OK
    collecting = gc.isenabled()
    gc.disable()
    try:
        if args.json:
            _, reader, records = stream_run(args.dir, args)
            reader.unique_files = False
            return _json(records, reader)
        reader, rows = _rows(args)
        return _table(args, rows, reader)
    finally:
        if collecting:
            gc.enable()


def _rows(args: argparse.Namespace) -> tuple[ManifestReader, Iterator[Sequence[Any]]]:
    """Return the manifest reader and the rows of the captures to list (see :mod:`profctx.records._listing`).

    Unfiltered, a shard whose index is up to date is not read: its rows come from the index.
    """
    if _filtered(args):
        _, reader, merged = stream_merged(args.dir, args, lean=True)
        reader.unique_files = False  # a listing: every capture is a row, whatever files it names
        return reader, map(fast_row, merged)
    reader = ManifestReader(check_folder(args.dir), lean=True)
    reader.unique_files = False

    def rows() -> Iterator[Sequence[Any]]:
        pending: dict[str, dict[str, Any]] = {}
        finished: set[str] = set()
        for shard in reader.shards():
            found = read_index(shard)
            # Read the shard itself when it finishes a capture started in a shard before it, or repeats
            # one a shard before it finished (a copy: the reader leaves the repeats out).
            if found is not None and finished.isdisjoint(found.ids) and (
                    not pending or (pending.keys().isdisjoint(found.ids)
                                    and pending.keys().isdisjoint(found.open_ids))):
                listed = _listed(reader, shard.name, found, pending, finished)
                if listed is not None:
                    yield from listed
                    continue
            yield from map(fast_row, reader._merge_shard(shard, pending, finished))
        yield from map(fast_row, reader._still_open(pending, finished))

    return reader, rows()


def _listed(reader: ManifestReader, name: str, found: Indexed, pending: dict[str, dict[str, Any]],
            finished: set[str]) -> list[Sequence[Any]] | None:
    """Return the rows of a shard from its index and the tail after it, as :meth:`ManifestReader._merge_shard` would.

    ``None`` (nothing changed) when the tail touches a capture the index lists: a capture finished
    again, whose record the shard's last word makes. Captures without an id come first (the index's,
    then the tail's), as they would reading the shard whole.
    """
    lines = found.open
    if not found.tail and not lines:
        finished.update(found.ids)
        reader.damaged.extend(found.damaged)
        return found.loose + found.rows if found.loose else found.rows
    if found.tail:
        lines = [*lines, *found.tail.splitlines()]
    count = len(reader.damaged)
    reader.damaged.extend(found.damaged)
    parsed = [r for r in reader._lean_parse(name, lines, found.lines + 1 - len(found.open)) if r is not None]
    if parsed and found.ids:
        listed = set(found.ids)
        for record in parsed:
            key = record.get("capture")
            if type(key) is str and key in listed:
                del reader.damaged[count:]
                return None
    finished.update(found.ids)
    first: list[Sequence[Any]] = []
    last: list[Sequence[Any]] = []
    for raw in reader._merge_records(parsed, pending, finished):
        key = raw.get("capture")
        (last if type(key) is str and key else first).append(fast_row(raw))
    return [*found.loose, *first, *found.rows, *last]


def _table(args: argparse.Namespace, rows_in: Iterable[Sequence[Any]], reader: ManifestReader) -> int:
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
    intern = cells.setdefault
    add_run = runs.add
    append = rows.append
    for (begin, order, status, listed, written, run_id, grouping, host, pid,
         steps, role, who, source, duration, why) in rows_in:
        counts[status] = counts.get(status, 0) + 1
        files += listed
        if written:
            total += written
        add_run(run_id)
        shown = sizes.get(written)
        if shown is None:
            shown = sizes[written] = size(written)
        process = None
        if grouping == UNGROUPED:
            key = (run_id, host, pid)
            process = ungrouped.setdefault(key, key)
        elif grouping == GROUPED:
            grouped.add(run_id)
        row = (run_id, steps, role, who, source, status, str(listed), shown if listed else "-", duration, why)
        append((begin, order, tuple(map(intern, row, row)), process))
    failed = "failed" in counts
    for where in reader.damaged:
        print(_skipped(where), file=sys.stderr)
    tell_repeats("profctx ls", reader)
    # Cells come from the run folder (untrusted): escape control characters, once per distinct cell.
    unsafe = {cell: shown for cell in cells if (shown := escape(cell)) is not cell}
    if unsafe:
        rows = [(begin, order, tuple(unsafe.get(cell, cell) for cell in shown_row), process)
                for begin, order, shown_row, process in rows]
    if not rows:
        print("no captures match the filters" if _filtered(args) else "no captures recorded")
        return OK
    # Filters hide processes: then the run's layout comes from its shards, one per process.
    drivers = _drivers(args) if _filtered(args) else _alone(grouped, ungrouped)
    if drivers:
        for index, (begin, order, shown_row, process) in enumerate(rows):
            if process is not None and process in drivers:
                rows[index] = (begin, order, (*shown_row[:3], DRIVER, *shown_row[4:]), process)
    rows.sort(key=itemgetter(0, 1))
    style = Style(sys.stdout)
    headers = ["RUN", "STEP", "ROLE", "RANK", "SOURCE", "STATUS", "FILES", "SIZE", "DURATION", "NOTE"]
    first = 0 if len(runs) > 1 else 1
    status_col = headers.index("STATUS") - first
    right = {headers.index(h) - first for h in ("STEP", "RANK", "FILES", "SIZE", "DURATION")}

    def paint(column: int, cell: str) -> str:
        return style.status(cell.strip()) + cell[len(cell.strip()):] if column == status_col else cell

    print(table(headers[first:], list(map(itemgetter(2), rows)), right=right, paint=paint if style.enabled else None,
                skip=first, escaped=True))
    summary = ", ".join(f"{n} {s}" for s, n in sorted(counts.items()))
    print(style(f"{len(rows)} captures ({summary}), {files} files, {size(total)}", "dim"))
    hole = None if _filtered(args) else lacking(args.dir)
    if hole:
        print(style(hole, "yellow"))
    return FINDINGS if failed else OK


def _json(records: Iterator[CaptureRecord], reader: ManifestReader) -> int:
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
    for where in reader.damaged:
        print(_skipped(where), file=sys.stderr)
    tell_repeats("profctx ls", reader)
    return FINDINGS if failed else OK


def _skipped(where: str) -> str:
    """Return what ``ls`` says of one damaged manifest entry: a shard it did not read (and why), or a line."""
    if ": " in where:  # "SHARD: not read (a symbolic link ...)": the whole shard, refused or unreadable
        return f"profctx ls: skipped the manifest shard {escape(where)}"
    return f"profctx ls: skipped an unreadable manifest line ({escape(where)}), likely cut by a crash"


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
    for run_id, host, pid, group in ManifestReader(args.dir)._shard_processes():
        if group is None:
            ungrouped.append((run_id, host, pid))
        elif group != DRIVER:
            grouped.add(run_id)
    return _alone(grouped, ungrouped)


def _filtered(args: argparse.Namespace) -> bool:
    return any(getattr(args, name, None) for name in ("run", "step", "role", "rank", "group", "status"))
