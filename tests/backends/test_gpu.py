"""Checks that need CUDA: they run where ``torch.cuda.is_available()`` and skip cleanly elsewhere."""

from __future__ import annotations

import gzip
import json
import pickle
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import profctx
from profctx.records._manifest import read

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


def only(tmp_path: Path) -> dict[str, object]:
    profctx.flush()
    (record,) = read(tmp_path)
    assert record["status"] == "ok", record
    return record


def test_torch_trace_has_cuda_kernels(tmp_path: Path) -> None:
    profctx.configure(steps=[3], save_path=str(tmp_path), exit_hooks=False)
    x = torch.randn(256, 256, device="cuda")
    with profctx.profile_step(3), profctx.profile_step(role="matmul"):
        (x @ x).sum().item()
    record = only(tmp_path)
    events = json.loads(gzip.decompress((tmp_path / record["files"][0]["path"]).read_bytes()))["traceEvents"]
    assert any(e.get("cat") == "kernel" for e in events)
    assert any(e.get("name") == "matmul" for e in events)


@pytest.mark.parametrize("mode", ["step", "role"])
def test_back_to_back_cuda_captures_keep_their_gpu_times(tmp_path: Path, mode: str) -> None:
    # Exported after the next session had started, torch wrote every kernel, copy and CUDA call with ts 0 and
    # dur 0 (torch 2.11, H200): the next capture's start now waits for the export.
    profctx.configure(steps="1:4", mode=mode, save_path=str(tmp_path), exit_hooks=False)
    x = torch.randn(512, 512, device="cuda")
    for step in range(1, 4):
        with profctx.profile_step(step):
            for role in ("a", "b"):
                with profctx.profile_step(role=role):
                    for _ in range(20):
                        x = torch.tanh(x @ x)
    profctx.flush(120)
    records = read(tmp_path)
    assert len(records) == (3 if mode == "step" else 6)
    for record in records:
        assert record["status"] == "ok", record
        trace = json.loads(gzip.decompress((tmp_path / record["files"][0]["path"]).read_bytes()))
        device = [e for e in trace["traceEvents"] if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
        assert device and all(e["ts"] > 0 for e in device), record["files"][0]["path"]


def test_nsys_backend_starts_and_stops_the_cuda_profiler_with_nvtx_ranges(tmp_path: Path) -> None:
    profctx.configure(steps=[3], tool="nsys", save_path=str(tmp_path), exit_hooks=False)
    with profctx.profile_step(3), profctx.profile_step(role="matmul"):
        torch.ones(64, device="cuda").sum().item()
    record = only(tmp_path)
    data = json.loads((tmp_path / record["files"][0]["path"]).read_text())
    assert data["nvtx_ranges"] == ["matmul"] and data["range"] == 1


SCRIPT = """
import sys, torch, profctx
profctx.configure(steps=[2, 3], tool="nsys", save_path=sys.argv[1], exit_hooks=False)
for step in range(1, 5):
    with profctx.profile_step(step):
        with profctx.profile_step(role="work"):
            torch.ones(1024, device="cuda").sum().item()
profctx.flush()
"""


@pytest.mark.skipif(shutil.which("nsys") is None, reason="needs the nsys command")
def test_under_nsys_each_range_becomes_a_report(tmp_path: Path) -> None:
    from profctx.backends.nsys import nsys_command
    from profctx.core._config import ProfilerConfig

    config = ProfilerConfig(steps=[2, 3], tool="nsys", save_path=str(tmp_path))
    script = tmp_path / "run.py"
    script.write_text(SCRIPT)
    argv = nsys_command(config, [sys.executable, str(script), str(tmp_path)], output=str(tmp_path / "rep"))
    subprocess.run(argv, check=True, timeout=300)
    assert len(list(tmp_path.glob("rep*.nsys-rep"))) == 2


def test_memory_snapshot_holds_the_capture_allocations(tmp_path: Path) -> None:
    profctx.configure(steps=[3], tool="torch_memory", save_path=str(tmp_path), exit_hooks=False)
    with profctx.profile_step(3), profctx.profile_step(role="alloc"):
        kept = torch.empty(1 << 20, device="cuda")
    record = only(tmp_path)
    snapshot = pickle.loads((tmp_path / record["files"][0]["path"]).read_bytes())
    sizes = [e["size"] for trace in snapshot["device_traces"] for e in trace if e["action"] == "alloc"]
    assert kept.numel() * 4 in sizes
