"""Shared fixtures: every test starts and ends with profctx unconfigured."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from fakeclock import FakeClock, install

import profctx
from profctx.testing import RecordingBackend

# No property test asserts how long one example takes: Hypothesis's default 200 ms deadline per example and its
# too-slow health check are wall-clock margins a loaded machine breaks (a case waiting for a core). Tests that
# bound a case's cost do it themselves, in thread CPU time (test_config_fuzz.py). Settings a test passes win.
try:  # the real-engine environment (requirements-vllm.txt) runs these fixtures without Hypothesis
    from hypothesis import HealthCheck, settings
except ImportError:
    pass
else:
    settings.register_profile("profctx", deadline=None, suppress_health_check=[HealthCheck.too_slow])
    settings.load_profile("profctx")


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
