"""Caps a run cannot outgrow: bytes of traces per process (in all and per hour), bytes of the timeline.

Each test counts bytes and records: a capture stopped by a cap is a ``skipped`` record giving the
cap, and the timeline file stops under its cap with a line saying so.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Iterator
from pathlib import Path

import pytest

import profctx
from profctx.core._config import DEFAULT_MAX_TIMELINE_BYTES, DEFAULT_MAX_TRACE_BYTES, DEFAULT_MAX_TRACE_BYTES_PER_HOUR
from profctx.process._owner import OWNER
from profctx.process._runtime import TraceBudget
from profctx.records._manifest import read

MIB = 2**20


@pytest.fixture(autouse=True)
def _reset() -> Iterator[None]:
    yield
    profctx.reset()


def test_captures_stop_at_max_trace_bytes(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    profctx.configure(steps="0:6", tool="recording", save_path=tmp_path, exit_hooks=False, warmup=False,
                      max_trace_bytes=1, timeline=False)  # below one capture's bytes: the first one crosses it
    runtime = OWNER.runtime
    with caplog.at_level(logging.WARNING, logger="profctx"):
        for step in range(6):
            with profctx.profile_step(step):
                pass
            assert profctx.flush(30)
    records = sorted(read(tmp_path), key=lambda r: r["step"])
    assert [r["status"] for r in records] == ["ok"] + ["skipped"] * 5
    written = records[0]["bytes"]
    assert written > 0 and runtime.traces.written == written  # counted from the record's own byte count
    assert all("max_trace_bytes (1 bytes) reached" in r["reason"] for r in records[1:])
    assert sum("max_trace_bytes" in r.getMessage() for r in caplog.records) == 1  # one log line


def test_the_hourly_cap_refuses_until_the_hour_has_passed() -> None:
    now = [0.0]
    budget = TraceBudget(None, 100, clock=lambda: now[0])
    budget.add(60)
    assert budget.refuses() is None
    now[0] = 1800.0
    budget.add(50)  # 110 bytes in the last hour
    assert "max_trace_bytes_per_hour (100 bytes) reached" in (budget.refuses() or "")
    now[0] = 3600.0  # the first 60 bytes are an hour old
    assert budget.refuses() is None
    assert budget.in_hour == 50 and budget.written == 110


def test_the_total_cap_counts_every_byte_and_never_resumes() -> None:
    budget = TraceBudget(100, None, clock=lambda: 0.0)
    budget.add(99)
    assert budget.refuses() is None
    budget.add(1)
    assert "max_trace_bytes (100 bytes)" in (budget.refuses() or "")


def test_the_timeline_stops_under_its_cap_and_says_so(tmp_path: Path) -> None:
    profctx.configure(steps="100000:100001", tool="noop", save_path=tmp_path, exit_hooks=False, warmup=False,
                      max_timeline_bytes=MIB)
    runtime = OWNER.runtime
    steps = 20_000  # about 60 bytes each: more than 1 MiB
    for step in range(steps):
        with profctx.profile_step(step):
            pass
    assert profctx.flush(60)
    [path] = list((tmp_path / ".profctx").glob("*.timeline"))
    data = path.read_bytes()
    assert len(data) <= MIB
    lines = [json.loads(line) for line in data.splitlines()]
    written = [line["step"] for line in lines if "step" in line]
    [capped] = [line["capped"] for line in lines if "capped" in line]
    assert capped["max_timeline_bytes"] == MIB and capped["last_step"] == written[-1]
    assert 0 < len(written) < steps and written == list(range(len(written)))
    assert lines[-1] == {"capped": capped}  # nothing written after it
    assert runtime.timeline.write is False


@pytest.mark.parametrize(("field", "value"), [("max_trace_bytes", 0), ("max_trace_bytes", -5),
                                              ("max_trace_bytes_per_hour", 1.5), ("max_timeline_bytes", True),
                                              ("max_timeline_bytes", 1000), ("max_trace_bytes", "1G"),
                                              ("max_trace_bytes_per_hour", 0)])
def test_a_bad_cap_is_refused_at_configure_time(field: str, value: object) -> None:
    with pytest.raises(profctx.ConfigError) as caught:
        profctx.configure(steps="1", tool="noop", exit_hooks=False, **{field: value})
    assert field in str(caught.value)


def test_the_caps_are_on_by_default() -> None:
    config = profctx.configure(steps="1", tool="noop", exit_hooks=False)
    assert (config.max_trace_bytes, config.max_trace_bytes_per_hour, config.max_timeline_bytes) == (
        DEFAULT_MAX_TRACE_BYTES, DEFAULT_MAX_TRACE_BYTES_PER_HOUR, DEFAULT_MAX_TIMELINE_BYTES)
    assert profctx.configure(steps="1", tool="noop", exit_hooks=False, max_trace_bytes=None).max_trace_bytes is None
