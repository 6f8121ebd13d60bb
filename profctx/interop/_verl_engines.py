"""Map verl's rollout profiler block onto profctx's ``engines``: which replicas, what, and which window.

verl drives the vLLM/SGLang rollout engines only for the torch and npu tools and only when the
rollout block is discrete; otherwise ``engines.roles`` is empty and the reason is noted.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..util._errors import ConfigError, one_of
from ._verl_input import as_flag
from ._verl_options import CONTENTS, SGLANG_SWITCHES
from ._verl_report import Report
from ._verl_roles import Role
from ._verl_tool import tool_config, tool_leftovers


def engine_settings(
    report: Report, data: Mapping[str, Any], tool: str | None, rollout: Role | None, roles: list[Role]
) -> dict[str, Any]:
    """Return profctx's ``engines`` mapping for the enabled ``rollout`` role (``None`` when not enabled).

    ``data`` is the whole verl config, read for the rollout engine's name and parallel sizes.
    Raise :class:`ConfigError` naming the verl field for an invalid content or window.
    """
    block = next((r for r in roles if r.name == "rollout"), None)
    if rollout is None:
        if block is not None:
            report.mapped(block.field("enable"), "engines.roles = [] (rollout not enabled)")
            tool_leftovers(report, block, tool, "unused: rollout not enabled")
            for key in ("all_ranks", "ranks"):
                report.mark(block.path, block.block, key, "unused: rollout not enabled")
        return {"roles": []}
    path = rollout.field("tool_config")
    tc = tool_config(rollout, tool) if tool else {}
    discrete_path = f"{path}.{tool}.discrete"
    out: dict[str, Any] = {"roles": []}
    for key in ("all_ranks", "ranks"):
        report.mark(rollout.path, rollout.block, key, "engines.replicas")
    engine = engine_name(data)
    if tool not in ("torch", "npu"):
        if engine == "trtllm":  # verl drives TensorRT-LLM with nsys too: what stops profctx is the engine
            reason = (f"the rollout engine is TensorRT-LLM, which profctx has no adapter for (verl drives it "
                      f"with collective_rpc start_profile/stop_profile, with the {tool!r} tool too): no engine "
                      "is driven (engines.roles = []); profile it with its own tools")
        else:
            reason = (f"verl's vLLM/SGLang servers accept only the torch and npu tools, not {tool!r}: no engine "
                      "is driven (engines.roles = [])")
        report.note(rollout.field("enable"), True, reason)
        tool_leftovers(report, rollout, tool, "unused: no engine is driven")
        return out
    if engine == "trtllm":
        report.note(rollout.field("enable"), True, "the rollout engine is TensorRT-LLM, which profctx has no "
                    "adapter for (verl drives it with collective_rpc start_profile/stop_profile, discrete or "
                    "not): no engine is driven (engines.roles = []); profile it with its own tools")
        report.mapped(discrete_path, "unused: no engine is driven (TensorRT-LLM)")
        tool_leftovers(report, rollout, tool, "unused: no engine is driven (TensorRT-LLM)")
        return out
    discrete = as_flag(discrete_path, tc.get("discrete", False))
    report.mapped(discrete_path, "engines on/off (verl drives engines only when discrete)")
    if not discrete:
        report.note(discrete_path, False, "verl drives the rollout engines only with discrete=true, so no engine "
                    "is driven (engines.roles = []); set engines.roles=['rollout'] to profile them")
        tool_leftovers(report, rollout, tool, "unused: no engine is driven")
        return out
    out["roles"] = ["rollout"]
    out["replicas"] = _replicas(report, data, rollout)
    out["contents"] = _engine_contents(report, rollout, tool, tc)
    if engine == "sglang" and "memory" in out["contents"]:
        out["contents"].remove("memory")
        report.note(f"{path}.{tool}.contents", list(tc.get("contents") or []), "SGLang's profiler records no "
                    "memory: verl warns and drops 'memory' for SGLang, and so does profctx")
    out.update(_engine_window(report, data, rollout, tool, tc))
    if engine in (None, "vllm") and not out.get("delay") and not out.get("count"):
        report.note(f"{path}.{tool}.profile_token_end", tc.get("profile_token_end"), "verl always launches vLLM "
                    "with ignore_frontend=true (no front-end process trace), and so does profctx: its vLLM launch "
                    "settings always send ignore_frontend=true (0.13+) or VLLM_TORCH_PROFILER_DISABLE_ASYNC_LLM=1 "
                    "(0.12-0.15), with or without an engines.delay/count window; vLLM's front end is not traced")
    for key in ("level", "analysis"):
        if key in tc:
            report.note(f"{path}.{tool}.{key}", tc[key], "profctx sends no NPU level or analysis switch to "
                        "rollout engines: they use their own defaults")
    tool_leftovers(report, rollout, tool, "rollout engine setting")
    return out


def engine_name(data: Mapping[str, Any]) -> str | None:
    """Return ``actor_rollout_ref.rollout.name`` (``vllm``, ``sglang``, ``trtllm``...), or ``None`` when not given."""
    arr = data.get("actor_rollout_ref")
    rollout = arr.get("rollout") if isinstance(arr, Mapping) else None
    name = rollout.get("name") if isinstance(rollout, Mapping) else None
    return str(name) if name is not None else None


def _replicas(report: Report, data: Mapping[str, Any], rollout: Role) -> list[int] | str:
    if rollout.all_ranks:
        return "all"
    if not rollout.ranks:
        return [0]
    cfg = (data.get("actor_rollout_ref") or {}).get("rollout") or {}
    size = 1
    for key in ("tensor_model_parallel_size", "data_parallel_size", "pipeline_model_parallel_size"):
        value = cfg.get(key, 1) if isinstance(cfg, Mapping) else 1
        size *= value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 1
    replicas = sorted({rank // size for rank in rollout.ranks})
    if isinstance(cfg, Mapping) and "tensor_model_parallel_size" in cfg:
        reason = (f"read as global GPU ranks of replicas of {size} GPUs, as verl 0.9 does (0.9.0 on): replicas "
                  f"{replicas}; each selected replica keeps the traces of all its GPUs (verl drops those of "
                  "GPUs not listed when it relocates them)")
    else:
        reason = (f"read as replica indices {replicas} (no rollout parallel sizes given; verl 0.9 reads "
                  "global GPU ranks: pass the whole trainer config to map them)")
    report.note(rollout.field("ranks"), list(rollout.ranks), reason)
    return replicas


def _engine_contents(report: Report, rollout: Role, tool: str, tc: Mapping[str, Any]) -> list[str]:
    path = f"{rollout.field('tool_config')}.{tool}.contents"
    raw = tc.get("contents") or []
    if not isinstance(raw, (list, tuple)):
        raise ConfigError(path, raw, "a list; " + one_of(CONTENTS[tool]))
    report.mapped(path, "engines.contents (stack/module, shapes, memory; the engine records its default "
                  "activities, as verl leaves them)")
    out: list[str] = []
    for item in raw:
        if item in SGLANG_SWITCHES:
            continue
        if item not in CONTENTS[tool]:
            raise ConfigError(path, item, f"verl's {tool} contents: {one_of(CONTENTS[tool])}")
        # verl passes engines with_stack (stack or module), record_shapes and with_memory only:
        # the engine's activities are never restricted, so cpu/cuda/npu select nothing there.
        mapped = {"module": "stack", "npu": None, "cpu": None, "cuda": None}.get(item, item)
        if mapped is not None:
            out.append(mapped)
    return list(dict.fromkeys(out))


def _engine_window(
    report: Report, data: Mapping[str, Any], rollout: Role, tool: str, tc: Mapping[str, Any]
) -> dict[str, Any]:
    base = f"{rollout.field('tool_config')}.{tool}"
    engine = engine_name(data)
    out: dict[str, Any] = {}
    switches = [s for s in (tc.get("contents") or []) if s in SGLANG_SWITCHES]
    for switch in switches:
        out[SGLANG_SWITCHES[switch]] = True
    start, end = tc.get("profile_token_start"), tc.get("profile_token_end")
    token = start is not None or end is not None
    if not token and ("step_start" in tc or "step_end" in tc):  # January 2026: SGLang's start_step/num_steps
        raw_start, raw_end = tc.get("step_start", 0), tc.get("step_end", -1)
        for key, value in (("step_start", raw_start), ("step_end", raw_end)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise ConfigError(f"{base}.{key}", value, "an integer")
        first = raw_start if raw_end is not None else 1
        count = raw_end - first if raw_end is not None else 0
        first = max(first, 1)
        for key in ("step_start", "step_end"):
            report.mapped(f"{base}.{key}", "engines.absolute_start_step / engines.count (SGLang)")
        if count > 0:
            out["count"] = count
        if first > 1:
            out["absolute_start_step"] = first
        if engine not in (None, "sglang") and (count > 0 or first > 1):
            report.note(f"{base}.step_start", raw_start, f"verl (January 2026) sends this window to SGLang only; "
                        f"the rollout engine is {engine!r}, so profctx sends it too (engines.count/delay)")
    if token:
        for key, value in (("profile_token_start", start), ("profile_token_end", end)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise ConfigError(f"{base}.{key}", value, "an integer >= 0 or null")
        if start is not None and end is not None and end <= start:
            raise ConfigError(f"{base}.profile_token_end", end, f"greater than profile_token_start ({start})")
        count = end - (start or 0) if end is not None else None
        if count:
            out["count"] = count
        report.mapped(f"{base}.profile_token_end", "engines.count (engine iterations)")
        if engine == "sglang":
            if start:
                out["absolute_start_step"] = start
            report.mapped(f"{base}.profile_token_start", "engines.absolute_start_step (SGLang's start_step is "
                          "an absolute forward count, as verl sends it)")
        else:
            if start and start > 1:
                out["delay"] = start - 1  # vLLM's delay_iterations=N skips N-1 engine steps
            report.mapped(f"{base}.profile_token_start", "engines.delay (vLLM delay_iterations - 1)")
            if engine is None and start:
                report.note(f"{base}.profile_token_start", start, "rollout engine unknown (no "
                            "actor_rollout_ref.rollout.name): read as vLLM's delay_iterations; for SGLang "
                            "set engines.absolute_start_step instead")
    if out.get("by_stage") and not out.get("count"):
        raise ConfigError(f"{base}.contents", "profile-by-stage", "profile-by-stage needs a step window "
                          "(step_end / profile_token_end): SGLang's profile_by_stage needs num_steps")
    return out
