"""One process's step timeline held as arrays: a mapping of step -> :class:`StepTime`, each value made when asked for.

The reader (:mod:`profctx.analysis._timeline`) appends each line it parses; the arrays take about 40 bytes a role
a step, less than the JSON line they were read from.
"""

from __future__ import annotations

from array import array
from bisect import bisect_left
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Final


@dataclass
class StepTime:
    """One step of one process: its wall time and its top-level roles' (name -> (seconds, blocks)).

    ``start``: the step's entry on the process's wall clock (Unix seconds); ``spans``: each role's first
    entry and last exit, in seconds from the step's entry (empty in a timeline written before they were kept).
    """

    time_s: float
    start: float | None
    roles: dict[str, tuple[float, int]]
    spans: dict[str, tuple[float, float]] = field(default_factory=dict)


_NONE: Final = float("nan")  # a start, first entry or last exit the line does not give


class Steps(Mapping[int, StepTime]):
    """One process's steps, held as arrays (about 40 bytes a role a step, less than the line it was read from).

    A mapping of step -> :class:`StepTime`, in step order; each value is made when asked for, so a caller
    that walks the steps holds one at a time. A step given twice keeps its last line (as a dict would).
    """

    def __init__(self) -> None:
        self._step = array("q")
        self._time = array("d")
        self._start = array("d")
        self._first_role = array("q", [0])  # row i's roles are the entries _first_role[i]:_first_role[i + 1]
        self._name = array("l")  # each role entry: its name's index in _names, seconds, count, first, last
        self._seconds = array("d")
        self._count = array("q")
        self._entered = array("d")
        self._left = array("d")
        self._names: list[str] = []
        self._ids: dict[str, int] = {}
        self._sorted = True
        #: Some step gives role times without role entries (a timeline written before they were kept).
        self.unspanned = False

    def add(self, step: int, time_s: float, start: float | None, roles: Mapping[str, tuple[float, int]],
            spans: Mapping[str, tuple[float, float]]) -> None:
        """Append one step's line."""
        if self._step and step <= self._step[-1]:
            self._sorted = False
        self._step.append(step)
        self._time.append(time_s)
        self._start.append(_NONE if start is None else start)
        if roles and not spans:
            self.unspanned = True
        for name, (seconds, count) in roles.items():
            index = self._ids.get(name)
            if index is None:
                index = self._ids[name] = len(self._names)
                self._names.append(name)
            first, last = spans.get(name, (_NONE, _NONE))
            self._name.append(index)
            self._seconds.append(seconds)
            self._count.append(min(max(count, -(1 << 62)), 1 << 62))
            self._entered.append(first)
            self._left.append(last)
        self._first_role.append(len(self._name))

    def seal(self) -> None:
        """Put the rows in step order, a repeated step's last line kept (after the last :meth:`add`)."""
        if self._sorted:
            return
        last: dict[int, int] = {}
        for at, number in enumerate(self._step):
            last[number] = at
        order = [last[number] for number in sorted(last)]
        del last
        step, time_s, start, first_role = self._step, self._time, self._start, self._first_role
        name, seconds, count, entered, left = self._name, self._seconds, self._count, self._entered, self._left
        self._step, self._time, self._start, self._first_role = array("q"), array("d"), array("d"), array("q", [0])
        self._name, self._seconds, self._count = array("l"), array("d"), array("q")
        self._entered, self._left = array("d"), array("d")
        self.unspanned = False
        for row in order:
            self._step.append(step[row])
            self._time.append(time_s[row])
            self._start.append(start[row])
            a, b = first_role[row], first_role[row + 1]
            self._name.extend(name[a:b])
            self._seconds.extend(seconds[a:b])
            self._count.extend(count[a:b])
            self._entered.extend(entered[a:b])
            self._left.extend(left[a:b])
            self._first_role.append(len(self._name))
            if b > a and all(entered[i] != entered[i] for i in range(a, b)):
                self.unspanned = True
        self._sorted = True

    def row(self, step: int) -> int | None:
        """Return the row of ``step`` (``None``: not a step of this process)."""
        at = bisect_left(self._step, step)
        return at if at < len(self._step) and self._step[at] == step else None

    def entry(self, row: int) -> StepTime:
        """Return row ``row`` as a :class:`StepTime`."""
        roles: dict[str, tuple[float, int]] = {}
        spans: dict[str, tuple[float, float]] = {}
        for i in range(self._first_role[row], self._first_role[row + 1]):
            name = self._names[self._name[i]]
            roles[name] = (self._seconds[i], self._count[i])
            if self._entered[i] == self._entered[i]:
                spans[name] = (self._entered[i], self._left[i])
        start = self._start[row]
        return StepTime(self._time[row], None if start != start else start, roles, spans)

    def time_s(self, row: int) -> float:
        """Return row ``row``'s step time."""
        return self._time[row]

    def start(self, row: int) -> float | None:
        """Return row ``row``'s wall-clock start (``None``: not given)."""
        start = self._start[row]
        return None if start != start else start

    def step(self, row: int) -> int:
        """Return row ``row``'s step."""
        return self._step[row]

    def __getitem__(self, step: int) -> StepTime:
        row = self.row(step)
        if row is None:
            raise KeyError(step)
        return self.entry(row)

    def __contains__(self, step: object) -> bool:
        return type(step) is int and self.row(step) is not None

    def __iter__(self) -> Iterator[int]:
        return iter(self._step)

    def __len__(self) -> int:
        return len(self._step)
