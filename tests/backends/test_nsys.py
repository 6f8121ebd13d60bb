"""The nsys backend: configure-time refusal on CPU-only torch, range counts that match a real run, CLI."""

from __future__ import annotations

import json
import shlex
from pathlib import Path
from typing import Any

import pytest
import torch

import profctx
from profctx.backends import nsys
from profctx.cli import main
from profctx.core._config import ProfilerConfig
from profctx.records._manifest import read

from .doubles import cuda as cuda_double

Tree = dict[str, "Tree"]


def enter(tree: Tree) -> None:
    for name, children in tree.items():
        with profctx.profile_step(role=name):
            enter(children)


def paths(tree: Tree, prefix: str = "") -> list[str]:
    out = []
    for name, children in tree.items():
        out.append(prefix + name)
        out += paths(children, prefix + name + "/")
    return out


@pytest.mark.skipif(torch.backends.cuda.is_built(), reason="needs a CPU-only torch build")
def test_nsys_on_a_cpu_only_torch_build_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(AssertionError, match="not compiled with CUDA"):
        torch.cuda.profiler.start()  # the fact the refusal rests on (engine-apis.md §4.2)
    with pytest.raises(profctx.ConfigError) as caught:
        profctx.configure(steps=[3], tool="nsys", save_path=str(tmp_path))
    assert caught.value.field == "tool" and "CPU-only" in str(caught.value)


TREE: Tree = {"rollout": {}, "train": {"actor_update": {}, "critic_update": {}}}


@pytest.mark.parametrize(
    ("fields", "expected"),
    [
        ({"steps": [3, 4, 5]}, 3),
        ({"steps": [3, 4, 5, 9], "contiguous": True}, 2),
        ({"steps": "2:10:3"}, 3),
        ({"steps": [3, 4], "mode": "role"}, 4),  # rollout, train (its children are ranges)
        ({"steps": [3, 4], "mode": "role", "roles": ["*_update"]}, 4),  # actor_update, critic_update
        ({"steps": [3], "mode": "role", "roles": ["train/actor_update", "rollout"]}, 2),
        ({"steps": [3], "mode": "role", "roles": ["nothing"]}, 0),
    ],
)
def test_the_range_count_is_the_number_of_ranges_a_run_opens(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, fields: dict[str, Any], expected: int
) -> None:
    state = cuda_double.install_profiler(monkeypatch)
    config = ProfilerConfig(tool="nsys", save_path=str(tmp_path), exit_hooks=False, **fields)
    assert nsys.capture_ranges(config, paths(TREE)) == expected
    profctx.configure(config)
    for step in range(1, 12):
        with profctx.profile_step(step):
            enter(TREE)
    assert state.starts == state.stops == expected
    profctx.flush()
    sidecars = sorted(tmp_path.rglob("*" + nsys.SIDECAR))
    assert sorted(json.loads(p.read_text())["range"] for p in sidecars) == list(range(1, expected + 1))


def test_the_sidecar_names_steps_role_and_nvtx_ranges_and_notes_a_missing_tool(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    cuda_double.install_profiler(monkeypatch)
    profctx.configure(steps=[3], tool="nsys", mode="role", save_path=str(tmp_path), exit_hooks=False)
    with profctx.profile_step(3):
        enter(TREE)
    profctx.flush()
    records = read(tmp_path)
    assert [r["role"] for r in records] == ["rollout", "train"]
    train = records[1]
    (path,) = [tmp_path / f["path"] for f in train["files"]]
    data = json.loads(path.read_text())
    assert (data["range"], data["steps"], data["role"]) == (2, [3], "train")
    assert data["nvtx_ranges"] == ["actor_update", "critic_update"]  # the capture is the role itself
    assert any("no NVTX tool is attached" in n for n in train["notes"])  # nvtx gives a dummy domain here


def test_role_mode_without_roles_per_step_cannot_be_counted() -> None:
    config = ProfilerConfig(steps=[3], mode="role", tool="nsys")
    with pytest.raises(ValueError, match="roles_per_step"):
        nsys.capture_ranges(config)
    assert nsys.capture_ranges(config.replace(tool_options={"roles_per_step": 3})) == 3


def test_command_line_and_ray_options() -> None:
    config = ProfilerConfig(steps="3:6", tool="nsys", save_path="/runs/a", contents=["cuda", "memory"],
                            tool_options={"nsys_options": {"t": "cuda,nvtx,cublas", "cuda-graph-trace": "graph"}})
    argv = nsys.nsys_command(config, ["python", "train.py"])
    assert argv[:2] == ["nsys", "profile"] and argv[-2:] == ["python", "train.py"]
    assert "--capture-range=cudaProfilerApi" in argv
    assert "--capture-range-end=repeat:3" in argv
    assert "--trace=cuda,nvtx,cublas" in argv and "--cuda-memory-usage=true" in argv
    assert "--output=/runs/a/nsys/%h_%p" in argv
    ray = nsys.ray_nsight(config)
    assert ray["capture-range"] == "cudaProfilerApi" and ray["capture-range-end"] == "repeat:3"
    assert ray["o"] == "'profctx_%h_%p'" and "output" not in ray


@pytest.mark.parametrize(
    ("options", "field"),
    [
        ({"nsys_options": {"capture-range-end": "stop"}}, "tool_options.nsys_options.capture-range-end"),
        ({"nsys_options": {"-c": "nvtx"}}, "tool_options.nsys_options.c"),
        ({"nsys_options": ["trace"]}, "tool_options.nsys_options"),
        ({"roles_per_step": -1}, "tool_options.roles_per_step"),
        ({"repeat": 3}, "tool_options.repeat"),
    ],
)
def test_bad_nsys_options_are_refused_at_configure_time(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, options: dict[str, Any], field: str
) -> None:
    cuda_double.install_profiler(monkeypatch)
    with pytest.raises(profctx.ConfigError) as caught:
        profctx.configure(steps=[3], tool="nsys", save_path=str(tmp_path), tool_options=options)
    assert caught.value.field == field


def test_contents_nsys_cannot_record_are_refused(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    cuda_double.install_profiler(monkeypatch)
    with pytest.raises(profctx.ConfigError, match="nsys backend records"):
        profctx.configure(steps=[3], tool="nsys", save_path=str(tmp_path), contents=["shapes"])


def test_cli_prints_the_command_and_the_ray_options(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    code = main(["nsys-command", "--steps", "3:6", "--mode", "role", "--step-roles", "rollout,train,train/update",
                 "--save-path", str(tmp_path), "--", "python", "train.py", "--lr", "1"])
    out, err = capsys.readouterr()
    assert code == 0
    argv = shlex.split(out)
    assert "--capture-range-end=repeat:6" in argv and argv[-4:] == ["python", "train.py", "--lr", "1"]
    assert "6 capture range(s)" in err
    assert main(["nsys-command", "--steps", "1,2,5", "--contiguous", "--ray"]) == 0
    entries = json.loads(capsys.readouterr().out)
    assert entries["*"]["nsight"]["capture-range-end"] == "repeat:2"  # every worker group: no groups configured
    assert entries["driver"]["capture_ranges"] == 2 and "repeat:2" in entries["driver"]["command"]


def test_cli_usage_errors_exit_2(capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["nsys-command", "--steps", "3:6", "--mode", "role"]) == 2
    assert "roles_per_step" in capsys.readouterr().err
    assert main(["nsys-command"]) == 2
    assert main(["nsys-command", "--steps", "3:"]) == 2


# -- per worker group (profctx.ray.group): selection, roles and contents of each group ---------------

GROUP_ROLES = {"driver": ["train"], "actor": ["log_prob", "update", "update/backward"], "rollout": ["generate"]}


def test_a_process_the_config_does_not_select_opens_no_range() -> None:
    config = ProfilerConfig(steps=[3, 4], tool="nsys", ranks={"actor": [1], "rollout": "all"}, profile_driver=False)
    assert nsys.capture_ranges(config, group="actor", rank=1) == 2
    assert nsys.capture_ranges(config, group="actor", rank=0) == 0
    assert nsys.capture_ranges(config, group="rollout", rank=7) == 2
    assert nsys.capture_ranges(config, group="critic", rank=0) == 0  # groups named: the others profile nothing
    assert nsys.capture_ranges(config, group=None, rank=0) == 0  # profile_driver=False
    assert nsys.capture_ranges(config) == 2  # no rank given: a selected process


def test_role_mode_counts_each_groups_own_roles() -> None:
    config = ProfilerConfig(steps="3:6", tool="nsys", mode="role",
                            ranks={"actor": "all", "rollout": "all", "driver": [0]})
    assert nsys.capture_ranges(config, GROUP_ROLES, group="actor", rank=0) == 6  # backward: a range of update
    assert nsys.capture_ranges(config, GROUP_ROLES, group="rollout", rank=0) == 3
    assert nsys.capture_ranges(config, GROUP_ROLES, group=None, rank=0) == 3
    assert nsys.capture_ranges(config, {"*": 2}, group="rollout") == 6  # '*': any group not named
    with pytest.raises(ValueError, match="no entry for 'critic'"):
        nsys.capture_ranges(config, {"actor": 2}, group="critic")
    from_options = config.replace(tool_options={"roles_per_step": {"actor": ["log_prob", "update"], "driver": 0}})
    assert nsys.capture_ranges(from_options, group="actor") == 6
    assert nsys.capture_ranges(from_options, group=None) == 0


def test_group_ranges_lists_the_driver_and_each_group_with_its_ranks_count_and_options() -> None:
    config = ProfilerConfig(steps=[1, 2, 3, 7], tool="nsys", contiguous=True, contents=["cpu", "cuda"],
                            groups={"actor": {"ranks": [0, 1], "contents": ["cuda", "memory"]},
                                    "rollout": {"ranks": "all"}}, profile_driver=True)
    rows = {row.group: row for row in nsys.group_ranges(config, groups=["critic"])}
    assert list(rows) == ["driver", "actor", "rollout", "critic"]
    assert [(r.ranks, r.ranges) for r in rows.values()] == [((0,), 2), ((0, 1), 2), ("all", 2), ((), 0)]
    actor = rows["actor"].nsight()
    assert actor is not None and actor["capture-range-end"] == "repeat:2"
    assert actor["trace"] == "cuda,nvtx" and actor["cuda-memory-usage"] == "true"  # the group's contents
    assert actor["o"] == "'profctx_actor_%h_%p'"
    assert rows["driver"].options is not None and rows["driver"].options["trace"] == "cuda,nvtx,osrt"
    assert rows["critic"].nsight() is None and not rows["critic"].selects(0)
    assert rows["actor"].selects(1) and not rows["actor"].selects(2) and rows["rollout"].selects(9)
    assert nsys.ray_nsight(config, group="actor") == actor
    without_groups = {row.group: row.ranks for row in nsys.group_ranges(config.replace(groups={}))}
    assert without_groups == {"driver": (0,), "*": (0,)}  # every group takes ranks=[0]


def test_group_roles_and_contents_nsys_cannot_use_are_refused(monkeypatch: pytest.MonkeyPatch,
                                                              tmp_path: Path) -> None:
    cuda_double.install_profiler(monkeypatch)
    with pytest.raises(profctx.ConfigError) as caught:
        profctx.configure(steps=[3], tool="nsys", save_path=str(tmp_path),
                          tool_options={"roles_per_step": {"actor": -1}})
    assert caught.value.field == "tool_options.roles_per_step.actor"
    with pytest.raises(profctx.ConfigError) as caught:
        profctx.configure(steps=[3], tool="nsys", save_path=str(tmp_path), contents={"actor": ["shapes"]},
                          ranks={"actor": [0]})
    assert caught.value.field == "groups.actor.contents"


def test_cli_ray_prints_one_line_per_group_with_its_ranks_and_ranges(
    capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    config = tmp_path / "profctx.yaml"
    config.write_text("steps: '3:6'\nmode: role\nranks: {actor: [0, 1], rollout: all, driver: [0]}\n")
    code = main(["nsys-command", "--config", str(config), "--ray", "--group", "critic",
                 "--step-roles", "actor=log_prob,update,update/backward", "--step-roles", "rollout=generate",
                 "--step-roles", "driver=", "--", "python", "train.py"])
    out, err = capsys.readouterr()
    assert code == 0, err
    lines = out.splitlines()
    assert lines[0] == "{" and lines[-1] == "}" and len(lines) == 6  # one line per row
    entries = json.loads(out)
    assert {name: (e["ranks"], e["capture_ranges"]) for name, e in entries.items()} == {
        "driver": ([], 0), "actor": ([0, 1], 6), "rollout": ("all", 3), "critic": ([], 0)}
    assert entries["actor"]["nsight"]["capture-range-end"] == "repeat:6"
    assert entries["critic"]["nsight"] is None and entries["driver"]["command"] is None
    assert "# actor: ranks [0, 1], 6 capture range(s) each" in err
    assert "# critic: no capture range (not profiled)" in err
    # --ranks GROUP=R overrides one group's ranks and keeps the others'
    assert main(["nsys-command", "--config", str(config), "--ray", "--ranks", "actor=1", "--roles-per-step", "2"]) == 0
    entries = json.loads(capsys.readouterr().out)
    assert (entries["actor"]["ranks"], entries["rollout"]["ranks"]) == ([1], "all")
    assert entries["driver"]["capture_ranges"] == entries["actor"]["capture_ranges"] == 6


def test_cli_ray_names_the_group_whose_roles_are_missing(capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["nsys-command", "--steps", "3:6", "--mode", "role", "--ranks", "actor=all", "--ray",
                 "--step-roles", "actor=update"])
    assert code == 2 and "no entry for 'driver'" in capsys.readouterr().err
    assert main(["nsys-command", "--steps", "3:6", "--ranks", "0", "--ranks", "1", "--ray"]) == 2
    assert main(["nsys-command", "--steps", "3:6", "--ranks", "actor=x", "--ray"]) == 2


@pytest.mark.parametrize("extra", [{"on_demand": True}, {"auto_capture": True}])
def test_on_demand_and_anomaly_captures_make_nsys_repeat_without_a_limit(extra: dict[str, Any]) -> None:
    # No config can count the ranges a request or an anomaly opens: with repeat:N the later ones were lost.
    for steps, mode in (("3:6", "step"), ("3:6", "role"), ([], "step"), ([], "role")):
        config = ProfilerConfig(steps=steps, mode=mode, tool="nsys", save_path="/runs/a", **extra)
        argv = nsys.nsys_command(config, ["python", "train.py"])
        assert "--capture-range-end=repeat" in argv, (steps, mode)
        (row,) = nsys.group_ranges(config)[:1]
        assert row.selects(0) and row.nsight() is not None
    plain = ProfilerConfig(steps="3:6", tool="nsys", save_path="/runs/a")
    assert "--capture-range-end=repeat:3" in nsys.nsys_command(plain)


def test_cli_says_on_demand_ranges_are_not_counted(capsys: pytest.CaptureFixture[str],
                                                   monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROFCTX_ON_DEMAND", "1")
    assert main(["nsys-command", "--steps", "3:6", "--", "python", "train.py"]) == 0
    out, err = capsys.readouterr()
    assert "--capture-range-end=repeat" in shlex.split(out)
    assert "on-demand" in err and "without a limit" in err
