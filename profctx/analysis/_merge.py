"""Merge the traces of a run (some steps or all; every rank, role and engine replica) into one Chrome trace.

Clock alignment. torch.profiler (and engines built on it) write event ``ts`` in microseconds
relative to the top-level ``baseTimeNanoseconds``, so ``baseTimeNanoseconds / 1000 + ts`` is
Unix wall-clock time in microseconds. A trace without that key whose times are already Unix
microseconds (larger than 1e15) is taken as is. Any other trace is placed so that its first
event starts at its capture's manifest ``start_time`` (approximate: marked in the output).
The merged file's ``baseTimeNanoseconds`` is the whole second at or before the earliest
capture start, and its ``ts`` are relative to it, so readers of either convention agree.

Processes. One process of the merged trace per process of the job: a worker (run, host, pid,
group and rank) or an engine replica, named as :func:`profctx.manifest.process_names` names
rows: ``driver``, ``actor rank 0``, ``rank 0``, ``vllm replica 1`` (with the run id when several
runs are merged, the roles or host:pid when two would share a name).
Every capture of that process lands in it; a ``profctx captures`` thread holds one span per
capture (``step 3 · actor_update``), and a first ``steps`` process holds one span per step.
Flow and async ids are made unique per capture. Inputs are streamed in batches
(:mod:`profctx.analysis._tracejson`), so memory stays near one read buffer whatever the inputs' size.
"""

from __future__ import annotations

import contextlib
import gc
import json
import math
import os
import queue
import threading
from collections.abc import Callable, Collection, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from operator import attrgetter, itemgetter
from pathlib import Path
from typing import IO, Any, Final

from ..core._plan import STEP_MARKER_PREFIX
from ..manifest import DRIVER, CaptureRecord, process_names
from ..util import _codec
from ..util._files import sweep, temporary_name
from ..util._fs import Folder, walk
from ..util._untrusted import Budget, UnsafeFileError, files_under, resolve
from ._tracedecode import Heads, heads_or_values, raws
from ._tracejson import EVENTS, TraceFormatError, TraceStream, header, is_trace_file

try:
    import orjson as _orjson

    #: Whether a batch the reader parsed in one slice holds only finite numbers (orjson refuses
    #: ``NaN``, ``Infinity`` and numbers beyond a double; the standard library reads them).
    _FINITE_BATCHES = True
    _loads_values: Callable[[bytes], Any] = _orjson.loads

    def _dumps(value: Any) -> bytes:
        try:
            return _orjson.dumps(value, default=str)
        except TypeError:  # a string orjson refuses (lone surrogate from a damaged file)
            return json.dumps(value, default=str, separators=(",", ":")).encode()
except ImportError:  # pragma: no cover - exercised when the extra is absent
    _FINITE_BATCHES = False
    _loads_values = json.loads

    def _dumps(value: Any) -> bytes:
        return json.dumps(value, default=str, separators=(",", ":")).encode()

#: Event phases whose ``id`` pairs events (flows, async, object events): made unique per capture.
_ID_PHASES: Final = frozenset("stfbenSTFpNODP")
#: Bits kept from an input's integer id; the capture's index fills the bits above.
_ID_BITS: Final = 40
_ID_MASK: Final = (1 << _ID_BITS) - 1
#: A ``ts`` above this is already Unix time in microseconds (after September 2001).
_EPOCH_US: Final = 1e15
#: Metadata events replaced by the merged trace's own names.
_RENAMED: Final = frozenset({"process_name", "process_labels", "process_sort_index", "thread_name",
                             "thread_sort_index"})
#: How Ray's process title of a worker ends while it runs profctx's control call (``ActorHandle.__ray_call__``).
RAY_CONTROL_CALL: Final = ".__ray_call__"
#: Key, among an input's pids, of torch's string pseudo-processes ("Spans", "Traces", "").
_MAIN: Final = "\0main"
#: Thread, in each merged process, holding one span per capture.
CAPTURES_TID: Final = 999_999_000
#: Merged pid of the process holding one span per step.
STEPS_PID: Final = 1
#: First pid given to a merged process whose own pid is taken (above any OS's pid range).
_FRESH_PID: Final = 1 << 30


@dataclass
class MergeInput:
    """One trace file of one capture."""

    path: Path
    record: CaptureRecord
    order: tuple[Any, ...]
    #: The run folder the file must lie in (a manifest is untrusted: see :mod:`profctx.util._untrusted`).
    root: Path | None = None


@dataclass
class MergeResult:
    """What a merge wrote: counts, and the problems met (a file missing or cut short)."""

    output: Path
    inputs: int = 0
    events: int = 0
    processes: int = 0
    steps: list[int] = field(default_factory=list)
    runs: list[str] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)
    approximate: list[str] = field(default_factory=list)
    #: Inputs with events left out because their ``ts`` or ``dur`` is not a finite number.
    dropped: list[str] = field(default_factory=list)
    #: With ``step_markers``: captures whose trace names no step and that cover several steps (not marked).
    unmarked: list[str] = field(default_factory=list)


#: A :class:`~profctx.analysis._tracedecode.Head`'s phase, pid and tid.
_PHASE: Final = attrgetter("ph")
_PID: Final = attrgetter("pid")
_TID: Final = attrgetter("tid")
#: An event's phase, pid and tid (``KeyError`` if one is missing).
_PH_PID_TID: Final = itemgetter("ph", "pid", "tid")


def _process_order(record: CaptureRecord) -> tuple[Any, ...]:
    if record.is_engine:
        return (2, record.engine or "", record.replica if record.replica is not None else -1)
    if record.group == "driver":
        return (0, "", -1)
    return (1, record.group or "", record.rank if record.rank is not None else -1)


def plan(save_path: Path, records: Iterable[CaptureRecord],
         steps: Collection[int] | None = None) -> tuple[list[MergeInput], list[str]]:
    """Return the trace files of captures covering any of ``steps`` (all when ``None``), in display order.

    Also return notes on files left out. Engine captures list exactly the files the engine wrote
    for them; only records of older manifests, which list none, are looked up in the capture's
    folder (less any file another capture lists). A file several records name is merged once, for
    the first of them (in the manifest's order).
    """
    records = list(records)
    listed = {f.path for r in records for f in r.files}
    first: dict[str, float] = {}
    for r in records:
        key = r.run or ""
        first[key] = min(first.get(key, r.begin), r.begin)
    run_order = {run: i for i, run in enumerate(sorted(first, key=lambda x: (first[x], x)))}
    inputs: list[MergeInput] = []
    notes: list[str] = []
    wanted = None if steps is None else set(steps)
    named: set[object] = set()
    for record in records:
        if wanted is not None and not wanted.intersection(record.steps):
            continue
        paths = [f.path for f in record.files]
        if record.is_engine and not record.lists_files and record.folder:
            try:
                paths = _engine_files(save_path, record.folder, listed)
            except UnsafeFileError as exc:
                notes.append(f"{exc}: its traces left out")
                paths = []
        for rel in paths:
            if not is_trace_file(rel):
                notes.append(f"{rel}: not a Chrome trace, left out")
                continue
            known = _file_key(save_path, rel)
            if known in named:
                notes.append(f"{rel}: named by more than one capture record: merged once, for the first")
                continue
            named.add(known)
            order = (run_order.get(record.run or "", 0), _process_order(record), record.begin, rel)
            inputs.append(MergeInput(save_path / rel, record, order, save_path))
    inputs.sort(key=lambda item: item.order)
    return inputs, notes


def _file_key(save_path: Path, rel: str) -> object:
    """Return what a file is known by: its device and inode, else (refused or unseen) its resolved path."""
    try:
        path = resolve(save_path, rel)
    except UnsafeFileError:
        return rel
    try:
        info = os.stat(path, follow_symlinks=False)
    except (OSError, ValueError):
        return os.path.normpath(path)
    return info.st_dev, info.st_ino


def _engine_files(save_path: Path, folder: str, listed: set[str]) -> list[str]:
    return [rel for rel in files_under(save_path, folder)
            if is_trace_file(rel) and rel not in listed and not rel.rpartition("/")[2].startswith((".", "merged."))]


class _Sink:
    """Write bytes to a file, through a gzip stream when the name ends in ``.gz``; count events.

    Compression runs on a thread of its own (zlib releases the GIL), so it overlaps the parsing
    of the next batch; at most a few batches wait in its queue.
    """

    def __init__(self, raw: IO[bytes], gzip_level: int | None) -> None:
        self.raw = raw
        self.zip: Any = _codec.deflater(gzip_level) if gzip_level is not None else None
        self.count = 0
        self.failed: BaseException | None = None
        self.queue: queue.Queue[bytes | None] = queue.Queue(maxsize=4)
        self.thread: threading.Thread | None = None
        if self.zip is not None:
            self.thread = threading.Thread(target=self._drain, name="profctx-merge-gzip", daemon=True)
            self.thread.start()

    def _drain(self) -> None:
        while True:
            data = self.queue.get()
            if data is None:
                return
            if self.failed is None:
                try:
                    self.raw.write(self.zip.compress(data))
                except BaseException as exc:  # noqa: BLE001 - handed to the merging thread
                    self.failed = exc

    def write(self, data: bytes) -> None:
        if self.failed is not None:
            raise self.failed
        if self.thread is not None:
            self.queue.put(data)
        else:
            self.raw.write(data)

    def events(self, events: list[Any]) -> None:
        self.copy(_dumps(events)[1:-1], len(events))  # "[a,b]" -> "a,b": one C call for the whole batch

    def copy(self, body: bytes, count: int) -> None:
        """Write ``count`` events given as their JSON text, separated by commas (no brackets)."""
        if not count:
            return
        self.write(b",\n" + body if self.count else body)
        self.count += count

    def close(self) -> None:
        """Finish the stream (wait for the compressing thread); raise what it met."""
        if self.thread is not None:
            self.queue.put(None)
            self.thread.join()
            self.thread = None
        if self.failed is not None:
            raise self.failed
        if self.zip is not None:
            self.raw.write(self.zip.flush())

    def abort(self) -> None:
        """Stop the compressing thread without finishing the stream."""
        if self.thread is not None:
            self.failed = self.failed or RuntimeError("merge aborted")
            self.queue.put(None)
            self.thread.join()
            self.thread = None


class _Process:
    """One process of the merged trace."""

    def __init__(self, pid: int, record: CaptureRecord, label: str, order: int) -> None:
        self.pid = pid
        self.order = order
        self.record = record
        self.label = label
        self.original_name: str | None = None
        self.threads: dict[Any, int] = {}
        self.thread_names: dict[int, str] = {CAPTURES_TID: "profctx captures"}

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

    def labels(self) -> str:
        r = self.record
        if r.is_engine:
            return f"run {r.run}, {r.engine} {r.version or ''} replica {r.replica}, host {r.host}, pid {r.pid}"
        if self.label.startswith(DRIVER):
            return f"run {r.run}, driver, host {r.host}, pid {r.pid}"
        group = f"group {r.group}, " if r.group else ""
        return f"run {r.run}, {group}rank {r.rank} of {r.world_size}, host {r.host}, pid {r.pid}"

    def metadata(self, name: str) -> list[dict[str, Any]]:
        """Return the ``M`` events naming this process and each of its threads."""
        original = self.original_name
        if original and original.endswith(RAY_CONTROL_CALL):
            # Ray titles a worker by the task it runs: a capture that profctx's control call started
            # would be named after that call, not after the worker (``ray::Trainer``).
            original = original[: -len(RAY_CONTROL_CALL)]
        if original and original not in ("python", ""):
            name = f"{name} · {original}"
        events: list[dict[str, Any]] = [
            {"ph": "M", "name": "process_name", "pid": self.pid, "tid": 0, "ts": 0, "args": {"name": name}},
            {"ph": "M", "name": "process_labels", "pid": self.pid, "tid": 0, "ts": 0,
             "args": {"labels": self.labels()}},
            {"ph": "M", "name": "process_sort_index", "pid": self.pid, "tid": 0, "ts": 0,
             "args": {"sort_index": self.order}},
        ]
        for tid in sorted({*self.threads.values(), CAPTURES_TID}):
            tname = self.thread_names.get(tid, f"thread {tid}")
            events.append({"ph": "M", "name": "thread_name", "pid": self.pid, "tid": tid, "ts": 0,
                           "args": {"name": tname}})
        return events


def merge(
    inputs: Sequence[MergeInput],
    output: Path,
    *,
    steps: Sequence[int] | None = None,
    compress_level: int = 1,
    progress: Callable[[int, int], None] | None = None,
    driver: Collection[tuple[str, ...]] | None = None,
    base_ns: int | None = None,
    first_keys: Mapping[str, Any] | None = None,
    step_markers: bool = False,
    at: Folder | None = None,
    budget: Budget | None = None,
) -> MergeResult:
    """Write one ``.json.gz`` (or ``.json``) Chrome trace holding every event of ``inputs``.

    ``at``: the held folder ``output`` goes into (only ``output``'s name is used then); without
    it ``output``'s folder is walked to (created if missing, the user's path followed).

    ``driver``: the driver processes of the run (see :func:`profctx.manifest.process_names`),
    when ``inputs`` are a filtered part of it.

    The file is written under a temporary name and renamed. A missing or damaged input is
    reported in :attr:`MergeResult.problems` (events read before the damage are kept). Each file
    is written once (one opened again under another name is refused as read already), and all of
    them together inflate at most as a :class:`~profctx.util._untrusted.Budget` allows.
    ``progress(done_bytes, total_bytes)`` is called as input bytes are consumed.

    For a file of a layout that other tools read (:mod:`profctx.analysis._hta`): ``base_ns`` sets the
    clock base (to share one between files), ``first_keys`` are written first in the file, and
    ``step_markers`` leaves out the ``steps`` process and the capture spans, and gives each step
    one ``ProfilerStep#N`` range, as torch's schedule does: over every event of the step's
    one-step captures (their own markers, one per role capture in role mode, are replaced) and over
    the markers of captures of several steps. ``budget``: what the command may inflate, when it
    merges more than ``inputs`` (default: the budget of ``inputs``).
    """
    result = MergeResult(output=output)
    records = [i.record for i in inputs]
    budget = budget or Budget.of(i.path for i in inputs)
    out_base_ns = clock_base(inputs, budget) if base_ns is None else base_ns
    base_us = out_base_ns / 1000
    result.runs = list(dict.fromkeys(r.run or "" for r in records))
    result.steps = sorted({s for r in records for s in r.steps} if steps is None else set(steps))
    multi_run = len(result.runs) > 1
    labels = process_names(records, driver)
    total = sum(_size(i.path) for i in inputs)
    markers = _StepMarkers() if step_markers else None
    folder = at if at is not None else walk(output.parent)
    try:
        return _write(inputs, output, folder, result, out_base_ns, base_us, multi_run, labels, total, progress,
                      markers, first_keys, compress_level, budget)
    finally:
        if folder is not at:
            folder.close()


def _write(inputs: Sequence[MergeInput], output: Path, folder: Folder, result: MergeResult, out_base_ns: int,
           base_us: float, multi_run: bool, labels: Any, total: int, progress: Callable[[int, int], None] | None,
           markers: _StepMarkers | None, first_keys: Mapping[str, Any] | None, compress_level: int,
           budget: Budget) -> MergeResult:
    """Write the merged trace into the held ``folder`` as ``output.name`` (see :func:`merge`)."""
    done = 0
    processes: dict[tuple[Any, ...], _Process] = {}
    sources: list[dict[str, Any]] = []
    seen: set[tuple[int, int]] = set()
    sweep(folder)
    # A fresh name nobody can predict, created exclusively: a link planted there is never followed.
    tmp = temporary_name()
    raw: IO[bytes] | None = None
    sink: _Sink | None = None
    # Millions of short-lived event dicts would set off the cyclic collector again and again for
    # nothing (they hold no cycles; reference counting frees them): pause it for the merge.
    collecting = gc.isenabled()
    gc.disable()
    try:  # from before the temporary exists: an interrupt at any statement leaves none behind
        raw = os.fdopen(folder.create(tmp), "wb")
        sink = _Sink(raw, compress_level if output.name.endswith(".gz") else None)
        head = {**(first_keys or {}), "schemaVersion": 1, "displayTimeUnit": "ms", "baseTimeNanoseconds": out_base_ns}
        sink.write(json.dumps(head)[:-1].encode() + b',\n"traceEvents":[\n')
        for index, item in enumerate(inputs):

            def report(consumed: int, base: int = done) -> None:
                if progress:
                    progress(base + consumed, total)

            sources.append(_merge_one(index, item, out_base_ns, sink, processes, labels, result, report,
                                      markers, budget, seen))
            done += _size(item.path)
            if progress:
                progress(done, total)
        if markers is None:
            sink.events(_step_spans(inputs, base_us, multi_run, result.steps))
        else:
            sink.events(markers.spans())
        names = _names(list(processes.values()))
        for proc in processes.values():
            sink.events(proc.metadata(names[proc.pid]))
        tail = {"profctx": {"merged": True, "steps": result.steps, "runs": result.runs, "captures": sources}}
        sink.write(b"\n]," + json.dumps(tail, default=str)[1:].encode() + b"\n")
        sink.close()
        raw.close()
        folder.move(tmp, folder, output.name)
    except BaseException:  # an interrupt too (SIGTERM becomes SystemExit in the CLI): no temporary stays
        with contextlib.suppress(OSError):
            os.unlink(tmp, dir_fd=folder.fd)
        if sink is not None:
            sink.abort()
        if raw is not None:
            raw.close()
        raise
    finally:
        if collecting:
            gc.enable()
    assert sink is not None  # made in the try above, which returned normally
    result.inputs = len(inputs)
    result.events = sink.count
    result.processes = len(processes) + 1
    return result


def clock_base(inputs: Sequence[MergeInput], budget: Budget | None = None) -> int:
    """Return the clock base (ns) of a merge of ``inputs``: at or before the earliest capture start.

    torch writes one ``baseTimeNanoseconds`` for every process of a host (whole seconds): taking the
    smallest as the merged base leaves most events' ts untouched, which is most of the merge's speed.
    """
    known = [i.record.start_time for i in inputs if i.record.start_time]
    base = math.floor(min(known)) * 1_000_000_000 if known else 0
    bases = [b for b in (_head_base(i.path, i.root, budget) for i in inputs) if b is not None and b <= base]
    return min(bases) if bases else base


def _names(processes: list[_Process]) -> dict[int, str]:
    """Return each process's name, with ``host:pid`` added where two would share one."""
    seen: dict[str, int] = {}
    for proc in processes:
        key = proc.label
        seen[key] = seen.get(key, 0) + 1
    names = {}
    for proc in processes:
        r = proc.record
        clash = seen[proc.label] > 1 and not r.is_engine
        names[proc.pid] = f"{proc.label} · {r.host}:{r.pid}" if clash else proc.label
    return names


def _step_spans(inputs: Sequence[MergeInput], base_us: float, multi_run: bool,
                steps: Sequence[int]) -> list[dict[str, Any]]:
    """Return the ``steps`` process: one span per (run, step), from its first capture's start to its last's end."""
    spans: dict[tuple[str, int], list[float]] = {}
    wanted = set(steps)
    for item in inputs:
        r = item.record
        if not r.start_time or not r.end_time:
            continue
        for step in r.steps:
            if step not in wanted:
                continue
            span = spans.setdefault((r.run or "", step), [r.start_time, r.end_time])
            span[0], span[1] = min(span[0], r.start_time), max(span[1], r.end_time)
    events: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": STEPS_PID, "tid": 0, "ts": 0, "args": {"name": "steps"}},
        {"ph": "M", "name": "process_sort_index", "pid": STEPS_PID, "tid": 0, "ts": 0, "args": {"sort_index": 0}},
        {"ph": "M", "name": "thread_name", "pid": STEPS_PID, "tid": 0, "ts": 0, "args": {"name": "global step"}},
    ]
    for (run, step), (begin, end) in sorted(spans.items(), key=lambda kv: kv[1][0]):
        name = f"step {step}" + (f" · run {run}" if multi_run else "")
        events.append({"ph": "X", "cat": "profctx", "name": name, "pid": STEPS_PID, "tid": 0,
                       "ts": round(begin * 1e6 - base_us, 3), "dur": round((end - begin) * 1e6, 3),
                       "args": {"step": step, "run": run}})
    return events


def _merge_one(
    index: int,
    item: MergeInput,
    out_base_ns: int,
    sink: _Sink,
    processes: dict[tuple[Any, ...], _Process],
    labels: dict[tuple[str, ...], str],
    result: MergeResult,
    progress: Callable[[int], None],
    markers: _StepMarkers | None = None,
    budget: Budget | None = None,
    seen: set[tuple[int, int]] | None = None,
) -> dict[str, Any]:
    record = item.record
    source: dict[str, Any] = {
        key: value for key, value in record.as_dict().items()
        if key in ("capture", "run", "kind", "rank", "world_size", "host", "pid", "group", "steps", "role",
                   "engine", "version", "replica", "backend", "start_time", "end_time", "status")
    }
    source["file"] = item.path.name
    source["label"] = labels[record.process]
    if not item.path.is_file():
        result.problems.append(f"{item.path}: missing")
        source["error"] = "missing"
        return source
    owner = (*record.process, record.group or "", record.rank)
    mapper = _Mapper(index, owner, record, processes, labels[record.process])
    if markers is not None:
        markers.named = False
    meta: dict[str, Any] = {}
    count = 0
    damaged = 0
    try:
        # Without step markers to rewrite, slices are first read as heads only (phase, pid, tid): most
        # batches need no change and are copied as read, their events never parsed.
        with TraceStream(item.path, item.root, loads=heads_or_values if markers is None else None,
                         budget=budget) as stream:
            if seen is not None:
                if stream.identity in seen:  # another name of a file merged already, swapped in since the plan
                    raise UnsafeFileError(f"{item.path}: a file merged already for another record: not written twice")
                seen.add(stream.identity)
            for key, value in stream.batches():
                if key != EVENTS:
                    meta[key] = value
                    continue
                if mapper.shift_us is None:
                    mapper.shift_us = _shift(item, meta, out_base_ns, result, budget)
                raw = stream.raw
                if type(value) is Heads and raw is not None:
                    body = mapper.copy_body(value, raw)
                    if body is not None:
                        sink.copy(body, len(value))
                        count += len(value)
                        progress(stream.consumed)
                        continue
                    value, raw = _values(raw)
                if not (_FINITE_BATCHES and raw is not None):
                    finite = _finite(value)
                    if len(finite) != len(value):
                        damaged += len(value) - len(finite)
                        value, raw = finite, None
                kept = mapper.remap(value)
                if markers is not None:
                    kept, raw = markers.take(kept, record.steps, raw, index)
                if mapper.untouched and raw is not None:
                    sink.copy(raw, len(kept))  # the batch's own bytes: nothing to serialise again
                else:
                    sink.events(kept)
                count += len(kept)
                progress(stream.consumed)
    except (TraceFormatError, OSError) as exc:
        result.problems.append(str(exc))
        source["error"] = str(exc)
    if damaged:
        result.dropped.append(f"{item.path}: {damaged} event(s) whose ts or dur is not a finite number left out")
        source["dropped"] = damaged
    main = mapper.main()
    if markers is not None:
        if len(record.steps) > 1 and not markers.named:
            result.unmarked.append(f"{item.path}: names no step and covers steps {_span_text(record.steps)}")
    elif record.start_time and record.end_time:
        role = record.role or "step"
        steps = record.steps
        span = f"step {steps[0]}" if len(steps) == 1 else f"steps {steps[0]}-{steps[-1]}" if steps else "no step"
        sink.events([{"ph": "X", "cat": "profctx", "name": f"{span} · {role}", "pid": main.pid, "tid": CAPTURES_TID,
                      "ts": round(record.start_time * 1e6 - out_base_ns / 1000, 3),
                      "dur": round((record.end_time - record.start_time) * 1e6, 3),
                      "args": {"capture": record.capture, "status": record.status, "file": item.path.name}}])
        count += 1
    for key in ("profctx", "distributedInfo"):
        if key in meta:
            source[f"trace_{key}"] = meta[key]
    source["pids"] = sorted({p.pid for p in mapper.pids.values()})
    source["events"] = count
    return source


#: Event arguments that link events of one capture (an operator, its kernel launch, the kernel):
#: made unique per capture in a file holding several, as flow ids are.
_LINK_ARGS: Final = ("correlation", "External id", "Python id", "Python parent id")


class _StepMarkers:
    """Gather where each step lies in one output file, from its captures' events and step markers.

    A one-step capture's events all belong to its step (also those the profiler draws outside the
    step's range); a capture of several steps is split by its own markers. The markers read are
    left out of the output: :meth:`spans` gives one per step instead. The ids linking events of a
    capture (:data:`_LINK_ARGS`) get the capture's index in their high bits: a tool joining a rank's
    kernels to their launches by ``correlation`` must not join two captures' (each counts from its
    own start).
    """

    def __init__(self) -> None:
        #: step -> [begin, end, pid, tid]: extent in merged time, and the thread the marker goes on.
        self.steps: dict[int, list[Any]] = {}
        #: Whether the capture last read named a step.
        self.named = False

    def take(self, events: list[Any], steps: Sequence[int], raw: bytes | None,
             index: int) -> tuple[list[Any], bytes | None]:
        """Take in a batch of merged events of capture ``index`` of ``steps``; return it less its markers, its
        link ids made unique (and ``raw`` when nothing changed)."""
        single = steps[0] if len(steps) == 1 else None
        kept = []
        changed = False
        high = index << _ID_BITS
        for event in events:
            if type(event) is not dict:
                kept.append(event)
                continue
            args = event.get("args") if high else None  # the first capture's ids stay as they are
            if type(args) is dict:
                for key in _LINK_ARGS:
                    value = args.get(key)
                    if type(value) is int:
                        args[key] = high | (value & _ID_MASK)
                        changed = True
            if event.get("ph") != "X":
                kept.append(event)
                continue
            name, ts, dur = event.get("name"), event.get("ts"), event.get("dur", 0)
            marker = isinstance(name, str) and name.startswith(STEP_MARKER_PREFIX)
            step = _marker_step(name) if isinstance(name, str) and marker else single
            if marker:
                self.named = True
            else:
                kept.append(event)
            if step is None or not isinstance(ts, (int, float)) or not isinstance(dur, (int, float)):
                continue
            known = self.steps.get(step)
            if known is None:
                self.steps[step] = [ts, ts + dur, event.get("pid"), event.get("tid"), marker]
                continue
            known[0], known[1] = min(known[0], ts), max(known[1], ts + dur)
            if marker and not known[4]:  # torch's marker thread, rather than any event's
                known[2:] = [event.get("pid"), event.get("tid"), True]
        return kept, raw if len(kept) == len(events) and not changed else None

    def spans(self) -> list[dict[str, Any]]:
        """Return one ``ProfilerStep#N`` range per step seen."""
        return [{"ph": "X", "cat": "user_annotation", "name": f"{STEP_MARKER_PREFIX}{step}", "pid": pid, "tid": tid,
                 "ts": begin, "dur": round(end - begin, 3), "args": {"profctx": "the step's extent in this file"}}
                for step, (begin, end, pid, tid, _) in sorted(self.steps.items())]


def _marker_step(name: str) -> int | None:
    digits = name[len(STEP_MARKER_PREFIX):]
    return int(digits) if digits.isdigit() else None


def _span_text(steps: Sequence[int]) -> str:
    return f"{steps[0]}-{steps[-1]}" if steps else "none"


def _values(raw: bytes) -> tuple[list[Any], bytes | None]:
    """Parse the events of a batch read as heads; return them, with ``raw`` when the parser vouches all are finite."""
    text = b"[" + raw + b"]"
    try:
        return _loads_values(text), raw
    except ValueError:  # a number beyond a double, bytes not UTF-8: the standard library reads them as the reader does
        try:
            return json.loads(text.decode("utf-8", "surrogateescape")), None
        except (ValueError, RecursionError) as exc:
            raise TraceFormatError(f"the data is damaged ({exc})") from None


def _finite(events: list[Any]) -> list[Any]:
    """Return ``events`` less those that cannot be placed in time: a ``ts`` or ``dur`` that is NaN or infinite.

    Metadata events are kept (the merge sets their ``ts`` to 0).
    """
    return [event for event in events
            if type(event) is not dict or event.get("ph") == "M"
            or not (_non_finite(event.get("ts")) or _non_finite(event.get("dur")))]


def _non_finite(value: Any) -> bool:
    return type(value) is float and not math.isfinite(value)


class _Mapper:
    """Rewrite one input's events for the merged trace: pids, tids, clock, ids."""

    def __init__(self, index: int, owner: tuple[Any, ...], record: CaptureRecord,
                 processes: dict[tuple[Any, ...], _Process], label: str) -> None:
        self.index = index
        self.owner = owner
        self.record = record
        self.processes = processes
        self.label = label
        self.pids: dict[Any, _Process] = {}
        #: Whether :meth:`remap` returned its batch exactly as read (no event rewritten or left out).
        self.untouched = False
        self.shift_us: float | None = None

    def _process(self, key: Any) -> _Process:
        proc = self.pids.get(key)
        if proc is not None:
            return proc
        # The capture's own process takes torch's string pseudo-processes and the first real pid;
        # an engine trace may hold further pids (its workers), each a process of its own.
        if key == _MAIN or not any(k != _MAIN for k in self.pids):
            merged_key: tuple[Any, ...] = (*self.owner, "first")
        else:
            merged_key = (*self.owner, "pid", key)
        proc = self.processes.get(merged_key)
        if proc is None:
            proc = _Process(self._new_pid(key), self.record, self.label, len(self.processes) + STEPS_PID + 1)
            self.processes[merged_key] = proc
        self.pids[key] = proc
        return proc

    def _new_pid(self, key: Any) -> int:
        """Keep the trace's own pid when no other merged process has it (events then need no rewrite)."""
        taken = {p.pid for p in self.processes.values()}
        if type(key) is int and key > STEPS_PID and key < _FRESH_PID and key not in taken:
            return int(key)
        return _FRESH_PID + len(self.processes)

    def main(self) -> _Process:
        """Return the merged process the capture's own events went to."""
        if self.pids:
            return next(iter(self.pids.values()))
        return self._process(_MAIN)

    def remap(self, events: list[Any]) -> list[Any]:
        """Rewrite ``events`` in place; return those to keep.

        The common event (an int pid kept as is, an int tid, a clock shift of zero) is only
        looked at, never rewritten. A batch made only of such events (and of flow events,
        whose ids alone change) is recognised by a few passes in C, without a Python loop
        over every event: that loop was most of a merge's time.
        """
        self.untouched = False
        if self._plain(events):
            return events
        shift = self.shift_us or 0.0
        kept = []
        pids = self.pids
        for event in events:
            if type(event) is not dict:
                continue
            phase = event.get("ph")
            if phase is None:
                continue
            original = event.get("pid", "")
            proc = pids.get(original) if type(original) is int else None
            if proc is None:
                proc = self._slow(event, original)
                if proc is None:
                    continue
            else:
                if proc.pid != original:
                    event["pid"] = proc.pid
                tid = event.get("tid", 0)
                if type(tid) is int:
                    if tid not in proc.threads:
                        proc.threads[tid] = tid
                else:
                    event["tid"] = proc.tid(tid)
                if phase == "M":
                    if not self._metadata(event, proc, original, tid):
                        continue
                elif shift:
                    ts = event.get("ts")
                    if type(ts) is float or type(ts) is int:
                        event["ts"] = round(ts + shift, 3)
            if phase in _ID_PHASES:
                self._flow_ids(event)
            kept.append(event)
        return kept

    def _plain(self, events: list[Any]) -> bool:
        """Return whether the per-event loop would keep every event and change only flow ids; change those.

        True when there is no clock shift and every event is a dict with a phase other than
        ``M``, the one int pid of the batch is kept as is, and every tid is an int (then
        registered, as the loop does).
        """
        if self.shift_us or not events:
            return False
        try:
            # One pass; a batch is a few distinct (phase, pid, tid) triples.
            triples = set(map(_PH_PID_TID, events))
        except (KeyError, TypeError):  # a key missing (the loop then rewrites), not a dict, or unhashable
            return False
        if not self._plain_sets({t[0] for t in triples}, {t[1] for t in triples}, {t[2] for t in triples}):
            return False
        if not self.untouched:
            for event in events:
                if event["ph"] in _ID_PHASES:
                    self._flow_ids(event)
        return True

    def copy_body(self, heads: list[Any], raw: bytes) -> bytes | None:
        """Return the JSON text to write for a batch read as heads (``raw``), or ``None`` when it needs parsing.

        As :meth:`_plain`, on the heads: a batch that needs no change is copied as read; one whose
        flow events alone change has only those parsed and written again.
        """
        if self.shift_us or not heads:
            return None
        if not self._plain_sets(set(map(_PHASE, heads)), set(map(_PID, heads)), set(map(_TID, heads))):
            return None
        if self.untouched:
            return raw
        texts = raws(b"[" + raw + b"]")
        if texts is None:  # pragma: no cover - heads come from msgspec, which splits raws too
            return None
        for i, phase in enumerate(map(_PHASE, heads)):
            if phase in _ID_PHASES:
                event = _loads_values(bytes(texts[i]))
                self._flow_ids(event)
                texts[i] = _dumps(event)
        return b",".join(texts)

    def _plain_sets(self, phases: set[Any], pids: set[Any], tids: set[Any]) -> bool:
        """Return whether events of these phases, pids and tids need no change but flow ids; register the tids.

        Set :attr:`untouched` when no flow event is among them.
        """
        self.untouched = False
        if len(pids) != 1 or None in phases or "M" in phases:
            return False
        pid = next(iter(pids))
        proc = self.pids.get(pid) if type(pid) is int else None
        if proc is None or proc.pid != pid:
            return False
        threads = proc.threads
        known: list[int] = []
        for tid in tids:
            if type(tid) is not int:
                return False
            known.append(tid)
        for number in known:
            if number not in threads:
                threads[number] = number
        self.untouched = _ID_PHASES.isdisjoint(phases)
        return True

    def _flow_ids(self, event: dict[str, Any]) -> None:
        """Make a flow event's ids unique to this input: ints get its index in the high bits, strings a prefix."""
        for id_key in ("id", "bind_id"):
            value = event.get(id_key)
            if type(value) is int:
                event[id_key] = (self.index << _ID_BITS) | (value & _ID_MASK)
            elif type(value) is str:
                event[id_key] = f"c{self.index}:{value}"

    def _slow(self, event: dict[str, Any], original: Any) -> _Process | None:
        """Rewrite an event of a pid not seen yet, or of one of torch's string pseudo-processes."""
        tid_key = event.get("tid", 0)
        if type(original) is int:
            key: Any = original
        else:
            key = _MAIN
            tid_key = (str(original), str(tid_key))
        proc = self._process(key)
        event["pid"] = proc.pid
        if "tid" in event or key == _MAIN:
            event["tid"] = proc.tid(tid_key)
        if event["ph"] == "M":
            return proc if self._metadata(event, proc, key, tid_key) else None
        ts = event.get("ts")
        if self.shift_us and (type(ts) is float or type(ts) is int):
            event["ts"] = round(ts + self.shift_us, 3)
        return proc

    def _metadata(self, event: dict[str, Any], proc: _Process, key: Any, tid_key: Any) -> bool:
        """Handle an ``M`` event; return whether to keep it (names are re-emitted under the merged labels)."""
        name = event.get("name")
        if name in _RENAMED:
            args = event.get("args") or {}
            if name == "process_name" and key != _MAIN and isinstance(args, dict):
                proc.original_name = str(args.get("name", ""))
            elif name == "thread_name" and isinstance(args, dict):
                proc.thread_names[proc.tid(tid_key)] = str(args.get("name", ""))
            return False
        event["ts"] = 0
        return True


def _shift(item: MergeInput, meta: dict[str, Any], out_base_ns: int, result: MergeResult,
           budget: Budget | None = None) -> float:
    """Return what to add to an input's ``ts`` to get the merged file's ``ts``."""
    base = meta.get("baseTimeNanoseconds")
    if not isinstance(base, int):
        # Metadata may follow the events: read the file's top level once more to find out.
        try:
            meta_full, first = header(item.path, item.root, budget)
        except (TraceFormatError, OSError):
            meta_full, first = {}, None
        base = meta_full.get("baseTimeNanoseconds")
        if not isinstance(base, int):
            if first is not None and first > _EPOCH_US:
                base = 0
            else:
                start = item.record.start_time or 0.0
                result.approximate.append(str(item.path))
                return start * 1e6 - (first or 0.0) - out_base_ns / 1000
    return (base - out_base_ns) / 1000


def _head_base(path: Path, root: Path | None = None, budget: Budget | None = None) -> int | None:
    """Return the ``baseTimeNanoseconds`` a trace gives before its events, or ``None``."""
    try:
        with TraceStream(path, root, budget=budget) as stream:
            for key, value in stream.batches():
                if key == EVENTS:
                    return None
                if key == "baseTimeNanoseconds":
                    return value if type(value) is int else None
    except (TraceFormatError, OSError):
        return None
    return None


def _size(path: Path) -> int:
    try:
        return path.stat().st_size
    except OSError:
        return 0
