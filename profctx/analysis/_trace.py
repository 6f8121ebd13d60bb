"""Read one Chrome trace as a stream and keep only its figures: span, roles, self time per operator.

Roles are profctx's own ranges. A trace profctx's torch backend wrote lists, in its metadata
(``profctxRanges``), the role ranges and step markers it drew: a role is the outermost of those
role ranges on its thread; every other range (the user's ``record_function``, torch's own such
as ``gloo:all_reduce``) is an operator. A trace without that list (an older profctx, another
producer) falls back to the outermost user range on each thread. Step markers
(``ProfilerStep#N``, and older profctx's ``step N``) are never roles nor operators: they give
the step a role ran in.

Self time is an event's duration less that of the events nested directly in it on the same
thread (the definition HTA and the TensorBoard plugin use). Work on a thread that draws no role
of its own (gloo's thread of a collective, autograd's thread of a backward) is lent the role
whose range, on another thread of the same process, holds the event's start, when exactly one
does: its operators are listed in that role (a role's total and covered times stay those of its
own thread).

Device time (kernels, copies) is given per role: each device event carries the correlation id of
the runtime call that launched it (``cudaLaunchKernel``, ``cuLaunchKernel``: categories
:data:`RUNTIME_CATS`), and the launch, on its CPU thread, lies in a role range (or is lent one, as
above) or in none. A kernel runs after its launch, often after the role's range has closed: by
correlation, not by time, it still counts in the role that launched it. The correlation is decoded
only once a trace shows device or runtime events: CPU-only traces never pay for decoding ``args``.

Nesting needs each thread's events in time order, so the reader keeps, per complete (``X``)
event, its start, duration and an interned name: about 30 bytes an event against the 250 or so of
its JSON, whatever the trace; :mod:`profctx.analysis._nesting` nests them once the trace is read.
Most batches of events are added to their threads in a few passes in C per field; a batch with a
missing time or name, odd types or many threads takes the loop over each event.
"""

from __future__ import annotations

import gc
import math
from array import array
from bisect import bisect_right
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from itertools import compress, repeat
from operator import add, attrgetter, eq, not_, sub
from pathlib import Path
from typing import Any, Final, cast

from ..core._plan import RANGES_KEY
from ..util._untrusted import Budget
from ._nesting import MARK, OP, ROLE, STEP_MARKER, Lent, Span, nest, step_at
from ._tracedecode import Decoder, Unchecked, as_event, correlation, correlations, events, flat
from ._tracejson import EVENTS, TraceFormatError, TraceStream

_np: Any  # numpy, or None where it is not installed
try:
    import numpy

    _np = numpy
except ImportError:  # pragma: no cover - exercised with numpy absent (tests patch it out)
    _np = None

#: Categories of device activity (CUDA kernels and copies; torch_npu uses the same names in its JSON).
DEVICE_CATS: Final = frozenset({"kernel", "gpu_memcpy", "gpu_memset", "Kernel", "Memcpy", "Memset"})
#: Categories of the runtime calls that launch device work, on the launching CPU thread (operators too).
RUNTIME_CATS: Final = frozenset({"cuda_runtime", "cuda_driver"})
#: Categories whose events carry the correlation id linking a launch and its device event.
LINKED_CATS: Final = DEVICE_CATS | RUNTIME_CATS
#: Categories of user ranges (``record_function``, profctx's role ranges): phases, not operators.
RANGE_CATS: Final = frozenset({"user_annotation"})
#: Categories that are neither: torch's whole-capture span, device-side copies of user ranges, and the
#: profiler's own work with CUDA activity ("Activity Buffer Request", on a row of its own: it ran in no role).
IGNORED_CATS: Final = frozenset({"Trace", "gpu_user_annotation", "overhead"})
#: Categories the batch path handles apart from operators.
_OPERATOR_ONLY: Final = DEVICE_CATS | RANGE_CATS | IGNORED_CATS | RUNTIME_CATS
#: Categories of events that are not on a thread's nesting (kernels: device figures; ignored: counted only).
_APART: Final = DEVICE_CATS | IGNORED_CATS
#: Threads a batch may hold for the batch path (more: the loop over each event, which costs the same then).
_THREADS: Final = 8
_FIELD: Final = {f: attrgetter(f) for f in ("ph", "cat", "name", "ts", "dur", "pid", "tid")}
#: Types an unchecked batch's times, and its pid, tid and category, may have for the batch path.
_NUMBERS: Final = frozenset({float, int})
_ID_TYPES: Final = frozenset({int, str, type(None)})


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
    kernel names to ``[total, count]``; ``role_device`` maps ``(step, role)`` to the device time
    launched in the role (``role`` ``None``: a launch in no role, or not found; empty for a trace
    without device events). ``problem`` says why reading stopped early, if it did (the figures
    then cover what was read). ``bad_times``: complete events left out as damage, their ``ts`` or
    ``dur`` not a finite number or their ``dur`` negative. ``identity``: the device and inode of
    the file read (``None``: not opened), so that a command counts one file once under any name.
    """

    span_us: float = 0.0
    events: int = 0
    ops: dict[tuple[int | None, str | None, str], list[float]] = field(default_factory=dict)
    roles: dict[tuple[int | None, str], list[float]] = field(default_factory=dict)
    steps: dict[int, list[float]] = field(default_factory=dict)
    marked: bool = False
    device: dict[str, list[float]] = field(default_factory=dict)
    device_us: float = 0.0
    role_device: dict[tuple[int | None, str | None], float] = field(default_factory=dict)
    problem: str | None = None
    bad_times: int = 0
    identity: tuple[int, int] | None = None
    #: For the cross-process alignment (:mod:`profctx.analysis._align`): the trace's time origin (Unix
    #: seconds; add ``ts / 1e6``), each step marker's ``(step, start, end)``, each outermost role range's
    #: ``(step, role, start, end)`` and each collective's ``(step, role, name, start, end)`` (microseconds,
    #: as the trace gives them), and the role names profctx listed (a listed role inside a role: nested).
    base_s: float | None = None
    step_spans: list[tuple[int, float, float]] = field(default_factory=list)
    role_spans: list[tuple[int | None, str, float, float]] = field(default_factory=list)
    collectives: list[tuple[int | None, str | None, str, float, float]] = field(default_factory=list)
    listed: tuple[str, ...] = ()


class _Thread:
    __slots__ = ("dur", "kind", "launch_id", "launch_ts", "name", "ts")

    def __init__(self) -> None:
        self.ts = array("d")
        self.dur = array("d")
        self.name = array("l")
        self.kind = bytearray()  # 1: a user range, 0: an operator
        self.launch_id = array("q")  # the correlation ids of the runtime calls on the thread, and their starts
        self.launch_ts = array("d")


class _Device:
    """The correlation id (``-1``: none) and duration of every device event, in file order."""

    __slots__ = ("dur", "ids")

    def __init__(self) -> None:
        self.ids = array("q")
        self.dur = array("d")

    def add(self, link: int | None, dur: float) -> None:
        self.ids.append(_id(link))
        self.dur.append(dur)


def _id(link: int | None) -> int:
    """Return a correlation id as the arrays keep it: ``-1`` for none or one past 64 bits."""
    return link if link is not None and 0 <= link < 1 << 63 else -1


def _ids(links: list[int | None]) -> array[int]:
    """Return the correlation ids ``links`` as the arrays keep them (see :func:`_id`), in C when all are plain."""
    try:
        found = array("q", cast("list[int]", links))  # a None raises TypeError: taken one by one below
    except (TypeError, OverflowError):
        return array("q", map(_id, links))
    return found if min(found, default=0) >= 0 else array("q", map(_id, links))


def read_figures(path: str | Path, root: str | Path | None = None, budget: Budget | None = None) -> TraceFigures:
    """Stream the trace at ``path`` and return its figures.

    A file cut short or damaged yields the figures of what was read, with ``problem`` set;
    an unreadable file (missing, not a trace, not a regular file inside ``root`` when given) too,
    with empty figures. ``budget``: what the command may inflate over all its files (see
    :class:`~profctx.analysis._tracejson.TraceStream`).
    """
    collecting = gc.isenabled()
    gc.disable()  # the parsed events hold no cycles: the collector would only rescan them again and again
    try:
        return _read(path, root, budget)
    finally:
        if collecting:
            gc.enable()


def _read(path: str | Path, root: str | Path | None, budget: Budget | None = None) -> TraceFigures:
    figures = TraceFigures()
    names = _Names()
    threads: dict[tuple[Any, Any], _Thread] = {}
    lo = float("inf")
    hi = float("-inf")
    drawn: set[str] | None = None
    marks: list[tuple[float, float, int]] = []
    device = _Device()
    # Slices are decoded into the seven fields read here (typed: a time is a float or None), and the
    # correlation too once the trace shows device or runtime events.
    decoder = Decoder()
    try:
        with TraceStream(path, root, loads=decoder, flat=flat, budget=budget) as stream:
            figures.identity = stream.identity
            for key, batch in stream.batches():
                if key != EVENTS:
                    if key == RANGES_KEY and isinstance(batch, dict) and isinstance(batch.get("roles"), list):
                        drawn = {str(n) for n in batch["roles"]}
                    elif key == "baseTimeNanoseconds" and type(batch) is int:
                        figures.base_s = batch / 1e9
                    continue
                if stream.raw is None:  # values decoded one at a time are plain JSON values
                    batch = [e for e in map(as_event, batch) if e is not None]
                unchecked = type(batch) is Unchecked  # the fallback parser's dicts: fields of any type
                # The complete events, picked in C (most of a trace is other phases only in metadata).
                batch = list(compress(batch, map(eq, _column(batch, "ph", unchecked), repeat("X"))))
                try:
                    cats: set[Any] | None = set(_column(batch, "cat", unchecked))
                except TypeError:  # a category that is not hashable: the loop over each event names it
                    cats = None
                if not decoder.linked and cats is not None and not LINKED_CATS.isdisjoint(cats):
                    decoder.linked = True  # the first device or runtime events: decode correlations from here on
                    if not unchecked and stream.raw is not None:  # this batch again, with them
                        batch = events(b"".join((b"[", stream.raw, b"]")), linked=True)
                        unchecked = type(batch) is Unchecked
                        batch = list(compress(batch, map(eq, _column(batch, "ph", unchecked), repeat("X"))))
                taken = _batch(batch, names, threads, marks, figures, unchecked, cats, device)
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
                    if not (ts - ts == 0.0 and dur - dur == 0.0 and dur >= 0.0):  # NaN, an infinity, dur < 0
                        figures.bad_times += 1
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
                        device.add(correlation(event), dur)
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
                    if cat in RUNTIME_CATS:
                        thread.launch_id.append(_id(correlation(event)))
                        thread.launch_ts.append(ts)
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
    figures.listed = tuple(sorted(drawn or ()))
    figures.step_spans = [(step, start, end) for start, end, step in marks]
    by_index = list(names)
    kinds = bytearray(_classify(n, drawn) for n in by_index)
    for start, end, step in marks:
        slot = figures.steps.setdefault(step, [0.0, 0])
        slot[0] += end - start
        slot[1] += 1
    _nest_all(figures, threads, by_index, kinds, marks, device)
    return figures


def _nest_all(figures: TraceFigures, threads: dict[tuple[Any, Any], _Thread], names: list[str], kinds: bytearray,
              marks: list[tuple[float, float, int]], device: _Device) -> None:
    """Nest every thread into the figures: first those that draw roles of their own, then the others, each
    event of which is lent the role of another thread of its process that holds its start (see the module's
    docstring); then give each device event the role of its launch. Figures are added in thread order."""
    results: dict[tuple[Any, Any], tuple[Any, Any]] = {}
    covers: dict[tuple[Any, Any], _Cover] = {}
    spans_of: dict[Any, list[Span]] = {}
    roleless = []
    for place, thread in threads.items():
        if ROLE not in map(kinds.__getitem__, compress(thread.name, thread.kind)):
            roleless.append(place)
            continue
        ops, roles, spans = nest(thread.ts, thread.dur, thread.name, thread.kind, names, kinds, marks, figures.marked)
        results[place] = ops, roles
        covers[place] = _Cover(spans)
        spans_of.setdefault(place[0], []).extend(spans)
    lenders = {pid: _Cover(spans) for pid, spans in spans_of.items()}
    for place in roleless:
        thread = threads[place]
        cover = covers[place] = lenders.get(place[0], _NOWHERE)
        lent: Lent | None = None
        if cover.spans:
            lent = (cover.codes_of(thread.ts), [(step, name) for _, _, step, name in cover.spans])
        ops, roles, _ = nest(thread.ts, thread.dur, thread.name, thread.kind, names, kinds, marks, figures.marked,
                             lent)
        results[place] = ops, roles
    for place in threads:
        ops, roles = results[place]
        _add(figures.ops, ops)
        _add(figures.roles, roles)
    figures.role_spans = [(step, names[name], start, end) for spans in spans_of.values()
                          for start, end, step, name in spans]
    figures.collectives = collectives(threads, names, lenders)
    if not device.ids:
        return
    launched: dict[int, tuple[int | None, str | None]] = {}
    # The step of a launch in no role: that of the one marker that holds it (else as nest places a role).
    steps = _Cover([(start - 1e-3, end, step, 0) for start, end, step in marks])
    for place, thread in threads.items():
        if not thread.launch_id:
            continue
        cover = covers[place]
        labels = [(step, names[name]) for _, _, step, name in cover.spans]
        codes = cover.codes_of(thread.launch_ts)
        where = [labels[code] if code >= 0 else (_step_of(steps, marks, ts), None)
                 for code, ts in zip(codes, thread.launch_ts, strict=True)]
        launched.update(zip(thread.launch_id, where, strict=True))
    launched.pop(-1, None)  # launches without an id link nothing
    unknown: tuple[int | None, str | None] = (None, None)
    table = figures.role_device
    for key, dur in zip(map(launched.get, device.ids, repeat(unknown)), device.dur, strict=True):
        table[key] = table.get(key, 0.0) + dur


def collectives(threads: dict[tuple[Any, Any], _Thread], names: list[str],
                lenders: dict[Any, _Cover]) -> list[tuple[int | None, str | None, str, float, float]]:
    """Return the collectives of the trace: ``(step, role, name, start, end)``, each in the role of its process
    that holds its start (see the module's docstring), in time order.

    Only gloo's own ranges (``gloo:all_reduce``, on gloo's thread: from the call to the end of the transfer)
    say how long a process waited. c10d's operators (``c10d::allreduce_``) and NCCL's host-side ranges only
    enqueue the work (NCCL waits on the device): they are left out, and the wait is read from the timeline."""
    chosen = [i for i, n in enumerate(names) if n.startswith(COLLECTIVE_RANGES)]
    if not chosen:
        return []
    wanted = frozenset(chosen)
    found: list[tuple[int | None, str | None, str, float, float]] = []
    for (pid, _), thread in threads.items():
        picked = list(compress(range(len(thread.name)), map(wanted.__contains__, thread.name)))
        if not picked:
            continue
        cover = lenders.get(pid, _NOWHERE)
        for i in picked:
            ts = thread.ts[i]
            code = cover.code(ts) if cover.spans else -1
            step, role = (cover.spans[code][2], names[cover.spans[code][3]]) if code >= 0 else (None, None)
            found.append((step, role, names[thread.name[i]], ts, ts + thread.dur[i]))
    found.sort(key=lambda c: c[3])
    return found


#: Names of the collectives' own ranges that last until the transfer ends (gloo's thread runs each to its end).
COLLECTIVE_RANGES: Final = ("gloo:",)


def _step_of(steps: _Cover, marks: list[tuple[float, float, int]], ts: float) -> int | None:
    """Return :func:`profctx.analysis._nesting.step_at` of ``ts``; ``steps`` covers the markers (found by
    bisection where one marker alone holds ``ts``)."""
    code = steps.code(ts)
    return steps.spans[code][2] if code >= 0 else step_at(marks, ts)


class _Cover:
    """Which of some role ranges holds a time: the one that alone holds it, else none.

    Ranges are half-open, ``[start, end)``; where ranges of several threads overlap, none holds the time.
    """

    __slots__ = ("bounds", "codes", "spans")

    def __init__(self, spans: Sequence[Span]) -> None:
        self.spans = list(spans)
        # A sweep over the starts and ends (an end before a start at one time): after the changes at each
        # time, the one range open then, if only one is.
        held = [(at, start, end) for at, (start, end, _, _) in enumerate(self.spans) if start < end]  # holds time
        changes = sorted([(start, 1, at) for at, start, _ in held] + [(end, -1, at) for at, _, end in held])
        # Led by a bound before every time: a bisection always lands on a segment.
        self.bounds: list[float] = [float("-inf")]
        self.codes: list[int] = [-1]
        open_: set[int] = set()
        for at, (time, change, which) in enumerate(changes):
            if change > 0:
                open_.add(which)
            else:
                open_.discard(which)
            if at + 1 < len(changes) and changes[at + 1][0] == time:
                continue
            self.bounds.append(time)
            self.codes.append(next(iter(open_)) if len(open_) == 1 else -1)

    def code(self, ts: float) -> int:
        """Return the index (in :attr:`spans`) of the range that alone holds ``ts``, else ``-1``."""
        return self.codes[bisect_right(self.bounds, ts) - 1]

    def codes_of(self, times: Sequence[float]) -> array[int]:
        """Return :meth:`code` of each time (bisections taken in C)."""
        return array("l", map(self.codes.__getitem__, map(sub, map(bisect_right, repeat(self.bounds), times),
                                                          repeat(1))))


_NOWHERE: Final = _Cover(())


def _add(into: dict[Any, list[Any]], table: dict[Any, list[Any]]) -> None:
    """Add one thread's figures to the trace's (its slots are its own: kept as they are when new)."""
    for key, values in table.items():
        slot = into.get(key)
        if slot is None:
            into[key] = values
        else:
            for at, value in enumerate(values):
                slot[at] += value


def _batch(batch: list[Any], names: _Names, threads: dict[tuple[Any, Any], _Thread],
           marks: list[tuple[float, float, int]], figures: TraceFigures,
           unchecked: bool, kinds_seen: set[Any] | None, device: _Device) -> tuple[float, float] | None:
    """Add a batch of complete events, all with times and names, to the figures: each thread's events to
    its thread in file order, kernels to ``figures.device`` and ``device``, launches to their threads;
    return the first start and last end of the events that count for the span. Return ``None`` (nothing
    added) when some event needs the loop over each event: a missing time or name, a field of an odd
    type, a category that is not hashable (``kinds_seen`` ``None``), events of more than :data:`_THREADS`
    threads.

    The common batch of a trace, taken in a few passes in C per field rather than the loop over each event.
    ``unchecked``: the fields may be of any type (checked here, in C, for the whole batch); ``kinds_seen``:
    the categories of the batch's events.
    """
    if not batch or kinds_seen is None:
        return None
    try:
        one = len(set(_column(batch, "pid", unchecked))) == 1 and len(set(_column(batch, "tid", unchecked))) == 1
    except TypeError:  # a pid or tid that is not hashable: the loop over each event names it
        return None
    if unchecked and not _plain(batch, kinds_seen):
        return None
    try:  # a time or name missing (None) fails here: the loop over each event skips or names that event
        starts = array("d", _column(batch, "ts", unchecked))
        durations = array("d", _column(batch, "dur", unchecked))
        indexes = array("l", map(names.__getitem__, _column(batch, "name", unchecked)))
    except (TypeError, KeyError):
        return None
    if not _sane(starts, durations):  # the loop over each event leaves out (and counts) the bad ones
        return None
    where: list[tuple[Any, Any]] = []
    if not one:
        where = list(zip(_column(batch, "pid", unchecked), _column(batch, "tid", unchecked), strict=True))
        if len(set(where)) > _THREADS:
            return None
    lo = float("inf")
    hi = float("-inf")
    launches: list[int] = []  # the position of each runtime call
    if _OPERATOR_ONLY.isdisjoint(kinds_seen):
        ranges = bytes(len(batch))
    else:
        cats = list(_column(batch, "cat", unchecked))
        labels = list(_column(batch, "name", unchecked))
        if not RUNTIME_CATS.isdisjoint(kinds_seen):
            launches = list(compress(range(len(batch)), map(RUNTIME_CATS.__contains__, cats)))
        apart = list(map(_APART.__contains__, cats))
        if any(apart):
            kernels = []
            for i in compress(range(len(batch)), apart):
                if cats[i] in IGNORED_CATS:
                    continue  # counted as an event, nothing more
                kernels.append(i)
                ts = starts[i]
                dur = durations[i]
                lo = min(lo, ts)
                hi = max(hi, ts + dur)
                slot = figures.device.get(labels[i])
                if slot is None:
                    figures.device[labels[i]] = [dur, 1]
                else:
                    slot[0] += dur
                    slot[1] += 1
                figures.device_us += dur
            device.ids.extend(_ids(correlations(list(map(batch.__getitem__, kernels)), unchecked)))
            device.dur.extend(map(durations.__getitem__, kernels))
            kept = list(map(not_, apart))
            starts = array("d", compress(starts, kept))
            durations = array("d", compress(durations, kept))
            indexes = array("l", compress(indexes, kept))
            cats = list(compress(cats, kept))
            labels = list(compress(labels, kept))
            where = list(compress(where, kept))
            if not starts:
                return lo, hi
        ranges = bytes(map(RANGE_CATS.__contains__, cats))
        for i in compress(range(len(labels)), ranges):
            marker = STEP_MARKER.fullmatch(labels[i])
            if marker is not None:
                marks.append((starts[i], starts[i] + durations[i], int(marker[1])))
    first, last = _bounds(starts, durations)
    lo = min(lo, first)
    hi = max(hi, last)
    if one:
        place = (batch[0].get("pid"), batch[0].get("tid")) if unchecked else (batch[0].pid, batch[0].tid)
        _extend(threads, place, starts, durations, indexes, ranges)
    else:
        for place in dict.fromkeys(where):  # threads in the order their first event comes, as event by event
            mine = list(map(eq, where, repeat(place)))
            _extend(threads, place, array("d", compress(starts, mine)), array("d", compress(durations, mine)),
                    array("l", compress(indexes, mine)), bytes(compress(ranges, mine)))
    # After the events: a thread is made by its first event, as the loop over each event makes it.
    if launches:
        ids = _ids(correlations(list(map(batch.__getitem__, launches)), unchecked))
        for i, found in zip(launches, ids, strict=True):
            e = batch[i]
            thread = threads[(e.get("pid"), e.get("tid")) if unchecked else (e.pid, e.tid)]
            thread.launch_id.append(found)
            thread.launch_ts.append(e.get("ts") if unchecked else e.ts)
    return lo, hi


def _plain(batch: list[dict[str, Any]], cats: set[Any]) -> bool:
    """Whether the fallback parser's events of ``batch`` have fields the batch path may take as they are:
    times that are finite numbers, names that are strings, ids and categories of the types an event keeps."""
    starts = list(_column(batch, "ts", True))
    durations = list(_column(batch, "dur", True))
    if (not set(map(type, starts)).union(map(type, durations)) <= _NUMBERS
            or set(map(type, _column(batch, "name", True))) != {str}
            or not _ID_TYPES.issuperset(map(type, _column(batch, "pid", True)))
            or not _ID_TYPES.issuperset(map(type, _column(batch, "tid", True)))
            or not _ID_TYPES.issuperset(map(type, cats))):
        return False
    try:  # msgspec's floats are finite; the fallback parser may give NaN, infinities, huge integers
        return math.isfinite(math.fsum(starts)) and math.isfinite(math.fsum(durations))
    except OverflowError:  # an integer past any float
        return False


def _sane(starts: array[float], durations: array[float]) -> bool:
    """Whether every time is a finite number and every duration not negative (sums and a minimum, in C)."""
    try:
        return (math.isfinite(math.fsum(starts)) and math.isfinite(math.fsum(durations))
                and (not durations or min(durations) >= 0.0))
    except OverflowError:  # finite times whose sum is past any float: each is checked in the loop
        return False


def _bounds(starts: array[float], durations: array[float]) -> tuple[float, float]:
    """Return the first start and the last end (start + duration) of the events."""
    if _np is not None:
        t = _np.frombuffer(starts, dtype=_np.float64)
        return float(t.min()), float((t + _np.frombuffer(durations, dtype=_np.float64)).max())
    return min(starts), max(map(add, starts, durations))


class _Names(dict):  # type: ignore[type-arg] # dict[str, int]
    """Each name's index, in the order first seen; a missing name is added (``KeyError`` for one not a string)."""

    def __missing__(self, name: Any) -> int:
        if type(name) is not str:
            raise KeyError(name)
        index = self[name] = len(self)
        return index


def _extend(threads: dict[tuple[Any, Any], _Thread], place: tuple[Any, Any], starts: array[float],
            durations: array[float], indexes: array[int], ranges: bytes) -> None:
    thread = threads.get(place)
    if thread is None:
        thread = threads[place] = _Thread()
    thread.ts.extend(starts)
    thread.dur.extend(durations)
    thread.name.extend(indexes)
    thread.kind.extend(ranges)


def _column(batch: list[Any], field: str, unchecked: bool) -> Iterator[Any]:
    """Iterate over one field of every event of ``batch`` (structs, or dicts when ``unchecked``), in C."""
    return map(dict.get, batch, repeat(field)) if unchecked else map(_FIELD[field], batch)


def _classify(name: str, drawn: set[str] | None) -> int:
    if STEP_MARKER.fullmatch(name):
        return MARK
    if drawn is None:
        return ROLE  # no list: the outermost user range is the role, nested ones are left out
    return ROLE if name in drawn else OP
