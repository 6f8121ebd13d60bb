"""The backend contract, written once and run against every backend (see conftest.HARNESSES).

Each backend: starts and stops balance (exceptions included), ranges exist only while a
capture is live, files land in the capture folder under their final names, a failure is
recorded and never raised into training, and a second concurrent capture is refused.
"""

from __future__ import annotations

import logging
import threading
from pathlib import Path
from typing import Any

import pytest

import profctx
from profctx.records._manifest import read

from .conftest import Harness, Probe


def configure(h: Harness, save: Path, **fields: Any) -> None:
    base: dict[str, Any] = {"steps": [3], "tool": h.tool, "save_path": str(save), "contents": list(h.contents),
                            "tool_options": dict(h.options), "exit_hooks": False}
    profctx.configure({**base, **fields})


def captures(save: Path) -> list[dict[str, Any]]:
    profctx.flush()
    return read(save)


def files_of(save: Path, record: dict[str, Any]) -> list[Path]:
    return [save / f["path"] for f in record["files"]]


def test_start_and_stop_balance_even_when_the_step_raises(harness: Harness, probe: Probe, tmp_path: Path) -> None:
    configure(harness, tmp_path, steps=[3, 4])
    error = ValueError("user bug")
    with pytest.raises(ValueError) as caught, profctx.profile_step(3):
        assert probe.running() or harness.tool == "noop"
        raise error
    assert caught.value is error  # the user's exception, unchanged
    assert not probe.running()
    with profctx.profile_step(4):
        pass
    assert not probe.running()
    records = captures(tmp_path)
    assert [(r["step"], r["status"]) for r in records] == [(3, "ok"), (4, "ok")]
    counts = probe.counts()
    if counts is not None:
        assert counts == (2, 2)


def test_ranges_exist_only_while_a_capture_is_live(harness: Harness, probe: Probe, tmp_path: Path) -> None:
    configure(harness, tmp_path, steps=[3])
    for step in (2, 3, 4):
        with profctx.profile_step(step):
            with profctx.profile_step(role="rollout"):
                pass
            with profctx.profile_step(role=f"update_{step}"):
                pass
    (record,) = captures(tmp_path)
    assert record["status"] == "ok", record
    assert record["ranges"] == 2
    names = probe.ranges_in(files_of(tmp_path, record))
    if names is not None:
        assert [n for n in names if n != "ProfilerStep#3"] == ["rollout", "update_3"]  # the step marker
    calls = probe.range_calls()
    if calls is not None:
        assert [c for c in calls if c[0] != "ProfilerStep#3"] == [("rollout", True), ("update_3", True)]


def test_files_land_in_the_capture_folder_under_final_names(harness: Harness, probe: Probe, tmp_path: Path) -> None:
    configure(harness, tmp_path, steps=[3], mode="role")
    with profctx.profile_step(3), profctx.profile_step(role="actor_update"):
        pass
    (record,) = captures(tmp_path)
    assert record["status"] == "ok", record
    assert record["folder"] == "step000003/actor_update"
    files = files_of(tmp_path, record)
    assert bool(files) == harness.writes_files
    for path in files:
        assert path.is_file()
        assert (tmp_path / record["folder"]) in path.parents
        assert record["files"][files.index(path)]["bytes"] == path.stat().st_size
    assert not [p for p in tmp_path.rglob("*.tmp")]


def test_a_failure_is_recorded_not_raised(harness: Harness, probe: Probe, tmp_path: Path,
                                          caplog: pytest.LogCaptureFixture) -> None:
    configure(harness, tmp_path, steps=[3, 4, 5])
    (tmp_path / "step000003").write_text("a file where the capture folder must go")
    with caplog.at_level(logging.WARNING, logger="profctx"):
        with profctx.profile_step(3):
            ran = True
        undo = probe.break_next() if probe.break_next is not None else None
        try:
            with profctx.profile_step(4):
                ran_native = True
        finally:
            if undo is not None:
                undo()
        with profctx.profile_step(5):
            pass
    assert ran and ran_native
    assert not probe.running()
    records = {r["step"]: r for r in captures(tmp_path)}
    assert records[3]["status"] == "failed" and records[3]["error"]
    if probe.break_next is not None:
        assert records[4]["status"] == "failed" and records[4]["error"], records[4]
    assert records[5]["status"] == "ok", records[5]
    assert any("failed" in m for m in caplog.messages)


def test_a_second_concurrent_capture_is_refused(harness: Harness, probe: Probe, tmp_path: Path) -> None:
    configure(harness, tmp_path, steps=[3, 4, 7, 8])
    with profctx.profile_step(3), profctx.profile_step(4):
        pass
    barrier = threading.Barrier(2)
    release = threading.Event()

    def worker(step: int) -> None:
        with profctx.profile_step(step):
            barrier.wait(timeout=10)
            release.wait(timeout=10)

    threads = [threading.Thread(target=worker, args=(s,)) for s in (7, 8)]
    for t in threads:
        t.start()
    for _ in range(200):
        if sum(1 for t in threads if t.is_alive()) == 2 and barrier.n_waiting == 0:
            break
        threading.Event().wait(0.01)
    release.set()
    for t in threads:
        t.join(timeout=20)
    records = {r["step"]: r for r in captures(tmp_path)}
    assert records[3]["status"] == "ok"
    assert records[4]["status"] == "skipped"
    assert records[4]["owner"]["capture"] == records[3]["capture"]
    assert sorted(records[s]["status"] for s in (7, 8)) == ["ok", "skipped"]
    assert not probe.running()
    counts = probe.counts()
    if counts is not None:
        assert counts == (2, 2)  # steps 3 and one of 7/8: never two native sessions
