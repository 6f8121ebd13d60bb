"""Convert verl's profiler configuration into a profctx config, and report what does not carry over.

verl keeps its profiler settings in two levels (``global_profiler`` in ``ppo_trainer.yaml`` and a
``profiler:`` block per role with ``tool_config.<tool>``); profctx has one config with one rank
selection, one role filter and one mode. :func:`convert` maps every verl field onto profctx's
fields or reports it in :attr:`Conversion.notes` with a one-line reason; nothing is dropped
silently. The verl shapes read are those of January 2026 and August 2026 (see
``docs/migrating-from-verl.md``).

Role names: verl enables profiling per worker role; profctx filters by the role names given to
``profile_step(role=...)`` / ``@profiled(role=...)``. The conversion assumes verl's stage names
(or names with the same prefixes): actor -> ``actor_*``, ref -> ``ref_*``, critic -> ``critic_*``
and ``compute_values``, reward model -> ``reward_*`` and ``compute_rm_score``, rollout ->
``rollout`` and ``rollout_*`` plus the attached engines (vLLM, SGLang).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .._config import ProfilerConfig
from .._log import warn_once
from .._window import StepWindow
from ._verl_engines import engine_settings
from ._verl_input import plain
from ._verl_options import CONTENTS, NPU_LEVELS, NSYS_OWNED, SGLANG_SWITCHES, tool_settings
from ._verl_report import Conversion, Note, Report
from ._verl_roles import ROLE_PATHS, ROLE_PATTERNS, locate, rank_selection, read_role, role_filter
from ._verl_settings import DEFAULT_SAVE_PATH, account_hooks, capture_mode, contiguous_steps, resolve_save_path
from ._verl_tool import KNOWN_TOOL_FIELDS, TOOLS, UNSUPPORTED_TOOLS, global_leftovers, resolve_tool, tool_config

__all__ = [
    "CONTENTS",
    "DEFAULT_SAVE_PATH",
    "KNOWN_TOOL_FIELDS",
    "NPU_LEVELS",
    "NSYS_OWNED",
    "ROLE_PATHS",
    "ROLE_PATTERNS",
    "SGLANG_SWITCHES",
    "TOOLS",
    "UNSUPPORTED_TOOLS",
    "Conversion",
    "Note",
    "convert",
    "from_verl",
]


def convert(cfg: object) -> Conversion:
    """Return the profctx config equivalent to verl config ``cfg`` and the report of what differs.

    ``cfg`` is a whole verl trainer config or just its profiler parts (``global_profiler``
    and/or role blocks ``actor``/``ref``/``critic``/``reward_model``/``rollout``, or one
    ``profiler`` block), as a mapping, an OmegaConf ``DictConfig`` or a path to a YAML file.
    OmegaConf interpolations (``${oc.select:...}``) are resolved. Raise :class:`ConfigError`
    naming the verl field path for invalid verl input.
    """
    return _convert(plain(cfg))


def from_verl(cfg: object) -> ProfilerConfig:
    """Return just the profctx config for ``cfg`` (see :func:`convert`); log the notes once."""
    conversion = convert(cfg)
    if conversion.notes:
        text = conversion.report()
        warn_once(f"verl-conversion:{text}", "profctx: verl profiler config converted with differences:\n%s", text)
    return conversion.config


def _convert(data: Mapping[str, Any]) -> Conversion:
    # The order of the steps below is the order of the report's fields and notes.
    report = Report()
    glob_entry, roles = locate(data)
    gpath, g = glob_entry if glob_entry is not None else ("global_profiler", {})
    if glob_entry is not None:
        report.blocks[gpath] = g
    for role in roles:
        report.blocks[role.path] = role.block
        read_role(report, role, g)

    steps = StepWindow.parse([] if g.get("steps") is None else g.get("steps"), field=f"{gpath}.steps")
    report.mapped(f"{gpath}.steps", "steps")
    report.mark(gpath, g, "_target_", "Hydra target; nothing to carry")

    no_blocks = not roles
    if no_blocks and glob_entry is not None:
        report.note(gpath, "(no role blocks)", "no per-role profiler block given: every role is profiled on "
                    "rank 0 (verl's default ranks) and no engine is driven; pass the role blocks to narrow this")
    enabled = [r for r in roles if r.enable]
    training = [r for r in enabled if r.name != "rollout"]
    rollout = next((r for r in enabled if r.name == "rollout"), None)

    tool = resolve_tool(report, gpath, g, roles, enabled)
    primary = training[0] if training else rollout
    primary_config = tool_config(primary, tool) if primary is not None else {}

    enable = bool(steps) and tool is not None and (bool(enabled) or no_blocks)
    if not steps:
        report.mapped(f"{gpath}.steps", "enable=False (verl profiles nothing without steps)")
    elif tool is not None and roles and not enabled:
        report.note(f"{roles[0].field('enable')}", False, "no role has profiler.enable set: verl profiles "
                    "nothing, so the profctx config is disabled (enable=False)")

    mode = capture_mode(report, gpath, g, tool, training or ([rollout] if rollout else []))
    contiguous = contiguous_steps(report, gpath, g, mode)
    ranks = rank_selection(report, training)
    patterns = role_filter(roles, enabled)
    save_path = resolve_save_path(report, gpath, g, roles)
    account_hooks(report, gpath, g, roles)
    global_leftovers(report, gpath, g, tool)
    contents, options = tool_settings(report, gpath, g, tool, primary, primary_config, training)
    engines = engine_settings(report, data, tool, rollout, roles)
    for role in roles:
        if not enable or not role.enable:
            report.unused(role.path, role.block, "unused: profiling is off" if not enable else
                          "unused: the role is not enabled (verl profiles nothing for it)")
    if not enable:
        report.unused(gpath, g, "unused: profiling is off")
    report.sweep()
    config = ProfilerConfig(
        enable=enable,
        steps=steps if steps else None,
        mode=mode,
        contiguous=contiguous,
        roles=patterns,
        ranks=ranks,
        save_path=save_path,
        tool=tool or "torch",
        contents=contents,
        engines=engines,  # type: ignore[arg-type]  # a mapping; ProfilerConfig builds the EngineConfig
        tool_options=options,
    )
    return report.conversion(config)
