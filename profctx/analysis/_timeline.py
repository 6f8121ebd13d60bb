"""Read a run's step timelines and mark anomalous steps and stragglers.

Each process that marks steps writes ``{save_path}/.profctx/*.timeline`` (see
:mod:`profctx.process._timeline`): a header line naming the run and the process, then one JSON line
per step (``step``, ``start``, ``time_s``, ``roles``: name -> [seconds, blocks]) and, when steps were
dropped, a ``dropped`` line. The folder is untrusted input: only regular files inside it are read
(:mod:`profctx.util._untrusted`), a line longer than :data:`MAX_LINE` is skipped unread, at most
:data:`MAX_BYTES` are read over all files, and a line that does not parse (a torn last line after a
crash, garbage) is counted and skipped.

The rules, one pure function each (:func:`anomalies`, :func:`stragglers`):

- a step is **anomalous** when its time (the median over processes) exceeds ``factor`` (2) times
  the median of the ``window`` (20) steps before it, with at least ``min_history`` (5) of them, and by
  at least ``min_s`` (1 ms); a step in which a role (or engine) capture of the run's manifest started and
  stopped is never anomalous, nor in any step's history: the capture's own start and stop fall inside it;
- a process **straggles** in a step when its time exceeds ``ratio`` (1.5) times the median of the
  other processes' times in that step, and by at least ``min_s``.
"""

from __future__ import annotations

import heapq
import html
import os
import statistics
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final, TextIO

from ..core._layout import MANIFEST_DIR
from ..util._units import seconds_text as _secs
from ..util._untrusted import MAX_LISTED, UnsafeFileError, names_in, open_regular, too_deep
from . import _align
from ._timeline_steps import Steps

#: How a timeline file's name ends (see :mod:`profctx.process._timeline`).
SUFFIX: Final = ".timeline"
SCHEMA: Final = "profctx.timeline"
#: Version of the JSON document :func:`to_json` returns.
VERSION: Final = 1
#: Highest line-format version read; newer lines are skipped (2 adds each role's first entry and last exit).
LINE_VERSION: Final = 2
#: A line longer than this is skipped unread (a step line is about 100 bytes, plus 40 per role).
MAX_LINE: Final = 1 << 20
#: Bytes read at most over all timeline files of a folder.
MAX_BYTES: Final = 512 << 20
#: Timeline files read at most.
MAX_FILES: Final = 10_000

ANOMALY_FACTOR: Final = 2.0
ANOMALY_WINDOW: Final = 20
MIN_HISTORY: Final = 5
STRAGGLER_RATIO: Final = 1.5
MIN_S: Final = 0.001


@dataclass
class Process:
    """One process's timeline (one file; a process whose rank changed writes a second file)."""

    name: str
    run: str
    rank: int | None
    world_size: int | None
    group: str | None
    host: str
    pid: int | None
    file: str
    steps: Steps = field(default_factory=Steps)
    dropped: int = 0


@dataclass
class Timelines:
    """What a folder holds: the processes of the run chosen, the runs present, what could not be read."""

    processes: list[Process]
    runs: list[str]
    damaged: list[str]
    truncated: bool = False
    #: Steps of the chosen run in which profctx captured a role or an engine (from the manifest beside the
    #: timelines): each role's capture starts and stops inside the step, so its time is not judged an anomaly.
    captured: frozenset[int] = frozenset()


def files(save_path: str | os.PathLike[str]) -> list[Path]:
    """Return the timeline files under ``save_path`` (none when the manifest folder is a link or outside it)."""
    folder = Path(save_path) / MANIFEST_DIR
    names = names_in(save_path, MANIFEST_DIR, MAX_LISTED)
    return [folder / n for n in names if n.endswith(SUFFIX)][:MAX_FILES]


def _lines(path: Path, root: str | os.PathLike[str], budget: list[int], damaged: list[str]) -> Iterable[bytes]:
    """Yield the whole lines of ``path`` (a line over :data:`MAX_LINE`, or a torn last line, is left out)."""
    try:
        handle = open_regular(path, root)
    except UnsafeFileError as exc:
        damaged.append(f"{path.name}: not read ({exc})")
        return
    except OSError as exc:
        damaged.append(f"{path.name}: unreadable ({exc.strerror or exc})")
        return
    with handle:
        number = 0
        while budget[0] > 0:
            line = handle.readline(min(MAX_LINE + 1, budget[0]))
            if not line:
                return
            budget[0] -= len(line)
            number += 1
            if not line.endswith(b"\n"):
                if len(line) > MAX_LINE:  # skip to the end of the line, unheld
                    damaged.append(f"{path.name}:{number} (a line over {MAX_LINE >> 20} MB, not read)")
                    while budget[0] > 0:
                        rest = handle.readline(min(MAX_LINE, budget[0]))
                        budget[0] -= len(rest)
                        if not rest or rest.endswith(b"\n"):
                            break
                    continue
                if budget[0] > 0:
                    damaged.append(f"{path.name}:{number} (a torn last line: the process was cut short)")
                return
            yield line


def _number(value: Any) -> float | None:
    if type(value) in (int, float) and value == value and abs(value) != float("inf"):
        return float(value)
    return None


def _text(value: Any, limit: int = 200) -> str | None:
    return value[:limit] if isinstance(value, str) else None


def read(save_path: str | os.PathLike[str], run: str | None = "latest") -> Timelines:
    """Return the timelines under ``save_path`` of ``run`` (``"latest"``: the run that started last; ``None``: all).

    Never raises for what a file holds; unreadable files and lines are listed in ``damaged``.
    """
    import json

    damaged: list[str] = []
    budget = [MAX_BYTES]
    found: list[Process] = []
    for path in files(save_path):
        process: Process | None = None
        bad: list[int] = []  # lines that do not parse or say nothing this reader understands
        for number, line in enumerate(_lines(path, save_path, budget, damaged), 1):
            try:
                record = json.loads(line)
            except (ValueError, RecursionError):
                bad.append(number)
                continue
            if type(record) is not dict or (line.count(b"{") + line.count(b"[") > 64 and too_deep(line)):
                bad.append(number)
                continue
            if "schema" in record:
                version = record.get("v")
                if record.get("schema") != SCHEMA or type(version) is not int or version > LINE_VERSION:
                    damaged.append(f"{path.name}: not a timeline this reader understands")
                    process = None
                    break
                rank, size, pid = record.get("rank"), record.get("world_size"), record.get("pid")
                process = Process(
                    name="", run=_text(record.get("run")) or "-",
                    rank=rank if type(rank) is int else None, world_size=size if type(size) is int else None,
                    group=_text(record.get("group"), 64), host=_text(record.get("host")) or "?",
                    pid=pid if type(pid) is int else None, file=path.name)
                found.append(process)
                continue
            if process is None:
                bad.append(number)
                continue
            if "capped" in record:  # the writer stopped at max_timeline_bytes: the line says where
                continue
            if "dropped" in record:
                dropped = record.get("dropped")
                if type(dropped) is int and dropped >= 0:
                    process.dropped = max(process.dropped, dropped)
                continue
            step, seconds = record.get("step"), _number(record.get("time_s"))
            if type(step) is not int or step < 0 or seconds is None or seconds < 0:
                bad.append(number)
                continue
            roles: dict[str, tuple[float, int]] = {}
            spans: dict[str, tuple[float, float]] = {}
            raw = record.get("roles")
            broken = False
            if isinstance(raw, dict):
                for name, value in list(raw.items())[:256]:
                    if isinstance(value, list) and len(value) in (2, 4) and type(value[1]) is int:
                        spent = _number(value[0])
                        if spent is not None and spent >= 0:
                            roles[str(name)[:200]] = (spent, value[1])
                            first, last = (_number(v) for v in value[2:4]) if len(value) == 4 else (None, None)
                            if first is not None and last is not None and 0 <= first <= last <= seconds + 1e-6:
                                spans[str(name)[:200]] = (first, last)
                        elif type(value[0]) in (int, float):  # NaN, an infinity, a negative time: damage
                            broken = True
            if broken:
                bad.append(number)
                continue
            process.steps.add(step, seconds, _number(record.get("start")), roles, spans)
        if bad:
            shown = ", ".join(map(str, bad[:5])) + (f" and {len(bad) - 5} more" if len(bad) > 5 else "")
            damaged.append(f"{path.name}: {len(bad)} unreadable line(s) skipped (line {shown})")
    for process in found:
        process.steps.seal()
    runs = _runs(found)
    chosen = (runs[-1] if runs else None) if run == "latest" else run
    kept = [p for p in found if chosen is None or p.run == chosen]
    _name(kept)
    return Timelines(kept, runs, damaged, truncated=budget[0] <= 0, captured=_captured(save_path, chosen))


def _captured(save_path: str | os.PathLike[str], run: str | None) -> frozenset[int]:
    """Return the steps of ``run`` (``None``: every run) some role or engine capture of the manifest covers.

    A step-mode capture starts before the step block reads its clock and stops after it, so its step's time
    holds none of it; a role's (and the engine a role drives) starts and stops inside the step. A capture the
    writer skipped (a cap) never started.
    """
    from ..manifest import ManifestReader

    steps: set[int] = set()
    for record in ManifestReader(save_path, run, lean=True):
        if record.kind in ("role", "engine") and record.status != "skipped" and (run is None or record.run == run):
            steps.update(s for s in record.steps if s >= 0)
    return frozenset(steps)


def _runs(processes: Sequence[Process]) -> list[str]:
    """Return the runs in order of their first step's start (the latest last)."""
    first: dict[str, float] = {}
    for process in processes:
        starts = (process.steps.start(i) for i in range(len(process.steps)))
        when = min((s for s in starts if s is not None), default=0.0)
        first[process.run] = min(first.get(process.run, when), when)
    return sorted(first, key=lambda r: (first[r], r))


def _name(processes: list[Process]) -> None:
    """Name each process ``rankR`` (``group/rankR`` in a worker group, ``driver`` outside every group of a run
    with groups); a name taken twice gets its host and pid."""
    grouped = {p.run for p in processes if p.group}
    for process in processes:
        rank = "?" if process.rank is None else str(process.rank)
        if process.group:
            process.name = f"{process.group}/rank{rank}"
        else:
            process.name = "driver" if process.run in grouped else f"rank{rank}"
    counts: dict[str, int] = {}
    for process in processes:
        counts[process.name] = counts.get(process.name, 0) + 1
    for process in processes:
        if counts[process.name] > 1:
            process.name = f"{process.name}@{process.host}:{process.pid}"


# -- the analysis: pure functions ---------------------------------------------------------------


@dataclass
class Anomaly:
    """A step slower than ``ratio`` times the median of the steps before it (``baseline_s``)."""

    ratio: float
    baseline_s: float
    history: int
    #: The step was captured in role mode (:attr:`Timelines.captured`): shown, never counted as an anomaly.
    captured: bool = False


@dataclass
class Straggler:
    """The process the others waited for in a step (see :mod:`profctx.analysis._align`).

    ``time_s``: its step time; ``ratio``: its work in ``segment`` over the median of the other processes'
    (``None`` when theirs is 0); ``lag_s``: the lag it accrued there; ``answer``: the line a user reads.
    From a timeline that records no role entries (written before they were kept): a process whose step
    time exceeds ``ratio`` times the median of the others', ``segment`` ``None``.
    """

    process: str
    time_s: float
    ratio: float | None
    segment: str | None = None
    lag_s: float | None = None
    answer: str = ""


@dataclass
class StepRow:
    """One step across processes."""

    step: int
    time_s: float
    max_s: float
    slowest: str
    times: dict[str, float]
    roles: dict[str, float]
    counts: dict[str, int]
    anomaly: Anomaly | None = None
    stragglers: list[Straggler] = field(default_factory=list)
    #: What the anomaly rule finds in a step profctx captured in role mode: its own capture's cost, not counted.
    captured: Anomaly | None = None
    #: The processes lined up on one clock (``None``: some process's timeline gives no entry times).
    alignment: _align.StepAlignment | None = None

    def to_json(self) -> dict[str, Any]:
        """Return this row as JSON-safe values."""
        return {
            "step": self.step, "time_s": self.time_s, "max_s": self.max_s, "slowest": self.slowest,
            "processes": self.times,
            "roles": {name: {"time_s": t, "count": self.counts.get(name, 0)} for name, t in self.roles.items()},
            "anomaly": None if self.anomaly is None else {"ratio": self.anomaly.ratio,
                                                          "baseline_s": self.anomaly.baseline_s,
                                                          "history": self.anomaly.history},
            "captured": None if self.captured is None else {"ratio": self.captured.ratio,
                                                            "baseline_s": self.captured.baseline_s,
                                                            "history": self.captured.history},
            "stragglers": [{"process": s.process, "time_s": s.time_s, "ratio": s.ratio, "segment": s.segment,
                            "lag_s": s.lag_s, "answer": s.answer} for s in self.stragglers],
            "alignment": None if self.alignment is None else self.alignment.to_json(),
            "answer": None if self.alignment is None else _align.answer(self.alignment),
        }


@dataclass(frozen=True)
class Rules:
    """The thresholds of :func:`anomalies` and :func:`stragglers`."""

    factor: float = ANOMALY_FACTOR
    window: int = ANOMALY_WINDOW
    min_history: int = MIN_HISTORY
    straggler_ratio: float = STRAGGLER_RATIO
    min_s: float = MIN_S

    def to_json(self) -> dict[str, Any]:
        """Return the rules as stated in the JSON document."""
        return {
            "anomaly": {"factor": self.factor, "window": self.window, "min_history": self.min_history,
                        "min_s": self.min_s,
                        "rule": "median time over processes > factor x median of the previous `window` steps "
                                "(at least `min_history` of them), by at least min_s; a step with a role capture "
                                "(captured_steps) is left out of every history and never an anomaly"},
            "straggler": {**self.align().to_json(),
                          "fallback": "without role entries in a timeline: a process's step time > ratio x median "
                                      "of the other processes' times, by at least min_s"},
        }

    def align(self) -> _align.Rules:
        """Return the alignment's rules: this straggler ratio, lags of at least ``min_s`` (5 ms at least)."""
        return _align.Rules(ratio=self.straggler_ratio, min_s=max(self.min_s, _align.Rules().min_s))


def anomalies(times: Sequence[float], rules: Rules, captured: Sequence[bool] = ()) -> list[Anomaly | None]:
    """Return, per step of ``times`` (in step order), its :class:`Anomaly` or ``None``.

    A step ``captured`` flags (profctx's own capture start and stop fall inside it) is left out of every
    step's history, and an anomaly of its own has ``captured`` set (a caller shows it, never counts it).
    """
    out: list[Anomaly | None] = []
    history: list[float] = []  # the last `window` uncaptured steps' times
    for i, value in enumerate(times):
        skipped = i < len(captured) and captured[i]
        found: Anomaly | None = None
        if len(history) >= rules.min_history:
            base = statistics.median(history)
            if value > rules.factor * base and value - base >= rules.min_s:
                found = Anomaly(value / base if base > 0 else float("inf"), base, len(history), skipped)
        out.append(found)
        if not skipped:
            history.append(value)
            if len(history) > rules.window:
                del history[0]
    return out


def stragglers(times: Mapping[str, float], rules: Rules) -> list[Straggler]:
    """Return the processes of one step (``times``: process -> seconds) that straggle, slowest first."""
    if len(times) < 2:
        return []
    found = []
    for name, value in times.items():
        others = statistics.median([v for n, v in times.items() if n != name])
        if value > rules.straggler_ratio * others and value - others >= rules.min_s:
            found.append(Straggler(name, value, value / others if others > 0 else float("inf")))
    return sorted(found, key=lambda s: -s.time_s)


def rows(timelines: Timelines, rules: Rules = Rules()) -> list[StepRow]:
    """Return one row per step of the run, in step order, anomalies and stragglers marked (see :func:`iter_rows`)."""
    return list(iter_rows(timelines, rules))


def iter_rows(timelines: Timelines, rules: Rules = Rules()) -> Iterator[StepRow]:
    """Yield one row per step of the run, in step order, anomalies and stragglers marked.

    Each row is made when asked for: a caller that does not keep them holds one at a time (and the
    anomaly rule's window), whatever the length of the run.
    """
    processes = timelines.processes
    aligner = _Aligner(timelines, rules)
    history: list[float] = []  # the last `window` uncaptured steps' median times
    for step in _step_order(processes):
        times: dict[str, float] = {}
        spent: dict[str, list[float]] = {}
        counts: dict[str, int] = {}
        for process in processes:
            at = process.steps.row(step)
            if at is None:
                continue
            entry = process.steps.entry(at)
            times[process.name] = entry.time_s
            for name, (seconds, count) in entry.roles.items():
                spent.setdefault(name, []).append(seconds)
                counts[name] = counts.get(name, 0) + count
        slowest = max(times, key=lambda n: times[n])
        roles = {name: statistics.median(values) for name, values in spent.items()}
        row = StepRow(step, statistics.median(times.values()), times[slowest], slowest, times, roles, counts)
        row.stragglers = stragglers(times, rules)
        aligner.mark(row)
        captured = step in timelines.captured
        (found,) = anomalies([*history, row.time_s], rules, [False] * len(history) + [captured])[-1:]
        if found is not None and found.captured:
            row.captured = found
        else:
            row.anomaly = found
        if not captured:
            history.append(row.time_s)
            if len(history) > rules.window:
                del history[0]
        yield row


def _step_order(processes: Sequence[Process]) -> Iterator[int]:
    """Yield every step some process gives, in order, once."""
    last: int | None = None
    for step in heapq.merge(*(iter(p.steps) for p in processes)):
        if step != last:
            yield step
            last = step


class _Lanes(Mapping[int, list[_align.Lane]]):
    """Each step's processes as lanes, made when asked for (steps some process gives no entry time of are left
    out; with ``least``, steps of fewer lanes too)."""

    def __init__(self, timelines: Timelines, least: int = 1) -> None:
        self._processes = timelines.processes
        self._least = least
        self._len: int | None = None

    def lanes(self, step: int) -> list[_align.Lane]:
        out = []
        for process in self._processes:
            steps = process.steps
            row = steps.row(step)
            start = None if row is None else steps.start(row)
            if row is None or start is None:
                continue
            before_start = steps.start(row - 1) if row > 0 else None
            before = None if before_start is None else before_start + steps.time_s(row - 1)
            entry = steps.entry(row)
            spans = tuple((n, start + a, start + b) for n, (a, b) in entry.spans.items())
            out.append(_align.Lane(process.name, process.host, start, start + entry.time_s, before, spans))
        return out

    def __getitem__(self, step: int) -> list[_align.Lane]:
        found = self.lanes(step)
        if not found or len(found) < self._least:
            raise KeyError(step)
        return found

    def __iter__(self) -> Iterator[int]:
        for step in _step_order(self._processes):
            if len(self.lanes(step)) >= max(self._least, 1):
                yield step

    def __len__(self) -> int:
        if self._len is None:
            self._len = sum(1 for _ in self)
        return self._len

    def items(self) -> Iterator[tuple[int, list[_align.Lane]]]:  # type: ignore[override]
        for step in _step_order(self._processes):
            found = self.lanes(step)
            if found and len(found) >= self._least:
                yield step, found

    def values(self) -> Iterator[list[_align.Lane]]:  # type: ignore[override]
        return (found for _, found in self.items())


def lanes(timelines: Timelines) -> dict[int, list[_align.Lane]]:
    """Return each step's processes as :class:`profctx.analysis._align.Lane` (steps some process gives no
    entry time of are left out)."""
    return dict(_Lanes(timelines).items())


class _Aligner:
    """Line the processes up and name the stragglers from that, where every process gives entry times.

    The clocks and the segments that synchronise the processes are facts of the whole run, found first
    (walking the steps, none kept); each row is then aligned alone.
    """

    def __init__(self, timelines: Timelines, rules: Rules) -> None:
        self.on = False
        self._lanes = _Lanes(timelines)
        if any(not p.steps or p.steps.unspanned for p in timelines.processes) or not any(True for _ in self._lanes):
            return  # a timeline without role entries: the step-time rule stays
        self.on = True
        self.clock = _align.clocks(self._lanes)
        self.rule = rules.align()
        every = _Lanes(timelines, least=2)
        self.sync = _align.sync_points(every, self.clock, self.rule) if len(every) >= _align.SYNC_STEPS else None

    def mark(self, row: StepRow) -> None:
        if not self.on:
            return
        here = self._lanes.lanes(row.step)
        if len(here) < 2 or len(here) != len(row.times):
            return
        row.alignment = _align.align(row.step, here, self.clock, self.rule, self.sync)
        s = row.alignment.straggler
        row.stragglers = [] if s is None else [
            Straggler(s.process, row.times[s.process], s.ratio, s.segment, s.lag_s, _align.answer(row.alignment))]


def role_order(found: Sequence[StepRow]) -> list[str]:
    """Return the role names of ``found``, by total time, largest first."""
    totals: dict[str, float] = {}
    for row in found:
        for name, seconds in row.roles.items():
            totals[name] = totals.get(name, 0.0) + seconds
    return sorted(totals, key=lambda n: (-totals[n], n))


def to_json(timelines: Timelines, found: Sequence[StepRow], rules: Rules) -> dict[str, Any]:
    """Return the versioned ``profctx.timeline`` document."""
    return {
        "schema": SCHEMA, "version": VERSION,
        "run": timelines.processes[0].run if timelines.processes else None,
        "runs": timelines.runs,
        "processes": [{"name": p.name, "rank": p.rank, "world_size": p.world_size, "group": p.group,
                       "host": p.host, "pid": p.pid, "file": p.file, "steps": len(p.steps), "dropped": p.dropped}
                      for p in timelines.processes],
        "rules": rules.to_json(),
        "roles": role_order(found),
        "steps": [row.to_json() for row in found],
        "anomalies": [row.step for row in found if row.anomaly is not None],
        "captured_steps": sorted(timelines.captured),
        "straggler_steps": [row.step for row in found if row.stragglers],
        "clocks": _clocks_json(timelines),
        "damaged": timelines.damaged,
        "truncated": timelines.truncated,
    }


def dump_json(timelines: Timelines, found: Iterable[StepRow], rules: Rules, stream: TextIO,
              extra: Mapping[str, Any] | None = None) -> None:
    """Write :func:`to_json`'s document (and ``extra``'s keys after it) to ``stream`` as ``json.dump(..., indent=1)``
    would, its steps one at a time: ``found`` is walked twice (rows made afresh each time: none is kept)."""
    import json

    totals: dict[str, float] = {}
    marked: list[int] = []
    straggling: list[int] = []
    for row in found:
        for name, seconds in row.roles.items():
            totals[name] = totals.get(name, 0.0) + seconds
        if row.anomaly is not None:
            marked.append(row.step)
        if row.stragglers:
            straggling.append(row.step)
    head = to_json(timelines, [], rules)
    head["roles"] = sorted(totals, key=lambda n: (-totals[n], n))
    head["anomalies"], head["straggler_steps"] = marked, straggling
    document = {**head, **(extra or {})}

    def value(v: Any, indent: str) -> str:
        return json.dumps(v, indent=1).replace("\n", "\n" + indent)

    stream.write("{")
    for i, (key, v) in enumerate(document.items()):
        stream.write(("," if i else "") + "\n " + json.dumps(key) + ": ")
        if key != "steps":
            stream.write(value(v, " "))
            continue
        first = True
        for row in found:
            stream.write(("[" if first else ",") + "\n  " + value(row.to_json(), "  "))
            first = False
        stream.write("[]" if first else "\n ]")
    stream.write("\n}")


def _clocks_json(timelines: Timelines) -> dict[str, Any] | None:
    by_step = _Lanes(timelines)
    return _align.clocks(by_step).to_json() if any(True for _ in by_step) else None


# -- the HTML report's section ---------------------------------------------------------------------


def html_section(save_path: str | os.PathLike[str], run: str | None, rules: Rules = Rules()) -> str:
    """Return the report's "Step timeline" section: step times as an inline SVG, anomalies marked; ``""`` if none."""
    timelines = read(save_path, run if run is not None else "latest")
    # Two walks over rows made afresh (none kept): the first for the scale and the marked steps, the second
    # for the bars, one a pixel column at most (a column's bar: its slowest step, red or orange if any is).
    count, first, last, peak = 0, 0, 0, 0.0
    flagged: list[StepRow] = []
    for row in iter_rows(timelines, rules):
        first, last = (row.step if count == 0 else first), row.step
        count += 1
        peak = max(peak, row.max_s)
        if (row.anomaly is not None or row.stragglers) and len(flagged) < 50:
            row.alignment = None
            flagged.append(row)
    if not count:
        return ""
    e = html.escape
    width, height, left, top = 1180, 160, 60, 10
    peak = peak or 1.0
    columns = width - left - 10
    per = -(-count // columns)  # steps a bar
    step_w = columns / max(-(-count // per), 1)
    bars: list[str] = []
    column: list[StepRow] = []
    for row in iter_rows(timelines, rules):
        column.append(row)
        if len(column) == per:
            bars.append(_bar(column, len(bars), left, step_w, height, top, peak))
            column = []
    if column:
        bars.append(_bar(column, len(bars), left, step_w, height, top, peak))
    axis = (f'<text x="{left - 4}" y="{top + 8}" text-anchor=end font-size=10>{e(_secs(peak))}</text>'
            f'<text x="{left - 4}" y="{height - 20}" text-anchor=end font-size=10>0</text>'
            f'<text x="{left}" y="{height - 6}" font-size=10>step {first}</text>'
            f'<text x="{width - 10}" y="{height - 6}" text-anchor=end font-size=10>step {last}</text>')
    table = ""
    if flagged:
        cells = "".join(
            f"<tr><td>{r.step}</td><td>{e(_secs(r.time_s))}</td><td>{e(_secs(r.max_s))} {e(r.slowest)}</td>"
            f"<td>{e(_flags(r))}</td></tr>" for r in flagged)
        table = f"<table><tr><th>step</th><th>time</th><th>max</th><th>marked</th></tr>{cells}</table>"
    names = ", ".join(p.name for p in timelines.processes[:20])
    return (f"<h2 id=step-timeline>Step timeline</h2><p class=hint>Every step's wall time (median over processes; "
            f"{len(timelines.processes)} process(es): {e(names)}), profiled or not. Red: an anomaly (over "
            f"{rules.factor:g}x the median of the previous {rules.window} steps); orange: a straggler (a process over "
            f"{rules.straggler_ratio:g}x the median of the others). <code>profctx timeline</code> prints it per "
            f"role.</p><svg width={width} height={height} role=img>{axis}{''.join(bars)}</svg>{table}")


def _bar(column: Sequence[StepRow], i: int, left: float, step_w: float, height: int, top: int, peak: float) -> str:
    """Return the bar of one step, or of the steps of one pixel column (its slowest step's height)."""
    row = max(column, key=lambda r: r.time_s)
    x = left + i * step_w
    h = (height - top - 20) * row.time_s / peak
    anomalous = any(r.anomaly is not None for r in column)
    colour = "#be0032" if anomalous else ("#f38400" if any(r.stragglers for r in column) else "#0067a5")
    if len(column) == 1:
        tip = f"step {row.step}: {_secs(row.time_s)} (median over processes), max {_secs(row.max_s)} {row.slowest}"
        if row.anomaly is not None:
            tip += f"; anomaly: {row.anomaly.ratio:.1f}x the median of the previous {row.anomaly.history} steps"
        if row.stragglers:
            tip += "; " + _flags(row)
    else:
        marked = sum(1 for r in column if r.anomaly is not None or r.stragglers)
        tip = (f"steps {column[0].step}-{column[-1].step}: the slowest, step {row.step}, {_secs(row.time_s)} "
               f"(median over processes)" + (f"; {marked} marked" if marked else ""))
    return (f'<rect x="{x:.1f}" y="{height - 20 - h:.1f}" width="{max(step_w - 1, 0.5):.1f}" '
            f'height="{h:.1f}" fill="{colour}"><title>{html.escape(tip)}</title></rect>')


def _flags(row: StepRow) -> str:
    parts = []
    if row.anomaly is not None:
        parts.append(f"anomaly: {row.anomaly.ratio:.1f}x the median of the {row.anomaly.history} steps before")
    if row.captured is not None:
        parts.append(f"captured: {row.captured.ratio:.1f}x, profctx's own capture start and stop (not an anomaly)")
    for s in row.stragglers[:3]:
        if s.segment is not None:
            parts.append(f"straggler {s.answer}")
        else:
            parts.append(f"straggler {s.process} {s.ratio:.1f}x" if s.ratio is not None else f"straggler {s.process}")
    if len(row.stragglers) > 3:
        parts.append(f"+{len(row.stragglers) - 3} stragglers")
    return "; ".join(parts)


def flags(row: StepRow) -> str:
    """Return what is marked in ``row``, as one line: the anomaly and the stragglers."""
    return _flags(row)


