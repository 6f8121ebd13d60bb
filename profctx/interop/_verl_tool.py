"""Choose the one verl tool profctx runs, and account for the fields of every tool block.

verl picks a tool per role (``global_profiler.tool`` as the default); profctx runs one tool per
process, so the global tool, else the first enabled role's, is used for every role.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from ..util._errors import ConfigError, one_of
from ._verl_input import as_mapping
from ._verl_report import Report, instead, leaves
from ._verl_roles import Role

#: verl tools profctx has a backend for.
TOOLS: Final = ("torch", "npu", "nsys", "torch_memory")
#: verl tools with no profctx equivalent, and why.
UNSUPPORTED_TOOLS: Final[Mapping[str, str]] = {
    "precision_debugger": "msprobe numerics dumps are not performance traces; profctx has no equivalent, "
    "keep verl's profiler for them",
    "memray": "profctx has no memray backend; use tool 'torch_memory' for CUDA memory",
}
#: Fields of verl's tool blocks, per tool (both shapes).
KNOWN_TOOL_FIELDS: Final[Mapping[str, tuple[str, ...]]] = {
    "torch": ("contents", "discrete", "schedule"),
    "npu": ("contents", "discrete", "level", "analysis"),
    "nsys": ("discrete",),
    "torch_memory": ("trace_alloc_max_entries", "stack_depth", "memory_snapshot_num_steps"),
}


def resolve_tool(
    report: Report, gpath: str, g: Mapping[str, Any], roles: list[Role], enabled: list[Role]
) -> str | None:
    """Return the verl tool to run, or ``None`` when verl's tool is null (a no-op profiler).

    Raise :class:`ConfigError` for a tool profctx has no backend for.
    """
    tool = g.get("tool")
    path = f"{gpath}.tool"
    if tool is None:
        chosen = next((r for r in enabled if r.tool is not None), None) or next(
            (r for r in roles if r.tool is not None), None
        )
        if chosen is not None:
            tool, path = chosen.tool, chosen.field("tool")
    if tool is None:
        if "tool" in g or any("tool" in r.block for r in roles):
            report.note(path, None, "tool is null: verl runs a no-op profiler, so the profctx config is disabled")
        return None
    tool = str(tool)
    if tool in UNSUPPORTED_TOOLS:
        raise ConfigError(path, tool, UNSUPPORTED_TOOLS[tool])
    if tool not in TOOLS:
        raise ConfigError(path, tool, f"a verl tool profctx can run: {one_of(TOOLS)}")
    report.mapped(path, "tool")
    for role in roles:
        if "tool" not in role.block:
            continue
        if role.tool == tool:
            report.mapped(role.field("tool"), "tool")
        elif role.enable:
            report.note(role.field("tool"), role.tool, f"profctx uses one tool per process: {tool!r} is used "
                        f"for this role too; {instead('tool')}")
        else:
            report.mapped(role.field("tool"), "unused: the role is not enabled")
    return tool


def note_memory_history(report: Report, gpath: str, g: Mapping[str, Any], roles: list[Role]) -> None:
    """Note what verl's torch_memory tool does beyond captures, and the profctx call that does the same."""
    path = f"{gpath}.tool" if g.get("tool") == "torch_memory" else next(
        (r.field("tool") for r in roles if r.tool == "torch_memory"), f"{gpath}.tool")
    report.note(path, "torch_memory", "verl turns on CUDA memory history in every worker process built with this "
                "tool, whatever steps and enable say, and writes an allocator snapshot on out-of-memory on the "
                "ranks its blocks select (all_ranks, ranks, else rank 0); profctx records memory only inside "
                "captures: call profctx.backends.torch_memory.watch_oom(save_path) once in each worker for "
                "verl's always-on history and OOM snapshots")


def tool_config(role: Role, tool: str | None) -> Mapping[str, Any]:
    """Return ``role``'s ``tool_config.<tool>`` block (empty when absent or ``tool`` is ``None``)."""
    tc = role.block.get("tool_config") or {}
    if tool is None or tool not in tc:
        return {}
    return as_mapping(f"{role.field('tool_config')}.{tool}", tc[tool] or {})


def tool_leftovers(report: Report, role: Role, tool: str | None, unused: str | None = None) -> None:
    """Account for the keys of the role's tool blocks not read yet.

    ``unused`` is the reason for every remaining key of the used tool (a role whose
    settings do not apply); otherwise they were read from the primary role, one setting
    for all roles.
    """
    base = role.field("tool_config")
    all_tc = role.block.get("tool_config") or {}
    for name, block in all_tc.items():
        if not isinstance(block, Mapping):
            continue
        for key, value in block.items():
            path = f"{base}.{name}.{key}"
            if path in report.fields or any(f.startswith(path + ".") for f in report.fields):
                continue
            if key == "_target_":
                report.mapped(path, "Hydra target; nothing to carry")
            elif key == "name":
                report.mapped(path, "tool name tag; nothing to carry")
            elif name != tool:
                report.mapped(path, f"unused: the tool is {tool!r}, in verl too")
            elif unused is not None:
                report.mapped(path, unused)
            elif key in ("step_start", "step_end", "manual_save"):
                if (key, value) in (("step_start", 0), ("step_end", -1), ("step_end", None),
                                    ("manual_save", True), ("step_start", -1)):
                    report.mapped(path, "verl's default; nothing to carry")
                else:
                    report.note(path, value, "no effect on training roles in verl (January 2026: read only "
                                "for SGLang rollout); nothing to carry")
            elif key in ("profile_token_start", "profile_token_end"):
                if value is None:
                    report.mapped(path, "unset; nothing to carry")
                else:
                    report.note(path, value, "verl applies the token window to rollout engines only")
            elif key in KNOWN_TOOL_FIELDS.get(name, ()):
                report.mapped(path, "read from the first enabled role: one setting for all roles")


def global_leftovers(report: Report, gpath: str, g: Mapping[str, Any], tool: str | None) -> None:
    """Account for the global tool configs of tools other than the one used."""
    gtc = g.get("global_tool_config") or {}
    for name, block in gtc.items():
        if not isinstance(block, Mapping):
            continue
        for leaf, _ in leaves(f"{gpath}.global_tool_config.{name}", block):
            if name != tool:
                report.mapped(leaf, f"unused: the tool is {tool!r}, in verl too")
            elif leaf.endswith("._target_"):
                report.mapped(leaf, "Hydra target; nothing to carry")
