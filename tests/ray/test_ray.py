"""Worker groups on a real local Ray cluster: the driver drives its workers' steps; failures; import orders."""

from __future__ import annotations

import asyncio
import json
import os
import subprocess
import sys
import textwrap
from collections import Counter
from pathlib import Path
from typing import Any

import pytest

import profctx
from profctx.cli import main
from profctx.records import _manifest

ray = pytest.importorskip("ray")
pray = pytest.importorskip("profctx.ray")
from _actors import Plain, PlainAsync, Worker, where  # noqa: E402 - after the skip: needs ray

pytestmark = pytest.mark.slow


def _configure(save_path: Path, **fields: Any) -> None:
    base: dict[str, Any] = dict(steps="2:4", mode="role", ranks="all", save_path=str(save_path), tool="recording",
                                warmup=False)
    base.update(fields)
    profctx.configure(**base)


def _remote(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [r for r in records if r.get("group") is not None]


@pytest.fixture(scope="module")
def sync_workers(ray_cluster: Any) -> list[Any]:
    """Two plain (sync) actors made remote by the driver, shared by the module's tests."""
    return [ray.remote(num_cpus=0)(Plain).remote() for _ in range(2)]


@pytest.fixture(autouse=True)
def _fresh() -> Any:
    yield
    profctx.reset()


def test_members_join_with_the_drivers_config_and_their_group_identity(sync_workers: list[Any],
                                                                       tmp_path: Path) -> None:
    _configure(tmp_path, run_id="run-groups")
    grp = pray.group("actor", sync_workers)
    assert [m.rank for m in grp.members] == [0, 1] and grp.world_size == 2
    assert all(m.main for m in grp.members)  # Ray runs a sync actor's calls on its main thread
    seen = [ray.get(w.__ray_call__.remote(where)) for w in sync_workers]
    assert [(s["group"], s["rank"], s["world_size"], s["run_id"]) for s in seen] == [
        ("actor", 0, 2, "run-groups"), ("actor", 1, 2, "run-groups")]
    assert [s["step"] for s in seen] == [None, None]  # no step held outside the driver's steps
    for step in (1, 2, 5):
        with profctx.profile_step(step, role="train"):
            out = pray.fan_out([(w, "work") for w in sync_workers], kwargs={"user": 1})
            plain = ray.get(sync_workers[0].undecorated.remote())
        held = step in (2, 3)
        # The worker knows the step only while its driver is in an in-window step; its roles are its own.
        assert [(o["step"], o["path"], o["kwargs"]) for o in out] == [
            (step if held else None, "plain_work" if held else "", ["user"])] * 2
        assert plain["step"] == (step if held else None)
    assert pray.flush() == [True, True]
    records = _remote(_manifest.read(tmp_path))
    assert sorted((r["group"], r["rank"], r["world_size"], r["step"], r["role"]) for r in records) == [
        ("actor", 0, 2, 2, "plain_work"), ("actor", 1, 2, 2, "plain_work")]
    assert {r["run"] for r in records} == {"run-groups"}
    assert all("actor-rank" in r["files"][0]["path"] for r in records)  # file names carry the group


def _spy_control(monkeypatch: pytest.MonkeyPatch) -> Counter[str]:
    calls: Counter[str] = Counter()
    original = pray.Driver._refs

    def counting(self: Any, fn: Any, step: int) -> tuple[list[Any], list[Any]]:
        now, later = original(self, fn, step)
        calls[fn.__name__] += len(now) + len(later)
        return now, later

    monkeypatch.setattr(pray.Driver, "_refs", counting)
    return calls


@pytest.mark.parametrize("contiguous", [False, True])
def test_step_mode_is_one_capture_per_worker_per_step_whatever_it_serves(
        sync_workers: list[Any], tmp_path: Path, monkeypatch: pytest.MonkeyPatch, contiguous: bool) -> None:
    calls = _spy_control(monkeypatch)
    _configure(tmp_path, mode="step", contiguous=contiguous, profile_driver=False)
    pray.group("actor", sync_workers)
    for step in range(1, 6):
        with profctx.profile_step(step):
            for _ in range(3):  # several calls per step, decorated or not
                pray.fan_out([(w, "work") for w in sync_workers])
                ray.get([w.undecorated.remote() for w in sync_workers])
    pray.flush()
    records = _manifest.read(tmp_path)
    assert not [r for r in records if r.get("group") is None]  # profile_driver=False: the driver files nothing
    got = sorted((r["rank"], tuple(r["steps"]), r["kind"], r["status"]) for r in _remote(records))
    if contiguous:
        assert got == [(0, (2, 3), "step", "ok"), (1, (2, 3), "step", "ok")]
    else:
        assert got == [(0, (2,), "step", "ok"), (0, (3,), "step", "ok"), (1, (2,), "step", "ok"),
                       (1, (3,), "step", "ok")]
    # Two in-window steps x two workers, entered and left; out of the window no control call at all.
    assert calls == {"step_enter": 4, "step_exit": 4}


def test_a_driver_reset_inside_a_step_makes_its_workers_leave_it(sync_workers: list[Any], tmp_path: Path) -> None:
    _configure(tmp_path, mode="step", profile_driver=False)
    pray.group("actor", sync_workers)
    with profctx.profile_step(2):
        ray.get([w.undecorated.remote() for w in sync_workers])
        assert [ray.get(w.__ray_call__.remote(where))["step"] for w in sync_workers] == [2, 2]
        profctx.reset()  # e.g. an error handler that resets profiling while the step is still open
        # The workers left the step: no capture keeps recording until their processes end.
        assert [ray.get(w.__ray_call__.remote(where))["step"] for w in sync_workers] == [None, None]
    assert [ray.get(w.__ray_call__.remote(_flushed)) for w in sync_workers] == [True, True]
    got = sorted((r["rank"], tuple(r["steps"]), r["status"]) for r in _remote(_manifest.read(tmp_path)))
    assert got == [(0, (2,), "ok"), (1, (2,), "ok")]


def _flushed(actor: Any) -> bool:
    return profctx.flush(60)


def test_ranks_contents_and_the_driver_are_chosen_per_group(ray_cluster: Any, tmp_path: Path) -> None:
    actors = [ray.remote(num_cpus=0)(Plain).remote() for _ in range(2)]
    rollout = [ray.remote(num_cpus=0)(PlainAsync).remote()]
    _configure(tmp_path, mode="step", ranks={"actor": [1], "rollout": "all"}, contents={"actor": ["cpu", "shapes"]},
               profile_driver=False)
    pray.group("actor", actors)
    grp = pray.group("rollout", rollout)
    assert [m.main for m in grp.members] == [False]  # an async actor: control calls run off its main thread
    with profctx.profile_step(2):
        pray.fan_out([(a, "work") for a in actors])
        pray.fan_out([(r, "work") for r in rollout])
    pray.flush()
    records = _manifest.read(tmp_path)
    assert sorted((r.get("group"), r["rank"], r["step"]) for r in records) == [("actor", 1, 2), ("rollout", 0, 2)]
    for actor in (*actors, *rollout):
        ray.kill(actor)


def test_a_worker_that_configured_itself_keeps_its_config(ray_cluster: Any, tmp_path: Path) -> None:
    own = tmp_path / "own"
    worker = ray.remote(num_cpus=0)(Plain).remote()
    ray.get(worker.__ray_call__.remote(_configure_here, str(own)))
    _configure(tmp_path / "driver")
    pray.group("actor", [worker])
    with profctx.profile_step(2):
        out = ray.get(worker.work.remote())
    assert (out["step"], out["path"], out["group"]) == (2, "plain_work", None)  # still its own identity
    pray.flush()
    assert [r["role"] for r in _manifest.read(own)] == ["plain_work"]
    ray.kill(worker)


def _configure_here(actor: Any, save_path: str, **fields: Any) -> None:
    profctx.configure(steps=[2], mode="role", ranks="all", save_path=save_path, tool="recording", warmup=False,
                      **fields)


def test_two_processes_claiming_one_group_rank_are_warned_about_once(
        ray_cluster: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    own, other = (ray.remote(num_cpus=0)(Plain).remote() for _ in range(2))
    ray.get(own.__ray_call__.remote(_configure_here, str(tmp_path), group="actor", rank=0, world_size=2))
    _configure(tmp_path)
    with caplog.at_level("WARNING", logger="profctx"):
        # `own` files as actor rank 0 by its own config; reading the members waits for the joins (and the warning)
        assert pray.group("actor", [other, own], ranks=[0, 1]).members
    warned = [r.getMessage() for r in caplog.records if "claim worker group 'actor' rank 0" in r.getMessage()]
    assert len(warned) == 1
    for actor in (own, other):
        ray.kill(actor)


def test_async_drivers_await_the_control_calls(sync_workers: list[Any], tmp_path: Path) -> None:
    _configure(tmp_path)
    pray.group("actor", sync_workers)

    async def main() -> list[Any]:
        with pytest.raises(RuntimeError, match="fan_out_async"):
            pray.fan_out([(w, "work") for w in sync_workers])  # a blocking ray.get has no place in a loop
        async with profctx.profile_step(2):
            return await pray.fan_out_async([w.work for w in sync_workers])

    out = asyncio.run(main())
    assert [(o["step"], o["path"], o["rank"]) for o in out] == [(2, "plain_work", 0), (2, "plain_work", 1)]


def test_failures_carry_the_actors_message_and_role_and_only_in_window(ray_cluster: Any, tmp_path: Path) -> None:
    ok, raising, dying = (Worker.remote(b) for b in ("ok", "raise", "die"))  # type: ignore[attr-defined]
    _configure(tmp_path)
    pray.group("actor", [ok, raising, dying])
    # Out of the window: nothing recorded, the error passes through.
    with profctx.profile_step(1), pytest.raises(ValueError, match="boom from the worker"):
        pray.fan_out([(raising, "work")])
    with profctx.profile_step(2, role="train"), pytest.raises(ValueError, match="boom from the worker") as info:
        pray.fan_out([(ok, "work"), (raising, "work"), (dying, "work")], (0.3,))
    assert isinstance(info.value, ray.exceptions.RayTaskError)  # what ray.get raises, unchanged
    assert pray.flush([ok, raising, dying]) == [True, True, False]
    failed = sorted((r["kind"], r.get("group") or "", r.get("rank"), r.get("target_rank"), r["role"], r["error"],
                     r["reason"]) for r in _manifest.read(tmp_path) if r["status"] == "failed")
    assert failed == [
        ("remote", "", 0, 2, "train/work", "ActorDiedError: The actor died unexpectedly before finishing this task.",
         "the actor running work died"),
        ("remote", "actor", 1, None, "work", "ValueError: boom from the worker", "the call work raised"),
    ]
    assert not any("\x1b[" in r.get("error", "") for r in _manifest.read(tmp_path) if r.get("error"))


DRIVER = textwrap.dedent("""
    import json, os, sys
    {imports}

    @ray.remote(num_cpus=0)
    class InMain:
        @profctx.profiled(role="main_work")
        def work(self, **kwargs):
            scope = profctx.current()
            return [scope.step, scope.path, sorted(kwargs)]

    @ray.remote(num_cpus=0, max_concurrency=4)
    class Threaded:
        @profctx.profiled(role="threaded_work")
        def work(self, **kwargs):
            scope = profctx.current()
            return [scope.step, scope.path, sorted(kwargs)]

    if __name__ == "__main__":
        ray.init(address=sys.argv[2], logging_level="WARNING", log_to_driver=False,
                 runtime_env={{"env_vars": {{"PYTHONPATH": os.environ["PYTHONPATH"]}}}})
        profctx.configure(steps=[3], mode=sys.argv[3], ranks="all", save_path=sys.argv[1], tool="recording",
                          warmup=False)
        import _actors
        kinds = {{
            "main": InMain.remote(),
            "threaded": Threaded.remote(),
            "remote_by_driver": ray.remote(num_cpus=0)(_actors.Plain).remote(),
            "async_by_driver": ray.remote(num_cpus=0)(_actors.PlainAsync).remote(),
            "options": ray.remote(_actors.Plain).options(num_cpus=0, name="opt", max_concurrency=2).remote(),
        }}
        for name, actor in kinds.items():
            profctx.ray.group(name, [actor])
        out = {{}}
        for step in (2, 3):
            with profctx.profile_step(step):
                for name, actor in kinds.items():
                    got = ray.get(actor.work.options(name="call-" + name).remote(extra=1))
                    got = [got["step"], got["path"], got["kwargs"]] if isinstance(got, dict) else got
                    out[f"{{name}}:{{step}}"] = got
        profctx.ray.flush()
        print(json.dumps(out))
""")

IMPORTS = {
    "ray-first": "import ray\nimport profctx, profctx.ray",
    "profctx-first": "import profctx, profctx.ray\nimport ray",
    "user-module-first": "import _actors\nimport profctx\nimport ray\nimport profctx.ray",
}


@pytest.mark.parametrize("mode", ["role", "step"])
@pytest.mark.parametrize("order", list(IMPORTS))
def test_every_import_order_class_location_and_actor_kind(ray_cluster: Any, tmp_path: Path, order: str,
                                                          mode: str) -> None:
    if mode == "step" and order != "ray-first":
        pytest.skip("step mode does not depend on decorators: one import order is enough")
    script = tmp_path / "driver.py"
    script.write_text(DRIVER.format(imports=IMPORTS[order]))
    save = tmp_path / "out"
    here = str(Path(__file__).parent)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([here, *sys.path])}
    done = subprocess.run([sys.executable, str(script), str(save), ray_cluster.address_info["gcs_address"], mode],
                          capture_output=True, text=True, timeout=180, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.strip().splitlines()[-1])
    roles = {"main": "main_work", "threaded": "threaded_work", "remote_by_driver": "plain_work",
             "async_by_driver": "async_work", "options": "plain_work"}
    for name, role in roles.items():
        assert out[f"{name}:2"] == [None, "", ["extra"]]  # out of window: no step, no role, the user's kwargs only
        assert out[f"{name}:3"] == [3, role, ["extra"]]  # step mode: the role is a range of the step capture
    records = [r for r in _manifest.read(save) if r.get("group") is not None]
    if mode == "role":
        assert sorted((r["group"], r["role"], r["step"], r["status"]) for r in records) == sorted(
            (name, role, 3, "ok") for name, role in roles.items())
    else:
        assert sorted((r["group"], r["kind"], r["steps"], r["status"]) for r in records) == sorted(
            (name, "step", [3], "ok") for name in roles)
    assert "arrived without profctx's wrapper" not in done.stderr


def test_workers_without_the_drivers_file_system_send_their_files_at_step_end(
        ray_cluster: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr(pray._driver, "CHUNK", 512)  # many chunks per trace: the copy is appended piece by piece
    elsewhere = tmp_path / "worker-disk"  # the worker's own save root (PROFCTX_SAVE_PATH wins over the carried one)
    worker = ray.remote(num_cpus=0)(Plain).options(
        runtime_env={"env_vars": {"PROFCTX_SAVE_PATH": str(elsewhere)}}).remote()
    driver_root = tmp_path / "driver"
    _configure(driver_root, mode="step", tool="torch", contents=["cpu", "shapes"], compress=False, profile_driver=False)
    (member,) = pray.group("actor", [worker]).members
    assert member.collect  # it writes under another folder: the driver copies its files
    with profctx.profile_step(2):
        for _ in range(20):
            ray.get(worker.work.remote())
    # At the end of the step, before any flush, the trace and its record are in the driver's folder.
    (record,) = [r for r in _manifest.read(driver_root) if r.get("group") == "actor"]
    assert record["status"] == "ok" and record["steps"] == [2]
    (entry,) = record["files"]
    copy, original = driver_root / entry["path"], elsewhere / entry["path"]
    assert copy.stat().st_size > 3 * 512
    assert copy.read_bytes() == original.read_bytes()
    with profctx.profile_step(3):
        ray.get(worker.work.remote())
    assert pray.flush() == [True]
    steps = sorted(r["steps"][0] for r in _manifest.read(driver_root) if r.get("group") == "actor")
    assert steps == [2, 3]
    shards = sorted(p.name for p in (driver_root / ".profctx").glob("*.jsonl"))
    assert shards == sorted(p.name for p in (elsewhere / ".profctx").glob("*.jsonl"))
    # A merged trace names the worker by its actor class, not by the control call that started its capture.
    assert main(["merge", str(driver_root), "-o", str(tmp_path / "merged.json")]) == 0
    names = [e["args"]["name"] for e in json.loads((tmp_path / "merged.json").read_text())["traceEvents"]
             if e.get("ph") == "M" and e.get("name") == "process_name"]
    assert any("ray::Plain" in n for n in names) and not any("__ray_call__" in n for n in names), names
    # The shards' listing indexes come too (profctx ls reads them instead of parsing every line).
    indexes = sorted((elsewhere / ".profctx").glob("*.jsonl.index"))
    assert indexes and [(driver_root / ".profctx" / p.name).read_bytes() for p in indexes] == [
        p.read_bytes() for p in indexes]
    # So do its step timelines: the driver's `profctx timeline` shows the worker's steps beside its own.
    timelines = sorted((elsewhere / ".profctx").glob("*.timeline"))
    assert timelines and [(driver_root / ".profctx" / p.name).read_bytes() for p in timelines] == [
        p.read_bytes() for p in timelines]
    capsys.readouterr()
    assert main(["timeline", str(driver_root), "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert {p["name"]: p["steps"] for p in shown["processes"]}["actor/rank0"] == 2  # steps 2 and 3
    ray.kill(worker)


def test_group_arguments_are_checked_and_a_process_keeps_its_first_identity(
        sync_workers: list[Any], tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    _configure(tmp_path)
    with pytest.raises(ValueError, match="no actors"):
        pray.group("actor", [])
    with pytest.raises(ValueError, match="reserved"):
        pray.group("driver", sync_workers)
    with pytest.raises(TypeError, match="not a Ray actor handle"):
        pray.group("actor", [object()])
    with pytest.raises(ValueError, match="one distinct rank per actor"):
        pray.group("actor", sync_workers, ranks=[0, 0])
    pray.group("actor", sync_workers)
    with pytest.raises(ValueError, match="already registered"):
        pray.group("actor", sync_workers)
    with caplog.at_level("WARNING", logger="profctx"):
        pray.group("actor-again", sync_workers[:1])
        pray.group("actor-again2", sync_workers[1:], ranks=[0])
    # The same process was already rank 0 / 1 of "actor": a second identity is refused (its first sticks).
    seen = [ray.get(w.__ray_call__.remote(where)) for w in sync_workers]
    assert [(s["group"], s["rank"]) for s in seen] == [("actor", 0), ("actor", 1)]


def test_a_method_that_lost_its_wrapper_is_named(ray_cluster: Any) -> None:
    from profctx.ray import _worker

    def bare(self: Any) -> None: ...

    bare.__profctx_role__ = "lost"  # type: ignore[attr-defined]

    class Copied:
        lost = bare

        @profctx.profiled(role="kept")
        def kept(self) -> None: ...

    assert _worker._undecorated(Copied) == ["lost"]
