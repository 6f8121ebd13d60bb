"""``tool="auto"`` logs and records its choice; the torch backend's CUDA fallback warns once and notes it."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import pytest
import torch

import profctx
from profctx.records._manifest import read

from .doubles import torch_npu as npu_double


def one_capture(tmp_path: Path, **fields: object) -> dict[str, object]:
    profctx.configure(steps=[3], save_path=str(tmp_path), exit_hooks=False, **fields)
    with profctx.profile_step(3):
        pass
    profctx.flush()
    (record,) = read(tmp_path)
    return record


@pytest.mark.parametrize(
    ("npu", "tool", "reason"),
    [
        ("present", "npu", "an NPU is available"),
        ("absent", "torch", "no NPU is available"),
        ("not installed", "torch", "torch_npu is not installed"),
    ],
)
def test_auto_logs_and_records_its_choice(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, caplog: pytest.LogCaptureFixture, npu: str, tool: str,
    reason: str
) -> None:
    if npu == "not installed":
        monkeypatch.setitem(sys.modules, "torch_npu", None)
    else:
        npu_double.install(monkeypatch, npu_available=npu == "present")
    with caplog.at_level(logging.INFO, logger="profctx"):
        record = one_capture(tmp_path, tool="auto", tool_options={})
    assert record["backend"] == tool
    assert record["status"] == "ok", record
    assert any(reason in str(n) and f"chose {tool!r}" in str(n) for n in record["notes"])  # type: ignore[union-attr]
    assert [m for m in caplog.messages if f"chose {tool!r}" in m]


@pytest.mark.skipif(torch.cuda.is_available(), reason="needs a machine without CUDA")
def test_cuda_asked_for_without_cuda_warns_once_notes_each_capture_and_records_cpu(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    profctx.configure(steps=[3, 4], save_path=str(tmp_path), exit_hooks=False, contents=["cuda"], compress=False)
    with caplog.at_level(logging.WARNING, logger="profctx"):
        for step in (3, 4):
            with profctx.profile_step(step):
                torch.ones(8).sum()
    profctx.flush()
    records = read(tmp_path)
    assert [r["status"] for r in records] == ["ok", "ok"]
    assert all(any("CUDA is not available" in n for n in r["notes"]) for r in records)
    assert len([m for m in caplog.messages if "CUDA is not available" in m]) == 1
    trace = (tmp_path / records[0]["files"][0]["path"]).read_text()
    assert '"aten::sum"' in trace and '"cat": "kernel"' not in trace
