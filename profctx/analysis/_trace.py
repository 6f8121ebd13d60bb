"""Read one Chrome trace as a stream and keep only its figures: span, roles, self time per operator.

Roles are profctx's own ranges. A trace profctx's torch backend wrote lists, in its metadata
(``profctxRanges``), the role ranges and step markers it drew: a role is the outermost of those
role ranges on its thread; every other range (the user's ``record_function``, torch's own such
as ``gloo:all_reduce``) is an operator. A trace without that list (an older profctx, another
producer) falls back to the outermost user range on each thread. Step markers
(``ProfilerStep#N``, and older profctx's ``step N``) are never roles nor operators: they give
the step a role ran in.

Self time is an event's duration less that of the events nested directly in it on the same
thread (the definition HTA and the TensorBoard plugin use). Nesting needs each thread's events
in time order, so the reader keeps, per complete (``X``) event, its start, duration and an
interned name: about 30 bytes an event against the 250 or so of its JSON, whatever the trace.
"""

from __future__ import annotations

import gc
import math
import re
from array import array
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from itertools import compress, islice, repeat
from operator import add, attrgetter, eq, gt
from pathlib import Path
from typing import Any, Final

from ..core._plan import RANGES_KEY
from ._tracedecode import Event, Unchecked, as_event, events
from ._tracejson import EVENTS, TraceFormatError, TraceStream

#: Categories of device activity (CUDA kernels and copies; torch_npu uses the same names in its JSON).
DEVICE_CATS: Final = frozenset({"kernel", "gpu_memcpy", "gpu_memset", "Kernel", "Memcpy", "Memset"})
#: Categories of user ranges (``record_function``, profctx's role ranges): phases, not operators.
RANGE_CATS: Final = frozenset({"user_annotation"})
#: Categories that are neither: torch's whole-capture span, device-side copies of user ranges.
IGNORED_CATS: Final = frozenset({"Trace", "gpu_user_annotation"})
#: Categories an event of the batch path may not have: those the loop over each event handles apart.
_OPERATOR_ONLY: Final = DEVICE_CATS | RANGE_CATS | IGNORED_CATS
_FIELD: Final = {f: attrgetter(f) for f in ("ph", "cat", "name", "ts", "dur", "pid", "tid")}
#: Types an unchecked batch's times, and its pid, tid and category, may have for the batch path.
_NUMBERS: Final = frozenset({float, int})
_ID_TYPES: Final = frozenset({int, str, type(None)})
#: Names of step markers: torch's (``ProfilerStep#N``, drawn by profctx too) and older profctx's ``step N``.
STEP_MARKER: Final = re.compile(r"(?:ProfilerStep#|step )(-?[0-9]+)")

# What a range name is, per trace (operators, kind 0, need no lookup).
_ROLE, _MARK, _OP, _RANGE = 1, 2, 3, 4


@dataclass
class TraceFigures:
    """What one trace adds up to; times in microseconds.

    ``roles`` maps ``(step, role)`` to ``[total, count, covered]``: the total duration of the
    role's ranges, how many, and how much of them some operator on their thread covers (the rest
    is time in no operator). ``step`` is that of the step marker the range lies in (``None``
    without one). ``ops`` maps ``(step, role, operator)`` to ``[self, total, count]``, where
    ``role`` is the role the operator ran in (``None`` outside any). ``steps`` maps each step
    marked in the trace to ``[total, count]`` of its markers. ``marked``: the trace lists
    profctx's ranges (else roles were taken from the outermost user ranges). ``device`` maps
    kernel names to ``[total, count]``. ``problem`` says why reading stopped early, if it did
    (the figures then cover what was read).
    """

    span_us: float = 0.0
    events: int = 0
    ops: dict[tuple[int | None, str | None, str], list[float]] = field(default_factory=dict)
    roles: dict[tuple[int | None, str], list[float]] = field(default_factory=dict)
    steps: dict[int, list[float]] = field(default_factory=dict)
    marked: bool = False
    device: dict[str, list[float]] = field(default_factory=dict)
    device_us: float = 0.0
    problem: str | None = None


class _Thread:
    __slots__ = ("dur", "kind", "name", "ts")

    def __init__(self) -> None:
        self.ts = array("d")
        self.dur = array("d")
        self.name = array("l")
        self.kind = bytearray()  # 1: a user range, 0: an operator


def read_figures(path: str | Path, root: str | Path | None = None) -> TraceFigures:
    """Stream the trace at ``path`` and return its figures.

    A file cut short or damaged yields the figures of what was read, with ``problem`` set;
    an unreadable file (missing, not a trace, not a regular file inside ``root`` when given) too,
    with empty figures.
    """
    collecting = gc.isenabled()
    gc.disable()  # the parsed events hold no cycles: the collector would only rescan them again and again
    try:
        return _read(path, root)
    finally:
        if collecting:
            gc.enable()


def _read(path: str | Path, root: str | Path | None) -> TraceFigures:
    figures = TraceFigures()
    names: dict[str, int] = {}
    threads: dict[tuple[Any, Any], _Thread] = {}
    lo = float("inf")
    hi = float("-inf")
    drawn: set[str] | None = None
    marks: list[tuple[float, float, int]] = []
    try:
        # Slices are decoded into the seven fields read here (typed: a time is a float or None).
        with TraceStream(path, root, loads=events) as stream:
            for key, batch in stream.batches():
                if key != EVENTS:
                    if key == RANGES_KEY and isinstance(batch, dict) and isinstance(batch.get("roles"), list):
                        drawn = {str(n) for n in batch["roles"]}
                    continue
                if stream.raw is None:  # values decoded one at a time are plain JSON values
                    batch = [e for e in map(as_event, batch) if e is not None]
                unchecked = type(batch) is Unchecked  # the fallback parser's dicts: fields of any type
                # The complete events, picked in C (most of a trace is other phases only in metadata).
                batch = list(compress(batch, map(eq, _column(batch, "ph", unchecked), repeat("X"))))
                taken = _operators(batch, names, threads, unchecked)
                if taken is not None:
                    figures.events += len(batch)
                    lo = min(lo, taken[0])
                    hi = max(hi, taken[1])
                    continue
                if unchecked:
                    batch = [e for e in map(as_event, batch) if e is not None]
                for event in batch:
                    ts = event.ts
                    dur = event.dur
                    if ts is None or dur is None:
                        continue
                    cat = event.cat
                    figures.events += 1
                    if cat in IGNORED_CATS:
                        continue
                    if ts < lo:
                        lo = ts
                    if ts + dur > hi:
                        hi = ts + dur
                    name = event.name
                    if name is None:
                        name = "None"  # as str() of a missing name has always read
                    if cat in DEVICE_CATS:
                        slot = figures.device.get(name)
                        if slot is None:
                            figures.device[name] = [dur, 1]
                        else:
                            slot[0] += dur
                            slot[1] += 1
                        figures.device_us += dur
                        continue
                    where = (event.pid, event.tid)
                    thread = threads.get(where)
                    if thread is None:
                        thread = threads[where] = _Thread()
                    index = names.get(name)
                    if index is None:
                        index = names[name] = len(names)
                    thread.ts.append(ts)
                    thread.dur.append(dur)
                    thread.name.append(index)
                    if cat in RANGE_CATS:
                        thread.kind.append(1)
                        marker = STEP_MARKER.fullmatch(name)
                        if marker is not None:
                            marks.append((ts, ts + dur, int(marker[1])))
                    else:
                        thread.kind.append(0)
    except (TraceFormatError, OSError) as exc:
        figures.problem = str(exc)
    if hi > lo:
        figures.span_us = hi - lo
    figures.marked = drawn is not None
    by_index = list(names)
    kinds = bytearray(_classify(n, drawn) for n in by_index)
    for start, end, step in marks:
        slot = figures.steps.setdefault(step, [0.0, 0])
        slot[0] += end - start
        slot[1] += 1
    for thread in threads.values():
        _nest(thread, by_index, kinds, marks, figures)
    return figures


def _operators(batch: list[Event], names: dict[str, int], threads: dict[tuple[Any, Any], _Thread],
               unchecked: bool = False) -> tuple[float, float] | None:
    """Add a batch of complete events that are all operators of one thread, with times and names, to its
    thread; return the batch's first start and last end. Return ``None`` (nothing added) for any other batch.

    The common batch of a trace, taken in a few passes in C rather than the loop over each event.
    ``unchecked``: the fields may be of any type (checked here, in C, for the whole batch).
    """
    if not batch:
        return None
    try:
        pids = set(_column(batch, "pid", unchecked))
        tids = set(_column(batch, "tid", unchecked))
        cats = set(_column(batch, "cat", unchecked))
    except TypeError:  # a pid, tid or category that is not hashable: the loop over each event names it
        return None
    if len(pids) != 1 or len(tids) != 1 or not _OPERATOR_ONLY.isdisjoint(cats):
        return None
    key = (pids.pop(), tids.pop())
    starts = list(_column(batch, "ts", unchecked))
    durations = list(_column(batch, "dur", unchecked))
    labels = list(_column(batch, "name", unchecked))
    if unchecked:
        if (not set(map(type, starts)).union(map(type, durations)) <= _NUMBERS
                or set(map(type, labels)) != {str} or not _ID_TYPES.issuperset(map(type, key))
                or not _ID_TYPES.issuperset(map(type, cats))):
            return None
        try:  # msgspec's floats are finite; the fallback parser may give NaN, infinities, huge integers
            if not (math.isfinite(math.fsum(starts)) and math.isfinite(math.fsum(durations))):
                return None  # a time that is not a number: the loop over each event takes it as it always has
        except OverflowError:  # an integer past any float
            return None
    elif None in starts or None in durations or None in labels:
        return None
    thread = threads.get(key)
    if thread is None:
        thread = threads[key] = _Thread()
    for name in set(labels).difference(names):
        names[name] = len(names)
    thread.ts.extend(starts)
    thread.dur.extend(durations)
    thread.name.extend(map(names.__getitem__, labels))
    thread.kind.extend(bytes(len(batch)))
    return min(starts), max(map(add, starts, durations))


def _column(batch: list[Any], field: str, unchecked: bool) -> Iterator[Any]:
    """Iterate over one field of every event of ``batch`` (structs, or dicts when ``unchecked``), in C."""
    return map(dict.get, batch, repeat(field)) if unchecked else map(_FIELD[field], batch)


def _classify(name: str, drawn: set[str] | None) -> int:
    if STEP_MARKER.fullmatch(name):
        return _MARK
    if drawn is None:
        return _ROLE  # no list: the outermost user range is the role, nested ones are left out
    return _ROLE if name in drawn else _OP


def _step_at(marks: list[tuple[float, float, int]], ts: float) -> int | None:
    for start, end, step in marks:
        if start - 1e-3 <= ts < end:
            return step
    return None


def _nest(thread: _Thread, names: list[str], kinds: bytearray, marks: list[tuple[float, float, int]],
          figures: TraceFigures) -> None:
    ts, dur, name, kind = thread.ts, thread.dur, thread.name, thread.kind
    n = len(ts)
    order: Iterable[int] = range(n)
    if any(map(gt, ts, islice(ts, 1, None))):  # out of time order (pairwise, in C)
        # By start, the longer first at one start: two stable sorts with keys read in C, not a key tuple
        # per event (which took five times the memory of the events' figures).
        order = sorted(sorted(range(n), key=dur.__getitem__, reverse=True), key=ts.__getitem__)
    ops = figures.ops
    roles = figures.roles
    # Stack entries: [end, index, child time, role key (step, name) or None, step, covered by an operator,
    # is an operator].
    stack: list[list[Any]] = []

    def close(entry: list[Any]) -> None:
        if not entry[6]:
            return
        i = entry[1]
        role = entry[3]
        key = (entry[4], None if role is None else role[1], names[name[i]])
        slot = ops.get(key)
        length = dur[i]
        if slot is None:
            ops[key] = [length - entry[2], length, 1]
        else:
            slot[0] += length - entry[2]
            slot[1] += length
            slot[2] += 1

    for i in order:
        start = ts[i]
        length = dur[i]
        # 1 ns of slack: torch rounds times to ns, so a sibling may seem to start inside the previous one.
        limit = start + 1e-3
        while stack and stack[-1][0] <= limit:
            entry = stack.pop()
            if entry[6]:  # close(entry), written out: it runs once for every operator
                j = entry[1]
                role = entry[3]
                key = (entry[4], None if role is None else role[1], names[name[j]])
                slot = ops.get(key)
                if slot is None:
                    ops[key] = [dur[j] - entry[2], dur[j], 1]
                else:
                    slot[0] += dur[j] - entry[2]
                    slot[1] += dur[j]
                    slot[2] += 1
        if stack:
            parent = stack[-1]
            parent[2] += length
            role, step, covered = parent[3], parent[4], parent[5]
        else:
            role = step = None
            covered = False
        if not kind[i]:  # an operator: most events
            if role is not None and not covered:
                roles[role][2] += length
            stack.append([start + length, i, 0.0, role, step, True, True])
            continue
        what = kinds[name[i]]
        if what == _ROLE:
            if role is None:
                if step is None:
                    step = _step_at(marks, start)
                role = (step, names[name[i]])
                slot = roles.get(role)
                if slot is None:
                    roles[role] = [length, 1, 0.0]
                else:
                    slot[0] += length
                    slot[1] += 1
                stack.append([start + length, i, 0.0, role, step, False, False])
                continue
            # A role range inside a role: an operator of the outer role in a listed trace, else left out.
            what = _OP if figures.marked else _RANGE
        if what == _MARK:
            match = STEP_MARKER.fullmatch(names[name[i]])
            stack.append([start + length, i, 0.0, role, int(match[1]) if match else step, covered, False])
        elif what == _OP:
            if role is not None and not covered:
                roles[role][2] += length
            stack.append([start + length, i, 0.0, role, step, True, True])
        else:
            stack.append([start + length, i, 0.0, role, step, covered, False])
    while stack:
        close(stack.pop())
