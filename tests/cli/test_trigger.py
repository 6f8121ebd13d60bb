"""``profctx trigger``: the request it writes, the first step it names, and what it refuses."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

import profctx
from profctx.cli import main
from profctx.core._ondemand import parse
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
    if code in (0, 1) and "--json" in args and out.out.strip():
        return code, json.loads(out.out)
    return code, out.out + out.err


def _said(save: Path, rid: str) -> dict[str, Any] | None:
    """Return the state of request ``rid`` as the run's progress file publishes it (what the CLI reads)."""
    for path in (save / ".profctx" / "live").glob("*.json"):
        state = (json.loads(path.read_text()).get("requests") or {}).get(rid)
        if state is not None:
            return dict(state)
    return None


def test_a_live_run_captures_the_steps_the_cli_asks_for(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    profctx.configure(save_path=tmp_path, on_demand=True, tool="noop")  # step mode; the request asks for roles
    step = 0
    deadline = time.monotonic() + 60
    request: dict[str, Any] | None = None
    asked_at = -1
    while request is None or (_said(tmp_path, request["id"]) or {}).get("state") != "done":
        assert time.monotonic() < deadline, "timed out"
        with profctx.profile_step(step), profctx.profile_step(role="rollout"):
            time.sleep(0.01)
        step += 1
        if request is None and list((tmp_path / ".profctx" / "live").glob("*.json")) and step > 60:
            # Asked from the training thread itself: the run names the steps at a later step entry, so the
            # CLI does not wait for its answer here.
            code, answer = _trigger(tmp_path, "--steps", "2", "--mode", "role", "--roles", "rollout", "--json",
                                    "--wait", "0", capsys=capsys)
            assert code == 0 and isinstance(answer, dict), answer
            request, asked_at = answer, step
    profctx.flush()
    assert OWNER.runtime is not None
    assert request["first"] is None and request["run"] == OWNER.runtime.run_id  # matched by run and progress
    written = parse(json.loads(next((tmp_path / ".profctx" / "requests").glob("*.json")).read_text()))
    assert written.id == request["id"] and written.mode == "role" and written.roles == ("rollout",)
    said = _said(tmp_path, request["id"])
    assert said is not None
    first = said["first"]
    assert first > asked_at and said["last"] == first + 1
    got = [(r.kind, r.steps, r.role, r.status, (r.trigger or {}).get("id")) for r in read(tmp_path)]
    assert got == [("role", (first,), "rollout", "ok", request["id"]), ("role", (first + 1,), "rollout", "ok",
                                                                         request["id"])]


def test_the_request_names_the_run_and_no_step(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / ".profctx").mkdir()
    _live(tmp_path, step=100, period=0.01, age=600.0)  # a clock 600 s apart: on this host the pid tells
    code, request = _trigger(tmp_path, "--steps", "3", "--json", "--wait", "0", capsys=capsys)
    assert code == 0 and isinstance(request, dict)
    assert request["first"] is None and request["run"] == "r" and request["count"] == 3
    assert request["uid"] == os.getuid() and request["origin"] == "trigger" and request["answer"] is None
    code, out = _trigger(tmp_path, "--steps", "3", "--wait", "0", capsys=capsys)
    assert code == 0 and "the 3 step(s) after the one it enters next" in str(out)


@pytest.mark.parametrize(("published", "args", "message"), [
    ({"decides": True, "left": 0}, [], "on_demand_max_captures"),
    ({"world_size": 2}, ["--ranks", "1,3"], "--ranks 3: the run has ranks 0-1"),
])
def test_a_request_the_run_cannot_honour_is_refused_by_the_cli(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                                              published: dict[str, Any], args: list[str],
                                                              message: str) -> None:
    (tmp_path / ".profctx").mkdir()
    path = _live(tmp_path, step=5, period=0.1)
    path.write_text(json.dumps({**json.loads(path.read_text()), **published}))
    code, out = _trigger(tmp_path, "--steps", "1", "--wait", "0", *args, capsys=capsys)
    assert code == 1 and "refused" in str(out) and message in str(out), out
    assert not (tmp_path / ".profctx" / "requests").exists()


@pytest.mark.parametrize("which", ["stale-elsewhere", "dead", "not-on-demand", "link", "garbage"])
def test_only_live_on_demand_processes_count(tmp_path: Path, capsys: pytest.CaptureFixture[str], which: str,
                                             monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / ".profctx").mkdir()
    monkeypatch.setattr("profctx.cli.trigger.HEARTBEAT_S", 0.1)  # the second look at another host's file
    if which == "stale-elsewhere":  # another host's file, old by this clock and unchanged when looked at again
        path = _live(tmp_path, step=5, period=0.1, age=60.0)
        path.write_text(json.dumps({**json.loads(path.read_text()), "host": "elsewhere"}))
    elif which == "dead":
        _live(tmp_path, step=5, period=0.1, pid=2**22 + 12345)
    elif which == "not-on-demand":
        _live(tmp_path, step=5, period=0.1, on_demand=False)
    elif which == "link":
        target = _live(tmp_path, step=5, period=0.1, name="real.json")
        moved = tmp_path / "elsewhere.json"
        target.rename(moved)
        (tmp_path / ".profctx" / "live" / "link.json").symlink_to(moved)
    else:
        (tmp_path / ".profctx" / "live").mkdir(parents=True)
        (tmp_path / ".profctx" / "live" / "x.json").write_bytes(b"\x00" * 100)
    code, out = _trigger(tmp_path, "--steps", "1", "--wait", "0", capsys=capsys)
    assert code == 1, out
    assert "no live process" in str(out)
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
    code, request = _trigger(tmp_path, "--steps", "1", "--json", "--wait", "0", capsys=capsys)
    assert code == 0 and isinstance(request, dict)
    assert not old.exists() and recent.exists() and (folder / f"{request['id']}.json").is_file()
