"""Merge the traces of one step (every rank, role and engine replica) into one Chrome trace.

Clock alignment. torch.profiler (and engines built on it) write event ``ts`` in microseconds
relative to the top-level ``baseTimeNanoseconds``, so ``baseTimeNanoseconds / 1000 + ts`` is
Unix wall-clock time in microseconds. A trace without that key whose times are already Unix
microseconds (larger than 1e15) is taken as is. Any other trace is placed so that its first
event starts at its capture's manifest ``start_time`` (approximate: marked in the output).
The merged file's ``baseTimeNanoseconds`` is the whole second at or before the earliest
capture start, and its ``ts`` are relative to it, so readers of either convention agree.

Each (capture, original process) becomes one process of the merged trace, named after the
capture (``rank 0 · actor_update``); thread ids become integers with ``thread_name``
metadata; flow and async ids are made unique per capture. Inputs are streamed event by event
(:mod:`profctx._tracejson`), so memory stays near one read buffer whatever the inputs' size.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import json
import math
import os
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, TextIO

from ._layout import temporary
from ._tracejson import EVENTS, TraceFormatError, TraceStream, header, is_trace_file

#: Event phases whose ``id`` pairs events (flows, async, object events): made unique per capture.
_ID_PHASES: Final = frozenset("stfbenSTFpNODP")
#: Bits kept from an input's integer id; the capture's index fills the bits above.
_ID_BITS: Final = 40
#: A ``ts`` above this is already Unix time in microseconds (after September 2001).
_EPOCH_US: Final = 1e15
#: Metadata events replaced by the merged trace's own names.
_RENAMED: Final = frozenset({"process_name", "process_labels", "process_sort_index", "thread_name"})
#: Key, among an input's pids, of the process its pseudo-processes fold into.
_MAIN: Final = "\0main"
#: Events written per ``write`` call.
_BATCH: Final = 2000


@dataclass
class MergeInput:
    """One trace file of one capture, with the label its processes get."""

    path: Path
    record: Mapping[str, Any]
    label: str
    order: tuple[Any, ...]


@dataclass
class MergeResult:
    """What a merge wrote: counts, and the problems met (a file missing or cut short)."""

    output: Path
    inputs: int = 0
    events: int = 0
    processes: int = 0
    problems: list[str] = field(default_factory=list)
    approximate: list[str] = field(default_factory=list)


def label(record: Mapping[str, Any]) -> str:
    """Return the process label of a capture: ``rank 0 · actor_update`` or ``vllm replica 1 · rollout``."""
    role = record.get("role") or "step"
    steps = record.get("steps") or []
    span = f" · steps {steps[0]}-{steps[-1]}" if len(steps) > 1 else ""
    if record.get("kind") == "engine":
        who = f"{record.get('engine') or 'engine'} replica {record.get('replica', '?')}"
    else:
        who = f"rank {record.get('rank', '?')}"
    return f"{who} · {role}{span}"


def plan(save_path: Path, records: Iterable[Mapping[str, Any]], step: int) -> tuple[list[MergeInput], list[str]]:
    """Return the trace files of captures covering ``step``, in display order, and notes on files left out.

    Engine captures usually list no files (the engine writes them itself, later): their trace
    files are found in the capture's folder, less any file another capture lists.
    """
    records = list(records)
    listed = {str(f.get("path")) for r in records for f in (r.get("files") or ())}
    inputs: list[MergeInput] = []
    notes: list[str] = []
    for record in records:
        steps = record.get("steps") or ([record["step"]] if record.get("step") is not None else [])
        if step not in steps:
            continue
        engine = record.get("kind") == "engine"
        paths = [str(entry.get("path", "")) for entry in record.get("files") or ()]
        if engine and not paths and record.get("folder"):
            paths = _engine_files(save_path, str(record["folder"]), listed)
        for rel in paths:
            if not is_trace_file(rel):
                notes.append(f"{rel}: not a Chrome trace, left out")
                continue
            number = record.get("replica" if engine else "rank")
            order = (1 if engine else 0, number if isinstance(number, int) else 0,
                     float(record.get("start_time") or 0.0), rel)
            inputs.append(MergeInput(save_path / rel, record, label(record), order))
    inputs.sort(key=lambda item: item.order)
    return inputs, notes


def _engine_files(save_path: Path, folder: str, listed: set[str]) -> list[str]:
    root = save_path / folder
    if not root.is_dir():
        return []
    found = []
    for path in sorted(root.rglob("*.json*")):
        rel = path.relative_to(save_path).as_posix() if path.is_relative_to(save_path) else str(path)
        if path.is_file() and is_trace_file(rel) and rel not in listed and not path.name.startswith((".", "merged.")):
            found.append(rel)
    return found


def merge(
    inputs: Sequence[MergeInput],
    output: Path,
    *,
    step: int | None = None,
    compress_level: int = 1,
    progress: Callable[[int, int], None] | None = None,
) -> MergeResult:
    """Write one ``.json.gz`` (or ``.json``) Chrome trace holding every event of ``inputs``.

    The file is written under a temporary name and renamed. A missing or damaged input is
    reported in :attr:`MergeResult.problems` (events read before the damage are kept).
    ``progress(done_bytes, total_bytes)`` is called as input bytes are consumed.
    """
    result = MergeResult(output=output)
    starts = [float(i.record.get("start_time") or 0.0) for i in inputs]
    known = [s for s in starts if s > 0]
    out_base_ns = math.floor(min(known)) * 1_000_000_000 if known else 0
    total = sum(_size(i.path) for i in inputs)
    done = 0
    processes: list[_Process] = []
    sources: list[dict[str, Any]] = []
    tmp = temporary(output)
    output.parent.mkdir(parents=True, exist_ok=True)
    raw = open(tmp, "wb")  # noqa: SIM115 - closed below, in every path
    try:
        sink: Any = (
            gzip.GzipFile(fileobj=raw, mode="wb", compresslevel=compress_level, mtime=0)
            if output.name.endswith(".gz") else raw
        )
        with io.TextIOWrapper(sink, encoding="utf-8") as out:
            head = {"schemaVersion": 1, "displayTimeUnit": "ms", "baseTimeNanoseconds": out_base_ns}
            out.write(json.dumps(head)[:-1] + ',\n"traceEvents":[\n')
            writer = _Writer(out)
            for index, item in enumerate(inputs):

                def report(consumed: int, base: int = done) -> None:
                    if progress:
                        progress(base + consumed, total)

                sources.append(_merge_one(index, item, out_base_ns, writer, processes, result, report))
                done += _size(item.path)
                if progress:
                    progress(done, total)
            for proc in processes:
                for event in proc.metadata():
                    writer.add(event)
            writer.flush()
            tail = {"profctx": {"merged": True, "step": step, "captures": sources}}
            out.write("\n]," + json.dumps(tail, default=str)[1:] + "\n")
        raw.close()
        os.replace(tmp, output)
    except BaseException:
        raw.close()
        with contextlib.suppress(OSError):
            tmp.unlink()
        raise
    result.inputs = len(inputs)
    result.events = writer.count
    result.processes = len(processes)
    return result


class _Writer:
    """Join events into large writes; count them."""

    def __init__(self, out: TextIO) -> None:
        self.out = out
        self.batch: list[str] = []
        self.count = 0

    def add(self, event: Mapping[str, Any]) -> None:
        self.batch.append(json.dumps(event, separators=(",", ":"), default=str))
        if len(self.batch) >= _BATCH:
            self.flush()

    def flush(self) -> None:
        if not self.batch:
            return
        self.out.write((",\n" if self.count else "") + ",\n".join(self.batch))
        self.count += len(self.batch)
        self.batch.clear()


class _Process:
    """One process of the merged trace: a capture's original process under a new pid."""

    def __init__(self, pid: int, label: str, labels: str) -> None:
        self.pid = pid
        self.label = label
        self.labels = labels
        self.original_name: str | None = None
        self.threads: dict[Any, int] = {}
        self.thread_names: dict[int, str] = {}

    def tid(self, original: Any) -> int:
        """Return the merged integer tid for ``original``, naming string tids after themselves."""
        known = self.threads.get(original)
        if known is not None:
            return known
        if isinstance(original, int) and not isinstance(original, bool):
            new = original
        else:
            new = 1_000_000_000 + len(self.threads)
            parts = original if isinstance(original, tuple) else (original,)
            self.thread_names.setdefault(new, " ".join(str(p) for p in parts if p) or "events")
        self.threads[original] = new
        return new

    def metadata(self) -> list[dict[str, Any]]:
        """Return the ``M`` events naming this process and each of its threads."""
        name = self.label
        if self.original_name and self.original_name not in ("python", ""):
            name = f"{self.label} · {self.original_name}"
        events: list[dict[str, Any]] = [
            {"ph": "M", "name": "process_name", "pid": self.pid, "tid": 0, "ts": 0, "args": {"name": name}},
            {"ph": "M", "name": "process_labels", "pid": self.pid, "tid": 0, "ts": 0, "args": {"labels": self.labels}},
            {"ph": "M", "name": "process_sort_index", "pid": self.pid, "tid": 0, "ts": 0,
             "args": {"sort_index": self.pid}},
        ]
        for tid in sorted(set(self.threads.values())):
            tname = self.thread_names.get(tid, f"thread {tid}")
            events.append({"ph": "M", "name": "thread_name", "pid": self.pid, "tid": tid, "ts": 0,
                           "args": {"name": tname}})
        return events


def _merge_one(
    index: int,
    item: MergeInput,
    out_base_ns: int,
    writer: _Writer,
    processes: list[_Process],
    result: MergeResult,
    progress: Callable[[int], None],
) -> dict[str, Any]:
    record = item.record
    source: dict[str, Any] = {
        key: record.get(key)
        for key in ("capture", "run", "kind", "rank", "world_size", "host", "pid", "steps", "role",
                    "engine", "version", "replica", "backend", "start_time", "end_time")
        if record.get(key) is not None
    }
    source["file"] = item.path.name
    source["label"] = item.label
    if not item.path.is_file():
        result.problems.append(f"{item.path}: missing")
        source["error"] = "missing"
        return source
    identity = f"run {record.get('run')}, rank {record.get('rank')} of {record.get('world_size')}, " \
               f"host {record.get('host')}, pid {record.get('pid')}, capture {record.get('capture')}"
    pids: dict[Any, _Process] = {}
    shift_us: float | None = None
    meta: dict[str, Any] = {}
    count = seen = 0
    try:
        with TraceStream(item.path) as stream:
            for key, value in stream.items():
                if key != EVENTS:
                    meta[key] = value
                    continue
                seen += 1
                if seen % 20000 == 0:
                    progress(stream.consumed)
                if not isinstance(value, dict) or "ph" not in value:
                    continue
                if shift_us is None:
                    shift_us = _shift(item, meta, out_base_ns, result)
                if _remap(value, index, shift_us, pids, processes, item.label, identity):
                    writer.add(value)
                    count += 1
    except (TraceFormatError, OSError) as exc:
        result.problems.append(str(exc))
        source["error"] = str(exc)
    for key in ("profctx", "distributedInfo"):
        if key in meta:
            source[f"trace_{key}"] = meta[key]
    source["pids"] = [p.pid for p in pids.values()]
    source["events"] = count
    return source


def _shift(item: MergeInput, meta: dict[str, Any], out_base_ns: int, result: MergeResult) -> float:
    """Return what to add to an input's ``ts`` to get the merged file's ``ts``."""
    base = meta.get("baseTimeNanoseconds")
    if not isinstance(base, int):
        # Metadata may follow the events: read the file's top level once more to find out.
        meta_full, first = header(item.path)
        base = meta_full.get("baseTimeNanoseconds")
        if not isinstance(base, int):
            if first is not None and first > _EPOCH_US:
                base = 0
            else:
                start = float(item.record.get("start_time") or 0.0)
                result.approximate.append(str(item.path))
                return start * 1e6 - (first or 0.0) - out_base_ns / 1000
    return (base - out_base_ns) / 1000


def _remap(
    event: dict[str, Any],
    index: int,
    shift_us: float,
    pids: dict[Any, _Process],
    processes: list[_Process],
    label: str,
    identity: str,
) -> bool:
    """Rewrite ``event`` in place for the merged trace; return whether to keep it."""
    original = event.get("pid", "")
    tid_key = event.get("tid", 0)
    if isinstance(original, int) and not isinstance(original, bool):
        key: Any = original
    else:
        # torch's string pseudo-processes ("Spans", "Traces", "") become threads of the main process.
        key = _MAIN
        tid_key = (str(original), str(tid_key))
    proc = pids.get(key)
    if proc is None:
        main = pids.get(_MAIN)
        if main is not None and key != _MAIN and not any(isinstance(k, int) for k in pids):
            proc = main  # the first real pid adopts the process opened for pseudo-processes
        else:
            proc = _Process(len(processes) + 1, label, identity)
            processes.append(proc)
        pids[key] = proc
        if isinstance(key, int):
            pids.setdefault(_MAIN, proc)
    event["pid"] = proc.pid
    phase = event.get("ph")
    if phase == "M" and event.get("name") in _RENAMED:
        # Names are re-emitted at the end of the merged trace, under the capture's label.
        args = event.get("args") or {}
        if event["name"] == "process_name" and key is not _MAIN:
            proc.original_name = str(args.get("name", ""))
        elif event["name"] == "thread_name":
            proc.thread_names[proc.tid(tid_key)] = str(args.get("name", ""))
        return False
    if "tid" in event:
        event["tid"] = proc.tid(tid_key)
    ts = event.get("ts")
    if isinstance(ts, (int, float)) and not isinstance(ts, bool):
        event["ts"] = round(ts + shift_us, 3) if phase != "M" else 0
    if phase in _ID_PHASES:
        for id_key in ("id", "bind_id"):
            value = event.get(id_key)
            if isinstance(value, int) and not isinstance(value, bool):
                event[id_key] = (index << _ID_BITS) | (value & ((1 << _ID_BITS) - 1))
            elif isinstance(value, str):
                event[id_key] = f"c{index}:{value}"
    return True


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0
