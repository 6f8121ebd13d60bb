"""The rows of ``profctx ls``, and the listing index a process writes beside its shard when it ends.

A row is what ``ls`` shows of one capture (:func:`typed_row`). Reading a large manifest is
mostly parsing its JSON lines, so when a process's manifest writer closes it writes
``{shard}.index`` beside its shard (:func:`write_index`): a first line of JSON saying which bytes
of the shard it covers (their length and the CRC-32 of their last 4 kB) and the CRC-32 of the
rest, then one line of JSON holding the rows of the shard's captures (in the order of
:meth:`ManifestReader.merged`), their capture ids and the shard's damaged lines. ``ls`` takes a
shard's rows from its index when the shard is still exactly those bytes (:func:`read_index`),
and reads the shard itself otherwise: a shard written to after its index, a process killed
before it wrote one, an index cut, altered or of another version. The index is a cache:
deleting it changes nothing but speed.
"""

from __future__ import annotations

import json
import os
import zlib
from pathlib import Path
from typing import Any, Final

from .manifest import DRIVER, CaptureRecord, ManifestReader, _parser

#: Version of the index format and of the cells it holds: raise it whenever a row's cells change.
INDEX_VERSION: Final = 1
#: Appended to a shard's file name to name its index (the name no longer ends with ``.jsonl``).
INDEX_SUFFIX: Final = ".index"
#: Shards larger than this get no index: building it at exit would take too long.
INDEX_MAX_BYTES: Final = 64 * 1024 * 1024
#: The index holds the CRC-32 of this many bytes at the end of what it covers.
_TAIL: Final = 4096

#: A row: begin, order (rank, -1 when none), status, files listed, bytes written, run, the
#: process's grouping, host, pid, and the cells STEP ROLE RANK SOURCE DURATION NOTE.
Row = tuple[float, int, str, int, "int | None", str, int, "str | None", "int | None", str, str, str, str, str, str]
#: Grouping of a row's process: an engine replica or a named driver; a process outside every group; one in a group.
NO_GROUP: Final = 0
UNGROUPED: Final = 1
GROUPED: Final = 2


def seconds(s: float | None) -> str:
    """Return a duration in seconds as ``850 ms`` or ``2.41 s``, or ``-``."""
    if s is None:
        return "-"
    # round() formats faster than a float format and rounds the same way (half to even).
    return f"{round(s * 1000)} ms" if s < 1 else f"{s:.2f} s"


def steps_text(record: CaptureRecord) -> str:
    """Return a capture's steps as ``3`` or ``3-5``."""
    steps = record.steps
    if not steps:
        return "-"
    return str(steps[0]) if len(steps) == 1 else f"{steps[0]}-{steps[-1]}"


def source_text(record: CaptureRecord) -> str:
    """Return what recorded a capture: the backend, or ``engine version`` for engine captures."""
    if record.is_engine:
        engine = record.engine or "engine"
        return f"{engine} {record.version}" if record.version else engine
    return record.backend or "-"


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


def typed_row(record: CaptureRecord) -> Row:
    """Return the row of one capture, read through its typed record (any record, however odd its values)."""
    status = record.status
    rank = record.rank
    grouping = NO_GROUP
    if record.is_engine:
        replica = record.replica
        who = f"r{'?' if replica is None else replica}"
        source = source_text(record)
    else:
        who, grouping = _who(record.group, rank)
        source = record.backend or "-"
    return (record.begin, -1 if rank is None else rank, status, record.file_count, record.bytes, str(record.run),
            grouping, record.host, record.pid, steps_text(record), record.role or "step", who, source,
            seconds(record.duration_s), note(record) if status != "ok" or record.notes else "")


def _who(group: str | None, rank: int | None) -> tuple[str, int]:
    """Return the cell naming a non-engine process (``3``, ``actor:3``, ``driver``) and its grouping."""
    who = "-" if rank is None else str(rank)
    if group is None:
        return who, UNGROUPED
    if group == DRIVER:
        return DRIVER, NO_GROUP
    return f"{group}:{who}", GROUPED


def fast_row(raw: dict[str, Any]) -> Row:
    """Return :func:`typed_row` of the merged record ``raw``, reading its keys directly where their types are plain.

    A finished ``ok`` capture of a worker whose values have the writer's types (most of a large
    run) costs a few dict lookups; any other record goes through the typed record, so both
    give the same row (a test fuzzes this).
    """
    get = raw.get
    if get("status") != "ok" or get("kind") == "engine":
        return typed_row(CaptureRecord(raw))
    run, group, host, backend, role, steps, begin, duration, files, notes = (
        get("run"), get("group"), get("host"), get("backend"), get("role"), get("steps"), get("start_time"),
        get("duration_s"), get("files"), get("notes"))
    if (type(run) is not str or type(steps) is not list or len(steps) != 1 or type(steps[0]) is not int
            or type(begin) is not float or not begin or type(files) is not list
            or (group is not None and (type(group) is not str or not group))
            or (host is not None and type(host) is not str) or (backend is not None and type(backend) is not str)
            or (role is not None and type(role) is not str) or (duration is not None and type(duration) is not float)
            or (notes is not None and notes != [])):
        return typed_row(CaptureRecord(raw))
    rank, pid, written = get("rank"), get("pid"), get("bytes")
    if type(rank) is not int:
        rank = None
    listed = 0
    for entry in files:
        if (type(entry) is dict and type(entry.get("path")) is str) or type(entry) is str:
            listed += 1
    who, grouping = _who(group, rank)
    return (begin, -1 if rank is None else rank, "ok", listed, written if type(written) is int else None, run,
            grouping, host, pid if type(pid) is int else None, str(steps[0]), role or "step", who, backend or "-",
            seconds(duration), "")


def index_path(shard: Path) -> Path:
    """Return where the index of ``shard`` lies."""
    return shard.with_name(shard.name + INDEX_SUFFIX)


def write_index(shard: Path) -> bool:
    """Write the index of ``shard`` as it is now (see the module's docstring); return whether one was written.

    None is written (and a stale one is removed) when the shard cannot be read, is larger than
    :data:`INDEX_MAX_BYTES`, or holds a capture started and not finished. Never raises on I/O
    errors. Call it once nothing appends to the shard any more (its writer closed).
    """
    target = index_path(shard)
    try:
        if shard.stat().st_size > INDEX_MAX_BYTES:
            target.unlink(missing_ok=True)
            return False
        data = shard.read_bytes()
    except OSError:
        return False
    reader = ManifestReader(shard.parent.parent, lean=True)
    captures, still_open = reader.shard_captures(shard, data)
    try:
        if still_open:
            target.unlink(missing_ok=True)
            return False
        ids = []
        rows = []
        for raw in captures:
            key = raw.get("capture")
            ids.append(key if type(key) is str else "")
            rows.append(typed_row(CaptureRecord(raw)))
        body = json.dumps({"ids": ids, "rows": rows, "damaged": reader.damaged}, separators=(",", ":"),
                          default=str).encode()
        head = {"index": INDEX_VERSION, "shard": shard.name, "bytes": len(data), "crc": _crc(data[-_TAIL:]),
                "body": _crc(body)}
        text = json.dumps(head, separators=(",", ":")).encode() + b"\n" + body
        temporary = target.with_name(f"{target.name}.{os.getpid()}.tmp")
        temporary.write_bytes(text)
        os.replace(temporary, target)
    except (OSError, ValueError):
        return False
    return True


def read_index(shard: Path) -> tuple[list[str], list[list[Any]], list[str]] | None:
    """Return (capture ids, rows, damaged lines) of ``shard`` from its index, or ``None`` to read the shard instead.

    ``None`` when there is no index, it does not parse, is of another version or was altered, or
    the shard is no longer exactly the bytes it covers (written to, cut, or replaced since).
    """
    loads = _parser()[0]
    try:
        head_text, _, body = index_path(shard).read_bytes().partition(b"\n")
        head = loads(head_text)
        if (type(head) is not dict or head.get("index") != INDEX_VERSION or head.get("shard") != shard.name
                or head.get("body") != _crc(body)):
            return None
        covers = head.get("bytes")
        if type(covers) is not int:
            return None
        with open(shard, "rb") as fh:
            if os.fstat(fh.fileno()).st_size != covers:
                return None
            fh.seek(max(covers - _TAIL, 0))
            if _crc(fh.read(_TAIL)) != head.get("crc"):
                return None
        index = loads(body)
    except (OSError, ValueError):  # the parsers' errors are ValueErrors
        return None
    if type(index) is not dict:
        return None
    ids, rows, damaged = index.get("ids"), index.get("rows"), index.get("damaged")
    if type(ids) is not list or type(rows) is not list or type(damaged) is not list or len(ids) != len(rows):
        return None
    return ids, rows, damaged


def _crc(data: bytes) -> int:
    return zlib.crc32(data) & 0xFFFFFFFF
