"""Configuration: sources, precedence, environment, and errors that name field, value and what is allowed."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import pytest

import profctx
from profctx import ConfigError, ProfilerConfig, StepWindow
from profctx.core._config import from_environment


def test_keywords_build_a_normalised_config(tmp_path: Path) -> None:
    config = profctx.configure(steps="3:5", mode="role", ranks=[1, 0, 1], roles="actor_*", save_path=tmp_path)
    assert config is not None
    assert config.steps == StepWindow.parse([3, 4])
    assert config.ranks == (0, 1)
    assert config.roles == ("actor_*",)
    assert config.save_path == str(tmp_path)
    assert profctx.is_configured() and profctx.get_config() == config


@pytest.mark.parametrize("source", [None, {"profctx": None}])
def test_absent_or_none_config_means_disabled(source: object) -> None:
    config = profctx.configure(source)
    assert config is None or not config.active
    with profctx.profile_step(1):
        assert profctx.current().step == 1


def test_yaml_file_and_nested_key(tmp_path: Path) -> None:
    path = tmp_path / "profile.yaml"
    path.write_text("profctx:\n  steps: [2, 3]\n  mode: role\n  engines:\n    roles: [gen]\n    count: 4\n")
    config = profctx.configure(path)
    assert config is not None and config.steps == StepWindow.parse([2, 3])
    assert config.engines.roles == ("gen",) and config.engines.count == 4
    empty = tmp_path / "empty.yaml"
    empty.write_text("")
    assert profctx.configure(str(empty)) is not None
    assert not profctx.get_config().active  # type: ignore[union-attr]


def test_omegaconf_dictconfig() -> None:
    omegaconf = pytest.importorskip("omegaconf")
    cfg = omegaconf.OmegaConf.create({"steps": "1:3", "ranks": "all", "save_path": "${oc.env:HOME}/profiles"})
    config = profctx.configure(cfg)
    assert config is not None and config.ranks == "all" and config.steps == StepWindow.parse([1, 2])
    assert not config.save_path.startswith("$")


def test_precedence_source_keywords_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("PROFCTX_STEPS", "7,9")
    monkeypatch.setenv("PROFCTX_RANKS", "all")
    monkeypatch.setenv("PROFCTX_ROLES", "rollout, actor_*")
    config = profctx.configure({"steps": [1], "mode": "role", "save_path": str(tmp_path)}, mode="step")
    assert config is not None
    assert config.steps == StepWindow.parse([7, 9])  # env beats the mapping
    assert config.mode == "step"  # keyword beats the mapping
    assert config.ranks == "all" and config.roles == ("rollout", "actor_*")


def test_env_alone_configures(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROFCTX_STEPS", "1:2")
    monkeypatch.setenv("PROFCTX_TOOL", "noop")
    config = profctx.configure()
    assert config is not None and config.tool == "noop" and config.steps == StepWindow.parse([1])
    monkeypatch.setenv("PROFCTX_ENABLE", "off")
    config = profctx.configure()
    assert config is not None and not config.active


@pytest.mark.parametrize(
    ("env", "value", "needle"),
    [
        ("PROFCTX_ENABLE", "maybe", "PROFCTX_ENABLE: 'maybe'"),
        ("PROFCTX_RANKS", "0,x", "PROFCTX_RANKS: '0,x'"),
        ("PROFCTX_STEPS", "5:", "PROFCTX_STEPS: '5:' is not valid; an unbounded window"),
        ("PROFCTX_STEPS", "3:6:0", "PROFCTX_STEPS: '3:6:0'"),
        ("PROFCTX_MODE", "phase", "PROFCTX_MODE: 'phase' is not valid; allowed: 'step', 'role'"),
        ("PROFCTX_TOOL", "perf", "PROFCTX_TOOL: 'perf' is not valid; allowed: 'auto'"),
        ("PROFCTX_ROLES", "actor,,rollout", "PROFCTX_ROLES: 'actor,,rollout' is not valid; role names"),
        ("PROFCTX_SAVE_PATH", "/proc/profiles", "PROFCTX_SAVE_PATH: '/proc/profiles'"),
        ("PROFCTX_RUN_ID", "a/b", "PROFCTX_RUN_ID: 'a/b'"),
    ],
)
def test_bad_env_values_name_the_variable(monkeypatch: pytest.MonkeyPatch, env: str, value: str, needle: str) -> None:
    monkeypatch.setenv(env, value)
    if env != "PROFCTX_STEPS":
        monkeypatch.setenv("PROFCTX_STEPS", "1")
    with pytest.raises(ConfigError) as info:
        profctx.configure()
    assert needle in str(info.value)


@pytest.mark.parametrize(
    ("fields", "needle"),
    [
        ({"steps": "1:2", "mode": "phase"}, "mode: 'phase' is not valid; allowed: 'step', 'role'"),
        ({"steps": "1:2", "tool": "perf"}, "tool: 'perf' is not valid; allowed: 'auto', 'torch'"),
        ({"steps": "1:2", "contents": ["cpu", "gpu"]}, "contents: 'gpu' is not valid; allowed: 'cpu'"),
        ({"steps": "1:2", "ranks": [-1]}, "ranks: [-1] is not valid"),
        ({"steps": "1:2", "ranks": []}, "non-empty list"),
        ({"steps": "1:2", "stepz": 3}, "stepz: 3 is not valid; did you mean 'steps'?"),
        ({"steps": "1:2", "contiguous": True, "mode": "role"}, "contiguous: True is not valid; contiguous captures"),
        ({"steps": "1:2", "on_error": "ignore"}, "on_error: 'ignore'"),
        ({"steps": "1:2", "rank": 3, "world_size": 2}, "rank: 3 is not valid; a rank below world_size 2"),
        ({"steps": "1:2", "run_id": "a/b"}, "run_id: 'a/b'"),
        ({"steps": "1:2", "save_path": ""}, "save_path: ''"),
        ({"steps": "1:2", "engines": {"by_stage": True}}, "engines.by_stage: True is not valid; by_stage needs"),
        ({"steps": "1:2", "engines": {"count": 0}}, "engines.count: 0"),
        ({"steps": "1:2", "engines": {"rolez": ["x"]}}, "engines.rolez"),
        ({"steps": "1:2", "engines": {"contents": ["flops"]}}, "engines.contents: 'flops'"),
        ({"steps": "1:2", "tool_options": {"compress_level": 11}}, "tool_options.compress_level: 11"),
        ({"steps": "1:2", "tool_options": {"level": 1}}, "tool_options.level: 1"),
        ({}, "steps: None is not valid; profiling is enabled, so give the steps"),
        ({"steps": "3:"}, "steps: '3:' is not valid; an unbounded window never stops"),
    ],
)
def test_config_errors(fields: dict[str, object], needle: str) -> None:
    with pytest.raises(ConfigError) as info:
        profctx.configure(fields)
    assert needle in str(info.value)
    assert isinstance(info.value, ValueError)
    assert not profctx.is_configured()


def test_config_round_trips_through_a_dict() -> None:
    config = ProfilerConfig(steps=StepWindow.parse("1:4"), mode="role", roles=("a",), ranks="all",
                            engines=profctx.EngineConfig(count=3, by_stage=True), tool_options={"compress_level": 1})
    assert ProfilerConfig.from_mapping(config.to_dict()) == config
    assert config.replace(mode="step").mode == "step"
    with pytest.raises(ConfigError):
        config.replace(mode="nope")


def test_a_long_window_is_the_same_from_text_env_a_list_and_a_dict() -> None:
    config = ProfilerConfig(steps="0:100000:3")
    steps = config.steps
    assert steps is not None
    assert (steps.first, steps.last, len(steps)) == (0, 99_999, 33_334)
    assert 99_999 in steps and 99_998 not in steps
    assert ProfilerConfig.from_mapping(config.to_dict()) == config
    assert pickle.loads(pickle.dumps(steps)) == steps
    from_env = from_environment({"PROFCTX_STEPS": "0:100000:3"})
    assert from_env is not None and from_env.steps == steps
    assert ProfilerConfig(steps=list(range(0, 100_000, 3))) == config


def test_yaml_errors_name_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("steps: [1, 2\n")
    with pytest.raises(ConfigError, match="valid YAML"):
        profctx.configure(bad)
    with pytest.raises(ConfigError, match="readable YAML"):
        profctx.configure(tmp_path / "missing.yaml")
    with pytest.raises(ConfigError, match="config: 42"):
        profctx.configure(42)


# -- YAML slices (issue 14, item 1) -------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "steps"),
    [
        ("steps: 3:6\n", [3, 4, 5]),  # YAML 1.1 reads this as 3*60 + 6 = 186
        ("steps: 10:40:10\n", [10, 20, 30]),  # ... and this as 38410
        ("profctx:\n  steps: 1:3\n", [1, 2]),
        ("steps: '3:6'\n", [3, 4, 5]),
        ("steps: 186\n", [186]),
    ],
)
def test_yaml_slices_are_read_as_slices(tmp_path: Path, text: str, steps: list[int]) -> None:
    path = tmp_path / "profile.yaml"
    path.write_text(text)
    config = profctx.configure(path, save_path=tmp_path / "out")
    assert config is not None and list(config.steps or ()) == steps


@pytest.mark.parametrize("text", ["steps: !!int 3:6\n", "steps: !!float 1:30.5\n"])
def test_yaml_base_60_numbers_forced_by_a_tag_are_refused(tmp_path: Path, text: str) -> None:
    path = tmp_path / "profile.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match="base-60"):
        profctx.configure(path)


@pytest.mark.parametrize("text", ["rank: 1:2\n", "ranks: 1:4\n", "engines:\n  count: 1:30\n"])
def test_yaml_slice_text_in_an_integer_field_is_refused(tmp_path: Path, text: str) -> None:
    path = tmp_path / "profile.yaml"
    path.write_text("steps: [1]\n" + text)
    with pytest.raises(ConfigError) as info:
        profctx.configure(path)
    assert ":" in repr(info.value.value)  # the text itself is shown, not a base-60 number


# -- roles as text (item 2), empty steps (item 3) ----------------------------------------------


def test_a_comma_separated_roles_string_means_several_patterns(tmp_path: Path) -> None:
    config = profctx.configure(steps=[1], roles="actor_*, rollout", engines={"roles": "gen,rollout"},
                               save_path=tmp_path)
    assert config is not None
    assert config.roles == ("actor_*", "rollout")
    assert config.engines.roles == ("gen", "rollout")


@pytest.mark.parametrize("roles", [["actor_*,rollout"], "actor_*,,rollout", ","])
def test_a_pattern_holding_a_comma_is_refused(roles: object) -> None:
    with pytest.raises(ConfigError, match=r"^roles: "):
        profctx.configure(steps=[1], roles=roles)


def test_enabled_with_no_steps_given_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="profiling is enabled, so give the steps"):
        profctx.configure(save_path=tmp_path)


@pytest.mark.parametrize("steps", [[], (), range(0), set()])
def test_empty_steps_keep_the_timeline_alone_and_are_refused_with_nothing_to_keep(steps: object,
                                                                                 tmp_path: Path) -> None:
    config = profctx.configure(steps=steps, save_path=tmp_path)
    assert config is not None and config.timeline_only and not config.active
    with pytest.raises(ConfigError, match="steps=\\[\\] for the step timeline alone"):
        profctx.configure(steps=steps, save_path=tmp_path, timeline=False)


def test_disabled_with_no_steps_is_fine(tmp_path: Path) -> None:
    config = profctx.configure(steps=[], enable=False, save_path=tmp_path / "never")
    assert config is not None and not config.active
    assert not (tmp_path / "never").exists()  # a disabled config touches no disk


# -- save_path (item 4) -------------------------------------------------------------------------


def test_save_path_is_created_and_probed_at_configure(tmp_path: Path) -> None:
    target = tmp_path / "a" / "b"
    profctx.configure(steps=[1], save_path=target)
    assert target.is_dir()
    assert [p.name for p in target.iterdir()] == [".profctx"]  # the probe file is removed; the manifest folder stays


@pytest.mark.parametrize(
    ("save_path", "needle"),
    [
        ("out\0put", "without NUL bytes"),
        ("/proc/profiles", "/proc is a kernel file system"),
        ("/proc", "/proc is a kernel file system"),
        ("/sys/fs/profiles", "/sys is a kernel file system"),
        ("/sys/../proc/x", "/proc is a kernel file system"),
        ("   ", "a non-empty folder path"),
    ],
)
def test_save_path_that_can_never_hold_files_is_refused(save_path: str, needle: str) -> None:
    with pytest.raises(ConfigError) as info:
        profctx.configure(steps=[1], save_path=save_path)
    assert info.value.field == "save_path" and info.value.value == save_path
    assert needle in str(info.value)
    with pytest.raises(ConfigError, match=needle):  # the value type refuses it too, before any disk access
        ProfilerConfig(steps=StepWindow.parse([1]), save_path=save_path)


def test_unwritable_save_path_is_refused_by_really_writing(tmp_path: Path) -> None:
    # Tests may run as root, where permission bits stop nothing: these fail for root as well.
    blocker = tmp_path / "a-file"
    blocker.write_text("x")
    with pytest.raises(ConfigError, match="a folder profctx can create and write into") as info:
        profctx.configure(steps=[1], save_path=blocker / "sub")
    assert info.value.value == str(blocker / "sub")
    link = tmp_path / "kernel"
    link.symlink_to("/proc")
    with pytest.raises(ConfigError, match="a folder profctx can create and write into"):
        profctx.configure(steps=[1], save_path=link / "profiles")
    assert not profctx.is_configured()


# -- wrong types from any source (item 5) ------------------------------------------------------


@pytest.mark.parametrize(
    ("source", "field"),
    [
        ({1: 2, "steps": [1]}, "1"),
        ({("a",): 2}, "('a',)"),
        ({"profctx": [1, 2]}, "profctx"),
        ({"profctx": "steps: 3:6"}, "profctx"),
        ({"steps": [1], "engines": {1: 2}}, "engines.1"),
        ({"steps": [1], "engines": {"start_timeout": 10**400}}, "engines.start_timeout"),
        ({"steps": [1], "engines": {"stop_timeout": float("nan")}}, "engines.stop_timeout"),
        ({"steps": [1], "ranks": range(10**9)}, "ranks"),
        ({"steps": [1], "ranks": range(10**30)}, "ranks"),
        ({"steps": [1], "engines": {"replicas": range(10**9)}}, "engines.replicas"),
        ({"steps": b"3:6"}, "steps"),
        ({"steps": [1], "mode": ["step"]}, "mode"),
        ({"steps": [1], "tool": {"torch": 1}}, "tool"),
        ({"steps": [1], "on_error": ["log"]}, "on_error"),
        ({"steps": [1], "contents": [["cpu"]]}, "contents"),
        ({"steps": [1], "save_path": b"/tmp/x"}, "save_path"),
    ],
)
def test_wrong_types_are_config_errors(source: dict[object, object], field: str) -> None:
    with pytest.raises(ConfigError) as info:
        profctx.configure(source)
    assert info.value.field == field
    assert type(info.value) is ConfigError


def test_omegaconf_that_does_not_resolve_is_a_config_error() -> None:
    omegaconf = pytest.importorskip("omegaconf")
    cfg = omegaconf.OmegaConf.create({"steps": "${nowhere}", "save_path": "${oc.env:PROFCTX_NOT_SET_ANYWHERE}"})
    with pytest.raises(ConfigError, match="an OmegaConf config that resolves"):
        profctx.configure(cfg)


def test_omegaconf_base_60_int_is_indistinguishable_and_documented() -> None:
    # OmegaConf (and so Hydra) reads YAML 1.1 itself: an unquoted 3:6 arrives as 186 and no
    # trace of the text is left. profctx cannot tell; docs/configuration.md says to quote slices.
    omegaconf = pytest.importorskip("omegaconf")
    assert omegaconf.OmegaConf.create("steps: 3:6").steps == 186
    doc = (Path(__file__).parents[1] / "docs" / "configuration.md").read_text()
    assert "quote" in doc and "186" in doc


# -- environment (item 6, validation side) -----------------------------------------------------


def test_from_environment_reads_and_checks_the_variables(tmp_path: Path) -> None:
    from profctx.core._config import from_environment

    assert from_environment({}) is None
    assert from_environment({"PROFCTX_RUN_ID": "r1"}) is None  # a run id alone switches nothing on
    config = from_environment({"PROFCTX_STEPS": "2:4", "PROFCTX_ROLES": "actor_*,rollout",
                               "PROFCTX_SAVE_PATH": str(tmp_path / "p"), "PROFCTX_RUN_ID": "r1"})
    assert config is not None and list(config.steps or ()) == [2, 3]
    assert config.roles == ("actor_*", "rollout") and config.run_id == "r1"
    assert (tmp_path / "p").is_dir()
    with pytest.raises(ConfigError, match=r"^PROFCTX_STEPS: '3:1'"):
        from_environment({"PROFCTX_STEPS": "3:1"})
    with pytest.raises(ConfigError, match=r"^PROFCTX_RANKS: "):
        from_environment({"PROFCTX_STEPS": "1", "PROFCTX_RANKS": ",".join(["1"] * 200_001)})


def test_a_command_that_only_reads_the_config_creates_no_folder(tmp_path: Path,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    from profctx.cli import main
    from profctx.core._config import load_config

    monkeypatch.chdir(tmp_path)
    path = tmp_path / "profile.yaml"
    path.write_text("steps: 3:6\ntool: nsys\nsave_path: out/profile\n")
    config = load_config(path)
    assert config is not None and list(config.steps or ()) == [3, 4, 5]
    assert main(["nsys-command", "--config", str(path), "--", "python", "train.py"]) == 0
    assert not (tmp_path / "out").exists()
    with pytest.raises(ConfigError, match=r"^save_path: '/proc/x'"):  # values are still checked
        load_config(path, save_path="/proc/x")


def test_yaml_alias_bomb_and_endless_files_are_refused_quickly(tmp_path: Path) -> None:
    # Nine levels of nine aliases: 9**9 leaves if anything expanded them (the error message, say).
    anchors = ["  a0: &a0 [x, x, x, x, x, x, x, x, x]"]
    anchors += [f"  a{i}: &a{i} [{', '.join([f'*a{i - 1}'] * 9)}]" for i in range(1, 9)]
    bomb = tmp_path / "bomb.yaml"
    bomb.write_text("tool_options:\n" + "\n".join(anchors) + "\nsteps: *a8\n")
    with pytest.raises(ConfigError, match=r"^config: .*alias bomb") as info:  # refused as it is read
        profctx.configure(bomb)
    assert len(str(info.value)) < 10_000
    with pytest.raises(ConfigError, match="at most 4 MiB"):
        profctx.configure("/dev/zero")


@pytest.mark.parametrize("text", ["steps: &a [*a]\n", "tool_options: &m {k: *m}\nsteps: [1]\n",
                                  "tool_options: {a: &s [1, *s]}\nsteps: [1]\n"])
def test_a_yaml_node_that_holds_itself_is_refused_not_walked_forever(tmp_path: Path, text: str) -> None:
    # PyYAML builds recursive data from an anchor used inside itself: endless if expanded or walked naively.
    path = tmp_path / "loop.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=r"^config: .*alias bomb"):
        profctx.configure(path)


def test_worker_group_selection_and_the_driver_default() -> None:
    plain = ProfilerConfig(steps=[1], ranks=[0, 2])
    assert plain.profile_driver is True and plain.selects(None, 2) and plain.selects("actor", 0)
    grouped = ProfilerConfig(steps=[1], ranks={"actor": [1], "rollout": "all"}, contents={"actor": ["cpu"]})
    assert grouped.profile_driver is False and not grouped.selects(None, 0)  # the driver is not named
    assert grouped.selects("actor", 1) and not grouped.selects("actor", 0) and grouped.selects("rollout", 7)
    assert not grouped.selects("critic", 0)  # a group not named does not profile
    assert grouped.contents_of("actor") == ("cpu",) and grouped.contents_of("rollout") == ()
    named = ProfilerConfig(steps=[1], ranks={"actor": [0], "driver": "all"})
    assert named.profile_driver is True and named.ranks == "all" and named.selects(None, 3)
    explicit = ProfilerConfig(steps=[1], groups={"actor": [0]}, profile_driver=True)
    assert explicit.selects(None, 0) and explicit.groups["actor"].ranks == (0,)
    assert ProfilerConfig.from_mapping(grouped.to_dict()) == grouped


@pytest.mark.parametrize(("fields", "field"), [
    ({"ranks": {"bad name": [0]}}, "ranks"),
    ({"groups": {"actor": {"ranks": [-1]}}}, "groups.actor.ranks"),
    ({"groups": {"actor": {"rank": [0]}}}, "groups.actor"),
    ({"ranks": {"actor": [0]}, "contents": {"critic": ["cpu"]}}, "contents"),
    ({"groups": {"actor": {"contents": ["colour"]}}}, "groups.actor.contents"),
    ({"group": "a/b"}, "group"),
    ({"profile_driver": "maybe"}, "profile_driver"),
])
def test_bad_group_settings_name_the_field(fields: dict[str, Any], field: str) -> None:
    with pytest.raises(ConfigError) as caught:
        ProfilerConfig(steps=[1], **fields)
    assert caught.value.field == field
