"""The configuration: one frozen value, built from keywords, a mapping, YAML, OmegaConf or env."""

from __future__ import annotations

import contextlib
import dataclasses
import os
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any, Final, Literal, final

from ..util._errors import ConfigError, one_of
from ..util._files import temporary_name
from ._ondemand import DEFAULT_MAX_CAPTURES, AutoCapture
from ._vocab import BUILTIN_TOOLS, MODES, Mode
from ._window import MAX_STEPS, StepWindow, range_exceeds

#: What a ``tool`` value must look like here. Which names resolve is the backend registry's
#: business, checked where backends are known (``configure()``): a backend registered in one
#: process is a valid name in a config carried to another.
TOOL_NAME: Final = (f"a backend name: {', '.join(repr(t) for t in ('auto', *BUILTIN_TOOLS))} "
                    "or one registered with profctx.backends.register()")
ON_ERROR: Final = ("log", "raise")
CONTENTS: Final = ("cpu", "cuda", "npu", "memory", "shapes", "stack", "flops", "modules")
ENGINE_CONTENTS: Final = ("cpu", "cuda", "memory", "stack", "shapes")
#: Most ranks (or engine replicas) a list may name; a bigger selection is written ``"all"``.
MAX_RANKS: Final = MAX_STEPS
#: Longest engine timeout, in seconds (a week): a longer wait is a typo, and bounds the float conversion.
MAX_TIMEOUT: Final = 7 * 24 * 3600.0
#: Seconds the exit waits for trace files and ``on_capture`` hooks (``exit_timeout``).
DEFAULT_EXIT_TIMEOUT: Final = 60.0
#: Caps a run cannot outgrow, per process (``None`` in the config: no cap). Trace bytes over the whole
#: run and over any hour, and bytes of the step timeline file.
DEFAULT_MAX_TRACE_BYTES: Final = 64 * 2**30
DEFAULT_MAX_TRACE_BYTES_PER_HOUR: Final = 16 * 2**30
DEFAULT_MAX_TIMELINE_BYTES: Final = 256 * 2**20
#: Largest YAML file read as a config (a whole trainer config is tens of kB).
MAX_YAML_BYTES: Final = 4 * 2**20
#: Folders of kernel pseudo-file systems: nothing profctx writes can live there.
PSEUDO_FOLDERS: Final = ("/proc", "/sys")

#: Environment overrides, applied last: variable -> field.
ENV_FIELDS: Final = {
    "PROFCTX_ENABLE": "enable",
    "PROFCTX_STEPS": "steps",
    "PROFCTX_RANKS": "ranks",
    "PROFCTX_MODE": "mode",
    "PROFCTX_ROLES": "roles",
    "PROFCTX_SAVE_PATH": "save_path",
    "PROFCTX_TOOL": "tool",
    "PROFCTX_ON_DEMAND": "on_demand",
    "PROFCTX_TIMELINE": "timeline",
    "PROFCTX_SUMMARY_AT_EXIT": "summary_at_exit",
}


@final
@dataclass(frozen=True)
class EngineConfig:
    """What attached inference engines (vLLM, SGLang) do when a matching role is entered.

    ``delay`` and ``count`` are engine iterations (engine steps, not requests or tokens):
    skip ``delay`` engine steps after the start, then record ``count`` (``None``: until stop).
    """

    roles: tuple[str, ...] = ("rollout",)
    replicas: tuple[int, ...] | Literal["all"] = (0,)
    contents: tuple[str, ...] = ()
    delay: int | None = None
    count: int | None = None
    by_stage: bool = False
    merge_profiles: bool = False
    absolute_start_step: int | None = None
    #: Seconds to wait for an engine to start profiling.
    start_timeout: float = 120.0
    #: Seconds to wait for an engine to stop; generous because vLLM can take minutes to flush a trace.
    stop_timeout: float = 1800.0

    def __post_init__(self) -> None:
        _set(self, "roles", _names("engines.roles", self.roles))
        for name in ("start_timeout", "stop_timeout"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= MAX_TIMEOUT:
                raise ConfigError(f"engines.{name}", value, f"a number of seconds > 0 and at most {MAX_TIMEOUT:.0f}")
            _set(self, name, float(value))
        _set(self, "replicas", _rank_list("engines.replicas", self.replicas))
        _set(self, "contents", _choices("engines.contents", self.contents, ENGINE_CONTENTS))
        for name in ("delay", "count", "absolute_start_step"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise ConfigError(f"engines.{name}", value, "an integer >= 0 or None")
        if self.count == 0:
            raise ConfigError("engines.count", 0, "an integer >= 1, or None to record until the role exits")
        _set(self, "by_stage", _flag("engines.by_stage", self.by_stage))
        _set(self, "merge_profiles", _flag("engines.merge_profiles", self.merge_profiles))
        if self.by_stage and self.count is None:
            raise ConfigError(
                "engines.by_stage", True, "by_stage needs engines.count (SGLang's scheduler crashes without num_steps)"
            )
        if self.absolute_start_step is not None and self.delay is not None:
            raise ConfigError(
                "engines.absolute_start_step",
                self.absolute_start_step,
                "give either delay (relative) or absolute_start_step (SGLang's absolute forward count), not both",
            )


@final
@dataclass(frozen=True)
class GroupConfig:
    """What one worker group (``profctx.ray.group``) profiles: its ranks and, optionally, its contents.

    ``contents`` empty: the config's own ``contents``.
    """

    ranks: tuple[int, ...] | Literal["all"] = (0,)
    contents: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        _set(self, "ranks", _rank_list("groups.ranks", self.ranks))
        _set(self, "contents", _choices("groups.contents", self.contents, CONTENTS))


@final
@dataclass(frozen=True)
class ProfilerConfig:
    """Everything profctx needs to decide what to capture and where to file it.

    Fields accept loose forms (a list for ``steps``, a list for ``ranks``) and normalise
    them; any invalid value raises :class:`ConfigError` naming the field. See
    ``docs/configuration.md`` for each field.
    """

    enable: bool = True
    steps: StepWindow | None = None
    mode: Mode = "step"
    contiguous: bool = False
    roles: tuple[str, ...] = ()
    ranks: tuple[int, ...] | Literal["all"] = (0,)
    rank: int | None = None
    world_size: int | None = None
    group: str | None = None
    groups: Mapping[str, GroupConfig] = field(default_factory=dict)
    profile_driver: bool | None = None
    save_path: str = "./profiles"
    tool: str = "torch"
    contents: tuple[str, ...] = ()
    compress: bool = True
    on_error: Literal["log", "raise"] = "log"
    exit_hooks: bool = True
    exit_timeout: float = DEFAULT_EXIT_TIMEOUT
    max_trace_bytes: int | None = DEFAULT_MAX_TRACE_BYTES
    max_trace_bytes_per_hour: int | None = DEFAULT_MAX_TRACE_BYTES_PER_HOUR
    max_timeline_bytes: int | None = DEFAULT_MAX_TIMELINE_BYTES
    warmup: bool = True
    private: bool = False
    on_demand: bool = False
    on_demand_max_captures: int = DEFAULT_MAX_CAPTURES
    auto_capture: AutoCapture | None = None
    timeline: bool = True
    summary_at_exit: bool = False
    run_id: str | None = None
    engines: EngineConfig = field(default_factory=EngineConfig)
    tool_options: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        _set(self, "enable", _flag("enable", self.enable))
        if self.steps is not None:
            _set(self, "steps", StepWindow.parse(self.steps))
        if not isinstance(self.mode, str) or self.mode not in MODES:
            raise ConfigError("mode", self.mode, one_of(MODES))
        _set(self, "contiguous", _flag("contiguous", self.contiguous))
        if self.contiguous and self.mode != "step":
            raise ConfigError("contiguous", True, "contiguous captures need mode='step'")
        _set(self, "roles", _names("roles", self.roles))
        _set_groups(self)
        _set(self, "ranks", _rank_list("ranks", self.ranks))
        for name in ("rank", "world_size"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise ConfigError(name, value, "an integer >= 0 or None (detect it)")
        if self.world_size == 0:
            raise ConfigError("world_size", 0, "an integer >= 1 or None (detect it)")
        if self.rank is not None and self.world_size is not None and self.rank >= self.world_size:
            raise ConfigError("rank", self.rank, f"a rank below world_size {self.world_size}")
        if isinstance(self.save_path, os.PathLike):
            _set(self, "save_path", os.fspath(self.save_path))
        check_save_path("save_path", self.save_path)
        if not isinstance(self.tool, str) or not _safe_name(self.tool):
            raise ConfigError("tool", self.tool, TOOL_NAME)
        _set(self, "contents", _choices("contents", self.contents, CONTENTS))
        _set(self, "profile_driver", _flag("profile_driver", self.profile_driver))
        _set(self, "compress", _flag("compress", self.compress))
        if not isinstance(self.on_error, str) or self.on_error not in ON_ERROR:
            raise ConfigError("on_error", self.on_error, one_of(ON_ERROR))
        _set(self, "exit_hooks", _flag("exit_hooks", self.exit_hooks))
        _set(self, "exit_timeout", _seconds("exit_timeout", self.exit_timeout))
        for capped in ("max_trace_bytes", "max_trace_bytes_per_hour"):
            _set(self, capped, _byte_cap(capped, getattr(self, capped), 1))
        _set(self, "max_timeline_bytes", _byte_cap("max_timeline_bytes", self.max_timeline_bytes, 2**16))
        _set(self, "warmup", _flag("warmup", self.warmup))
        _set(self, "private", _flag("private", self.private))
        _set(self, "on_demand", _flag("on_demand", self.on_demand))
        cap = self.on_demand_max_captures
        if isinstance(cap, bool) or not isinstance(cap, int) or not 0 <= cap <= 1000:
            raise ConfigError("on_demand_max_captures", cap, "an integer from 0 to 1000: on-demand captures (accepted "
                              "requests) per process; 0 refuses every request")
        _set(self, "auto_capture", AutoCapture.of(self.auto_capture))
        _set(self, "timeline", _flag("timeline", self.timeline))
        _set(self, "summary_at_exit", _flag("summary_at_exit", self.summary_at_exit))
        if self.run_id is not None and (not isinstance(self.run_id, str) or not _safe_name(self.run_id)):
            raise ConfigError("run_id", self.run_id, "letters, digits, '.', '_' or '-' (1-64 characters)")
        if isinstance(self.engines, Mapping):
            _set(self, "engines", _build(EngineConfig, self.engines, "engines."))
        elif not isinstance(self.engines, EngineConfig):
            raise ConfigError("engines", self.engines, "a mapping of engine options or an EngineConfig")
        if not isinstance(self.tool_options, Mapping):
            raise ConfigError("tool_options", self.tool_options, "a mapping of backend options")
        _set(self, "tool_options", MappingProxyType(dict(self.tool_options)))
        if self.auto_capture is not None and self.auto_capture.role is not None and not self.timeline:
            raise ConfigError("auto_capture.role", self.auto_capture.role,
                              "a role's time per step comes from the step timeline: keep timeline=True, or watch "
                              "the step's time (role=None)")
        if self.enable and not self.steps and not self.on_demand and self.auto_capture is None and not (
                self.steps is not None and (self.timeline or self.summary_at_exit)):  # steps=[]: the timeline alone
            raise ConfigError(
                "steps", None if self.steps is None else list(self.steps),
                "profiling is enabled, so give the steps to profile (e.g. '3:6' or [1, 2]), on_demand=True or "
                "auto_capture; steps=[] for the step timeline alone (with timeline or summary_at_exit on); or "
                "enable=False",
            )

    def selects(self, group: str | None, rank: int) -> bool:
        """Return whether the process of ``rank`` in worker ``group`` (``None``: not in a group) profiles.

        With ``groups`` given, a group profiles only if named there, with its own ranks; without,
        every group uses ``ranks``. A process in no group (the driver, or any process of a job
        without worker groups) profiles when ``profile_driver`` is on and ``ranks`` selects it
        (``profile_driver`` defaults to on, and to off when ``groups`` are given without the driver).
        """
        if group is None:
            return bool(self.profile_driver) and (self.ranks == "all" or rank in self.ranks)
        if self.groups:
            chosen = self.groups.get(group)
            return chosen is not None and (chosen.ranks == "all" or rank in chosen.ranks)
        return self.ranks == "all" or rank in self.ranks

    def contents_of(self, group: str | None) -> tuple[str, ...]:
        """Return what a capture of a process in ``group`` records (the group's contents, else the config's)."""
        chosen = self.groups.get(group) if group is not None else None
        return chosen.contents if chosen is not None and chosen.contents else self.contents

    @property
    def active(self) -> bool:
        """Whether this config can capture anything at all."""
        return self.enable and (bool(self.steps) or self.on_demand or self.auto_capture is not None)

    @property
    def timeline_only(self) -> bool:
        """Whether this config keeps the step timeline and captures nothing (``steps=[]``, nothing on demand)."""
        return self.enable and not self.active and self.steps is not None and (self.timeline or self.summary_at_exit)

    def replace(self, **changes: Any) -> ProfilerConfig:
        """Return a copy with ``changes`` applied (validated like the constructor)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict[str, Any]:
        """Return a JSON-safe dict that :meth:`from_mapping` reads back to an equal config."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            value = getattr(self, f.name)
            if isinstance(value, StepWindow):
                value = list(value.steps)
            elif f.name == "groups":
                value = {name: {"ranks": g.ranks if g.ranks == "all" else list(g.ranks), "contents": list(g.contents)}
                         for name, g in value.items()}
            elif isinstance(value, AutoCapture):
                value = value.to_dict()
            elif isinstance(value, EngineConfig):
                value = {
                    g.name: (list(v) if isinstance(v := getattr(value, g.name), tuple) else v)
                    for g in dataclasses.fields(value)
                }
            elif isinstance(value, tuple):
                value = list(value)
            elif isinstance(value, Mapping):
                value = dict(value)
            out[f.name] = value
        return out

    @classmethod
    def from_mapping(cls, data: Mapping[str, Any]) -> ProfilerConfig:
        """Return the config a mapping describes; unknown keys raise ``ConfigError``."""
        config: ProfilerConfig = _build(cls, data, "")
        return config


def load(source: object = None, /, **overrides: Any) -> ProfilerConfig | None:
    """Return the config from ``source`` and keyword ``overrides``, then environment overrides.

    ``source`` is ``None``, a :class:`ProfilerConfig`, a mapping, an OmegaConf ``DictConfig``
    or a path to a YAML file (a top-level ``profctx:`` key is looked into); a verl config is
    converted first (``profctx.interop.verl.from_verl``; ``configure(verl=...)`` does it). Precedence:
    defaults < source < keywords < ``PROFCTX_*`` environment. Returns ``None`` (disabled)
    when nothing at all is given and no ``PROFCTX_*`` variable is set. An active config's
    ``save_path`` is probed (see :func:`probe_save_path`): the folder exists afterwards; not
    where the config names its process (``rank``, ``group``) as one it never profiles.
    Raise :class:`ConfigError` for anything invalid, and for nothing else.
    """
    return _load(source, overrides, os.environ, probe=True)


def load_config(source: object = None, /, **overrides: Any) -> ProfilerConfig | None:
    """Return what :func:`load` returns, without touching the disk: ``save_path`` is not probed.

    For tools that only read a config (``profctx nsys-command`` prints a command line): creating
    the folder there would be a side effect nobody asked for. Values are checked all the same.
    """
    return _load(source, overrides, os.environ, probe=False)


def from_environment(environ: Mapping[str, str] | None = None) -> ProfilerConfig | None:
    """Return the config the ``PROFCTX_*`` variables describe, or ``None`` when none is set.

    The same as ``load()`` with no source and no keywords: a bad value raises
    :class:`ConfigError` naming the variable, and an active config's ``save_path`` is probed.
    ``environ`` defaults to ``os.environ``. ``PROFCTX_RUN_ID`` alone does not count as set.
    """
    return _load(None, {}, os.environ if environ is None else environ, probe=True)


def _load(
    source: object, overrides: dict[str, Any], environ: Mapping[str, str], *, probe: bool
) -> ProfilerConfig | None:
    data: dict[Any, Any]
    if source is None:
        data = {}
    elif isinstance(source, ProfilerConfig):
        data = source.to_dict()
    elif isinstance(source, (str, os.PathLike)):
        data = read_yaml(source)
    elif _is_omegaconf(source):  # before Mapping: a DictConfig is one, but its lists are ListConfigs
        data = _from_omegaconf(source)
    elif isinstance(source, Mapping):
        data = dict(source)
    else:
        raise ConfigError(
            "config", source, "a ProfilerConfig, a mapping, an OmegaConf DictConfig, or a path to a YAML file"
        )
    if "profctx" in data and len(data) == 1:
        inner = data["profctx"]
        if inner is None:
            data = {"enable": False}
        elif isinstance(inner, Mapping):
            data = dict(inner)
        else:
            raise ConfigError("profctx", inner, "a mapping of profctx fields (or null: disabled)")
    data.update(overrides)
    env = env_overrides(environ)
    if source is None and not overrides and not env.keys() - _ALONE_SETS_NOTHING:
        return None
    data.update(env)
    run_id = environ.get("PROFCTX_RUN_ID", "").strip()
    if run_id and data.get("run_id") is None:
        if not _safe_name(run_id):
            raise ConfigError("PROFCTX_RUN_ID", run_id, "letters, digits, '.', '_' or '-' (1-64 characters)")
        data["run_id"] = run_id
    config = ProfilerConfig.from_mapping(data)
    # A process the config names as one that never captures (a group member left out) writes no trace:
    # its save_path is not probed (a private one still is: the probe is what makes it private).
    unselected = config.rank is not None and not config.selects(config.group, config.rank)
    if probe and (config.active or config.timeline_only) and (config.private or not unselected):
        probe_save_path(config.save_path, private=config.private)
    return config


def env_overrides(environ: Mapping[str, str]) -> dict[str, Any]:
    """Return the fields set by ``PROFCTX_*`` variables in ``environ``.

    Each value is checked here, so a bad one raises :class:`ConfigError` naming the variable.
    """
    out: dict[str, Any] = {}
    for var, name in ENV_FIELDS.items():
        raw = environ.get(var)
        if raw is None or raw.strip() == "":
            continue
        raw = raw.strip()
        if name in ("enable", "timeline", "summary_at_exit", "on_demand"):
            lowered = raw.lower()
            if lowered not in _TRUE + _FALSE:
                raise ConfigError(var, raw, "one of 1, 0, true, false, yes, no, on, off")
            out[name] = lowered in _TRUE
        elif name == "steps":
            out[name] = StepWindow.parse(raw, field=var)
        elif name == "ranks":
            out[name] = _rank_list(var, raw)
        elif name == "roles":
            out[name] = _names(var, raw)
        elif name == "mode" and raw not in MODES:
            raise ConfigError(var, raw, one_of(MODES))
        elif name == "tool" and not _safe_name(raw):
            raise ConfigError(var, raw, TOOL_NAME)
        elif name == "save_path":
            check_save_path(var, raw)
            out[name] = raw
        else:
            out[name] = raw
    return out


def check_save_path(name: str, value: object) -> None:
    """Refuse a ``save_path`` that no file can ever be written under, without touching the disk.

    Refused: anything but a non-empty string, a NUL byte (the OS rejects it), a folder under
    ``/proc`` or ``/sys``. Whether the folder can really be written is :func:`probe_save_path`'s job.
    """
    if not isinstance(value, str) or not value.strip():
        raise ConfigError(name, value, "a non-empty folder path")
    if "\0" in value:
        raise ConfigError(name, value, "a folder path without NUL bytes")
    try:
        absolute = os.path.normpath(os.path.abspath(os.path.expanduser(value)))
    except OSError:  # the working folder is gone: a relative path cannot be under /proc anyway
        absolute = os.path.normpath(value)
    for pseudo in PSEUDO_FOLDERS:
        if absolute == pseudo or absolute.startswith(pseudo + os.sep):
            raise ConfigError(name, value, f"a folder for files; {pseudo} is a kernel file system")


def probe_save_path(save_path: str, *, private: bool = False) -> None:
    """Create ``save_path`` (with parents), write a small file into it and remove it.

    Permission bits say nothing when running as root, so the only honest check is a real
    write. Raise :class:`ConfigError` naming the path and the OS's reason when any step fails;
    the folder is left in place when it could be created. ``private``: the folder is made
    ``0o700`` (so nothing below it can be read by other accounts); one that belongs to another
    account raises :class:`ConfigError` naming ``private``.
    """
    check_save_path("save_path", save_path)
    folder = Path(save_path).expanduser()
    probe = folder / temporary_name()  # a leftover (a kill right here) is swept like any temporary
    if private:
        _make_private(folder, save_path)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        with probe.open("xb") as handle:
            handle.write(b"profctx\n")
        probe.unlink()
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise ConfigError("save_path", save_path, f"a folder profctx can create and write into ({reason})") from None
    finally:
        with contextlib.suppress(OSError):  # the write failed before the file existed, or the folder is gone
            probe.unlink(missing_ok=True)


def _make_private(folder: Path, save_path: str) -> None:
    """Create ``folder`` ``0o700``, or narrow an existing one of this account to ``0o700``."""
    try:
        folder.mkdir(parents=True, exist_ok=True, mode=0o700)
        info = folder.stat()
        if info.st_uid != os.geteuid():
            raise ConfigError("private", True, f"a save_path of this account; {save_path} belongs to uid "
                                               f"{info.st_uid}, so other accounts' access cannot be taken away")
        if info.st_mode & 0o077:
            folder.chmod(0o700)
    except OSError as exc:
        reason = exc.strerror or type(exc).__name__
        raise ConfigError("save_path", save_path, f"a folder profctx can create and write into ({reason})") from None


def read_yaml(path: str | os.PathLike[str]) -> dict[Any, Any]:
    """Return the mapping a profctx YAML file holds (an empty file: ``{"enable": False}``).

    The file is read with :func:`yaml_load`, so ``steps: 3:6`` means steps 3, 4, 5.
    Raise :class:`ConfigError` naming the file when it cannot be read or is not a mapping.
    """
    shown = os.fspath(path)
    if not isinstance(shown, str):  # an os.PathLike may give bytes
        raise ConfigError("config", shown, "a path to a YAML file, as text")
    try:
        with open(shown, "rb") as handle:  # bounded: a path to /dev/zero or a log file must not hang here
            raw = handle.read(MAX_YAML_BYTES + 1)
        if len(raw) > MAX_YAML_BYTES:
            raise ConfigError("config", shown, f"a YAML file of at most {MAX_YAML_BYTES // 2**20} MiB")
        text = raw.decode("utf-8")
    except OSError as exc:
        raise ConfigError("config", shown, f"a readable YAML file ({exc.strerror or exc})") from None
    except (ValueError, UnicodeDecodeError) as exc:  # a NUL byte in the path, or not UTF-8
        raise ConfigError("config", shown, f"a readable UTF-8 YAML file ({exc})") from None
    data = yaml_load(text, origin=shown)
    if data is None:
        return {"enable": False}
    if not isinstance(data, dict):
        raise ConfigError("config", shown, "a YAML mapping of profctx fields")
    return data


def yaml_load(text: str, *, origin: str = "<text>") -> Any:
    """Return the data in YAML ``text``, reading slice-like scalars as text.

    YAML 1.1 (PyYAML's default) reads an unquoted ``3:6`` as the base-60 integer 186 and
    ``1:30.5`` as 90.5; here both stay strings, and a base-60 number forced with ``!!int`` /
    ``!!float`` is refused. Otherwise the same as ``yaml.safe_load``. Raise
    :class:`ConfigError` naming ``origin`` for invalid YAML or when PyYAML is missing.
    """
    try:
        import yaml
    except ImportError:  # pragma: no cover - depends on the environment
        raise ConfigError("config", origin, "YAML needs PyYAML: pip install 'profctx[yaml]'") from None
    from ..util._yaml import SliceSafeLoader

    loader = None
    try:
        loader = SliceSafeLoader(text)  # refuses a character YAML does not allow (a NUL) at once
        return loader.get_single_data()
    except yaml.YAMLError as exc:
        raise ConfigError("config", origin, f"valid YAML ({exc})") from None
    except ValueError as exc:  # a number too long for int() (over 4300 digits)
        raise ConfigError("config", origin, f"YAML whose values profctx can read ({exc})") from None
    except RecursionError:
        raise ConfigError("config", origin, "YAML nested less deeply") from None
    finally:
        if loader is not None:
            loader.dispose()


# -- helpers ----------------------------------------------------------------------------------

#: Fields whose variables alone configure nothing (they shape a configuration given otherwise).
_ALONE_SETS_NOTHING: Final = frozenset({"timeline", "summary_at_exit"})
_TRUE: Final = ("1", "true", "yes", "on")
_FALSE: Final = ("0", "false", "no", "off")


def _set(obj: object, name: str, value: object) -> None:
    object.__setattr__(obj, name, value)



def _build(cls: Any, data: Mapping[Any, Any], prefix: str) -> Any:
    names = {f.name for f in dataclasses.fields(cls)}
    for key in data:
        if not isinstance(key, str) or key not in names:
            import difflib  # only to word an error

            close = difflib.get_close_matches(key, names, n=1) if isinstance(key, str) else []
            hint = f"did you mean {close[0]!r}? " if close else ""
            shown = key if isinstance(key, str) and key.isidentifier() else repr(key)  # '' or 1 stay visible
            raise ConfigError(f"{prefix}{shown}", data[key], f"{hint}known fields: {', '.join(sorted(names))}")
    return cls(**data)


def _from_omegaconf(source: object) -> dict[Any, Any]:
    from omegaconf import OmegaConf
    from omegaconf.errors import OmegaConfBaseException

    try:
        container = OmegaConf.to_container(source, resolve=True)  # type: ignore[call-overload]
    except OmegaConfBaseException as exc:  # an interpolation that does not resolve, a missing value
        raise ConfigError("config", type(source).__name__, f"an OmegaConf config that resolves ({exc})") from None
    if not isinstance(container, dict):
        raise ConfigError("config", source, "an OmegaConf mapping (DictConfig)")
    return {str(k): v for k, v in container.items()}


def _seconds(name: str, value: object) -> float:
    """Return ``value`` as seconds > 0 and at most :data:`MAX_TIMEOUT`, else raise ``ConfigError``."""
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= MAX_TIMEOUT:
        raise ConfigError(name, value, f"a number of seconds > 0 and at most {MAX_TIMEOUT:.0f}")
    return float(value)


def _byte_cap(name: str, value: object, least: int) -> int | None:
    """Return ``value`` as a byte count >= ``least``, or ``None`` (no cap); else raise ``ConfigError``."""
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ConfigError(name, value, f"a number of bytes of at least {least}, or None for no cap")
    return value


def _flag(name: str, value: object) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in _TRUE + _FALSE:
        return value.strip().lower() in _TRUE
    raise ConfigError(name, value, "true or false")


def _names(name: str, value: object) -> tuple[str, ...]:
    """Return role patterns; a string is a comma list (``"actor_*,rollout"``), as in ``PROFCTX_ROLES``."""
    if value is None:
        return ()
    if isinstance(value, str):
        parts = [part.strip() for part in value.split(",")]
        if not all(parts):
            raise ConfigError(name, value, "role names or fnmatch patterns separated by single commas, e.g. "
                              "'actor_*,rollout'")
        value = parts
    if not isinstance(value, (list, tuple)) or not all(isinstance(v, str) and v.strip() for v in value):
        raise ConfigError(name, value, "a list of role names or fnmatch patterns, e.g. ['actor_*', 'rollout']")
    for item in value:
        if "," in item:  # one pattern with a comma matches no role name: two were meant
            raise ConfigError(name, item, "one role name or fnmatch pattern per list item, without ','")
    return tuple(value)


def _choices(name: str, value: object, allowed: tuple[str, ...]) -> tuple[str, ...]:
    if value is None:
        return ()
    if isinstance(value, str):
        value = [value]
    if not isinstance(value, (list, tuple)):
        raise ConfigError(name, value, "a list; " + one_of(allowed))
    for item in value:
        if not isinstance(item, str) or item not in allowed:
            raise ConfigError(name, item, one_of(allowed))
    return tuple(dict.fromkeys(value))


_RANKS: Final = "'all' or a non-empty list of integers >= 0"
_GROUP_NAME: Final = "a worker group name: letters, digits, '.', '_' or '-' (1-64 characters)"


def _set_groups(config: ProfilerConfig) -> None:
    """Normalise ``group``, ``groups`` and the per-group shorthands ``ranks={...}`` and ``contents={...}``.

    ``ranks={"actor": [0, 1], "rollout": "all"}`` is ``groups={"actor": {"ranks": [0, 1]}, ...}``;
    its ``"driver"`` entry, if any, is ``ranks`` itself (processes in no group); ``contents={"actor":
    [...]}`` sets the contents of groups named in ``groups`` or in a ``ranks`` mapping.
    ``profile_driver`` left unset is true, unless groups are chosen and the driver is not named.
    """
    if config.group is not None and (not isinstance(config.group, str) or not _safe_name(config.group)):
        raise ConfigError("group", config.group, _GROUP_NAME)
    raw = config.groups
    if not isinstance(raw, Mapping):
        raise ConfigError("groups", raw, "a mapping of group name -> {'ranks': ..., 'contents': [...]}")
    entries: dict[str, dict[str, Any]] = {}
    for name, value in raw.items():
        if not isinstance(name, str) or not _safe_name(name):
            raise ConfigError("groups", name, _GROUP_NAME)
        if isinstance(value, GroupConfig):
            entries[name] = {"ranks": value.ranks, "contents": value.contents}
        elif isinstance(value, Mapping):
            unknown = sorted(set(value) - {"ranks", "contents"})
            if unknown:
                raise ConfigError(f"groups.{name}", unknown[0], "keys 'ranks' and 'contents'")
            entries[name] = dict(value)
        else:
            entries[name] = {"ranks": value}  # groups={"actor": [0, 1]}: ranks only
    driver: object = None
    if isinstance(config.ranks, Mapping):
        for name, value in config.ranks.items():
            if not isinstance(name, str) or not _safe_name(name):
                raise ConfigError("ranks", name, _GROUP_NAME)
            if name == "driver":
                driver = value  # the processes in no group: the driver's own selection
                continue
            entries.setdefault(name, {})["ranks"] = value
        _set(config, "ranks", (0,) if driver is None else driver)
    if isinstance(config.contents, Mapping):
        for name, value in config.contents.items():
            if not isinstance(name, str) or name not in entries:
                raise ConfigError("contents", name, "a group named in groups or in a ranks mapping")
            entries[name]["contents"] = value
        _set(config, "contents", ())
    groups: dict[str, GroupConfig] = {}
    for name, entry in entries.items():
        try:
            groups[name] = GroupConfig(**entry)
        except ConfigError as exc:
            raise ConfigError(f"groups.{name}.{exc.field.split('.')[-1]}", exc.value, exc.allowed) from None
    _set(config, "groups", MappingProxyType(groups))
    if config.profile_driver is None:  # by default the driver profiles unless groups are chosen without it
        _set(config, "profile_driver", not groups or driver is not None)
_TOO_MANY_RANKS: Final = f"at most {MAX_RANKS} ranks in a list; 'all' selects every rank"


def _rank_list(name: str, value: object) -> tuple[int, ...] | Literal["all"]:
    """Return sorted distinct ranks, or ``"all"``; at most :data:`MAX_RANKS` of them.

    A ``range`` is measured before it is expanded, so ``range(10**9)`` is refused at once.
    """
    if isinstance(value, str):
        return "all" if value.strip() == "all" else _int_list(name, value)
    if isinstance(value, bool):
        raise ConfigError(name, value, _RANKS)
    if isinstance(value, int):
        value = [value]
    if not isinstance(value, (list, tuple, range)) or not value:
        raise ConfigError(name, value, _RANKS)
    if (range_exceeds(value, MAX_RANKS) if isinstance(value, range) else len(value) > MAX_RANKS):
        raise ConfigError(name, _shown(value), _TOO_MANY_RANKS)
    for item in value:
        if isinstance(item, bool) or not isinstance(item, int) or item < 0:
            raise ConfigError(name, _shown(value), _RANKS)
    return tuple(sorted(set(value)))


def _shown(value: list[Any] | tuple[Any, ...] | range) -> object:
    """Return ``value``, or a short stand-in when printing it whole would flood the error message."""
    return value if isinstance(value, range) or len(value) <= 20 else f"<a list of {len(value)} items>"


def _int_list(name: str, raw: str) -> tuple[int, ...]:
    try:
        items = [int(p) for p in raw.replace(" ", "").split(",") if p]
    except ValueError:
        raise ConfigError(name, raw, "'all' or a comma-separated list of integers, e.g. '0,1'") from None
    if not items or any(i < 0 for i in items):
        raise ConfigError(name, raw, "'all' or a comma-separated list of integers >= 0")
    if len(items) > MAX_RANKS:
        raise ConfigError(name, f"<{len(items)} ranks>", _TOO_MANY_RANKS)
    return tuple(sorted(set(items)))


def _safe_name(text: str) -> bool:
    return 0 < len(text) <= 64 and all(c.isascii() and (c.isalnum() or c in "._-") for c in text)


def _is_omegaconf(obj: object) -> bool:
    return type(obj).__module__.startswith("omegaconf")
