"""Find verl's per-role profiler blocks, and map their role and rank selection onto profctx's.

verl enables profiling and picks ranks per worker role; profctx has one role filter (patterns
of the names given to ``profile_step(role=...)``) and one rank selection for all roles.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

from .._errors import ConfigError
from ._verl_input import as_flag, as_mapping
from ._verl_report import Report

#: verl role -> where its ``profiler`` block sits in the trainer config.
ROLE_PATHS: Final[Mapping[str, tuple[str, ...]]] = {
    "actor": ("actor_rollout_ref", "actor", "profiler"),
    "ref": ("actor_rollout_ref", "ref", "profiler"),
    "critic": ("critic", "profiler"),
    "reward_model": ("reward_model", "profiler"),
    "rollout": ("actor_rollout_ref", "rollout", "profiler"),
}
#: verl role -> the profctx role patterns it becomes (see ``profctx.interop.verl``).
ROLE_PATTERNS: Final[Mapping[str, tuple[str, ...]]] = {
    "actor": ("actor_*",),
    "ref": ("ref_*",),
    "critic": ("critic_*", "compute_values"),
    "reward_model": ("reward_*", "compute_rm_score"),
    "rollout": ("rollout", "rollout_*"),
}

_ORDER: Final = ("actor", "critic", "ref", "reward_model", "rollout")


@dataclass
class Role:
    """One verl role's profiler block; :func:`read_role` fills in what the block selects."""

    name: str  # "" for a lone profiler block whose role is not known
    path: str
    block: Mapping[str, Any]
    enable: bool = False
    all_ranks: bool = False
    ranks: tuple[int, ...] = ()
    tool: str | None = None

    def field(self, key: str) -> str:
        """Return the verl path of ``key`` in this block."""
        return f"{self.path}.{key}"

    @property
    def selection(self) -> tuple[int, ...] | str:
        """verl's rule: all_ranks, else the listed ranks, else rank 0."""
        return "all" if self.all_ranks else (self.ranks or (0,))


def locate(data: Mapping[str, Any]) -> tuple[tuple[str, Mapping[str, Any]] | None, list[Role]]:
    """Return the global profiler block (its path and contents, or ``None``) and the role blocks in ``data``.

    Raise :class:`ConfigError` when ``data`` has neither the shape of a trainer config, of
    role blocks, of a ``global_profiler`` block, nor of a single profiler block.
    """
    roles: list[Role] = []
    trainer_keys = {"global_profiler", "actor_rollout_ref", "critic", "reward_model"}
    if trainer_keys & data.keys():
        glob = ("global_profiler", as_mapping("global_profiler", data.get("global_profiler") or {}))
        for role in _ORDER:
            node: Any = data
            for key in ROLE_PATHS[role]:
                node = node.get(key) if isinstance(node, Mapping) else None
            path = ".".join(ROLE_PATHS[role])
            if node is not None:
                roles.append(Role(role, path, as_mapping(path, node)))
            elif isinstance(data.get(role), Mapping) and _looks_like_block(data[role]):
                roles.append(_short_role(role, data[role]))  # the profiler parts alone
        return glob, roles
    if any(role in data for role in _ORDER):
        for role in _ORDER:
            if role in data:
                roles.append(_short_role(role, data[role]))
        return None, roles
    if data.keys() & {"steps", "profile_continuous_steps", "global_tool_config"}:
        return ("global_profiler", data), []
    if _looks_like_block(data):
        return None, [Role("", "profiler", data)]
    raise ConfigError(
        "verl", sorted(data), "a verl trainer config (with global_profiler and role profiler blocks), "
        "a global_profiler block, or a role's profiler block"
    )


def read_role(report: Report, role: Role, g: Mapping[str, Any]) -> None:
    """Fill in ``role``'s enable flag, rank selection and tool (``g`` is the global block, for the tool)."""
    b = role.block
    role.enable = as_flag(role.field("enable"), b.get("enable", False))
    role.all_ranks = as_flag(role.field("all_ranks"), b.get("all_ranks", False))
    role.ranks = _rank_list(role.field("ranks"), b.get("ranks"))
    tool = b.get("tool", g.get("tool"))
    role.tool = None if tool is None else str(tool)
    what = "roles (profctx role filter)" if role.name else "enable"
    report.mapped(role.field("enable"), what)
    report.mark(role.path, b, "_target_", "Hydra target; nothing to carry")
    tool_config = b.get("tool_config")
    if tool_config is not None:
        as_mapping(role.field("tool_config"), tool_config)


def rank_selection(report: Report, training: list[Role]) -> tuple[int, ...] | Literal["all"]:
    """Return profctx's ``ranks``: the union of the enabled training roles' selections."""
    if not training:
        return (0,)
    if any(r.all_ranks for r in training):
        union: tuple[int, ...] | Literal["all"] = "all"
    else:
        union = tuple(sorted({rank for r in training for rank in (r.ranks or (0,))}))
    for role in training:
        report.mapped(role.field("all_ranks"), "ranks ('all')")
        report.mapped(role.field("ranks"), "ranks (verl's rule: empty means rank 0)")
        if role.selection != union:
            key = "all_ranks" if role.all_ranks or union == "all" else "ranks"
            value = role.all_ranks if key == "all_ranks" else list(role.ranks)
            shown = "all ranks" if union == "all" else f"ranks {list(union)}"
            report.note(role.field(key), value, f"profctx has one rank selection for all roles: the union of "
                        f"the enabled roles' ranks ({shown}) is used, so this role is profiled there too")
    return union


def role_filter(roles: list[Role], enabled: list[Role]) -> tuple[str, ...]:
    """Return profctx's ``roles`` patterns: none when every named role is enabled."""
    named = [r for r in roles if r.name]
    if not named or all(r.enable for r in named):
        return ()
    return tuple(p for r in sorted(enabled, key=lambda r: _ORDER.index(r.name)) for p in ROLE_PATTERNS[r.name])


def _short_role(role: str, node: object) -> Role:
    block = as_mapping(role, node)
    if "profiler" in block and isinstance(block["profiler"], Mapping):
        return Role(role, f"{role}.profiler", as_mapping(f"{role}.profiler", block["profiler"]))
    return Role(role, role, block)


def _looks_like_block(data: Mapping[str, Any]) -> bool:
    return bool(data.keys() & {"tool_config", "enable", "all_ranks", "ranks"}) or isinstance(
        data.get("profiler"), Mapping)


def _rank_list(path: str, value: object) -> tuple[int, ...]:
    if value is None:
        return ()
    if not isinstance(value, (list, tuple)):
        raise ConfigError(path, value, "a list of ranks (integers >= 0), [] meaning rank 0")
    for item in value:
        if isinstance(item, bool) or not isinstance(item, int) or item < 0:
            raise ConfigError(path, value, "a list of ranks (integers >= 0), [] meaning rank 0")
    return tuple(sorted(set(value)))
