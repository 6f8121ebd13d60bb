"""The analysis on real torch.profiler traces made at test time, checked against the loop's own timers.

The corpus is made once per module by ``real_loop.py``: one process running the loop in step,
contiguous and role modes, and a 2-rank ``torch.distributed.run`` job (gloo, an all_reduce, a
straggler sleep on rank 1). Each role's body is timed with ``time.perf_counter`` inside the
``with`` block, so the role's range (opened just before the body, closed just after) holds it, and
the whole ``with`` statement around it, which holds the range.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from profctx.analysis import Summary, summarize
from profctx.cli import main

pytest.importorskip("torch")
from .real_loop import OUTSIDE, SLEEPS  # after the skip: imports torch

HERE = Path(__file__).resolve().parent
LOOP = HERE / "real_loop.py"
MODES = ("step", "contiguous", "role")
#: Extra seconds rank 1 sleeps in actor_update in the torchrun job.
STRAGGLER = 0.08
#: What the trace's clock and ``perf_counter`` may disagree by on one interval (the trace rounds to the
#: microsecond; their rates differ by parts per million).
CLOCKS_S = 5e-5
CLOCKS_REL = 1e-4


def _run(args: list[str], env: dict[str, str] | None = None) -> None:
    # A session of its own: a hung job is ended whole, the ranks torchrun started with it.
    with subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                          start_new_session=True) as proc:
        try:
            out, _ = proc.communicate(timeout=240)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
            pytest.fail(f"timed out: {' '.join(args)}\n{out[-3000:]}")
    assert proc.returncode == 0, out[-6000:]


def _timers(folder: Path) -> dict[tuple[int, str, int], tuple[float, float]]:
    """The loop's timers by (step, role, rank): (its body's seconds, its ``with`` statement's seconds)."""
    found = {}
    for path in folder.glob("*.jsonl"):
        for line in path.read_text().splitlines():
            t = json.loads(line)
            found[(t["step"], t["role"], t["rank"])] = (t["seconds"], t["around"])
    return found


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One process, the loop in step, contiguous and role modes: ``{root}/save/MODE``, ``{root}/timers/MODE``."""
    root = tmp_path_factory.mktemp("real")
    _run([sys.executable, str(LOOP), "--save", str(root / "save"), "--timers", str(root / "timers"),
          "--modes", ",".join(MODES)])
    return root


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 2-rank torchrun job (gloo) in step mode, rank 1 a straggler in actor_update."""
    root = tmp_path_factory.mktemp("job")
    env = {**os.environ, "PROFCTX_RUN_ID": "job"}
    env.pop("RANK", None)
    _run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2",
          str(LOOP), "--save", str(root / "save"), "--timers", str(root / "timers"), "--dist",
          "--straggler", str(STRAGGLER)], env)
    return root


@pytest.fixture(scope="module")
def summaries(corpus: Path) -> dict[str, Summary]:
    return {mode: summarize(corpus / "save" / mode) for mode in MODES}


def _rank(process: str) -> int:
    return int(process.rsplit(" ", 1)[-1]) if process.startswith("rank ") else 0


def _check_times(summary: Summary, timers: dict[tuple[int, str, int], tuple[float, float]]) -> int:
    """Assert that each role's time holds its body's timer and lies in its ``with`` statement's; return how many.

    Both are containments, exact whatever the machine's load (no margin a preempted thread can exceed). Out of
    role mode the profiler starts and stops at step boundaries, outside the ``with`` statement, so a role time
    that counted them (2-9 ms a capture) would exceed the outer timer; what lies between the two timers is
    profctx's and torch's range bookkeeping (0.1-0.2 ms on a quiet 2-core machine). Role mode, whose captures
    start inside the ``with`` statement, is checked for that by the overhead test below.
    """
    checked = 0
    for phase in summary.phases:
        for process, seconds in phase.per_process.items():
            inside, around = timers[(phase.step, phase.role, _rank(process))]
            slack = CLOCKS_S + CLOCKS_REL * around
            assert inside - slack <= seconds <= around + slack, (phase, process, inside, around)
            checked += 1
    return checked


def test_step_mode_names_the_real_roles(summaries: dict[str, Summary], corpus: Path,
                                        capsys: pytest.CaptureFixture[str]) -> None:
    summary = summaries["step"]
    assert summary.steps == [2, 3]
    assert sorted(summary.roles) == ["actor_update", "rollout"]
    assert sorted((p.step, p.role) for p in summary.phases) == [(2, "actor_update"), (2, "rollout"),
                                                                (3, "actor_update"), (3, "rollout")]
    # The user's ranges are operators: one inside a role, one in the step but in no role.
    assert "user_inner" in {o.name for o in summary.role_ops["rollout"]}
    assert "user_data_loading" in {o.name for o in summary.role_ops["step"]}
    assert main(["summary", str(corpus / "save" / "step")]) == 0
    out = capsys.readouterr().out
    assert "rollout" in out and "actor_update" in out and "NO-OP" in out
    assert "ProfilerStep" not in out and "user_data_loading " not in out.split("Trend")[0]


@pytest.mark.parametrize("mode", MODES)
def test_role_times_are_their_ranges_and_match_the_timers(summaries: dict[str, Summary], corpus: Path,
                                                          mode: str) -> None:
    summary = summaries[mode]
    assert _check_times(summary, _timers(corpus / "timers" / mode)) == 4  # 2 steps x 2 roles, one process
    assert all(c.time_from == "ranges" for c in summary.captures)


def test_role_mode_leaves_the_profilers_start_and_stop_out(summaries: dict[str, Summary], corpus: Path) -> None:
    summary = summaries["role"]
    timers = _timers(corpus / "timers" / "role")
    assert len(summary.captures) == 4
    for capture in summary.captures:
        ((step, role), (seconds, _)), = capture.role_steps.items()
        timer, _ = timers[(step, role, 0)]
        assert capture.wall_s is not None and capture.overhead_s is not None and capture.overhead_s > 0
        assert seconds + capture.overhead_s == pytest.approx(capture.wall_s, abs=1e-3)
        assert abs(seconds - timer) < capture.wall_s - timer  # nearer the timer than the capture's wall
    assert set(summary.overhead) == {2, 3} and all(v > 0 for v in summary.overhead.values())
    doc = summary.to_json()
    assert doc["overhead_s"] and all(c["overhead_s"] > 0 for c in doc["captures"])


def test_time_in_no_operator_holds_the_sleeps(summaries: dict[str, Summary]) -> None:
    for mode in MODES:
        for phase in summaries[mode].phases:
            assert phase.no_op_s is not None
            assert SLEEPS[phase.role] <= phase.no_op_s <= phase.time_s, (mode, phase)
            assert phase.to_json()["no_op_s"] == phase.no_op_s


def test_a_contiguous_capture_is_split_by_its_step_markers(summaries: dict[str, Summary]) -> None:
    summary = summaries["contiguous"]
    (capture,) = summary.captures
    assert capture.record.steps == (2, 3)
    assert sorted({p.step for p in summary.phases}) == [2, 3]


def test_every_trace_names_its_step_and_lists_profctxs_ranges(corpus: Path) -> None:
    for mode in MODES:
        traces = sorted((corpus / "save" / mode).rglob("*.pt.trace.json*"))
        assert traces
        for path in traces:
            doc = json.loads(gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes())
            ranges = [e for e in doc["traceEvents"] if e.get("cat") == "user_annotation"]
            steps = sorted({e["name"] for e in ranges if e["name"].startswith("ProfilerStep#")})
            listed = doc["profctxRanges"]
            assert steps == listed["steps"] and steps, path
            assert set(listed["roles"]) <= set(SLEEPS) and "user_inner" not in listed["roles"]


def test_diff_and_check_of_two_steps_compare_roles(corpus: Path, capsys: pytest.CaptureFixture[str]) -> None:
    for mode in MODES:
        folder = str(corpus / "save" / mode)
        assert main(["diff", folder, "--steps", "2", "3", "--json"]) == 0
        doc = json.loads(capsys.readouterr().out)
        assert {r["role"] for r in doc["roles"]} == {"rollout", "actor_update"}, mode
        assert all(r["a_s"] > 0 and r["b_s"] > 0 for r in doc["roles"])
        assert main(["check", folder, "--baseline", folder]) == 0
        out = capsys.readouterr().out
        assert "check passed" in out and "rollout +0.0%" in out and "step" not in out.split("(")[-1]


def test_a_trace_without_the_list_falls_back_to_its_outermost_user_ranges(corpus: Path, tmp_path: Path) -> None:
    save = shutil.copytree(corpus / "save" / "step", tmp_path / "old")
    for path in save.rglob("*.pt.trace.json*"):
        doc = json.loads(gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes())
        del doc["profctxRanges"]
        data = json.dumps(doc).encode()
        path.write_bytes(gzip.compress(data) if path.suffix == ".gz" else data)
    summary = summarize(save)
    # The step marker is never a role; the user's outermost range now is one, as in traces of older profctx.
    assert sorted(summary.roles) == ["actor_update", "rollout", "user_data_loading"]
    assert all(c.time_from == "user ranges" for c in summary.captures)
    assert summary.phase(2, "user_data_loading").time_s >= OUTSIDE  # type: ignore[union-attr]


# -- a 2-rank torchrun job ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def job_summary(job: Path) -> Iterator[Summary]:
    yield summarize(job / "save" / "step")


def test_torchrun_job_roles_times_and_straggler(job_summary: Summary, job: Path,
                                                capsys: pytest.CaptureFixture[str]) -> None:
    summary = job_summary
    assert summary.run == "job" and summary.processes == ["rank 0", "rank 1"]
    assert sorted(summary.roles) == ["actor_update", "rollout", "sync"]
    assert not any(p.role.startswith(("gloo", "ProfilerStep")) for p in summary.phases)
    # torch's own range of the collective is an operator, never a role.
    assert any(o.name.startswith("gloo:all_reduce") for ops in summary.role_ops.values() for o in ops)
    assert _check_times(summary, _timers(job / "timers" / "step")) == 12  # 2 steps x 3 roles x 2 ranks
    for step in (2, 3):
        update = summary.phase(step, "actor_update")
        assert update is not None and update.straggler == "rank 1"
        assert update.per_process["rank 1"] - update.per_process["rank 0"] > STRAGGLER / 2
    assert main(["summary", str(job / "save" / "step")]) == 0
    out = capsys.readouterr().out
    assert "rank 1" in out and "gloo" not in out.split("Top operators")[0]
    assert main(["diff", str(job / "save" / "step"), "--steps", "2", "3", "--json"]) == 0
    assert {r["role"] for r in json.loads(capsys.readouterr().out)["roles"]} == {"rollout", "actor_update", "sync"}


def test_a_collective_on_gloos_thread_counts_in_the_role_it_ran_in(job_summary: Summary, job: Path) -> None:
    # gloo runs the all_reduce on a thread of its own, which draws no role: its operators count in the role
    # the main thread was in when they started (sync), not in the step's row of work in no role.
    summary = job_summary
    assert any(o.name.startswith("gloo:all_reduce") for o in summary.role_ops["sync"])
    assert not any(o.name.startswith("gloo") for o in summary.role_ops.get("step", []))
    # Each rank's trace: the collective's events lie on a thread other than the one that draws sync.
    for path in (job / "save" / "step").rglob("*.pt.trace.json*"):
        doc = json.loads(gzip.decompress(path.read_bytes()) if path.suffix == ".gz" else path.read_bytes())
        threads = {e["name"]: e["tid"] for e in doc["traceEvents"] if e.get("ph") == "X"
                   and (e["name"] == "sync" or e["name"].startswith("gloo:all_reduce"))}
        assert len(threads) == 2 and threads["sync"] != next(t for n, t in threads.items() if n != "sync"), path
