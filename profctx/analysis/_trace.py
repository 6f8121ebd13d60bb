"""Read one Chrome trace as a stream and keep only its figures: span, self time per operator, ranges.

Self time is an event's duration minus that of the events nested directly in it on the same
thread (the definition HTA and the TensorBoard plugin use). Nesting needs each thread's events
in time order, so the reader keeps, per complete (``X``) event, its start, duration and an
interned name: about 30 bytes an event against the 250 or so of its JSON, whatever the trace.
"""

from __future__ import annotations

import gc
from array import array
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Final

from .._tracejson import EVENTS, TraceFormatError, TraceStream

#: Categories of device activity (CUDA kernels and copies; torch_npu uses the same names in its JSON).
DEVICE_CATS: Final = frozenset({"kernel", "gpu_memcpy", "gpu_memset", "Kernel", "Memcpy", "Memset"})
#: Categories of user ranges (``record_function``, profctx's role ranges): phases, not operators.
RANGE_CATS: Final = frozenset({"user_annotation"})
#: Categories that are neither: torch's whole-capture span, device-side copies of user ranges.
IGNORED_CATS: Final = frozenset({"Trace", "gpu_user_annotation"})


@dataclass
class TraceFigures:
    """What one trace adds up to; times in microseconds.

    ``ops`` maps ``(range, operator)`` to ``[self, total, count]``, where ``range`` is the
    outermost user range the operator ran in (``None`` outside any). ``ranges`` maps each
    outermost range name to ``[total, count]``. ``device`` maps kernel names to
    ``[total, count]``. ``problem`` says why reading stopped early, if it did (the figures
    then cover what was read).
    """

    span_us: float = 0.0
    events: int = 0
    ops: dict[tuple[str | None, str], list[float]] = field(default_factory=dict)
    ranges: dict[str, list[float]] = field(default_factory=dict)
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


def read_figures(path: str | Path) -> TraceFigures:
    """Stream the trace at ``path`` and return its figures.

    A file cut short or damaged yields the figures of what was read, with ``problem`` set;
    an unreadable file (missing, not a trace) too, with empty figures.
    """
    collecting = gc.isenabled()
    gc.disable()  # the parsed events hold no cycles: the collector would only rescan them again and again
    try:
        return _read(path)
    finally:
        if collecting:
            gc.enable()


def _read(path: str | Path) -> TraceFigures:
    figures = TraceFigures()
    names: dict[str, int] = {}
    threads: dict[tuple[Any, Any], _Thread] = {}
    lo = float("inf")
    hi = float("-inf")
    try:
        with TraceStream(path) as stream:
            for key, batch in stream.batches():
                if key != EVENTS:
                    continue
                for event in batch:
                    if type(event) is not dict or event.get("ph") != "X":
                        continue
                    raw_ts = event.get("ts")
                    raw_dur = event.get("dur")
                    if not isinstance(raw_ts, (int, float)) or not isinstance(raw_dur, (int, float)):
                        continue
                    ts = float(raw_ts)
                    dur = float(raw_dur)
                    cat = event.get("cat")
                    figures.events += 1
                    if cat in IGNORED_CATS:
                        continue
                    if ts < lo:
                        lo = ts
                    if ts + dur > hi:
                        hi = ts + dur
                    name = str(event.get("name"))
                    if cat in DEVICE_CATS:
                        slot = figures.device.get(name)
                        if slot is None:
                            figures.device[name] = [dur, 1]
                        else:
                            slot[0] += dur
                            slot[1] += 1
                        figures.device_us += dur
                        continue
                    where = (event.get("pid"), event.get("tid"))
                    thread = threads.get(where)
                    if thread is None:
                        thread = threads[where] = _Thread()
                    index = names.get(name)
                    if index is None:
                        index = names[name] = len(names)
                    thread.ts.append(ts)
                    thread.dur.append(dur)
                    thread.name.append(index)
                    thread.kind.append(1 if cat in RANGE_CATS else 0)
    except (TraceFormatError, OSError) as exc:
        figures.problem = str(exc)
    if hi > lo:
        figures.span_us = hi - lo
    by_index = list(names)
    for thread in threads.values():
        _nest(thread, by_index, figures)
    return figures


def _nest(thread: _Thread, names: list[str], figures: TraceFigures) -> None:
    ts, dur, name, kind = thread.ts, thread.dur, thread.name, thread.kind
    n = len(ts)
    order: Iterable[int] = range(n)
    if any(ts[i] > ts[i + 1] for i in range(n - 1)):
        order = sorted(range(n), key=lambda i: (ts[i], -dur[i]))
    ops = figures.ops
    ranges = figures.ranges
    # Stack entries: [end, index, child time, outermost range name].
    stack: list[list[Any]] = []

    def close(entry: list[Any]) -> None:
        i = entry[1]
        if kind[i]:
            return
        key = (entry[3], names[name[i]])
        slot = ops.get(key)
        if slot is None:
            ops[key] = [dur[i] - entry[2], dur[i], 1]
        else:
            slot[0] += dur[i] - entry[2]
            slot[1] += dur[i]
            slot[2] += 1

    for i in order:
        start = ts[i]
        # 1 ns of slack: torch rounds times to ns, so a sibling may seem to start inside the previous one.
        while stack and stack[-1][0] <= start + 1e-3:
            close(stack.pop())
        outer = stack[0][3] if stack else None
        if stack:
            stack[-1][2] += dur[i]
        if kind[i] and outer is None:
            outer = names[name[i]]
            slot = ranges.get(outer)
            if slot is None:
                ranges[outer] = [dur[i], 1]
            else:
                slot[0] += dur[i]
                slot[1] += 1
        stack.append([start + dur[i], i, 0.0, outer])
    while stack:
        close(stack.pop())
