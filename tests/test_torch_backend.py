"""The torch backend on CPU: real traces with role ranges, identity metadata and safe file names."""

from __future__ import annotations

import contextvars
import gzip
import json
import os
import re
import socket
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

import pytest

import profctx
from profctx.records._manifest import read

torch = pytest.importorskip("torch")


def work(n: int = 3) -> None:
    x = torch.randn(64, 64)
    for _ in range(n):
        x = x @ x
        x = x / x.norm()


def load_trace(path: Path) -> dict[str, Any]:
    opener = gzip.open if path.suffix == ".gz" else open
    with opener(path, "rt") as fh:
        data: dict[str, Any] = json.load(fh)
    return data


def names(trace: dict[str, Any]) -> set[str]:
    return {str(e.get("name")) for e in trace["traceEvents"]}


def test_step_mode_trace_has_ranges_metadata_and_tensorboard_name(tmp_path: Path) -> None:
    profctx.configure(steps=[2], save_path=tmp_path, rank=1, world_size=2, run_id="run-1", ranks="all")
    for step in (1, 2, 3):
        with profctx.profile_step(step):
            with profctx.profile_step(role="rollout"):
                work()
            with profctx.profile_step(role="actor_update"):
                work()
    assert profctx.flush(30)
    records = read(tmp_path)
    assert [(r["step"], r["role"], r["status"], r["rank"]) for r in records] == [(2, None, "ok", 1)]
    (entry,) = records[0]["files"]
    path = tmp_path / entry["path"]
    assert path.parent == tmp_path / "step000002" / "step"
    host = re.sub(r"[^A-Za-z0-9._-]+", "-", socket.gethostname())
    assert re.fullmatch(rf"rank1-of-2_{re.escape(host)}_{os.getpid()}\.\d+\.pt\.trace\.json\.gz", path.name)
    assert entry["bytes"] == path.stat().st_size > 0
    trace = load_trace(path)
    assert {"rollout", "actor_update"} <= names(trace)
    meta = trace["profctx"]
    assert (meta["step"], meta["role"], meta["rank"], meta["world_size"], meta["run"]) == (2, None, 1, 2, "run-1")
    assert meta["host"] == socket.gethostname() and meta["pid"] == os.getpid()
    assert trace["distributedInfo"]["rank"] == 1 and trace["distributedInfo"]["world_size"] == 2
    assert not [p for p in tmp_path.rglob("*") if p.name.endswith(".tmp")]


def test_role_mode_nested_roles_are_ranges_and_folders_nest(tmp_path: Path) -> None:
    profctx.configure(steps="1:3", mode="role", roles=["train"], save_path=tmp_path, compress=False)
    for step in (1, 2):
        with profctx.profile_step(step), profctx.profile_step(role="train"):
            with profctx.profile_step(role="fwd"):
                work()
            with profctx.profile_step(role="bwd"):
                work()
    assert profctx.flush(30)
    records = read(tmp_path)
    assert [(r["step"], r["role"], r["folder"]) for r in records] == [
        (1, "train", "step000001/train"), (2, "train", "step000002/train")]
    for record in records:
        path = tmp_path / record["files"][0]["path"]
        assert path.name.endswith(".pt.trace.json")
        trace = load_trace(path)
        assert {"fwd", "bwd"} <= names(trace)
        assert "train" in names(trace)  # the role capture's own role is its top-level range
        assert trace["profctx"]["role"] == "train"


def test_contiguous_capture_spans_the_run(tmp_path: Path) -> None:
    profctx.configure(steps=[1, 2, 3, 7], contiguous=True, save_path=tmp_path)
    for step in range(1, 9):
        with profctx.profile_step(step), profctx.profile_step(role=f"r{step}"):
            work(1)
    assert profctx.flush(30)
    records = read(tmp_path)
    assert [(r["steps"], r["folder"]) for r in records] == [
        ([1, 2, 3], "step000001-000003/step"), ([7], "step000007/step")]
    trace = load_trace(tmp_path / records[0]["files"][0]["path"])
    assert {"r1", "r2", "r3"} <= names(trace) and "r4" not in names(trace)


def test_roles_entered_on_other_threads_appear_with_all_threads(tmp_path: Path) -> None:
    profctx.configure(steps=[1], save_path=tmp_path, tool_options={"all_threads": True})

    def worker() -> None:
        with profctx.profile_step(role="from_thread"):
            work(1)

    with profctx.profile_step(1):
        # A plain thread starts with an empty context: hand it this one.
        thread = threading.Thread(target=contextvars.copy_context().run, args=(worker,))
        thread.start()
        thread.join()
    assert profctx.flush(30)
    (record,) = read(tmp_path)
    assert "from_thread" in names(load_trace(tmp_path / record["files"][0]["path"]))


def test_no_record_function_outside_a_live_capture(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    calls: list[str] = []
    original = torch.profiler.record_function

    def counting(name: str, *args: Any) -> Any:
        calls.append(name)
        return original(name, *args)

    monkeypatch.setattr(torch.profiler, "record_function", counting)
    profctx.configure(steps=[5], ranks=[1], rank=0, world_size=2, save_path=tmp_path)
    for step in (4, 5):
        with profctx.profile_step(step), profctx.profile_step(role="rollout"):
            work(1)
    assert calls == []
    profctx.configure(steps=[5], save_path=tmp_path)
    with profctx.profile_step(5), profctx.profile_step(role="rollout"):
        work(1)
    assert calls == ["ProfilerStep#5", "rollout"]  # the step marker, then the role


def test_cuda_asked_for_without_cuda_is_noted(tmp_path: Path) -> None:
    if torch.cuda.is_available():
        pytest.skip("CUDA is present")
    profctx.configure(steps=[1], contents=["cpu", "cuda", "shapes"], save_path=tmp_path)
    with profctx.profile_step(1):
        work(1)
    assert profctx.flush(30)
    (record,) = read(tmp_path)
    assert record["status"] == "ok"
    assert any("CUDA is not available" in note for note in record["notes"])


@pytest.mark.parametrize("all_threads", [False, True])
def test_a_foreign_torch_profiler_makes_the_capture_fail_not_crash(tmp_path: Path, all_threads: bool) -> None:
    from torch._C._profiler import _ExperimentalConfig

    profctx.configure(steps=[1], save_path=tmp_path)
    config = _ExperimentalConfig(profile_all_threads=True) if all_threads else None
    activities = [torch.profiler.ProfilerActivity.CPU]
    with torch.profiler.profile(activities=activities, experimental_config=config), profctx.profile_step(1):
        work(1)
    assert profctx.flush(30)
    (record,) = read(tmp_path)
    assert record["status"] == "failed"
    assert "not started by profctx" in record["error"]


def test_contents_map_to_torch_profiler_options(tmp_path: Path) -> None:
    def capture_args(contents: list[str]) -> list[dict[str, Any]]:
        save = tmp_path / "-".join(contents or ["default"])
        profctx.configure(steps=[1], save_path=save, contents=contents)
        with profctx.profile_step(1):
            torch.randn(8, 8) @ torch.randn(8, 8)
        assert profctx.flush(30)
        (record,) = read(save)
        trace = load_trace(save / record["files"][0]["path"])
        return [e.get("args", {}) for e in trace["traceEvents"] if e.get("name") == "aten::mm"]

    plain = capture_args([])
    assert plain and not any("Input Dims" in a for a in plain)
    shaped = capture_args(["cpu", "shapes"])
    assert any(a.get("Input Dims") == [[8, 8], [8, 8]] for a in shaped)


@pytest.mark.parametrize("cuda", [True, False])
def test_a_capture_after_a_cuda_capture_starts_once_its_trace_is_exported(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cuda: bool) -> None:
    # torch exports a CUDA trace's GPU times with ts 0 and dur 0 once the next session has started (seen on an
    # H200, benchmarks/gpu_check.py): a capture that recorded CUDA activity makes the next start wait for its
    # export. CPU-only captures never wait. The backend is told which it recorded (this CPU build records no CUDA).
    # tests/backends/test_gpu.py checks the real thing: back-to-back CUDA captures keep their kernel times.
    from torch.profiler import profile

    import profctx.backends.torch as backend

    monkeypatch.setattr(backend, "exported_before_next_start", lambda activities: cuda)  # also where CUDA is real
    seen: list[tuple[str, float]] = []
    export, start = profile.export_chrome_trace, profile.start

    def slow_export(self: Any, path: str) -> Any:
        threading.Event().wait(0.3)
        try:
            return export(self, path)
        finally:
            seen.append(("exported", time.perf_counter()))

    def noted_start(self: Any) -> Any:
        seen.append(("started", time.perf_counter()))
        return start(self)

    monkeypatch.setattr(profile, "export_chrome_trace", slow_export)
    monkeypatch.setattr(profile, "start", noted_start)
    profctx.configure(steps="1:3", save_path=tmp_path, exit_hooks=False, timeline=False)
    for step in (1, 2):
        with profctx.profile_step(step):
            work(1)
    assert profctx.flush(30)
    order = [what for what, _ in sorted(seen, key=lambda s: s[1])]
    records = sorted(read(tmp_path), key=lambda r: r["step"])
    assert [r["status"] for r in records] == ["ok", "ok"]
    waited = [n for n in records[1].get("notes", []) if "previous capture's CUDA trace" in n]
    if cuda:
        assert order == ["started", "exported", "started", "exported"]
        assert len(waited) == 1
    else:
        assert order == ["started", "started", "exported", "exported"]
        assert not waited


def test_a_cuda_capture_whose_export_never_ran_does_not_hold_the_next_start(monkeypatch: pytest.MonkeyPatch) -> None:
    # An interrupt between the stop and the queueing of its export drops the export unrun: the next start must
    # not wait for it (it waited up to two minutes).
    import profctx.backends.torch as backend
    from profctx.backends._base import CaptureSpec
    from profctx.util._identity import Identity

    monkeypatch.setattr(backend, "exported_before_next_start", lambda activities: True)
    tool = backend.TorchBackend()

    def spec(folder: Path) -> CaptureSpec:
        return CaptureSpec(capture_id="c", steps=(1,), roles=(), folder=folder, stem="s",
                           identity=Identity(0, 1, "host", os.getpid(), "test"), run_id="r", contents=("cpu",),
                           options={}, compress=False, metadata={})

    with tempfile.TemporaryDirectory() as tmp:
        tool.start(spec(Path(tmp)))
        finish = tool.stop()
        del finish  # never queued
        second = spec(Path(tmp))
        t0 = time.perf_counter()
        tool.start(second)
        waited = time.perf_counter() - t0
        tool.stop()()
    # The wait it had was up to two minutes; a profiler start is 15-130 ms on a quiet 2-core machine: 30 s
    # leaves a loaded one ample room and still tells the two apart.
    assert waited < 30 and not second.notes
