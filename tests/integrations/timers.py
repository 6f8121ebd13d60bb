"""Timers a test takes around a framework's phases, and how a profiled range must agree with them.

A test stamps ``time.perf_counter()`` at hook points it controls: just inside a range (the body of
a hook it overrides, a callback that runs after profctx's at one event and before it at the next)
and, where the framework offers one, just around it. The range profctx drew, read back from the
real trace, must hold the inner interval and lie within the outer one, in every step: both are
exact bounds whatever the machine's load.

Where the outer interval is loose (it holds the start of the step's capture), no timer the test
can take holds the range tighter, so one bound stays on wall-clock time, made generous: the range
must exceed the inner interval by at most :data:`TOLERANCE_S` (10 ms) in the step where it exceeds
it least (:func:`least_excess`). What lies between the two is the framework's dispatch of a hook
and profctx's range bookkeeping, 0.02-0.3 ms measured on a shared 2-core machine (Lightning's
hooks, the ``Trainer``'s callbacks and a TRL reward function alike), 2.7 ms once under load. What
profctx would count by mistake is the profiler's own start or stop, 15-130 ms of CPU work per
capture there on a quiet machine (more on a loaded one), in every step. Load flips the bound only
by preempting the thread inside that sub-millisecond window in every step of the run (once, a
preempted thread added 25 ms to one range): hence the least step, not each.
"""

from __future__ import annotations

import time
from collections import defaultdict
from pathlib import Path

from profctx import manifest
from profctx.analysis import TraceFigures, read_figures

#: What the two clocks (``perf_counter``, the trace's) may disagree by on one interval: the trace
#: rounds to the nanosecond, and their rates may differ by parts per million.
CLOCKS_S = 1e-4
CLOCKS_REL = 1e-4
#: How far a range may exceed the timers just inside it, in the step where it exceeds them least:
#: 30x the quiet figure, under the 15 ms that the error it catches costs at the least (module docstring).
TOLERANCE_S = 0.010


class Stamps:
    """``perf_counter()`` readings by name, in the order taken."""

    def __init__(self) -> None:
        self.at: defaultdict[str, list[float]] = defaultdict(list)

    def __call__(self, name: str) -> None:
        self.at[name].append(time.perf_counter())

    def span(self, first: str, last: str, index: int) -> float:
        """Seconds from the ``index``-th ``first`` stamp to the ``index``-th ``last`` stamp."""
        return self.at[last][index] - self.at[first][index]


def check(what: str, seconds: float, inside: float, around: float) -> float:
    """Assert that a range of ``seconds`` holds ``inside`` and lies in ``around``; return its excess over ``inside``."""
    slack = CLOCKS_S + CLOCKS_REL * inside
    assert inside - slack <= seconds <= around + slack, (
        f"{what}: the trace says {seconds * 1e3:.3f} ms, the timers inside it {inside * 1e3:.3f} ms "
        f"and around it {around * 1e3:.3f} ms")
    return seconds - inside


def least_excess(what: str, excesses: list[float]) -> None:
    """Assert that in one step at least a range exceeded the timers inside it by at most ``TOLERANCE_S``."""
    assert excesses and min(excesses) <= TOLERANCE_S, (
        f"{what}: the trace's ranges exceed the timers inside them by {[round(e * 1e3, 3) for e in excesses]} ms")


def traces(save_path: Path) -> dict[int, TraceFigures]:
    """The figures of each single-step capture's trace under ``save_path``, by step (every capture must be ok)."""
    found = {}
    for record in manifest.read(save_path):
        assert record.status == "ok" and len(record.steps) == 1, record
        files = [f.path for f in record.files if ".pt.trace.json" in f.path]
        assert len(files) == 1, record.files
        found[record.steps[0]] = read_figures(save_path / files[0])
    return found
