"""A worker class for the Ray real-trace test, in an importable module (Ray loads it by reference)."""

from __future__ import annotations

import time

import torch

import profctx


class Generator:
    """Generates for real: operators, then a sleep; ``rank_delay`` adds seconds (a straggler)."""

    def __init__(self, delay: float = 0.0) -> None:
        self.delay = delay
        self.x = torch.randn(96, 96)

    @profctx.profiled(role="generate")
    def generate(self, seconds: float) -> float:
        """Return the seconds the body took (measured inside the role's range)."""
        t0 = time.perf_counter()
        for _ in range(10):
            self.x = torch.tanh(self.x @ self.x)
        time.sleep(seconds + self.delay)
        return time.perf_counter() - t0

    def timed(self, seconds: float) -> tuple[float, float]:
        """Call :meth:`generate`; return its body's seconds and the seconds of the whole call (around its range)."""
        before = time.perf_counter()
        inside = self.generate(seconds)
        return inside, time.perf_counter() - before
