"""A monotonic clock the test moves, installed where profctx reads its own (``process._timeline.clock``).

Blocks time steps and roles with that clock (the timeline, the anomaly watch, the exit summary), so
a test that advances it instead of sleeping gets exact times that a loaded machine cannot move.
"""

from __future__ import annotations

import pytest

from profctx.process import _block, _steps, _timeline


class FakeClock:
    """Monotonic seconds, moved only by :meth:`advance`."""

    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        """Let ``seconds`` pass."""
        self.now += seconds


def install(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    """Return a :class:`FakeClock` that every profctx clock read uses until the test ends."""
    clock = FakeClock()
    monkeypatch.setattr(_timeline, "clock", clock)
    monkeypatch.setattr(_block, "_clock", clock)
    monkeypatch.setattr(_steps, "_clock", clock)
    return clock
