"""Shared fixtures: every test starts and ends with profctx unconfigured."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fakeclock import FakeClock, install

import profctx
from profctx.testing import RecordingBackend


@pytest.fixture(autouse=True)
def _reset_profctx(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    for var in ("PROFCTX_ENABLE", "PROFCTX_STEPS", "PROFCTX_RANKS", "PROFCTX_MODE", "PROFCTX_ROLES",
                "PROFCTX_SAVE_PATH", "PROFCTX_TOOL", "PROFCTX_RUN_ID", "RANK", "WORLD_SIZE"):
        monkeypatch.delenv(var, raising=False)
    profctx.reset()
    RecordingBackend.clear()
    yield
    profctx.reset()


@pytest.fixture
def fake_clock(monkeypatch: pytest.MonkeyPatch) -> FakeClock:
    """The clock profctx times steps and roles with, moved by the test instead of sleeping (``tests/fakeclock.py``)."""
    return install(monkeypatch)
