"""The rows of ``profctx ls``, and the listing index a process keeps beside its shard as it writes.

A row is what ``ls`` shows of one capture (:func:`typed_row`). Reading a large manifest is
mostly parsing its JSON lines, so each process's manifest writer keeps ``{shard}.index`` beside
its shard, appended to as the shard grows (:class:`IndexBuilder`), so that a run killed or still
running is indexed too. Every line of it is compact JSON, a tab and the CRC-32 of that JSON in
hex, so a line torn by a kill, or altered, is known and not used. The first line is the header,
``{"index": INDEX_VERSION, "shard": name}``. Then one segment per checkpoint: the writer appends
one each time the shard has grown by ``CHECKPOINT_BYTES`` (64 kB, in :mod:`profctx.records._manifest`)
and a last one when it closes. A segment covers the shard's bytes ``[a, b)`` (``a``: the previous
segment's ``b``; ``b``: just after a newline) and holds: ``lines``, the shard's lines before ``b``;
``crc``, the CRC-32 of the 4 kB before ``b``; ``ids`` and ``rows``, the captures finished in
``[a, b)`` (in the order of :meth:`ManifestReader.merged`); ``loose``, the rows of records
without a capture id; ``damaged``, the lines there that do not parse; ``open`` and ``open_ids``,
the lines of the captures started and not finished at ``b`` (a later part merges onto them).
A segment is built from those bytes alone, parsed by the reader's own code, with the open lines
carried from the segment before (so it costs what the new bytes cost, never a re-read).

``ls`` (:func:`read_index`) takes the rows of every segment up to the last one whose 4 kB still
match the shard's bytes, then parses only the shard's tail after it, with the open lines before
it. It reads the shard whole instead when no segment matches (the shard cut or rewritten), the
index is missing, of another version or its header is damaged, the tail touches a capture a
segment lists (a capture finished again: the shard's last word wins), or the shard finishes a
capture started in a shard read before. The writer stops appending segments (and indexes the
shard whole when it closes) when a segment could list otherwise than a whole read: see
:class:`IndexBuilder`. The index is a cache: deleting it changes nothing but speed.
"""

from __future__ import annotations

import contextlib
import json
import os
import zlib
from dataclasses import dataclass
from operator import itemgetter
from pathlib import Path
from typing import Any, Final

from ..manifest import _STARTED, DRIVER, MAX_LINE, CaptureRecord, ManifestReader, _capture_id, _parser
from ..util._files import create, temporary_name
from ..util._fs import walk
from ..util._untrusted import open_regular

#: Version of the index format and of the cells it holds: raise it whenever a row's cells change.
INDEX_VERSION: Final = 2
#: Appended to a shard's file name to name its index (the name no longer ends with ``.jsonl``).
INDEX_SUFFIX: Final = ".index"
#: :func:`write_index` (a whole shard at once) skips shards larger than this: it would take too long at exit.
INDEX_MAX_BYTES: Final = 64 * 1024 * 1024
_CLOEXEC: Final = getattr(os, "O_CLOEXEC", 0)
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
    # round() formats faster than a float format and rounds the same way (half to even); it
    # cannot take an infinity, which a damaged duration times 1000 can overflow to.
    return f"{round(s * 1000)} ms" if -1e300 < s < 1 else f"{s:.2f} s"


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
    """Return why a capture is not plainly ok, on one line: its reason, error, or notes."""
    status = record.status
    if status == "skipped":
        return _first_line(record.reason or "skipped")
    if status == "failed":
        return _first_line(record.error or "failed")
    if status == "open":
        return "started, never finished (still running, or the process died)"
    if status == "interrupted":
        return _first_line(record.error or record.reason or "interrupted (the process was stopped during the capture)")
    return "; ".join(_first_line(n) for n in record.notes)


def _first_line(text: str) -> str:
    """Return ``text``'s first non-blank line, with `` …`` when more follow (a Ray error spans many)."""
    lines = [line.strip() for line in text.strip().splitlines() if line.strip()]
    if len(lines) <= 1:
        return lines[0] if lines else text.strip()
    return f"{lines[0]} …"


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


def _line(value: dict[str, Any]) -> bytes:
    """Return one line of the index: compact JSON, a tab, the CRC-32 of the JSON in hex."""
    body = json.dumps(value, separators=(",", ":"), default=str).encode()
    return body + b"\t%08x\n" % _crc(body)


def _candidate(line: bytes) -> bool:
    """Whether the lean reader may skip ``line`` as a started record a later one covers (see ``_lean_parse``)."""
    return _STARTED in line and line.rstrip().endswith(b"}")


class IndexBuilder:
    """Append the segments of one shard's index as the shard grows (see the module's docstring).

    :meth:`checkpoint` covers the whole lines written since the last segment: it reads only those
    bytes (and the 4 kB before them, to check they are still the bytes it covered), parses them with
    the reader's own code and appends one line. It returns ``False``, and the shard gets no more
    segments, when a segment could disagree with reading the shard whole: the shard was cut or
    rewritten, a record finishes or restarts a capture an earlier segment lists, a started record
    is damaged or names its capture ambiguously, or the index was changed by someone else. The
    segments already written stay valid: ``ls`` reads the rest of the shard after them.
    """

    def __init__(self, shard: Path, target: Path | None = None) -> None:
        self.shard = shard
        self.target = index_path(shard) if target is None else target
        #: The shard's folder (``.profctx/``), walked to from the save path and held: the shard is
        #: read and the index written through it, never by path (see :mod:`profctx.util._fs`).
        self.folder = walk(shard.parent.parent, shard.parent.name, create=False)
        self.reader = ManifestReader(shard.parent.parent, lean=True)
        #: Bytes of the shard the segments cover, and their lines.
        self.covered = 0
        self.lines = 0
        self.segments = 0
        self._crc = _crc(b"")
        self._open: list[bytes] = []  # the lines of the captures started and not finished at ``covered``
        self._listed: set[str] = set()
        self._size = 0  # bytes of the index written so far (0: none yet)
        self._file: tuple[int, int] = (-1, -1)  # device and inode of the index created

    def _create(self) -> int:
        """Create the index exclusively, never through a link; one found there (stale, or planted) is removed first."""
        held = self.folder.fd
        try:
            fd = create(self.target.name, dir_fd=held)
        except FileExistsError:
            os.unlink(self.target.name, dir_fd=held)  # a link is removed, not followed
            fd = create(self.target.name, dir_fd=held)
        info = os.fstat(fd)
        self._file = (info.st_dev, info.st_ino)
        return fd

    def checkpoint(self) -> bool:
        """Append a segment covering the shard's new whole lines, if any; return ``False`` once it cannot."""
        with os.fdopen(os.open(self.shard.name, os.O_RDONLY | os.O_NOFOLLOW | _CLOEXEC, dir_fd=self.folder.fd),
                       "rb") as fh:
            before = max(self.covered - _TAIL, 0)
            fh.seek(before)
            data = fh.read()
        known = self.covered - before
        if _crc(data[:known]) != self._crc or len(data) < known:
            return False  # cut or rewritten since the last segment
        end = data.rfind(b"\n") + 1
        if end <= known:
            return True  # no new whole line
        new = data[known:end].splitlines()
        lines = [*self._open, *new]
        first = self.lines + 1 - len(self._open)
        reader = self.reader
        reader.damaged.clear()
        name = self.shard.name
        parsed = reader._lean_parse(name, lines, first)
        for where in reader.damaged:
            if _candidate(lines[int(where.rpartition(":")[2]) - first]):
                return False  # whether the whole read parses it depends on lines not written yet
        started: list[tuple[int, Any]] = []
        for index, record in enumerate(parsed):
            if record is not None and record.get("event") == "started":
                key = record.get("capture")
                line = lines[index]
                if _candidate(line) and _capture_id(line) != key:
                    return False
                started.append((index, key))
        listed = self._listed
        ids: list[str] = []
        rows: list[Row] = []
        loose: list[Row] = []  # captures without an id: a whole read lists them before the others
        pending: dict[str, dict[str, Any]] = {}
        for raw in reader._merge_records([r for r in parsed if r is not None], pending, set()):
            key = raw.get("capture")
            if type(key) is not str or not key:
                loose.append(fast_row(raw))
                continue
            if key in listed:
                return False  # finished again: the whole read merges it with the row an earlier segment holds
            ids.append(key)
            rows.append(fast_row(raw))
        still = pending.keys()
        if not still.isdisjoint(listed) or not still.isdisjoint(ids):
            return False  # restarted after it finished
        carried = [lines[index] for index, key in started if type(key) is str and key in still]
        try:
            text = [line.decode() for line in carried]
        except UnicodeDecodeError:
            return False
        covered, count, crc = self.covered + end - known, self.lines + len(new), _crc(data[:end][-_TAIL:])
        out = _line({"a": self.covered, "b": covered, "lines": count, "crc": crc, "ids": ids, "rows": rows,
                     "loose": loose, "damaged": list(reader.damaged), "open": text, "open_ids": list(still)})
        if not self._size:
            out = _line({"index": INDEX_VERSION, "shard": name}) + out
            fd = self._create()
        else:  # reopened by name: never through a link, and only the file created here
            fd = os.open(self.target.name, os.O_WRONLY | os.O_APPEND | os.O_NOFOLLOW | _CLOEXEC, dir_fd=self.folder.fd)
        try:
            info = os.fstat(fd)
            if ((info.st_dev, info.st_ino) != self._file or info.st_size != self._size
                    or os.write(fd, out) != len(out)):
                return False  # changed or replaced by someone else, or the disk is full (the torn line is ignored)
        finally:
            os.close(fd)
        self._size += len(out)
        self.covered, self.lines, self._crc = covered, count, crc
        self._open = carried
        listed.update(ids)
        self.segments += 1
        return True


def write_index(shard: Path) -> bool:
    """Write the index of ``shard`` as it is now, in one segment; return whether one was written.

    For a shard whose writer could not keep its index as it went (see :class:`IndexBuilder`): none
    is written (and a stale one is removed) when the shard cannot be read, is larger than
    :data:`INDEX_MAX_BYTES`, or is one a segment could not list. Never raises on I/O errors.
    """
    target = index_path(shard)
    temporary = target.with_name(temporary_name())
    try:
        builder = IndexBuilder(shard, temporary)
    except OSError:
        return False
    held = builder.folder
    try:
        if os.stat(shard.name, dir_fd=held.fd, follow_symlinks=False).st_size > INDEX_MAX_BYTES \
                or not builder.checkpoint() or not builder.segments:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(target.name, dir_fd=held.fd)
            return False
        os.replace(temporary.name, target.name, src_dir_fd=held.fd, dst_dir_fd=held.fd)  # a link there is replaced
    except (OSError, ValueError):
        return False
    finally:
        with contextlib.suppress(OSError):
            os.unlink(temporary.name, dir_fd=held.fd)
        held.close()
    return True


@dataclass
class Indexed:
    """What a shard's index says of it, checked against the shard: see :func:`read_index`."""

    #: Ids and rows of the captures finished in the bytes covered, rows of those without an id, damaged lines.
    ids: list[str]
    rows: list[Any]
    loose: list[Any]
    damaged: list[str]
    #: Bytes and lines covered; the lines of the captures open there, and their ids.
    covered: int
    lines: int
    open: list[bytes]
    open_ids: list[str]
    #: The shard's bytes after those covered, and how many segments were read.
    tail: bytes
    segments: int


def read_index(shard: Path) -> Indexed | None:
    """Return what the index of ``shard`` covers, or ``None`` to read the shard whole instead.

    The segments are read up to the first one that is torn, altered or does not follow the one
    before; then the last one whose 4 kB before its end are still the shard's bytes there is
    used. ``None`` when there is no index, its header does not parse or is of another version, or
    no segment matches the shard (cut or rewritten since).
    """
    loads = _parser()[0]
    try:
        # A run folder is untrusted: a regular file inside it, never blocking, and bounded.
        with open_regular(index_path(shard), shard.parent.parent) as fh:
            if os.fstat(fh.fileno()).st_size > INDEX_MAX_BYTES:
                return None
            data = fh.read(os.fstat(fh.fileno()).st_size + 1)
        if len(data) > INDEX_MAX_BYTES:
            return None
        entries = data.split(b"\n")
    except OSError:
        return None
    entries.pop()  # what follows the last newline: nothing, or a line torn by a kill
    segments: list[dict[str, Any]] = []
    end = 0
    lines = 0
    for number, entry in enumerate(entries):
        body, tab, crc = entry.rpartition(b"\t")
        if not tab or crc != b"%08x" % _crc(body):
            break
        try:
            value = loads(body)
        except ValueError:  # the parsers' errors are ValueErrors
            break
        if number == 0:
            if type(value) is not dict or value.get("index") != INDEX_VERSION or value.get("shard") != shard.name:
                return None
            continue
        if not _valid(value, end, lines):
            break
        segments.append(value)
        end, lines = value["b"], value["lines"]
    try:
        with open_regular(shard, shard.parent.parent) as fh:
            size = os.fstat(fh.fileno()).st_size
            while segments:
                last = segments[-1]
                covered = last["b"]
                if covered <= size:
                    fh.seek(max(covered - _TAIL, 0))
                    if _crc(fh.read(min(covered, _TAIL))) == last["crc"]:
                        tail = fh.read(min(size - covered, MAX_LINE) + 1)
                        if len(tail) > MAX_LINE:
                            return None  # a long tail: the reader reads it in pieces
                        break
                segments.pop()
            else:
                return None
    except OSError:
        return None
    ids: list[str] = []
    rows: list[Any] = []
    loose: list[Any] = []
    damaged: list[str] = []
    for segment in segments:
        ids += segment["ids"]
        rows += segment["rows"]
        loose += segment["loose"]
        damaged += segment["damaged"]
    if not (_rows_ok(rows) and _rows_ok(loose) and all(type(where) is str for where in damaged)):
        return None  # not what a writer writes (a run folder is untrusted): read the shard itself
    return Indexed(ids, rows, loose, damaged, covered, last["lines"], [line.encode() for line in last["open"]],
                   last["open_ids"], tail, len(segments))


#: The cells of a row (:data:`Row`); those ``ls`` shows as text, and the types each other cell may have.
_ROW_CELLS: Final = 15
_TEXT_CELLS: Final = (2, 5, 9, 10, 11, 12, 13, 14)
_OTHER_CELLS: Final = ((0, {int, float}), (1, {int}), (3, {int}), (4, {int, type(None)}), (6, {int}),
                       (7, {str, type(None)}), (8, {int, type(None)}))


def _rows_ok(rows: list[Any]) -> bool:
    """Whether ``rows`` (from an index) are rows as :func:`fast_row` makes them (checked column by column, in C)."""
    if not rows:
        return True
    if {type(row) for row in rows} != {list} or set(map(len, rows)) != {_ROW_CELLS}:
        return False
    for column in _TEXT_CELLS:
        if set(map(type, map(itemgetter(column), rows))) != {str}:
            return False
    return all(set(map(type, map(itemgetter(column), rows))) <= allowed for column, allowed in _OTHER_CELLS)


def _valid(segment: Any, start: int, lines: int) -> bool:
    """Whether ``segment`` is a segment that follows one ending at byte ``start`` and line ``lines``."""
    if type(segment) is not dict:
        return False
    get = segment.get
    ids, rows, damaged, still, keys = get("ids"), get("rows"), get("damaged"), get("open"), get("open_ids")
    loose = get("loose")
    end, count = get("b"), get("lines")
    return (get("a") == start and type(end) is int and end > start and type(count) is int and count >= lines
            and type(get("crc")) is int and type(ids) is list and type(rows) is list and len(ids) == len(rows)
            and type(loose) is list and type(damaged) is list and type(still) is list and type(keys) is list
            and all(type(line) is str for line in still) and all(type(key) is str for key in keys))


def _crc(data: bytes) -> int:
    return zlib.crc32(data) & 0xFFFFFFFF
