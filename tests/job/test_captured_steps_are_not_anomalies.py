"""A step's own capture never marks it anomalous, in step and role mode.

The backend here is the noop one with a start and a stop that take 0.3 s each (torch's first start
takes seconds), so a captured step lasts 20-60 times the others: were it judged, it would be an
anomaly at any load. Other steps may look slow on a loaded machine; the test only asks that no
anomaly capture names a captured step, or the one after it (its files being written).
"""

from __future__ import annotations

import time

import pytest

import profctx
from profctx import backends
from profctx.backends._base import CaptureSpec, Finish
from profctx.backends.noop import NoopBackend
from profctx.manifest import read


class SlowCapture(NoopBackend):
    """The noop backend, with a capture start and stop of 0.3 s each."""

    name = "slow-capture"

    def start(self, spec: CaptureSpec) -> None:
        time.sleep(0.3)

    def stop(self) -> Finish:
        time.sleep(0.3)
        return super().stop()


@pytest.mark.parametrize("mode", ["step", "role"])
def test_a_captured_step_is_never_judged(tmp_path: object, mode: str, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(backends._REGISTRY, "slow-capture", SlowCapture)  # registered for this test only
    profctx.configure(save_path=tmp_path, tool="slow-capture", mode=mode, steps=[10],
                      auto_capture={"factor": 5.0, "window": 5, "max_captures": 1000})
    for step in range(16):
        with profctx.profile_step(step):
            for role in ("rollout", "train"):
                with profctx.profile_step(role=role):
                    time.sleep(0.01)
    profctx.flush()
    records = read(tmp_path)  # type: ignore[arg-type]
    planned = [r for r in records if r.trigger is None]
    assert {r.steps for r in planned} == {(10,)} and all(r.status == "ok" for r in planned)
    judged = [str((r.trigger or {}).get("reason")) for r in records if r.trigger is not None]
    assert not [why for why in judged if why.startswith(("step 10 took", "step 11 took"))], judged
