"""Map the settings profctx holds once per run: capture mode, contiguous steps, save path; account for finish hooks.

verl sets these per role or globally; where enabled roles disagree, one value is used for all
roles and the others are noted.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Final

from ..core._vocab import Mode
from ..util._errors import ConfigError
from ._verl_input import as_flag, as_mapping
from ._verl_report import Report, instead
from ._verl_roles import Role
from ._verl_tool import tool_config

#: The verl default of ``save_path``.
DEFAULT_SAVE_PATH: Final = "outputs/profile"


def capture_mode(
    report: Report, gpath: str, g: Mapping[str, Any], tool: str | None, roles: list[Role]
) -> Mode:
    """Return profctx's ``mode``: ``'role'`` when any of ``roles`` is discrete in verl, else ``'step'``.

    ``roles`` are the enabled training roles, else the enabled rollout role; with none, nsys's
    global ``discrete`` decides.
    """
    gnsys = _global_nsys(gpath, g)
    if tool == "nsys" and "discrete" in gnsys:
        report.mapped(f"{gpath}.global_tool_config.nsys.discrete", "mode (the roles' nsys discrete default)")
    if tool is None or tool == "torch_memory":
        return "step"
    if not roles:
        return "role" if tool == "nsys" and gnsys.get("discrete") is True else "step"
    flags = {r.name: _discrete(report, r, tool, g, gpath) for r in roles if r.name != "rollout" or len(roles) == 1}
    mode: Mode = "role" if any(flags.values()) else "step"
    for role in roles:
        if role.name in flags and flags[role.name] != (mode == "role"):
            chosen = next(n for n, f in flags.items() if f)
            report.note(f"{role.field('tool_config')}.{tool}.discrete", False,
                        f"profctx has one mode for all roles: mode='role' because {chosen} is discrete, so "
                        "this role is captured per role block too, not as part of a whole-step trace; "
                        f"{instead('mode')}")
    return mode


def contiguous_steps(report: Report, gpath: str, g: Mapping[str, Any], mode: str) -> bool:
    """Return profctx's ``contiguous`` from ``profile_continuous_steps`` (ignored outside step mode, as in verl)."""
    path = f"{gpath}.profile_continuous_steps"
    value = as_flag(path, g.get("profile_continuous_steps", False))
    if value and mode != "step":
        report.note(path, True, "ignored with discrete roles, in verl too (its start/stop toggles do nothing "
                    "there); profctx's role mode captures each role block")
        return False
    report.mapped(path, "contiguous")
    return value


def resolve_save_path(report: Report, gpath: str, g: Mapping[str, Any], roles: list[Role]) -> str:
    """Return profctx's ``save_path``: the global one, else the first enabled role's, else verl's default.

    Raise :class:`ConfigError` for an empty or non-string path.
    """
    path = g.get("save_path")
    source = f"{gpath}.save_path"
    if path is None:
        role = next((r for r in roles if r.enable and r.block.get("save_path")), None)
        if role is not None:
            path, source = role.block["save_path"], role.field("save_path")
    if path is None:
        path = DEFAULT_SAVE_PATH
    if not isinstance(path, str) or not path.strip():
        raise ConfigError(source, path, "a non-empty folder path")
    report.mapped(source, "save_path")
    for role in roles:
        if "save_path" not in role.block:
            continue
        if role.block["save_path"] == path or not role.enable:
            report.mapped(role.field("save_path"), "save_path")
        else:
            report.note(role.field("save_path"), role.block["save_path"],
                        f"profctx has one save_path: {path!r} is used (captures are filed by step and role below "
                        f"it); {instead('save_path')}")
    return path


def account_hooks(report: Report, gpath: str, g: Mapping[str, Any], roles: list[Role]) -> None:
    """Account for verl's result relocation and finish hooks, which profctx has no equivalent of."""
    reasons: dict[str, tuple[object, str]] = {
        "relocate_results": (False, "not needed: profctx writes every capture, engine traces included, under "
                             "save_path; nsys reports go where profctx's emitted nsys options say"),
        "finish_hook_cmd": (None, "profctx runs no shell hook; run the command after training (the manifest, "
                            "`profctx ls`, lists every file written)"),
        "finish_hook_all_ranks": (False, "only selects where verl's finish hook runs; profctx has none"),
        "finish_hook_ranks": ([], "only selects where verl's finish hook runs; profctx has none"),
    }
    for key, (default, reason) in reasons.items():
        value = g.get(key, default)
        if key in g:
            if value == default or (key == "finish_hook_ranks" and not value):
                report.mapped(f"{gpath}.{key}", "verl's default; nothing to carry")
            else:
                report.note(f"{gpath}.{key}", value, reason)
        for role in roles:
            if key not in role.block:
                continue
            own = role.block[key]
            if own in (value, default) or (key == "finish_hook_ranks" and not own):
                report.mapped(role.field(key), f"same as {gpath}.{key}" if own == value else "verl's default")
            else:
                report.note(role.field(key), own, reason)


def _discrete(report: Report, role: Role, tool: str, g: Mapping[str, Any], gpath: str) -> bool:
    tc = tool_config(role, tool)
    path = f"{role.field('tool_config')}.{tool}.discrete"
    if "discrete" in tc:
        report.mapped(path, "mode ('role' when true, 'step' when false)")
        return as_flag(path, tc["discrete"])
    if tool == "nsys":
        nsys = _global_nsys(gpath, g)
        if "discrete" in nsys:
            return as_flag(f"{gpath}.global_tool_config.nsys.discrete", nsys["discrete"])
    return False


def _global_nsys(gpath: str, g: Mapping[str, Any]) -> Mapping[str, Any]:
    return as_mapping(f"{gpath}.global_tool_config.nsys", (g.get("global_tool_config") or {}).get("nsys") or {})
