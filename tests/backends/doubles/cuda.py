"""Doubles of torch's CUDA profiler calls and CUDA memory history, for a CPU-only torch build.

``torch.cuda.profiler.start()/stop()`` wrap ``cudaProfilerStart/Stop``, which are no-ops when
already started/stopped (engine-apis.md §4.2). ``torch.cuda.memory._record_memory_history``,
``_snapshot`` keep their torch 2.13 signatures (checked against the installed torch by
test_doubles.py); the snapshot has torch's documented shape (``segments`` of ``blocks``
with ``frames``, ``device_traces`` of entries with ``frames``).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from typing import Any

import pytest
import torch
import torch.cuda.memory
import torch.cuda.profiler


@dataclass
class CudaProfilerState:
    """What the fake CUDA profiler API saw."""

    active: bool = False
    events: list[str] = field(default_factory=list)
    fail: BaseException | None = None

    @property
    def starts(self) -> int:
        return self.events.count("start")

    @property
    def stops(self) -> int:
        return self.events.count("stop")


def install_profiler(monkeypatch: pytest.MonkeyPatch) -> CudaProfilerState:
    """Make torch look like a CUDA build whose ``torch.cuda.profiler`` calls are recorded."""
    state = CudaProfilerState()

    def start() -> None:
        if state.fail is not None:
            raise state.fail
        state.active = True
        state.events.append("start")

    def stop() -> None:
        if state.fail is not None:
            raise state.fail
        state.active = False
        state.events.append("stop")

    monkeypatch.setattr(torch.backends.cuda, "is_built", lambda: True)
    monkeypatch.setattr(torch.cuda.profiler, "start", start)
    monkeypatch.setattr(torch.cuda.profiler, "stop", stop)
    return state


@dataclass
class CudaMemoryState:
    """What the fake CUDA memory history saw; ``frames`` is the stack depth of every fake event."""

    recording: str | None = None
    calls: list[dict[str, Any]] = field(default_factory=list)
    frames: int = 50
    fail_snapshot: BaseException | None = None

    @property
    def starts(self) -> int:
        return sum(1 for c in self.calls if c["enabled"] is not None)

    @property
    def stops(self) -> int:
        return sum(1 for c in self.calls if c["enabled"] is None)


def install_memory(monkeypatch: pytest.MonkeyPatch) -> CudaMemoryState:
    """Make torch look like a CUDA build with memory-history recording."""
    state = CudaMemoryState()

    def _record_memory_history(enabled: str | None = "all", context: str | None = "all", stacks: str = "all",
                               max_entries: int = sys.maxsize, device: Any = None, clear_history: bool = False,
                               compile_context: bool = False, global_record_annotations: bool = False,
                               skip_actions: list[str] | None = None) -> None:
        state.recording = enabled
        state.calls.append({"enabled": enabled, "context": context, "stacks": stacks, "max_entries": max_entries,
                            "clear_history": clear_history, "global_record_annotations": global_record_annotations})

    def _snapshot(device: Any = None, augment_with_fx_traces: bool = False) -> dict[str, Any]:
        if state.fail_snapshot is not None:
            raise state.fail_snapshot
        frames = [{"filename": "train.py", "line": i, "name": f"f{i}"} for i in range(state.frames)]
        block = {"size": 512, "requested_size": 500, "address": 4096, "state": "active_allocated",
                 "frames": list(frames)}
        return {
            "segments": [{"address": 4096, "total_size": 2 << 20, "stream": 0, "segment_type": "large",
                          "segment_pool_id": (0, 0), "allocated_size": 512, "active_size": 512, "blocks": [block]}],
            "device_traces": [[{"action": "alloc", "addr": 4096, "size": 512, "stream": 0, "time_us": 1,
                                "frames": list(frames)}]],
        }

    monkeypatch.setattr(torch.backends.cuda, "is_built", lambda: True)
    monkeypatch.setattr(torch.cuda.memory, "_record_memory_history", _record_memory_history)
    monkeypatch.setattr(torch.cuda.memory, "_snapshot", _snapshot)
    return state
