"""The run summary on synthetic torch-shaped runs whose figures are known by construction (scale, shapes, fallbacks)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from profctx.analysis import SCHEMA, SCHEMA_VERSION, diff, process_names, read_figures, summarize
from profctx.cli import main
from profctx.manifest import CaptureRecord

from .synth import Spec, write_run


def test_phase_shares_stragglers_and_trend(tmp_path: Path) -> None:
    spec = Spec(steps=(1, 2, 3), ranks=4, slow={(2, "actor_update"): 2.0}, step_scale={3: 1.5})
    summary = summarize(write_run(tmp_path, spec))
    assert summary.run == "synth" and summary.steps == [1, 2, 3]
    assert summary.processes == [f"actor rank {r}" for r in range(4)]
    one = summary.phase(1, "rollout")
    assert one is not None and one.time_s == pytest.approx(0.4) and one.median_s == pytest.approx(0.4)
    # Step 1: rollout 0.4, ref 0.1, actor_update 0.6 (rank 2 takes twice 0.3): shares of 1.1.
    assert one.share == pytest.approx(0.4 / 1.1)
    update = summary.phase(1, "actor_update")
    assert update is not None and update.time_s == pytest.approx(0.6) and update.straggler == "actor rank 2"
    assert update.ratio == pytest.approx(2.0)
    assert [(p.step, p.role) for p in summary.stragglers()] == [(1, "actor_update"), (2, "actor_update"),
                                                                 (3, "actor_update")]
    assert summary.phase(1, "rollout").straggler is None  # type: ignore[union-attr]
    trend = summary.trend("rollout")
    assert [s for s, _ in trend] == [1, 2, 3] and trend[2][1] == pytest.approx(0.6)


def test_a_higher_ratio_names_no_straggler(tmp_path: Path) -> None:
    summary = summarize(write_run(tmp_path, Spec(slow={(1, "ref"): 1.3})), straggler_ratio=1.5)
    assert summary.stragglers() == []
    assert summarize(tmp_path, straggler_ratio=1.2).stragglers()[0].straggler == "actor rank 1"


def test_self_time_per_operator_and_device_time(tmp_path: Path) -> None:
    spec = Spec(steps=(1,), ranks=2, roles={"actor_update": 0.3}, events=40, kernels=True)
    summary = summarize(write_run(tmp_path, spec))
    slot = 0.3e6 / 40
    leaf = slot * 0.6 - 2
    ops = {o.name: o for o in summary.role_ops["actor_update"]}
    # Summed over 2 processes: the leaf's self is its duration, the outer's is its duration less the leaf's.
    assert ops["actor_update::leaf"].self_s == pytest.approx(2 * 40 * leaf / 1e6, rel=1e-4)
    assert ops["actor_update::outer"].self_s == pytest.approx(2 * 40 * (slot * 0.9 - leaf) / 1e6, rel=1e-4)
    assert ops["actor_update::leaf"].count == 80
    assert sum(o.share for o in ops.values()) == pytest.approx(1.0)
    capture = summary.captures[0]
    assert capture.device_s == pytest.approx(40 * (slot * 0.6) / 2 / 1e6, rel=1e-3)
    assert capture.device_ops[0].name == "actor_update::leaf_kernel"


def test_step_mode_roles_come_from_the_ranges(tmp_path: Path) -> None:
    spec = Spec(steps=(1, 2), ranks=2, mode="step", slow={(0, "rollout"): 2.0})
    summary = summarize(write_run(tmp_path, spec))
    rollout = summary.phase(2, "rollout")
    assert rollout is not None and rollout.time_s == pytest.approx(0.8) and rollout.median_s == pytest.approx(0.6)
    assert rollout.straggler == "actor rank 0"
    # Operators are filed under the range they ran in, not under the whole-step capture.
    assert {o.name for o in summary.role_ops["ref"]} == {"ref::outer", "ref::leaf"}
    assert "step" not in summary.role_ops


def test_diff_names_the_operator_that_explains_a_slowdown(tmp_path: Path) -> None:
    base = write_run(tmp_path / "a", Spec())
    new = write_run(tmp_path / "b", Spec(slow={(r, "actor_update"): 1.2 for r in range(4)},
                                         op_scale={"actor_update::leaf": 1.4}))
    result = diff(summarize(base), summarize(new))
    top = result.roles[0]
    assert top.role == "actor_update" and top.change == pytest.approx(0.2)
    assert top.ops[0].name == "actor_update::leaf" and top.ops[0].delta_s > 0
    assert {r.role: r.delta_s for r in result.roles}["rollout"] == pytest.approx(0.0, abs=1e-9)


def test_summary_json_is_versioned(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_run(tmp_path, Spec(steps=(1,), ranks=2))
    assert main(["summary", str(tmp_path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert (doc["schema"], doc["version"]) == (SCHEMA, SCHEMA_VERSION)
    assert set(doc) >= {"run", "steps", "roles", "processes", "phases", "stragglers", "trend", "role_ops",
                        "captures", "step_wall_s", "straggler_ratio"}
    assert {c["process"] for c in doc["captures"]} == {"actor rank 0", "actor rank 1"}
    assert main(["summary", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "Phases" in out and "rollout" in out and "\x1b[" not in out


def test_diff_and_check_commands(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    base = write_run(tmp_path / "a", Spec())
    new = write_run(tmp_path / "b", Spec(slow={(r, "actor_update"): 1.25 for r in range(4)},
                                         op_scale={"actor_update::leaf": 1.5}))
    assert main(["diff", str(base), str(new)]) == 0
    out = capsys.readouterr().out.splitlines()
    first = next(line for line in out if line.startswith("actor_update"))
    assert "+25.0%" in first
    assert main(["diff", str(base), str(new), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert doc["schema"] == "profctx.diff" and doc["roles"][0]["role"] == "actor_update"

    assert main(["check", str(new), "--baseline", str(base), "--max-slowdown", "actor_update=10%"]) == 1
    out = capsys.readouterr().out
    assert "check failed: 1 regression" in out and "actor_update" in out and "actor_update=10%" in out
    assert main(["check", str(new), "--baseline", str(base), "--max-slowdown", "actor_update=30%"]) == 0
    assert "check passed" in capsys.readouterr().out
    code = main(["check", str(new), "--baseline", str(base), "--max-slowdown", "*=30%",
                 "--max-op-slowdown", "*::leaf=20%", "--json"])
    doc = json.loads(capsys.readouterr().out)
    assert code == 1 and [v["name"] for v in doc["violations"]] == ["actor_update::leaf"]
    assert main(["check", str(new), "--baseline", str(base), "--max-slowdown", "ten percent"]) == 2
    assert "NAME=PERCENT" in capsys.readouterr().err


def test_diff_two_steps_of_one_run(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    write_run(tmp_path, Spec(steps=(3, 50), step_scale={50: 2.0}))
    assert main(["diff", str(tmp_path), "--steps", "3", "50"]) == 0
    out = capsys.readouterr().out
    assert "A: step 3    B: step 50" in out and "+100.0%" in out
    assert main(["diff", str(tmp_path), "--steps", "3", "7"]) == 2
    assert "step 7: no completed capture" in capsys.readouterr().err


def test_processes_that_share_a_rank_number_get_distinct_rows() -> None:
    def record(pid: int, role: str, **extra: object) -> CaptureRecord:
        return CaptureRecord({"capture": f"{pid}{role}", "run": "r", "rank": 0, "host": "h", "pid": pid,
                              "role": role, "steps": [1], "status": "ok", **extra})

    rows = [record(10, "rollout"), record(11, "ref"), record(11, "actor_update"), record(12, "actor_update"),
            record(13, "rollout", kind="engine", engine="vllm", replica=0), record(14, "step", group="driver"),
            record(15, "rollout", group="rollout"), record(16, "rollout")]
    names = process_names(rows)
    # Roles tell apart a rollout actor and a trainer; host:pid is the last resort.
    assert sorted(names.values()) == ["driver", "rank 0 (actor_update)", "rank 0 (ref+actor_update)",
                                      "rank 0 (rollout) h:10", "rank 0 (rollout) h:16", "rollout rank 0",
                                      "vllm replica 0"]
    assert len(set(names.values())) == len(names)


def test_traces_of_other_producers_keep_their_capture_time(tmp_path: Path) -> None:
    summary = summarize(write_run(tmp_path, Spec(steps=(1,), ranks=2, listed=False)))
    assert {c.time_from for c in summary.captures} == {"capture"}
    rollout = summary.phase(1, "rollout")
    assert rollout is not None and rollout.time_s == pytest.approx(0.4) and rollout.no_op_s is None
    assert all(c.overhead_s is None for c in summary.captures) and summary.overhead == {}


def test_an_older_profctx_step_range_is_a_step_not_a_role(tmp_path: Path) -> None:
    trace = tmp_path / "old.pt.trace.json"
    trace.write_text(json.dumps({"traceEvents": [
        {"ph": "X", "cat": "user_annotation", "name": "step 3", "pid": 1, "tid": 1, "ts": 0, "dur": 100},
        {"ph": "X", "cat": "user_annotation", "name": "rollout", "pid": 1, "tid": 1, "ts": 10, "dur": 60},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 20, "dur": 25},
        {"ph": "X", "cat": "user_annotation", "name": "gloo:all_reduce", "pid": 1, "tid": 2, "ts": 30, "dur": 9}]}))
    figures = read_figures(trace)
    assert not figures.marked and figures.steps == {3: [100, 1]}
    # Without profctx's list the outermost user range of each thread is taken for a role, the step excepted.
    assert figures.roles == {(3, "rollout"): [60, 1, 25], (3, "gloo:all_reduce"): [9, 1, 0.0]}  # step: by time
    listed = json.loads(trace.read_text())
    listed["profctxRanges"] = {"version": 1, "roles": ["rollout"], "steps": ["step 3"]}
    trace.write_text(json.dumps(listed))
    figures = read_figures(trace)
    # With it, torch's own range is an operator; its thread draws no role: it is lent the role its start lies in,
    # which keeps its own time (25 µs covered: gloo's thread covers none of it).
    assert figures.marked and figures.roles == {(3, "rollout"): [60, 1, 25]}
    assert figures.ops[(3, "rollout", "gloo:all_reduce")] == [9, 9, 1]


def test_the_summary_says_which_role_times_are_whole_captures(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    write_run(tmp_path, Spec(steps=(1,), ranks=2, listed=False))
    assert main(["summary", str(tmp_path)]) == 0
    assert "6 capture(s) hold no range of their role" in capsys.readouterr().out
    write_run(tmp_path / "listed", Spec(steps=(1,), ranks=2))
    assert main(["summary", str(tmp_path / "listed")]) == 0
    assert "hold no range" not in capsys.readouterr().out


def test_a_role_inside_a_role_is_an_operator_of_the_outer_one(tmp_path: Path) -> None:
    trace = tmp_path / "nested.pt.trace.json"
    trace.write_text(json.dumps({"profctxRanges": {"version": 1, "roles": ["train", "actor_update"],
                                                   "steps": ["ProfilerStep#4"]}, "traceEvents": [
        {"ph": "X", "cat": "user_annotation", "name": "ProfilerStep#4", "pid": 1, "tid": 1, "ts": 0, "dur": 100},
        {"ph": "X", "cat": "user_annotation", "name": "train", "pid": 1, "tid": 1, "ts": 5, "dur": 90},
        {"ph": "X", "cat": "user_annotation", "name": "actor_update", "pid": 1, "tid": 1, "ts": 10, "dur": 50},
        {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "pid": 1, "tid": 1, "ts": 20, "dur": 30}]}))
    figures = read_figures(trace)
    # The nested role covers 50 of train's 90 us: train spent 40 us in no operator.
    assert figures.roles == {(4, "train"): [90, 1, 50]}
    assert figures.ops == {(4, "train", "actor_update"): [20, 50, 1], (4, "train", "aten::mm"): [30, 30, 1]}
