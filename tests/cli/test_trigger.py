"""``profctx trigger``: the request it writes, the first step it names, and what it refuses."""

from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Any

import pytest

import profctx
from profctx.cli import main
from profctx.core._ondemand import AHEAD_S, AHEAD_STEPS, parse
from profctx.manifest import read
from profctx.process._ondemand import LIVE_VERSION, live_name
from profctx.process._owner import OWNER


def _live(save: Path, *, step: int | None, period: float | None, age: float = 0.0, pid: int | None = None,
          on_demand: bool = True, name: str | None = None) -> Path:
    """Write a progress file as a live process publishes it (``pid`` defaults to this process: alive)."""
    folder = save / ".profctx" / "live"
    folder.mkdir(parents=True, exist_ok=True)
    pid = os.getpid() if pid is None else pid
    data = {"profctx_live": LIVE_VERSION, "run": "r", "host": os.uname().nodename, "pid": pid, "uid": os.getuid(),
            "rank": 0, "world_size": 1, "group": None, "step": step, "period": period, "time": time.time() - age,
            "on_demand": on_demand}
    path = folder / (name or live_name("r", os.uname().nodename, pid))
    path.write_text(json.dumps(data))
    return path


def _trigger(save: Path, *args: str, capsys: pytest.CaptureFixture[str]) -> tuple[int, dict[str, Any] | str]:
    code = main(["trigger", str(save), *args])
    out = capsys.readouterr()
    if code == 0 and "--json" in args:
        return code, json.loads(out.out)
    return code, out.out + out.err


def test_a_live_run_captures_the_steps_the_cli_asks_for(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    profctx.configure(save_path=tmp_path, on_demand=True, tool="noop")  # step mode; the request asks for roles
    step = 0
    deadline = time.monotonic() + 30
    request: dict[str, Any] | None = None
    while request is None or step < request["first"] + 4:
        assert time.monotonic() < deadline, "timed out"
        with profctx.profile_step(step), profctx.profile_step(role="rollout"):
            time.sleep(0.01)
        step += 1
        if request is None and list((tmp_path / ".profctx" / "live").glob("*.json")) and step > 60:
            code, answer = _trigger(tmp_path, "--steps", "2", "--mode", "role", "--roles", "rollout", "--json",
                                    capsys=capsys)
            assert code == 0 and isinstance(answer, dict), answer
            request = answer
    profctx.flush()
    assert request["first"] > 60
    written = parse(json.loads(next((tmp_path / ".profctx" / "requests").glob("*.json")).read_text()))
    assert written.to_dict() == request and written.mode == "role" and written.roles == ("rollout",)
    got = [(r.kind, r.steps, r.role, r.status, (r.trigger or {}).get("id")) for r in read(tmp_path)]
    first = request["first"]
    assert got == [("role", (first,), "rollout", "ok", request["id"]), ("role", (first + 1,), "rollout", "ok",
                                                                         request["id"])]
    assert OWNER.last_step is not None and OWNER.last_step >= first + 2


def test_the_first_step_is_two_seconds_or_two_steps_ahead_of_the_furthest_process(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / ".profctx").mkdir()
    _live(tmp_path, step=100, period=0.01, name="a.json")
    _live(tmp_path, step=104, period=0.02, name="b.json")
    code, request = _trigger(tmp_path, "--steps", "3", "--json", capsys=capsys)
    assert code == 0 and isinstance(request, dict)
    # The furthest is 104 (projected a few steps on, for the ms since it was written); 2 s at 0.01 s per step.
    assert 104 + math.ceil(AHEAD_S / 0.01) <= request["first"] <= 104 + math.ceil(AHEAD_S / 0.01) + 10
    assert request["count"] == 3 and request["uid"] == os.getuid() and request["origin"] == "trigger"
    for path in (tmp_path / ".profctx" / "live").iterdir():
        path.unlink()
    _live(tmp_path, step=7, period=30.0)  # slow steps: two steps are more than two seconds
    code, request = _trigger(tmp_path, "--steps", "1", "--json", capsys=capsys)
    assert code == 0 and isinstance(request, dict) and request["first"] == 7 + AHEAD_STEPS


def test_a_process_without_a_pace_yet_is_watched_for_a_second(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / ".profctx").mkdir()
    _live(tmp_path, step=3, period=None)
    started = time.monotonic()
    code, request = _trigger(tmp_path, "--steps", "1", "--json", capsys=capsys)
    assert code == 0 and isinstance(request, dict)
    assert time.monotonic() - started >= 1.0
    assert request["first"] == 3 + AHEAD_STEPS  # it did not move in that second: 2 steps take 2 s or more


@pytest.mark.parametrize("which", ["stale", "dead", "not-on-demand", "no-step", "link", "garbage"])
def test_only_live_on_demand_processes_count(tmp_path: Path, capsys: pytest.CaptureFixture[str], which: str) -> None:
    (tmp_path / ".profctx").mkdir()
    if which == "stale":
        _live(tmp_path, step=5, period=0.1, age=60.0)
    elif which == "dead":
        _live(tmp_path, step=5, period=0.1, pid=2**22 + 12345)
    elif which == "not-on-demand":
        _live(tmp_path, step=5, period=0.1, on_demand=False)
    elif which == "no-step":
        _live(tmp_path, step=None, period=None)
    elif which == "link":
        target = _live(tmp_path, step=5, period=0.1, name="real.json")
        moved = tmp_path / "elsewhere.json"
        target.rename(moved)
        (tmp_path / ".profctx" / "live" / "link.json").symlink_to(moved)
    else:
        (tmp_path / ".profctx" / "live").mkdir(parents=True)
        (tmp_path / ".profctx" / "live" / "x.json").write_bytes(b"\x00" * 100)
    code, out = _trigger(tmp_path, "--steps", "1", capsys=capsys)
    assert code == 1, out
    expected = "has not entered a step yet" if which == "no-step" else "no live process"
    assert expected in str(out)
    assert not (tmp_path / ".profctx" / "requests").exists()


@pytest.mark.parametrize(("args", "message"), [
    (["--steps", "0"], "--steps 0"),
    (["--steps", "101"], "--steps 101"),
    (["--steps", "1", "--ranks", "0,x"], "--ranks"),
    (["--steps", "1", "--ranks", "-1"], "--ranks"),
    (["--steps", "1", "--roles", "a,,b"], "--roles"),
    (["--steps", "1", "--group", "../x"], "group"),
])
def test_bad_arguments_are_usage_errors(tmp_path: Path, capsys: pytest.CaptureFixture[str], args: list[str],
                                        message: str) -> None:
    (tmp_path / ".profctx").mkdir()
    _live(tmp_path, step=5, period=0.1)
    code, out = _trigger(tmp_path, *args, capsys=capsys)
    assert code == 2 and message in str(out)


def test_a_folder_that_is_no_run_is_a_usage_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out = _trigger(tmp_path, "--steps", "1", capsys=capsys)
    assert code == 2 and "not the save_path of a profctx run" in str(out)


def test_old_requests_of_this_user_are_removed(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    folder = tmp_path / ".profctx" / "requests"
    folder.mkdir(parents=True)
    old, recent = folder / "old.json", folder / "recent.json"
    old.write_text("{}")
    recent.write_text("{}")
    os.utime(old, (time.time() - 7200, time.time() - 7200))
    _live(tmp_path, step=5, period=0.1)
    code, request = _trigger(tmp_path, "--steps", "1", "--json", capsys=capsys)
    assert code == 0 and isinstance(request, dict)
    assert not old.exists() and recent.exists() and (folder / f"{request['id']}.json").is_file()
