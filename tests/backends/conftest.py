"""One harness per backend, so the contract suite is written once and run against each.

A harness installs what its backend needs on this CPU-only machine (a double where the
real component cannot run), and says how to observe the backend from outside: whether its
native profiler is running, how many native starts and stops it saw, which range names its
output files hold, and how to make its next capture fail the way that component fails.
"""

from __future__ import annotations

import gzip
import json
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from profctx.testing import RecordingBackend

from .doubles import cuda as cuda_double
from .doubles import torch_npu as npu_double


@dataclass
class Probe:
    """How a test observes one backend in this process."""

    running: Callable[[], bool] = lambda: False
    #: (starts, stops) seen by the native profiler, or None where it cannot be counted.
    counts: Callable[[], tuple[int, int] | None] = lambda: None
    #: Range names found in a capture's output files, or None where the output holds none.
    ranges_in: Callable[[list[Path]], list[str] | None] = lambda files: None
    #: Range calls as (name, whether the native profiler was running), or None where unseen.
    range_calls: Callable[[], list[tuple[str, bool]] | None] = lambda: None
    #: Make the next capture fail as the component would; returns an undo (or None).
    break_next: Callable[[], Callable[[], None] | None] | None = None
    state: Any = None


@dataclass
class Harness:
    tool: str
    install: Callable[[pytest.MonkeyPatch], Probe]
    contents: tuple[str, ...] = ()
    options: dict[str, Any] = field(default_factory=dict)
    writes_files: bool = True

    def __str__(self) -> str:
        return self.tool


def _noop(monkeypatch: pytest.MonkeyPatch) -> Probe:
    return Probe()


def _recording(monkeypatch: pytest.MonkeyPatch) -> Probe:
    def ranges_in(files: list[Path]) -> list[str]:
        return [name for f in files for name in json.loads(f.read_text())["ranges"]]

    return Probe(
        running=lambda: RecordingBackend._live > 0,
        counts=lambda: (len(RecordingBackend.log), sum(1 for c in RecordingBackend.log if c.stopped is not None)),
        ranges_in=ranges_in,
    )


def _torch(monkeypatch: pytest.MonkeyPatch) -> Probe:
    import torch.autograd.profiler
    from torch.profiler import profile

    def ranges_in(files: list[Path]) -> list[str]:
        names = []
        for f in files:
            data = json.loads(gzip.decompress(f.read_bytes()) if f.suffix == ".gz" else f.read_bytes())
            names += [e["name"] for e in data["traceEvents"] if e.get("cat") == "user_annotation"]
        return names

    def break_next() -> Callable[[], None]:
        foreign = profile()  # another torch profiler owns the process's one session
        foreign.start()
        return foreign.stop

    # torch's flag for "a profiler is on", also set for all-threads sessions (unlike _profiler_enabled()).
    return Probe(running=lambda: bool(torch.autograd.profiler._is_profiler_enabled), ranges_in=ranges_in,
                 break_next=break_next)


def _npu(monkeypatch: pytest.MonkeyPatch) -> Probe:
    state = npu_double.install(monkeypatch)

    def ranges_in(files: list[Path]) -> list[str]:
        names = []
        for f in files:
            if f.name == "trace_view.json":
                names += [e["name"] for e in json.loads(f.read_text()) if e.get("cat") == "mstx"]
        return names

    def break_next() -> None:
        state.fail_start = "aclrtSetDevice failed: device busy"

    return Probe(
        running=lambda: state.enabled,
        counts=lambda: (state.starts, state.stops),
        ranges_in=ranges_in,
        range_calls=lambda: [(e[1], e[3]) for e in state.events if e[0] == "range_start"],
        break_next=break_next,
        state=state,
    )


def _nsys(monkeypatch: pytest.MonkeyPatch) -> Probe:
    import nvtx

    state = cuda_double.install_profiler(monkeypatch)
    calls: list[tuple[str, bool]] = []
    real_start = nvtx.start_range

    def start_range(message: str | None = None, color: Any = None, domain: str | None = None,
                    category: Any = None, payload: Any = None) -> Any:
        calls.append((str(message), state.active))
        return real_start(message=message, color=color, domain=domain, category=category, payload=payload)

    monkeypatch.setattr(nvtx, "start_range", start_range)  # a spy: the real nvtx call still runs

    def ranges_in(files: list[Path]) -> list[str]:
        return [name for f in files for name in json.loads(f.read_text())["nvtx_ranges"]]

    def break_next() -> Callable[[], None]:
        state.fail = RuntimeError("Found no NVIDIA driver on your system.")

        def undo() -> None:
            state.fail = None

        return undo

    return Probe(
        running=lambda: state.active,
        counts=lambda: (state.starts, state.stops),
        ranges_in=ranges_in,
        range_calls=lambda: list(calls),
        break_next=break_next,
        state=state,
    )


def _torch_memory(monkeypatch: pytest.MonkeyPatch) -> Probe:
    state = cuda_double.install_memory(monkeypatch)

    def break_next() -> Callable[[], None]:
        state.fail_snapshot = RuntimeError("CUDA error: an illegal memory access was encountered")

        def undo() -> None:
            state.fail_snapshot = None

        return undo

    return Probe(
        running=lambda: state.recording is not None,
        counts=lambda: (state.starts, state.stops),
        break_next=break_next,
        state=state,
    )


HARNESSES = [
    Harness("noop", _noop, writes_files=False),
    Harness("recording", _recording),
    Harness("torch", _torch, options={"compress_level": 1}),
    Harness("npu", _npu),
    Harness("nsys", _nsys),
    Harness("torch_memory", _torch_memory),
]


@pytest.fixture(params=HARNESSES, ids=str)
def harness(request: pytest.FixtureRequest) -> Harness:
    h: Harness = request.param
    return h


@pytest.fixture
def probe(harness: Harness, monkeypatch: pytest.MonkeyPatch) -> Iterator[Probe]:
    yield harness.install(monkeypatch)
