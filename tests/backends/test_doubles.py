"""The doubles keep the documented behaviour, and match the real modules wherever those import."""

from __future__ import annotations

import importlib
import inspect
import sys
from collections.abc import Callable
from typing import Any

import pytest
import torch
import torch.cuda.memory
import torch.cuda.profiler

from .doubles import cuda as cuda_double
from .doubles import torch_npu as npu_double


def params(fn: Callable[..., Any]) -> list[tuple[str, Any, Any]]:
    return [(p.name, p.kind, p.default) for p in inspect.signature(fn).parameters.values()]


def test_cuda_profiler_double_has_the_real_signatures(monkeypatch: pytest.MonkeyPatch) -> None:
    real = {name: params(getattr(torch.cuda.profiler, name)) for name in ("start", "stop")}
    cuda_double.install_profiler(monkeypatch)
    assert {name: params(getattr(torch.cuda.profiler, name)) for name in ("start", "stop")} == real


def test_cuda_memory_double_has_the_real_signatures(monkeypatch: pytest.MonkeyPatch) -> None:
    names = ("_record_memory_history", "_snapshot")
    real = {name: [p[0] for p in params(getattr(torch.cuda.memory, name))] for name in names}
    cuda_double.install_memory(monkeypatch)
    assert {name: [p[0] for p in params(getattr(torch.cuda.memory, name))] for name in names} == real


def test_npu_double_swallows_and_prints_errors_like_torch_npu(monkeypatch: pytest.MonkeyPatch) -> None:
    state = npu_double.install(monkeypatch)
    from torch_npu import profiler
    from torch_npu.npu import mstx

    first, second = profiler.profile(), profiler.profile()
    assert first.start() is None
    assert second.start() is None  # a second session: printed, not raised
    assert any("Call start failed" in p and "already enabled" in p for p in state.printed)
    assert second.stop() is None
    assert any("Can't stop" in p for p in state.printed)
    assert mstx.range_end(12345) is None  # unknown id: printed, not raised
    first.stop()
    assert (state.starts, state.stops) == (1, 1)


def test_npu_double_resets_cuda_activities_and_aic_metrics_with_a_warning(monkeypatch: pytest.MonkeyPatch) -> None:
    state = npu_double.install(monkeypatch)
    from torch_npu import profiler

    profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA])
    assert state.profiles[-1]["activities"] == ["CPU", "NPU"]
    config = profiler._ExperimentalConfig(profiler_level=profiler.ProfilerLevel.Level0,
                                          aic_metrics=profiler.AiCMetrics.PipeUtilization)
    assert config.aic_metrics == profiler.AiCMetrics.AiCoreNone
    assert any("Invalid activities" in p for p in state.printed)
    # Positional order is (wait, active, warmup), unlike torch's keyword-only (wait, warmup, active).
    assert [profiler.schedule(0, 2, 1)(i).name for i in range(3)] == ["WARMUP", "RECORD", "RECORD_AND_SAVE"]


def _real_torch_npu() -> Any:
    saved = {k: v for k, v in sys.modules.items() if k == "torch_npu" or k.startswith("torch_npu.")}
    for key in saved:
        del sys.modules[key]
    try:
        return importlib.import_module("torch_npu")
    except ImportError:
        return None
    finally:
        sys.modules.update(saved)


def test_npu_double_matches_the_real_torch_npu(monkeypatch: pytest.MonkeyPatch) -> None:
    real = _real_torch_npu()
    if real is None:
        pytest.skip("torch_npu is not installed")
    real_modules = {name: importlib.import_module(name) for name in npu_double.MIRRORED if name != "torch_npu.npu.mstx"}
    from torch_npu.npu import mstx as real_mstx

    npu_double.install(monkeypatch)
    for module_name, names in npu_double.MIRRORED.items():
        fake = sys.modules[module_name] if module_name != "torch_npu.npu.mstx" else npu_double.mstx
        genuine = real_modules.get(module_name, real_mstx)
        for name in names:
            want, got = getattr(genuine, name), getattr(fake, name)
            if inspect.isclass(want) and not callable(getattr(want, "__init__", None)):
                continue
            if name in ("ProfilerActivity", "ProfilerLevel", "AiCMetrics", "ExportType", "ProfilerAction"):
                public = {n for n in dir(want) if not n.startswith("_")}
                assert {n for n in dir(got) if not n.startswith("_")} <= public | {"name", "value"}, name
                continue
            target_want = want.__init__ if inspect.isclass(want) else want
            target_got = got.__init__ if inspect.isclass(got) else got
            assert [p[0] for p in params(inspect.unwrap(target_got))] == \
                [p[0] for p in params(inspect.unwrap(target_want))], f"{module_name}.{name}"
