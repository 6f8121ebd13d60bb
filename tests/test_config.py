"""Configuration: sources, precedence, environment, and errors that name field, value and what is allowed."""

from __future__ import annotations

from pathlib import Path

import pytest

import profctx
from profctx import ConfigError, ProfilerConfig, StepWindow


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


def test_yaml_errors_name_the_file(tmp_path: Path) -> None:
    bad = tmp_path / "bad.yaml"
    bad.write_text("steps: [1, 2\n")
    with pytest.raises(ConfigError, match="valid YAML"):
        profctx.configure(bad)
    with pytest.raises(ConfigError, match="readable YAML"):
        profctx.configure(tmp_path / "missing.yaml")
    with pytest.raises(ConfigError, match="config: 42"):
        profctx.configure(42)
