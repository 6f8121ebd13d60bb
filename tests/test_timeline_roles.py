"""Every top-level role of every step in the timeline, whatever marks it; ``last_step()``; the timeline-only mode."""

from __future__ import annotations

import asyncio
import json
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import profctx

ROOT = Path(__file__).resolve().parents[1]


def _steps(save: Path) -> list[dict[str, object]]:
    lines = [json.loads(line) for path in sorted((save / ".profctx").glob("*.timeline"))
             for line in path.read_text().splitlines()]
    return [line for line in lines if "step" in line]


@profctx.profiled(role="generate")
def generate(n: int) -> int:
    return n + 1


@profctx.profiled(role="update")
def update(n: int) -> int:
    return generate(n) * 2  # nested: part of update's time, not a role of its own


@profctx.profiled(role="score")
async def score(n: int) -> int:
    await asyncio.sleep(0)
    return n


def test_profiled_roles_are_timed_in_every_step_and_nest_under_held_roles(tmp_path: Path) -> None:
    profctx.configure(steps=[2], save_path=tmp_path, tool="noop", warmup=False, exit_hooks=False)
    for step in (1, 2, 3):  # 2 is in the window, 1 and 3 are not
        with profctx.profile_step(step):
            generate(step)
            update(step)
            asyncio.run(score(step))
    steps = profctx.Steps()
    steps.begin(4)  # out of the window, marked by callbacks (as the HF callback does)
    steps.begin_role("training_step")
    generate(4)  # inside the held role: folds into it
    with profctx.profile_step(role="loss"):
        assert profctx.current().roles == ("training_step", "loss")
    steps.end_role("training_step")
    update(4)
    steps.end()
    assert generate(5) == 6  # outside any step: straight through
    assert profctx.current() == profctx.Scope()
    assert profctx.flush()
    got = {s["step"]: {name: count for name, (_, count, *_) in s["roles"].items()} for s in _steps(tmp_path)}
    assert got == {1: {"generate": 1, "update": 1, "score": 1}, 2: {"generate": 1, "update": 1, "score": 1},
                   3: {"generate": 1, "update": 1, "score": 1}, 4: {"training_step": 1, "update": 1}}


def test_last_step_returns_the_step_that_just_ended(tmp_path: Path) -> None:
    assert profctx.last_step() is None  # not configured
    profctx.configure(steps=[100], save_path=tmp_path, tool="noop", warmup=False, exit_hooks=False)
    assert profctx.last_step() is None  # no step ended yet
    for step in range(1, 4):
        with profctx.profile_step(step):
            with profctx.profile_step(role="rollout"):
                pass
            with profctx.profile_step(role="train"):
                pass
            with profctx.profile_step(role="train"):
                pass
        last = profctx.last_step()
        assert last is not None and last.step == step
        assert {name: role.count for name, role in last.roles.items()} == {"rollout": 1, "train": 2}
        assert sum(role.seconds for role in last.roles.values()) <= last.time_s
    with pytest.raises(AttributeError):
        last.step = 9  # type: ignore[misc]  # frozen
    metrics = last.metrics(counts="timing_n/")
    assert set(metrics) == {"timing_s/step", "timing_s/rollout", "timing_s/train", "timing_n/rollout",
                            "timing_n/train"}
    assert metrics["timing_n/train"] == 2.0 and metrics["timing_s/step"] == last.time_s
    assert set(last.metrics("t/", step_name="iter")) == {"t/iter", "t/rollout", "t/train"}
    assert profctx.flush()
    assert [s["step"] for s in _steps(tmp_path)] == [1, 2, 3]  # folding for last_step loses no line


def test_last_step_marks_an_anomalous_step(tmp_path: Path) -> None:
    import time

    profctx.configure(steps=[100], save_path=tmp_path, tool="noop", warmup=False, exit_hooks=False)
    marks = []
    for step in range(1, 10):
        with profctx.profile_step(step):
            time.sleep(0.3 if step == 8 else 0.002)  # 150 times the others: no load makes those 2x slower as often
        last = profctx.last_step()
        assert last is not None
        marks.append(last.marks)
    assert marks[7] == ("anomaly",)


def test_timeline_only_keeps_the_timeline_and_summary_and_says_nothing_of_captures(tmp_path: Path) -> None:
    code = textwrap.dedent(f"""
        import sys
        import profctx
        profctx.configure(steps=[], save_path={str(tmp_path)!r}, summary_at_exit=True)
        for step in range(1, 6):
            with profctx.profile_step(step):
                with profctx.profile_step(role="rollout"):
                    pass
        print("torch imported:", "torch" in sys.modules)
    """)
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                          cwd=ROOT, env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"})
    assert done.returncode == 0, done.stderr
    assert "torch imported: False" in done.stdout  # no backend is set up for a run that captures nothing
    assert "phases per step" in done.stderr and "rollout" in done.stderr
    assert "nothing was captured" not in done.stderr
    assert [s["step"] for s in _steps(tmp_path)] == [1, 2, 3, 4, 5]
    assert not [p for p in tmp_path.iterdir() if p.name != ".profctx"]  # no capture folder
