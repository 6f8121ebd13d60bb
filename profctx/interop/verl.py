"""Convert verl's profiler configuration into a profctx config, and report what does not carry over.

verl keeps its profiler settings in two levels (``global_profiler`` in ``ppo_trainer.yaml`` and a
``profiler:`` block per role with ``tool_config.<tool>``); profctx has one config with one rank
selection, one role filter and one mode. :func:`convert` maps every verl field onto profctx's
fields or reports it in :attr:`Conversion.notes` with a one-line reason; nothing is dropped
silently. The verl shapes read are those of verl 0.8 (January 2026) and 0.9 (0.9.0, 0.9.1 and
the 0.10 development line; see ``docs/migrating-from-verl.md``), tested against verl 0.9.1's own
configs.

Role names: verl enables profiling per worker role; profctx filters by the role names given to
``profile_step(role=...)`` / ``@profiled(role=...)``. The conversion uses the stage names verl's
workers annotate, per verl version (``STAGES``; from 0.8: actor -> ``actor_compute_log_prob``,
``actor_update`` and the reference model's ``ref_compute_log_prob``, which runs in the actor's
worker; critic -> ``train_batch``), and ``rollout`` for the attached engines (vLLM, SGLang).
verl's SFT trainer config (a top-level ``profiler`` block and ``trainer.profile_interval``) is
read too.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..core._config import ProfilerConfig
from ..core._window import StepWindow
from ..util._log import warn_once
from ._verl_engines import engine_settings
from ._verl_input import plain
from ._verl_options import CONTENTS, NPU_LEVELS, NSYS_OWNED, SGLANG_SWITCHES, tool_settings
from ._verl_report import Conversion, Note, Report
from ._verl_roles import (
    ROLE_PATHS,
    drop_unknown,
    fuse_ref,
    locate,
    note_whole_step_workers,
    rank_selection,
    read_role,
    role_filter,
    sft_interval,
    stage_patterns,
)
from ._verl_settings import DEFAULT_SAVE_PATH, account_hooks, capture_mode, contiguous_steps, resolve_save_path
from ._verl_stages import STAGES, VERSIONS, resolve_version
from ._verl_tool import (
    KNOWN_TOOL_FIELDS,
    TOOLS,
    UNSUPPORTED_TOOLS,
    global_leftovers,
    note_memory_history,
    resolve_tool,
    tool_config,
)
from ._verl_types import check_block

__all__ = [
    "CONTENTS",
    "DEFAULT_SAVE_PATH",
    "KNOWN_TOOL_FIELDS",
    "NPU_LEVELS",
    "NSYS_OWNED",
    "ROLE_PATHS",
    "STAGES",
    "SGLANG_SWITCHES",
    "TOOLS",
    "UNSUPPORTED_TOOLS",
    "VERSIONS",
    "Conversion",
    "Note",
    "convert",
    "from_verl",
    "stage_patterns",
]


def convert(cfg: object, verl_version: str | None = None) -> Conversion:
    """Return the profctx config equivalent to verl config ``cfg`` and the report of what differs.

    ``cfg`` is a whole verl trainer config (PPO or SFT) or just its profiler parts
    (``global_profiler`` and/or role blocks ``actor``/``ref``/``critic``/``reward_model``/
    ``rollout``, or one ``profiler`` block), as a mapping, an OmegaConf ``DictConfig``, verl's
    ``ProfilerConfig`` dataclass (or a mapping holding them) or a path to a YAML file.
    OmegaConf interpolations (``${oc.select:...}``) are resolved. ``verl_version`` picks the
    stage names (:data:`STAGES`); by default the installed verl's, else the newest known.
    Raise :class:`ConfigError` naming the verl field path for invalid verl input.
    """
    return _convert(plain(cfg), resolve_version(verl_version))


def from_verl(cfg: object, verl_version: str | None = None) -> ProfilerConfig:
    """Return just the profctx config for ``cfg`` (see :func:`convert`); log the notes once."""
    conversion = convert(cfg, verl_version)
    if conversion.notes:
        text = conversion.report()
        warn_once(f"verl-conversion:{text}", "profctx: verl profiler config converted with differences:\n%s", text)
    return conversion.config


def _convert(data: Mapping[str, Any], version: str) -> Conversion:
    # The order of the steps below is the order of the report's fields and notes.
    report = Report()
    glob_entry, roles = locate(data)
    sft = len(roles) == 1 and roles[0].name == "sft"
    gpath, g = glob_entry if glob_entry is not None else ("global_profiler", {})
    if glob_entry is not None:
        report.blocks[gpath] = g
        check_block(gpath, g)
    for role in roles:
        check_block(role.path, role.block)
        report.blocks[role.path] = role.block
        read_role(report, role, g)
    roles = drop_unknown(report, fuse_ref(report, roles), version)

    if sft:
        steps = StepWindow.parse(sft_interval(report, data), field="trainer.profile_interval")
    else:
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
    if tool == "torch_memory":
        note_memory_history(report, gpath, g, roles)
    primary = training[0] if training else rollout
    primary_config = tool_config(primary, tool) if primary is not None else {}

    enable = bool(steps) and tool is not None and (bool(enabled) or no_blocks)
    steps_path = "trainer.profile_interval" if sft else f"{gpath}.steps"
    if not steps:
        if enabled:
            names = ", ".join(r.field("enable") for r in enabled)
            report.note(steps_path, None if not sft else data["trainer"].get("profile_interval"),
                        f"{names} set but no step is listed: verl profiles nothing, so the profctx config "
                        "is disabled (enable=False); list the steps to profile")
        else:
            report.mapped(steps_path, "enable=False (verl profiles nothing without steps)")
    elif tool is not None and roles and not enabled:
        report.note(f"{roles[0].field('enable')}", False, "no role has profiler.enable set: verl profiles "
                    "nothing, so the profctx config is disabled (enable=False)")

    mode = capture_mode(report, gpath, g, tool, training or ([rollout] if rollout else []))
    # verl's SFT trainer starts once and stops once over its interval: one capture over the run.
    contiguous = (mode == "step") if sft else contiguous_steps(report, gpath, g, mode)
    if enable and mode == "step":
        note_whole_step_workers(report, roles, data)
    ranks, groups = rank_selection(report, training)
    patterns = role_filter(roles, enabled, version)
    if sft and mode == "role":
        patterns = STAGES[version]["sft"]  # discrete SFT: one capture per annotated train_batch call
    save_path = resolve_save_path(report, gpath, g, roles)
    account_hooks(report, gpath, g, roles)
    global_leftovers(report, gpath, g, tool)
    contents, options = tool_settings(report, gpath, g, tool, primary, primary_config, training, groups)
    for entry in groups.values():
        entry.setdefault("ranks", ranks)
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
        groups=groups,
        profile_driver=True,  # processes in no group (workers not registered): the union of the ranks
        save_path=save_path,
        tool=tool or "torch",
        contents=contents,
        engines=engines,  # type: ignore[arg-type]  # a mapping; ProfilerConfig builds the EngineConfig
        tool_options=options,
    )
    return report.conversion(config)

