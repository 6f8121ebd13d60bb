"""verl 0.9.1's own worker groups, profiled as profctx worker groups, on a real local Ray cluster.

verl's ``RayWorkerGroup`` over a ``RayResourcePool`` builds the actors (CPU only: the pool asks
for no GPU, the group's device is ``cpu``; nothing else of verl is replaced), its generated
dispatch methods call them, and ``create_colocated_worker_cls`` puts an actor and a reference
worker in one process per rank, reached through plain functions verl generates. The driver
registers each group's actors (``wg.workers``) with ``profctx.ray.group`` and enters its steps;
the manifest tells what each worker captured. docs/migrating-from-verl.md's recipe runs here as
written.
"""

from __future__ import annotations

import gzip
import json
import logging
import os
import re
import sys
from collections import Counter
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

import profctx
from profctx import manifest

ray = pytest.importorskip("ray")
pytest.importorskip("torch")
pytest.importorskip("verl.single_controller.ray", reason="verl's worker groups need profctx's 'verl' extra")
from verl.single_controller.ray import RayClassWithInitArgs, RayResourcePool, RayWorkerGroup  # noqa: E402
from verl.single_controller.ray.base import create_colocated_worker_cls  # noqa: E402

import profctx.ray as pray  # noqa: E402 - after the skips: needs ray

from .verl_workers import ActorWorker, RefWorker, TaskRunner  # noqa: E402

pytestmark = [pytest.mark.slow, pytest.mark.ray]

DOC = Path(__file__).parents[2] / "docs" / "migrating-from-verl.md"
WINDOW = (2, 3)  # steps="2:4" of steps 1..4: step 1 before the window, step 4 after it
GROUPS = {"actor": 2, "actor_ref": 2}  # group name -> world size


@dataclass
class VerlGroups:
    """verl's worker groups built once for the module (starting actors takes tens of seconds here)."""

    pool: Any
    actor: Any  # RayWorkerGroup of ActorWorker
    colocated: Any  # RayWorkerGroup of the colocated actor+ref class
    spawned: dict[str, Any]  # colocated.spawn(...): "actor" and "ref", sharing colocated's actors


@pytest.fixture(scope="module")
def cluster() -> Iterator[Any]:
    """A 2-CPU local Ray cluster whose workers import what this process imports (verl, this folder)."""
    context = ray.init(num_cpus=2, include_dashboard=False, logging_level=logging.WARNING, log_to_driver=False,
                       runtime_env={"env_vars": {"PYTHONPATH": os.pathsep.join(sys.path)}})
    try:
        yield context
    finally:
        ray.shutdown()


@pytest.fixture(scope="module")
def verl_groups(cluster: Any) -> VerlGroups:
    """One resource pool of 2 CPU processes per group, as verl's trainer builds its groups."""
    pool = RayResourcePool([2], use_gpu=False, max_colocate_count=1)  # one CPU per bundle
    actor = RayWorkerGroup(resource_pool=pool, ray_cls_with_init=RayClassWithInitArgs(ray.remote(ActorWorker), seed=1),
                           device_name="cpu")
    class_dict = {"actor": RayClassWithInitArgs(ray.remote(ActorWorker)),
                  "ref": RayClassWithInitArgs(ray.remote(RefWorker))}
    colocated = RayWorkerGroup(resource_pool=pool, ray_cls_with_init=create_colocated_worker_cls(class_dict),
                               device_name="cpu")
    spawned = colocated.spawn(prefix_set=set(class_dict))
    assert [len(actor.workers), len(colocated.workers)] == [2, 2]
    assert len({w["pid"] for w in actor.where() + spawned["ref"].where()}) == 4  # both groups up, 4 processes
    return VerlGroups(pool, actor, colocated, spawned)


def _register(groups: VerlGroups) -> None:
    pray.group("actor", groups.actor.workers)
    pray.group("actor_ref", groups.colocated.workers)  # one group: the spawned groups share these actors


def _train(groups: VerlGroups, steps: range = range(1, 5)) -> dict[int, list[dict[str, Any]]]:
    """Run verl-style steps: several dispatch calls per step on each group; return where calls said they ran."""
    seen = {}
    for step in steps:
        with profctx.profile_step(step):
            groups.actor.prepare(8)
            groups.actor.update_actor(8)
            groups.actor.prepare(4)
            groups.spawned["actor"].prepare(8)
            groups.spawned["ref"].compute_ref_log_prob(8)
            groups.spawned["actor"].update_actor(8)
            seen[step] = groups.actor.where() + groups.spawned["ref"].where()
    assert pray.flush() == [True] * 4
    return seen


def _captures(save_path: Path) -> list[manifest.CaptureRecord]:
    return manifest.read(save_path)


def _op_names(save_path: Path, record: manifest.CaptureRecord) -> set[str]:
    (entry,) = record.files
    trace = json.loads(gzip.decompress((save_path / entry.path).read_bytes()))
    return {event.get("name", "") for event in trace["traceEvents"]}


def test_step_mode_one_capture_per_worker_per_step_covering_every_call(verl_groups: VerlGroups,
                                                                        tmp_path: Path) -> None:
    profctx.configure(steps="2:4", mode="step", ranks="all", profile_driver=False, save_path=str(tmp_path),
                      tool="torch", contents=["cpu"], warmup=False)
    _register(verl_groups)
    seen = _train(verl_groups)

    # Workers are inside the driver's step while it is in the window, and in no step outside it.
    assert {step: sorted({w["step"] for w in ws}, key=str) for step, ws in seen.items()} == {
        1: [None], 2: [2], 3: [3], 4: [None]}
    records = _captures(tmp_path)
    assert sorted((r.group, r.rank, r.world_size, r.step, r.kind, r.status) for r in records) == sorted(
        (group, rank, size, step, "step", "ok") for group, size in GROUPS.items() for rank in range(size)
        for step in WINDOW)
    # profctx's rank of each process is verl's rank of the worker in it (its position in wg.workers).
    verl_ranks = {("actor", w["pid"]): w["rank"] for w in seen[2][:2]}
    verl_ranks.update({("actor_ref", w["pid"]): w["rank"] for w in seen[2][2:]})
    assert {(r.group, r.pid): r.rank for r in records} == verl_ranks
    for record in records:
        assert f"rank{record.rank}-of-2" in record.files[0].path
        names = _op_names(tmp_path, record)
        # One capture holds every call of the step: the profiled stage and the undecorated method,
        # in the colocated group through the plain functions verl generates.
        assert {"aten::mm", "aten::cumsum"} <= names
        assert ("aten::_log_softmax" in names) == (record.group == "actor_ref")


def test_role_mode_one_capture_per_profiled_stage_per_worker_per_step(verl_groups: VerlGroups,
                                                                      tmp_path: Path) -> None:
    profctx.configure(steps="2:4", mode="role", ranks="all", profile_driver=False, save_path=str(tmp_path),
                      tool="torch", contents=["cpu"], warmup=False)
    _register(verl_groups)
    _train(verl_groups)

    records = _captures(tmp_path)
    stages = {"actor": ["actor_update"], "actor_ref": ["actor_update", "ref_compute_log_prob"]}
    expected = [(group, rank, step, role) for group, roles in stages.items() for rank in range(GROUPS[group])
                for step in WINDOW for role in roles]
    assert Counter((r.group, r.rank, r.step, r.role) for r in records) == Counter(expected)  # once each
    assert {(r.kind, r.status, r.world_size) for r in records} == {("role", "ok", 2)}
    for record in records:
        names = _op_names(tmp_path, record)
        assert "aten::cumsum" not in names  # the undecorated method is outside every stage's capture
        assert ("aten::_log_softmax" in names) == (record.role == "ref_compute_log_prob")


def test_per_group_ranks_select_the_workers(verl_groups: VerlGroups, tmp_path: Path) -> None:
    profctx.configure(steps="2:4", mode="step", ranks={"actor": [1], "actor_ref": "all"}, save_path=str(tmp_path),
                      tool="recording", warmup=False)
    _register(verl_groups)
    _train(verl_groups, range(1, 4))

    records = _captures(tmp_path)
    # The driver is in no group and the mapping does not name it: it files nothing.
    assert sorted((r.group or "(driver)", r.rank, r.step) for r in records) == [
        ("actor", 1, 2), ("actor", 1, 3), ("actor_ref", 0, 2), ("actor_ref", 0, 3), ("actor_ref", 1, 2),
        ("actor_ref", 1, 3)]


def test_registering_verl_workers_warns_about_nothing(verl_groups: VerlGroups, tmp_path: Path,
                                                      caplog: pytest.LogCaptureFixture) -> None:
    # verl's @register copies the function's attributes over @profiled (functools.wraps): the
    # methods still run profctx's wrapper, so no "arrived without profctx's wrapper" warning.
    profctx.configure(steps=[2], mode="role", ranks="all", save_path=str(tmp_path), tool="recording")
    with caplog.at_level(logging.WARNING, logger="profctx"):
        _register(verl_groups)
    assert [r.getMessage() for r in caplog.records if r.name.startswith("profctx")] == []
    assert [(m.rank, m.main) for g in pray.groups().values() for m in g.members] == [
        (0, True), (1, True), (0, True), (1, True)]


def test_a_driver_in_a_ray_actor_drives_its_groups(verl_groups: VerlGroups, tmp_path: Path) -> None:
    # verl's trainer runs in a Ray actor (main_ppo's TaskRunner): configure, registration and the
    # step blocks all happen there; here over verl's worker group attached to the module's actors.
    runner = TaskRunner.remote()  # type: ignore[attr-defined]
    try:
        seen = ray.get(runner.run.remote(verl_groups.actor.workers, str(tmp_path)), timeout=300)
    finally:
        ray.kill(runner)
    assert [[w["step"] for w in step] for step in seen] == [[None, None], [2, 2], [None, None]]
    records = _captures(tmp_path)
    assert sorted((r.group or "(driver)", r.rank, r.step, r.status) for r in records) == [
        ("(driver)", 0, 2, "ok"), ("actor", 0, 2, "ok"), ("actor", 1, 2, "ok")]
    assert {r.pid for r in records if r.group == "actor"} == {w["pid"] for w in seen[1]}


# -- the recipe of docs/migrating-from-verl.md, run as written ----------------------------------


def recipe() -> str:
    """Return the page's Python block that registers worker groups (the recipe)."""
    blocks = re.findall(r"^```python\n(.*?)^```", DOC.read_text(encoding="utf-8"), re.M | re.S)
    (block,) = [b for b in blocks if "profctx.ray.group(" in b]
    return block


def test_the_migration_recipe_runs_as_written(verl_groups: VerlGroups, tmp_path: Path,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    # What the recipe leaves to the reader: verl's resource pool, the worker classes, the device, the batch.
    namespace: dict[str, Any] = {"__name__": "__doc_snippet__", "resource_pool": verl_groups.pool,
                                 "ActorWorker": ActorWorker, "RefWorker": RefWorker, "device_name": "cpu",
                                 "batch": 8}
    try:
        exec(compile(recipe(), str(DOC), "exec"), namespace)  # running the docs is the point
    finally:
        for worker in getattr(namespace.get("wg_dict"), "workers", []):
            ray.kill(worker)
    records = _captures(tmp_path / "profiles")
    assert sorted((r.group, r.rank, r.step, r.role) for r in records if r.group is not None) == [
        ("actor_ref", rank, step, role) for rank in (0, 1) for step in (2, 3)
        for role in ("actor_update", "ref_compute_log_prob")]
