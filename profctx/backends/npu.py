"""The ``npu`` backend: torch_npu's profiler (Ascend), with role ranges as mstx ranges.

torch_npu (2.14) catches and prints every error of its profiler and mstx functions instead
of raising, so a failed capture looks like a successful one. This backend judges success by
the output torch_npu must have written: its ``*_ascend_pt`` folder (and, when analysed,
``ASCEND_PROFILER_OUTPUT/``). A missing output is a recorded failure.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, ClassVar, Final

from ..core._layout import safe
from ..util._errors import ConfigError, one_of
from ..util._log import warn_once
from ._base import CaptureSpec, Finish, installed, named_unselected

if TYPE_CHECKING:
    from ..core._config import ProfilerConfig

#: ``contents`` entry -> ``torch_npu.profiler.profile`` keyword (the same keywords as torch's).
FLAGS: Final = {
    "shapes": "record_shapes",
    "stack": "with_stack",
    "memory": "profile_memory",
    "flops": "with_flops",
    "modules": "with_modules",
}
CONTENTS: Final = ("cpu", "npu", *FLAGS)
#: ``tool_options["level"]`` -> attribute of ``torch_npu.profiler.ProfilerLevel``.
LEVELS: Final = {"level_none": "Level_none", "level0": "Level0", "level1": "Level1", "level2": "Level2"}
#: Attributes of ``torch_npu.profiler.AiCMetrics`` accepted as ``tool_options["aic_metrics"]``.
AIC_METRICS: Final = (
    "AiCoreNone", "PipeUtilization", "ArithmeticUtilization", "Memory", "MemoryL0", "MemoryUB",
    "ResourceConflictRatio", "L2Cache", "MemoryAccess",
)
#: ``tool_options["export_type"]`` -> attribute of ``torch_npu.profiler.ExportType``.
EXPORT_TYPES: Final = {"text": "Text", "db": "Db"}
#: Options this backend reads from ``tool_options``, with their defaults.
DEFAULTS: Final[Mapping[str, Any]] = {
    "level": "level0",
    "aic_metrics": "AiCoreNone",
    "export_type": ("text",),
    "analyse": True,
    "data_simplification": True,
    "mstx_domain_exclude": (),
}
#: The mstx domain role ranges are recorded in.
DOMAIN: Final = "profctx"
#: Environment variables under which torch_npu turns its profiler API into no-ops (msprof drives).
DISABLING_ENV: Final = ("PROFILER_SAMPLECONFIG", "PROFILING_MODE")
#: The folder torch_npu's analysis writes.
ANALYSED: Final = "ASCEND_PROFILER_OUTPUT"
#: Seconds the analysis child may run (on profctx's writer thread, never in the training loop).
ANALYSE_TIMEOUT: Final = 3600.0


class OutputMissingError(RuntimeError):
    """Raise when torch_npu wrote nothing where a capture's output must be."""


class NpuBackend:
    """Drive ``torch_npu.profiler.profile`` into the capture folder; check what it wrote.

    Empty ``contents`` means CPU plus NPU when an NPU is available. CPU activity is always on.
    ``tool_options``: ``level`` (level_none, level0, level1, level2), ``aic_metrics``
    (level1/level2 only), ``export_type`` (text, db or both), ``analyse`` (parse the raw data
    into ``ASCEND_PROFILER_OUTPUT/`` in a child process started from profctx's writer thread,
    not in the training loop and never changing this process's multiprocessing settings),
    ``data_simplification``, ``mstx_domain_exclude``.
    Files: ``{folder}/{rank tag}_{host}_{pid}_{timestamp}_ascend_pt/``.
    """

    name: ClassVar[str] = "npu"

    def __init__(self) -> None:
        self._prof: Any = None
        self._spec: CaptureSpec | None = None
        self._before: frozenset[Path] = frozenset()
        self._settings: dict[str, Any] = {}
        self._mstx: Any = None

    @classmethod
    def check_config(cls, config: ProfilerConfig) -> None:
        """Refuse a config this backend cannot run: no torch_npu, CUDA contents, bad options.

        torch_npu is found, not imported (a process that cannot capture never pays for it).
        """
        if not named_unselected(config) and not installed("torch_npu"):
            raise ConfigError(
                "tool", config.tool, "the npu backend needs torch_npu (Ascend); use tool='torch' elsewhere"
            )
        for item in config.contents:
            if item not in CONTENTS:
                raise ConfigError("contents", item, f"the npu backend records {one_of(CONTENTS)}")
        settings(config.tool_options)

    def prepare(self) -> None:
        """Import torch_npu's profiler (slow) now, not in the first profiled step."""
        import torch_npu.profiler  # noqa: F401

    def start(self, spec: CaptureSpec) -> None:
        """Start a torch_npu profiler session writing into ``spec.folder``."""
        import torch_npu
        from torch_npu import profiler as npu_profiler
        from torch_npu.npu import mstx

        self._mstx = mstx  # held, so a range costs no import lookup

        opts = settings(spec.options)
        for var in DISABLING_ENV:
            if os.environ.get(var):
                note = f"{var} is set, so torch_npu's profiler API does nothing (msprof drives profiling)"
                spec.notes.append(note)
                warn_once(f"npu:{var}", "profctx: %s", note)
        activities = [npu_profiler.ProfilerActivity.CPU]
        wants_npu = "npu" in spec.contents or not spec.contents
        if wants_npu and torch_npu.npu.is_available():
            activities.append(npu_profiler.ProfilerActivity.NPU)
        elif "npu" in spec.contents:
            note = "npu was asked for but no NPU is available; captured CPU activity only"
            spec.notes.append(note)
            warn_once("npu:no-npu", "profctx: %s", note)
        experimental = npu_profiler._ExperimentalConfig(
            profiler_level=getattr(npu_profiler.ProfilerLevel, LEVELS[opts["level"]]),
            aic_metrics=getattr(npu_profiler.AiCMetrics, opts["aic_metrics"]),
            export_type=[getattr(npu_profiler.ExportType, EXPORT_TYPES[e]) for e in opts["export_type"]],
            mstx=True,  # role ranges are mstx ranges, recorded only with mstx on
            data_simplification=opts["data_simplification"],
            mstx_domain_exclude=list(opts["mstx_domain_exclude"]) or None,
        )
        worker = _worker(spec)
        self._before = frozenset(_outputs(spec.folder, worker))
        # Built right before the profiler: the handler re-points a process-global output path.
        handler = npu_profiler.tensorboard_trace_handler(dir_name=str(spec.folder), worker_name=worker,
                                                         analyse_flag=False)
        prof = npu_profiler.profile(
            activities=activities,
            # One active step, ended by stop(): the session is saved by the schedule, not cut short.
            schedule=npu_profiler.schedule(wait=0, active=1, warmup=0, repeat=1),
            on_trace_ready=handler,
            experimental_config=experimental,
            **{keyword: (content in spec.contents) for content, keyword in FLAGS.items()},
        )
        prof.start()
        prof.add_metadata_json("profctx", json.dumps(spec.metadata, default=str))
        self._prof, self._spec, self._settings = prof, spec, opts

    def stop(self) -> Finish:
        """Stop the session (torch_npu writes its raw data now); return the checker/analyser."""
        prof, spec, before, opts = self._prof, self._spec, self._before, self._settings
        self._prof = self._spec = None
        if prof is None or spec is None:
            raise RuntimeError("stop() without a live capture")
        prof.step()  # leaves the active step: on_trace_ready saves the raw data
        prof.stop()
        return lambda: _collect(spec, before, opts)

    def range(self, name: str) -> contextlib.AbstractContextManager[Any]:
        """Return an mstx range ``name`` (host side, domain ``profctx``)."""
        return _MstxRange(name, self._mstx)

    def step(self) -> None:
        """Do nothing: the one-step schedule must not advance inside a capture."""


class _MstxRange:
    __slots__ = ("_id", "_mstx", "_name")

    def __init__(self, name: str, mstx: Any) -> None:
        self._name = name
        self._mstx = mstx
        self._id = 0

    def __enter__(self) -> None:
        self._id = self._mstx.range_start(self._name, domain=DOMAIN) or 0

    def __exit__(self, *exc: object) -> None:
        if self._id:  # 0: torch_npu refused the start (and printed why)
            self._mstx.range_end(self._id, domain=DOMAIN)


def settings(options: Mapping[str, Any]) -> dict[str, Any]:
    """Return the npu options from ``tool_options`` with defaults filled in; raise ``ConfigError``."""
    for key in options:
        if key not in DEFAULTS:
            raise ConfigError(f"tool_options.{key}", options[key], f"npu options: {', '.join(DEFAULTS)}")
    out = {**DEFAULTS, **options}
    level = out["level"]
    if not isinstance(level, str) or level.lower() not in LEVELS:
        raise ConfigError("tool_options.level", level, one_of(LEVELS))
    out["level"] = level.lower()
    if out["aic_metrics"] not in AIC_METRICS:
        raise ConfigError("tool_options.aic_metrics", out["aic_metrics"], one_of(AIC_METRICS))
    if out["aic_metrics"] != "AiCoreNone" and out["level"] in ("level0", "level_none"):
        raise ConfigError(
            "tool_options.aic_metrics", out["aic_metrics"],
            f"AI Core metrics need level1 or level2 (torch_npu drops them at {out['level']})",
        )
    export = out["export_type"]
    export = [export] if isinstance(export, str) else export
    if not isinstance(export, (list, tuple)) or not export or any(e not in EXPORT_TYPES for e in export):
        raise ConfigError("tool_options.export_type", out["export_type"], "'text', 'db' or a list of both")
    out["export_type"] = tuple(dict.fromkeys(export))
    for flag in ("analyse", "data_simplification"):
        if not isinstance(out[flag], bool):
            raise ConfigError(f"tool_options.{flag}", out[flag], "true or false")
    exclude = out["mstx_domain_exclude"]
    exclude = [exclude] if isinstance(exclude, str) else exclude
    if not isinstance(exclude, (list, tuple)) or not all(isinstance(d, str) and d for d in exclude):
        raise ConfigError("tool_options.mstx_domain_exclude", exclude, "a list of mstx domain names")
    if DOMAIN in exclude:
        raise ConfigError("tool_options.mstx_domain_exclude", DOMAIN, "profctx's own domain holds the role ranges")
    out["mstx_domain_exclude"] = tuple(exclude)
    return out


def _analyse(out: Path, export: Sequence[str]) -> None:
    """Run torch_npu's analysis of ``out`` in a child process; raise ``OutputMissingError`` if it failed.

    A child, not this process: ``analyse`` sets the process-wide ``fork`` start method, forks a
    pool, and refuses to run in a daemon process. A plain subprocess works from any process,
    daemon or not, and leaves this one's multiprocessing state as it was.
    """
    command = [sys.executable, "-m", "profctx.backends._npu_analyse", str(out), *export]
    try:
        done = subprocess.run(command, capture_output=True, text=True, timeout=ANALYSE_TIMEOUT, check=False)
    except subprocess.TimeoutExpired as exc:
        raise OutputMissingError(f"torch_npu's analysis of {out} took more than {ANALYSE_TIMEOUT:g} s; "
                                 f"run it later: python -m profctx.backends._npu_analyse {out}") from exc
    if done.returncode != 0:
        tail = (done.stderr or done.stdout).strip()[-500:]
        raise OutputMissingError(f"torch_npu's analysis of {out} exited with {done.returncode}: {tail}")
    if not (out / ANALYSED).is_dir():
        tail = (done.stderr or done.stdout).strip()[-500:]
        raise OutputMissingError(f"torch_npu's analysis wrote nothing into {out / ANALYSED} (it printed: {tail})")


def _worker(spec: CaptureSpec) -> str:
    return f"{spec.identity.tag}_{safe(spec.identity.host)}"


def _outputs(folder: Path, worker: str) -> list[Path]:
    # torch_npu names the folder {worker}_{pid}_{YYYYmmddHHMMSSfff}_ascend_pt.
    return [p for p in folder.glob(f"{worker}_{os.getpid()}_*_ascend_pt") if p.is_dir()]


def _collect(spec: CaptureSpec, before: frozenset[Path], opts: Mapping[str, Any]) -> Sequence[Path]:
    worker = _worker(spec)
    new = [p for p in _outputs(spec.folder, worker) if p not in before]
    if not new:
        hint = next((f"; {v} is set" for v in DISABLING_ENV if os.environ.get(v)), "")
        raise OutputMissingError(
            f"torch_npu wrote no {worker}_{os.getpid()}_*_ascend_pt folder in {spec.folder} "
            f"(it prints its errors instead of raising: look for 'Call ... failed' in the process output{hint})"
        )
    out = max(new, key=lambda p: p.name)
    if opts["analyse"]:
        _analyse(out, [str(e) for e in opts["export_type"]])
        parsed = out / ANALYSED
        files = sorted(p for p in parsed.iterdir() if p.is_file()) if parsed.is_dir() else []
        if not files:
            raise OutputMissingError(f"torch_npu's analysis wrote nothing into {parsed} (its errors are printed)")
        return files
    files = sorted(p for p in out.iterdir() if p.is_file())
    if not files:
        raise OutputMissingError(f"torch_npu's output folder {out} is empty (its errors are printed)")
    spec.notes.append(f"raw data only; parse with torch_npu.profiler.profiler.analyse({str(out)!r})")
    return files
