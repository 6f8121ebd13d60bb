"""The torch_memory backend: options reach torch's memory history; the snapshot file is trimmed."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import pytest
import torch

import profctx
from profctx._manifest import read

from .doubles import cuda as cuda_double


@pytest.mark.skipif(torch.backends.cuda.is_built(), reason="needs a CPU-only torch build")
def test_torch_memory_on_a_cpu_only_torch_build_is_a_config_error(tmp_path: Path) -> None:
    with pytest.raises(profctx.ConfigError, match="CPU-only"):
        profctx.configure(steps=[3], tool="torch_memory", save_path=str(tmp_path))


def test_history_is_recorded_over_the_capture_and_dumped_trimmed(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    state = cuda_double.install_memory(monkeypatch)
    profctx.configure(steps=[3], tool="torch_memory", save_path=str(tmp_path), exit_hooks=False,
                      contents=["stack"], tool_options={"max_entries": 5000, "stack_depth": 4, "context": "alloc"})
    with profctx.profile_step(3):
        assert state.recording == "all"
    assert state.recording is None
    start = state.calls[0]
    assert (start["max_entries"], start["context"], start["stacks"]) == (5000, "alloc", "all")
    assert start["clear_history"] and start["global_record_annotations"]
    profctx.flush()
    (record,) = read(tmp_path)
    assert record["status"] == "ok"
    (path,) = [tmp_path / f["path"] for f in record["files"]]
    assert path.name.endswith(".memory_snapshot.pickle") and path.parent == tmp_path / "step000003" / "step"
    snapshot = pickle.loads(path.read_bytes())
    assert len(snapshot["segments"][0]["blocks"][0]["frames"]) == 4
    assert len(snapshot["device_traces"][0][0]["frames"]) == 4


def test_python_frames_only_by_default(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    state = cuda_double.install_memory(monkeypatch)
    profctx.configure(steps=[3], tool="torch_memory", save_path=str(tmp_path), exit_hooks=False)
    with profctx.profile_step(3):
        pass
    assert state.calls[0]["stacks"] == "python" and state.calls[0]["max_entries"] == 100_000


@pytest.mark.parametrize(
    ("fields", "field"),
    [
        ({"tool_options": {"max_entries": 0}}, "tool_options.max_entries"),
        ({"tool_options": {"stack_depth": True}}, "tool_options.stack_depth"),
        ({"tool_options": {"context": "everything"}}, "tool_options.context"),
        ({"tool_options": {"trace_alloc_max_entries": 10}}, "tool_options.trace_alloc_max_entries"),
        ({"contents": ["cpu"]}, "contents"),
    ],
)
def test_bad_torch_memory_config_is_refused(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, fields: dict[str, Any], field: str
) -> None:
    cuda_double.install_memory(monkeypatch)
    with pytest.raises(profctx.ConfigError) as caught:
        profctx.configure(steps=[3], tool="torch_memory", save_path=str(tmp_path), **fields)
    assert caught.value.field == field
