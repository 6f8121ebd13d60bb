"""A small CUDA trace in the shape torch 2.x writes (kineto with CUPTI), and a run folder holding it.

The main thread (pid = tid = :data:`PID`) draws ``ProfilerStep#3`` and, inside it, profctx's role
ranges ``rollout`` and ``actor_update`` (listed in ``profctxRanges``). Operators launch device
work through ``cuda_runtime`` calls carrying ``args.correlation``; the kernels, copies and sets
run on the device's stream 7 (pid 0, tid 7) with the same correlation, later than their launch,
some after the launching role's CPU range has closed (during the next role, or after the step).
Flow events (``ac2g``) mirror each link, as torch writes them. A second CPU thread draws no role
(autograd's backward thread) and launches a kernel during ``actor_update``. :data:`EXPECTED` is
the device time per (step, role) that launching decides; :data:`BY_TIME` what time overlap would
say instead.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

PID = 4242
#: The backward thread: no role range of its own.
BACKWARD = 4250
T0 = 4806806272551.016
BASE_NS = 1790857026000000000

#: Device microseconds per (step, role) by launch (``None``: launched in no role, or launch not found).
EXPECTED = {(3, "rollout"): 100.0 + 200.0 + 8.0, (3, "actor_update"): 50.0 + 40.0 + 30.0, (3, None): 10.0,
            (None, None): 5.0}
#: What kernels lying in each role's CPU range by time would give rollout and actor_update.
BY_TIME = {"rollout": 100.0 + 8.0, "actor_update": 200.0 + 50.0 + 30.0}


def _x(cat: str, name: str, ts: float, dur: float, tid: int | str = PID, pid: int | str = PID,
       args: dict[str, Any] | None = None) -> dict[str, Any]:
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": round(T0 + ts, 3), "dur": dur,
            "args": args or {}}


def _launch(name: str, ts: float, link: int, tid: int = PID) -> dict[str, Any]:
    return _x("cuda_runtime", name, ts, 4.0, tid=tid, args={"External id": link + 500, "cbid": 211,
                                                        "correlation": link})


def _device(cat: str, name: str, ts: float, dur: float, link: int) -> dict[str, Any]:
    return _x(cat, name, ts, dur, tid=7, pid=0, args={"External id": link + 500, "queued": 0, "device": 0,
                                                     "context": 1, "stream": 7, "correlation": link,
                                                     "registers per thread": 128, "grid": [64, 1, 1],
                                                     "block": [256, 1, 1]})


def _flows(ts: float, device_ts: float, link: int, tid: int = PID) -> list[dict[str, Any]]:
    return [{"ph": "s", "id": link, "pid": PID, "tid": tid, "ts": round(T0 + ts, 3), "cat": "ac2g", "name": "ac2g"},
            {"ph": "f", "id": link, "pid": 0, "tid": 7, "ts": round(T0 + device_ts, 3), "cat": "ac2g",
             "name": "ac2g", "bp": "e"}]


def events(padding: int = 0) -> list[dict[str, Any]]:
    """Return the trace's events; ``padding`` CPU operators come first (in the step, before any role)."""
    out: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "ts": T0 - 300, "pid": PID, "tid": 0, "args": {"name": "python"}},
        {"ph": "M", "name": "thread_name", "ts": T0 - 300, "pid": PID, "tid": PID,
         "args": {"name": f"thread {PID} (python)"}},
        {"ph": "M", "name": "process_name", "ts": T0 - 300, "pid": 0, "tid": 0, "args": {"name": "python"}},
        {"ph": "M", "name": "process_labels", "ts": T0 - 300, "pid": 0, "tid": 0, "args": {"labels": "GPU 0"}},
        {"ph": "M", "name": "thread_name", "ts": T0 - 300, "pid": 0, "tid": 7, "args": {"name": "stream 7 "}},
        _x("user_annotation", "ProfilerStep#3", 0.0, 1000.0, args={"External id": 1, "Record function id": 0}),
    ]
    for i in range(padding):  # 1e-3 µs each: all before the first role
        out.append(_x("cpu_op", "aten::empty", 1.0 + i * 1e-3, 5e-4, args={"External id": 10_000 + i,
                                                                         "Input Dims": [[64, 64]]}))
    out += [
        _x("user_annotation", "rollout", 10.0, 400.0, args={"External id": 2, "Record function id": 0}),
        _x("cpu_op", "aten::mm", 20.0, 30.0, args={"External id": 3, "Input Dims": [[64, 64], [64, 64]]}),
        _launch("cudaLaunchKernel", 25.0, 11),
        _x("cpu_op", "aten::zero_", 100.0, 20.0, args={"External id": 4}),
        _launch("cudaMemsetAsync", 105.0, 16),
        _x("cpu_op", "aten::mm", 370.0, 30.0, args={"External id": 5}),
        _launch("cuLaunchKernel", 380.0, 12) | {"cat": "cuda_driver"},
        _x("user_annotation", "actor_update", 420.0, 480.0, args={"External id": 6, "Record function id": 0}),
        _x("cpu_op", "aten::copy_", 425.0, 20.0, args={"External id": 7}),
        _launch("cudaMemcpyAsync", 430.0, 13),
        _x("cpu_op", "aten::add", 495.0, 15.0, args={"External id": 8}),
        _launch("cudaLaunchKernel", 500.0, 14),
        _launch("cudaStreamSynchronize", 890.0, 17),  # launches nothing
        _x("cpu_op", "aten::add", 945.0, 12.0, args={"External id": 9}),  # in the step, in no role
        _launch("cudaLaunchKernel", 950.0, 15),
        # The backward thread: an operator and its launch during actor_update, no range of its own.
        _x("cpu_op", "autograd::engine::evaluate_function: MmBackward0", 590.0, 30.0, tid=BACKWARD),
        _launch("cudaLaunchKernel", 600.0, 18, tid=BACKWARD),
        # Device work, in the order the device ran it.
        _device("kernel", "ampere_sgemm_64x64_nn", 60.0, 100.0, 11),
        _device("gpu_memset", "Memset (Device)", 170.0, 8.0, 16),
        _device("kernel", "ampere_sgemm_128x64_nn", 450.0, 200.0, 12),  # after rollout's range closed
        _device("kernel", "void at::native::vectorized_elementwise_kernel<4>", 660.0, 30.0, 18),
        _device("gpu_memcpy", "Memcpy HtoD (Pageable -> Device)", 700.0, 50.0, 13),
        _device("kernel", "void at::native::vectorized_elementwise_kernel<4>", 910.0, 40.0, 14),  # after the role
        _device("kernel", "void at::native::vectorized_elementwise_kernel<4>", 960.0, 10.0, 15),
        _device("kernel", "nccl_orphan", 980.0, 5.0, 99),  # its launch is not in the trace
        _x("gpu_user_annotation", "rollout", 60.0, 390.0, tid=7, pid=0),
        _x("Trace", "PyTorch Profiler (0)", -200.0, 1300.0, tid="PyTorch Profiler", pid="Spans"),
    ]
    for link, (ts, device_ts) in {11: (25, 60), 16: (105, 170), 12: (380, 450), 13: (430, 700), 14: (500, 910),
                                  15: (950, 960)}.items():
        out += _flows(ts, device_ts, link)
    out += _flows(600, 660, 18, tid=BACKWARD)
    return out


def document(padding: int = 0) -> dict[str, Any]:
    """Return the whole trace, with the top-level keys torch 2.x and profctx write."""
    return {"schemaVersion": 1,
            "deviceProperties": [{"id": 0, "name": "NVIDIA H200", "totalGlobalMem": 150_000_000_000,
                                  "computeMajor": 9, "computeMinor": 0, "maxThreadsPerBlock": 1024,
                                  "numSms": 132}],
            "cupti_version": 24, "cuda_runtime_version": 12040, "cuda_driver_version": 12040,
            "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": 1},
            "profctxRanges": {"version": 1, "roles": ["actor_update", "rollout"], "steps": ["ProfilerStep#3"]},
            "displayTimeUnit": "ms", "baseTimeNanoseconds": BASE_NS,
            "traceEvents": events(padding), "traceName": "cuda"}


def write_run(save: Path, doc: dict[str, Any], *, role: str | None = None, run: str = "cuda") -> Path:
    """Write ``doc`` as the one capture of step 3 of a run under ``save`` (``role``: a role-mode capture)."""
    folder = f"step000003/{role or 'step'}"
    name = f"rank0-of-1_host_{PID}.1795663834000.pt.trace.json.gz"
    path = save / folder / name
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(json.dumps(doc).encode(), 1))
    start = 1_795_663_834.0
    common = {"v": 1, "run": run, "rank": 0, "world_size": 1, "host": "host", "pid": PID, "capture": f"{run}-3",
              "kind": "role" if role else "step", "steps": [3], "step": 3, "role": role, "backend": "torch",
              "folder": folder}
    lines = [{**common, "event": "started", "start_time": start},
             {**common, "event": "finished", "status": "ok", "start_time": start, "end_time": start + 0.0015,
              "duration_s": 0.0015, "blocked_s": 0.001, "files": [{"path": f"{folder}/{name}",
                                                                   "bytes": path.stat().st_size}],
              "bytes": path.stat().st_size, "error": None, "notes": []}]
    manifest = save / ".profctx"
    manifest.mkdir(parents=True, exist_ok=True)
    (manifest / f"{run}.rank0-of-1.host.{PID}.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines))
    return save
