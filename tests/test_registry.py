"""One native capture per process: concurrent tasks and threads never run two torch profilers."""

from __future__ import annotations

import asyncio
import contextvars
import itertools
import threading
from pathlib import Path

import pytest

import profctx
from profctx.records._manifest import read
from profctx.testing import RecordingBackend, capture

torch = pytest.importorskip("torch")


def test_concurrent_tasks_and_threads_in_role_mode(tmp_path: Path) -> None:
    profctx.configure(steps=[1], mode="role", save_path=tmp_path, compress=False)
    entered: list[str] = []
    lock = threading.Lock()

    def note(role: str) -> None:
        with lock:
            entered.append(role)

    async def task(i: int) -> None:
        async with profctx.profile_step(role=f"task{i}"):
            note(f"task{i}")
            for _ in range(3):
                torch.randn(32, 32) @ torch.randn(32, 32)
                await asyncio.sleep(0)

    def thread(i: int) -> None:
        with profctx.profile_step(role=f"thread{i}"):
            note(f"thread{i}")
            for _ in range(3):
                torch.randn(32, 32) @ torch.randn(32, 32)

    async def main() -> None:
        await asyncio.gather(*(task(i) for i in range(12)))

    with profctx.profile_step(1):
        threads = [threading.Thread(target=contextvars.copy_context().run, args=(thread, i)) for i in range(6)]
        for t in threads:
            t.start()
        asyncio.run(main())
        for t in threads:
            t.join()
    assert profctx.flush(60)

    records = read(tmp_path)
    assert sorted(r["role"] for r in records) == sorted(entered)
    assert len(entered) == 18
    statuses = {r["status"] for r in records}
    assert statuses <= {"ok", "skipped"}
    captured = [r for r in records if r["status"] == "ok"]
    assert captured
    ids = {r["capture"] for r in captured}
    for record in records:
        if record["status"] == "skipped":
            assert record["owner"]["capture"] in ids
            assert record["owner"]["capture"] in record["reason"]
    # Never two live at once: the captured intervals do not overlap.
    spans = sorted((r["start_time"], r["end_time"]) for r in captured)
    for (_, end), (start, _) in itertools.pairwise(spans):
        assert start >= end
    for record in captured:
        assert (tmp_path / record["files"][0]["path"]).stat().st_size > 0


def test_overlapping_role_becomes_a_range_of_the_live_capture() -> None:
    release = threading.Event()
    started = threading.Event()

    def background(ctx: contextvars.Context) -> None:
        def body() -> None:
            with profctx.profile_step(role="second"):
                started.set()
                release.wait(5)

        ctx.run(body)

    with capture(steps=[1], mode="role") as got, profctx.profile_step(1):
        sibling = contextvars.copy_context()  # in step 1, outside "first": a sibling role
        with profctx.profile_step(role="first"):
            worker = threading.Thread(target=background, args=(sibling,))
            worker.start()
            assert started.wait(5)
            release.set()
            worker.join()
    assert [(c.role, c.status) for c in got] == [("second", "skipped"), ("first", "ok")]
    assert got[1].ranges == ["second"]
    assert "first" in (got[0].reason or "")
    assert RecordingBackend.max_live == 1
