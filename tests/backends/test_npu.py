"""The npu backend against the torch_npu 2.14 double (engine-apis.md §3)."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import pytest

import profctx
from profctx.records._manifest import read

from .doubles import torch_npu as npu_double


@pytest.fixture
def npu(monkeypatch: pytest.MonkeyPatch) -> npu_double.NpuState:
    return npu_double.install(monkeypatch)


def run_step(tmp_path: Path, **fields: Any) -> dict[str, Any]:
    profctx.configure(steps=[3], tool="npu", save_path=str(tmp_path), exit_hooks=False, **fields)
    with profctx.profile_step(3), profctx.profile_step(role="rollout"):
        pass
    profctx.flush()
    (record,) = read(tmp_path)
    return record


def test_empty_contents_records_cpu_and_npu_with_mstx_and_a_one_step_schedule(
    npu: npu_double.NpuState, tmp_path: Path
) -> None:
    record = run_step(tmp_path)
    assert record["status"] == "ok", record
    (prof,) = npu.profiles
    assert prof["activities"] == ["CPU", "NPU"]
    assert not any(prof[k] for k in ("record_shapes", "profile_memory", "with_stack"))
    assert prof["experimental"]["mstx"] is True
    assert prof["experimental"]["profiler_level"] == "Level0"
    assert npu.schedules == [{"wait": 0, "active": 1, "warmup": 0, "repeat": 1, "skip_first": 0}]
    assert not [p for p in npu.printed if "Incorrect schedule" in p or "ERROR" in p]
    names = [Path(f["path"]).name for f in record["files"]]
    assert "trace_view.json" in names
    (session,) = (tmp_path / "step000003" / "step").glob("rank0-of-1_*_ascend_pt")
    assert json.loads((session / "profiler_metadata.json").read_text())["profctx"]["step"] == 3


def test_contents_map_to_activities_and_flags(npu: npu_double.NpuState, tmp_path: Path) -> None:
    run_step(tmp_path, contents=["cpu", "shapes", "memory"])
    (prof,) = npu.profiles
    assert prof["activities"] == ["CPU"]
    assert prof["record_shapes"] and prof["profile_memory"] and not prof["with_stack"]


def test_npu_asked_for_without_an_npu_is_a_note_and_a_cpu_capture(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    state = npu_double.install(monkeypatch, npu_available=False)
    record = run_step(tmp_path, contents=["npu"])
    assert record["status"] == "ok"
    assert state.profiles[0]["activities"] == ["CPU"]
    assert any("no NPU is available" in n for n in record["notes"])


def test_options_reach_the_experimental_config(npu: npu_double.NpuState, tmp_path: Path) -> None:
    record = run_step(tmp_path, tool_options={"level": "level1", "aic_metrics": "PipeUtilization",
                                              "export_type": ["text", "db"], "mstx_domain_exclude": ["communication"]})
    experimental = npu.profiles[0]["experimental"]
    assert experimental["profiler_level"] == "Level1"
    assert experimental["aic_metrics"] == "ACL_AICORE_PIPE_UTILIZATION"
    assert experimental["export_type"] == ["text", "db"]
    assert experimental["mstx_domain_exclude"] == ["communication"]
    names = {Path(f["path"]).name for f in record["files"]}
    assert {"trace_view.json", "analysis.db"} <= names


def test_without_analysis_the_raw_data_is_listed_with_a_note(npu: npu_double.NpuState, tmp_path: Path) -> None:
    record = run_step(tmp_path, tool_options={"analyse": False})
    assert record["status"] == "ok"
    assert {Path(f["path"]).name for f in record["files"]} == {"profiler_info.json", "profiler_metadata.json"}
    assert any("analyse(" in n for n in record["notes"])
    assert not list(tmp_path.rglob("ASCEND_PROFILER_OUTPUT"))


def test_a_swallowed_analysis_error_is_a_recorded_failure(npu: npu_double.NpuState, tmp_path: Path,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROFCTX_TEST_NPU_FAIL_ANALYSE", "parser crashed")
    record = run_step(tmp_path)
    assert record["status"] == "failed"
    assert "analysis wrote nothing" in record["error"]
    assert "Call analyse failed" in record["error"] and "parser crashed" in record["error"]  # printed, not raised


def test_analysis_runs_in_a_child_and_leaves_this_process_start_method_alone(
    npu: npu_double.NpuState, tmp_path: Path
) -> None:
    import multiprocessing

    before = multiprocessing.get_start_method(allow_none=True)
    record = run_step(tmp_path)
    assert record["status"] == "ok", record
    assert any(Path(f["path"]).parent.name == "ASCEND_PROFILER_OUTPUT" for f in record["files"])
    assert multiprocessing.get_start_method(allow_none=True) == before  # torch_npu's fork switch stayed in the child


def test_msprof_environment_disables_the_api_and_the_capture_fails_with_a_note(
    npu: npu_double.NpuState, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PROFILER_SAMPLECONFIG", "--aic-metrics=PipeUtilization")
    record = run_step(tmp_path)
    assert record["status"] == "failed"
    assert "PROFILER_SAMPLECONFIG is set" in record["error"]
    assert any("msprof" in n for n in record["notes"])


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"contents": ["cuda"]}, "contents"),
        ({"tool_options": {"level": "Level3"}}, "tool_options.level"),
        ({"tool_options": {"aic_metrics": "Memory"}}, "tool_options.aic_metrics"),
        ({"tool_options": {"aic_metrics": "Bogus", "level": "level2"}}, "tool_options.aic_metrics"),
        ({"tool_options": {"export_type": "json"}}, "tool_options.export_type"),
        ({"tool_options": {"analyse": "yes"}}, "tool_options.analyse"),
        ({"tool_options": {"mstx_domain_exclude": ["profctx"]}}, "tool_options.mstx_domain_exclude"),
        ({"tool_options": {"compress_level": 3}}, "tool_options.compress_level"),
    ],
)
def test_bad_npu_config_is_refused_at_configure_time(
    npu: npu_double.NpuState, tmp_path: Path, fields: dict[str, Any], field: str
) -> None:
    with pytest.raises(profctx.ConfigError) as caught:
        profctx.configure(steps=[3], tool="npu", save_path=str(tmp_path), **fields)
    assert caught.value.field == field
    assert npu.profiles == []


def test_npu_without_torch_npu_is_a_config_error(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setitem(sys.modules, "torch_npu", None)  # import torch_npu raises ImportError
    with pytest.raises(profctx.ConfigError, match="torch_npu"):
        profctx.configure(steps=[3], tool="npu", save_path=str(tmp_path))
