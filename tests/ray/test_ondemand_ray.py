"""On-demand capture with Ray worker groups: the driver reads the request, the selected members follow its steps."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest

import profctx
from profctx.process._owner import OWNER
from profctx.records import _manifest

ray = pytest.importorskip("ray")
pray = pytest.importorskip("profctx.ray")
from _actors import Plain, where  # noqa: E402 - after the skip: needs ray

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def workers(ray_cluster: Any) -> list[Any]:
    """Two plain (sync) actors, shared by the module's tests, started (the first steps' pace is the loop's)."""
    actors = [ray.remote(num_cpus=0)(Plain).remote() for _ in range(2)]
    ray.get([a.__ray_call__.remote(where) for a in actors])
    return actors


@pytest.fixture(autouse=True)
def _fresh() -> Any:
    yield
    profctx.reset()


def _trigger(save: Path, *args: str) -> subprocess.Popen[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PROFCTX_")}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    return subprocess.Popen([sys.executable, "-m", "profctx", "trigger", str(save), "--json", *args], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def _published(save: Path) -> bool:
    """Whether the driver published its step and pace (what the CLI reads)."""
    for path in (save / ".profctx" / "live").glob("*.json"):
        try:
            data = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(data.get("step"), int) and data.get("period"):
            return True
    return False


def _run_until_triggered(save: Path, workers: list[Any], *args: str) -> dict[str, Any]:
    """Step the driver (each step calls both workers) while ``profctx trigger`` runs; return its request.

    The loop goes on a second past the requested steps, so the driver has read the request whatever it said.
    """
    proc: subprocess.Popen[str] | None = None
    request: dict[str, Any] | None = None
    known = 0.0
    deadline = time.monotonic() + 90
    step = 0
    while request is None or step <= request["first"] + request["count"] + 1 or time.monotonic() < known + 1.0:
        assert time.monotonic() < deadline, "timed out"
        with profctx.profile_step(step):
            pray.fan_out([(w, "work") for w in workers])
            time.sleep(0.02)
        step += 1
        if proc is None and step % 10 == 0 and _published(save):
            proc = _trigger(save, *args)
        if proc is not None and request is None and proc.poll() is not None:
            out, err = proc.communicate()
            assert proc.returncode == 0, out + err
            answer = json.loads(out)
            # The request names no step: the driver named the first one from its own progress (the answer).
            assert answer["first"] is None and answer["answer"]["state"] in ("scheduled", "done"), answer
            request = {**answer, "first": answer["answer"]["first"]}
            known = time.monotonic()
    assert pray.flush() == [True, True]
    return request


def test_the_selected_members_capture_the_triggered_steps(workers: list[Any], tmp_path: Path) -> None:
    profctx.configure(save_path=str(tmp_path), on_demand=True, mode="step", ranks="all", tool="recording",
                      warmup=False)
    pray.group("actor", workers)
    request = _run_until_triggered(tmp_path, workers, "--steps", "2", "--group", "actor", "--ranks", "1")
    first = request["first"]
    records = _manifest.read(tmp_path)
    got = sorted((r.get("group"), r["rank"], tuple(r["steps"]), r["status"]) for r in records)
    # Only rank 1 of the group captures (the driver is in no group: not selected), exactly the two steps.
    assert got == [("actor", 1, (first,), "ok"), ("actor", 1, (first + 1,), "ok")], records
    assert all(r["trigger"]["id"] == request["id"] for r in records)
    assert OWNER.runtime is not None and OWNER.runtime.ondemand.accepted["trigger"] == 1


def test_every_member_follows_when_no_rank_is_named(workers: list[Any], tmp_path: Path) -> None:
    profctx.configure(save_path=str(tmp_path), on_demand=True, mode="step", ranks="all", profile_driver=False,
                      tool="recording", warmup=False)
    pray.group("actor", workers)
    request = _run_until_triggered(tmp_path, workers, "--steps", "1")
    records = _manifest.read(tmp_path)
    got = sorted((r.get("group"), r["rank"], tuple(r["steps"])) for r in records)
    assert got == [("actor", 0, (request["first"],)), ("actor", 1, (request["first"],))]


def test_an_anomaly_in_the_driver_captures_the_next_step_in_its_workers(workers: list[Any], tmp_path: Path) -> None:
    profctx.configure(save_path=str(tmp_path), mode="step", ranks="all", profile_driver=False, tool="recording",
                      warmup=False, auto_capture={"factor": 10.0, "window": 5, "max_captures": 1})
    pray.group("actor", workers)
    for step in range(1, 14):
        with profctx.profile_step(step):
            pray.fan_out([(w, "work") for w in workers])
            time.sleep(1.0 if step == 8 else 0.03)
    assert pray.flush() == [True, True]
    records = _manifest.read(tmp_path)
    assert sorted((r.get("group"), r["rank"], tuple(r["steps"])) for r in records) == [
        ("actor", 0, (9,)), ("actor", 1, (9,))]
    assert all(r["trigger"]["reason"].startswith("step 8 took ") for r in records)
