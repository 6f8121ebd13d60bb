"""``profctx.Steps``: begin/end pairs that cannot leave a step open or the scope on a dead step."""

from __future__ import annotations

import threading
from pathlib import Path

import pytest

import profctx
from profctx.testing import capture


def test_begin_end_marks_the_step_and_roles_for_blocks_without_their_own() -> None:
    steps = profctx.Steps()
    with capture(steps=[4]):
        steps.begin(4, run="a")
        steps.begin_role("train", phase=1)
        with profctx.profile_step(role="fwd"):
            scope = profctx.current()
        assert (scope.step, scope.roles, dict(scope.tags)) == (4, ("train", "fwd"), {"run": "a", "phase": 1})
        assert steps.step == 4 and steps.roles == ("train",) and steps.live
        steps.end_role("train")
        assert profctx.current().roles == ()
        steps.end()
        assert profctx.current() == profctx.Scope()
        assert steps.step is None and not steps.live


def test_out_of_the_window_roles_are_held_for_the_timeline_only_the_step_without_one() -> None:
    steps = profctx.Steps()
    with capture(steps=[4]):
        steps.begin(3, run="a")
        steps.begin_role("train")
        assert (profctx.current().step, profctx.current().roles, steps.live) == (3, ("train",), False)
        with profctx.profile_step(role="fwd"):  # a block of the user's, nested in the held role
            assert profctx.current() == profctx.Scope(3, ("train", "fwd"), {"run": "a"})
        steps.end_role("train")
        steps.end()
        assert profctx.current() == profctx.Scope()
    with capture(steps=[4], timeline=False):
        steps.begin(3, run="a")
        steps.begin_role("train")
        assert (profctx.current().step, profctx.current().roles, steps.marks_roles) == (3, (), False)
        with profctx.profile_step(role="fwd"):
            assert profctx.current() == profctx.Scope(3, ("fwd",), {"run": "a"})
        steps.end()
        assert profctx.current() == profctx.Scope()


def test_a_step_block_of_its_own_wins_over_the_held_step() -> None:
    steps = profctx.Steps()
    steps.begin(2)
    with profctx.profile_step(9):
        assert profctx.current().step == 9
    assert profctx.current().step == 2
    steps.close()


def test_end_without_begin_and_end_role_of_a_role_not_open_do_nothing() -> None:
    steps = profctx.Steps()
    steps.end()
    steps.end_role("opt")
    steps.end_role()
    steps.begin_role("opt")  # outside a step: nothing
    assert profctx.current() == profctx.Scope()
    steps.begin(1)
    steps.end_role("never")
    steps.end_role()  # no role open: the step stays
    assert profctx.current().step == 1
    steps.end()


def test_begin_closes_a_step_and_roles_left_open() -> None:
    steps = profctx.Steps()
    with capture(steps="1:4", mode="role") as caps:
        for step in (1, 2, 3):
            steps.begin(step)
            steps.begin_role("train")
            steps.begin_role("train")  # a missed end_role: the first one ends here
            if step != 2:
                steps.end_role("train")
                steps.end()
        assert profctx.current() == profctx.Scope()
    assert sorted((c.steps, c.role, c.status) for c in caps) == [
        ((1,), "train", "ok"), ((1,), "train", "ok"), ((2,), "train", "ok"), ((2,), "train", "ok"),
        ((3,), "train", "ok"), ((3,), "train", "ok")]


def test_step_mode_one_capture_per_step_with_roles_as_ranges() -> None:
    steps = profctx.Steps()
    with capture(steps="2:4", mode="step") as caps:
        for step in range(1, 6):
            steps.begin(step)
            steps.begin_role("training_step")
            steps.end_role("training_step")
            steps.begin_role("optimizer_step")
            steps.end_role("optimizer_step")
            steps.end()
    assert [(c.steps, c.ranges) for c in caps] == [
        ((2,), ["training_step", "optimizer_step"]), ((3,), ["training_step", "optimizer_step"])]


def test_an_exception_inside_with_steps_leaves_nothing_open() -> None:
    steps = profctx.Steps()
    seen: list[profctx.Scope] = []

    @profctx.profiled(role="later")
    def later() -> None:
        seen.append(profctx.current())

    with capture(steps="1:3", mode="role") as caps:
        with pytest.raises(ZeroDivisionError), steps:
            steps.begin(1)
            steps.begin_role("train")
            1 / 0  # noqa: B018 - the step's end never comes
        assert profctx.current() == profctx.Scope()
        later()  # outside any step: not captured, not step 1
    assert seen == [profctx.Scope()]
    assert [(c.steps, c.role) for c in caps] == [((1,), "train")]
    assert all(c.status == "ok" for c in caps)


def test_reset_ends_a_step_left_open(tmp_path: Path) -> None:
    steps = profctx.Steps()
    profctx.configure(steps="1:2", tool="recording", exit_hooks=False, warmup=False, save_path=str(tmp_path))
    steps.begin(1)
    steps.begin_role("train")
    profctx.reset()
    assert profctx.current() == profctx.Scope()
    steps.end()  # already ended: nothing


def test_the_step_is_seen_by_other_threads() -> None:
    steps = profctx.Steps()
    steps.begin(7)
    seen: list[int | None] = []
    thread = threading.Thread(target=lambda: seen.append(profctx.current().step))
    thread.start()
    thread.join()
    steps.end()
    assert seen == [7]


def test_a_second_steps_object_ends_the_first_ones_step() -> None:
    first, second = profctx.Steps(), profctx.Steps()
    first.begin(1)
    second.begin(2)
    assert profctx.current().step == 2
    first.end()  # its step is already over: the second one's stays
    assert profctx.current().step == 2
    second.end()
    assert profctx.current() == profctx.Scope()


@pytest.mark.parametrize("step", [1.5, True, "3", None])
def test_a_bad_step_is_refused(step: object) -> None:
    with pytest.raises(profctx.ConfigError, match="step"):
        profctx.Steps().begin(step)  # type: ignore[arg-type]
    assert profctx.current() == profctx.Scope()


def test_a_step_left_open_at_process_exit_is_written(tmp_path: Path) -> None:
    import subprocess
    import sys
    import textwrap

    script = textwrap.dedent(f"""
        import profctx
        profctx.configure(steps=[1], tool="recording", save_path={str(tmp_path)!r}, warmup=False)
        steps = profctx.Steps()
        steps.begin(1)
        steps.begin_role("train")
        raise SystemExit(3)  # no end, no close
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 3, done.stderr
    from profctx import manifest

    records = manifest.read(tmp_path)
    assert [(r.steps, r.status) for r in records] == [((1,), "ok")]
    assert [f.path.endswith(".recording.json") for f in records[0].files] == [True]
