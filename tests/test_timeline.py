"""The always-on step timeline: every step and its top-level roles, written beside the manifest, off the training
thread.

Runs are real: a capture inside the run, real files read back by the reader the CLI uses, real
subprocesses for a crash and for the exit summary. Where a test checks the times written, the
clock the blocks read is the test's own (:class:`FakeClock`), moved by the test instead of sleeping,
so the times are exact and a loaded machine cannot move them (``fake_clock``, tests/conftest.py).
"""

from __future__ import annotations

import asyncio
import os
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path
from typing import Any

import pytest
from fakeclock import FakeClock

import profctx
from profctx.analysis._timeline import files, read
from profctx.backends.noop import NoopBackend
from profctx.process._owner import OWNER
from profctx.process._timeline import FLUSH_EVENTS, FLUSH_S, MAX_EVENTS


def _taking(seconds: float, clock: FakeClock, method: Any) -> Any:
    """Return ``method``, made to take ``seconds`` of ``clock``'s time before it runs."""
    def slow(self: Any, *args: Any) -> Any:
        clock.advance(seconds)
        return method(self, *args)

    return slow


def _steps_of(save_path: Path) -> dict[int, dict[str, tuple[float, int]]]:
    (process,) = read(save_path).processes
    return {step: entry.roles for step, entry in process.steps.items()}


def test_a_30_step_run_lists_every_step_with_role_times_matching_the_tests_own_timers(
    tmp_path: Path, fake_clock: FakeClock, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Step 5 is captured (the noop backend: the same capture path as torch's, without its seconds of
    # start-up); its start and stop take a whole (fake) second each, which the step's time must leave out.
    for name in ("start", "stop"):
        monkeypatch.setattr(NoopBackend, name, _taking(1.0, fake_clock, getattr(NoopBackend, name)))
    profctx.configure(save_path=str(tmp_path), steps=[5], tool="noop", warmup=False)
    mine: dict[int, dict[str, float]] = {}
    step_times: dict[int, float] = {}
    for step in range(1, 31):
        with profctx.profile_step(step):
            begin = fake_clock.now
            spent: dict[str, float] = {}
            t0 = fake_clock.now
            with profctx.profile_step(role="rollout"):
                fake_clock.advance(0.004 * step)
                with profctx.profile_step(role="reward"):  # nested: folds into rollout
                    fake_clock.advance(0.001)
            spent["rollout"] = fake_clock.now - t0
            fake_clock.advance(0.002)  # between two roles: the step's, no role's
            t0 = fake_clock.now
            for _ in range(2):  # repeated: sums
                with profctx.profile_step(role="train"):
                    fake_clock.advance(0.006)
            spent["train"] = fake_clock.now - t0
            mine[step] = spent
            step_times[step] = fake_clock.now - begin
    profctx.reset()

    (process,) = read(tmp_path).processes
    assert sorted(process.steps) == list(range(1, 31))  # step 5 was captured: timed all the same
    assert (tmp_path / "step000005" / "step").is_dir()
    for step, entry in process.steps.items():
        assert set(entry.roles) == {"rollout", "train"}
        assert entry.roles["rollout"][1] == 1 and entry.roles["train"][1] == 2
        for role, (seconds, _) in entry.roles.items():
            assert seconds == pytest.approx(mine[step][role], abs=1e-6), (step, role, seconds, mine[step][role])
        # The step's own time is its body: the capture's start and stop (step 5) are not in it.
        assert entry.time_s == pytest.approx(step_times[step], abs=1e-6), (step, entry.time_s, step_times[step])
        # The wall-clock start: this run's, to within the seconds the fake clock moved (a generous bound).
        assert entry.start is not None and abs(entry.start - time.time()) < 120


def test_flush_writes_the_steps_so_far(tmp_path: Path) -> None:
    profctx.configure(save_path=str(tmp_path), steps=[50], tool="noop", warmup=False)
    for step in range(1, 6):
        with profctx.profile_step(step):
            pass
    assert profctx.flush(30)
    (process,) = read(tmp_path).processes  # the run goes on: no reset, no exit
    assert sorted(process.steps) == [1, 2, 3, 4, 5]


def test_timeline_false_writes_nothing(tmp_path: Path) -> None:
    profctx.configure(save_path=str(tmp_path), steps=[5], tool="noop", warmup=False, timeline=False)
    for step in range(1, 10):
        with profctx.profile_step(step), profctx.profile_step(role="r"):
            pass
    profctx.reset()
    assert files(tmp_path) == []
    assert not list((tmp_path / ".profctx").glob("*.timeline"))


def test_timeline_is_refused_when_not_a_flag(tmp_path: Path) -> None:
    with pytest.raises(profctx.ConfigError, match=r"timeline.*'sometimes'.*true or false"):
        profctx.configure(save_path=str(tmp_path), steps=[5], timeline="sometimes")
    with pytest.raises(profctx.ConfigError, match="summary_at_exit"):
        profctx.configure(save_path=str(tmp_path), steps=[5], summary_at_exit=3)


def test_environment_turns_the_timeline_off_and_alone_configures_nothing(tmp_path: Path,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROFCTX_TIMELINE", "0")
    with profctx.profile_step(1):  # no configuration given: the variable alone does not switch profiling on
        pass
    assert profctx.get_config() is None
    config = profctx.configure(save_path=str(tmp_path), steps=[5], tool="noop", warmup=False)
    assert config is not None and config.timeline is False
    monkeypatch.setenv("PROFCTX_TIMELINE", "perhaps")
    with pytest.raises(profctx.ConfigError, match="PROFCTX_TIMELINE"):
        profctx.configure(save_path=str(tmp_path), steps=[5])


def test_steps_begin_end_and_async_blocks_are_timed(tmp_path: Path) -> None:
    profctx.configure(save_path=str(tmp_path), steps=[2], tool="noop", warmup=False)
    steps = profctx.Steps()
    for step in (1, 2, 3):  # out of the window, in it, out again
        steps.begin(step)
        steps.begin_role("generate")
        steps.begin_role("sample")  # nested in generate
        time.sleep(0.002)
        steps.end_role("sample")
        steps.end_role("generate")
        steps.begin_role("score")
        time.sleep(0.001)
        steps.end()  # ends the open role too
    steps.begin(4)
    steps.begin(5)  # a missed end: step 4 ends here
    steps.close()

    async def loop() -> None:
        for step in (10, 11):
            async with profctx.profile_step(step), profctx.profile_step(role="await"):
                await asyncio.sleep(0.002)

    asyncio.run(loop())
    profctx.reset()
    found = _steps_of(tmp_path)
    assert sorted(found) == [1, 2, 3, 4, 5, 10, 11]
    for step in (1, 2, 3):
        assert set(found[step]) == {"generate", "score"}
        assert found[step]["generate"][1] == 1 and found[step]["generate"][0] >= 0.002
    assert found[10]["await"][0] >= 0.002 and found[4] == {}


def test_a_worker_times_the_steps_its_driver_holds_for_it(tmp_path: Path) -> None:
    # What a Ray worker runs when its driver enters and leaves a step (profctx.ray calls these through
    # __ray_call__), here in this process: the worker's own role blocks under the held step are its roles.
    from profctx.ray import _worker

    profctx.configure(save_path=str(tmp_path), steps=[2], tool="noop", warmup=False, group="actor", rank=1,
                      world_size=2)
    for step in (1, 2):
        assert _worker.step_enter(None, step)
        with profctx.profile_step(role="update"):
            time.sleep(0.002)
        assert _worker.step_exit(None, step)
    profctx.reset()
    (process,) = read(tmp_path).processes
    assert process.name == "actor/rank1" and sorted(process.steps) == [1, 2]
    assert all(entry.roles["update"][1] == 1 and entry.roles["update"][0] >= 0.002
               for entry in process.steps.values())


def test_a_step_with_very_many_role_blocks_is_folded_as_it_goes(tmp_path: Path) -> None:
    profctx.configure(save_path=str(tmp_path), steps=[10**6], tool="noop", warmup=False)
    blocks = 3 * FLUSH_EVENTS + 7  # handed to the writer several times within the one step
    with profctx.profile_step(1):
        for i in range(blocks):
            with profctx.profile_step(role="micro" if i % 2 else "macro/inner"):
                pass
    profctx.reset()
    roles = _steps_of(tmp_path)[1]
    assert set(roles) == {"micro", "macro"} and roles["micro"][1] + roles["macro"][1] == blocks


def test_a_writer_that_falls_behind_drops_what_waits_and_counts_it(tmp_path: Path) -> None:
    profctx.configure(save_path=str(tmp_path), steps=[10**6], tool="noop", warmup=False)
    runtime = OWNER.runtime
    assert runtime is not None and runtime.timeline is not None
    stuck = threading.Event()
    runtime.submit(lambda: stuck.wait(60))  # the writer thread is busy (a slow disk) until released
    extra = 25
    for step in range(MAX_EVENTS + extra):
        with profctx.profile_step(step):
            pass
    assert len(runtime.timeline.events) == extra  # memory stayed bounded: what waited was dropped
    stuck.set()
    profctx.reset()
    (process,) = read(tmp_path).processes
    assert process.dropped == MAX_EVENTS
    assert sorted(process.steps) == list(range(MAX_EVENTS, MAX_EVENTS + extra))


def test_summary_at_reset_prints_phases_per_step(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                 fake_clock: FakeClock) -> None:
    profctx.configure(save_path=str(tmp_path), steps=[10**6], tool="noop", warmup=False, timeline=False,
                      summary_at_exit=True)
    for step in range(1, 11):
        with profctx.profile_step(step):
            with profctx.profile_step(role="rollout"):
                fake_clock.advance(0.003)
            with profctx.profile_step(role="train"):
                fake_clock.advance(0.001)
    profctx.reset()
    err = capsys.readouterr().err
    assert "profctx: phases per step, rank 0 of 1" in err and "10 steps (1..10)" in err
    lines = {line.split()[0]: line.split() for line in err.splitlines() if line.startswith("  ")}
    assert lines["rollout"][-2] == "10" and lines["train"][-2] == "10"
    share = float(lines["rollout"][-1].rstrip("%"))
    assert share == pytest.approx(75, abs=1)  # 3 of 4 ms per step
    assert files(tmp_path) == []  # timeline=False: the totals are kept, no file written


def _python(code: str, cwd: Path, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    full = {**os.environ, **(env or {})}
    for var in ("PROFCTX_STEPS", "PROFCTX_SAVE_PATH", "RANK", "WORLD_SIZE"):
        full.pop(var, None)
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=cwd, env=full, capture_output=True,
                          text=True, timeout=120)


def test_the_summary_is_printed_at_interpreter_exit(tmp_path: Path) -> None:
    done = _python(f"""
        import time, profctx
        profctx.configure(save_path={str(tmp_path)!r}, steps=[3], tool="noop", warmup=False, summary_at_exit=True)
        for step in range(1, 7):
            with profctx.profile_step(step):
                with profctx.profile_step(role="rollout"):
                    time.sleep(0.002)
        print("loop done")
    """, tmp_path)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "loop done"
    assert "profctx: phases per step" in done.stderr and "6 steps (1..6)" in done.stderr
    assert any(line.split()[:1] == ["rollout"] and line.split()[-2] == "6" for line in done.stderr.splitlines())
    assert len(read(tmp_path).processes[0].steps) == 6  # the file was flushed at exit too


def test_a_crash_leaves_a_readable_timeline_of_the_steps_flushed(tmp_path: Path) -> None:
    done = _python(f"""
        import glob, os, time, profctx
        profctx.configure(save_path={str(tmp_path)!r}, steps=[3], tool="noop", warmup=False)
        for step in range(1, 31):
            with profctx.profile_step(step):
                with profctx.profile_step(role="work"):
                    pass
            if step == 20:
                time.sleep({FLUSH_S} + 0.1)  # step 21 ends past the hand-over time: steps 1-21 go to the writer
            if step == 21:
                deadline = time.monotonic() + 30
                while time.monotonic() < deadline and not any(
                        '"step":21,' in open(f).read() for f in glob.glob({str(tmp_path)!r} + "/.profctx/*.timeline")):
                    time.sleep(0.01)
        os._exit(3)  # killed: no exit hook, no flush of the steps still waiting
    """, tmp_path)
    assert done.returncode == 3, done.stderr
    (path,) = files(tmp_path)
    with open(path, "ab") as handle:  # and a write cut mid-line, as a kill during a write leaves it
        handle.write(b'{"step": 999, "time_s": 0.')
    timelines = read(tmp_path)
    (process,) = timelines.processes
    flushed = sorted(process.steps)
    assert flushed == list(range(1, len(flushed) + 1)) and len(flushed) >= 21  # whole steps, in order
    assert all(set(s.roles) == {"work"} for s in process.steps.values())
    assert any("torn" in d for d in timelines.damaged)
