"""Map the chosen tool's contents and options (torch, npu, nsys, torch_memory) onto profctx's.

profctx records one contents list and one set of tool options for all roles: they are read
from the primary role (the first enabled training role), and other roles that differ are noted.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from ..util._errors import ConfigError, one_of
from ._verl_input import as_flag, as_mapping
from ._verl_report import Report, instead
from ._verl_roles import Role
from ._verl_tool import tool_config, tool_leftovers

#: verl ``contents`` per tool -> profctx ``contents`` entry.
CONTENTS: Final[Mapping[str, Mapping[str, str]]] = {
    "torch": {"cpu": "cpu", "cuda": "cuda", "memory": "memory", "shapes": "shapes", "stack": "stack"},
    "npu": {"cpu": "cpu", "npu": "npu", "memory": "memory", "shapes": "shapes", "stack": "stack", "module": "modules"},
}
#: Rollout ``contents`` entries of January 2026 (SGLang switches, hyphenated as verl's validator wants).
SGLANG_SWITCHES: Final = {"profile-by-stage": "by_stage", "merge-profiles": "merge_profiles"}
#: NPU levels verl accepts.
NPU_LEVELS: Final = ("level_none", "level0", "level1", "level2")
#: nsys options profctx sets itself from the plan.
NSYS_OWNED: Final = ("capture-range", "capture-range-end", "c")


def tool_settings(
    report: Report,
    gpath: str,
    g: Mapping[str, Any],
    tool: str | None,
    primary: Role | None,
    tc: Mapping[str, Any],
    training: list[Role],
    groups: dict[str, Any] | None = None,
) -> tuple[tuple[str, ...], dict[str, Any]]:
    """Return profctx's ``contents`` and ``tool_options`` for ``tool``.

    A role whose contents differ from the primary role's keeps them as its worker group's
    (``groups[role]["contents"]``, filled in here).

    ``tc`` is the primary role's block for ``tool``. Raise :class:`ConfigError` naming the
    verl field for an invalid content, level, option or schedule.
    """
    gtc = as_mapping(f"{gpath}.global_tool_config", g.get("global_tool_config") or {})
    contents: tuple[str, ...] = ()
    options: dict[str, Any] = {}
    if tool in ("torch", "npu") and primary is not None:
        contents = _contents(report, primary, tool, tc)
        for role in training[1:]:
            other = tool_config(role, tool)
            path = f"{role.field('tool_config')}.{tool}.contents"
            own = _contents(report, role, tool, other, quiet=True) if "contents" in other else contents
            if own != contents and groups is not None and role.name:
                groups.setdefault(primary.name, {}).setdefault("contents", list(contents))
                groups.setdefault(role.name, {})["contents"] = list(own)
                report.note(path, other["contents"], f"kept per role as groups.{role.name}.contents: register this "
                            f"role's workers with profctx.ray.group({role.name!r}, <its worker group>.workers); "
                            f"processes in no group record {list(contents)} from {primary.name}")
    if tool == "npu" and primary is not None:
        options = _npu_options(report, primary, tc, training)
    elif tool == "nsys":
        options = _nsys_options(report, gpath, gtc)
    elif tool == "torch_memory":
        contents, options = _memory_options(report, gpath, gtc, primary, tc)
    if tool == "torch":
        for role in training:
            _schedule(report, role, tool_config(role, tool))
    for role in training:
        tool_leftovers(report, role, tool)
    return contents, options


def _contents(
    report: Report, role: Role, tool: str, tc: Mapping[str, Any], quiet: bool = False
) -> tuple[str, ...]:
    path = f"{role.field('tool_config')}.{tool}.contents"
    raw = tc.get("contents") or []
    if not isinstance(raw, (list, tuple)):
        raise ConfigError(path, raw, "a list; " + one_of(CONTENTS[tool]))
    out: list[str] = []
    for item in raw:
        if item in SGLANG_SWITCHES and tool == "torch":
            continue  # rollout engine switches, read by the engine mapping
        if item not in CONTENTS[tool]:
            allowed = [*CONTENTS[tool], *(SGLANG_SWITCHES if tool == "torch" else ())]
            raise ConfigError(path, item, f"verl's {tool} contents: {one_of(allowed)}")
        out.append(CONTENTS[tool][item])
    if not quiet:
        report.mapped(path, "contents (empty made explicit: torch CPU+CUDA, npu CPU only)")
    if not out:
        # verl's empty contents: torch records CPU and CUDA, npu records CPU only.
        if tool == "npu" and not quiet:
            report.note(path, list(raw), "verl's npu backend records CPU only for empty contents; kept as "
                        "contents=['cpu'] (add 'npu' to record the device)")
        return ("cpu", "cuda") if tool == "torch" else ("cpu",)
    return tuple(dict.fromkeys(["cpu", *out]))  # verl records CPU activity whatever is listed


def _npu_options(report: Report, primary: Role, tc: Mapping[str, Any], training: list[Role]) -> dict[str, Any]:
    base = f"{primary.field('tool_config')}.npu"
    level = tc.get("level", "level0")
    if level not in NPU_LEVELS:
        raise ConfigError(f"{base}.level", level, one_of(NPU_LEVELS))
    analysis = as_flag(f"{base}.analysis", tc.get("analysis", False))
    report.mapped(f"{base}.level", "tool_options.level")
    report.mapped(f"{base}.analysis", "tool_options.analyse")
    for role in training[1:]:
        other = tool_config(role, "npu")
        for key, value in (("level", level), ("analysis", analysis)):
            if key in other and other[key] != value:
                report.note(f"{role.field('tool_config')}.npu.{key}", other[key],
                            f"profctx has one npu setting for all roles: {value!r} from {primary.name} is used; "
                            f"{instead('tool_options.' + ('level' if key == 'level' else 'analyse'))}")
    # verl's NPU profiler fixes these (export to Db, simplified data, no communication mstx ranges).
    return {"level": level, "analyse": analysis, "export_type": ["db"], "data_simplification": True,
            "mstx_domain_exclude": ["communication"]}


def _nsys_options(report: Report, gpath: str, gtc: Mapping[str, Any]) -> dict[str, Any]:
    nsys = as_mapping(f"{gpath}.global_tool_config.nsys", gtc.get("nsys") or {})
    base = f"{gpath}.global_tool_config.nsys"
    report.mark(base, nsys, "_target_", "Hydra target; nothing to carry")
    worker = as_mapping(f"{base}.worker_nsight_options", nsys.get("worker_nsight_options") or {})
    extra: dict[str, Any] = {}
    for key, value in worker.items():
        path = f"{base}.worker_nsight_options.{key}"
        if key == "capture-range":
            report.mapped(path, "set by profctx (cudaProfilerApi)")
        elif key in ("capture-range-end", "c"):
            if value is None:
                report.mapped(path, "computed by profctx from the plan (repeat:N)")
            else:
                report.note(path, value, "profctx computes capture-range-end=repeat:N from the steps, mode and "
                            "roles (profctx nsys-command); verl's value is not used")
        elif value is None:
            report.mapped(path, "unset; nothing to carry")
        else:
            extra[key] = value
            report.mapped(path, f"tool_options.nsys_options.{key}")
    controller = nsys.get("controller_nsight_options")
    if controller:
        report.note(f"{base}.controller_nsight_options", dict(controller), "profctx does not launch the driver; "
                    "run it under `nsys profile` with these options yourself if you need its timeline")
    return {"nsys_options": extra} if extra else {}


def _memory_options(
    report: Report, gpath: str, gtc: Mapping[str, Any], primary: Role | None, tc: Mapping[str, Any]
) -> tuple[tuple[str, ...], dict[str, Any]]:
    base = f"{gpath}.global_tool_config.torch_memory"
    mem = as_mapping(base, gtc.get("torch_memory") or {})
    role_base = f"{primary.field('tool_config')}.torch_memory" if primary is not None else base
    options: dict[str, Any] = {}
    for verl_key, ours in (("trace_alloc_max_entries", "max_entries"), ("stack_depth", "stack_depth")):
        value, path = (tc[verl_key], f"{role_base}.{verl_key}") if verl_key in tc else (
            mem.get(verl_key), f"{base}.{verl_key}")
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ConfigError(path, value, "an integer > 0")
        options[ours] = value
        report.mapped(path, f"tool_options.{ours}")
        report.mapped(f"{base}.{verl_key}", f"tool_options.{ours}")
    if "context" in mem:
        if mem["context"] not in ("state", "alloc", "all"):
            raise ConfigError(f"{base}.context", mem["context"], one_of(("state", "alloc", "all")))
        options["context"] = mem["context"]
        report.mapped(f"{base}.context", "tool_options.context")
    contents: tuple[str, ...] = ()
    stacks = mem.get("stacks", "python")
    if stacks in ("all", "cpp"):
        contents = ("stack",)
        report.mapped(f"{base}.stacks", "contents ['stack'] (Python and C++ frames)")
        if stacks == "cpp":
            report.note(f"{base}.stacks", stacks, "profctx keeps Python frames as well as C++ ones "
                        "(contents ['stack'])")
    elif stacks == "python":
        report.mapped(f"{base}.stacks", "contents [] (Python frames)")
    else:
        raise ConfigError(f"{base}.stacks", stacks, one_of(("python", "cpp", "all")))
    if mem.get("kw_args"):
        report.note(f"{base}.kw_args", dict(mem["kw_args"]), "extra keywords for torch's "
                    "_record_memory_history are not passed by profctx")
    elif "kw_args" in mem:
        report.mapped(f"{base}.kw_args", "empty; nothing to carry")
    for path, block in ((base, mem), (role_base, tc)):
        value = block.get("memory_snapshot_num_steps", 1)
        if "memory_snapshot_num_steps" in block:
            if value == 1:
                report.mapped(f"{path}.memory_snapshot_num_steps", "one snapshot per capture (profctx's rule)")
            else:
                report.note(f"{path}.memory_snapshot_num_steps", value, "profctx writes one snapshot per "
                            "capture; use profile_continuous_steps (contiguous) to span consecutive steps")
    return contents, options


def _schedule(report: Report, role: Role, tc: Mapping[str, Any]) -> None:
    path = f"{role.field('tool_config')}.torch.schedule"
    schedule = tc.get("schedule")
    if schedule is None:
        return
    sched = as_mapping(path, schedule)
    for key in ("skip_first", "wait", "warmup", "active", "repeat"):
        value = sched.get(key, 0)
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ConfigError(f"{path}.{key}", value, "an integer >= 0")
    if sched.get("active", 0) > 0:
        report.note(path, {k: v for k, v in sched.items() if k != "_target_"},
                    "profctx captures whole steps or role blocks: there is no sub-sampling of update "
                    "mini-batches, so the whole update is recorded (a larger trace)")
    else:
        for key in sched:
            report.mapped(f"{path}.{key}", "schedule off (active <= 0): the whole update, as in profctx")
