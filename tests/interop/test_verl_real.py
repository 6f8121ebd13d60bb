"""verl -> profctx conversion against the real verl 0.9.1: every config verl ships (composed with
Hydra as its entry point composes them), every profiler override of its example scripts and
profiling docs; every field accounted for; and verl's effective behaviour, computed by verl's own
code (DistProfiler's gates, the rollout replica gate, the vLLM launch arguments), compared with the
converted config: every difference is carried by a note on the verl field that causes it."""

from __future__ import annotations

import ast
import copy
import dataclasses
import fnmatch
import json
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import pytest

import profctx
from profctx.interop import verl as interop
from profctx.interop.verl import Conversion, convert

from .verl_inputs import VERL_VERSION, Input, all_inputs, compose, config_dir, require_verl

pytestmark = pytest.mark.usefixtures("verl_wheel")
omegaconf = pytest.importorskip("omegaconf")
OmegaConf = omegaconf.OmegaConf

#: Examples in verl's docs that verl itself refuses (its Hydra config is strict), with verl's reason.
#: They are doc rot in verl; profctx is not asked to convert what verl cannot load.
REFUSED_BY_VERL = {
    "nsight_profiling#1": "Key 'profiler' is not in struct",  # `profiler.steps`: no such key
    "nsight_profiling#2": "Key 'discrete' is not in struct",  # `global_profiler.discrete`: no such key
    "nsight_profiling#3": "Key 'profiler' is not in struct",
    "torch_profiling#3": "Error parsing override",  # a quoted value inside an unquoted override
}
WORLD = 8  # GPUs in the examples (one node of 8)

_INPUTS = None


def inputs() -> list[Input]:
    global _INPUTS
    if _INPUTS is None:
        try:
            _INPUTS = all_inputs()
        except ImportError:
            _INPUTS = []
    return _INPUTS


def _ids(items: Iterable[Input]) -> list[str]:
    return [i.name for i in items]


@pytest.fixture(scope="module")
def composed() -> dict[str, Any]:
    """Every real input verl loads, composed once; verl's refusals as the exception."""
    require_verl()
    out: dict[str, Any] = {}
    for item in inputs():
        try:
            out[item.name] = compose(item)
        except Exception as exc:
            out[item.name] = exc
    return out


# -- the stage names and inputs themselves -----------------------------------------------------------


def _annotated_stages(module_file: Path) -> dict[str, set[str]]:
    """Return class name -> the ``role=`` of every ``DistProfiler.annotate`` on its methods (read from source)."""
    tree = ast.parse(module_file.read_text(encoding="utf-8"))
    out: dict[str, set[str]] = {}
    for cls in (n for n in tree.body if isinstance(n, ast.ClassDef)):
        for fn in (n for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
            for deco in fn.decorator_list:
                if isinstance(deco, ast.Call) and ast.unparse(deco.func).endswith("DistProfiler.annotate"):
                    role = next((k.value for k in deco.keywords if k.arg == "role"), None)
                    if isinstance(role, ast.Constant):
                        out.setdefault(cls.name, set()).add(str(role.value))
    return out


def test_the_real_verl_is_installed() -> None:
    require_verl()
    from profctx.interop._verl_stages import installed_version, resolve_version

    assert installed_version() == VERL_VERSION
    assert resolve_version(None) == "0.8"


def test_stage_names_are_the_ones_verl_annotates() -> None:
    require_verl()
    import verl

    stages = _annotated_stages(Path(verl.__file__).parent / "workers" / "engine_workers.py")
    table = interop.STAGES["0.8"]
    assert stages["ActorRolloutRefWorker"] == {*table["actor"], *table["ref"]}
    assert stages["TrainingWorker"] == set(table["critic"]) == set(table["sft"])
    # names of the legacy workers, which 0.8 and later do not have
    assert not {"compute_values", "critic_update", "compute_rm_score", "rollout_generate"} & {
        s for names in table.values() for s in names}


_WORKERS = {"ActorRolloutRefWorker": ("actor", "ref"), "CriticWorker": ("critic",), "TrainingWorker": ("critic",),
            "RewardModelWorker": ("reward_model",)}


def _release_stages(wheel: Path) -> dict[str, set[str]]:
    """Return verl role -> stages annotated in the default workers of a verl wheel (role=, else the method name)."""
    import zipfile

    out: dict[str, set[str]] = {}
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
        legacy = "verl/workers/fsdp_workers.py" in names
        modules = ("fsdp_workers.py", "megatron_workers.py") if legacy else ("engine_workers.py",)
        for module in modules:
            path = f"verl/workers/{module}"
            if path not in names:
                continue
            tree = ast.parse(archive.read(path).decode("utf-8"))
            for cls in (n for n in tree.body if isinstance(n, ast.ClassDef) and n.name in _WORKERS):
                for fn in (n for n in cls.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))):
                    for deco in fn.decorator_list:
                        if isinstance(deco, ast.Call) and ast.unparse(deco.func).endswith("DistProfiler.annotate"):
                            role = next((k.value for k in deco.keywords if k.arg == "role"), None)
                            name = str(role.value) if isinstance(role, ast.Constant) else fn.name
                            out.setdefault(_WORKERS[cls.name][0], set()).add(name)
    return out


@pytest.mark.parametrize(("release", "key"), [("0.6.0", "0.6"), ("0.7.0", "0.7"), ("0.8.0", "0.8"), ("0.9.1", "0.8")])
def test_each_stage_table_is_what_that_verl_release_annotates(
    release: str, key: str, pytestconfig: pytest.Config, tmp_path_factory: pytest.TempPathFactory
) -> None:
    """Download each verl release's wheel (no install) and read its workers' annotations."""
    import subprocess
    import sys

    from profctx.interop._verl_stages import resolve_version

    cache = getattr(pytestconfig, "cache", None)  # absent with -p no:cacheprovider
    folder = cache.mkdir("verl-wheels") if cache is not None else tmp_path_factory.mktemp("wheels")
    wheels = list(folder.glob(f"verl-{release}-*.whl"))
    if not wheels:
        subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--dest", str(folder),
                        f"verl=={release}"], check=True)
        wheels = list(folder.glob(f"verl-{release}-*.whl"))
    stages = _release_stages(wheels[0])
    table = interop.STAGES[key]
    assert resolve_version(release) == key
    assert stages["actor"] == {*table["actor"], *table["ref"]}
    assert stages.get("critic", set()) == set(table["critic"])
    assert stages.get("reward_model", set()) == set(table.get("reward_model", ()))


def test_every_shipped_profiler_config_is_an_input() -> None:
    require_verl()
    shipped = {i.name for i in inputs() if i.config == i.name}
    top = {p.stem for p in config_dir().glob("*.yaml")}
    assert top - shipped == {"evaluation", "legacy_reward_impl"}  # neither holds a profiler
    assert {"ppo_trainer", "ppo_megatron_trainer", "sft_trainer_engine", "_generated_ppo_trainer"} <= shipped
    # npu_profile/npu_profile.yaml is an options file that no 0.9.1 code reads (only a commented-out line)
    import verl

    root = Path(verl.__file__).parent
    readers = [p for p in root.rglob("*.py") if "npu_profile" in "".join(
        line for line in p.read_text(encoding="utf-8").splitlines() if not line.strip().startswith("#"))]
    assert [p.name for p in readers if "npu_profile." in p.read_text(encoding="utf-8")] == []


def test_example_scripts_and_docs_give_inputs() -> None:
    require_verl()
    names = _ids(inputs())
    assert sum("torch_profile" in n for n in names) >= 6 and sum("npu_profile" in n for n in names) >= 4
    assert any(n.startswith("ascend_profiling_en#") for n in names)
    assert sum(n.startswith(("nsight_profiling#", "torch_profiling#")) for n in names) >= 5


# -- every real input converts, every field accounted for ----------------------------------------------


@pytest.mark.parametrize("name", _ids(inputs()))
def test_every_real_input_converts(name: str, composed: dict[str, Any]) -> None:
    cfg = composed[name]
    if isinstance(cfg, Exception):
        assert name in REFUSED_BY_VERL and REFUSED_BY_VERL[name] in str(cfg), f"verl refuses {name}: {cfg}"
        return
    assert name not in REFUSED_BY_VERL
    conversion = convert(cfg)
    _assert_every_field_accounted_for(cfg, conversion)
    for note in conversion.notes:
        assert "\n" not in note.reason and note.reason.strip()


def _assert_every_field_accounted_for(cfg: Any, conversion: Conversion) -> None:
    data = OmegaConf.to_container(cfg, resolve=True)
    blocks = {"global_profiler": data.get("global_profiler"), "profiler": data.get("profiler")}
    arr = data.get("actor_rollout_ref") or {}
    for role in ("actor", "ref", "rollout"):
        blocks[f"actor_rollout_ref.{role}.profiler"] = (arr.get(role) or {}).get("profiler")
    blocks["critic.profiler"] = (data.get("critic") or {}).get("profiler")
    known = conversion.fields
    for path, block in blocks.items():
        if not block:
            continue
        for leaf in _leaves(path, block):
            assert any(leaf == f or leaf.startswith(f + ".") for f in known), f"{leaf} not accounted for"


def _leaves(prefix: str, block: Mapping[str, Any]) -> Iterable[str]:
    for key, value in block.items():
        if isinstance(value, Mapping) and value:
            yield from _leaves(f"{prefix}.{key}", value)
        else:
            yield f"{prefix}.{key}"


# -- verl's effective behaviour against the converted plan ---------------------------------------------


def _dist_profiler(block: Any, rank: int, rollout: tuple[int, int] | None = None) -> Any:
    """Build verl's own DistProfiler for ``block`` as its workers do (tool forced to the no-op backend:
    the gates under test are the same, and no device profiler is needed on this machine)."""
    from verl.utils.config import omega_conf_to_dataclass
    from verl.utils.profiler import DistProfiler, ProfilerConfig
    from verl.utils.profiler.profile import build_rollout_dist_profiler

    pc = omega_conf_to_dataclass(block, dataclass_type=ProfilerConfig)
    tool = block.get("tool")
    tc = omega_conf_to_dataclass(block.tool_config.get(tool)) if tool in ("npu", "nsys", "torch", "torch_memory") \
        else None
    pc = dataclasses.replace(pc, tool=None)
    if rollout is not None:
        return build_rollout_dist_profiler(rollout[0], rollout[1], config=pc, tool_config=tc), pc, tc
    return DistProfiler(rank=rank, config=pc, tool_config=tc), pc, tc


def _selected(config: profctx.ProfilerConfig, rank: int) -> bool:
    return config.enable and (config.ranks == "all" or rank in config.ranks)


def _filtered(config: profctx.ProfilerConfig, stage: str) -> bool:
    return not config.roles or any(fnmatch.fnmatchcase(stage, p) for p in config.roles)


def _differences(cfg: Any, config: profctx.ProfilerConfig) -> list[tuple[str, str]]:
    """Return (verl field prefix, what differs) for each behaviour verl has that ``config`` does not."""
    out: list[tuple[str, str]] = []
    cfg = copy.deepcopy(cfg)
    OmegaConf.resolve(cfg)  # verl resolves the whole tree before a worker reads its block
    sft = "profiler" in cfg and "global_profiler" not in cfg
    if sft:
        start, end = cfg.trainer.profile_interval
        steps = list(range(start, end + 1)) if start > 0 else []
        workers = {"profiler": (cfg.profiler, interop.STAGES["0.8"]["sft"], ["trainer.profile_interval"])}
        tool = cfg.profiler.tool
    else:
        steps = list(cfg.global_profiler.steps or [])
        tool = cfg.global_profiler.tool
        arr = cfg.actor_rollout_ref
        table = interop.STAGES["0.8"]
        workers = {"actor_rollout_ref.actor.profiler": (arr.actor.profiler, (*table["actor"], *table["ref"]),
                                                         ["actor_rollout_ref.ref.profiler"])}
        if cfg.critic.get("enable") or (cfg.critic.get("enable") is None and cfg.algorithm.adv_estimator == "gae"):
            workers["critic.profiler"] = (cfg.critic.profiler, table["critic"], [])
    active = bool(steps) and tool is not None
    got = list(config.steps or ()) if config.enable else []
    if (steps if active else []) != got:
        out.append(("global_profiler" if not sft else "trainer.profile_interval", f"steps {steps} vs {got}"))
    for path, (block, stages, related) in workers.items():
        for rank in range(WORLD):
            prof, _, _ = _dist_profiler(block, rank)
            on = active and prof.check_enable() and prof.check_this_rank()
            verl_caps = set(stages) if on and prof.is_discrete_mode() else ({"step"} if on else set())
            ours: set[str] = set()
            if config.enable and _selected(config, rank):
                ours = {s for s in stages if _filtered(config, s)} if config.mode == "role" else {"step"}
            if verl_caps != ours:
                for prefix in (path, *related):
                    out.append((prefix, f"rank {rank}: verl {sorted(verl_caps)} vs profctx {sorted(ours)}"))
    if not sft:
        out += _engine_differences(cfg, config, active)
    return out


def _engine_differences(cfg: Any, config: profctx.ProfilerConfig, active: bool) -> list[tuple[str, str]]:
    from verl.utils.profiler.config import build_vllm_profiler_args

    path = "actor_rollout_ref.rollout.profiler"
    rollout = cfg.actor_rollout_ref.rollout
    block = rollout.profiler
    size = rollout.tensor_model_parallel_size * rollout.data_parallel_size * rollout.pipeline_model_parallel_size
    engine = None if OmegaConf.is_missing(rollout, "name") else rollout.name  # mandatory at launch (???)
    out: list[tuple[str, str]] = []
    for replica in range(WORLD // size):
        prof, pc, tc = _dist_profiler(block, replica, rollout=(replica, size))
        gate = prof.check_enable() and prof.check_this_rank()
        if engine in (None, "vllm", "sglang"):
            verl_on = active and gate and prof.is_discrete_mode() and block.tool in ("torch", "npu")
        else:  # TRT-LLM: no discrete gate
            verl_on = active and gate and block.tool in ("torch", "npu", "nsys")
        ours = bool(config.enable and config.engines.roles and (
            config.engines.replicas == "all" or replica in config.engines.replicas))
        if verl_on != ours:
            out.append((path, f"replica {replica}: verl engine {verl_on} vs profctx {ours}"))
        if verl_on and ours and engine == "vllm":
            verl_args = json.loads(build_vllm_profiler_args(pc, tc, replica, legacy_env=False)["profiler_config"])
            from profctx.engines.vllm import launch_settings

            mine = dict(launch_settings(config, version="0.24.0", replica=replica).profiler_config or {})
            for key in ("torch_profiler_with_stack", "torch_profiler_record_shapes", "torch_profiler_with_memory",
                        "delay_iterations", "max_iterations"):
                if bool(verl_args.get(key)) != bool(mine.get(key, False)) or (
                        isinstance(verl_args.get(key), int) and verl_args[key] > 1 and verl_args[key] != mine.get(key)):
                    out.append((path, f"vLLM {key}: verl {verl_args.get(key)!r} vs profctx {mine.get(key)!r}"))
            if str(verl_args.get("ignore_frontend")).lower() != str(mine.get("ignore_frontend", False)).lower():
                out.append((path, f"vLLM ignore_frontend: verl {verl_args.get('ignore_frontend')!r} vs profctx "
                                  f"{mine.get('ignore_frontend')!r}"))  # the note must name ignore_frontend
    return out


@pytest.mark.parametrize("name", _ids(inputs()))
def test_every_difference_from_verl_is_noted(name: str, composed: dict[str, Any]) -> None:
    """Zero silent changes: where the converted plan differs from what verl's own code would do, a note
    names a verl field of the role (or global block) concerned."""
    cfg = composed[name]
    if isinstance(cfg, Exception):
        pytest.skip("verl itself refuses this input")
    conversion = convert(cfg)
    for prefix, what in _differences(cfg, conversion.config):
        prefixes = (prefix, "global_profiler") if prefix != "trainer.profile_interval" else (prefix, "profiler")
        notes = [n for n in conversion.notes if n.field.startswith(prefixes)]
        if "ignore_frontend" in what:
            notes = [n for n in notes if "ignore_frontend" in n.reason]
        assert notes, f"silent change at {prefix}: {what}"


def test_the_difference_check_catches_a_silent_change(composed: dict[str, Any]) -> None:
    """The check above fails when a conversion drops the ref stage without a note (issue: fused ref)."""
    cfg = composed["run_qwen2_5_7b_torch_profile-profile_discrete=True"]
    config = convert(cfg).config
    broken = config.replace(roles=("actor_compute_log_prob", "actor_update", "rollout"))
    diffs = _differences(cfg, broken)
    assert any(p == "actor_rollout_ref.actor.profiler" and "ref_compute_log_prob" in w for p, w in diffs)


# -- wrong types anywhere in a real config: ConfigError naming the field, never another error -----------

_WRONG = (7, "x", [1, "a"], {"k": 1})
_PROFILING = ("global_profiler.steps=[1,2]", "actor_rollout_ref.actor.profiler.enable=True",
              "actor_rollout_ref.rollout.name=vllm", "critic.enable=True", "critic.profiler.enable=True",
              "actor_rollout_ref.actor.profiler.tool_config.torch.discrete=True",
              "actor_rollout_ref.rollout.profiler.tool_config.torch.discrete=True",
              "actor_rollout_ref.rollout.profiler.tool_config.npu.discrete=True")


def _nodes(prefix: str, block: Mapping[str, Any]) -> Iterable[str]:
    """Yield the path of every non-empty mapping inside ``block`` (whole blocks replaced by a wrong type)."""
    for key, value in block.items():
        if isinstance(value, Mapping) and value:
            yield f"{prefix}.{key}"
            yield from _nodes(f"{prefix}.{key}", value)


def _profiler_parts(data: dict[str, Any]) -> dict[str, Any]:
    arr = data["actor_rollout_ref"]
    rollout = {k: arr["rollout"][k] for k in ("profiler", "name", "tensor_model_parallel_size",
                                               "data_parallel_size", "pipeline_model_parallel_size")}
    return {"global_profiler": data["global_profiler"], "algorithm": {"adv_estimator": "gae"},
            "critic": {"enable": True, "profiler": data["critic"]["profiler"]},
            "actor_rollout_ref": {"actor": {"profiler": arr["actor"]["profiler"]},
                                  "ref": {"profiler": arr["ref"]["profiler"]}, "rollout": rollout}}


@pytest.mark.parametrize("tool", ["torch", "npu", "nsys", "torch_memory"])
def test_a_wrong_type_in_any_profiler_field_is_a_config_error(tool: str) -> None:
    require_verl()
    cfg = compose(Input("profiling", "ppo_trainer", (*_PROFILING, f"global_profiler.tool={tool}")))
    base = _profiler_parts(OmegaConf.to_container(cfg, resolve=True))
    convert(base)  # the valid config converts
    refused = 0
    for leaf in [*_leaves("", base), *_nodes("", base)]:
        keys = leaf.strip(".").split(".")
        if "profiler" not in leaf or keys[-1] in ("_target_", "name"):
            continue
        for wrong in _WRONG:
            data = json.loads(json.dumps(base))
            node = data
            for key in keys[:-1]:
                node = node[key]
            node[keys[-1]] = wrong
            try:
                convert(data)
            except profctx.ConfigError as err:
                refused += 1
                # the field named is the one replaced, or a field inside it (a mapping of wrong fields)
                assert err.field.startswith(leaf.strip(".")), (leaf, wrong, err.field)
                assert str(err).startswith(err.field) and "not valid" in str(err)
    assert refused > 100


# -- the issue's cases, one by one, on verl's real ppo_trainer / sft_trainer_engine --------------------

_ON = ("global_profiler.tool=torch", "global_profiler.steps=[1,2]", "actor_rollout_ref.actor.profiler.enable=True",
       "actor_rollout_ref.rollout.name=vllm")


def _real(*overrides: str, config: str = "ppo_trainer") -> Conversion:
    require_verl()
    return convert(compose(Input("case", config, overrides)))


@pytest.mark.parametrize("flag", ["null", "True", "False"])
def test_the_legacy_reward_model_section_is_not_a_profiler_block(flag: str) -> None:
    conversion = _real(*_ON, f"reward_model.enable={flag}")
    assert not any(n.field.startswith("reward_model") for n in conversion.notes)
    assert not any(f.startswith("reward_model") for f in conversion.fields)
    assert conversion.config.enable and conversion.config.ranks == (0,)


@pytest.mark.parametrize(("actor", "ref"), [(True, True), (True, False), (False, True), (False, False)])
def test_the_ref_stage_follows_the_actor(actor: bool, ref: bool) -> None:
    conversion = _real("global_profiler.tool=torch", "global_profiler.steps=[1]",
                       f"actor_rollout_ref.actor.profiler.enable={actor}",
                       f"actor_rollout_ref.ref.profiler.enable={ref}",
                       "actor_rollout_ref.actor.profiler.tool_config.torch.discrete=True", "critic.enable=False")
    config = conversion.config
    assert config.enable is actor
    if actor:
        assert "ref_compute_log_prob" in config.roles and "actor_update" in config.roles
    note = conversion.note("actor_rollout_ref.ref.profiler.enable")
    assert (note is not None) is (actor != ref)


@pytest.mark.parametrize(("tool", "contents"), [("torch", "[stack]"), ("torch", "[cpu]"), ("npu", "[npu,cpu]"),
                                                ("torch", "[cuda,shapes]"), ("torch", "[]")])
def test_rollout_engines_keep_their_own_activities(tool: str, contents: str) -> None:
    from profctx.engines.vllm import launch_settings

    conversion = _real(f"global_profiler.tool={tool}", "global_profiler.steps=[1]",
                       "actor_rollout_ref.actor.profiler.enable=True", "actor_rollout_ref.rollout.name=vllm",
                       f"actor_rollout_ref.rollout.profiler.tool_config.{tool}.discrete=True",
                       f"actor_rollout_ref.rollout.profiler.tool_config.{tool}.contents={contents}")
    engines = conversion.config.engines
    assert engines.roles == ("rollout",)
    assert not {"cpu", "cuda", "npu"} & set(engines.contents)
    settings = launch_settings(conversion.config, version="0.33.0")
    assert "torch_profiler_activities" not in (settings.profiler_config or {})


def test_the_critic_stage_is_train_batch_in_verl_09() -> None:
    conversion = _real("global_profiler.tool=torch", "global_profiler.steps=[1]", "critic.enable=True",
                       "critic.profiler.enable=True", "critic.profiler.tool_config.torch.discrete=True")
    assert conversion.config.roles == ("train_batch",) and conversion.config.mode == "role"


def test_a_reward_model_profiler_block_is_reported_unused_in_verl_09() -> None:
    conversion = convert({"global_profiler": {"tool": "torch", "steps": [1]},
                          "actor": {"enable": True}, "reward_model": {"profiler": {"enable": True}}}, "0.9.1")
    note = conversion.note("reward_model.profiler.enable")
    assert note is not None and "no reward_model profiler" in note.reason
    assert "compute_rm_score" not in conversion.config.roles


def test_an_enabled_role_without_steps_is_reported() -> None:
    conversion = _real("global_profiler.tool=torch", "actor_rollout_ref.actor.profiler.enable=True")
    assert conversion.config.enable is False
    note = conversion.note("global_profiler.steps")
    assert note is not None and "no step is listed" in note.reason


def test_sft_profile_interval_becomes_one_capture_over_the_steps() -> None:
    conversion = _real("profiler.enable=True", "trainer.profile_interval=[3,5]", config="sft_trainer_engine")
    config = conversion.config
    assert config.enable and list(config.steps or ()) == [3, 4, 5] and config.contiguous and config.mode == "step"
    discrete = _real("profiler.enable=True", "trainer.profile_interval=[3,5]",
                     "profiler.tool_config.torch.discrete=True", config="sft_trainer_engine").config
    assert discrete.mode == "role" and discrete.roles == ("train_batch",) and not discrete.contiguous


@pytest.mark.parametrize(("interval", "why"), [("[-1,-1]", None), ("[0,4]", "count from 1")])
def test_sft_interval_that_profiles_nothing(interval: str, why: str | None) -> None:
    conversion = _real("profiler.enable=True", f"trainer.profile_interval={interval}", config="sft_trainer_engine")
    assert conversion.config.enable is False
    note = conversion.note("trainer.profile_interval")
    assert note is not None and (why is None or why in note.reason)


def test_sft_bad_interval_is_a_config_error() -> None:
    with pytest.raises(profctx.ConfigError) as err:
        _real("profiler.enable=True", "trainer.profile_interval=[5,3]", config="sft_trainer_engine")
    assert err.value.field == "trainer.profile_interval"


def test_torch_memory_without_steps_is_reported_with_what_to_call() -> None:
    conversion = _real("global_profiler.tool=torch_memory")
    note = conversion.note("global_profiler.tool")
    assert conversion.config.enable is False
    assert note is not None and "watch_oom" in note.reason and "whatever steps" in note.reason


def test_trtllm_rollout_is_reported_not_driven_as_vllm() -> None:
    conversion = _real("global_profiler.tool=torch", "global_profiler.steps=[1]",
                       "actor_rollout_ref.actor.profiler.enable=True", "actor_rollout_ref.rollout.name=trtllm",
                       "actor_rollout_ref.rollout.profiler.tool_config.torch.discrete=True")
    assert conversion.config.engines.roles == ()
    note = conversion.note("actor_rollout_ref.rollout.profiler.enable")
    assert note is not None and "TensorRT-LLM" in note.reason


def test_vllm_ignore_frontend_is_reported_without_a_token_window() -> None:
    conversion = _real(*_ON, "actor_rollout_ref.rollout.profiler.tool_config.torch.discrete=True")
    note = conversion.note("actor_rollout_ref.rollout.profiler.tool_config.torch.profile_token_end")
    assert note is not None and "ignore_frontend" in note.reason
    windowed = _real(*_ON, "actor_rollout_ref.rollout.profiler.tool_config.torch.discrete=True",
                     "actor_rollout_ref.rollout.profiler.tool_config.torch.profile_token_end=40")
    assert not any("ignore_frontend" in n.reason for n in windowed.notes)


def test_verls_profiler_config_dataclass_is_read_as_a_role_block() -> None:
    require_verl()
    from verl.utils.profiler import ProfilerConfig
    from verl.utils.profiler.config import TorchProfilerToolConfig

    block = ProfilerConfig(tool="torch", enable=True, ranks=[1], save_path="/p",
                           tool_config={"torch": TorchProfilerToolConfig(discrete=True)})
    for given in (block, {"global_profiler": {"tool": "torch", "steps": [2]}, "actor": block}):
        conversion = convert(given, "0.9.1")
        assert conversion.config.mode == "role" and conversion.config.ranks == (1,)
        assert conversion.config.save_path == "/p" or given is not block
    assert convert({"global_profiler": {"tool": "torch", "steps": [2]}, "actor": block}, "0.9.1").config.enable


# -- profctx verl-convert -------------------------------------------------------------------------------


def _run_cli(*argv: str) -> tuple[int, str, str]:
    import contextlib
    import io

    from profctx.cli import main

    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(list(argv))
    return code, out.getvalue(), err.getvalue()


def test_verl_convert_reads_a_verl_yaml_file_with_overrides(tmp_path: Path) -> None:
    """A YAML dump of a composed verl config (what a verl run writes to .hydra/config.yaml)."""
    require_verl()
    dump = tmp_path / "config.yaml"
    OmegaConf.save(compose(Input("x", "ppo_trainer", _ON)), dump)
    code, out, _ = _run_cli("verl-convert", str(dump), "global_profiler.steps=[4,5]")
    assert code == 0
    import yaml

    config = profctx.ProfilerConfig.from_mapping(yaml.safe_load(out))
    assert list(config.steps or ()) == [4, 5] and "actor_update" in config.roles
    assert "# - actor_rollout_ref.ref.profiler.enable = False" in out


@pytest.mark.parametrize("argv", [("nope",), ("ppo_trainer", "global_profiler.nope=1"), ("ppo_trainer", "@/no/file"),
                                  ("ppo_trainer", "global_profiler.steps=7", "global_profiler.tool=torch")])
def test_verl_convert_refuses_what_it_cannot_read_with_status_2(argv: tuple[str, ...]) -> None:
    require_verl()
    code, out, err = _run_cli("verl-convert", *argv)
    assert code == 2 and out == "" and err.startswith("profctx verl-convert: ")
