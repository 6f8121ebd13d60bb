"""Capture on anomaly: the rule (Hypothesis), and a run whose step 12 is slow captures step 13, with its reason.

The in-process runs move the clock profctx times steps with (``fake_clock``) instead of sleeping:
a slow step is slow by exactly what the test says, and a loaded machine makes no other step slow.
"""

from __future__ import annotations

import os
import re
import socket
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from fakeclock import FakeClock
from hypothesis import given
from hypothesis import strategies as st

import profctx
from profctx.core._ondemand import anomaly, reason
from profctx.manifest import read

ROOT = Path(__file__).resolve().parents[1]

times = st.floats(0.001, 10.0)


@given(st.lists(times, max_size=30), times, st.floats(1.01, 10.0), st.integers(3, 30))
def test_a_step_is_anomalous_when_it_exceeds_factor_times_the_median_of_a_full_window(
        history: list[float], seconds: float, factor: float, window: int) -> None:
    median = anomaly(seconds, history, factor, window)
    if len(history) < window:
        assert median is None  # too few steps known to say what is normal
        return
    last = sorted(history[-window:])
    middle = len(last) // 2
    expected = last[middle] if window % 2 else (last[middle - 1] + last[middle]) / 2
    assert median == (expected if seconds > factor * expected else None)


@given(st.lists(times, min_size=5, max_size=5), st.floats(1.5, 10.0))
def test_steps_like_the_others_are_never_anomalous(history: list[float], factor: float) -> None:
    assert anomaly(sorted(history)[2], history, factor, 5) is None


def test_the_reason_says_which_step_how_much_slower_and_against_what() -> None:
    assert reason(812, 1.23, 0.45, 20) == "step 812 took 2.7\u00d7 the median of the last 20 steps (1.23 s vs 0.45 s)"
    assert reason(5, 0.05, 0.01, 10, role="rollout").startswith("role rollout in step 5 took 5.0\u00d7")


def run_loop(clock: FakeClock, steps: int, slow: dict[int, float], pause: float = 0.03) -> None:
    for step in range(1, steps + 1):
        with profctx.profile_step(step), profctx.profile_step(role="rollout"):
            clock.advance(pause + slow.get(step, 0.0))
        # A capture's files are written by then, as in a loop whose steps outlast the writing: a step
        # while they are written is not judged, and with no real time passing the writer could lag.
        assert profctx.flush(timeout=600)


def test_a_slow_step_yields_one_capture_of_the_next_step_with_its_reason(
        tmp_path: Path, caplog: pytest.LogCaptureFixture, fake_clock: FakeClock) -> None:
    profctx.configure(save_path=tmp_path, tool="torch", compress=False,
                      auto_capture={"factor": 10.0, "window": 10, "max_captures": 3})
    with caplog.at_level("WARNING", logger="profctx"):
        run_loop(fake_clock, 30, {12: 1.0})
    profctx.flush()
    captures = read(tmp_path)
    assert [(r.kind, r.steps, r.status) for r in captures] == [("step", (13,), "ok")]
    trigger = captures[0].trigger
    assert trigger is not None
    assert trigger["origin"] == "anomaly" and trigger["first"] == 13 and trigger["count"] == 1
    assert trigger["reason"] == "step 12 took 34.3\u00d7 the median of the last 10 steps (1.03 s vs 30.0 ms)"
    assert f"auto capture: {trigger['reason']}" in captures[0].notes
    assert captures[0].files and all((tmp_path / f.path).is_file() for f in captures[0].files)
    assert [m for m in caplog.messages if "capturing step 13" in m]


def test_nothing_is_judged_before_a_full_window_and_the_cap_holds(tmp_path: Path, fake_clock: FakeClock) -> None:
    profctx.configure(save_path=tmp_path, tool="noop", auto_capture={"factor": 10.0, "window": 10, "max_captures": 2})
    # Step 5 is slow but only 4 steps are known: not judged. Steps 14, 17 and 20 are slow: the cap takes two.
    run_loop(fake_clock, 24, {5: 0.6, 14: 0.6, 17: 0.6, 20: 0.6}, pause=0.03)
    profctx.flush()
    captured = [r.steps for r in read(tmp_path)]
    assert captured == [(15,), (18,)]


#: A rank of a job without Ray: a gloo process group and an all_reduce in every step (as DDP has), 40 steps
#: of 10 ms, step 12 slow on every rank.
RANK_LOOP = textwrap.dedent('''
    import sys, time
    import torch, torch.distributed as dist
    import profctx
    dist.init_process_group("gloo")
    profctx.configure(save_path=sys.argv[1], tool="noop", ranks="all",
                      auto_capture={"factor": 10.0, "window": 8, "max_captures": 1})
    grad = torch.ones(4)
    for step in range(40):
        with profctx.profile_step(step):
            time.sleep(1.5 if step == 12 else 0.01)
            dist.all_reduce(grad)
    dist.destroy_process_group()
''')


def test_ranks_without_ray_capture_the_step_rank_0_chose(tmp_path: Path) -> None:
    script = tmp_path / "rank.py"
    script.write_text(RANK_LOOP)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {k: v for k, v in os.environ.items() if not k.startswith("PROFCTX_")}
    env.update(PYTHONPATH=str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""), WORLD_SIZE="2",
               PROFCTX_RUN_ID="auto-ranks", MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    procs = [subprocess.Popen([sys.executable, str(script), str(tmp_path / "run")], env={**env, "RANK": str(rank)},
                              stderr=subprocess.PIPE, text=True) for rank in (0, 1)]
    errors = [p.communicate(timeout=120)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], errors
    captures = [r for r in read(tmp_path / "run") if r.status == "ok"]
    by_rank = {rank: [r.steps for r in captures if r.rank == rank] for rank in (0, 1)}
    # Rank 0 judged a step anomalous (step 12, unless load made an earlier one look so: the step its reason
    # names is the one counted from) and named the step after the next: every rank captured that step.
    reasons = {(r.trigger or {}).get("reason") for r in captures}
    assert len(reasons) == 1, (reasons, errors)
    judged = int(re.match(r"step (\d+) took ", str(next(iter(reasons)))).group(1))  # type: ignore[union-attr]
    assert judged <= 12
    assert by_rank[0] == by_rank[1] == [(judged + 2,)], (by_rank, errors)


def test_steps_marked_by_callbacks_are_watched_too(tmp_path: Path, fake_clock: FakeClock) -> None:
    profctx.configure(save_path=tmp_path, tool="noop", auto_capture={"factor": 10.0, "window": 6, "max_captures": 1})
    steps = profctx.Steps()
    for step in range(1, 16):
        steps.begin(step)
        fake_clock.advance(0.6 if step == 9 else 0.03)
        steps.end()
    profctx.flush()
    assert [r.steps for r in read(tmp_path)] == [(10,)]


@pytest.mark.parametrize("every_step", [False, True])
def test_a_watched_role_that_is_slow_yields_one_capture_of_the_next_step(
        tmp_path: Path, every_step: bool, monkeypatch: pytest.MonkeyPatch, fake_clock: FakeClock) -> None:
    if every_step:  # the timeline hands its entries to the writer at every step's end, as for steps of minutes
        monkeypatch.setattr("profctx.process._timeline.FLUSH_S", 0.0)
    profctx.configure(save_path=tmp_path, tool="noop",
                      auto_capture={"factor": 10.0, "window": 8, "max_captures": 3, "role": "rollout"})
    for step in range(1, 25):
        with profctx.profile_step(step):
            with profctx.profile_step(role="rollout"):
                fake_clock.advance(0.6 if step == 12 else 0.03)
            with profctx.profile_step(role="train"):
                fake_clock.advance(0.6 if step == 6 else 0.03)  # slow too, but not watched
    profctx.flush()
    captures = read(tmp_path)
    assert [r.steps for r in captures] == [(13,)]
    trigger = captures[0].trigger
    assert trigger is not None
    assert trigger["reason"].startswith("role rollout in step 12 took "), trigger["reason"]


def test_a_watched_role_no_step_runs_is_said_once_with_the_roles_seen(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    """A typo in ``auto_capture.role``: said after a window of judged steps without it, once, not silently never."""
    def loop(steps: int) -> list[int]:
        """Run ``steps`` steps marked as the HF callback marks them; return the steps after which it was said."""
        marks = profctx.Steps()
        said = []
        for step in range(1, steps + 1):
            marks.begin(step)
            for role in ("training_step", "optimizer_step"):
                marks.begin_role(role)
                marks.end_role(role)
            marks.end()
            said += [step] * len([m for m in caplog.messages if "was in none of the" in m])
            caplog.clear()
        return said

    with caplog.at_level("WARNING", logger="profctx"):
        profctx.configure(save_path=tmp_path / "typo", tool="noop", auto_capture={"window": 4, "role": "trainig_step"})
        said = loop(12)
        # Step 1 is judged as step 2 begins: the 4th judged step (step 4) is judged as step 5 begins.
        assert said == [5]
        profctx.reset()
        caplog.clear()
        profctx.configure(save_path=tmp_path / "right", tool="noop",
                          auto_capture={"window": 4, "role": "training_step"})
        assert loop(12) == []
    profctx.reset()


def test_the_unseen_role_warning_names_the_role_and_the_roles_seen(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    profctx.configure(save_path=tmp_path, tool="noop", auto_capture={"window": 3, "role": "rolout"})
    with caplog.at_level("WARNING", logger="profctx"):
        for step in range(1, 8):
            with profctx.profile_step(step):
                with profctx.profile_step(role="rollout"):
                    pass
                with profctx.profile_step(role="train"):
                    pass
    said = [m for m in caplog.messages if "was in none of the" in m]
    assert len(said) == 1
    assert "auto_capture.role='rolout'" in said[0] and "'rollout', 'train'" in said[0], said[0]
    assert read(tmp_path) == []
