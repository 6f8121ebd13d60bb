"""Actors for the nsys range-count tests: torch looks like a CUDA build whose profiler calls are counted.

``torch.cuda.profiler.start()/stop()`` are ``cudaProfilerStart/Stop``: each start is one capture
range for ``nsys --capture-range=cudaProfilerApi``. On this CPU-only machine they raise, so each
actor process replaces them, when it starts, by counters (and makes ``torch.backends.cuda.is_built``
say yes, which the nsys backend checks at configure time). The real nsys backend then runs.
"""

from __future__ import annotations

from typing import Any

import ray

import profctx


class CudaProfilerCounter:
    """Counts ``cudaProfilerStart``/``Stop`` calls; ``active`` while a range is open."""

    def __init__(self) -> None:
        self.starts = 0
        self.stops = 0
        self.active = False

    def start(self) -> None:
        self.starts += 1
        self.active = True

    def stop(self) -> None:
        self.stops += 1
        self.active = False

    def take(self) -> tuple[int, int]:
        """Return (starts, stops) since the last call."""
        counts = (self.starts, self.stops)
        self.starts = self.stops = 0
        return counts


def install(setattr_: Any = setattr) -> CudaProfilerCounter:
    """Make torch a CUDA build with counted profiler calls in this process (``setattr_``: e.g. a monkeypatch's)."""
    import torch
    import torch.backends.cuda
    import torch.cuda.profiler

    counter = CudaProfilerCounter()
    setattr_(torch.backends.cuda, "is_built", lambda: True)
    setattr_(torch.cuda.profiler, "start", counter.start)
    setattr_(torch.cuda.profiler, "stop", counter.stop)
    return counter


class _Counted:
    def __init__(self) -> None:
        self.counter = install()

    def take_ranges(self) -> tuple[int, int]:
        """Return the capture ranges this process opened and closed since the last call."""
        return self.counter.take()

    def pid(self) -> int:
        import os

        return os.getpid()


@ray.remote(num_cpus=0)
class Trainer(_Counted):
    """Two profiled stages per step, each with a nested role (an NVTX range of the stage's capture)."""

    @profctx.profiled(role="log_prob")
    def log_prob(self) -> None:
        with profctx.profile_step(role="forward"):
            pass

    @profctx.profiled(role="update")
    def update(self) -> None:
        with profctx.profile_step(role="backward"):
            pass


@ray.remote(num_cpus=0)
class Rollout(_Counted):
    """One profiled stage per step."""

    @profctx.profiled(role="generate")
    def generate(self) -> None:
        return None
