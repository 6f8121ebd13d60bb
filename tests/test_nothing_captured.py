"""Nothing captured, something said: one warning naming what the process saw, at exit, reset() or flush()."""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import profctx
from profctx.cli import main


def _warnings(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "profctx" and r.levelno >= logging.WARNING]


def _loop(steps: int, roles: tuple[str, ...] = ("rollout", "actor_update")) -> None:
    for step in range(1, steps + 1):
        with profctx.profile_step(step):
            for role in roles:
                with profctx.profile_step(role=role):
                    pass


def test_a_window_the_loop_never_reaches_is_named_once_with_the_last_step(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="profctx")
    profctx.configure(steps="30:35", save_path=tmp_path, exit_hooks=False, warmup=False)
    _loop(20)
    profctx.flush()  # the loop may not be over for all profctx knows: the window is still ahead
    assert _warnings(caplog) == []
    profctx.reset()
    (said,) = _warnings(caplog)
    assert "nothing was captured" in said and "steps='30:35'" in said and "last step seen: 20" in said


def test_a_role_filter_typo_in_role_mode_lists_the_roles_seen_once(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="profctx")
    profctx.configure(steps="3:5", mode="role", roles=["actor_updat"], save_path=tmp_path,
                      exit_hooks=False, warmup=False)
    _loop(8)
    profctx.flush()  # past the window: said here
    profctx.reset()  # and not again
    (said,) = _warnings(caplog)
    assert "nothing was captured" in said and "roles=['actor_updat']" in said
    assert "actor_update" in said.split("matched none of the roles seen")[1] and "rollout" in said
    assert "steps 3-4" in said


def test_a_role_filter_typo_in_step_mode_says_the_captures_hold_no_roles(
        tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="profctx")
    profctx.configure(steps=[2], roles=["actor_updat"], save_path=tmp_path, exit_hooks=False, warmup=False)
    _loop(3)
    profctx.reset()
    (said,) = _warnings(caplog)
    assert "no role ranges" in said and "actor_update" in said and "rollout" in said


def test_a_normal_run_and_an_unselected_rank_say_nothing(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger="profctx")
    profctx.configure(steps="2:3", mode="role", roles=["actor_*"], save_path=tmp_path / "a", exit_hooks=False,
                      warmup=False)
    _loop(4)
    profctx.flush()
    profctx.reset()
    assert list((tmp_path / "a").glob("step000002/actor_update/*.pt.trace.json*"))  # a real capture was made
    profctx.configure(steps="30:35", ranks=[1], rank=0, world_size=2, save_path=tmp_path / "b", exit_hooks=False)
    _loop(3)
    profctx.reset()
    profctx.configure(steps="30:35", save_path=tmp_path / "c", exit_hooks=False)  # no step marked at all
    profctx.reset()
    assert _warnings(caplog) == []


def test_a_process_that_exits_without_capturing_warns_once(tmp_path: Path) -> None:
    script = textwrap.dedent(f"""
        import profctx
        profctx.configure(steps="30:35", save_path={str(tmp_path)!r}, warmup=False)
        for step in range(1, 21):
            with profctx.profile_step(step):
                with profctx.profile_step(role="actor_update"):
                    pass
        profctx.flush()
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120, check=True)
    assert done.stderr.count("nothing was captured") == 1, done.stderr
    assert "last step seen: 20" in done.stderr


def test_ls_on_a_configured_folder_with_no_capture_says_so(tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    profctx.configure(steps="30:35", save_path=tmp_path, exit_hooks=False, warmup=False)
    _loop(2)
    assert main(["ls", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "a profctx folder with no capture yet" in out and "not a profctx folder" not in out
    assert main(["summary", str(tmp_path)]) == 2
    assert "no capture yet" in capsys.readouterr().err
    profctx.reset()
    empty = tmp_path / "empty"
    empty.mkdir()
    assert main(["ls", str(empty)]) == 2
    assert "not a profctx folder" in capsys.readouterr().err
