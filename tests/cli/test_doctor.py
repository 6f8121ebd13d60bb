"""``profctx doctor``: one line per finding, exit 1 only when profiling here is broken."""

from __future__ import annotations

import importlib.metadata
import json
from pathlib import Path

import pytest

from profctx.cli import main


def test_doctor_reports_this_machine(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["doctor", "--save-path", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    lines = {line.split()[1]: line for line in out.splitlines()}
    import torch

    assert torch.__version__ in lines["torch"]
    assert ("not available" in lines["cuda"]) != torch.cuda.is_available()
    assert {"torch_npu", "nsys", "ray", "vllm", "sglang", "save_path"} <= set(lines)
    assert importlib.metadata.version("ray") in lines["ray"]
    assert "is writable" in lines["save_path"] and str(tmp_path) in lines["save_path"]


def test_doctor_fails_on_an_unusable_save_path(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("x")
    assert main(["doctor", "--json", "--save-path", str(blocker)]) == 1
    findings = {f["subject"]: f for f in json.loads(capsys.readouterr().out)}
    assert findings["save_path"]["level"] == "fail" and "not a folder" in findings["save_path"]["message"]
    assert main(["doctor", "--json", "--save-path", str(blocker / "sub")]) == 1


def test_doctor_reads_engine_versions_and_adapter_capabilities(monkeypatch: pytest.MonkeyPatch,
                                                               capsys: pytest.CaptureFixture[str],
                                                               tmp_path: Path) -> None:
    real = importlib.metadata.version
    fake = {"vllm": "0.17.1", "sglang": "0.5.15"}

    def version(name: str) -> str:
        if name in fake:
            return fake[name]
        return real(name)

    monkeypatch.setattr(importlib.metadata, "version", version)
    main(["doctor", "--json", "--save-path", str(tmp_path)])
    findings = {f["subject"]: f for f in json.loads(capsys.readouterr().out)}
    assert findings["vllm"]["message"].startswith("0.17.1: adapter supports prefix")
    assert "iterations" in findings["vllm"]["message"].split("not in this version:")[1]
    assert "profile_id" in findings["sglang"]["message"] and "detailed_annotations" not in findings["sglang"]["message"]
