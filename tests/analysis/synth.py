"""Synthetic but torch-shaped runs: a manifest plus Chrome traces shaped like torch.profiler's.

Each trace holds torch's metadata events, the whole-capture ``Trace`` span, nested ``cpu_op``
events (an outer op calling a leaf op) and, optionally, CUDA kernels, with the top-level keys
torch writes (``schemaVersion``, ``distributedInfo``, ``baseTimeNanoseconds``). As profctx's
torch backend writes them, each capture's roles are ranges inside a ``ProfilerStep#N`` marker,
listed in the ``profctxRanges`` metadata (``Spec.listed=False``: traces of another producer,
without the list, and in role mode without ranges). Used by the
analysis tests and by ``benchmarks/bench_analysis.py``; the figures it encodes are known, so
tests can check the summary against them.
"""

from __future__ import annotations

import gzip
import json
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BASE_NS = 1_800_000_000_000_000_000


@dataclass
class Spec:
    """What to write. Role seconds are per process and step; ``slow`` multiplies some (rank, role) cells."""

    run: str = "synth"
    steps: tuple[int, ...] = (1, 2)
    ranks: int = 4
    roles: Mapping[str, float] = field(default_factory=lambda: {"rollout": 0.4, "ref": 0.1, "actor_update": 0.3})
    ops: Mapping[str, tuple[str, str]] = field(default_factory=dict)
    slow: Mapping[tuple[int, str], float] = field(default_factory=dict)
    step_scale: Mapping[int, float] = field(default_factory=dict)
    op_scale: Mapping[str, float] = field(default_factory=dict)
    events: int = 40
    kernels: bool = False
    mode: str = "role"
    start: float = 1_800_000_000.0  # whole seconds: the traces' baseTimeNanoseconds
    group: str | None = "actor"
    listed: bool = True


def trace(pid: int, start_us: float, seconds: float, outer: str, leaf: str, events: int, kernels: bool,
          role_range: str | None = None, leaf_scale: float = 1.0, base_ns: int = BASE_NS,
          rank: int = 0) -> dict[str, Any]:
    """Return one torch-shaped trace: ``events`` pairs (outer holding leaf), filling ``seconds``."""
    out: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "ts": start_us, "pid": pid, "tid": 0, "args": {"name": "python"}},
        {"ph": "M", "name": "thread_name", "ts": start_us, "pid": pid, "tid": pid, "args": {"name": "thread"}},
    ]
    slot = seconds * 1e6 / events
    if role_range:
        out.append({"ph": "X", "cat": "user_annotation", "name": role_range, "pid": pid, "tid": pid,
                    "ts": round(start_us, 3), "dur": round(seconds * 1e6, 3)})
    for i in range(events):
        ts = start_us + i * slot
        # The leaf takes 60 % of each slot (times leaf_scale), the outer op the whole slot minus a gap.
        leaf_dur = slot * 0.6 * leaf_scale
        outer_dur = max(slot * 0.9, leaf_dur + 1)
        out.append({"ph": "X", "cat": "cpu_op", "name": outer, "pid": pid, "tid": pid, "ts": round(ts, 3),
                    "dur": round(outer_dur, 3), "args": {"External id": i, "Input Dims": [[64, 64], [64, 64]],
                                                          "Input type": ["float", "float"]}})
        out.append({"ph": "X", "cat": "cpu_op", "name": leaf, "pid": pid, "tid": pid, "ts": round(ts + 1, 3),
                    "dur": round(leaf_dur - 2, 3), "args": {"External id": i + 100000}})
        if kernels:
            out.append({"ph": "X", "cat": "kernel", "name": f"{leaf}_kernel", "pid": 0, "tid": 7,
                        "ts": round(ts + 2, 3), "dur": round(leaf_dur / 2, 3),
                        "args": {"device": 0, "stream": 7, "correlation": i}})
    out.append({"ph": "X", "cat": "Trace", "name": "PyTorch Profiler (0)", "pid": "Spans", "tid": "PyTorch Profiler",
                "ts": start_us, "dur": seconds * 1e6})
    return {"schemaVersion": 1, "distributedInfo": {"rank": rank}, "traceEvents": out,
            "baseTimeNanoseconds": base_ns, "traceName": "synthetic"}


def write_run(save_path: Path, spec: Spec, *, cache: dict[Any, bytes] | None = None) -> Path:
    """Write the manifest and traces of ``spec`` under ``save_path``; return ``save_path``.

    ``cache`` reuses the bytes of a trace already written for the same shape (for big runs).
    """
    shards: dict[int, list[str]] = {}
    # Times are kept as offsets from the run's start (exact in floating point) and made Unix times at the end.
    clock = 0.0
    base_s = 0.0
    origin = spec.start
    for step in spec.steps:
        scale = spec.step_scale.get(step, 1.0)
        step_roles = list(spec.roles.items())
        longest = 0.0
        for rank in range(spec.ranks):
            t = clock
            captures: list[tuple[str | None, float, float, list[tuple[str, float, float]]]] = []
            if spec.mode == "role":
                for role, seconds in step_roles:
                    d = seconds * scale * spec.slow.get((rank, role), 1.0)
                    captures.append((role, t, d, []))
                    t += d + 0.01
            else:
                ranges = []
                begin = t
                for role, seconds in step_roles:
                    d = seconds * scale * spec.slow.get((rank, role), 1.0)
                    ranges.append((role, t, d))
                    t += d
                captures.append((None, begin, t - begin, ranges))
            longest = max(longest, t - clock)
            for role, begin, duration, ranges in captures:
                folder = f"step{step:06d}/{role or 'step'}"
                name = f"rank{rank}-of-{spec.ranks}_host_{1000 + rank}.{int((origin + begin) * 1000)}.pt.trace.json.gz"
                path = save_path / folder / name
                path.parent.mkdir(parents=True, exist_ok=True)
                pid = 1000 + rank
                if ranges:
                    doc = None
                    for r_role, r_begin, r_dur in ranges:
                        outer, leaf = spec.ops.get(r_role, (f"{r_role}::outer", f"{r_role}::leaf"))
                        part = trace(pid, (r_begin - base_s) * 1e6, r_dur, outer, leaf, spec.events, spec.kernels,
                                     role_range=r_role, leaf_scale=spec.op_scale.get(leaf, 1.0),
                                     base_ns=int(origin) * 10**9, rank=rank)
                        if doc is None:
                            doc = part
                        else:
                            doc["traceEvents"].extend(part["traceEvents"])
                    assert doc is not None
                    if spec.listed:
                        _mark(doc, step, pid, (begin - base_s) * 1e6, duration, [r for r, _, _ in ranges])
                    data = gzip.compress(json.dumps(doc, indent=1).encode(), 1)
                    path.write_bytes(data)
                else:
                    assert role is not None
                    outer, leaf = spec.ops.get(role, (f"{role}::outer", f"{role}::leaf"))
                    key = (role, round(duration, 9), spec.events, spec.kernels, spec.op_scale.get(leaf, 1.0), rank,
                           step if spec.listed else None)
                    data_cached = cache.get(key) if cache is not None else None
                    if data_cached is None:
                        doc = trace(pid, (begin - base_s) * 1e6, duration, outer, leaf, spec.events, spec.kernels,
                                    role_range=role if spec.listed else None,
                                    leaf_scale=spec.op_scale.get(leaf, 1.0), base_ns=int(origin) * 10**9,
                                    rank=rank)
                        if spec.listed:
                            _mark(doc, step, pid, (begin - base_s) * 1e6, duration, [role])
                        data_cached = gzip.compress(json.dumps(doc, indent=1).encode(), 1)
                        if cache is not None:
                            cache[key] = data_cached
                    path.write_bytes(data_cached)
                capture = f"{spec.run}-{step}-{rank}-{role or 'step'}"
                common = {"v": 1, "run": spec.run, "rank": rank, "world_size": spec.ranks, "host": "host",
                          "pid": pid, "capture": capture, "kind": spec.mode, "steps": [step], "step": step,
                          "role": role, "backend": "torch", "folder": folder}
                if spec.group:
                    common["group"] = spec.group
                lines = shards.setdefault(rank, [])
                lines.append(json.dumps({**common, "event": "started", "start_time": origin + begin}))
                lines.append(json.dumps({**common, "event": "finished", "status": "ok", "start_time": origin + begin,
                                         "end_time": origin + begin + duration, "duration_s": duration,
                                         "blocked_s": 0.001,
                                         "files": [{"path": f"{folder}/{name}", "bytes": len(path.read_bytes())}],
                                         "bytes": 0, "error": None, "notes": []}))
        clock += longest + 1.0
    manifest = save_path / ".profctx"
    manifest.mkdir(parents=True, exist_ok=True)
    for rank, lines in shards.items():
        (manifest / f"{spec.run}.rank{rank}-of-{spec.ranks}.host.{1000 + rank}.jsonl").write_text(
            "\n".join(lines) + "\n")
    return save_path


def _mark(doc: dict[str, Any], step: int, pid: int, start_us: float, seconds: float, roles: list[str]) -> None:
    """Add the step marker around the capture and the list of profctx's ranges, as the torch backend does."""
    doc["traceEvents"].insert(2, {"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}", "pid": pid,
                                  "tid": pid, "ts": round(start_us, 3), "dur": round(seconds * 1e6, 3)})
    doc["profctxRanges"] = {"version": 1, "roles": sorted(set(roles)), "steps": [f"ProfilerStep#{step}"]}


def copy_run(src: Path, dst: Path) -> Path:
    """Copy a run folder."""
    shutil.copytree(src, dst)
    return dst
