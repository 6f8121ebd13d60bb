"""The summary of a run: per capture, per step, per role and per process, read from manifest and traces.

Definitions (also in ``docs/analysis.md``):

- A *process* is one worker process (host and pid, with its group and rank) or one engine
  replica; never a bare rank number, which several processes may share.
- A *role* is one of the ranges profctx drew (the trace lists them), the outermost on its
  thread; the user's and torch's own ranges are operators. Its *step* is that of the
  ``ProfilerStep#N`` marker it lies in (a contiguous capture is split by step).
- The *time of a role in a step on a process* is the total duration of its ranges in that step,
  in every mode; the capture's own start and stop (its wall time less its step markers) is the
  capture's *overhead*, apart. A role capture whose trace holds no range of the role (another
  producer), and an engine capture, keep the capture's duration (``time_from: "capture"``).
- *No-operator time*: the part of a role's ranges that no operator on their thread covers
  (host waits, sleeps, Python between operators).
- The *time of a role in a step* is the maximum over processes (ranks run a role together and
  the slowest sets the pace); its *share* is that time over the sum of every role's time.
- The processes of each step are lined up on one clock (:mod:`profctx.analysis._align`): the step
  timelines' entries and exits (else the traces' ranges) and the collectives the traces record. A
  role's time on a process splits into *wait* (for the others, in a collective or a segment they left
  together) and *work*. The *straggler* of a step is the process whose lag the others waited for, named
  in the role (or the time before the step) where it accrued: its work there over the median of the
  *other* processes' exceeds the straggler ratio (default 1.2), by at least 10 ms. A role's *ratio* is
  its largest work over the median of the other processes' work in it. Without anything to line the
  processes up by, the straggler of a role is the process whose time there exceeds the other processes'
  median by the ratio.
- An operator's *self time* excludes the operators nested in it; per role it is summed over
  processes and steps. An operator on a thread that draws no role of its own (gloo's, autograd's)
  counts in the role of another thread of its process that alone holds its start.
- The *device time of a role* is the duration of the device events (kernels, copies) launched in
  it: each is linked to its launch by correlation id, and the launch lies in a role range on its
  thread (or is lent one, as operators are), whenever the kernel itself runs. Per step and role it
  is that of the slowest process (the one whose time is the role's); per role, summed over
  processes and steps. Device time launched in no role counts in the :data:`NO_ROLE` row.
"""

from __future__ import annotations

import os
import statistics
from collections import defaultdict
from collections.abc import Callable, Collection, Iterable, Sequence
from dataclasses import dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any, Final

from ..manifest import (
    DRIVER,
    CaptureRecord,
    ManifestReader,
    drivers,
    in_groups,
    latest_run,
    process_names,
    repeats_text,
)
from ..records._job import of_records
from ..util._untrusted import Budget, UnsafeFileError, files_under, resolve
from . import _align
from ._parallel import Prefetched, jobs_for
from ._trace import TraceFigures, read_figures
from ._tracejson import is_trace_file

#: Name and version of the JSON document :meth:`Summary.to_json` returns.
SCHEMA: Final = "profctx.summary"
SCHEMA_VERSION: Final = 1
#: Default straggler ratio: max over median beyond which a process is named.
STRAGGLER_RATIO: Final = 1.2
#: The row of operators that ran in no role (``role_ops``); not a role.
NO_ROLE: Final = "step"


@dataclass
class OpFigure:
    """One operator's figures; times in seconds; ``share`` of the self time of its scope."""

    name: str
    self_s: float
    total_s: float
    count: int
    share: float = 0.0

    def to_json(self) -> dict[str, Any]:
        """Return the JSON form."""
        return {"name": self.name, "self_s": self.self_s, "total_s": self.total_s, "count": self.count,
                "share": self.share}


@dataclass
class CaptureSummary:
    """One capture: who, which steps and role, its times, ranges and top operators."""

    record: CaptureRecord
    wall_s: float | None
    roles: dict[str, float]
    ops: list[OpFigure]
    device_s: float | None
    device_ops: list[OpFigure]
    files: list[str]
    problems: list[str]
    #: Operator self/total time (µs) and count per role: the capture's role, else the outermost range.
    #: Emptied once :func:`summarize` has added it to the run's figures (:attr:`Summary.role_ops`).
    role_table: dict[str, dict[str, list[float]]] = field(default_factory=dict)
    #: The row name of the capture's process (see :func:`profctx.manifest.process_names`).
    process: str = ""
    #: ``(step, role) -> (seconds, no-operator seconds or None)``: the role times per step.
    role_steps: dict[tuple[int, str], tuple[float, float | None]] = field(default_factory=dict)
    #: Wall time less the step markers: the profiler's own start and stop (and, in a contiguous
    #: capture, the loop between steps); ``None`` when the trace marks no step.
    overhead_s: float | None = None
    #: ``(step, role) -> device seconds`` launched in the role (:data:`NO_ROLE`: in none; step ``None``: a
    #: launch outside every step marker of a capture of several steps); empty without device events.
    role_device: dict[tuple[int | None, str], float] = field(default_factory=dict)
    #: Where role times come from: ``"ranges"`` (profctx's listed ranges), ``"user ranges"`` (a trace
    #: that lists none: its outermost user ranges), ``"capture"`` (the capture's start to stop).
    time_from: str = "ranges"
    #: ``step -> (start, end, {role: (first entry, last exit)}, collectives)`` on the trace's wall clock
    #: (Unix seconds): what :mod:`profctx.analysis._align` lines up; empty for a trace without step markers.
    lanes: dict[int, tuple[float, float, dict[str, tuple[float, float]], list[_align.Collective]]] = \
        field(default_factory=dict)
    #: ``(step, parent role, nested role) -> seconds``: the listed roles drawn inside another role.
    nested: dict[tuple[int, str, str], float] = field(default_factory=dict)

    @property
    def empty(self) -> bool:
        """Whether the capture is ok but its traces hold no operator at all."""
        return self.record.status == "ok" and not self.ops and not self.device_ops and bool(self.files)

    def to_json(self) -> dict[str, Any]:
        """Return the JSON form."""
        r = self.record
        return {
            "capture": r.capture, "run": r.run, "status": r.status, "kind": r.kind, "steps": list(r.steps),
            "role": r.role, "process": self.process or r.who, "host": r.host, "pid": r.pid, "rank": r.rank,
            "group": r.group, "engine": r.engine, "replica": r.replica, "start_time": r.start_time,
            "end_time": r.end_time, "wall_s": self.wall_s, "roles": self.roles, "time_from": self.time_from,
            "overhead_s": self.overhead_s,
            "role_steps": [{"step": st, "role": ro, "time_s": t, "no_op_s": n}
                           for (st, ro), (t, n) in sorted(self.role_steps.items())],
            "device_s": self.device_s,
            "role_device": [{"step": st, "role": ro, "device_s": t}
                            for (st, ro), t in sorted(self.role_device.items(), key=_by_step)],
            "ops": [o.to_json() for o in self.ops], "device_ops": [o.to_json() for o in self.device_ops],
            "files": self.files, "empty": self.empty, "problems": self.problems,
            "reason": r.reason, "error": r.error,
        }


@dataclass
class RoleStep:
    """One role in one step: time per process, the role's time (max), median and straggler."""

    step: int
    role: str
    per_process: dict[str, float]
    time_s: float
    median_s: float
    share: float = 0.0
    straggler: str | None = None
    #: Seconds of the role's ranges on the slowest process that no operator covers (``None``: unknown,
    #: the time came from the capture).
    no_op_s: float | None = None
    #: Seconds of device work launched in the role on the slowest process (``None``: its traces hold no
    #: device event).
    device_s: float | None = None
    #: Per process, the seconds of its time in the role spent waiting for the others (empty: not lined up).
    wait: dict[str, float] = field(default_factory=dict)
    #: The largest work (time less wait) over processes, and the median of the other processes' work.
    work_s: float = 0.0
    others_s: float = 0.0
    #: The lag the straggler accrued in the role (``None``: no straggler named here by the alignment).
    lag_s: float | None = None
    #: ``{nested role: seconds}``: the listed roles drawn inside this one, on the slowest process.
    nested: dict[str, float] = field(default_factory=dict)

    @property
    def ratio(self) -> float:
        """The largest work over the median of the other processes' work (1.0 with one process)."""
        return self.work_s / self.others_s if self.others_s > 0 else 1.0

    @property
    def wait_s(self) -> float:
        """The longest wait of a process in the role (0 when nothing waited or nothing was lined up)."""
        return max(self.wait.values(), default=0.0)

    def to_json(self) -> dict[str, Any]:
        """Return the JSON form."""
        return {"step": self.step, "role": self.role, "time_s": self.time_s, "median_s": self.median_s,
                "share": self.share, "ratio": self.ratio, "straggler": self.straggler, "no_op_s": self.no_op_s,
                "device_s": self.device_s, "per_process": self.per_process, "work_s": self.work_s,
                "others_work_s": self.others_s, "wait_s": self.wait, "lag_s": self.lag_s, "nested": self.nested}


@dataclass
class Summary:
    """The summary of one run (or of some steps of it)."""

    save_path: Path
    run: str | None
    steps: list[int]
    roles: list[str]
    processes: list[str]
    captures: list[CaptureSummary]
    phases: list[RoleStep]
    step_wall: dict[int, float]
    role_ops: dict[str, list[OpFigure]]
    engines: list[CaptureSummary]
    straggler_ratio: float
    problems: list[str] = field(default_factory=list)
    #: ``{step: seconds}``: the profiler's own start and stop in the step on the process that lost
    #: most to it (the step's single-step captures); not in any role's time.
    overhead: dict[int, float] = field(default_factory=dict)
    #: ``{role: seconds}``: device work launched in each role (:data:`NO_ROLE`: in none), summed over
    #: processes and steps; empty when no trace holds a device event.
    role_device: dict[str, float] = field(default_factory=dict)
    #: The processes the run's records expect (``rank R of W``, selected ranks) and that have no record here.
    missing: list[str] = field(default_factory=list)
    #: ``{step: alignment}``: the processes of each step lined up (see :mod:`profctx.analysis._align`).
    alignment: dict[int, _align.StepAlignment] = field(default_factory=dict)
    clocks: _align.Clocks | None = None

    def answer(self, step: int) -> str | None:
        """Return who the others waited for in ``step``, as one line (``None``: the step was not lined up)."""
        found = self.alignment.get(step)
        return None if found is None else _align.answer(found)

    def phase(self, step: int, role: str) -> RoleStep | None:
        """Return the figures of ``role`` in ``step``, or ``None``."""
        for item in self.phases:
            if item.step == step and item.role == role:
                return item
        return None

    def stragglers(self) -> list[RoleStep]:
        """Return the (step, role) figures that name a straggler, worst ratio first."""
        return sorted((p for p in self.phases if p.straggler), key=lambda p: -p.ratio)

    def trend(self, role: str) -> list[tuple[int, float]]:
        """Return ``(step, time_s)`` of ``role`` for each step, in step order."""
        return [(p.step, p.time_s) for p in sorted(self.phases, key=lambda p: p.step) if p.role == role]

    def role_wait(self, role: str) -> float:
        """Return the mean over steps of the longest wait of a process for the others in ``role`` (0 when absent)."""
        values = [p.wait_s for p in self.phases if p.role == role]
        return sum(values) / len(values) if values else 0.0

    def nested_time(self, role: str) -> dict[str, float]:
        """Return each role drawn inside ``role``: its mean time per step of ``role`` (slowest process)."""
        found = [p for p in self.phases if p.role == role]
        out: dict[str, float] = {}
        for p in found:
            for child, seconds in p.nested.items():
                out[child] = out.get(child, 0.0) + seconds / len(found)
        return out

    def role_time(self, role: str) -> float:
        """Return the mean over steps of the role's time (0 when absent)."""
        values = [t for _, t in self.trend(role)]
        return sum(values) / len(values) if values else 0.0

    def to_json(self) -> dict[str, Any]:
        """Return the versioned JSON document (schema ``profctx.summary`` version 1)."""
        return {
            "schema": SCHEMA,
            "version": SCHEMA_VERSION,
            "save_path": str(self.save_path),
            "run": self.run,
            "steps": self.steps,
            "roles": self.roles,
            "processes": self.processes,
            "straggler_ratio": self.straggler_ratio,
            "step_wall_s": {str(k): v for k, v in self.step_wall.items()},
            "overhead_s": {str(k): v for k, v in self.overhead.items()},
            "phases": [p.to_json() for p in self.phases],
            "stragglers": [p.to_json() for p in self.stragglers()],
            "alignment": [{**a.to_json(), "answer": _align.answer(a)} for _, a in sorted(self.alignment.items())],
            "clocks": None if self.clocks is None else self.clocks.to_json(),
            "trend": {role: [{"step": s, "time_s": t} for s, t in self.trend(role)] for role in self.roles},
            "role_ops": {role: [o.to_json() for o in ops] for role, ops in self.role_ops.items()},
            "role_device_s": self.role_device,
            "captures": [c.to_json() for c in self.captures],
            "engines": [c.to_json() for c in self.engines],
            "problems": self.problems,
            "missing": self.missing,
        }


def summarize(
    save_path: str | os.PathLike[str],
    run: str | None = "latest",
    *,
    steps: Iterable[int] | None = None,
    top: int = 15,
    straggler_ratio: float = STRAGGLER_RATIO,
    progress: Callable[[int, int], None] | None = None,
    groups: Collection[str] | None = None,
    jobs: int | None = None,
) -> Summary:
    """Return the summary of ``run`` under ``save_path`` (``"latest"``: the run that started last; ``None``: all).

    ``steps`` keeps those steps only; ``groups`` the processes of those worker groups
    (``driver``: the processes outside every group). Traces are streamed one at a time: memory stays near
    the figures of one trace, per process: ``jobs`` processes read traces (``None``, the default: one per
    CPU when there are enough traces for a pool to gain and this process may fork, else one; see
    :data:`profctx.analysis._parallel.AUTO` for a command line). ``progress(done, total)`` counts traces read. A trace
    that cannot be read is listed in :attr:`Summary.problems` and its capture keeps the manifest's times.

    What it costs is bounded by the traces' bytes on disk: each file is read once, however many records name
    it (counted for the first capture that names it; the others are told so in the problems), and all of them
    together inflate at most as a :class:`~profctx.util._untrusted.Budget` allows.
    """
    root = Path(save_path)
    chosen = latest_run(root) if run == "latest" else run
    wanted = None if steps is None else set(steps)
    reader = ManifestReader(root, chosen)
    every = list(reader)
    records = [r for r in every
               if (wanted is None or wanted.intersection(r.steps)) and (groups is None or in_groups(r, groups))]
    summary = summarize_records(root, records, run=chosen, steps=wanted, top=top, straggler_ratio=straggler_ratio,
                                progress=progress, driver=drivers(every), jobs=jobs)
    summary.problems[:0] = repeats_text(reader)
    summary.missing = [m.name() for m in of_records(every)
                       if groups is None or (m.group or DRIVER) in groups]
    return summary


def summarize_records(
    save_path: str | os.PathLike[str],
    records: Iterable[CaptureRecord],
    *,
    run: str | None = None,
    steps: Iterable[int] | None = None,
    top: int = 15,
    straggler_ratio: float = STRAGGLER_RATIO,
    progress: Callable[[int, int], None] | None = None,
    driver: Collection[tuple[str, ...]] | None = None,
    jobs: int | None = None,
) -> Summary:
    """Return the summary of the captures ``records`` of ``save_path`` (already chosen by the caller).

    As :func:`summarize`, which reads the records from the manifest. ``driver``: the driver
    processes (see :func:`profctx.manifest.process_names`), when ``records`` are filtered.
    """
    root = Path(save_path)
    chosen = run
    wanted = None if steps is None else set(steps)
    records = sorted(records, key=lambda r: r.begin)
    listed = {f.path for r in records for f in r.files}
    total = sum(1 for r in records if r.status == "ok")
    captures: list[CaptureSummary] = []
    engines: list[CaptureSummary] = []
    problems: list[str] = []
    role_ops: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(lambda: [0.0, 0.0, 0]))
    done = 0
    chosen_files: list[list[str]] = []
    for record in records:
        files = [f.path for f in record.files if is_trace_file(f.path)]
        if record.is_engine and not files and record.folder:
            try:
                files = _engine_files(root, record.folder, listed)
            except UnsafeFileError as exc:
                problems.append(str(exc))
        chosen_files.append(files if record.status == "ok" else [])
    find = _finder(root)
    chosen_files, on_disk = _once(find, chosen_files, problems)
    # A record whose every file another record names is a copy: counted once, with the first.
    copies = {i for i, (record, files) in enumerate(zip(records, chosen_files, strict=True))
              if record.status == "ok" and not files and any(is_trace_file(f.path) for f in record.files)}
    if copies:
        problems.extend(f"capture {records[i].capture}: every trace it names another record names too: left out"
                        for i in sorted(copies))
        records = [r for i, r in enumerate(records) if i not in copies]
        chosen_files = [f for i, f in enumerate(chosen_files) if i not in copies]
        total = sum(1 for r in records if r.status == "ok")
    # Every trace to read, in the order the loop below reads them: read ahead by a process pool
    # when there are enough of them (see _parallel.jobs_for), else one by one here.
    paths = [path for files in chosen_files for path in _resolved(find, files)]
    read_one = partial(read_figures, root=root, budget=Budget(on_disk))
    seen: set[tuple[int, int]] = set()
    with Prefetched(read_one, paths, jobs_for(paths, jobs), server=jobs is not None) as read:
        for record, files in zip(records, chosen_files, strict=True):
            summary = _capture(root, record, files, top, wanted, read, seen, find)
            problems.extend(summary.problems)
            if record.is_engine:
                engines.append(summary)
            else:
                # Fold the capture's full operator table into the run's now: a real trace names
                # hundreds of operators, and thousands of captures must not each keep theirs.
                for role, table in summary.role_table.items():
                    for name, (s, t, c) in table.items():
                        slot = role_ops[role][name]
                        slot[0] += s
                        slot[1] += t
                        slot[2] += c
                summary.role_table = {}
                captures.append(summary)
            if record.status == "ok":
                done += 1
                if progress:
                    progress(done, total)
    return _assemble(root, chosen, captures, engines, problems, role_ops, top, straggler_ratio, wanted, driver)


def _finder(root: Path) -> Callable[[str], Path]:
    """Return :func:`~profctx.util._untrusted.resolve` of ``root``, each name resolved once (it walks every link)."""
    found: dict[str, Path | str] = {}

    def find(rel: str) -> Path:
        hit = found.get(rel)
        if hit is None:
            try:
                hit = resolve(root, rel)
            except UnsafeFileError as exc:
                hit = str(exc)
            found[rel] = hit
        if isinstance(hit, str):
            raise UnsafeFileError(hit)
        return hit

    return find


def _once(find: Callable[[str], Path], chosen: list[list[str]],
          problems: list[str]) -> tuple[list[list[str]], int]:
    """Return ``chosen`` (the files of each record) with each file kept for the first record naming it only,
    and the bytes on disk of the files kept (the command's :class:`~profctx.util._untrusted.Budget`).

    A file is known by its device and inode (a name that climbs and comes back, or an absolute name,
    names it too); one that cannot be seen by its resolved path. The files left out are said in ``problems``.
    """
    named: set[object] = set()
    kept: list[list[str]] = []
    total = 0
    for files in chosen:
        mine = []
        for rel in files:
            key: object
            try:
                path = find(rel)
            except UnsafeFileError:
                mine.append(rel)  # refused where it is read, and said there
                continue
            try:
                info = os.stat(path, follow_symlinks=False)
                key, size = (info.st_dev, info.st_ino), info.st_size
            except (OSError, ValueError):
                key, size = os.path.normpath(path), 0
            if key in named:
                problems.append(f"{rel}: named by more than one capture record: read once, for the first")
                continue
            named.add(key)
            total += size
            mine.append(rel)
        kept.append(mine)
    return kept, total


def _resolved(find: Callable[[str], Path], files: Sequence[str]) -> list[Path]:
    """Return the paths of ``files`` that :func:`_capture` reads (those it refuses are said there)."""
    found = []
    for rel in files:
        try:
            found.append(find(rel))
        except UnsafeFileError:
            continue
    return found


def _engine_files(root: Path, folder: str, listed: set[str]) -> list[str]:
    return [rel for rel in files_under(root, folder)
            if is_trace_file(rel) and rel not in listed and not rel.rpartition("/")[2].startswith((".", "merged."))]


def _capture(root: Path, record: CaptureRecord, files: Sequence[str], top: int,
             wanted: set[int] | None = None,
             read: Callable[[Path], TraceFigures] | None = None,
             seen: set[tuple[int, int]] | None = None,
             find: Callable[[str], Path] | None = None) -> CaptureSummary:
    ops: dict[tuple[int | None, str | None, str], list[float]] = defaultdict(lambda: [0.0, 0.0, 0])
    device: dict[str, list[float]] = defaultdict(lambda: [0.0, 0])
    ranges: dict[tuple[int | None, str], list[float]] = defaultdict(lambda: [0.0, 0.0])
    marked_steps: dict[int, float] = defaultdict(float)
    launched: dict[tuple[int | None, str | None], float] = defaultdict(float)
    span = 0.0
    device_us = 0.0
    has_device = False
    listed = False
    problems = []
    placed: list[TraceFigures] = []  # the traces with a time origin: what the alignment lines up
    for rel in files:
        try:
            # A run folder is untrusted: nothing outside it is read.
            path = find(rel) if find is not None else resolve(root, rel)
        except UnsafeFileError as exc:
            problems.append(str(exc))
            continue
        figures: TraceFigures = read(path) if read is not None else read_figures(path, root)
        if seen is not None and figures.identity is not None:
            if figures.identity in seen:  # the same file under another name, swapped in since the plan
                problems.append(f"{rel}: a file read already for another record: counted once")
                continue
            seen.add(figures.identity)
        if figures.problem:
            problems.append(figures.problem)
        if figures.bad_times:
            problems.append(f"{rel}: {figures.bad_times} event(s) whose ts or dur is not a finite number (or whose "
                            "dur is negative) left out as damage")
        span = max(span, figures.span_us)
        listed = listed or figures.marked
        for key, (s, t, c) in figures.ops.items():
            slot = ops[key]
            slot[0] += s
            slot[1] += t
            slot[2] += c
        for name, (t, c) in figures.device.items():
            device[name][0] += t
            device[name][1] += c
        for where, (t, _c, covered) in figures.roles.items():
            ranges[where][0] += t
            ranges[where][1] += covered
        for step, (t, _c) in figures.steps.items():
            marked_steps[step] += t
        for launch, t in figures.role_device.items():
            launched[launch] += t
        if figures.device:
            has_device = True
        device_us += figures.device_us
        if figures.base_s is not None:
            placed.append(figures)
    wall = record.duration_s if record.duration_s is not None else (span / 1e6 if span else None)
    single = record.steps[0] if len(record.steps) == 1 else None
    own = record.role.rsplit("/", 1)[-1] if record.role else None
    # A role capture's own range is named by the role's last name; it stands for the whole path.
    rename = {own: record.role} if own and record.role and not record.is_engine else {}
    time_from = "ranges" if listed else "user ranges"
    role_steps: dict[tuple[int, str], tuple[float, float | None]] = {}
    roles: dict[str, float] = defaultdict(float)
    if record.is_engine or (record.role and not any(name == own for _, name in ranges)):
        time_from = "capture"
        if record.role and record.steps and wall is not None:
            roles[record.role] = wall
            if single is not None:
                role_steps[(single, record.role)] = (wall, None)
    else:
        for (marked, name), (t, covered) in ranges.items():
            role = rename.get(name, name)
            roles[role] += t / 1e6
            at = single if marked is None else marked
            if at is not None:
                before, no_op = role_steps.get((at, role), (0.0, 0.0))
                role_steps[(at, role)] = (before + t / 1e6, (no_op or 0.0) + max(t - covered, 0.0) / 1e6)
    overhead = None
    if wall is not None and time_from != "capture":
        # A role capture's overhead is all but its role's range: the step marker around it is profctx's too, and
        # with CUDA activity the profiler's own start-up work lands inside that marker (4 ms seen on an H200).
        inside = sum(t for (_, name), (t, _) in ranges.items() if name == own) if rename else 0.0
        if not inside:
            inside = sum(t for step, t in marked_steps.items() if step in record.steps)
        if inside:
            overhead = max(wall - inside / 1e6, 0.0)
    by_name: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0, 0])
    role_table: dict[str, dict[str, list[float]]] = {}
    for (marked, inside_role, name), (s, t, c) in ops.items():
        at = single if marked is None else marked
        if wanted is not None and at not in wanted:
            continue
        role = rename.get(inside_role, inside_role) if inside_role else (record.role or NO_ROLE)
        for slot in (by_name[name], role_table.setdefault(role, {}).setdefault(name, [0.0, 0.0, 0])):
            slot[0] += s
            slot[1] += t
            slot[2] += c
    role_device: dict[tuple[int | None, str], float] = {}
    if has_device:
        for (marked, inside_role), t in launched.items():
            at = single if marked is None else marked
            if wanted is not None and at not in wanted:
                continue
            role = rename.get(inside_role, inside_role) if inside_role else (record.role or NO_ROLE)
            role_device[(at, role)] = role_device.get((at, role), 0.0) + t / 1e6
        for pair in role_steps:  # a role that launched nothing ran no device work
            if wanted is None or pair[0] in wanted:
                role_device.setdefault(pair, 0.0)
    lanes, nested = _placed(placed, single, rename, wanted)
    return CaptureSummary(
        lanes=lanes, nested=nested,
        record=record, wall_s=wall, roles=dict(roles), ops=_top(by_name, top),
        device_s=device_us / 1e6 if has_device else None,
        device_ops=_top({k: [v[0], v[0], v[1]] for k, v in device.items()}, top),
        files=list(files), problems=problems, role_table=role_table, role_steps=role_steps,
        overhead_s=overhead, time_from=time_from, role_device=role_device,
    )


def _placed(traces: Sequence[TraceFigures], single: int | None, rename: dict[str, str], wanted: set[int] | None) \
        -> tuple[dict[int, tuple[float, float, dict[str, tuple[float, float]], list[_align.Collective]]],
                 dict[tuple[int, str, str], float]]:
    """Return a capture's lanes per step (wall clock, seconds) and its nested roles (see :class:`CaptureSummary`)."""
    lanes: dict[int, tuple[float, float, dict[str, tuple[float, float]], list[_align.Collective]]] = {}
    nested: dict[tuple[int, str, str], float] = {}
    for figures in traces:
        base = figures.base_s or 0.0
        bounds: dict[int, list[float]] = {}
        for step, start, end in figures.step_spans:
            slot = bounds.setdefault(step, [start, end])
            slot[0], slot[1] = min(slot[0], start), max(slot[1], end)
        roles: dict[int, dict[str, list[float]]] = {}
        for at, name, start, end in figures.role_spans:
            placed_at = single if at is None else at
            if placed_at is None:
                continue
            step = placed_at
            slot = roles.setdefault(step, {}).setdefault(rename.get(name, name), [start, end])
            slot[0], slot[1] = min(slot[0], start), max(slot[1], end)
            whole = bounds.setdefault(step, [start, end])
            whole[0], whole[1] = min(whole[0], start), max(whole[1], end)
        for step, (start, end) in bounds.items():
            if wanted is not None and step not in wanted:
                continue
            spans = {n: (base + a / 1e6, base + b / 1e6) for n, (a, b) in roles.get(step, {}).items()}
            found = [_align.Collective(name, base + a / 1e6, base + b / 1e6, rename.get(role, role) if role else None)
                     for at, role, name, a, b in figures.collectives if (single if at is None else at) == step]
            before = lanes.get(step)
            if before is not None:  # several traces of one step on one process (role mode): one lane
                spans = {**before[2], **spans}
                found = sorted([*before[3], *found], key=lambda c: c.start)
                lanes[step] = (min(before[0], base + start / 1e6), max(before[1], base + end / 1e6), spans, found)
            else:
                lanes[step] = (base + start / 1e6, base + end / 1e6, spans, found)
        if figures.listed:
            drawn = set(figures.listed)
            for (at, role, name), (_s, total, _c) in figures.ops.items():
                in_step = single if at is None else at
                if role is None or name not in drawn or name == role or in_step is None:
                    continue
                key = (in_step, rename.get(role, role), name)
                nested[key] = nested.get(key, 0.0) + total / 1e6
    return lanes, nested


def _by_step(item: tuple[tuple[int | None, str], float]) -> tuple[bool, int, str]:
    """Sort key of a ``(step, role)`` table's items: by step (none first), then role."""
    (step, role), _ = item
    return step is not None, step or 0, role


def _top(table: dict[str, list[float]], limit: int) -> list[OpFigure]:
    total = sum(max(v[0], 0.0) for v in table.values())
    ranked = sorted(table.items(), key=lambda kv: -kv[1][0])[:limit]
    return [OpFigure(name, max(s, 0.0) / 1e6, t / 1e6, int(c), (max(s, 0.0) / total) if total else 0.0)
            for name, (s, t, c) in ranked]


def _assemble(root: Path, run: str | None, captures: list[CaptureSummary], engines: list[CaptureSummary],
              problems: list[str], role_ops: dict[str, dict[str, list[float]]], top: int, ratio: float,
              wanted: set[int] | None, driver: Collection[tuple[str, ...]] | None) -> Summary:
    per: dict[tuple[int, str], dict[str, float]] = defaultdict(dict)
    idle: dict[tuple[int, str], dict[str, float | None]] = defaultdict(dict)
    lost: dict[int, dict[str, float]] = defaultdict(dict)
    device: dict[tuple[int, str], dict[str, float]] = defaultdict(dict)
    role_device: dict[str, float] = defaultdict(float)
    spans: dict[int, list[float]] = {}
    processes: list[str] = []
    names = process_names((c.record for c in [*captures, *engines]), driver)
    rows = {key: index for index, key in enumerate(names)}
    for item in [*captures, *engines]:
        item.process = names[item.record.process]
    for item in sorted(captures, key=lambda c: (rows[c.record.process], c.record.begin)):
        r = item.record
        who = item.process
        if who not in processes:
            processes.append(who)
        if r.start_time and r.end_time:
            for step in r.steps:
                span = spans.setdefault(step, [r.start_time, r.end_time])
                span[0], span[1] = min(span[0], r.start_time), max(span[1], r.end_time)
        if r.status != "ok":
            continue
        for (step, role), (seconds, no_op) in item.role_steps.items():
            if wanted is None or step in wanted:
                cell = per[(step, role)]
                cell[who] = cell.get(who, 0.0) + seconds
                gaps = idle[(step, role)]
                before = gaps.get(who, 0.0)
                gaps[who] = None if no_op is None or (who in gaps and before is None) else (before or 0.0) + no_op
        for (step_at, role), seconds in item.role_device.items():
            role_device[role] += seconds
            if step_at is not None:
                cell = device[(step_at, role)]
                cell[who] = cell.get(who, 0.0) + seconds
        if len(r.steps) == 1 and item.overhead_s is not None and (wanted is None or r.steps[0] in wanted):
            cell = lost[r.steps[0]]
            cell[who] = cell.get(who, 0.0) + item.overhead_s
    alignment, clock = _alignment(root, run, captures, names, ratio)
    nested: dict[tuple[int, str], dict[str, dict[str, float]]] = defaultdict(lambda: defaultdict(dict))
    for item in captures:
        if item.record.status == "ok":
            for (step, parent, child), seconds in item.nested.items():
                cell = nested[(step, parent)][child]
                cell[item.process] = cell.get(item.process, 0.0) + seconds
    phases: list[RoleStep] = []
    for (step, role), cells in sorted(per.items()):
        values = list(cells.values())
        worst = max(cells, key=lambda k: cells[k])
        median = statistics.median(values)
        phase = RoleStep(step, role, dict(cells), cells[worst], median, no_op_s=idle[(step, role)].get(worst),
                         device_s=device.get((step, role), {}).get(worst),
                         nested={child: by.get(worst, 0.0) for child, by in nested.get((step, role), {}).items()})
        lined = alignment.get(step)
        if lined is not None and len(lined.processes) >= 2:
            phase.wait = {who: min(lined.wait(who, role), t) for who, t in cells.items()}
        work = {who: t - phase.wait.get(who, 0.0) for who, t in cells.items()}
        busiest = max(work, key=lambda k: work[k])
        phase.work_s = work[busiest]
        phase.others_s = statistics.median([v for k, v in work.items() if k != busiest]) if len(work) >= 2 else 0.0
        if lined is not None and len(lined.processes) >= 2:
            named = lined.straggler
            if named is not None and named.segment == role:
                phase.straggler, phase.lag_s = named.process, named.lag_s
        elif len(values) >= 2 and phase.others_s > 0 and phase.ratio > ratio:
            phase.straggler = busiest  # nothing to line the processes up by: the time over the others'
        phases.append(phase)
    by_step: dict[int, float] = defaultdict(float)
    for p in phases:
        by_step[p.step] += p.time_s
    for p in phases:
        p.share = p.time_s / by_step[p.step] if by_step[p.step] else 0.0
    roles = list(dict.fromkeys(p.role for p in sorted(phases, key=lambda p: (p.step, -p.time_s))))
    for role in role_ops:
        if role not in roles and (role != NO_ROLE or not phases):
            roles.append(role)
    steps = sorted({s for c in captures for s in c.record.steps if wanted is None or s in wanted})
    return Summary(
        save_path=root, run=run, steps=steps, roles=roles, processes=processes, captures=captures,
        phases=phases, step_wall={s: b - a for s, (a, b) in sorted(spans.items()) if wanted is None or s in wanted},
        role_ops={role: _top(dict(table), top) for role, table in role_ops.items()},
        engines=engines, straggler_ratio=ratio, problems=problems,
        overhead={step: max(cells.values()) for step, cells in sorted(lost.items())},
        role_device=dict(role_device), alignment=alignment, clocks=clock,
    )


def _alignment(root: Path, run: str | None, captures: Sequence[CaptureSummary], names: dict[tuple[str, ...], str],
               ratio: float) -> tuple[dict[int, _align.StepAlignment], _align.Clocks | None]:
    """Line up the processes of every captured step: the timelines' entries where every process of the step has
    one (they hold the time before the step), else the traces' ranges; the traces' collectives either way."""
    traced: dict[int, dict[str, list[Any]]] = defaultdict(dict)
    where: dict[str, tuple[str | None, int | None]] = {}
    for item in captures:
        r = item.record
        if r.status != "ok" or not item.lanes:
            continue
        where[item.process] = (r.host, r.pid)
        for step, (start, end, spans, found) in item.lanes.items():
            slot = traced[step].get(item.process)
            if slot is None:
                traced[step][item.process] = [start, end, dict(spans), list(found), r.host or "?"]
            else:
                slot[0], slot[1] = min(slot[0], start), max(slot[1], end)
                slot[2].update(spans)
                slot[3] = sorted([*slot[3], *found], key=lambda c: c.start)
    if not traced:
        return {}, None
    timed = _timeline_lanes(root, run, where) if any(len(v) >= 2 for v in traced.values()) else {}
    steps: dict[int, list[_align.Lane]] = {}
    for step, by_who in traced.items():
        mine = timed.get(step, {})
        if all(who in mine for who in by_who):
            steps[step] = [replace(mine[who], collectives=tuple(slot[3]),
                                   roles=mine[who].roles or tuple((n, a, b) for n, (a, b) in slot[2].items()))
                           for who, slot in by_who.items()]
        else:
            steps[step] = [_align.Lane(who, slot[4], slot[0], slot[1], None,
                                       tuple((n, a, b) for n, (a, b) in slot[2].items()), tuple(slot[3]))
                           for who, slot in by_who.items()]
    for step, lanes in steps.items():
        if any(lane.roles for lane in lanes):  # a process that draws no role (a driver waiting on its workers)
            steps[step] = [lane for lane in lanes if lane.roles]  # has nothing to compare the roles by
    rules = _align.Rules(ratio=ratio, share=0.0)
    # Where the code synchronises is a fact of the whole run: the timelines' steps tell it better than the
    # few captured ones (a capture's own start and stop also shifts its step).
    every = {step: list(by_who.values()) for step, by_who in timed.items() if len(by_who) >= 2}
    clock = _align.clocks({**every, **steps}) if every else _align.clocks(steps)
    sync = _align.sync_points(every, clock, rules) if len(every) >= _align.SYNC_STEPS else None
    return _align.align_steps(steps, clock, rules, sync), clock


def _timeline_lanes(root: Path, run: str | None, where: dict[str, tuple[str | None, int | None]]) \
        -> dict[int, dict[str, _align.Lane]]:
    """Return the timelines' lanes of the processes ``where`` (row name -> host and pid), named as the summary names
    them; empty when the folder holds no timeline of them."""
    from ._timeline import lanes, read

    timelines = read(root, run if run is not None else "latest")
    rename: dict[str, str] = {}
    for process in timelines.processes:
        for who, (host, pid) in where.items():
            if process.host == host and process.pid == pid:
                rename[process.name] = who
    if not rename:
        return {}
    out: dict[int, dict[str, _align.Lane]] = {}
    for step, found in lanes(timelines).items():
        for lane in found:
            named = rename.get(lane.process)
            if named is not None:
                out.setdefault(step, {})[named] = replace(lane, process=named)
    return out
