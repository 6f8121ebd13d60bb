"""Read a run's manifest: one typed record per capture, streamed shard by shard.

The writer (:mod:`profctx._manifest`) appends JSON lines to one shard per process under
``{save_path}/.profctx/``: a ``started`` record, then a ``finished`` record of the same
``capture`` id whose ``status`` is ``ok``, ``failed``, ``skipped`` or ``interrupted``. A capture
with a ``started`` record and no ``finished`` one reads as ``open`` (still running, or its
process died).

The reader is lenient: a line that does not parse (a write cut by a crash, garbage) is
listed in :attr:`ManifestReader.damaged` and skipped; a value of the wrong type reads as
``None`` (or empty); unknown keys are kept in :attr:`CaptureRecord.extra`. Nothing a shard
holds makes it raise; an unreadable shard is listed as damaged too.
"""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from ._layout import MANIFEST_DIR, safe

try:  # orjson parses a manifest line about 4x faster; the stdlib parser is the fallback (core needs no extra).
    import orjson as _orjson

    _loads: Callable[[bytes], Any] = _orjson.loads
    _DecodeError: tuple[type[Exception], ...] = (_orjson.JSONDecodeError, UnicodeDecodeError)
except ImportError:  # pragma: no cover - exercised when the extra is absent
    _loads = json.loads
    _DecodeError = (json.JSONDecodeError, UnicodeDecodeError)

#: Highest record version this reader understands; newer records are skipped.
VERSION: Final = 1
#: Statuses the writer emits. Other strings are kept as given.
STATUSES: Final = ("ok", "failed", "skipped", "open", "interrupted")

#: Keys the typed record holds as fields; every other key goes to ``extra``.
_FIELDS: Final = frozenset({
    "capture", "run", "status", "kind", "steps", "step", "last_step", "role", "rank", "world_size", "host",
    "pid", "group", "seq", "backend", "engine", "version", "replica", "folder", "start_time", "end_time",
    "duration_s", "blocked_s", "write_s", "files", "bytes", "ranges", "error", "reason", "notes", "shard",
    "event", "time",
})


@dataclass(frozen=True)
class TraceFile:
    """One file a capture wrote: ``path`` relative to ``save_path`` (or absolute), size in bytes."""

    path: str
    bytes: int | None


@dataclass(frozen=True, eq=False)
class CaptureRecord:
    """One capture, its ``started`` and ``finished`` records merged (later keys win).

    Times are Unix seconds. ``steps`` is empty when the record named none. ``extra`` holds the
    keys this reader does not type (``owner``, ``thread``, ``v``...), as read.
    """

    capture: str
    status: str
    shard: str
    run: str | None = None
    kind: str | None = None
    steps: tuple[int, ...] = ()
    role: str | None = None
    rank: int | None = None
    world_size: int | None = None
    host: str | None = None
    pid: int | None = None
    group: str | None = None
    seq: int | None = None
    backend: str | None = None
    engine: str | None = None
    version: str | None = None
    replica: int | None = None
    folder: str | None = None
    start_time: float | None = None
    end_time: float | None = None
    time: float | None = None
    duration_s: float | None = None
    blocked_s: float | None = None
    write_s: float | None = None
    files: tuple[TraceFile, ...] = ()
    bytes: int | None = None
    ranges: int | None = None
    error: str | None = None
    reason: str | None = None
    notes: tuple[str, ...] = ()
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def step(self) -> int | None:
        """The first step the capture covers."""
        return self.steps[0] if self.steps else None

    @property
    def last_step(self) -> int | None:
        """The last step the capture covers."""
        return self.steps[-1] if self.steps else None

    @property
    def role_name(self) -> str:
        """The last part of the role path (``actor_update`` of ``train/actor_update``), or ``step``."""
        return self.role.rsplit("/", 1)[-1] if self.role else "step"

    @property
    def is_engine(self) -> bool:
        """Whether an engine adapter (vLLM, SGLang...) recorded the capture."""
        return self.kind == "engine"

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
            return f"{self.engine or 'engine'} replica {'?' if self.replica is None else self.replica}"
        rank = "?" if self.rank is None else self.rank
        return f"{self.group} rank {rank}" if self.group else f"rank {rank}"

    def as_dict(self) -> dict[str, Any]:
        """Return the record as the JSON-able dict the writer's keys name (``None`` values left out)."""
        out: dict[str, Any] = dict(self.extra)
        for name in _DICT_ORDER:
            value = getattr(self, name)
            if value is None:
                continue
            if name == "steps":
                value = list(value)
                if value:
                    out["step"], out["last_step"] = value[0], value[-1]
            elif name == "files":
                value = [{"path": f.path, "bytes": f.bytes} for f in value]
            elif name == "notes":
                value = list(value)
            out[name] = value
        return out


_DICT_ORDER: Final = tuple(n for n in CaptureRecord.__dataclass_fields__ if n != "extra")


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


def _steps(record: Mapping[str, Any]) -> tuple[int, ...]:
    steps = record.get("steps")
    if type(steps) is list:
        return tuple(s for s in steps if type(s) is int)
    step = record.get("step")
    return (step,) if type(step) is int else ()


def _files(value: Any) -> tuple[TraceFile, ...]:
    if type(value) is not list:
        return ()
    out = []
    for entry in value:
        if type(entry) is dict and type(entry.get("path")) is str:
            out.append(TraceFile(entry["path"], _int(entry.get("bytes"))))
        elif type(entry) is str:
            out.append(TraceFile(entry, None))
    return tuple(out)


def _notes(value: Any) -> tuple[str, ...]:
    if type(value) is list:
        return tuple(str(n) for n in value)
    return (value,) if type(value) is str else ()


def to_record(merged: Mapping[str, Any]) -> CaptureRecord:
    """Return the typed record of one merged capture dict; wrong-typed values read as ``None``."""
    get = merged.get
    status = get("status")
    extra = {k: v for k, v in merged.items() if k not in _FIELDS}
    return CaptureRecord(
        capture=_str(get("capture")) or "",
        status=status if type(status) is str else "open",
        shard=_str(get("shard")) or "",
        run=_str(get("run")),
        kind=_str(get("kind")),
        steps=_steps(merged),
        role=_str(get("role")) or None,
        rank=_int(get("rank")),
        world_size=_int(get("world_size")),
        host=_str(get("host")),
        pid=_int(get("pid")),
        group=_str(get("group")) or None,
        seq=_int(get("seq")),
        backend=_str(get("backend")),
        engine=_str(get("engine")),
        version=_str(get("version")),
        replica=_int(get("replica")),
        folder=_str(get("folder")),
        start_time=_float(get("start_time")),
        end_time=_float(get("end_time")),
        time=_float(get("time")),
        duration_s=_float(get("duration_s")),
        blocked_s=_float(get("blocked_s")),
        write_s=_float(get("write_s")),
        files=_files(get("files")),
        bytes=_int(get("bytes")),
        ranges=_int(get("ranges")),
        error=_str(get("error")),
        reason=_str(get("reason")),
        notes=_notes(get("notes")),
        extra=extra,
    )


class ManifestReader:
    """Iterate over the captures of ``save_path`` (of one ``run``, or of all when ``None``).

    Iterating yields merged raw dicts with :meth:`merged` or typed records with ``iter()``;
    shards are read one at a time, so memory holds one shard's text and its unfinished
    captures. After iterating, :attr:`damaged` lists ``shard:line`` of every line skipped.
    Records of a newer format version are skipped too, counted in :attr:`newer`.
    """

    def __init__(self, save_path: str | os.PathLike[str], run: str | None = None) -> None:
        self.save_path = Path(save_path)
        self.run = run
        self.damaged: list[str] = []
        self.newer = 0

    def shards(self) -> list[Path]:
        """Return the shard files, those of other runs left out by name when a run is given."""
        folder = self.save_path / MANIFEST_DIR
        try:
            names = sorted(os.listdir(folder))
        except OSError:
            return []
        prefix = None if self.run is None else f"{safe(self.run)}."
        return [folder / n for n in names
                if n.endswith(".jsonl") and (prefix is None or n.startswith(prefix))]

    def lines(self) -> Iterator[dict[str, Any]]:
        """Yield every raw record of every shard, with its ``shard`` name added."""
        for shard in self.shards():
            yield from self._shard_lines(shard)

    def _shard_lines(self, shard: Path) -> Iterator[dict[str, Any]]:
        try:
            data = shard.read_bytes()
        except OSError as exc:
            self.damaged.append(f"{shard.name}: unreadable ({exc})")
            return
        name = shard.name
        run = self.run
        for number, line in enumerate(data.splitlines(), 1):
            if not line.strip():
                continue
            try:
                record = _loads(line)
            except _DecodeError:
                self.damaged.append(f"{name}:{number}")
                continue
            if type(record) is not dict:
                self.damaged.append(f"{name}:{number}")
                continue
            version = record.get("v", 0)
            if type(version) is not int:
                version = 0
            if version > VERSION:
                self.newer += 1
                continue
            if run is not None and record.get("run") != run:
                continue
            record["shard"] = name
            yield record

    def merged(self) -> Iterator[dict[str, Any]]:
        """Yield one merged dict per capture: finished ones as their shard is read, open ones at the end."""
        pending: dict[str, dict[str, Any]] = {}
        finished: set[str] = set()
        for shard in self.shards():
            waiting: dict[str, dict[str, Any]] = {}
            for record in self._shard_lines(shard):
                key = record.get("capture")
                key = key if type(key) is str else ""
                event = record.pop("event", None)
                if event == "started" and key:
                    entry = waiting.get(key)
                    if entry is None:
                        waiting[key] = record
                    else:
                        entry.update(record)
                    continue
                entry = waiting.pop(key, None) or pending.pop(key, None) if key else None
                if entry is not None:
                    entry.update(record)
                    record = entry
                record.setdefault("status", "open")
                if key:
                    finished.add(key)
                yield record
            pending.update(waiting)
        for key, record in pending.items():
            if key not in finished:
                record["status"] = "open"
                yield record

    def __iter__(self) -> Iterator[CaptureRecord]:
        for merged in self.merged():
            yield to_record(merged)


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

