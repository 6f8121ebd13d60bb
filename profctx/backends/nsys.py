"""The ``nsys`` backend: Nsight Systems capture ranges and NVTX role ranges.

A capture is one ``cudaProfilerStart``/``cudaProfilerStop`` pair (``torch.cuda.profiler``);
roles inside it are NVTX ranges in the ``profctx`` domain (the ``nvtx`` package, a safe
no-op when no tool is attached). The report itself is written by ``nsys``, outside this
process; profctx writes a small JSON sidecar per capture that says which nsys range
(1, 2, ... in this process) holds which steps and role.

``nsys`` must be told how many ranges to expect (``--capture-range-end=repeat:N``): with a
larger N its default ``defer`` mode writes nothing until the process exits, with a smaller
one the later ranges are lost. :func:`capture_ranges` computes N from the config;
:func:`nsys_command` and :func:`ray_nsight` emit the launch options.
"""

from __future__ import annotations

import contextlib
import fnmatch
import json
import os
import shlex
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Final

from .._errors import ConfigError, one_of
from .._layout import temporary
from .._log import warn_once
from ._base import CaptureSpec, Finish

if TYPE_CHECKING:
    from .._config import ProfilerConfig

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
        """Refuse a config this backend cannot run: a CPU-only torch build, no ``nvtx``, bad options."""
        try:
            import torch
        except ImportError:
            raise ConfigError("tool", config.tool, "the nsys backend needs torch with CUDA") from None
        if not torch.backends.cuda.is_built():
            raise ConfigError(
                "tool", config.tool,
                f"torch {torch.__version__} is a CPU-only build, where torch.cuda.profiler.start() raises; "
                "install a CUDA build of torch, or use tool='torch'",
            )
        try:
            import nvtx  # noqa: F401
        except ImportError:
            raise ConfigError(
                "tool", config.tool, "the nsys backend marks roles with the nvtx package: pip install 'profctx[nvtx]'"
            ) from None
        for item in config.contents:
            if item not in CONTENTS:
                raise ConfigError("contents", item, f"the nsys backend records {one_of(CONTENTS)}")
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
    tmp = temporary(final)
    tmp.write_text(json.dumps(data, indent=1, default=str), encoding="utf-8")
    os.replace(tmp, final)
    return (final,)


# -- the launch side: how many ranges, and the nsys options that expect them --------------------


def capture_ranges(config: ProfilerConfig, roles_per_step: int | Sequence[str] | None = None) -> int:
    """Return how many capture ranges one selected rank opens over the whole run.

    Assumes the program runs every step of the window, each once, and (role mode) enters
    the same roles in every in-window step, one after another (roles that overlap in
    time on different threads are refused by the one-capture-per-process rule and open
    no range). An unselected rank opens none.

    - ``mode="step"``: one range per window step; ``contiguous=True``: one per run of
      consecutive steps (``"3:6"`` plus ``[9]`` is 2).
    - ``mode="role"``: window steps times the roles per step that open a capture.
      ``roles_per_step`` is a count, or the role paths the program enters in one step
      (``["rollout", "train", "train/actor_update"]``); a path opens a capture when it
      matches ``config.roles`` (name or whole path, fnmatch) and no enclosing role does;
      roles nested in a capture are NVTX ranges of it. Defaults to
      ``tool_options["roles_per_step"]``.

    Raise ``ValueError`` in role mode when the roles per step are not given.
    """
    window = config.steps
    if not config.enable or window is None or not window:
        return 0
    if config.mode == "step":
        return len(window.runs()) if config.contiguous else len(window)
    given = roles_per_step if roles_per_step is not None else config.tool_options.get("roles_per_step")
    if given is None:
        raise ValueError(
            "mode='role' opens one range per matching role per step: give roles_per_step "
            "(a count, or the role paths entered in one step), or tool_options['roles_per_step']"
        )
    per_step = _roles_per_step(given, field="roles_per_step")
    if isinstance(per_step, tuple):
        per_step = sum(_opens_capture(config.roles, path) for path in per_step)
    return len(window) * (per_step or 0)


def nsys_options(config: ProfilerConfig, roles_per_step: int | Sequence[str] | None = None) -> dict[str, str]:
    """Return the ``nsys profile`` options (long names without ``--``) matching ``config``.

    ``--capture-range=cudaProfilerApi --capture-range-end=repeat:N`` with N from
    :func:`capture_ranges`; ``--trace`` from ``contents``; then ``tool_options["nsys_options"]``
    (which may not set the capture-range options). Raise ``ValueError`` when N is 0.
    """
    count = capture_ranges(config, roles_per_step)
    if count < 1:
        raise ValueError("this config opens no capture range (profiling disabled, or no role opens one)")
    contents = set(config.contents or ("cpu", "cuda"))
    trace = ["nvtx"]
    if "cuda" in contents or "memory" in contents:
        trace.insert(0, "cuda")
    if "cpu" in contents:
        trace.append("osrt")
    options = {"trace": ",".join(trace)}
    if "memory" in contents:
        options["cuda-memory-usage"] = "true"
    options["capture-range"] = "cudaProfilerApi"
    options["capture-range-end"] = f"repeat:{count}"
    options.update(_extra_options(config.tool_options.get("nsys_options")))
    return options


def nsys_command(
    config: ProfilerConfig,
    program: Sequence[str] = (),
    roles_per_step: int | Sequence[str] | None = None,
    output: str | None = None,
) -> list[str]:
    """Return ``nsys profile [options] [program...]`` as an argument list.

    ``output`` defaults to ``{save_path}/nsys/%h_%p`` (nsys expands ``%h`` host and ``%p`` pid;
    it numbers the reports of repeated ranges). Join with :func:`shlex.join` for a shell.
    """
    options = nsys_options(config, roles_per_step)
    if output is not None or "output" not in options:
        options["output"] = output or str(Path(config.save_path, "nsys", "%h_%p"))
    argv = ["nsys", "profile"]
    for key, value in options.items():
        argv += [f"--{key}={value}"] if len(key) > 1 else [f"-{key}", value]
    return [*argv, *program]


def ray_nsight(config: ProfilerConfig, roles_per_step: int | Sequence[str] | None = None) -> dict[str, str]:
    """Return the dict for Ray's ``runtime_env={"nsight": ...}``.

    Ray prefixes each key with ``--`` (``-`` for one letter) and writes the reports to its
    session's ``logs/nsight/`` folder, naming them from ``o`` (default here ``profctx_%h_%p``).
    """
    options = nsys_options(config, roles_per_step)
    options["o"] = options.pop("output", "'profctx_%h_%p'")
    return options


def command_line(argv: Sequence[str]) -> str:
    """Return ``argv`` as one shell-quoted line."""
    return shlex.join(argv)


def _opens_capture(patterns: tuple[str, ...], path: str) -> bool:
    parts = [p for p in path.split("/") if p]
    if not parts:
        return False
    for depth in range(1, len(parts)):
        if _matches(patterns, parts[:depth]):
            return False  # an enclosing role holds the capture; this one is a range in it
    return _matches(patterns, parts)


def _matches(patterns: tuple[str, ...], parts: list[str]) -> bool:
    if not patterns:
        return True
    name, path = parts[-1], "/".join(parts)
    return any(fnmatch.fnmatchcase(name, p) or fnmatch.fnmatchcase(path, p) for p in patterns)


def _roles_per_step(value: object, field: str = "tool_options.roles_per_step") -> int | tuple[str, ...] | None:
    if value is None:
        return None
    if isinstance(value, int) and not isinstance(value, bool):
        if value < 0:
            raise ConfigError(field, value, "a count >= 0, or the list of role paths entered in one step")
        return value
    if isinstance(value, str):
        value = [value]
    if isinstance(value, (list, tuple)) and all(isinstance(v, str) and v.strip("/") for v in value):
        return tuple(value)
    raise ConfigError(field, value, "a count >= 0, or the list of role paths entered in one step")


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
