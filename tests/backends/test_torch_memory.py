"""The torch_memory backend: options reach torch's memory history; the snapshot file is trimmed."""

from __future__ import annotations

import pickle
from pathlib import Path
from typing import Any

import pytest
import torch

import profctx
from profctx.records._manifest import read

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


# -- watch_oom: verl's torch_memory behaviour (memory history + OOM snapshot in every worker) -----------


def test_watch_oom_does_nothing_without_cuda(tmp_path: Path) -> None:
    if torch.cuda.is_available():
        pytest.skip("needs a machine without CUDA")
    from profctx.backends.torch_memory import watch_oom

    assert watch_oom(tmp_path) is None
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize(("kwargs", "field"), [({"max_entries": 0}, "tool_options.max_entries"),
                                               ({"context": "every"}, "tool_options.context"),
                                               ({"stacks": "cpp"}, "stacks")])
def test_watch_oom_refuses_bad_options(kwargs: dict[str, Any], field: str, tmp_path: Path) -> None:
    from profctx.backends.torch_memory import watch_oom

    with pytest.raises(profctx.ConfigError) as err:
        watch_oom(tmp_path, **kwargs)
    assert err.value.field == field


def test_watch_oom_records_history_and_writes_the_snapshot_at_oom(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """With the CUDA double: the observer torch calls at OOM writes the allocator snapshot."""
    from profctx.backends import torch_memory

    state = cuda_double.install_memory(monkeypatch)
    observers: list[Any] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch._C, "_cuda_attach_out_of_memory_observer", observers.append, raising=False)
    monkeypatch.setattr(torch_memory, "_oom_folder", None)
    monkeypatch.setattr(torch_memory, "_observing", [])  # this test's fake torch has no observer yet
    folder = torch_memory.watch_oom(tmp_path, max_entries=1000)
    assert folder == tmp_path / "oom"
    assert state.calls[-1]["enabled"] == "all" and state.calls[-1]["max_entries"] == 1000
    torch_memory.watch_oom(tmp_path)
    assert len(observers) == 1  # one observer per process
    observers[0](0, 1 << 30, 80 << 30, 1 << 20)
    (snapshot,) = folder.iterdir()
    assert snapshot.name.endswith(".memory_snapshot.pickle")
    with open(snapshot, "rb") as f:
        assert pickle.load(f)["segments"][0]["blocks"][0]["size"] == 512


def test_watch_oom_observer_never_raises(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    from profctx.backends import torch_memory

    state = cuda_double.install_memory(monkeypatch)
    state.fail_snapshot = RuntimeError("allocator busy")
    observers: list[Any] = []
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch._C, "_cuda_attach_out_of_memory_observer", observers.append, raising=False)
    monkeypatch.setattr(torch_memory, "_oom_folder", None)
    monkeypatch.setattr(torch_memory, "_observing", [])  # this test's fake torch has no observer yet
    torch_memory.watch_oom(tmp_path)
    observers[0](0, 1, 2, 3)  # logs, does not raise
    assert not (tmp_path / "oom").exists() or list((tmp_path / "oom").iterdir()) == []


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_watch_oom_on_a_real_gpu_writes_a_snapshot_when_an_allocation_fails(tmp_path: Path) -> None:
    from profctx.backends.torch_memory import watch_oom

    folder = watch_oom(tmp_path)
    assert folder is not None
    with pytest.raises(torch.cuda.OutOfMemoryError):
        torch.empty(1 << 50, dtype=torch.uint8, device="cuda")
    snapshots = list(folder.glob("*.memory_snapshot.pickle"))
    assert len(snapshots) == 1 and snapshots[0].stat().st_size > 0
