"""Read a run's manifest: one typed record per capture, streamed shard by shard.

The writer (:mod:`profctx.records._manifest`) appends JSON lines to one shard per process under
``{save_path}/.profctx/``: a ``started`` record, then a ``finished`` record of the same
``capture`` id whose ``status`` is ``ok``, ``failed``, ``skipped`` or ``interrupted``. A capture
with a ``started`` record and no ``finished`` one reads as ``open`` (still running, or its
process died).

The reader is lenient: a line that does not parse (a write cut by a crash, garbage) is
listed in :attr:`ManifestReader.damaged` and skipped; a value of the wrong type reads as
``None`` (or empty); unknown keys are kept in :attr:`CaptureRecord.extra`. Nothing a shard
holds makes it raise; an unreadable shard is listed as damaged too.

A run folder is untrusted input (it may come from elsewhere, or others may write to it): a
shard is read only if it is a regular file inside the folder (:mod:`profctx.util._untrusted`), in
pieces, and a line longer than :data:`MAX_LINE` or nested deeper than
:data:`~profctx.util._untrusted.MAX_DEPTH` is listed as damaged without being held whole.
:meth:`ManifestReader.resolve` turns a file name a record gives into a path inside the folder.
"""

from __future__ import annotations

import functools
import json
import os
from collections.abc import Callable, Collection, Iterable, Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, final

from .core._layout import MANIFEST_DIR, safe
from .core._status import LISTED
from .util._untrusted import MAX_DEPTH, MAX_LISTED, UnsafeFileError, names_in, open_regular, resolve, too_deep

__all__ = ["DRIVER", "MAX_LINE", "STATUSES", "VERSION", "CaptureRecord", "ManifestReader", "TraceFile", "drivers",
           "in_groups", "latest_run", "process_names", "read", "repeats_text", "runs"]


@functools.cache
def _parser() -> tuple[Callable[[bytes], Any], tuple[type[Exception], ...]]:
    """Return (loads, the errors it raises for a bad line).

    orjson parses a manifest line about 4x faster; the stdlib parser is the fallback (core needs
    no extra). Imported when a manifest is first read (orjson brings uuid, datetime and
    platform): ``import profctx`` only writes.
    """
    try:
        import orjson
    except ImportError:  # pragma: no cover - exercised when the extra is absent
        return json.loads, (json.JSONDecodeError, UnicodeDecodeError, RecursionError)
    return orjson.loads, (orjson.JSONDecodeError, UnicodeDecodeError)


#: A manifest line longer than this many bytes is damaged: skipped unread (a record is about 600 bytes; an
#: engine's listing thousands of files stays far under it).
MAX_LINE: Final = 8 << 20
#: Bytes read at a time from a shard larger than MAX_LINE (a smaller one is read whole).
_PIECE: Final = 1 << 20
#: Highest record version this reader understands; newer records are skipped.
VERSION: Final = 1
#: The group name that marks the driver; a process outside any group is the driver where its run has groups.
DRIVER: Final = "driver"
#: The statuses a record can have (``core._status.LISTED``). Other strings are kept as given.
STATUSES: Final = LISTED

#: Keys the typed record holds as fields; every other key goes to ``extra``.
_FIELDS: Final = frozenset({
    "capture", "run", "status", "kind", "steps", "step", "last_step", "role", "rank", "world_size", "host",
    "pid", "group", "seq", "backend", "engine", "version", "replica", "folder", "start_time", "end_time",
    "duration_s", "blocked_s", "write_s", "files", "bytes", "ranges", "error", "reason", "notes", "shard",
    "event", "time", "trigger", "selected",
})


@dataclass(frozen=True)
class TraceFile:
    """One file a capture wrote: ``path`` relative to ``save_path`` (or absolute), size in bytes."""

    path: str
    bytes: int | None


def _int(value: Any) -> int | None:
    return value if type(value) is int else None


def _float(value: Any) -> float | None:
    kind = type(value)
    if kind is float or kind is int:
        return float(value)
    return None


def _str(value: Any) -> str | None:
    if value is None or type(value) is str:
        return value
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return str(value)
    return None


@final
class CaptureRecord:
    """One capture, its ``started`` and ``finished`` records merged (later keys win): a read-only, typed view.

    Every attribute is typed and lenient: a value of the wrong type reads as ``None`` (or
    empty). Times are Unix seconds. Keys this view does not type (``owner``, ``thread``, ``v``...)
    are in :attr:`extra`; :meth:`as_dict` returns the record as read. A view over the parsed
    dict rather than a dataclass: a frozen dataclass of 31 fields took 9 µs to build, this 0.3 µs,
    and ``profctx ls`` builds one per capture (100,000 in a large run).
    """

    __slots__ = ("_raw",)
    _raw: Mapping[str, Any]

    def __init__(self, raw: Mapping[str, Any]) -> None:
        object.__setattr__(self, "_raw", raw)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError(f"CaptureRecord is read-only: cannot set {name!r}")

    def __repr__(self) -> str:
        return f"CaptureRecord({self.capture!r}, {self.status!r}, steps={self.steps}, role={self.role!r})"

    @property
    def capture(self) -> str:
        """The capture id (``""`` when absent)."""
        return _str(self._raw.get("capture")) or ""

    @property
    def status(self) -> str:
        """``ok``, ``failed``, ``skipped``, ``interrupted``, ``open``, or another string as written."""
        value = self._raw.get("status")
        return value if type(value) is str else "open"

    @property
    def shard(self) -> str:
        """The name of the shard file the record came from."""
        return _str(self._raw.get("shard")) or ""

    @property
    def run(self) -> str | None:
        """The run id."""
        return _str(self._raw.get("run"))

    @property
    def kind(self) -> str | None:
        """``step``, ``role`` or ``engine``."""
        return _str(self._raw.get("kind"))

    @property
    def steps(self) -> tuple[int, ...]:
        """The global steps the capture covers (from ``steps``, else ``step``); empty when none."""
        steps = self._raw.get("steps")
        if type(steps) is list:
            if len(steps) == 1 and type(steps[0]) is int:
                return (steps[0],)  # the common case, without a generator: ls builds 100,000 of these
            return tuple(s for s in steps if type(s) is int)
        step = self._raw.get("step")
        return (step,) if type(step) is int else ()

    @property
    def role(self) -> str | None:
        """The role path (``train/actor_update``); ``None`` for a whole-step capture."""
        return _str(self._raw.get("role")) or None

    @property
    def rank(self) -> int | None:
        """The rank (in its group, when it has one)."""
        return _int(self._raw.get("rank"))

    @property
    def world_size(self) -> int | None:
        """The world (or group) size."""
        return _int(self._raw.get("world_size"))

    @property
    def host(self) -> str | None:
        """The host name."""
        return _str(self._raw.get("host"))

    @property
    def pid(self) -> int | None:
        """The process id."""
        return _int(self._raw.get("pid"))

    @property
    def group(self) -> str | None:
        """The worker group name (``actor``, ``rollout``, ``driver``...), when recorded."""
        return _str(self._raw.get("group")) or None

    @property
    def seq(self) -> int | None:
        """The record's sequence number in its process, when recorded."""
        return _int(self._raw.get("seq"))

    @property
    def backend(self) -> str | None:
        """The device profiler (``torch``, ``npu``, ``nsys``...)."""
        return _str(self._raw.get("backend"))

    @property
    def engine(self) -> str | None:
        """The engine of an engine capture (``vllm``, ``sglang``)."""
        return _str(self._raw.get("engine"))

    @property
    def version(self) -> str | None:
        """The engine's version."""
        return _str(self._raw.get("version"))

    @property
    def replica(self) -> int | None:
        """The engine replica."""
        return _int(self._raw.get("replica"))

    @property
    def folder(self) -> str | None:
        """The capture's folder, relative to ``save_path``."""
        return _str(self._raw.get("folder"))

    @property
    def start_time(self) -> float | None:
        """When the capture started."""
        return _float(self._raw.get("start_time"))

    @property
    def end_time(self) -> float | None:
        """When it stopped."""
        return _float(self._raw.get("end_time"))

    @property
    def time(self) -> float | None:
        """When a skipped capture was refused."""
        return _float(self._raw.get("time"))

    @property
    def duration_s(self) -> float | None:
        """Seconds from start to stop."""
        return _float(self._raw.get("duration_s"))

    @property
    def blocked_s(self) -> float | None:
        """Seconds the training thread waited for the profiler to stop."""
        return _float(self._raw.get("blocked_s"))

    @property
    def write_s(self) -> float | None:
        """Seconds the background writer took to write the files."""
        return _float(self._raw.get("write_s"))

    @property
    def lists_files(self) -> bool:
        """Whether the record says which files the capture produced (an empty list included).

        Engine records of older manifests carry no list: readers then look in the capture's folder.
        """
        return type(self._raw.get("files")) is list

    @property
    def selected(self) -> tuple[int, ...] | str | None:
        """The ranks the process's configuration profiled (``"all"``; ``None``: not recorded)."""
        value = self._raw.get("selected")
        if value == "all":
            return "all"
        if type(value) is list and len(value) <= 4096 and all(type(r) is int and r >= 0 for r in value):
            return tuple(value)
        return None

    @property
    def files(self) -> tuple[TraceFile, ...]:
        """The files written, paths relative to ``save_path`` (or absolute)."""
        value = self._raw.get("files")
        if type(value) is not list or not value:
            return ()
        out = []
        for entry in value:
            if type(entry) is dict and type(entry.get("path")) is str:
                out.append(TraceFile(entry["path"], _int(entry.get("bytes"))))
            elif type(entry) is str:
                out.append(TraceFile(entry, None))
        return tuple(out)

    @property
    def file_count(self) -> int:
        """How many files the capture lists (as :attr:`files` would return, without building them)."""
        value = self._raw.get("files")
        if type(value) is not list:
            return 0
        count = 0
        for entry in value:
            if (type(entry) is dict and type(entry.get("path")) is str) or type(entry) is str:
                count += 1
        return count

    @property
    def bytes(self) -> int | None:
        """Total bytes written."""
        return _int(self._raw.get("bytes"))

    @property
    def ranges(self) -> int | None:
        """Named ranges opened inside the capture."""
        return _int(self._raw.get("ranges"))

    @property
    def error(self) -> str | None:
        """Why a capture failed."""
        return _str(self._raw.get("error"))

    @property
    def reason(self) -> str | None:
        """Why a capture was skipped."""
        return _str(self._raw.get("reason"))

    @property
    def notes(self) -> tuple[str, ...]:
        """Notes the backend left."""
        value = self._raw.get("notes")
        if type(value) is list:
            return tuple(str(n) for n in value) if value else ()
        return (value,) if type(value) is str else ()

    @property
    def trigger(self) -> dict[str, Any] | None:
        """Who asked for a capture nobody planned, when and why; ``None`` for a capture of the configured window.

        Keys as ``profctx trigger`` or the anomaly watch wrote them (``docs/on-demand.md``): ``id``,
        ``first``, ``count``, ``origin`` (``trigger`` or ``anomaly``), ``reason``, ``user``, ``uid``,
        ``host``, ``pid``, ``time``, and ``mode``, ``roles``, ``group``, ``ranks`` when the request named them.
        """
        value = self._raw.get("trigger")
        return dict(value) if type(value) is dict else None

    @property
    def extra(self) -> dict[str, Any]:
        """The keys not typed above, as read."""
        return {k: v for k, v in self._raw.items() if k not in _FIELDS}

    @property
    def step(self) -> int | None:
        """The first step the capture covers."""
        steps = self.steps
        return steps[0] if steps else None

    @property
    def last_step(self) -> int | None:
        """The last step the capture covers."""
        steps = self.steps
        return steps[-1] if steps else None

    @property
    def role_name(self) -> str:
        """The last part of the role path (``actor_update`` of ``train/actor_update``), or ``step``."""
        role = self.role
        return role.rsplit("/", 1)[-1] if role else "step"

    @property
    def is_engine(self) -> bool:
        """Whether an engine adapter (vLLM, SGLang...) recorded the capture."""
        return self._raw.get("kind") == "engine"

    @property
    def begin(self) -> float:
        """Best known start time: ``start_time``, else the record time, else ``end_time``, else 0."""
        return self.start_time or self.time or self.end_time or 0.0

    @property
    def process(self) -> tuple[str, ...]:
        """The key of the process the capture ran in: engine replica, or host, pid, group and rank; run last."""
        if self.is_engine:
            return ("engine", self.engine or "engine", str(self.replica), self.run or "")
        return ("process", self.host or "?", str(self.pid), self.group or "", str(self.rank), self.run or "")

    @property
    def who(self) -> str:
        """A short process label: ``vllm replica 1``, ``actor rank 0`` or ``rank 0``."""
        if self.is_engine:
            replica = self.replica
            return f"{self.engine or 'engine'} replica {'?' if replica is None else replica}"
        rank = self.rank
        shown = "?" if rank is None else rank
        group = self.group
        return f"{group} rank {shown}" if group else f"rank {shown}"

    def as_dict(self) -> dict[str, Any]:
        """Return the record as read (the writer's keys and the ``shard`` it came from), a copy."""
        return dict(self._raw)


_STARTED: Final = b'"event":"started"'
_GROUP: Final = b'"group"'
_CAPTURE: Final = b'"capture":"'


def _capture_id(line: bytes) -> str | None:
    """Return the ``capture`` id of a compact JSON line without parsing it (``None`` when unsure)."""
    at = line.find(_CAPTURE)
    if at < 0:
        return None
    at += len(_CAPTURE)
    end = line.find(b'"', at)
    if end < 0:
        return None
    raw = line[at:end]
    if b"\\" in raw:
        return None
    try:
        return raw.decode()
    except UnicodeDecodeError:
        return None


class ManifestReader:
    """Iterate over the captures of ``save_path`` (of one ``run``, or of all when ``None``).

    Iterating yields merged raw dicts with :meth:`merged` or typed records with ``iter()``;
    shards are read one at a time, so memory holds one shard's text and its unfinished
    captures. After iterating, :attr:`damaged` lists ``shard:line`` of every line skipped.
    Records of a newer format version are skipped too, counted in :attr:`newer`.

    ``lean=True`` skips parsing a ``started`` record whose capture finishes later in the same
    shard with its ``start_time``: the writer repeats every key of a started record in the
    finished one but ``thread``, so the typed fields read the same, and a large run reads in
    about half the time (``profctx ls``). :meth:`CaptureRecord.as_dict` then lacks ``thread``.
    """

    def __init__(self, save_path: str | os.PathLike[str], run: str | None = None, *, lean: bool = False) -> None:
        self.save_path = Path(save_path)
        self.run = run
        self.lean = lean
        self.damaged: list[str] = []
        self.newer = 0
        #: Shards every capture of which an earlier shard holds already (a copy, a shard synced twice): not read.
        self.duplicates: list[str] = []
        #: Records left out as repeats: captures another shard holds, a file another capture names already.
        self.repeated: list[str] = []
        #: Each trace file a capture read so far names, and that capture's id (a second naming is a repeat).
        self._named: dict[str, str] = {}
        #: Leave out a capture that names a trace file an earlier one names (the analysis would count its
        #: events twice); ``profctx ls``, which only lists, turns it off.
        self.unique_files = True

    def resolve(self, name: str) -> Path:
        """Return the path of a file a record names (relative to ``save_path``), refusing one outside it.

        Raise :class:`~profctx.util._untrusted.UnsafeFileError` (an :class:`OSError`) for an absolute
        name or one climbing out with ``..``; links are checked when the file is opened.
        """
        return resolve(self.save_path, name)

    def shards(self) -> list[Path]:
        """Return the shard files, those of other runs left out by name when a run is given.

        None when the manifest folder is a link or lies outside ``save_path``.
        """
        folder = self.save_path / MANIFEST_DIR
        names = names_in(self.save_path, MANIFEST_DIR, MAX_LISTED)
        prefix = None if self.run is None else f"{safe(self.run)}."
        # Shortest name first: a copy (``x.backup.jsonl``) is read after the shard it copies, so the copy is
        # the one named a duplicate.
        return [folder / n for n in sorted(names, key=lambda n: (len(n), n))
                if n.endswith(".jsonl") and (prefix is None or n.startswith(prefix))]

    def lines(self) -> Iterator[dict[str, Any]]:
        """Yield every raw record of every shard, with its ``shard`` name added."""
        for shard in self.shards():
            yield from self._shard_lines(shard)

    def _shard_lines(self, shard: Path, lean: bool = False) -> Iterator[dict[str, Any]]:
        lines = self._read(shard)
        if lines is not None:
            yield from self._lines(shard.name, lines, lean)

    def _read(self, shard: Path) -> list[bytes] | None:
        """Return the lines of ``shard`` (``b""`` for one over :data:`MAX_LINE`, listed damaged), or ``None``.

        ``None``, listed damaged, when the shard is not a regular file inside ``save_path`` or cannot be read.
        """
        try:
            with open_regular(shard, self.save_path) as fh:
                size = os.fstat(fh.fileno()).st_size
                if size <= MAX_LINE:
                    data = fh.read(size + 1)  # not MAX_LINE: read() sets aside what it is asked for
                    if len(data) <= MAX_LINE:  # no line in it can be over MAX_LINE
                        return data.splitlines()
                    del data  # it grew since: read it in pieces
                    fh.seek(0)
                return self._pieces(shard.name, fh)
        except UnsafeFileError as exc:
            self.damaged.append(f"{shard.name}: not read ({exc})")
        except OSError as exc:
            self.damaged.append(f"{shard.name}: unreadable ({exc})")
        return None

    def _pieces(self, name: str, fh: Any) -> list[bytes]:
        """Return the lines of a large shard read in pieces, a line over :data:`MAX_LINE` skipped unheld."""
        lines: list[bytes] = []
        held: list[bytes] = []  # the pieces of a line that runs on past a piece
        size = 0
        skipping = False
        while True:
            piece = fh.read(_PIECE)
            if not piece:
                break
            if skipping:  # through the end of the line too long (a "\n": the writer's line end)
                at = piece.find(b"\n")
                if at < 0:
                    continue
                piece = piece[at + 1:]
                skipping = False
                self._too_long(name, lines)
                if not piece:
                    continue
            if b"\n" not in piece and b"\r" not in piece:  # the line goes on
                held.append(piece)
                size += len(piece)
                if size > MAX_LINE:
                    held, size, skipping = [], 0, True
                continue
            data = b"".join((*held, piece)) if held else piece
            held, size = [], 0
            parts = data.splitlines(keepends=True)
            if parts and (not parts[-1].endswith((b"\n", b"\r")) or data.endswith(b"\r")):
                last = parts.pop()  # may go on in the next piece (a "\r" may be half of "\r\n")
                held, size = [last], len(last)
            if parts and max(map(len, parts)) > MAX_LINE:
                for part in parts:
                    part = part.rstrip(b"\r\n")
                    if len(part) > MAX_LINE:
                        self._too_long(name, lines)
                    else:
                        lines.append(part)
            else:
                lines += [part.rstrip(b"\r\n") for part in parts]
            if size > MAX_LINE + 1 or (size > MAX_LINE and not held[0].endswith(b"\r")):
                held, size, skipping = [], 0, True
        if skipping:
            self._too_long(name, lines)
        elif held:
            last = b"".join(held).rstrip(b"\r\n")
            if len(last) > MAX_LINE:
                self._too_long(name, lines)
            else:
                lines.append(last)
        return lines

    def _too_long(self, name: str, lines: list[bytes]) -> None:
        lines.append(b"")
        self.damaged.append(f"{name}:{len(lines)} (a line over {MAX_LINE >> 20} MB, not read)")

    def _records(self, name: str, data: bytes, lean: bool) -> Iterator[dict[str, Any]]:
        return self._lines(name, data.splitlines(), lean)

    def _lines(self, name: str, lines: list[bytes], lean: bool) -> Iterator[dict[str, Any]]:
        if not lean:
            for number, line in enumerate(lines, 1):
                record = self._parse(name, number, line)
                if record is not None:
                    yield record
            return
        yield from self._lean(name, lines)

    def _parse(self, name: str, number: int, line: bytes) -> dict[str, Any] | None:
        """Return the record of one line, or ``None`` (blank, damaged, newer, another run)."""
        if not line or line.isspace():
            return None
        if len(line) > MAX_LINE:
            self.damaged.append(f"{name}:{number} (a line over {MAX_LINE >> 20} MB, not read)")
            return None
        loads, bad_line = _parser()
        try:
            record = loads(line)
        except bad_line:
            self.damaged.append(f"{name}:{number}")
            return None
        if type(record) is not dict or (line.count(b"{") + line.count(b"[") > MAX_DEPTH and too_deep(line)):
            self.damaged.append(f"{name}:{number}")
            return None
        version = record.get("v", 0)
        if type(version) is not int:
            version = 0
        if version > VERSION:
            self.newer += 1
            return None
        if self.run is not None and record.get("run") != self.run:
            return None
        record["shard"] = name
        return record

    def _lean(self, name: str, lines: list[bytes]) -> Iterator[dict[str, Any]]:
        """Yield a shard's records as :meth:`_shard_lines` does, less the started ones a later record covers."""
        for record in self._lean_parse(name, lines):
            if record is not None:
                yield record

    def _lean_parse(self, name: str, lines: list[bytes], first: int = 1) -> list[dict[str, Any] | None]:
        """Return the record of each of ``lines`` as the lean reader reads them (``None``: not parsed or not a record).

        ``first``: the number of the first line, as :attr:`damaged` names lines. The listing
        index (:mod:`profctx.records._listing`) reads a shard piece by piece with it.
        """
        parsed: list[dict[str, Any] | None] = [None] * len(lines)
        started: list[tuple[int, bytes]] = []
        covered: dict[str, int] = {}  # capture id -> index of its last finished record holding start_time
        earliest: dict[str, int] = {}  # capture id -> index of its first parsed record
        for index, line in enumerate(lines):
            # The writer's compact JSON: inside a string every quote is escaped, so this is a key.
            # A line cut short (no closing brace) is parsed, so that it is reported as damaged.
            if _STARTED in line and line.rstrip().endswith(b"}"):
                started.append((index, line))
                continue
            record = parsed[index] = self._parse(name, index + first, line)
            # Only a finished record repeats the started one's keys (a record of another event
            # may finish the capture too, but then the started one must be read).
            if record is not None:
                key = record.get("capture")
                if type(key) is str:
                    earliest.setdefault(key, index)
                    if "start_time" in record and record.get("event") == "finished":
                        covered[key] = index
        # A started record restarts its capture: skipped, the finished one after it would merge
        # into what an earlier record of the capture left (a whole read starts afresh from it).
        restarted: set[str] = set()
        for index, line in started:
            key = _capture_id(line)
            if key is None or covered.get(key, -1) < index or earliest.get(key, index) < index or key in restarted:
                parsed[index] = self._parse(name, index + first, line)
            if key is not None:
                restarted.add(key)
        return parsed

    def _shard_processes(self) -> Iterator[tuple[str, str | None, int | None, str | None]]:
        """Yield ``(run, host, pid, group)`` of each shard's process (one process per shard).

        The group is the first one a line of the shard names (a process may be put in a group
        after its first records); ``None`` when no line does. Lines without a group are not
        parsed, but the first, which says who the process is.
        """
        seen: set[tuple[str, str | None, int | None]] = set()
        for shard in self.shards():
            lines = self._read(shard)
            if lines is None:
                continue
            who: CaptureRecord | None = None
            group = None
            for number, line in enumerate(lines, 1):
                if who is not None and _GROUP not in line:
                    continue
                record = self._parse(shard.name, number, line)
                if record is None:
                    continue
                typed = CaptureRecord(record)
                who = who or typed
                group = typed.group
                if group is not None:
                    break
            if who is not None and (str(who.run), who.host, who.pid) not in seen:
                seen.add((str(who.run), who.host, who.pid))
                yield str(who.run), who.host, who.pid, group

    def merged(self) -> Iterator[dict[str, Any]]:
        """Yield one merged dict per capture: finished ones as their shard is read, open ones at the end."""
        pending: dict[str, dict[str, Any]] = {}
        finished: set[str] = set()
        for shard in self.shards():
            yield from self._merge_shard(shard, pending, finished)
        yield from self._still_open(pending, finished)

    def _merge_shard(self, shard: Path, pending: dict[str, dict[str, Any]],
                    finished: set[str]) -> Iterator[dict[str, Any]]:
        """Yield the captures ``shard`` finishes, as :meth:`merged` does; a step of it, for callers that skip shards.

        ``pending``: the captures started in the shards read before and not finished yet, by id
        (a record of this shard that finishes one completes it); this shard's unfinished ones are
        added to it. ``finished``: the ids of the captures finished so far, this shard's added.
        A caller that takes a shard's captures from elsewhere adds their ids to ``finished``.

        Records are keyed by identity: a capture is its run, host, pid and capture id, and capture
        ids are 48 random bits, so within a folder the id stands for the rest. A capture an earlier
        shard finished is a repeat (a copy of a shard, or one synced twice): left out, and the
        shard named in :attr:`duplicates` when it holds nothing else, else counted in
        :attr:`repeated`. A capture naming a trace file an earlier capture names is left out
        too, named in :attr:`repeated` (its events would count twice).
        """
        repeats = [0]
        yielded = 0
        for record in self._merge(self._shard_lines(shard, self.lean), pending, finished, repeats):
            if self.unique_files and not self._first_to_name(shard.name, record):
                continue
            yielded += 1
            yield record
        self._tell_repeats(shard.name, repeats[0], yielded)

    def _tell_repeats(self, name: str, repeats: int, kept: int) -> None:
        """Name a shard whose captures were all read before, or count the repeats it held."""
        if not repeats:
            return
        if kept:
            self.repeated.append(f"{name}: {repeats} record(s) of captures another shard holds, ignored")
        else:
            self.duplicates.append(name)

    def _first_to_name(self, name: str, record: dict[str, Any]) -> bool:
        """Return whether ``record`` names no trace file an earlier capture names (else it is noted as a repeat)."""
        files = record.get("files")
        if type(files) is not list or not files or record.get("kind") == "engine":
            # An engine's record lists what its output folder holds, which a re-run of the same step shares:
            # naming an earlier capture's file there is no repeat.
            return True
        key = record.get("capture")
        key = key if type(key) is str else ""
        named = self._named
        paths: list[str] = []
        for entry in files:
            path = entry.get("path") if type(entry) is dict else entry
            if type(path) is str:
                paths.append(path)
        for path in paths:
            other = named.get(path)
            if other is not None and other != key:
                self.repeated.append(f"{name}: capture {key or '(no id)'} names {path}, which capture "
                                     f"{other or '(no id)'} names already: a damaged entry, not counted twice")
                return False
        for path in paths:
            named[path] = key
        return True

    @staticmethod
    def _still_open(pending: dict[str, dict[str, Any]], finished: set[str]) -> Iterator[dict[str, Any]]:
        """Yield the captures of ``pending`` that no shard finished, with status ``open`` (see :meth:`_merge_shard`)."""
        for key, record in pending.items():
            if key not in finished:
                record["status"] = "open"
                yield record

    @staticmethod
    def _merge_records(records: Iterable[dict[str, Any]], pending: dict[str, dict[str, Any]],
                      finished: set[str]) -> Iterator[dict[str, Any]]:
        """Yield the captures ``records`` (one shard's, in order) finish, as :meth:`_merge_shard` does.

        Those without a capture id come first, as read; then the others, each where its last record was.
        """
        return ManifestReader._merge(records, pending, finished)

    @staticmethod
    def _merge(records: Iterable[dict[str, Any]], pending: dict[str, dict[str, Any]],
               finished: set[str], repeats: list[int] | None = None) -> Iterator[dict[str, Any]]:
        """Yield the captures one shard finishes, merging in ``pending``; add its unfinished ones to ``pending``.

        A record of a capture an earlier shard finished (in ``finished``, not this shard's) is
        left out, counted in ``repeats[0]`` when given.
        """
        waiting: dict[str, dict[str, Any]] = {}
        # A capture may be finished more than once (an engine's late answer rewrites its
        # record): the shard's last word wins, so finished records are yielded at its end.
        done: dict[str, dict[str, Any]] = {}
        for record in records:
            key = record.get("capture")
            key = key if type(key) is str else ""
            if key and key in finished and key not in done and key not in waiting:
                if repeats is not None:
                    repeats[0] += 1
                continue
            event = record.pop("event", None)
            if event == "started" and key:
                entry = waiting.get(key)
                if entry is None:
                    waiting[key] = record
                else:
                    entry.update(record)
                continue
            entry = None
            if key:  # the emptiness tests skip lookups in the common lean case (nothing waits)
                if waiting:
                    entry = waiting.pop(key, None)
                if entry is None and done:
                    entry = done.pop(key, None)
                if entry is None and pending:
                    entry = pending.pop(key, None)
            if entry is not None:
                entry.update(record)
                record = entry
            record.setdefault("status", "open")
            if key:
                finished.add(key)
                done[key] = record
            else:
                yield record
        yield from done.values()
        pending.update(waiting)

    def __iter__(self) -> Iterator[CaptureRecord]:
        return map(CaptureRecord, self.merged())


def repeats_text(reader: ManifestReader) -> list[str]:
    """Return the lines that say what ``reader`` left out as repeats (duplicate shards, files named twice)."""
    lines = []
    if reader.duplicates:
        count = len(reader.duplicates)
        lines.append(f"{count} duplicate shard{'s' if count > 1 else ''} ignored: {', '.join(reader.duplicates)} "
                     "(every capture in it is read already from another shard)")
    lines += reader.repeated
    return lines


def in_groups(record: CaptureRecord, groups: Collection[str]) -> bool:
    """Return whether ``record`` was made by a process of one of ``groups``.

    ``driver`` stands for every process outside a worker group (the driver, in a job with groups).
    """
    return (record.group or DRIVER) in groups


def drivers(records: Iterable[CaptureRecord]) -> set[tuple[str, ...]]:
    """Return the process keys (:attr:`CaptureRecord.process`) of the drivers among ``records``.

    A driver is a process whose records name the group ``driver``, or, in a run where some
    process belongs to a worker group, the one process of that run that belongs to none (the
    process that registered the groups). Where a grouped run has several processes outside
    every group, none of them is taken for the driver.
    """
    found: set[tuple[str, ...]] = set()
    grouped: set[str] = set()
    ungrouped: dict[str, set[tuple[str, ...]]] = {}
    for record in records:
        if record.is_engine:
            continue
        group = record.group
        if group == DRIVER:
            found.add(record.process)
        elif group is None:
            ungrouped.setdefault(record.run or "", set()).add(record.process)
        else:
            grouped.add(record.run or "")
    for run in grouped:
        alone = ungrouped.get(run, set())
        if len(alone) == 1:
            found |= alone
    return found


def process_names(records: Iterable[CaptureRecord],
                  driver: Collection[tuple[str, ...]] | None = None) -> dict[tuple[str, ...], str]:
    """Return a distinct row name per process of ``records`` (keys: :attr:`CaptureRecord.process`), in row order.

    ``driver``: the driver processes, found with :func:`drivers` over every record of the run
    (pass it when ``records`` are a filtered part of it); by default found among ``records``.

    Rows: the driver first (``driver``), then worker processes by group and rank (``actor rank 0``,
    or ``rank 0`` outside any group), then engine replicas (``vllm replica 1``). A rank number
    alone never merges two processes: where two would share a name (a rollout actor and a trainer
    both ``rank 0`` without groups), the roles the process ran are added (``rank 0 (rollout)``),
    then ``host:pid``; with several runs, the run id.
    """
    records = list(records)
    if driver is None:
        driver = drivers(records)
    base: dict[tuple[str, ...], str] = {}
    order: dict[tuple[str, ...], tuple[Any, ...]] = {}
    roles: dict[tuple[str, ...], list[str]] = {}
    runs: set[str] = set()
    for record in records:
        key = record.process
        if key not in base:
            base[key] = DRIVER if key in driver else record.who
            order[key] = _row_order(record, key in driver)
        else:
            order[key] = min(order[key], _row_order(record, key in driver))
        seen = roles.setdefault(key, [])
        name = record.role_name
        if name not in seen:
            seen.append(name)
        runs.add(record.run or "")
    names = dict(base)
    for step in ("roles", "host"):
        count: dict[tuple[str, str], int] = {}
        for key, name in names.items():  # runs are told apart below
            count[name, key[-1]] = count.get((name, key[-1]), 0) + 1
        for key, name in names.items():
            if count[name, key[-1]] < 2 or key[0] != "process":
                continue
            if step == "roles":
                names[key] = f"{name} ({'+'.join(roles[key])})"
            else:
                names[key] = f"{name} {key[1]}:{key[2]}"
    if len(runs) > 1:
        names = {key: f"{name} · run {key[-1]}" for key, name in names.items()}
    return {key: names[key] for key in sorted(names, key=order.__getitem__)}


def _row_order(record: CaptureRecord, driver: bool) -> tuple[Any, ...]:
    if driver:
        return (0, "", -1, record.run or "", record.begin)
    if record.is_engine:
        return (2, record.engine or "", -1 if record.replica is None else record.replica, record.run or "",
                record.begin)
    return (1, record.group or "", -1 if record.rank is None else record.rank, record.run or "", record.begin)


def read(save_path: str | os.PathLike[str], run: str | None = None) -> list[CaptureRecord]:
    """Return one typed record per capture of ``save_path`` (of ``run`` only, when given), by start time."""
    records = list(ManifestReader(save_path, run))
    records.sort(key=lambda r: (r.begin, -1 if r.rank is None else r.rank))
    return records


def runs(records: Iterator[CaptureRecord] | list[CaptureRecord]) -> list[str]:
    """Return the run ids of ``records``, oldest first (by their earliest capture)."""
    first: dict[str, float] = {}
    for record in records:
        if record.run is not None:
            begin = record.begin
            if record.run not in first or begin < first[record.run]:
                first[record.run] = begin
    return sorted(first, key=lambda r: (first[r], r))


def latest_run(save_path: str | os.PathLike[str]) -> str | None:
    """Return the id of the run under ``save_path`` that started last, or ``None`` when there is none.

    Reads only the first readable line of each shard (a process's first record).
    """
    first: dict[str, float] = {}
    reader = ManifestReader(save_path)
    for shard in reader.shards():
        for record in reader._shard_lines(shard):
            run = record.get("run")
            when = _float(record.get("start_time")) or _float(record.get("time")) or 0.0
            if type(run) is str and (run not in first or when < first[run]):
                first[run] = when
            break
    return max(first, key=lambda r: (first[r], r)) if first else None

