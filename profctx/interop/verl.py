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

import os
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final, Literal, final

from .._config import ProfilerConfig
from .._errors import ConfigError, one_of
from .._log import warn_once
from .._window import StepWindow

#: verl role -> where its ``profiler`` block sits in the trainer config.
ROLE_PATHS: Final[Mapping[str, tuple[str, ...]]] = {
    "actor": ("actor_rollout_ref", "actor", "profiler"),
    "ref": ("actor_rollout_ref", "ref", "profiler"),
    "critic": ("critic", "profiler"),
    "reward_model": ("reward_model", "profiler"),
    "rollout": ("actor_rollout_ref", "rollout", "profiler"),
}
#: verl role -> the profctx role patterns it becomes (see the module docstring).
ROLE_PATTERNS: Final[Mapping[str, tuple[str, ...]]] = {
    "actor": ("actor_*",),
    "ref": ("ref_*",),
    "critic": ("critic_*", "compute_values"),
    "reward_model": ("reward_*", "compute_rm_score"),
    "rollout": ("rollout", "rollout_*"),
}
#: verl tools profctx has a backend for.
TOOLS: Final = ("torch", "npu", "nsys", "torch_memory")
#: verl tools with no profctx equivalent, and why.
UNSUPPORTED_TOOLS: Final[Mapping[str, str]] = {
    "precision_debugger": "msprobe numerics dumps are not performance traces; profctx has no equivalent, "
    "keep verl's profiler for them",
    "memray": "profctx has no memray backend; use tool 'torch_memory' for CUDA memory",
}
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
#: Fields of verl's tool blocks, per tool (both shapes).
KNOWN_TOOL_FIELDS: Final[Mapping[str, tuple[str, ...]]] = {
    "torch": ("contents", "discrete", "schedule"),
    "npu": ("contents", "discrete", "level", "analysis"),
    "nsys": ("discrete",),
    "torch_memory": ("trace_alloc_max_entries", "stack_depth", "memory_snapshot_num_steps"),
}
#: The verl default of ``save_path``.
DEFAULT_SAVE_PATH: Final = "outputs/profile"

_ORDER: Final = ("actor", "critic", "ref", "reward_model", "rollout")


@final
@dataclass(frozen=True)
class Note:
    """A verl field whose meaning profctx does not reproduce exactly, and why."""

    field: str
    value: Any
    reason: str

    def __str__(self) -> str:
        return f"{self.field} = {self.value!r}: {self.reason}"


@final
@dataclass(frozen=True)
class Conversion:
    """The profctx config for a verl config, with a report of every verl field read.

    ``fields`` maps each verl field path read (``global_profiler.steps``,
    ``actor_rollout_ref.actor.profiler.ranks``, ...) to what became of it; ``notes`` lists
    the fields whose verl meaning is not reproduced exactly, each with its reason.
    """

    config: ProfilerConfig
    notes: tuple[Note, ...]
    fields: Mapping[str, str]

    def note(self, field: str) -> Note | None:
        """Return the note on verl field ``field`` (a dotted path), or ``None``."""
        return next((n for n in self.notes if n.field == field), None)

    def report(self) -> str:
        """Return the notes as text, one per line (empty when everything carried over)."""
        return "\n".join(str(n) for n in self.notes)


def convert(cfg: object) -> Conversion:
    """Return the profctx config equivalent to verl config ``cfg`` and the report of what differs.

    ``cfg`` is a whole verl trainer config or just its profiler parts (``global_profiler``
    and/or role blocks ``actor``/``ref``/``critic``/``reward_model``/``rollout``, or one
    ``profiler`` block), as a mapping, an OmegaConf ``DictConfig`` or a path to a YAML file.
    OmegaConf interpolations (``${oc.select:...}``) are resolved. Raise :class:`ConfigError`
    naming the verl field path for invalid verl input.
    """
    return _Converter(_plain(cfg)).run()


def from_verl(cfg: object) -> ProfilerConfig:
    """Return just the profctx config for ``cfg`` (see :func:`convert`); log the notes once."""
    conversion = convert(cfg)
    if conversion.notes:
        text = conversion.report()
        warn_once(f"verl-conversion:{text}", "profctx: verl profiler config converted with differences:\n%s", text)
    return conversion.config


# -- input ------------------------------------------------------------------------------------


def _plain(cfg: object) -> dict[str, Any]:
    if isinstance(cfg, (str, os.PathLike)):
        cfg = _read_yaml(Path(cfg))
    if type(cfg).__module__.startswith("omegaconf"):
        return _resolve(cfg)
    if isinstance(cfg, Mapping):
        data = {str(k): v for k, v in cfg.items()}
        return _resolve(data) if _has_interpolation(data) else data
    raise ConfigError("verl", cfg, "a verl config: a mapping, an OmegaConf DictConfig or a path to a YAML file")


def _read_yaml(path: Path) -> dict[str, Any]:
    import yaml

    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, yaml.YAMLError) as exc:
        raise ConfigError("verl", str(path), f"a readable verl YAML file ({exc})") from None
    if not isinstance(data, dict):
        raise ConfigError("verl", str(path), "a YAML mapping (a verl trainer config or its profiler blocks)")
    return data


def _has_interpolation(value: object) -> bool:
    if isinstance(value, str):
        return "${" in value
    if isinstance(value, Mapping):
        return any(_has_interpolation(v) for v in value.values())
    if isinstance(value, (list, tuple)):
        return any(_has_interpolation(v) for v in value)
    return False


def _resolve(cfg: object) -> dict[str, Any]:
    try:
        from omegaconf import OmegaConf
    except ImportError:  # pragma: no cover - depends on the environment
        raise ConfigError("verl", "${...}", "verl's interpolations need omegaconf: pip install 'profctx[omegaconf]'") \
            from None
    try:
        node = cfg if type(cfg).__module__.startswith("omegaconf") else OmegaConf.create(cfg)  # type: ignore[arg-type]
        container = OmegaConf.to_container(node, resolve=True)  # type: ignore[call-overload]
    except Exception as exc:  # noqa: BLE001 - omegaconf raises several unrelated types
        raise ConfigError("verl", type(cfg).__name__, f"a config whose interpolations resolve ({exc})") from None
    if not isinstance(container, dict):
        raise ConfigError("verl", container, "a mapping (a verl trainer config or its profiler blocks)")
    return {str(k): v for k, v in container.items()}


# -- conversion -------------------------------------------------------------------------------


@dataclass
class _Role:
    name: str
    path: str
    block: Mapping[str, Any]
    enable: bool = False
    all_ranks: bool = False
    ranks: tuple[int, ...] = ()
    tool: str | None = None

    def field(self, key: str) -> str:
        return f"{self.path}.{key}"

    @property
    def selection(self) -> tuple[int, ...] | str:
        """verl's rule: all_ranks, else the listed ranks, else rank 0."""
        return "all" if self.all_ranks else (self.ranks or (0,))


class _Converter:
    def __init__(self, data: dict[str, Any]) -> None:
        self.data = data
        self.fields: dict[str, str] = {}
        self.notes: list[Note] = []
        self.blocks: dict[str, tuple[str, Mapping[str, Any]]] = {}  # path -> block, for the final sweep

    # -- bookkeeping ---------------------------------------------------------------------------

    def mapped(self, path: str, what: str) -> None:
        self.fields.setdefault(path, what)

    def note(self, path: str, value: Any, reason: str) -> None:
        if path not in self.fields or not self.fields[path].startswith("not carried"):
            self.fields[path] = f"not carried: {reason}"
            self.notes.append(Note(path, value, reason))

    # -- shape -----------------------------------------------------------------------------------

    def locate(self) -> tuple[tuple[str, Mapping[str, Any]] | None, list[_Role]]:
        data = self.data
        roles: list[_Role] = []
        trainer_keys = {"global_profiler", "actor_rollout_ref", "critic", "reward_model"}
        if trainer_keys & data.keys():
            glob = ("global_profiler", _mapping("global_profiler", data.get("global_profiler") or {}))
            for role in _ORDER:
                node: Any = data
                for key in ROLE_PATHS[role]:
                    node = node.get(key) if isinstance(node, Mapping) else None
                path = ".".join(ROLE_PATHS[role])
                if node is not None:
                    roles.append(_Role(role, path, _mapping(path, node)))
                elif isinstance(data.get(role), Mapping) and _looks_like_block(data[role]):
                    roles.append(self._short_role(role, data[role]))  # the profiler parts alone
            return glob, roles
        if any(role in data for role in _ORDER):
            for role in _ORDER:
                if role in data:
                    roles.append(self._short_role(role, data[role]))
            return None, roles
        if data.keys() & {"steps", "profile_continuous_steps", "global_tool_config"}:
            return ("global_profiler", data), []
        if _looks_like_block(data):
            return None, [_Role("", "profiler", data)]
        raise ConfigError(
            "verl", sorted(data), "a verl trainer config (with global_profiler and role profiler blocks), "
            "a global_profiler block, or a role's profiler block"
        )

    def _short_role(self, role: str, node: object) -> _Role:
        block = _mapping(role, node)
        if "profiler" in block and isinstance(block["profiler"], Mapping):
            return _Role(role, f"{role}.profiler", _mapping(f"{role}.profiler", block["profiler"]))
        return _Role(role, role, block)

    # -- the mapping -----------------------------------------------------------------------------

    def run(self) -> Conversion:
        glob_entry, roles = self.locate()
        gpath, g = glob_entry if glob_entry is not None else ("global_profiler", {})
        if glob_entry is not None:
            self.blocks[gpath] = (gpath, g)
        for role in roles:
            self.blocks[role.path] = (role.path, role.block)
            self.read_role(role, g)

        steps = StepWindow.parse([] if g.get("steps") is None else g.get("steps"), field=f"{gpath}.steps")
        self.mapped(f"{gpath}.steps", "steps")
        self.mark(gpath, g, "_target_", "Hydra target; nothing to carry")

        no_blocks = not roles
        if no_blocks and glob_entry is not None:
            self.note(gpath, "(no role blocks)", "no per-role profiler block given: every role is profiled on "
                      "rank 0 (verl's default ranks) and no engine is driven; pass the role blocks to narrow this")
        enabled = [r for r in roles if r.enable]
        training = [r for r in enabled if r.name != "rollout"]
        rollout = next((r for r in enabled if r.name == "rollout"), None)

        tool = self.resolve_tool(gpath, g, roles, enabled)
        primary = training[0] if training else rollout
        tool_config = self.tool_config(primary, tool) if primary is not None else {}

        enable = bool(steps) and tool is not None and (bool(enabled) or no_blocks)
        if not steps:
            self.mapped(f"{gpath}.steps", "enable=False (verl profiles nothing without steps)")
        elif tool is not None and roles and not enabled:
            self.note(f"{roles[0].field('enable')}", False, "no role has profiler.enable set: verl profiles "
                      "nothing, so the profctx config is disabled (enable=False)")

        mode = self.mode(gpath, g, tool, training or ([rollout] if rollout else []))
        contiguous = self.contiguous(gpath, g, mode)
        ranks = self.ranks(training)
        patterns = self.patterns(roles, enabled)
        save_path = self.save_path(gpath, g, roles)
        self.hooks(gpath, g, roles)
        self.global_leftovers(gpath, g, tool)
        contents, options = self.tool_settings(gpath, g, tool, primary, tool_config, training)
        engines = self.engines(tool, rollout, roles)
        for role in roles:
            if not enable or not role.enable:
                self.unused(role.path, role.block, "unused: profiling is off" if not enable else
                            "unused: the role is not enabled (verl profiles nothing for it)")
        if not enable:
            self.unused(gpath, g, "unused: profiling is off")
        self.sweep()
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
        return Conversion(config, tuple(self.notes), dict(self.fields))

    def mark(self, path: str, block: Mapping[str, Any], key: str, what: str) -> None:
        if key in block:
            self.mapped(f"{path}.{key}", what)

    def read_role(self, role: _Role, g: Mapping[str, Any]) -> None:
        b = role.block
        role.enable = _flag(role.field("enable"), b.get("enable", False))
        role.all_ranks = _flag(role.field("all_ranks"), b.get("all_ranks", False))
        role.ranks = _ranks(role.field("ranks"), b.get("ranks"))
        tool = b.get("tool", g.get("tool"))
        role.tool = None if tool is None else str(tool)
        what = "roles (profctx role filter)" if role.name else "enable"
        self.mapped(role.field("enable"), what)
        self.mark(role.path, b, "_target_", "Hydra target; nothing to carry")
        tool_config = b.get("tool_config")
        if tool_config is not None:
            _mapping(role.field("tool_config"), tool_config)

    def resolve_tool(
        self, gpath: str, g: Mapping[str, Any], roles: list[_Role], enabled: list[_Role]
    ) -> str | None:
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
                self.note(path, None, "tool is null: verl runs a no-op profiler, so the profctx config is disabled")
            return None
        tool = str(tool)
        if tool in UNSUPPORTED_TOOLS:
            raise ConfigError(path, tool, UNSUPPORTED_TOOLS[tool])
        if tool not in TOOLS:
            raise ConfigError(path, tool, f"a verl tool profctx can run: {one_of(TOOLS)}")
        self.mapped(path, "tool")
        for role in roles:
            if "tool" not in role.block:
                continue
            if role.tool == tool:
                self.mapped(role.field("tool"), "tool")
            elif role.enable:
                self.note(role.field("tool"), role.tool, f"profctx uses one tool per process: {tool!r} is used "
                          f"for this role too")
            else:
                self.mapped(role.field("tool"), "unused: the role is not enabled")
        return tool

    def tool_config(self, role: _Role, tool: str | None) -> Mapping[str, Any]:
        tc = role.block.get("tool_config") or {}
        if tool is None or tool not in tc:
            return {}
        return _mapping(f"{role.field('tool_config')}.{tool}", tc[tool] or {})

    def discrete(self, role: _Role, tool: str, g: Mapping[str, Any], gpath: str) -> bool:
        tc = self.tool_config(role, tool)
        path = f"{role.field('tool_config')}.{tool}.discrete"
        if "discrete" in tc:
            self.mapped(path, "mode ('role' when true, 'step' when false)")
            return _flag(path, tc["discrete"])
        if tool == "nsys":
            nsys = _mapping(f"{gpath}.global_tool_config.nsys", (g.get("global_tool_config") or {}).get("nsys") or {})
            if "discrete" in nsys:
                return _flag(f"{gpath}.global_tool_config.nsys.discrete", nsys["discrete"])
        return False

    def mode(self, gpath: str, g: Mapping[str, Any], tool: str | None, roles: list[_Role]) -> Literal["step", "role"]:
        gnsys = _mapping(f"{gpath}.global_tool_config.nsys", (g.get("global_tool_config") or {}).get("nsys") or {})
        if tool == "nsys" and "discrete" in gnsys:
            self.mapped(f"{gpath}.global_tool_config.nsys.discrete", "mode (the roles' nsys discrete default)")
        if tool is None or tool == "torch_memory":
            return "step"
        if not roles:
            return "role" if tool == "nsys" and gnsys.get("discrete") is True else "step"
        flags = {r.name: self.discrete(r, tool, g, gpath) for r in roles if r.name != "rollout" or len(roles) == 1}
        mode: Literal["step", "role"] = "role" if any(flags.values()) else "step"
        for role in roles:
            if role.name in flags and flags[role.name] != (mode == "role"):
                chosen = next(n for n, f in flags.items() if f)
                self.note(f"{role.field('tool_config')}.{tool}.discrete", False,
                          f"profctx has one mode for all roles: mode='role' because {chosen} is discrete, so "
                          "this role is captured per role block too, not as part of a whole-step trace")
        return mode

    def global_leftovers(self, gpath: str, g: Mapping[str, Any], tool: str | None) -> None:
        """Account for the global tool configs of tools other than the one used."""
        gtc = g.get("global_tool_config") or {}
        for name, block in gtc.items():
            if not isinstance(block, Mapping):
                continue
            for leaf, _ in _leaves(f"{gpath}.global_tool_config.{name}", block):
                if name != tool:
                    self.mapped(leaf, f"unused: the tool is {tool!r}, in verl too")
                elif leaf.endswith("._target_"):
                    self.mapped(leaf, "Hydra target; nothing to carry")

    def contiguous(self, gpath: str, g: Mapping[str, Any], mode: str) -> bool:
        path = f"{gpath}.profile_continuous_steps"
        value = _flag(path, g.get("profile_continuous_steps", False))
        if value and mode != "step":
            self.note(path, True, "ignored with discrete roles, in verl too (its start/stop toggles do nothing "
                      "there); profctx's role mode captures each role block")
            return False
        self.mapped(path, "contiguous")
        return value

    def ranks(self, training: list[_Role]) -> tuple[int, ...] | Literal["all"]:
        if not training:
            return (0,)
        if any(r.all_ranks for r in training):
            union: tuple[int, ...] | Literal["all"] = "all"
        else:
            union = tuple(sorted({rank for r in training for rank in (r.ranks or (0,))}))
        for role in training:
            self.mapped(role.field("all_ranks"), "ranks ('all')")
            self.mapped(role.field("ranks"), "ranks (verl's rule: empty means rank 0)")
            if role.selection != union:
                key = "all_ranks" if role.all_ranks or union == "all" else "ranks"
                value = role.all_ranks if key == "all_ranks" else list(role.ranks)
                shown = "all ranks" if union == "all" else f"ranks {list(union)}"
                self.note(role.field(key), value, f"profctx has one rank selection for all roles: the union of "
                          f"the enabled roles' ranks ({shown}) is used, so this role is profiled there too")
        return union

    def patterns(self, roles: list[_Role], enabled: list[_Role]) -> tuple[str, ...]:
        named = [r for r in roles if r.name]
        if not named or all(r.enable for r in named):
            return ()
        return tuple(p for r in sorted(enabled, key=lambda r: _ORDER.index(r.name)) for p in ROLE_PATTERNS[r.name])

    def save_path(self, gpath: str, g: Mapping[str, Any], roles: list[_Role]) -> str:
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
        self.mapped(source, "save_path")
        for role in roles:
            if "save_path" not in role.block:
                continue
            if role.block["save_path"] == path or not role.enable:
                self.mapped(role.field("save_path"), "save_path")
            else:
                self.note(role.field("save_path"), role.block["save_path"],
                          f"profctx has one save_path: {path!r} is used (captures are filed by step and role below it)")
        return path

    def hooks(self, gpath: str, g: Mapping[str, Any], roles: list[_Role]) -> None:
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
                    self.mapped(f"{gpath}.{key}", "verl's default; nothing to carry")
                else:
                    self.note(f"{gpath}.{key}", value, reason)
            for role in roles:
                if key not in role.block:
                    continue
                own = role.block[key]
                if own in (value, default) or (key == "finish_hook_ranks" and not own):
                    self.mapped(role.field(key), f"same as {gpath}.{key}" if own == value else "verl's default")
                else:
                    self.note(role.field(key), own, reason)

    def tool_settings(
        self,
        gpath: str,
        g: Mapping[str, Any],
        tool: str | None,
        primary: _Role | None,
        tc: Mapping[str, Any],
        training: list[_Role],
    ) -> tuple[tuple[str, ...], dict[str, Any]]:
        gtc = _mapping(f"{gpath}.global_tool_config", g.get("global_tool_config") or {})
        contents: tuple[str, ...] = ()
        options: dict[str, Any] = {}
        if tool in ("torch", "npu") and primary is not None:
            contents = self.contents(primary, tool, tc)
            for role in training[1:]:
                other = self.tool_config(role, tool)
                path = f"{role.field('tool_config')}.{tool}.contents"
                if "contents" in other and self.contents(role, tool, other, quiet=True) != contents:
                    self.note(path, other["contents"], f"profctx records one contents list for all roles: "
                              f"{list(contents)} from {primary.name} is used")
        if tool == "npu" and primary is not None:
            options = self.npu_options(primary, tc, training)
        elif tool == "nsys":
            options = self.nsys_options(gpath, gtc)
        elif tool == "torch_memory":
            contents, options = self.memory_options(gpath, gtc, primary, tc)
        if tool == "torch":
            for role in training:
                self.schedule(role, self.tool_config(role, tool))
        for role in training:
            self.tool_leftovers(role, tool)
        return contents, options

    def contents(self, role: _Role, tool: str, tc: Mapping[str, Any], quiet: bool = False) -> tuple[str, ...]:
        path = f"{role.field('tool_config')}.{tool}.contents"
        raw = tc.get("contents") or []
        if not isinstance(raw, (list, tuple)):
            raise ConfigError(path, raw, "a list; " + one_of(CONTENTS[tool]))
        out: list[str] = []
        for item in raw:
            if item in SGLANG_SWITCHES and tool == "torch":
                continue  # rollout engine switches, read by engines()
            if item not in CONTENTS[tool]:
                allowed = [*CONTENTS[tool], *(SGLANG_SWITCHES if tool == "torch" else ())]
                raise ConfigError(path, item, f"verl's {tool} contents: {one_of(allowed)}")
            out.append(CONTENTS[tool][item])
        if not quiet:
            self.mapped(path, "contents (empty made explicit: torch CPU+CUDA, npu CPU only)")
        if not out:
            # verl's empty contents: torch records CPU and CUDA, npu records CPU only.
            if tool == "npu" and not quiet:
                self.note(path, list(raw), "verl's npu backend records CPU only for empty contents; kept as "
                          "contents=['cpu'] (add 'npu' to record the device)")
            return ("cpu", "cuda") if tool == "torch" else ("cpu",)
        return tuple(dict.fromkeys(["cpu", *out]))  # verl records CPU activity whatever is listed

    def npu_options(self, primary: _Role, tc: Mapping[str, Any], training: list[_Role]) -> dict[str, Any]:
        base = f"{primary.field('tool_config')}.npu"
        level = tc.get("level", "level0")
        if level not in NPU_LEVELS:
            raise ConfigError(f"{base}.level", level, one_of(NPU_LEVELS))
        analysis = _flag(f"{base}.analysis", tc.get("analysis", False))
        self.mapped(f"{base}.level", "tool_options.level")
        self.mapped(f"{base}.analysis", "tool_options.analyse")
        for role in training[1:]:
            other = self.tool_config(role, "npu")
            for key, value in (("level", level), ("analysis", analysis)):
                if key in other and other[key] != value:
                    self.note(f"{role.field('tool_config')}.npu.{key}", other[key],
                              f"profctx has one npu setting for all roles: {value!r} from {primary.name} is used")
        # verl's NPU profiler fixes these (export to Db, simplified data, no communication mstx ranges).
        return {"level": level, "analyse": analysis, "export_type": ["db"], "data_simplification": True,
                "mstx_domain_exclude": ["communication"]}

    def nsys_options(self, gpath: str, gtc: Mapping[str, Any]) -> dict[str, Any]:
        nsys = _mapping(f"{gpath}.global_tool_config.nsys", gtc.get("nsys") or {})
        base = f"{gpath}.global_tool_config.nsys"
        self.mark(base, nsys, "_target_", "Hydra target; nothing to carry")
        worker = _mapping(f"{base}.worker_nsight_options", nsys.get("worker_nsight_options") or {})
        extra: dict[str, Any] = {}
        for key, value in worker.items():
            path = f"{base}.worker_nsight_options.{key}"
            if key == "capture-range":
                self.mapped(path, "set by profctx (cudaProfilerApi)")
            elif key in ("capture-range-end", "c"):
                if value is None:
                    self.mapped(path, "computed by profctx from the plan (repeat:N)")
                else:
                    self.note(path, value, "profctx computes capture-range-end=repeat:N from the steps, mode and "
                              "roles (profctx nsys-command); verl's value is not used")
            elif value is None:
                self.mapped(path, "unset; nothing to carry")
            else:
                extra[key] = value
                self.mapped(path, f"tool_options.nsys_options.{key}")
        controller = nsys.get("controller_nsight_options")
        if controller:
            self.note(f"{base}.controller_nsight_options", dict(controller), "profctx does not launch the driver; "
                      "run it under `nsys profile` with these options yourself if you need its timeline")
        return {"nsys_options": extra} if extra else {}

    def memory_options(
        self, gpath: str, gtc: Mapping[str, Any], primary: _Role | None, tc: Mapping[str, Any]
    ) -> tuple[tuple[str, ...], dict[str, Any]]:
        base = f"{gpath}.global_tool_config.torch_memory"
        mem = _mapping(base, gtc.get("torch_memory") or {})
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
            self.mapped(path, f"tool_options.{ours}")
            self.mapped(f"{base}.{verl_key}", f"tool_options.{ours}")
        if "context" in mem:
            if mem["context"] not in ("state", "alloc", "all"):
                raise ConfigError(f"{base}.context", mem["context"], one_of(("state", "alloc", "all")))
            options["context"] = mem["context"]
            self.mapped(f"{base}.context", "tool_options.context")
        contents: tuple[str, ...] = ()
        stacks = mem.get("stacks", "python")
        if stacks in ("all", "cpp"):
            contents = ("stack",)
            self.mapped(f"{base}.stacks", "contents ['stack'] (Python and C++ frames)")
            if stacks == "cpp":
                self.note(f"{base}.stacks", stacks, "profctx keeps Python frames as well as C++ ones "
                          "(contents ['stack'])")
        elif stacks == "python":
            self.mapped(f"{base}.stacks", "contents [] (Python frames)")
        else:
            raise ConfigError(f"{base}.stacks", stacks, one_of(("python", "cpp", "all")))
        if mem.get("kw_args"):
            self.note(f"{base}.kw_args", dict(mem["kw_args"]), "extra keywords for torch's "
                      "_record_memory_history are not passed by profctx")
        elif "kw_args" in mem:
            self.mapped(f"{base}.kw_args", "empty; nothing to carry")
        for path, block in ((base, mem), (role_base, tc)):
            value = block.get("memory_snapshot_num_steps", 1)
            if "memory_snapshot_num_steps" in block:
                if value == 1:
                    self.mapped(f"{path}.memory_snapshot_num_steps", "one snapshot per capture (profctx's rule)")
                else:
                    self.note(f"{path}.memory_snapshot_num_steps", value, "profctx writes one snapshot per "
                              "capture; use profile_continuous_steps (contiguous) to span consecutive steps")
        return contents, options

    def schedule(self, role: _Role, tc: Mapping[str, Any]) -> None:
        path = f"{role.field('tool_config')}.torch.schedule"
        schedule = tc.get("schedule")
        if schedule is None:
            return
        sched = _mapping(path, schedule)
        for key in ("skip_first", "wait", "warmup", "active", "repeat"):
            value = sched.get(key, 0)
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise ConfigError(f"{path}.{key}", value, "an integer >= 0")
        if sched.get("active", 0) > 0:
            self.note(path, {k: v for k, v in sched.items() if k != "_target_"},
                      "profctx captures whole steps or role blocks: there is no sub-sampling of update "
                      "mini-batches, so the whole update is recorded (a larger trace)")
        else:
            for key in sched:
                self.mapped(f"{path}.{key}", "schedule off (active <= 0): the whole update, as in profctx")

    def tool_leftovers(self, role: _Role, tool: str | None, unused: str | None = None) -> None:
        """Account for the keys of the role's tool blocks not read above.

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
                if path in self.fields or any(f.startswith(path + ".") for f in self.fields):
                    continue
                if key == "_target_":
                    self.mapped(path, "Hydra target; nothing to carry")
                elif key == "name":
                    self.mapped(path, "tool name tag; nothing to carry")
                elif name != tool:
                    self.mapped(path, f"unused: the tool is {tool!r}, in verl too")
                elif unused is not None:
                    self.mapped(path, unused)
                elif key in ("step_start", "step_end", "manual_save"):
                    if (key, value) in (("step_start", 0), ("step_end", -1), ("step_end", None),
                                        ("manual_save", True), ("step_start", -1)):
                        self.mapped(path, "verl's default; nothing to carry")
                    else:
                        self.note(path, value, "no effect on training roles in verl (January 2026: read only "
                                  "for SGLang rollout); nothing to carry")
                elif key in ("profile_token_start", "profile_token_end"):
                    if value is None:
                        self.mapped(path, "unset; nothing to carry")
                    else:
                        self.note(path, value, "verl applies the token window to rollout engines only")
                elif key in KNOWN_TOOL_FIELDS.get(name, ()):
                    self.mapped(path, "read from the first enabled role: one setting for all roles")

    def engines(self, tool: str | None, rollout: _Role | None, roles: list[_Role]) -> dict[str, Any]:
        block = next((r for r in roles if r.name == "rollout"), None)
        if rollout is None:
            if block is not None:
                self.mapped(block.field("enable"), "engines.roles = [] (rollout not enabled)")
                self.tool_leftovers(block, tool, "unused: rollout not enabled")
                for key in ("all_ranks", "ranks"):
                    self.mark(block.path, block.block, key, "unused: rollout not enabled")
            return {"roles": []}
        path = rollout.field("tool_config")
        tc = self.tool_config(rollout, tool) if tool else {}
        discrete_path = f"{path}.{tool}.discrete"
        out: dict[str, Any] = {"roles": []}
        for key in ("all_ranks", "ranks"):
            self.mark(rollout.path, rollout.block, key, "engines.replicas")
        if tool not in ("torch", "npu"):
            self.note(rollout.field("enable"), True, f"verl's vLLM/SGLang servers accept only the torch and npu "
                      f"tools, not {tool!r}: no engine is driven (engines.roles = [])")
            self.tool_leftovers(rollout, tool, "unused: no engine is driven")
            return out
        discrete = _flag(discrete_path, tc.get("discrete", False))
        self.mapped(discrete_path, "engines on/off (verl drives engines only when discrete)")
        if not discrete:
            self.note(discrete_path, False, "verl drives the rollout engines only with discrete=true, so no engine "
                      "is driven (engines.roles = []); set engines.roles=['rollout'] to profile them")
            self.tool_leftovers(rollout, tool, "unused: no engine is driven")
            return out
        out["roles"] = ["rollout"]
        out["replicas"] = self.replicas(rollout)
        out["contents"] = self.engine_contents(rollout, tool, tc)
        out.update(self.engine_window(rollout, tool, tc))
        for key in ("level", "analysis"):
            if key in tc:
                self.note(f"{path}.{tool}.{key}", tc[key], "profctx sends no NPU level or analysis switch to "
                          "rollout engines: they use their own defaults")
        self.tool_leftovers(rollout, tool, "rollout engine setting")
        return out

    def replicas(self, rollout: _Role) -> list[int] | str:
        if rollout.all_ranks:
            return "all"
        if not rollout.ranks:
            return [0]
        cfg = (self.data.get("actor_rollout_ref") or {}).get("rollout") or {}
        size = 1
        for key in ("tensor_model_parallel_size", "data_parallel_size", "pipeline_model_parallel_size"):
            value = cfg.get(key, 1) if isinstance(cfg, Mapping) else 1
            size *= value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else 1
        replicas = sorted({rank // size for rank in rollout.ranks})
        if isinstance(cfg, Mapping) and "tensor_model_parallel_size" in cfg:
            reason = (f"read as global GPU ranks (verl since August 2026) of replicas of {size} GPUs: replicas "
                      f"{replicas}; each selected replica is traced on all its GPUs")
        else:
            reason = (f"read as replica indices {replicas} (no rollout parallel sizes given; verl since August "
                      "2026 reads global GPU ranks: pass the whole trainer config to map them)")
        self.note(rollout.field("ranks"), list(rollout.ranks), reason)
        return replicas

    def engine_contents(self, rollout: _Role, tool: str, tc: Mapping[str, Any]) -> list[str]:
        path = f"{rollout.field('tool_config')}.{tool}.contents"
        raw = tc.get("contents") or []
        if not isinstance(raw, (list, tuple)):
            raise ConfigError(path, raw, "a list; " + one_of(CONTENTS[tool]))
        self.mapped(path, "engines.contents")
        out: list[str] = []
        for item in raw:
            if item in SGLANG_SWITCHES:
                continue
            if item not in CONTENTS[tool]:
                raise ConfigError(path, item, f"verl's {tool} contents: {one_of(CONTENTS[tool])}")
            mapped = {"module": "stack", "npu": None}.get(item, item)  # verl's vLLM args: stack or module -> with_stack
            if mapped is not None:
                out.append(mapped)
        if not out:
            return ["cpu", "cuda"] if tool == "torch" else ["cpu"]
        return list(dict.fromkeys(["cpu", *out]))

    def engine_window(self, rollout: _Role, tool: str, tc: Mapping[str, Any]) -> dict[str, Any]:
        base = f"{rollout.field('tool_config')}.{tool}"
        engine = (((self.data.get("actor_rollout_ref") or {}).get("rollout") or {}).get("name")
                  if isinstance(self.data.get("actor_rollout_ref"), Mapping) else None)
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
                self.mapped(f"{base}.{key}", "engines.absolute_start_step / engines.count (SGLang)")
            if count > 0:
                out["count"] = count
            if first > 1:
                out["absolute_start_step"] = first
            if engine not in (None, "sglang") and (count > 0 or first > 1):
                self.note(f"{base}.step_start", raw_start, f"verl (January 2026) sends this window to SGLang only; "
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
            self.mapped(f"{base}.profile_token_end", "engines.count (engine iterations)")
            if engine == "sglang":
                if start:
                    out["absolute_start_step"] = start
                self.mapped(f"{base}.profile_token_start", "engines.absolute_start_step (SGLang's start_step is "
                            "an absolute forward count, as verl sends it)")
            else:
                if start and start > 1:
                    out["delay"] = start - 1  # vLLM's delay_iterations=N skips N-1 engine steps
                self.mapped(f"{base}.profile_token_start", "engines.delay (vLLM delay_iterations - 1)")
                if engine is None and start:
                    self.note(f"{base}.profile_token_start", start, "rollout engine unknown (no "
                              "actor_rollout_ref.rollout.name): read as vLLM's delay_iterations; for SGLang "
                              "set engines.absolute_start_step instead")
        if out.get("by_stage") and not out.get("count"):
            raise ConfigError(f"{base}.contents", "profile-by-stage", "profile-by-stage needs a step window "
                              "(step_end / profile_token_end): SGLang's profile_by_stage needs num_steps")
        return out

    def unused(self, path: str, block: Mapping[str, Any], reason: str) -> None:
        for leaf, _ in _leaves(path, block):
            if not self.known(leaf):
                self.mapped(leaf, reason)

    def known(self, leaf: str) -> bool:
        return any(leaf == f or leaf.startswith(f + ".") for f in self.fields)

    def sweep(self) -> None:
        """Report every field of the profiler blocks that no rule above read."""
        for path, block in self.blocks.values():
            for leaf, value in _leaves(path, block):
                if not self.known(leaf):
                    self.note(leaf, value, "not a verl profiler field profctx knows (January or August 2026 "
                              "shapes); not carried over")


# -- small checks ------------------------------------------------------------------------------


def _looks_like_block(data: Mapping[str, Any]) -> bool:
    return bool(data.keys() & {"tool_config", "enable", "all_ranks", "ranks"}) or isinstance(
        data.get("profiler"), Mapping)


def _mapping(path: str, value: object) -> Mapping[str, Any]:
    if not isinstance(value, Mapping):
        raise ConfigError(path, value, "a mapping")
    return value


def _flag(path: str, value: object) -> bool:
    if isinstance(value, bool):
        return value
    raise ConfigError(path, value, "true or false")


def _ranks(path: str, value: object) -> tuple[int, ...]:
    if value is None:
        return ()
    if not isinstance(value, (list, tuple)):
        raise ConfigError(path, value, "a list of ranks (integers >= 0), [] meaning rank 0")
    for item in value:
        if isinstance(item, bool) or not isinstance(item, int) or item < 0:
            raise ConfigError(path, value, "a list of ranks (integers >= 0), [] meaning rank 0")
    return tuple(sorted(set(value)))


def _leaves(prefix: str, block: Mapping[str, Any]) -> Iterator[tuple[str, Any]]:
    for key, value in block.items():
        path = f"{prefix}.{key}"
        if isinstance(value, Mapping) and value:
            yield from _leaves(path, value)
        else:
            yield path, value
