"""Find verl's per-role profiler blocks, and map their role and rank selection onto profctx's.

verl enables profiling and picks ranks per worker role; profctx has one role filter (patterns
of the names given to ``profile_step(role=...)``) and one rank selection for all roles.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final, Literal

from ..util._errors import ConfigError
from ._verl_input import as_flag, as_mapping
from ._verl_report import Report, leaves
from ._verl_stages import LATEST, ROLLOUT_ROLE, STAGES

#: verl role -> where its ``profiler`` block sits in the trainer config.
ROLE_PATHS: Final[Mapping[str, tuple[str, ...]]] = {
    "actor": ("actor_rollout_ref", "actor", "profiler"),
    "ref": ("actor_rollout_ref", "ref", "profiler"),
    "critic": ("critic", "profiler"),
    "reward_model": ("reward_model", "profiler"),
    "rollout": ("actor_rollout_ref", "rollout", "profiler"),
}
_ORDER: Final = ("actor", "critic", "ref", "reward_model", "rollout", "sft")
#: Trainer-config sections that are role blocks only when they hold a ``profiler`` mapping
#: (0.8 and later: a top-level ``reward_model:`` is a legacy reward section with ``enable: null``).
_SECTIONS: Final = ("actor", "critic", "ref", "reward_model", "rollout")


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
    #: Whether the role runs inside another role's worker and follows that role's block (the
    #: reference model inside the actor's worker in verl's hybrid setup).
    fused: bool = False

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
    if isinstance(data.get("profiler"), Mapping) and "trainer" in data and "global_profiler" not in data:
        return None, [Role("sft", "profiler", as_mapping("profiler", data["profiler"]))]  # SFT trainer config
    trainer_keys = {"global_profiler", "actor_rollout_ref", "critic", "reward_model"}
    if trainer_keys & data.keys():
        glob = ("global_profiler", as_mapping("global_profiler", data.get("global_profiler") or {}))
        for role in _SECTIONS:
            node: Any = data
            for key in ROLE_PATHS[role]:
                node = node.get(key) if isinstance(node, Mapping) else None
            path = ".".join(ROLE_PATHS[role])
            if node is not None:
                roles.append(Role(role, path, as_mapping(path, node)))
            elif isinstance(data.get(role), Mapping) and _short_block(role, data[role]):
                roles.append(_short_role(role, data[role]))  # the profiler parts alone
        return glob, roles
    if any(role in data for role in _SECTIONS):
        for role in _SECTIONS:
            if role in data:
                roles.append(_short_role(role, data[role]))
        return None, roles
    if data.keys() & {"steps", "profile_continuous_steps"} or (
        "global_tool_config" in data and not data.keys() & {"enable", "all_ranks", "ranks", "tool_config"}
    ):
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


def rank_selection(report: Report, training: list[Role]) -> tuple[tuple[int, ...] | Literal["all"], dict[str, Any]]:
    """Return profctx's ``ranks`` (the union of the enabled training roles' selections) and per-role groups.

    When the enabled roles select different ranks, each becomes the worker group of its name
    with its own ranks (``groups``); the union stays for processes in no group.
    """
    if not training:
        return (0,), {}
    if any(r.all_ranks for r in training):
        union: tuple[int, ...] | Literal["all"] = "all"
    else:
        union = tuple(sorted({rank for r in training for rank in (r.ranks or (0,))}))
    differ = any(role.selection != union for role in training)
    groups: dict[str, Any] = {}
    for role in training:
        report.mapped(role.field("all_ranks"), "ranks ('all')")
        report.mapped(role.field("ranks"), "ranks (verl's rule: empty means rank 0)")
        if differ and role.name:
            groups[role.name] = {"ranks": role.selection}
        if role.selection != union:
            key = "all_ranks" if role.all_ranks or union == "all" else "ranks"
            value = role.all_ranks if key == "all_ranks" else list(role.ranks)
            shown = "all ranks" if union == "all" else f"ranks {list(union)}"
            report.note(role.field(key), value, f"kept per role as groups.{role.name}.ranks: register this role's "
                        f"workers with profctx.ray.group({role.name!r}, <its worker group>.workers); processes "
                        f"in no group use the union of the roles' ranks ({shown})")
    return union, groups


def role_filter(roles: list[Role], enabled: list[Role], version: str) -> tuple[str, ...]:
    """Return profctx's ``roles`` patterns: the stages of the enabled roles, none when every named role is enabled.

    The actor's stages include the reference model's, which runs inside the actor's worker
    in verl's hybrid setup; ``version`` picks the stage names (see ``_verl_stages``).
    """
    named = [r for r in roles if r.name and not r.fused]
    if not named or all(r.enable for r in named):
        return ()
    out: list[str] = []
    for role in sorted(enabled, key=lambda r: _ORDER.index(r.name)):
        out.extend(stage_patterns(role.name, version))
    return tuple(dict.fromkeys(out))


def stage_patterns(role: str, version: str) -> tuple[str, ...]:
    """Return the profctx role names verl ``role`` profiles in ``version`` (the actor's include the ref stage)."""
    if role == "rollout":
        return (ROLLOUT_ROLE,)
    stages = STAGES[version].get(role, ())
    if role == "actor":
        stages = (*stages, *STAGES[version]["ref"])
    return stages


def fuse_ref(report: Report, roles: list[Role]) -> list[Role]:
    """Fold the ref block into the actor's and return the roles left to convert.

    In verl's hybrid setup (its default) the reference model runs inside the actor's worker,
    whose one profiler is built from ``actor.profiler``: the ref stage is profiled exactly
    when and where the actor is, and every field of ``ref.profiler`` is ignored. Each ref
    field that differs from the actor's is noted; the others are recorded as following it.
    """
    actor = next((r for r in roles if r.name == "actor"), None)
    ref = next((r for r in roles if r.name == "ref"), None)
    if actor is None or ref is None:
        return roles
    ref.fused = True
    why = ("ignored by verl: the reference model runs inside the actor's worker (hybrid "
           "ActorRolloutRefWorker), whose profiler is built from actor.profiler; the ref stage is "
           f"profiled as the actor is (enable={actor.enable})")
    actor_leaves = dict(leaves(actor.path, actor.block))
    for leaf, value in leaves(ref.path, ref.block):
        twin = actor.path + leaf[len(ref.path):]
        if leaf.endswith("._target_"):
            report.mapped(leaf, "Hydra target; nothing to carry")
        elif leaf == ref.field("enable"):
            if ref.enable == actor.enable:
                report.mapped(leaf, "follows actor.profiler.enable (the ref stage runs in the actor's worker)")
            else:
                report.note(leaf, value, why)
        elif not actor.enable or actor_leaves.get(twin, value) == value or _is_default(leaf, value):
            report.mapped(leaf, "follows actor.profiler (the ref stage runs in the actor's worker)")
        else:
            report.note(leaf, value, why)
    return [r for r in roles if r is not ref]


#: verl's defaults for the fields of a role block (profiler.yaml): a ref field left at its default
#: was not set by the user, so the actor's value it is overridden by is no surprise.
_DEFAULTS: Final[Mapping[str, object]] = {"all_ranks": False, "ranks": [], "contents": [], "discrete": False}


def _is_default(leaf: str, value: object) -> bool:
    key = leaf.rsplit(".", 1)[-1]
    return key in _DEFAULTS and _DEFAULTS[key] == value


def note_whole_step_workers(report: Report, roles: list[Role], data: Mapping[str, Any]) -> None:
    """Note each disabled actor or critic whose worker verl starts: profctx's step mode captures it too.

    ``data`` is the whole verl config, read for whether the critic runs (``critic.enable``, else
    the GAE estimator, as verl decides).
    """
    for role in roles:
        if role.name in ("actor", "critic") and not role.enable and _has_worker(role.name, data):
            report.note(role.field("enable"), False, f"profctx's step mode captures whole steps in every process "
                        f"on the selected ranks, the {role.name}'s worker processes too, where verl profiles none "
                        f"of them; call profctx.configure(enable=False) in the {role.name}'s worker processes to "
                        "match")


def _has_worker(role: str, data: Mapping[str, Any]) -> bool:
    if role != "critic" or "algorithm" not in data:
        return True
    critic = data.get("critic")
    flag = critic.get("enable") if isinstance(critic, Mapping) else None
    if flag is not None:
        return bool(flag)
    algorithm = data.get("algorithm")
    return isinstance(algorithm, Mapping) and algorithm.get("adv_estimator") == "gae"


def drop_unknown(report: Report, roles: list[Role], version: str) -> list[Role]:
    """Return ``roles`` without the blocks verl ``version`` never reads, each accounted for.

    verl 0.8 and later have no reward-model profiler: the reward loop is not a profiled worker.
    """
    kept: list[Role] = []
    for role in roles:
        if not role.name or role.name == "rollout" or role.name in STAGES[version]:
            kept.append(role)
            continue
        reason = (f"verl {version}{' and later' if version == LATEST else ''} has no {role.name} profiler (no "
                  "worker reads this block); nothing to carry")
        if role.enable:
            report.note(role.field("enable"), True, reason)
        report.unused(role.path, role.block, reason)
    return kept


def sft_interval(report: Report, data: Mapping[str, Any]) -> list[int]:
    """Return the steps of verl's SFT ``trainer.profile_interval`` ``[start, end]`` (both included).

    verl's SFT trainer starts its profiler at step ``start`` and stops it after step ``end``:
    one capture over the run of steps. ``[-1, -1]`` (its default) profiles nothing. Raise
    :class:`ConfigError` for a value verl's trainer asserts against.
    """
    path = "trainer.profile_interval"
    trainer = as_mapping("trainer", data.get("trainer") or {})
    value = trainer.get("profile_interval", [-1, -1])
    allowed = "[start, end]: two integers with end >= start, or [-1, -1] for none (verl's SFT trainer)"
    if not isinstance(value, (list, tuple)) or len(value) != 2 or any(
        isinstance(v, bool) or not isinstance(v, int) for v in value
    ):
        raise ConfigError(path, value, allowed)
    start, end = value
    if end < start or (start < 0 and end >= 0):
        raise ConfigError(path, list(value), allowed)
    if start < 0:
        report.mapped(path, "steps none: verl's SFT trainer profiles nothing for [-1, -1]")
        return []
    if start == 0:
        report.note(path, list(value), "verl's SFT steps count from 1, so its profiler never starts at step 0 "
                    "and profiles nothing; profctx does the same (enable=False)")
        return []
    report.mapped(path, "steps (start..end, both included) with contiguous=True: one capture over the run")
    return list(range(start, end + 1))


def _short_role(role: str, node: object) -> Role:
    block = as_mapping(role, node)
    if "profiler" in block and isinstance(block["profiler"], Mapping):
        return Role(role, f"{role}.profiler", as_mapping(f"{role}.profiler", block["profiler"]))
    return Role(role, role, block)


def _short_block(role: str, block: Mapping[str, Any]) -> bool:
    # A trainer's top-level reward_model section (verl 0.8+: enable, model, reward_manager...) is
    # not a profiler block; only a profiler mapping or tool_config makes it one.
    if role == "reward_model":
        return isinstance(block.get("profiler"), Mapping) or "tool_config" in block
    return _looks_like_block(block)


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
