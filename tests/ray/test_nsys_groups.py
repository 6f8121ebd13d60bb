"""nsys under Ray: the ranges each worker of each group opens are the ranges profctx tells nsys to expect.

Real Ray workers in two groups run the real nsys backend, with ``cudaProfilerStart/Stop``
counted in each process (``_nsys_actors``). The count ``profctx.backends.nsys`` computes from the
plan for a (group, rank), and the one ``profctx nsys-command --ray`` prints for that group, must
equal the starts (and stops) the process made: with a larger N nsys writes nothing until exit,
with a smaller one it loses the later ranges.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

import profctx
from profctx.backends import nsys
from profctx.cli import main
from profctx.records import _manifest

ray = pytest.importorskip("ray")
pray = pytest.importorskip("profctx.ray")
from _nsys_actors import Rollout, Trainer, install  # noqa: E402 - after the skip: needs ray

pytestmark = [pytest.mark.slow, pytest.mark.ray]

#: The role paths each process enters in one step (the driver's own, and each group's methods).
ROLES = {
    "driver": ["generate_phase", "train_phase"],
    "actor": ["log_prob", "log_prob/forward", "update", "update/backward"],
    "rollout": ["generate"],
}
#: Steps the loop runs; the windows below take some of them.
LOOP = range(1, 8)


@pytest.fixture(scope="module")
def actors(ray_cluster: Any) -> dict[str, list[Any]]:
    """Two trainer actors and two rollout actors, shared by the module's tests."""
    handles = {"actor": [Trainer.remote() for _ in range(2)],  # type: ignore[attr-defined]
               "rollout": [Rollout.remote() for _ in range(2)]}  # type: ignore[attr-defined]
    ray.get([h.take_ranges.remote() for hs in handles.values() for h in hs])  # up, counters at zero
    return handles


def _run(actors: dict[str, list[Any]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
         fields: dict[str, Any]) -> tuple[dict[tuple[str, int], tuple[int, int]], int, Any]:
    """Configure, register both groups, run the loop; return the (starts, stops) per (group, rank) and the driver's."""
    driver = install(monkeypatch.setattr)
    config = profctx.configure(tool="nsys", save_path=str(tmp_path), warmup=False, exit_hooks=False,
                               ranks={"actor": [1], "rollout": "all", "driver": [0]}, **fields)
    assert config is not None
    for name, handles in actors.items():
        pray.group(name, handles)
    for step in LOOP:
        with profctx.profile_step(step):
            with profctx.profile_step(role="generate_phase"):
                pray.fan_out([(h, "generate") for h in actors["rollout"]])
            with profctx.profile_step(role="train_phase"):
                pray.fan_out([(h, "log_prob") for h in actors["actor"]])
                pray.fan_out([(h, "update") for h in actors["actor"]])
    assert all(pray.flush())
    profctx.flush()
    seen = {(name, rank): tuple(counts) for name, handles in actors.items()
            for rank, counts in enumerate(ray.get([h.take_ranges.remote() for h in handles]))}
    assert driver.starts == driver.stops
    return seen, driver.starts, config


def _cli_counts(fields: dict[str, Any], capsys: pytest.CaptureFixture[str]) -> dict[str, Any]:
    """Return ``profctx nsys-command --ray``'s entries for the same configuration."""
    argv = ["nsys-command", "--ray", "--steps", ",".join(map(str, fields["steps"])),
            "--ranks", "actor=1", "--ranks", "rollout=all"]
    if fields.get("mode"):
        argv += ["--mode", fields["mode"]]
    if fields.get("contiguous"):
        argv += ["--contiguous"]
    if fields.get("roles"):
        argv += ["--roles", ",".join(fields["roles"])]
    for name, paths in ROLES.items():
        argv += ["--step-roles", f"{name}={','.join(paths)}"]
    capsys.readouterr()
    assert main(argv) == 0
    entries: dict[str, Any] = json.loads(capsys.readouterr().out)
    return entries


@pytest.mark.parametrize(
    ("fields", "per_group"),
    [
        # one range per in-window step in every selected worker, however many calls it serves
        ({"steps": [2, 3, 5]}, {"driver": 3, "actor": 3, "rollout": 3}),
        # one range per run of consecutive window steps, held open across the driver's steps
        ({"steps": [2, 3, 5], "contiguous": True}, {"driver": 2, "actor": 2, "rollout": 2}),
        # one range per matching role capture; nested roles are NVTX ranges of it
        ({"steps": [2, 3, 5], "mode": "role"}, {"driver": 6, "actor": 6, "rollout": 3}),
        ({"steps": [2, 3, 5], "mode": "role", "roles": ["update", "generate*"]},
         {"driver": 3, "actor": 3, "rollout": 3}),
    ],
    ids=["step", "contiguous", "role", "role-filtered"],
)
def test_each_worker_opens_the_ranges_nsys_is_told_to_expect(
    actors: dict[str, list[Any]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
    capsys: pytest.CaptureFixture[str], fields: dict[str, Any], per_group: dict[str, int],
) -> None:
    seen, driver_starts, config = _run(actors, tmp_path, monkeypatch, fields)
    predicted = {(name, rank): nsys.capture_ranges(config, ROLES, group=name, rank=rank)
                 for name, rank in seen}
    assert {key: starts for key, (starts, _) in seen.items()} == predicted
    assert {key: stops for key, (_, stops) in seen.items()} == predicted
    assert predicted == {("actor", 0): 0, ("actor", 1): per_group["actor"],
                         ("rollout", 0): per_group["rollout"], ("rollout", 1): per_group["rollout"]}
    assert driver_starts == nsys.capture_ranges(config, ROLES, group=None, rank=0) == per_group["driver"]

    entries = _cli_counts(fields, capsys)
    assert {name: e["capture_ranges"] for name, e in entries.items()} == per_group
    assert entries["actor"]["ranks"] == [1] and entries["rollout"]["ranks"] == "all"
    for name in ("actor", "rollout"):
        assert entries[name]["nsight"]["capture-range"] == "cudaProfilerApi"
        assert entries[name]["nsight"]["capture-range-end"] == f"repeat:{per_group[name]}"

    # Each range is one capture record of that worker, filed under its group and rank, whose
    # sidecar names the range's number in that process: 1..N, the order nsys numbers its reports.
    records = [r for r in _manifest.read(tmp_path) if r.get("group") in ("actor", "rollout")]
    numbers: dict[tuple[str, int], list[int]] = {}
    for record in records:
        assert record["status"] == "ok"
        (sidecar,) = [tmp_path / f["path"] for f in record["files"]]
        numbers.setdefault((record["group"], record["rank"]), []).append(json.loads(sidecar.read_text())["range"])
    assert {key: sorted(n) for key, n in numbers.items()} == {
        key: list(range(1, n + 1)) for key, n in predicted.items() if n}
