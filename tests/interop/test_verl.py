"""verl -> profctx conversion: the fields produced, the notes naming each verl field not carried
over, and ConfigError naming the verl field path for invalid input. verl shapes: January 2026 and
August 2026 (the fixtures), as a DictConfig, a resolved plain dict, a raw YAML dict and a path."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import pytest

import profctx
from profctx.interop.verl import Conversion, convert, from_verl
from profctx.records._manifest import read

from .conftest import load_shape

omegaconf = pytest.importorskip("omegaconf")
OmegaConf = omegaconf.OmegaConf

ACTOR = "actor_rollout_ref.actor.profiler"
ROLLOUT = "actor_rollout_ref.rollout.profiler"
CRITIC = "critic.profiler"


def _set(cfg: Any, **paths: Any) -> Any:
    for path, value in paths.items():
        OmegaConf.update(cfg, path.replace("__", "."), value, force_add=True)
    return cfg


def _profiling(shape: str, tool: str = "torch", discrete: bool = False, **more: Any) -> Any:
    cfg = load_shape(shape)
    _set(cfg, global_profiler__tool=tool, global_profiler__steps=[1, 2, 5])
    OmegaConf.update(cfg, f"{ACTOR}.enable", True)
    if tool in ("torch", "npu"):
        OmegaConf.update(cfg, f"{ACTOR}.tool_config.{tool}.discrete", discrete)
    for path, value in more.items():
        OmegaConf.update(cfg, path.replace("__", "."), value, force_add=True)
    return cfg


#: The verl version each fixture shape follows (stage names differ).
VERSION = {"jan2026": "0.7", "aug2026": "0.8"}
#: verl's stages per version and role, as its workers annotate them (checked against the wheel in
#: test_verl_real.py): the actor's include the reference model's, which runs in the actor's worker.
ACTOR_STAGES = {
    "0.7": ("actor_update", "actor_compute_log_prob", "rollout_generate", "ref_compute_log_prob"),
    "0.8": ("actor_compute_log_prob", "actor_update", "ref_compute_log_prob"),
}
CRITIC_STAGES = {"0.7": ("compute_values", "critic_update"), "0.8": ("train_batch",)}


def _fields_of(conversion: Conversion) -> set[str]:
    return set(conversion.fields)


# -- verl's defaults ----------------------------------------------------------------------------


def test_defaults_are_disabled_and_say_why(shape: str) -> None:
    conversion = convert(load_shape(shape))
    assert conversion.config.enable is False
    note = conversion.note("global_profiler.tool")
    assert note is not None and "no-op" in note.reason


@pytest.mark.parametrize("form", ["dictconfig", "plain", "raw-yaml-dict", "path"])
def test_every_input_form_gives_the_same_config(shape: str, form: str, tmp_path: Path) -> None:
    cfg = _profiling(shape, discrete=True)
    expected = convert(cfg).config
    if form == "plain":
        given: Any = OmegaConf.to_container(cfg, resolve=True)
    elif form == "raw-yaml-dict":  # interpolation strings still in it, as yaml.safe_load leaves them
        given = OmegaConf.to_container(cfg, resolve=False)
        assert "${" in str(given)
    elif form == "path":
        given = tmp_path / "verl.yaml"
        given.write_text(OmegaConf.to_yaml(cfg))
    else:
        given = cfg
    assert convert(given).config == expected


def test_every_field_of_the_fixture_is_accounted_for(shape: str) -> None:
    cfg = _profiling(shape, discrete=True)
    conversion = convert(cfg)
    plain = OmegaConf.to_container(cfg, resolve=True)
    leaves: list[str] = []

    def walk(prefix: str, node: Any) -> None:
        if isinstance(node, dict) and node:
            for key, value in node.items():
                walk(f"{prefix}.{key}" if prefix else str(key), value)
        else:
            leaves.append(prefix)

    for top in ("global_profiler", ACTOR, "actor_rollout_ref.ref.profiler", ROLLOUT, CRITIC):
        node: Any = plain
        for key in top.split("."):
            node = node[key]
        walk(top, node)
    missing = [leaf for leaf in leaves if not any(leaf == f or leaf.startswith(f + ".") for f in conversion.fields)]
    assert missing == []
    # Nothing in the fixture is unknown: no note is a catch-all "not a verl profiler field".
    assert not [n for n in conversion.notes if "profctx knows" in n.reason]


# -- whole step vs discrete ---------------------------------------------------------------------


def test_continuous_actor_maps_to_step_mode(shape: str) -> None:
    config = convert(_profiling(shape, global_profiler__profile_continuous_steps=True), VERSION[shape]).config
    assert config.enable and list(config.steps or ()) == [1, 2, 5]
    assert config.mode == "step" and config.contiguous is True
    assert config.tool == "torch" and config.contents == ("cpu", "cuda")  # verl torch: empty = CPU + CUDA
    assert config.ranks == (0,)  # verl: empty ranks -> rank 0
    assert config.save_path == "outputs/profile"
    # the critic stays off; the ref stage follows the actor (it runs in the actor's worker)
    assert config.roles == (*ACTOR_STAGES[VERSION[shape]], "rollout")
    assert config.engines.roles == ()  # rollout inherits discrete=false: verl drives no engine


def test_discrete_actor_and_rollout_drive_engines(shape: str) -> None:
    conversion = convert(_profiling(shape, discrete=True))
    config = conversion.config
    assert config.mode == "role"
    assert config.engines.roles == ("rollout",)
    assert config.engines.replicas == (0,)
    assert config.engines.contents == ()  # verl never restricts the engine's activities


def test_rollout_without_discrete_is_reported(shape: str) -> None:
    conversion = convert(_profiling(shape, discrete=False))
    note = conversion.note(f"{ROLLOUT}.tool_config.torch.discrete")
    assert note is not None and "discrete=true" in note.reason
    assert conversion.config.engines.roles == ()


def test_continuous_steps_with_discrete_is_reported(shape: str) -> None:
    conversion = convert(_profiling(shape, discrete=True, **{"global_profiler.profile_continuous_steps": True}))
    assert conversion.config.contiguous is False
    assert conversion.note("global_profiler.profile_continuous_steps") is not None


def test_mixed_discrete_roles_choose_role_mode_and_report(shape: str) -> None:
    cfg = _profiling(shape, discrete=True, **{f"{CRITIC}.enable": True, f"{CRITIC}.tool_config.torch.discrete": False})
    conversion = convert(cfg)
    assert conversion.config.mode == "role"
    note = conversion.note(f"{CRITIC}.tool_config.torch.discrete")
    assert note is not None and "actor is discrete" in note.reason


# -- ranks ------------------------------------------------------------------------------------


def test_per_role_ranks_become_worker_groups_and_the_union_stays_for_the_rest(shape: str) -> None:
    cfg = _profiling(shape, **{f"{ACTOR}.ranks": [0, 1], f"{CRITIC}.enable": True, f"{CRITIC}.ranks": [2]})
    conversion = convert(cfg, VERSION[shape])
    config = conversion.config
    assert config.ranks == (0, 1, 2)  # processes in no group
    assert {name: g.ranks for name, g in config.groups.items()} == {"actor": (0, 1), "critic": (2,)}
    assert config.selects("actor", 1) and not config.selects("actor", 2) and config.selects("critic", 2)
    assert conversion.config.roles == ()  # actor (with the fused ref), critic and rollout: every role
    for path, name in ((f"{ACTOR}.ranks", "actor"), (f"{CRITIC}.ranks", "critic")):
        note = conversion.note(path)
        assert note is not None and f"profctx.ray.group({name!r}" in note.reason


def test_per_role_contents_become_worker_group_contents() -> None:
    cfg = _profiling("jan2026", **{f"{ACTOR}.tool_config.torch.contents": ["cpu"], f"{CRITIC}.enable": True,
                                   f"{CRITIC}.tool_config.torch.contents": ["cpu", "shapes"]})
    config = convert(cfg).config
    assert config.contents_of("critic") == ("cpu", "shapes")
    assert config.contents_of("actor") == config.contents == ("cpu",)


def test_all_ranks_wins(shape: str) -> None:
    cfg = _profiling(shape, **{f"{ACTOR}.all_ranks": True, f"{CRITIC}.enable": True, f"{CRITIC}.ranks": [1]})
    conversion = convert(cfg)
    assert conversion.config.ranks == "all"
    assert conversion.note(f"{CRITIC}.all_ranks") is not None


def test_rollout_gpu_ranks_map_to_replicas() -> None:
    cfg = _profiling("aug2026", discrete=True, **{f"{ROLLOUT}.ranks": [2, 3, 5]})  # tp=2: replicas 1 and 2
    conversion = convert(cfg)
    assert conversion.config.engines.replicas == (1, 2)
    note = conversion.note(f"{ROLLOUT}.ranks")
    assert note is not None and "replicas of 2 GPUs" in note.reason


def test_rollout_all_ranks_profiles_every_replica(shape: str) -> None:
    cfg = _profiling(shape, discrete=True, **{f"{ACTOR}.all_ranks": True})  # the rollout inherits it
    assert convert(cfg).config.engines.replicas == "all"


# -- contents and tool settings -------------------------------------------------------------------


def test_npu_empty_contents_is_cpu_only_and_reported(shape: str) -> None:
    conversion = convert(_profiling(shape, tool="npu"))
    config = conversion.config
    assert config.tool == "npu" and config.contents == ("cpu",)
    assert conversion.note(f"{ACTOR}.tool_config.npu.contents") is not None
    assert dict(config.tool_options) == {
        "level": "level0", "analyse": True, "export_type": ["db"], "data_simplification": True,
        "mstx_domain_exclude": ["communication"],
    }


def test_npu_contents_and_level_map(shape: str) -> None:
    cfg = _profiling(shape, tool="npu", **{f"{ACTOR}.tool_config.npu.contents": ["npu", "module", "stack"],
                                           f"{ACTOR}.tool_config.npu.level": "level2",
                                           f"{ACTOR}.tool_config.npu.analysis": False})
    config = convert(cfg).config
    assert config.contents == ("cpu", "npu", "modules", "stack")
    assert config.tool_options["level"] == "level2" and config.tool_options["analyse"] is False


def test_nsys_options_and_reports(shape: str) -> None:
    cfg = _profiling(shape, tool="nsys", **{
        "global_profiler.global_tool_config.nsys.discrete": True,
        "global_profiler.global_tool_config.nsys.worker_nsight_options.capture-range-end": "repeat-shutdown:6",
    })
    conversion = convert(cfg)
    config = conversion.config
    assert config.tool == "nsys" and config.mode == "role"
    assert dict(config.tool_options["nsys_options"]) == {
        "trace": "cuda,nvtx,cublas,ucx", "cuda-memory-usage": "true", "cuda-graph-trace": "graph", "kill": "none"}
    assert conversion.note("global_profiler.global_tool_config.nsys.worker_nsight_options.capture-range-end")
    assert conversion.note("global_profiler.global_tool_config.nsys.controller_nsight_options")


def test_torch_memory_options(shape: str) -> None:
    cfg = _profiling(shape, tool="torch_memory", **{
        "global_profiler.global_tool_config.torch_memory.trace_alloc_max_entries": 5000,
        "global_profiler.global_tool_config.torch_memory.kw_args": {"device": 0},
    })
    conversion = convert(cfg)
    config = conversion.config
    assert config.tool == "torch_memory" and config.mode == "step" and config.contents == ("stack",)
    assert dict(config.tool_options) == {"max_entries": 5000, "stack_depth": 32, "context": "all"}
    assert conversion.note("global_profiler.global_tool_config.torch_memory.kw_args") is not None


def test_mini_batch_schedule_is_reported() -> None:
    cfg = _profiling("aug2026", **{f"{ACTOR}.tool_config.torch.schedule.active": 2})
    note = convert(cfg).note(f"{ACTOR}.tool_config.torch.schedule")
    assert note is not None and "mini-batches" in note.reason


def test_finish_hook_and_relocation_are_reported() -> None:
    cfg = _profiling("aug2026", **{"global_profiler.finish_hook_cmd": "upload $VERL_PROFILE_SAVE_PATH",
                                   "global_profiler.relocate_results": True})
    conversion = convert(cfg)
    assert conversion.note("global_profiler.finish_hook_cmd") is not None
    assert conversion.note("global_profiler.relocate_results") is not None
    assert conversion.note(f"{ACTOR}.finish_hook_cmd") is None  # inherited: same value, reported once


def test_unknown_field_is_reported_not_dropped(shape: str) -> None:
    cfg = _profiling(shape, **{f"{ACTOR}.tool_config.torch.record_everything": True})
    note = convert(cfg).note(f"{ACTOR}.tool_config.torch.record_everything")
    assert note is not None and "not carried over" in note.reason


# -- engine windows -------------------------------------------------------------------------------


def test_vllm_token_window() -> None:
    cfg = _profiling("aug2026", discrete=True, **{f"{ROLLOUT}.tool_config.torch.profile_token_start": 5,
                                                  f"{ROLLOUT}.tool_config.torch.profile_token_end": 25})
    engines = convert(cfg).config.engines
    assert (engines.delay, engines.count, engines.absolute_start_step) == (4, 20, None)


def test_sglang_token_window_is_absolute() -> None:
    cfg = _profiling("aug2026", discrete=True, **{"actor_rollout_ref.rollout.name": "sglang",
                                                  f"{ROLLOUT}.tool_config.torch.profile_token_start": 5,
                                                  f"{ROLLOUT}.tool_config.torch.profile_token_end": 25})
    engines = convert(cfg).config.engines
    assert (engines.delay, engines.count, engines.absolute_start_step) == (None, 20, 5)


def test_january_sglang_window_and_switches() -> None:
    cfg = _profiling("jan2026", discrete=True, **{
        f"{ROLLOUT}.tool_config.torch.step_start": 3,
        f"{ROLLOUT}.tool_config.torch.step_end": 13,
        f"{ROLLOUT}.tool_config.torch.contents": ["cuda", "profile-by-stage", "merge-profiles"],
    })
    config = convert(cfg, "0.7").config
    assert (config.engines.absolute_start_step, config.engines.count) == (3, 10)
    assert config.engines.by_stage and config.engines.merge_profiles
    assert config.engines.contents == ()  # cuda: verl leaves the engine's activities alone


def test_january_by_stage_without_window_is_refused() -> None:
    cfg = _profiling("jan2026", discrete=True, **{f"{ROLLOUT}.tool_config.torch.contents": ["profile-by-stage"]})
    with pytest.raises(profctx.ConfigError) as err:
        convert(cfg)
    assert err.value.field == f"{ROLLOUT}.tool_config.torch.contents"


# -- invalid verl input -------------------------------------------------------------------------


@pytest.mark.parametrize(("path", "value"), [
    (f"{ACTOR}.ranks", "0,1"),
    (f"{ACTOR}.enable", "yes"),
    (f"{ACTOR}.tool_config.torch.contents", ["gpu"]),
    ("global_profiler.steps", ["one"]),
    ("global_profiler.tool", "precision_debugger"),
    ("global_profiler.tool", "perf"),
])
def test_invalid_verl_input_names_the_verl_field(shape: str, path: str, value: Any) -> None:
    cfg = _profiling(shape, **{path: value})
    with pytest.raises(profctx.ConfigError) as err:
        convert(cfg)
    assert err.value.field == path


def test_bad_npu_level_and_token_window_name_their_fields() -> None:
    with pytest.raises(profctx.ConfigError) as err:
        convert(_profiling("aug2026", tool="npu", **{f"{ACTOR}.tool_config.npu.level": "level9"}))
    assert err.value.field == f"{ACTOR}.tool_config.npu.level"
    with pytest.raises(profctx.ConfigError) as err:
        convert(_profiling("aug2026", discrete=True, **{f"{ROLLOUT}.tool_config.torch.profile_token_start": 9,
                                                        f"{ROLLOUT}.tool_config.torch.profile_token_end": 3}))
    assert err.value.field == f"{ROLLOUT}.tool_config.torch.profile_token_end"


def test_not_a_verl_config_is_refused() -> None:
    with pytest.raises(profctx.ConfigError) as err:
        convert({"learning_rate": 1e-5})
    assert err.value.field == "verl"
    with pytest.raises(profctx.ConfigError):
        convert(42)


# -- the profiler parts alone ---------------------------------------------------------------------


def test_profiler_parts_alone() -> None:
    parts = {
        "global_profiler": {"tool": "torch", "steps": [4], "save_path": "/p"},
        "actor": {"enable": True, "ranks": [1], "tool_config": {"torch": {"discrete": True}}},
        "ref": {"profiler": {"enable": False}},
    }
    config = convert(parts, "0.9.1").config
    assert (config.mode, config.ranks, config.roles, config.save_path) == ("role", (1,), (), "/p")  # ref fused


def test_global_profiler_alone_profiles_every_role_on_rank_0() -> None:
    conversion = convert({"global_profiler": {"tool": "torch", "steps": [1, 2]}})
    config = conversion.config
    assert config.enable and config.roles == () and config.ranks == (0,)
    assert conversion.note("global_profiler") is not None


def test_one_role_block_needs_steps_from_the_caller() -> None:
    block = {"tool": "torch", "enable": True, "all_ranks": True, "tool_config": {"torch": {"discrete": True}}}
    assert convert(block).config.enable is False  # a role block holds no steps
    config = profctx.configure(verl=block, enable=True, steps=[3], warmup=False)
    assert config is not None and config.active and config.mode == "role" and config.ranks == "all"


# -- through profctx.configure ---------------------------------------------------------------------


def test_configure_verl_refuses_a_second_source() -> None:
    with pytest.raises(profctx.ConfigError) as err:
        profctx.configure({"steps": [1]}, verl={"global_profiler": {"tool": "torch", "steps": [1]}})
    assert err.value.field == "verl"


def test_configure_verl_keywords_override(tmp_path: Path) -> None:
    config = profctx.configure(verl=_profiling("aug2026"), save_path=str(tmp_path), warmup=False)
    assert config is not None and config.save_path == str(tmp_path) and list(config.steps or ()) == [1, 2, 5]


def test_from_verl_logs_the_notes_once(caplog: pytest.LogCaptureFixture) -> None:
    cfg = _profiling("aug2026", **{"global_profiler.finish_hook_cmd": "upload"})
    with caplog.at_level(logging.DEBUG, logger="profctx"):
        first = from_verl(cfg)
        second = from_verl(cfg)
    assert first == second
    warnings = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert len(warnings) == 1 and "global_profiler.finish_hook_cmd" in warnings[0].getMessage()


def test_converted_discrete_config_captures_only_the_enabled_stages(tmp_path: Path) -> None:
    """End to end with the real torch backend: the actor's and the fused ref's stages are captured
    (the ref runs in the actor's worker under actor.profiler), the disabled critic's is not."""
    cfg = _profiling("aug2026", discrete=True, **{"global_profiler.steps": [2], "global_profiler.save_path":
                                                   str(tmp_path)})
    profctx.configure(verl=cfg, warmup=False)
    for step in (1, 2, 3):
        with profctx.profile_step(step):
            for stage in ("ref_compute_log_prob", "actor_update", "train_batch"):
                with profctx.profile_step(role=stage):
                    pass
    profctx.flush(30)
    records = [r for r in read(tmp_path) if r.get("kind") == "role"]
    assert sorted((r["step"], r["role"], r["status"]) for r in records) == [
        (2, "actor_update", "ok"), (2, "ref_compute_log_prob", "ok")]
    assert all(f["path"].endswith((".pt.trace.json", ".pt.trace.json.gz")) for r in records for f in r["files"])
