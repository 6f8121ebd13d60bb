"""Signals, threads and interrupts: exit never hangs, never crashes, and never leaves a capture ``open``."""

from __future__ import annotations

import asyncio
import contextvars
import gc
import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import profctx
from profctx.process._owner import OWNER
from profctx.records._manifest import read

torch = pytest.importorskip("torch")

PROFCTX_FILES = ("_capture.py", "_runtime.py", "_block.py", os.path.join("backends", "torch.py"))


def _child(script: str, save: Path) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", textwrap.dedent(script), str(save)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _wait_for(proc: subprocess.Popen[str], word: str, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        line = proc.stdout.readline() if proc.stdout else ""
        if word in line:
            return
        if not line and proc.poll() is not None:
            raise AssertionError(f"child ended before {word!r}: {proc.stderr.read() if proc.stderr else ''}")
    raise AssertionError(f"child never printed {word!r}")


LOOP = """
    import sys, time, profctx, torch
    from profctx.records._manifest import ManifestWriter

    write = ManifestWriter.write
    def slow(self, record):  # slow appends: SIGTERM lands while the manifest lock is held
        with self._lock:
            time.sleep(0.02)
        return write(self, record)
    ManifestWriter.write = slow

    profctx.configure(steps="0:100000", mode=sys.argv[2], save_path=sys.argv[1], compress=False)
    x = torch.ones(64, 64)
    step = 0
    while True:
        with profctx.profile_step(step):
            with profctx.profile_step(role="rollout"):
                x = x @ x / 64
            with profctx.profile_step(role="actor_update"):
                for _ in range(int(sys.argv[3])):
                    x = x @ x / 64
        if step == 1:
            print("looping", flush=True)
        step += 1
"""


@pytest.mark.slow
@pytest.mark.parametrize("seed", range(6))
def test_a_sigterm_storm_ends_the_process_and_leaves_no_capture_open(tmp_path: Path, seed: int) -> None:
    rng = random.Random(seed)
    mode = "role" if seed % 2 else "step"
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(LOOP), str(tmp_path), mode,
                             str(rng.choice([1, 50]))], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(proc, "looping")
        time.sleep(rng.uniform(0, 0.3))
        for _ in range(rng.randint(1, 6)):
            proc.send_signal(signal.SIGTERM)
            time.sleep(rng.uniform(0, 0.03))
        # The process ends by itself: the wait's bound (a generous 120 s, where exiting takes well
        # under a second on a quiet machine) only stops a hang from hanging the suite.
        rc = proc.wait(timeout=120)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert rc == -signal.SIGTERM, proc.stderr.read() if proc.stderr else ""
    records = read(tmp_path)
    assert records, "the child recorded nothing"
    assert {r["status"] for r in records} <= {"ok", "interrupted", "skipped"}, records[-3:]
    for record in records:
        if record["status"] == "ok" and record["kind"] != "engine":
            assert all((tmp_path / f["path"]).is_file() for f in record["files"])


BACKGROUND = """
    import sys, threading, time, profctx, torch
    profctx.configure(steps=[1], save_path=sys.argv[1], compress=False)
    ready = threading.Event()
    def worker():
        with profctx.profile_step(1, role="background"):
            torch.ones(10).sum()
            ready.set()
            time.sleep(300)
    threading.Thread(target=worker, daemon=True).start()
    ready.wait(60)
    print("ready", flush=True)
    if sys.argv[2] == "wait":
        time.sleep(300)
"""


@pytest.mark.slow
@pytest.mark.parametrize("how", ["exit", "sigterm"])
def test_a_capture_held_by_another_thread_at_exit_is_recorded_not_crashed(tmp_path: Path, how: str) -> None:
    proc = subprocess.Popen([sys.executable, "-c", textwrap.dedent(BACKGROUND), str(tmp_path),
                             "wait" if how == "sigterm" else "exit"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        _wait_for(proc, "ready")
        if how == "sigterm":
            proc.send_signal(signal.SIGTERM)
        rc = proc.wait(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert rc == (-signal.SIGTERM if how == "sigterm" else 0), proc.stderr.read() if proc.stderr else ""
    (record,) = read(tmp_path)
    assert record["status"] == "interrupted"
    assert any("thread that started it" in n for n in record["notes"])


def test_a_capture_stopped_from_another_thread_stops_on_its_own_thread(tmp_path: Path) -> None:
    profctx.configure(steps=[1, 2, 3], contiguous=True, save_path=tmp_path, compress=False, exit_hooks=False)
    # The run opens on a worker thread (step 1) and its last step ends on the main thread:
    # the stop waits for the worker thread's next block instead of failing.
    opened = threading.Event()
    go_on = threading.Event()

    def first_step() -> None:
        with profctx.profile_step(1):
            torch.ones(4).sum()
        opened.set()
        go_on.wait(10)
        with profctx.profile_step(5):  # out of window, on the starting thread: a safe point
            pass

    worker = threading.Thread(target=first_step)
    worker.start()
    assert opened.wait(30)
    with profctx.profile_step(2):
        pass
    with profctx.profile_step(3):
        pass  # the run's last step: ends the capture, here on the wrong thread
    assert [r["status"] for r in read(tmp_path)] == ["open"]
    go_on.set()
    worker.join(30)
    assert profctx.flush(30)
    (record,) = read(tmp_path)
    assert record["status"] == "ok" and record["steps"] == [1, 2, 3]


# -- interrupts at every statement of a capture's start and stop ---------------------------------


class _Injector:
    """Raise KeyboardInterrupt at the n-th line profctx executes while tracing (once)."""

    def __init__(self, at: int) -> None:
        self.at = at
        self.seen = 0
        self.fired = False

    def global_trace(self, frame: Any, event: str, arg: Any) -> Any:
        if frame.f_code.co_filename.endswith(PROFCTX_FILES) and "profctx" in frame.f_code.co_filename:
            return self.local_trace
        return None

    def local_trace(self, frame: Any, event: str, arg: Any) -> Any:
        if event == "line" and not self.fired:
            self.seen += 1
            if self.seen == self.at:
                self.fired = True
                raise KeyboardInterrupt
        return self.local_trace


def _one_capture(step: int) -> None:
    with profctx.profile_step(step):
        torch.ones(8).sum()


@pytest.mark.parametrize("mode", ["step", "role"])
def test_an_interrupt_at_any_statement_of_start_or_stop_leaves_profctx_usable(tmp_path: Path, mode: str) -> None:
    # Every object alive before the walk (torch, the modules earlier tests imported) is moved
    # out of the collector's view, so each gc.collect() below scans only what the walk created:
    # the blocks an interrupt dropped are all created here. A frozen object is never collected,
    # so freezing can only make the walk fail, never pass by mistake. One capture first, in a
    # configuration of its own, so that what the first capture of a process imports is frozen too.
    profctx.configure(steps="0:10", mode=mode, save_path=tmp_path / "first", compress=False, exit_hooks=False,
                      warmup=False)
    _one_capture(1)
    profctx.reset()
    gc.collect()
    gc.freeze()
    try:
        _walk_every_statement(tmp_path, mode)
    finally:
        gc.unfreeze()


def _walk_every_statement(tmp_path: Path, mode: str) -> None:
    profctx.configure(steps="0:10000", mode=mode, save_path=tmp_path, compress=False, exit_hooks=False,
                      warmup=False)
    step = 0
    statements = 0
    next_steps: list[int] = []
    while True:
        step += 1
        injector = _Injector(statements + 1)

        def interrupted(step: int = step, injector: _Injector = injector) -> None:
            sys.settrace(injector.global_trace)  # Ctrl-C lands in the main thread only
            try:
                with profctx.profile_step(step), profctx.profile_step(role="rollout"):
                    torch.ones(8).sum()
            except KeyboardInterrupt:
                pass
            finally:
                sys.settrace(None)

        # In a copy of the context: an interrupt inside profctx's own exit may leave the
        # ambient scope set in it (the user's program is being interrupted anyway).
        contextvars.copy_context().run(interrupted)
        # A block dropped mid-exit is ended when it is collected; the interrupt's traceback
        # holds it in a reference cycle, which the cycle collector frees.
        held = OWNER.runtime.holder() if OWNER.runtime is not None else None
        if held is not None and held.recording:
            gc.collect()
        runtime = OWNER.runtime
        assert runtime is not None
        step += 1
        with profctx.profile_step(step), profctx.profile_step(role="rollout"):
            torch.ones(8).sum()
        # The token is back, no torch session is left running, the next capture recorded.
        holder = runtime.holder()
        assert holder is None or holder.status not in ("starting", "live", "stopping"), (statements, holder.status)
        assert not torch.autograd._profiler_enabled(), statements
        next_steps.append(step)
        if not injector.fired:
            break  # every statement was interrupted once
        statements += 1
    assert statements > 20  # start and stop really were walked through
    assert profctx.flush(60)
    records = read(tmp_path)
    by_step = {r["step"]: r["status"] for r in records}
    assert [s for s in next_steps if by_step.get(s) != "ok"] == []  # every capture after an interrupt recorded
    assert {r["status"] for r in records} <= {"ok", "interrupted"}


# -- concurrent tasks ------------------------------------------------------------------------------

TASKS = """
    import asyncio, sys, profctx, torch
    profctx.configure(steps="0:4", mode="role", save_path=sys.argv[1], compress=False)

    async def task(i):
        async with profctx.profile_step(role=f"role{i % 5}"):
            x = torch.ones(32, 32)
            for _ in range(3):
                x = x @ x / 32
                await asyncio.sleep(0)
            async with profctx.profile_step(role="inner"):
                await asyncio.sleep(0)
                x = x + 1

    async def main():
        for step in range(4):
            with profctx.profile_step(step):
                await asyncio.gather(*(task(i) for i in range(64)))
    asyncio.run(main())
    print("done", flush=True)
"""


@pytest.mark.slow
@pytest.mark.parametrize("attempt", range(3))
def test_64_tasks_entering_roles_concurrently_never_crash(tmp_path: Path, attempt: int) -> None:
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(TASKS), str(tmp_path)],
                         capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "done" in out.stdout
    records = read(tmp_path)
    assert {r["status"] for r in records} <= {"ok", "skipped"}
    ok = [r for r in records if r["status"] == "ok"]
    assert len(ok) == 4  # one recording capture per step; the other tasks' roles are ranges in it
    for record in ok:
        trace = json.loads((tmp_path / record["files"][0]["path"]).read_text())
        names = {e.get("name") for e in trace["traceEvents"]}
        assert "inner" in names


def test_200_captures_in_the_same_millisecond_get_200_files(tmp_path: Path) -> None:
    from profctx.testing import RecordingBackend

    RecordingBackend.clear()
    profctx.configure(steps="0:200", save_path=tmp_path, tool="recording", exit_hooks=False, warmup=False)
    for step in range(200):
        with profctx.profile_step(step):
            pass
    assert profctx.flush(30)
    records = read(tmp_path)
    paths = [f["path"] for r in records for f in r["files"]]
    assert len(records) == 200 and len(set(paths)) == 200
    assert len(list(tmp_path.rglob("*.recording.json"))) == 200


def test_user_exceptions_and_cancellation_pass_through_async_blocks(tmp_path: Path) -> None:
    profctx.configure(steps=[1], mode="role", save_path=tmp_path, tool="recording", exit_hooks=False)

    async def body() -> None:
        async with profctx.profile_step(1, role="rollout"):
            await asyncio.sleep(10)

    async def main() -> None:
        task = asyncio.ensure_future(body())
        await asyncio.sleep(0.01)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task

    asyncio.run(main())
    assert profctx.flush(10)
    assert [r["status"] for r in read(tmp_path)] == ["ok"]
