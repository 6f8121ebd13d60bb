"""The ``nsys`` backend: Nsight Systems capture ranges and NVTX role ranges.

A capture is one ``cudaProfilerStart``/``cudaProfilerStop`` pair (``torch.cuda.profiler``);
roles inside it are NVTX ranges in the ``profctx`` domain (the ``nvtx`` package, a safe
no-op when no tool is attached). The report itself is written by ``nsys``, outside this
process; profctx writes a small JSON sidecar per capture that says which nsys range
(1, 2, ... in this process) holds which steps and role.

``nsys`` must be told how many ranges to expect (``--capture-range-end=repeat:N``): with a
larger N its default ``defer`` mode writes nothing until the process exits, with a smaller
one the later ranges are lost. :func:`capture_ranges` computes N from the config's plan, for
the driver and for each worker group (:func:`group_ranges`); :func:`nsys_command` and
:func:`ray_nsight` emit the launch options.
"""

from __future__ import annotations

import contextlib
import json
import shlex
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Final, Literal

from ..core._oracle import blocks_of, simulate
from ..core._plan import Policy
from ..core._vocab import assert_never
from ..util._errors import ConfigError, one_of
from ..util._files import write_file
from ..util._log import warn_once
from ._base import CaptureSpec, Finish, installed, named_unselected, torch_cuda_built, torch_version

if TYPE_CHECKING:
    from ..core._config import ProfilerConfig

#: The NVTX domain role ranges are recorded in.
DOMAIN: Final = "profctx"
#: ``contents`` this backend understands, and what each adds to the ``nsys`` command line.
CONTENTS: Final = ("cpu", "cuda", "memory")
#: Options this backend reads from ``tool_options``.
OPTIONS: Final = ("roles_per_step", "nsys_options")
#: nsys options profctx owns: they must agree with the ranges the program opens.
OWNED: Final = ("c", "capture-range", "capture-range-end")
#: Short nsys option names, normalised to the long ones.
ALIASES: Final = {"t": "trace", "o": "output"}
#: File suffix of the per-capture sidecar.
SIDECAR: Final = ".nsys-range.json"


class NsysBackend:
    """Open one nsys capture range per capture; mark roles as NVTX ranges.

    Empty ``contents`` means CPU plus CUDA (the emitted command traces ``cuda,nvtx,osrt``).
    Files: ``{stem}.nsys-range.json`` in the capture folder (the range number, steps, role
    and NVTX range names); the ``.nsys-rep`` report is written by nsys where it was told.
    """

    name: ClassVar[str] = "nsys"

    def __init__(self) -> None:
        self._spec: CaptureSpec | None = None
        self._ranges: list[str] = []
        self._markers: list[str] = []
        self._started = 0.0
        self._count = 0
        self._nvtx: Any = None

    @classmethod
    def check_config(cls, config: ProfilerConfig) -> None:
        """Refuse a config this backend cannot run: a CPU-only torch build, no ``nvtx``, bad options.

        Neither torch nor ``nvtx`` is imported here (a process that cannot capture never pays for
        them, and one the config names unselected is not checked for them); one that can capture
        imports both in :meth:`prepare`.
        """
        built = True if named_unselected(config) else torch_cuda_built()
        if built is None:
            raise ConfigError("tool", config.tool, "the nsys backend needs torch with CUDA")
        if not built:
            raise ConfigError(
                "tool", config.tool,
                f"torch {torch_version()} is a CPU-only build, where torch.cuda.profiler.start() raises; "
                "install a CUDA build of torch, or use tool='torch'",
            )
        if not named_unselected(config) and not installed("nvtx"):
            raise ConfigError(
                "tool", config.tool, "the nsys backend marks roles with the nvtx package: pip install 'profctx[nvtx]'"
            )
        for item in config.contents:
            if item not in CONTENTS:
                raise ConfigError("contents", item, f"the nsys backend records {one_of(CONTENTS)}")
        for name, chosen in config.groups.items():
            for item in chosen.contents:
                if item not in CONTENTS:
                    raise ConfigError(f"groups.{name}.contents", item, f"the nsys backend records {one_of(CONTENTS)}")
        for key in config.tool_options:
            if key not in OPTIONS:
                raise ConfigError(
                    f"tool_options.{key}", config.tool_options[key], f"nsys options: {', '.join(OPTIONS)}"
                )
        _roles_per_step(config.tool_options.get("roles_per_step"))
        _extra_options(config.tool_options.get("nsys_options"))

    def prepare(self) -> None:
        """Import ``nvtx`` and ``torch.cuda.profiler`` now, not in the first profiled step."""
        import nvtx  # noqa: F401
        import torch.cuda.profiler  # noqa: F401

    def start(self, spec: CaptureSpec) -> None:
        """Call ``cudaProfilerStart``: nsys (``--capture-range=cudaProfilerApi``) opens a range."""
        import nvtx
        import torch.cuda.profiler

        self._nvtx = nvtx  # held, so a range costs no import lookup
        if not tool_attached():
            note = ("no NVTX tool is attached to this process (is it running under nsys?): "
                    "nothing records this capture range or its NVTX ranges")
            spec.notes.append(note)
            warn_once("nsys:no-tool", "profctx: %s", note)
        torch.cuda.profiler.start()
        self._count += 1
        self._spec = spec
        self._ranges = []
        self._markers = []
        self._started = time.time()

    def stop(self) -> Finish:
        """Call ``cudaProfilerStop``; return the writer of the sidecar file."""
        import torch.cuda.profiler

        spec, ranges, markers = self._spec, self._ranges, self._markers
        self._spec = None
        if spec is None:
            raise RuntimeError("stop() without a live capture")
        torch.cuda.profiler.stop()
        data = {
            "range": self._count,
            "capture": spec.capture_id,
            "steps": list(spec.steps),
            "role": "/".join(spec.roles) or None,
            "rank": spec.identity.rank,
            "world_size": spec.identity.world_size,
            "host": spec.identity.host,
            "pid": spec.identity.pid,
            "start_time": self._started,
            "end_time": time.time(),
            "nvtx_domain": DOMAIN,
            "nvtx_ranges": ranges,
            "nvtx_markers": markers,
            "metadata": spec.metadata,
        }
        return lambda: _write_sidecar(spec, data)

    def range(self, name: str) -> contextlib.AbstractContextManager[Any]:
        """Return an NVTX range ``name`` in the ``profctx`` domain (start/end: valid across threads)."""
        self._ranges.append(name)
        return _NvtxRange(name, self._nvtx)

    def marker(self, name: str) -> contextlib.AbstractContextManager[Any]:
        """Return the NVTX range of a step or of the capture's own role (listed as a marker)."""
        self._markers.append(name)
        return _NvtxRange(name, self._nvtx)

    def step(self) -> None:
        """Do nothing: one capture is one nsys range."""


class _NvtxRange:
    __slots__ = ("_id", "_name", "_nvtx")

    def __init__(self, name: str, module: Any) -> None:
        self._name = name
        self._nvtx = module
        self._id: Any = None

    def __enter__(self) -> None:
        self._id = self._nvtx.start_range(message=self._name, domain=DOMAIN)

    def __exit__(self, *exc: object) -> None:
        self._nvtx.end_range(self._id)


def tool_attached() -> bool:
    """Return whether an NVTX tool (nsys) is attached: ``nvtx`` hands out a dummy domain otherwise."""
    import nvtx

    return type(nvtx.get_domain(DOMAIN)).__name__ != "DummyDomain"


def _write_sidecar(spec: CaptureSpec, data: Mapping[str, Any]) -> Sequence[Path]:
    final = spec.folder / f"{spec.stem}{SIDECAR}"
    write_file(final, json.dumps(data, indent=1, default=str).encode(), at=spec.at)
    return (final,)


# -- the launch side: how many ranges, and the nsys options that expect them --------------------

#: Roles entered per step: a count, the role paths, or either per worker group (``"driver"``: the
#: driver's own, ``"*"``: any group not named).
RolesPerStep = int | Sequence[str] | Mapping[str, int | Sequence[str]] | None
#: The row of the driver (a process in no worker group) in :func:`group_ranges`.
DRIVER: Final = "driver"
#: The row of every worker group not named in ``config.groups`` (they all use ``ranks``).
ANY_GROUP: Final = "*"


def capture_ranges(config: ProfilerConfig, roles_per_step: RolesPerStep = None, *,
                   group: str | None = None, rank: int | None = None) -> int:
    """Return how many capture ranges one process opens over the whole run.

    ``group`` is the process's worker group (``profctx.ray.group``; ``None``: the driver or a
    process in no group) and ``rank`` its rank there: a process the config does not select
    (``ranks``, per-group ``groups``/``ranks={...}``, ``profile_driver``) opens none. Without
    ``rank`` the process is taken as selected.

    Assumes the program runs every step of the window, each once, and (role mode) enters
    the same roles in every in-window step, one after another (roles that overlap in
    time on different threads are refused by the one-capture-per-process rule and open
    no range). A worker of a group holds each in-window step its driver enters, so it
    counts like a loop over the window in its own process:

    - ``mode="step"``: one range per window step; ``contiguous=True``: one per run of
      consecutive steps (``"3:6"`` plus ``[9]`` is 2).
    - ``mode="role"``: window steps times the roles per step that open a capture.
      ``roles_per_step`` is a count, or the role paths the process enters in one step
      (``["rollout", "train", "train/actor_update"]``; in a worker, the roles of its own
      ``@profiled`` methods and blocks: the driver's roles do not reach it), or a mapping of
      group name (``"driver"`` for the driver, ``"*"`` for any other group) to either; a path
      opens a capture when it matches ``config.roles`` (name or whole path, fnmatch) and no
      enclosing role does; roles nested in a capture are NVTX ranges of it. Defaults to
      ``tool_options["roles_per_step"]``.

    Raise ``ValueError`` in role mode when the roles per step of a selected process are not given.
    """
    if not config.active:
        return 0
    if rank is not None and not config.selects(group, rank):
        return 0
    policy = Policy.of(config, selected=True)
    steps = list(config.steps or ())
    mode = config.mode
    if mode == "step":
        return len(simulate(policy, steps))
    elif mode != "role":
        assert_never(mode)
    given = roles_per_step if roles_per_step is not None else config.tool_options.get("roles_per_step")
    per_step = _roles_of(_roles_per_step(given, field="roles_per_step"), group)
    if isinstance(per_step, int):
        return len(steps) * per_step
    plan = simulate(policy, steps, blocks_of(per_step))
    return sum(1 for capture in plan if capture.status == "ok")


def _roles_of(given: int | tuple[str, ...] | Mapping[str, int | tuple[str, ...]] | None,
              group: str | None) -> int | tuple[str, ...]:
    """Return the roles per step of a process in ``group`` (role mode), or raise ``ValueError``."""
    row = DRIVER if group is None else group
    if isinstance(given, Mapping):
        for key in (row, ANY_GROUP):
            if key in given:
                return given[key]
        raise ValueError(
            f"mode='role' opens one range per matching role per step: roles_per_step names no entry for "
            f"{row!r} (give {row}=... or *=...; it names {', '.join(repr(k) for k in given)})"
        )
    if given is None:
        raise ValueError(
            "mode='role' opens one range per matching role per step: give roles_per_step "
            "(a count, or the role paths entered in one step), or tool_options['roles_per_step']"
        )
    return given


@dataclass(frozen=True)
class GroupRanges:
    """The capture ranges of the processes of one row: a worker group, the driver, or any other group.

    ``ranks``: the ranks the config selects in it (``()``: none, ``"all"``); ``ranges``: how many
    each selected process opens; ``options``: the ``nsys profile`` options (long names) those
    processes need, ``None`` when they open none.
    """

    group: str
    ranks: tuple[int, ...] | Literal["all"]
    ranges: int
    options: Mapping[str, str] | None

    def nsight(self) -> dict[str, str] | None:
        """Return the options as Ray's ``runtime_env={"nsight": ...}`` dict (see :func:`ray_nsight`)."""
        return None if self.options is None else _as_nsight(self.options, self.group)

    def selects(self, rank: int) -> bool:
        """Return whether the process of ``rank`` in this row opens ranges (and so must run under nsys)."""
        return self.options is not None and (self.ranks == "all" or rank in self.ranks)


def group_ranges(config: ProfilerConfig, roles_per_step: RolesPerStep = None,
                 groups: Sequence[str] = ()) -> list[GroupRanges]:
    """Return, per row, the selected ranks, their capture-range count and nsys options.

    Rows: ``"driver"`` (the driver, or any process in no group; absent when
    ``profile_driver`` is off), then every group named in ``config.groups`` or in ``groups``,
    each with its own ranks and ``contents``; without ``config.groups`` every group uses
    ``ranks``, and the row ``"*"`` stands for all of them. Raise ``ValueError`` in role mode
    when a row with selected ranks has no roles per step.
    """
    rows: list[tuple[str, str | None, tuple[int, ...] | Literal["all"]]] = []
    if config.profile_driver:
        rows.append((DRIVER, None, config.ranks))
    named = list(dict.fromkeys([*config.groups, *groups]))
    if not config.groups:
        named = named or [ANY_GROUP]
    for name in named:
        chosen = config.groups.get(name)
        ranks = config.ranks if not config.groups else chosen.ranks if chosen is not None else ()
        rows.append((name, None if name == ANY_GROUP else name, ranks))
    out = []
    for name, group, ranks in rows:
        count = _scheduled(config, roles_per_step, group) if ranks and config.active else 0
        opens = bool(ranks) and config.active and (count > 0 or open_ended(config))
        options = nsys_options(config, roles_per_step, group=group) if opens else None
        out.append(GroupRanges(name, ranks if opens else (), count, options))
    return out


def open_ended(config: ProfilerConfig) -> bool:
    """Whether the run may open ranges no config can count ahead: on-demand or anomaly captures."""
    return config.on_demand or config.auto_capture is not None


def _scheduled(config: ProfilerConfig, roles_per_step: RolesPerStep, group: str | None) -> int:
    """The ranges of the step window; with open-ended captures, 0 where role mode cannot count them."""
    try:
        return capture_ranges(config, roles_per_step, group=group)
    except ValueError:
        if open_ended(config):
            return 0
        raise


def nsys_options(config: ProfilerConfig, roles_per_step: RolesPerStep = None, *,
                 group: str | None = None) -> dict[str, str]:
    """Return the ``nsys profile`` options (long names without ``--``) matching ``config``.

    ``--capture-range=cudaProfilerApi --capture-range-end=repeat:N`` with N from
    :func:`capture_ranges` for a selected process of ``group``; ``--trace`` from that group's
    ``contents``; then ``tool_options["nsys_options"]`` (which may not set the capture-range
    options). With on-demand or anomaly captures (:func:`open_ended`) the end is ``repeat`` without N:
    nsys then makes a report of every range, however many come. Raise ``ValueError`` when the config
    opens no range.
    """
    count = _scheduled(config, roles_per_step, group)
    if count < 1 and not (config.active and open_ended(config)):
        raise ValueError("this config opens no capture range (profiling disabled, or no role opens one)")
    contents = set(config.contents_of(group) or ("cpu", "cuda"))
    trace = ["nvtx"]
    if "cuda" in contents or "memory" in contents:
        trace.insert(0, "cuda")
    if "cpu" in contents:
        trace.append("osrt")
    options = {"trace": ",".join(trace)}
    if "memory" in contents:
        options["cuda-memory-usage"] = "true"
    options["capture-range"] = "cudaProfilerApi"
    # On-demand and anomaly captures come when asked for: no count bounds them, so nsys repeats without one
    # (its reports are then written at exit, as after the last of N ranges).
    options["capture-range-end"] = "repeat" if open_ended(config) else f"repeat:{count}"
    options.update(_extra_options(config.tool_options.get("nsys_options")))
    return options


def nsys_command(
    config: ProfilerConfig,
    program: Sequence[str] = (),
    roles_per_step: RolesPerStep = None,
    output: str | None = None,
    *,
    group: str | None = None,
) -> list[str]:
    """Return ``nsys profile [options] [program...]`` as an argument list (for a process of ``group``).

    ``output`` defaults to ``{save_path}/nsys/%h_%p`` (nsys expands ``%h`` host and ``%p`` pid;
    it numbers the reports of repeated ranges). Join with :func:`shlex.join` for a shell.
    """
    options = nsys_options(config, roles_per_step, group=group)
    if output is not None or "output" not in options:
        options["output"] = output or str(Path(config.save_path, "nsys", "%h_%p"))
    argv = ["nsys", "profile"]
    for key, value in options.items():
        argv += [f"--{key}={value}"] if len(key) > 1 else [f"-{key}", value]
    return [*argv, *program]


def ray_nsight(config: ProfilerConfig, roles_per_step: RolesPerStep = None, *,
               group: str | None = None) -> dict[str, str]:
    """Return the dict for Ray's ``runtime_env={"nsight": ...}`` of the actors of worker ``group``.

    Give it only to the actors the config selects (:meth:`GroupRanges.selects`): the others
    open no range. Ray prefixes each key with ``--`` (``-`` for one letter) and writes the
    reports to its session's ``logs/nsight/`` folder, naming them from ``o`` (default here
    ``profctx_%h_%p``, or ``profctx_{group}_%h_%p``).
    """
    return _as_nsight(nsys_options(config, roles_per_step, group=group), group)


def _as_nsight(options: Mapping[str, str], group: str | None) -> dict[str, str]:
    out = dict(options)
    name = "profctx" if group in (None, DRIVER, ANY_GROUP) else f"profctx_{group}"
    out["o"] = out.pop("output", f"'{name}_%h_%p'")
    return out


def command_line(argv: Sequence[str]) -> str:
    """Return ``argv`` as one shell-quoted line."""
    return shlex.join(argv)


def _roles_per_step(
    value: object, field: str = "tool_options.roles_per_step"
) -> int | tuple[str, ...] | Mapping[str, int | tuple[str, ...]] | None:
    if value is None:
        return None
    if isinstance(value, Mapping):
        out: dict[str, int | tuple[str, ...]] = {}
        for key, item in value.items():
            one = _one_roles_per_step(item, f"{field}.{key}") if isinstance(key, str) and key else None
            if one is None:
                raise ConfigError(f"{field}.{key}", item,
                                  "a worker group name ('driver', '*') mapped to a count or role paths")
            out[key] = one
        return out
    one = _one_roles_per_step(value, field)
    if one is None:
        raise ConfigError(field, value, _ROLES_PER_STEP)
    return one


_ROLES_PER_STEP: Final = ("a count >= 0, or the list of role paths entered in one step, or a mapping of "
                          "worker group name to either")


def _one_roles_per_step(value: object, field: str) -> int | tuple[str, ...] | None:
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 0:
            raise ConfigError(field, value, _ROLES_PER_STEP)
        return value
    if isinstance(value, str):
        value = [value]
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) and v.strip("/") for v in value):
        return tuple(value)
    return None


def _extra_options(value: object) -> dict[str, str]:
    if value is None:
        return {}
    if not isinstance(value, Mapping):
        raise ConfigError("tool_options.nsys_options", value, "a mapping of nsys option name to value")
    out: dict[str, str] = {}
    for key, item in value.items():
        name = str(key).lstrip("-")
        name = ALIASES.get(name, name)
        if name in OWNED:
            raise ConfigError(
                f"tool_options.nsys_options.{name}", item,
                "profctx sets the capture range options from the config (cudaProfilerApi, repeat:N)",
            )
        if not name or isinstance(item, (Mapping, list, tuple)) or item is None:
            raise ConfigError(f"tool_options.nsys_options.{key}", item, "an option name and a scalar value")
        out[name] = str(item).lower() if isinstance(item, bool) else str(item)
    return out
