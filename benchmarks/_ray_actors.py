"""The actor class of ``bench_ray.py``, in an importable module.

Ray copies a class defined in a script's ``__main__`` by value, and cloudpickle then drops
``@profiled``'s wrapper: the benchmark would time an undecorated method. Defined here, the
class is loaded by reference in each actor process, as users' worker classes are.
"""

from __future__ import annotations

import collections
import functools
import time
from collections.abc import Callable
from typing import Any

import ray

import profctx

#: The control functions the driver runs in a worker through ``__ray_call__`` (profctx.ray._worker).
CONTROL = ("join", "step_enter", "step_exit", "flush")


def _count_control_calls(counts: collections.Counter[str]) -> None:
    """Count, in this actor process, every control call the driver makes to it.

    The driver sends ``profctx.ray._worker.<function>`` through ``__ray_call__``; cloudpickle
    sends a module function by reference, so the actor process looks it up in its own copy of
    that module, which is replaced here by a counting wrapper (a benchmark instrument only).
    """
    from profctx.ray import _worker

    for name in CONTROL:
        original: Callable[..., Any] = getattr(_worker, name)

        @functools.wraps(original)
        def counted(*args: Any, _name: str = name, _fn: Callable[..., Any] = original, **kwargs: Any) -> Any:
            counts[_name] += 1
            return _fn(*args, **kwargs)

        setattr(_worker, name, counted)


def nothing(actor: Any) -> None:
    """A control call that does nothing: the floor of one round of calls to every worker."""


@ray.remote(num_cpus=0)
class Probe:
    """A tiny actor: one ``@profiled`` method, its plain twin, and the count of control calls received."""

    def __init__(self) -> None:
        self.counts: collections.Counter[str] = collections.Counter()
        _count_control_calls(self.counts)

    @profctx.profiled(role="bench")
    def tick(self) -> int:
        return 1

    def plain(self) -> int:
        return 1

    @profctx.profiled(role="work")
    def work(self, ms: float) -> int:
        """A step's share of work that leaves the CPU free (a device computing): sleep ``ms`` milliseconds."""
        time.sleep(ms / 1e3)
        return 1

    def work_riding(self, ms: float, control: tuple[int, float, float] | None = None) -> int:
        """``work`` with step control riding as an argument of the step's own call (the ``ride`` prototype)."""
        time.sleep(ms / 1e3)
        return 1

    def local_cost(self, calls: int) -> tuple[float, float]:
        """Return the ns per call of ``self.tick()`` and ``self.plain()`` inside this process."""
        times = []
        for method in (self.tick, self.plain):
            t0 = time.perf_counter_ns()
            for _ in range(calls):
                method()
            times.append((time.perf_counter_ns() - t0) / calls)
        return times[0], times[1]

    def control_calls(self) -> dict[str, int]:
        """Return how many control calls of each kind this process has run so far."""
        return dict(self.counts)
