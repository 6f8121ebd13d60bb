"""The structured schema mirrors ProfilerConfig, type-checks overrides, and composes under Hydra."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

import profctx
from profctx import EngineConfig, ProfilerConfig
from profctx.interop.structured import EngineSchema, ProfilerSchema, register

from .conftest import EXAMPLES

omegaconf = pytest.importorskip("omegaconf")
OmegaConf = omegaconf.OmegaConf


def _defaults(cls: type) -> dict[str, object]:
    out = {}
    for f in dataclasses.fields(cls):
        value = f.default_factory() if f.default_factory is not dataclasses.MISSING else f.default
        out[f.name] = value
    return out


def test_schema_has_every_field_with_the_same_default() -> None:
    schema = _defaults(ProfilerSchema)
    config = {k: list(v) if isinstance(v, tuple) else v for k, v in _defaults(ProfilerConfig).items()}
    assert list(schema) == list(config)
    differing = {k for k in schema if k != "engines" and schema[k] != config[k]}
    assert differing == {"enable"}  # off until steps are given: ProfilerConfig needs steps when enabled
    engine = {k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(EngineConfig()).items()}
    assert _defaults(EngineSchema) == engine


def test_structured_node_configures_profctx() -> None:
    cfg = OmegaConf.merge(OmegaConf.structured(ProfilerSchema), OmegaConf.load(EXAMPLES / "profctx-hydra.yaml").profctx)
    config = profctx.configure(cfg, warmup=False)
    assert config is not None and config.active
    assert config.mode == "role" and config.ranks == (0,) and config.engines.count == 20


def test_structured_node_refuses_wrong_types_at_override() -> None:
    cfg = OmegaConf.structured(ProfilerSchema)
    with pytest.raises(omegaconf.ValidationError):
        cfg.compress = "maybe"
    with pytest.raises(omegaconf.ValidationError):
        cfg.engines.count = "twenty"


def test_profctx_still_validates_values_the_schema_allows() -> None:
    cfg = OmegaConf.structured(ProfilerSchema)
    cfg.enable, cfg.steps, cfg.mode = True, [1], "phase"
    with pytest.raises(profctx.ConfigError) as err:
        profctx.configure(cfg)
    assert err.value.field == "mode"


def test_hydra_composes_the_registered_schema(tmp_path: Path) -> None:
    pytest.importorskip("hydra")
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    register(name="schema", group="profctx")
    (tmp_path / "config.yaml").write_text(
        "defaults:\n  - profctx: schema\n  - _self_\nprofctx:\n  enable: true\n  steps: [3, 4]\n"
    )
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(config_dir=str(tmp_path), version_base=None):
            cfg = compose(config_name="config", overrides=["profctx.mode=role", "profctx.ranks=[0,1]"])
            with pytest.raises(Exception, match="compress"):
                compose(config_name="config", overrides=["profctx.compress=maybe"])
    finally:
        GlobalHydra.instance().clear()
    config = profctx.configure(cfg.profctx, warmup=False)
    assert config is not None and config.mode == "role" and config.ranks == (0, 1)
    assert list(config.steps or ()) == [3, 4]
