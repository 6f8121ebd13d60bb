"""Device time per role: each kernel, copy and set counts in the role that launched it (by correlation id)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path
from typing import Any

import pytest

from profctx.analysis import _trace, _tracedecode, read_figures, summarize
from profctx.cli import main

from . import cuda
from .synth import Spec
from .synth import write_run as write_synth


def _write(tmp_path: Path, doc: dict[str, Any]) -> Path:
    path = tmp_path / "t.pt.trace.json"
    path.write_text(json.dumps(doc))
    return path


def _figures(path: Path) -> tuple[Any, ...]:
    got = read_figures(path)
    return got.role_device, got.device, got.device_us, got.ops, got.roles, got.span_us, got.events, got.problem


@pytest.mark.parametrize("padding", [0, 12_000])  # 12,000 operators first: the device events come in a later batch
def test_device_time_counts_in_the_role_that_launched_it(tmp_path: Path, padding: int,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    path = _write(tmp_path, cuda.document(padding))
    got = read_figures(path)
    assert got.problem is None
    assert got.role_device == pytest.approx(cuda.EXPECTED)
    # A kernel that ran after its role's CPU range closed still counts in that role, not in the next one.
    assert got.role_device[(3, "rollout")] != cuda.BY_TIME["rollout"]
    assert got.device_us == pytest.approx(sum(cuda.EXPECTED.values()))
    # Runtime calls stay operators of the role they ran in; the backward thread's operator is lent actor_update.
    assert got.ops[(3, "rollout", "cuLaunchKernel")][2] == 1
    assert got.ops[(3, "actor_update", "cudaLaunchKernel")][2] == 2  # one on the main thread, one on backward's
    assert (3, "actor_update", "autograd::engine::evaluate_function: MmBackward0") in got.ops
    fast = _figures(path)
    # The fallback parser (no msgspec), and the loop over each event, give the same figures.
    with monkeypatch.context() as patched:
        for attr in ("_EVENTS", "_HEADS", "_RAWS"):
            patched.setattr(_tracedecode, attr, None)
        assert _figures(path) == fast
        patched.setattr(_trace, "_batch", lambda *args: None)
        assert _figures(path) == fast
    monkeypatch.setattr(_trace, "_batch", lambda *args: None)
    assert _figures(path) == fast


def test_a_trace_without_device_events_has_no_device_figures(tmp_path: Path) -> None:
    doc = cuda.document()
    doc["traceEvents"] = [e for e in doc["traceEvents"] if e.get("cat") not in _trace.DEVICE_CATS]
    got = read_figures(_write(tmp_path, doc))
    assert got.role_device == {} and got.device == {} and got.device_us == 0.0
    assert got.roles[(3, "rollout")][1] == 1


def test_the_summary_gives_device_seconds_per_role_and_step(tmp_path: Path) -> None:
    summary = summarize(cuda.write_run(tmp_path / "run", cuda.document()))
    (capture,) = summary.captures
    assert capture.role_device == pytest.approx({(3, "rollout"): 308e-6, (3, "actor_update"): 120e-6,
                                                 (3, "step"): 15e-6})
    rollout, update = summary.phase(3, "rollout"), summary.phase(3, "actor_update")
    assert rollout is not None and rollout.device_s == pytest.approx(308e-6)
    assert update is not None and update.device_s == pytest.approx(120e-6)
    assert summary.role_device == pytest.approx({"rollout": 308e-6, "actor_update": 120e-6, "step": 15e-6})
    doc = summary.to_json()
    assert {p["role"]: p["device_s"] for p in doc["phases"]} == pytest.approx({"rollout": 308e-6,
                                                                              "actor_update": 120e-6})
    assert doc["role_device_s"] == pytest.approx(summary.role_device)
    assert {(r["step"], r["role"]) for r in doc["captures"][0]["role_device"]} == {(3, "rollout"),
                                                                                 (3, "actor_update"), (3, "step")}


def test_in_role_mode_the_captures_kernels_count_in_its_role(tmp_path: Path) -> None:
    doc = cuda.document()
    doc["traceEvents"] = [e for e in doc["traceEvents"] if e.get("name") != "rollout"]
    doc["profctxRanges"]["roles"] = ["actor_update"]
    summary = summarize(cuda.write_run(tmp_path / "run", doc, role="train/actor_update"))
    assert summary.role_device == pytest.approx({"train/actor_update": sum(cuda.EXPECTED.values()) / 1e6})
    phase = summary.phase(3, "train/actor_update")
    assert phase is not None and phase.device_s == pytest.approx(sum(cuda.EXPECTED.values()) / 1e6)


def test_the_report_shows_device_time_per_role_only_for_traces_with_device_events(tmp_path: Path) -> None:
    save = cuda.write_run(tmp_path / "run", cuda.document())
    assert main(["report", str(save), "--output", str(tmp_path / "r.html")]) == 0
    page = (tmp_path / "r.html").read_text()
    assert 'id=phases' in page and "<th>device</th>" in page
    assert 'class=device data-role="rollout" data-seconds="0.000308"' in page
    assert 'class=device-total data-role="step"' in page  # launched in no role
    plain = write_synth(tmp_path / "cpu", Spec(steps=(1,), ranks=1, events=20, mode="step"))
    assert main(["report", str(plain), "--output", str(tmp_path / "p.html")]) == 0
    page = (tmp_path / "p.html").read_text()
    assert "<th>device</th>" not in page and "class=device" not in page
    assert summarize(plain).role_device == {} and all(p.device_s is None for p in summarize(plain).phases)


# -- real CUDA traces ----------------------------------------------------------------------------

DATA = Path(__file__).resolve().parent / "data"
#: Made by ``cuda_loop.py`` on an H200 (torch 2.11, CUDA 13), step mode: step 3, rollout and actor_update.
REAL = DATA / "cuda_run"
#: Made on an H200 (torch 2.11, CUDA 13) by ``benchmarks/gpu_check.py --only loop``, one contiguous capture of
#: steps 2 and 3 (rollout, actor_update, ref), with ``timers.jsonl``: per step and role, ``gpu_s`` from CUDA
#: events recorded on the stream at the role's start and end.
CONTIGUOUS = DATA / "gpu_contiguous"


def _by_launch(doc: dict[str, Any]) -> tuple[dict[tuple[int | None, str | None], float], dict[str, float]]:
    """Return, computed here from the raw events, the device µs per (step, role) by launch, and per role by time."""
    events = [e for e in doc["traceEvents"] if e.get("ph") == "X"]
    roles = set(doc["profctxRanges"]["roles"])
    ranges = [(e["pid"], e["tid"], e["name"], e["ts"], e["ts"] + e["dur"]) for e in events
              if e.get("cat") == "user_annotation" and e["name"] in roles]
    steps = [(int(e["name"].split("#")[1]), e["ts"], e["ts"] + e["dur"]) for e in events
             if e.get("cat") == "user_annotation" and e["name"].startswith("ProfilerStep#")]
    drawing = {(pid, tid) for pid, tid, *_ in ranges}
    launches = {e["args"]["correlation"]: (e["pid"], e["tid"], e["ts"]) for e in events
                if e.get("cat") in ("cuda_runtime", "cuda_driver")}
    by_launch: dict[tuple[int | None, str | None], float] = {}
    by_time: dict[str, float] = {}
    for e in events:
        if e.get("cat") not in ("kernel", "gpu_memcpy", "gpu_memset"):
            continue
        pid, tid, ts = launches[e["args"]["correlation"]]
        mine = (pid, tid) in drawing  # else a thread without roles: another thread's range lends its role
        held = [name for p, t, name, start, end in ranges if p == pid and (t == tid) == mine and start <= ts < end]
        step = next((n for n, start, end in steps if start <= ts < end), None)
        key = (step, held[0] if len(held) == 1 else None)
        by_launch[key] = by_launch.get(key, 0.0) + e["dur"]
        for _, _, name, start, end in ranges:
            if start <= e["ts"] < end:
                by_time[name] = by_time.get(name, 0.0) + e["dur"]
    return by_launch, by_time


@pytest.mark.parametrize("run", [REAL, CONTIGUOUS], ids=["step", "contiguous"])
def test_a_real_cuda_trace_gives_each_role_the_kernels_it_launched(run: Path) -> None:
    (path,) = run.rglob("*.pt.trace.json.gz")
    doc = json.loads(gzip.decompress(path.read_bytes()))
    by_launch, by_time = _by_launch(doc)
    # What makes the case: some role's kernels run on after its CPU range, so time overlap gives another figure.
    per_role: dict[str | None, float] = {}
    for (_, role), us in by_launch.items():
        per_role[role] = per_role.get(role, 0.0) + us
    assert any(by_time.get(role, 0.0) != pytest.approx(us) for role, us in per_role.items() if role)
    summary = summarize(run)
    assert summary.role_device == pytest.approx({role or "step": us / 1e6 for role, us in per_role.items()},
                                                rel=1e-9)
    for (step, role), us in by_launch.items():
        if role is not None:
            assert step is not None
            phase = summary.phase(step, role)
            assert phase is not None and phase.device_s == pytest.approx(us / 1e6, rel=1e-9), (step, role)
    # autograd runs the backward on a thread of its own, which draws no role: its work is lent actor_update.
    backward = {e["tid"] for e in doc["traceEvents"] if e.get("name", "").startswith("autograd::engine")}
    assert backward and not backward & {e["tid"] for e in doc["traceEvents"] if e.get("name") == "actor_update"}
    ops = read_figures(path).ops
    assert any(name.startswith("autograd::engine") for _, role, name in ops if role == "actor_update")
    assert not any(name.startswith("autograd::engine") for _, role, name in ops if role != "actor_update")


def test_a_roles_device_time_lies_within_its_cuda_event_window() -> None:
    # The stream runs a role's kernels between the CUDA events recorded at its start and end (one stream, in
    # order), so the device time it launched fits in that window and fills most of it; by time overlap the
    # actor_update window would lose the kernels that run after its CPU range.
    summary = summarize(CONTIGUOUS)
    timers = [json.loads(line) for line in (CONTIGUOUS / "timers.jsonl").read_text().splitlines()]
    checked = 0
    for timer in timers:
        phase = summary.phase(timer["step"], timer["role"])
        if timer["step"] not in (2, 3):
            assert phase is None
            continue
        assert phase is not None and phase.device_s is not None
        assert 0.85 * timer["gpu_s"] <= phase.device_s <= timer["gpu_s"], (timer, phase.device_s)
        checked += 1
    assert checked == 6


def test_work_of_a_thread_without_roles_is_lent_only_where_one_role_range_holds_it(tmp_path: Path) -> None:
    def x(name: str, tid: int, ts: float, dur: float, cat: str = "cpu_op") -> dict[str, Any]:
        return {"ph": "X", "cat": cat, "name": name, "pid": 1, "tid": tid, "ts": ts, "dur": dur}

    doc = {"profctxRanges": {"version": 1, "roles": ["rollout", "reward"], "steps": ["ProfilerStep#5"]},
           "traceEvents": [
               x("ProfilerStep#5", 1, 0.0, 1000.0, "user_annotation"),
               x("rollout", 1, 10.0, 300.0, "user_annotation"),
               x("reward", 1, 400.0, 0.0, "user_annotation"),  # holds no time
               x("reward", 3, 200.0, 300.0, "user_annotation"),  # another thread's role, overlapping rollout
               x("gloo:all_reduce", 2, 50.0, 20.0),  # rollout alone
               x("gloo:broadcast", 2, 250.0, 20.0),  # rollout and reward: neither
               x("gloo:barrier", 2, 400.0, 20.0),  # reward alone (the empty range on thread 1 holds nothing)
               x("gloo:gather", 2, 600.0, 20.0),  # no role
               x("aten::add", 3, 100.0, 5.0),  # thread 3 draws a role: keeps its own (none here)
           ]}
    path = tmp_path / "t.pt.trace.json"
    path.write_text(json.dumps(doc))
    got = read_figures(path)
    assert {name: (step, role) for step, role, name in got.ops} == {
        "gloo:all_reduce": (5, "rollout"), "gloo:broadcast": (None, None), "gloo:barrier": (5, "reward"),
        "gloo:gather": (None, None), "aten::add": (None, None)}
    # Lent operators add nothing to a role's own time: rollout's 300 µs, covered only by its thread's operators.
    assert got.roles[(5, "rollout")] == [300.0, 1, 0.0]


def test_the_summary_table_has_a_device_column_only_for_traces_with_device_events(
        tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["summary", str(CONTIGUOUS)]) == 0
    out = capsys.readouterr().out
    head = next(line for line in out.splitlines() if line.startswith("STEP"))
    assert head.split() == ["STEP", "ROLE", "TIME", "SHARE", "NO-OP", "DEVICE", "MEDIAN", "MAX/MED", "STRAGGLER"]
    rollout = next(line for line in out.splitlines() if line.split()[:2] == ["2", "rollout"])
    assert "2.78 ms" in rollout  # the kernels rollout launched in step 2, as test_a_real_cuda_trace_... sums them
    plain = write_synth(tmp_path / "cpu", Spec(steps=(1,), ranks=1, events=20, mode="step"))
    assert main(["summary", str(plain)]) == 0
    assert "DEVICE" not in capsys.readouterr().out


def test_the_profilers_own_work_is_no_operator() -> None:
    # With CUDA activity torch writes its own buffer requests ("Activity Buffer Request", category overhead) on a
    # row of their own: they were listed as the top operator of the step (33 % on an H200 run).
    trace = next(CONTIGUOUS.rglob("*.pt.trace.json.gz"))
    assert b'"Activity Buffer Request"' in gzip.decompress(trace.read_bytes())
    summary = summarize(CONTIGUOUS)
    names = {o.name for table in summary.role_ops.values() for o in table} | {o.name for c in summary.captures
                                                                               for o in c.ops}
    assert names and not any("Activity Buffer Request" in n for n in names)
