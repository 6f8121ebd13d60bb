"""A double of ``torch_npu`` 2.14's profiler and mstx API, injected through ``sys.modules``.

Mirrors the documented signatures and behaviours (reference engine-apis.md §3): keyword-only
``profile``; its own ``ProfilerActivity`` (CPU, NPU) with any other activity reset to all
with a warning; ``Schedule(wait, active, warmup=0, ...)`` (positional order differs from
torch's); ``tensorboard_trace_handler`` re-pointing a process-global path when constructed;
``_ExperimentalConfig`` resetting AI Core metrics at Level0/Level_none; mstx ranges
recorded only with ``mstx=True``; one native session per process; the
``{worker}_{pid}_{ts}_ascend_pt`` folder layout; and every public function catching its
own exception and printing ``[ERROR] [pid] profiler.py: Call <fn> failed. Exception: <msg>``.
"""

from __future__ import annotations

import enum
import functools
import importlib.machinery
import json
import multiprocessing
import os
import socket
import sys
import time
import types
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

#: Names this double mirrors, checked against the real module when it is importable.
MIRRORED = {
    "torch_npu.profiler": ("profile", "ProfilerActivity", "schedule", "tensorboard_trace_handler",
                           "_ExperimentalConfig", "ProfilerLevel", "AiCMetrics", "ExportType", "ProfilerAction"),
    "torch_npu.npu.mstx": ("range_start", "range_end", "mark"),
    "torch_npu.profiler.profiler": ("analyse",),
}


@dataclass
class NpuState:
    """Everything the fake torch_npu process-global runtime holds; tests read and steer it."""

    npu_available: bool = True
    enabled: bool = False
    owner: Any = None
    path_creator: tuple[str | None, str | None] | None = None
    events: list[tuple[Any, ...]] = field(default_factory=list)
    printed: list[str] = field(default_factory=list)
    fail_start: str | None = None
    fail_analyse: str | None = None
    next_range: int = 1
    open_ranges: dict[int, tuple[str, str]] = field(default_factory=dict)
    schedules: list[dict[str, int]] = field(default_factory=list)
    profiles: list[dict[str, Any]] = field(default_factory=list)

    @property
    def starts(self) -> int:
        return sum(1 for e in self.events if e[0] == "start")

    @property
    def stops(self) -> int:
        return sum(1 for e in self.events if e[0] == "stop")


STATE = NpuState()


def _say(text: str) -> None:
    STATE.printed.append(text)
    print(text, file=sys.stderr)


def no_exception_func(fn: Callable[..., Any]) -> Callable[..., Any]:
    """Catch and print any exception, return None: torch_npu's wrapper on its public functions."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except Exception as exc:
            _say(f"[ERROR] [{os.getpid()}] profiler.py: Call {fn.__name__} failed. Exception: {exc}")
            return None

    return wrapper


def _disabled() -> bool:
    return bool(os.environ.get("PROFILER_SAMPLECONFIG") or os.environ.get("PROFILING_MODE"))


class ProfilerActivity(enum.Enum):
    CPU = "CPU"
    NPU = "NPU"


class ProfilerAction(enum.Enum):
    NONE = 0
    WARMUP = 1
    RECORD = 2
    RECORD_AND_SAVE = 3


class ProfilerLevel:
    Level0 = "Level0"
    Level1 = "Level1"
    Level2 = "Level2"
    Level_none = "Level_none"


class AiCMetrics:
    PipeUtilization = "ACL_AICORE_PIPE_UTILIZATION"
    ArithmeticUtilization = "ACL_AICORE_ARITHMETIC_UTILIZATION"
    Memory = "ACL_AICORE_MEMORY_BANDWIDTH"
    MemoryL0 = "ACL_AICORE_L0B_AND_WIDTH"
    MemoryUB = "ACL_AICORE_MEMORY_UB"
    ResourceConflictRatio = "ACL_AICORE_RESOURCE_CONFLICT_RATIO"
    L2Cache = "ACL_AICORE_L2_CACHE"
    MemoryAccess = "ACL_AICORE_MEMORY_ACCESS"
    AiCoreNone = "ACL_AICORE_NONE"


class ExportType:
    Text = "text"
    Db = "db"


class _ExperimentalConfig:
    def __init__(self, profiler_level: str = ProfilerLevel.Level0,
                 aic_metrics: str = AiCMetrics.PipeUtilization, l2_cache: bool = False, msprof_tx: bool = False,
                 mstx: bool = False, data_simplification: bool = True, record_op_args: bool = False,
                 op_attr: bool = False, gc_detect_threshold: float | None = None,
                 export_type: str | list[str] = ExportType.Text, host_sys: list[str] | None = None,
                 mstx_domain_include: list[str] | None = None, mstx_domain_exclude: list[str] | None = None,
                 sys_io: bool = False, sys_interconnection: bool = False) -> None:
        if profiler_level in (ProfilerLevel.Level0, ProfilerLevel.Level_none) and aic_metrics != AiCMetrics.AiCoreNone:
            _say(f"[WARNING] aic_metrics is reset to AiCoreNone at {profiler_level}")
            aic_metrics = AiCMetrics.AiCoreNone
        if profiler_level == ProfilerLevel.Level_none:
            mstx = True
        self.profiler_level = profiler_level
        self.aic_metrics = aic_metrics
        self.mstx = mstx or msprof_tx
        self.data_simplification = data_simplification
        self.export_type = [export_type] if isinstance(export_type, str) else list(export_type)
        self.mstx_domain_include = mstx_domain_include
        self.mstx_domain_exclude = None if mstx_domain_include else mstx_domain_exclude


class Schedule:
    def __init__(self, wait: int, active: int, warmup: int = 0, repeat: int = 0, skip_first: int = 0,
                 skip_first_wait: int = 0) -> None:
        if active <= 0:
            _say("[WARNING] Invalid parameter active, reset it to 1.")
            active = 1
        self.wait, self.active, self.warmup, self.repeat, self.skip_first = wait, active, warmup, repeat, skip_first
        STATE.schedules.append({"wait": wait, "active": active, "warmup": warmup, "repeat": repeat,
                                "skip_first": skip_first})

    def __call__(self, step: int) -> ProfilerAction:
        if step < self.skip_first:
            return ProfilerAction.NONE
        step -= self.skip_first
        cycle = self.wait + self.warmup + self.active
        if self.repeat > 0 and step // cycle >= self.repeat:
            return ProfilerAction.NONE
        mod = step % cycle
        if mod < self.wait:
            return ProfilerAction.NONE
        if mod < self.wait + self.warmup:
            return ProfilerAction.WARMUP
        return ProfilerAction.RECORD if mod < cycle - 1 else ProfilerAction.RECORD_AND_SAVE


schedule = Schedule


@no_exception_func
def tensorboard_trace_handler(dir_name: str | None = None, worker_name: str | None = None,
                              analyse_flag: bool = True, async_mode: bool = False) -> Callable[[Any], None]:
    if worker_name is not None and len(worker_name) >= 226:
        raise ValueError("Invalid parameter worker_name, its length must be less than 226")
    STATE.path_creator = (dir_name, worker_name)  # the process-global ProfPathCreator

    def handler(prof: profile) -> None:
        assert STATE.path_creator is not None
        folder, worker = STATE.path_creator
        stamp = time.strftime("%Y%m%d%H%M%S") + f"{int(time.time() * 1000) % 1000:03d}"
        out = Path(folder or ".") / f"{worker or socket.gethostname()}_{os.getpid()}_{stamp}_ascend_pt"
        (out / "FRAMEWORK").mkdir(parents=True)
        (out / f"PROF_000001_{stamp}_ABCDEFG").mkdir()
        (out / "logs").mkdir()
        rank = os.environ.get("RANK")
        (out / (f"profiler_info_{rank}.json" if rank else "profiler_info.json")).write_text(
            json.dumps({"config": prof.recorded_config()}))
        (out / "profiler_metadata.json").write_text(json.dumps(prof.metadata))
        (out / "FRAMEWORK" / "mstx.json").write_text(json.dumps(prof.ranges))
        if analyse_flag:
            analyse(str(out))

    return handler


class profile:  # noqa: N801 - torch_npu's name
    def __init__(self, *, activities: Any = None, schedule: Any = None, on_trace_ready: Any = None,
                 record_shapes: bool = False, profile_memory: bool = False, with_stack: bool = False,
                 with_flops: bool = False, with_modules: bool = False,
                 experimental_config: _ExperimentalConfig | None = None, execution_trace_observer: Any = None,
                 custom_trace_id_callback: Any = None, use_cuda: bool | None = None) -> None:
        if _disabled():
            _say("[WARNING] msprof is profiling: the torch_npu profiler API is disabled")
        if use_cuda is not None:
            _say("[WARNING] This is npu environment, use_cuda is invalid")
        acts = list(activities) if activities is not None else list(ProfilerActivity)
        if not acts or any(not isinstance(a, ProfilerActivity) for a in acts):
            _say("[WARNING] Invalid activities, only CPU and NPU are supported, reset it to default.")
            acts = list(ProfilerActivity)
        if experimental_config is not None and not isinstance(experimental_config, _ExperimentalConfig):
            _say("[WARNING] Invalid parameter experimental_config, reset it to default.")
            experimental_config = None
        self.activities = acts
        self.schedule = schedule
        self.on_trace_ready = on_trace_ready
        self.flags = {"record_shapes": record_shapes, "profile_memory": profile_memory, "with_stack": with_stack,
                      "with_flops": with_flops, "with_modules": with_modules}
        self.experimental_config = experimental_config or _ExperimentalConfig()
        self.metadata: dict[str, Any] = {}
        self.ranges: list[dict[str, Any]] = []
        self.step_num = 0
        self.action = ProfilerAction.NONE
        STATE.profiles.append({"activities": [a.value for a in acts], **self.flags,
                               "experimental": vars(self.experimental_config)})

    def recorded_config(self) -> dict[str, Any]:
        return {"activities": [a.value for a in self.activities], **self.flags}

    def _save(self) -> None:
        if self.on_trace_ready is not None:
            self.on_trace_ready(self)

    @no_exception_func
    def start(self) -> None:
        if _disabled():
            return
        if STATE.fail_start:
            message, STATE.fail_start = STATE.fail_start, None
            raise RuntimeError(message)
        if STATE.enabled:
            raise RuntimeError("[PTA]:Profiler is already enabled.")
        STATE.enabled, STATE.owner = True, self
        self.action = self.schedule(0) if self.schedule is not None else ProfilerAction.RECORD
        STATE.events.append(("start", id(self)))

    @no_exception_func
    def step(self) -> None:
        if _disabled() or STATE.owner is not self:
            return
        previous = self.action
        self.step_num += 1
        self.action = self.schedule(self.step_num) if self.schedule is not None else ProfilerAction.RECORD
        if previous == ProfilerAction.RECORD_AND_SAVE:
            self._save()

    @no_exception_func
    def stop(self) -> None:
        if _disabled():
            return
        if not STATE.enabled or STATE.owner is not self:
            raise RuntimeError("[PTA]:Can't stop Ascend Pytorch Profiler when it's not started.")
        if self.action == ProfilerAction.RECORD:
            _say("[WARNING] Incorrect schedule: Stop profiler while current state is RECORD which may result in "
                 "incomplete parsed data.")
        if self.action in (ProfilerAction.RECORD, ProfilerAction.RECORD_AND_SAVE):
            self._save()
        STATE.enabled, STATE.owner = False, None
        STATE.events.append(("stop", id(self)))

    @no_exception_func
    def add_metadata(self, key: str, value: str) -> None:
        self.metadata[key] = value

    @no_exception_func
    def add_metadata_json(self, key: str, value: str) -> None:
        self.metadata[key] = json.loads(value)


@no_exception_func
def analyse(profiler_path: str, max_process_number: int = 1, export_type: str | list[str] | None = None) -> None:
    # What the real analysis does to the process that calls it: refuse a daemon, switch to fork.
    if multiprocessing.current_process().daemon:
        raise AssertionError("daemonic processes are not allowed to have children")
    multiprocessing.set_start_method("fork", force=True)
    if STATE.fail_analyse:
        raise RuntimeError(STATE.fail_analyse)
    root = Path(profiler_path)
    sessions = [root] if root.name.endswith("_ascend_pt") else sorted(root.glob("*_ascend_pt"))
    for session in sessions:
        ranges = json.loads((session / "FRAMEWORK" / "mstx.json").read_text())
        types_ = [export_type] if isinstance(export_type, str) else list(export_type or ["text"])
        out = session / "ASCEND_PROFILER_OUTPUT"
        out.mkdir(exist_ok=True)
        if "text" in types_:
            events = [{"name": r["message"], "ph": "X", "cat": "mstx", "ts": r["start"], "dur": r["dur"]}
                      for r in ranges]
            (out / "trace_view.json").write_text(json.dumps(events))
            (out / "kernel_details.csv").write_text("Name,Duration(us)\n")
        if "db" in types_:
            (out / "ascend_pytorch_profiler.db").write_bytes(b"SQLite format 3\x00")
            (out / "analysis.db").write_bytes(b"SQLite format 3\x00")


class mstx:  # noqa: N801 - torch_npu's name
    @staticmethod
    @no_exception_func
    def mark(message: str, stream: Any = None, domain: str = "default") -> None:
        STATE.events.append(("mark", message, domain))

    @staticmethod
    @no_exception_func
    def range_start(message: str, stream: Any = None, domain: str = "default") -> int:
        if not message:
            _say("[WARNING] Invalid message for mstx.range_start")
            return 0
        range_id = STATE.next_range
        STATE.next_range += 1
        STATE.open_ranges[range_id] = (message, domain)
        STATE.events.append(("range_start", message, domain, STATE.enabled))
        prof = STATE.owner
        if prof is not None and prof.experimental_config.mstx and _domain_kept(prof.experimental_config, domain):
            prof.ranges.append({"id": range_id, "message": message, "domain": domain,
                                "start": time.perf_counter_ns() // 1000, "dur": 0})
        return range_id

    @staticmethod
    @no_exception_func
    def range_end(range_id: int, domain: str = "default") -> None:
        message, _ = STATE.open_ranges.pop(range_id)
        STATE.events.append(("range_end", message, domain, STATE.enabled))
        prof = STATE.owner
        if prof is not None:
            for r in prof.ranges:
                if r["id"] == range_id:
                    r["dur"] = time.perf_counter_ns() // 1000 - r["start"]


def _domain_kept(config: _ExperimentalConfig, domain: str) -> bool:
    if config.mstx_domain_include:
        return domain in config.mstx_domain_include
    return not (config.mstx_domain_exclude and domain in config.mstx_domain_exclude)


def _module(name: str, **attrs: Any) -> types.ModuleType:
    module = types.ModuleType(name)
    module.__spec__ = importlib.machinery.ModuleSpec(name, loader=None)
    module.__dict__.update(attrs)
    return module


def install(monkeypatch: pytest.MonkeyPatch, *, npu_available: bool = True) -> NpuState:
    """Inject the double as ``torch_npu`` for one test; return its (fresh) state."""
    state = NpuState(npu_available=npu_available)
    monkeypatch.setattr(sys.modules[__name__], "STATE", state)
    profiler_mod = _module(
        "torch_npu.profiler", profile=profile, ProfilerActivity=ProfilerActivity, ProfilerAction=ProfilerAction,
        schedule=schedule, Schedule=Schedule, tensorboard_trace_handler=tensorboard_trace_handler,
        _ExperimentalConfig=_ExperimentalConfig, ProfilerLevel=ProfilerLevel, AiCMetrics=AiCMetrics,
        ExportType=ExportType, supported_activities=lambda: set(ProfilerActivity),
    )
    inner = _module("torch_npu.profiler.profiler", analyse=analyse)
    profiler_mod.profiler = inner
    npu_mod = _module("torch_npu.npu", is_available=lambda: STATE.npu_available, mstx=mstx)
    root = _module("torch_npu", npu=npu_mod, profiler=profiler_mod, __version__="2.14.0")
    for name, module in (("torch_npu", root), ("torch_npu.npu", npu_mod), ("torch_npu.profiler", profiler_mod),
                         ("torch_npu.profiler.profiler", inner)):
        monkeypatch.setitem(sys.modules, name, module)
    # The analysis runs in a child process: let its `import torch_npu` find this double too.
    here = Path(__file__).resolve()
    paths = [str(here.parent / "npu_child"), str(here.parents[2]), str(here.parents[3]),
             os.environ.get("PYTHONPATH", "")]
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in paths if p))
    return state
