"""Who the others waited for, from the user's seat: a real ``torchrun`` job with lags the test injects.

One 2-rank job (gloo, CPU; ``align_job.py``: a GRPO-shaped loop, ``actor_update`` runs DDP's
all-reduce) is shared by the module: rank 1 sleeps :data:`LAG` inside ``ref`` in step
:data:`SLOW_STEP`, and :data:`LAG` before opening step :data:`LATE_STEP` (where a data loader sits).
Both steps are profiled (torch, step mode, every rank), so the summary has traces with gloo's
collectives; every step is in the timeline. The same job's timelines are then moved onto another
"host" (host name and clock changed in the files) to check the clock offset estimate.

Tolerance: the lag is injected as a 1 s sleep; what it is read as may differ by the jitter of a
sleep and of the operators around it on a loaded 2-core machine (tens of ms seen, 7.5 ms typical;
a preempted rank can add a scheduling delay, tens to hundreds of ms at load average 30), so the lag
and the wait are checked within ±40 % (400 ms), far from both the noise and from 0.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("torch")

from profctx.analysis import StepAlignment, Summary, align, summarize
from profctx.analysis._align import BEFORE, Collective, Lane, answer, clocks
from profctx.cli import main

HERE = Path(__file__).parent
JOB = HERE / "align_job.py"
LAG = 1.0
SLOW_STEP = 3
LATE_STEP = 5
STEPS = 6
#: ±40 %: see the module's docstring.
LOW, HIGH = LAG * 0.6, LAG * 1.4


def _torchrun(save: Path, *args: str, ranks: int = 2) -> None:
    env = {**os.environ, "PROFCTX_RUN_ID": "align"}
    env.pop("RANK", None)
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(ranks), str(JOB),
           "--save", str(save), *args]
    # A session of its own: a hung job is ended whole, the ranks torchrun started with it.
    with subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env,
                          start_new_session=True) as proc:
        try:
            out, _ = proc.communicate(timeout=240)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            out, _ = proc.communicate()
            pytest.fail(f"timed out\n{out[-3000:]}")
    assert proc.returncode == 0, out[-6000:]


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Path:
    save = tmp_path_factory.mktemp("align") / "save"
    _torchrun(save, "--steps", str(STEPS), "--window", f"{SLOW_STEP},{LATE_STEP}",
              "--slow", f"ref:1:{LAG}:{SLOW_STEP}", "--late", f"1:{LAG}:{LATE_STEP}")
    return save


@pytest.fixture(scope="module")
def summary(job: Path) -> Summary:
    return summarize(job)


def _timeline(capsys: pytest.CaptureFixture[str], save: Path) -> Any:
    assert main(["timeline", str(save), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def _step(doc: Any, step: int) -> Any:
    return next(row for row in doc["steps"] if row["step"] == step)


def test_slow_in_a_phase_names_the_slow_rank_in_that_phase_not_the_rank_that_waited(
        summary: Summary, capsys: pytest.CaptureFixture[str]) -> None:
    lined = summary.alignment[SLOW_STEP]
    assert lined.from_collectives  # the wait comes from gloo's all_reduce in the traces
    s = lined.straggler
    assert s is not None and (s.process, s.segment) == ("rank 1", "ref")
    assert LOW < s.lag_s < HIGH
    ((waiter, wait),) = [(w.process, w) for w in s.waited]
    assert waiter == "rank 0" and wait.segment == "actor_update" and wait.collective == "gloo:all_reduce"
    assert LOW < wait.wait_s < HIGH
    # The phase table: the slow rank's phase names it; the waiting rank's long actor_update is waiting.
    ref, update = summary.phase(SLOW_STEP, "ref"), summary.phase(SLOW_STEP, "actor_update")
    assert ref is not None and update is not None
    assert ref.straggler == "rank 1" and update.straggler is None
    assert LOW < update.wait["rank 0"] < HIGH and update.wait["rank 1"] < LOW
    assert update.work_s < update.time_s - LOW  # waiting is not work
    assert ref.ratio > 3  # over the other rank: 320 ms against 20 ms, not over the mean of both (< 2)
    assert main(["summary", str(summary.save_path)]) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith(f"step {SLOW_STEP}: "))
    assert "rank 1: +" in line and "in `ref`" in line and "rank 0 waited" in line and "gloo:all_reduce" in line
    assert main(["summary", str(summary.save_path), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    aligned = {a["step"]: a for a in doc["alignment"]}
    assert aligned[SLOW_STEP]["straggler"]["process"] == "rank 1"
    assert aligned[SLOW_STEP]["straggler"]["segment"] == "ref"
    assert aligned[SLOW_STEP]["answer"] == line.split(": ", 1)[1]


def test_late_before_the_step_names_the_time_before_the_step(summary: Summary, job: Path,
                                                             capsys: pytest.CaptureFixture[str]) -> None:
    lined = summary.alignment[LATE_STEP]
    s = lined.straggler
    assert s is not None and (s.process, s.segment) == ("rank 1", BEFORE)
    assert LOW < s.lag_s < HIGH
    assert [w.process for w in s.waited] == ["rank 0"] and LOW < s.waited[0].wait_s < HIGH
    assert f"rank 1 entered step {LATE_STEP}" in (summary.answer(LATE_STEP) or "")
    assert "the time before the step" in (summary.answer(LATE_STEP) or "")
    # No role is its straggler: the lag is not in a phase.
    assert not [p for p in summary.phases if p.step == LATE_STEP and p.straggler]
    # The HTML report says the same, and diff of the two steps lists both answers.
    out = job.parent / "report.html"
    assert main(["report", str(job), "-o", str(out)]) == 0
    capsys.readouterr()
    page = out.read_text()
    assert "Who the others waited for" in page and f"rank 1 entered step {LATE_STEP}" in page
    assert main(["diff", str(job), "--steps", str(SLOW_STEP), str(LATE_STEP), "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    assert "in `ref`" in doc["a_stragglers"][str(SLOW_STEP)]
    assert "entered step" in doc["b_stragglers"][str(LATE_STEP)]
    update = next(r for r in doc["roles"] if r["role"] == "actor_update")
    assert LOW < update["a_wait_s"] < HIGH and LOW < update["b_wait_s"] < HIGH


def test_the_timeline_names_both_without_a_profiler(job: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = _timeline(capsys, job)
    slow, late = _step(doc, SLOW_STEP), _step(doc, LATE_STEP)
    (s,) = slow["stragglers"]
    assert (s["process"], s["segment"]) == ("rank1", "ref") and LOW < s["lag_s"] < HIGH
    assert s["ratio"] > 3
    (t,) = late["stragglers"]
    assert (t["process"], t["segment"]) == ("rank1", BEFORE) and LOW < t["lag_s"] < HIGH
    waited = late["alignment"]["straggler"]["waited"]
    assert waited[0]["process"] == "rank0" and waited[0]["segment"] == "actor_update"
    # Nothing else of that size: the other steps name no lag near the injected one.
    for row in doc["steps"]:
        if row["step"] not in (SLOW_STEP, LATE_STEP):
            assert all(x["lag_s"] is None or x["lag_s"] < LOW for x in row["stragglers"]), row
    assert doc["clocks"]["source"] == "one host"
    assert main(["timeline", str(job), "--rows", "0"]) == 0
    lines = capsys.readouterr().out.splitlines()
    row = next(x for x in lines if x.split()[:1] == [str(SLOW_STEP)])
    assert "straggler rank1: +" in row and "in `ref`" in row and " !" in row  # the straggler's own ref time
    row = next(x for x in lines if x.split()[:1] == [str(LATE_STEP)])
    assert f"straggler rank1 entered step {LATE_STEP}" in row


def _other_host(job: Path, into: Path, shift: float, jitter: float = 0.0) -> Path:
    """Copy the job's timelines, rank 1's moved onto another host whose clock is ``shift`` s ahead (plus
    ``jitter`` s, alternating in sign, per step: a clock that cannot be pinned down)."""
    folder = into / ".profctx"
    folder.mkdir(parents=True)
    for path in (job / ".profctx").glob("*.timeline"):
        lines = path.read_text().splitlines()
        header = json.loads(lines[0])
        if header["rank"] == 1:
            header["host"] = "other-host"
            moved = [json.dumps(header)]
            for n, line in enumerate(lines[1:]):
                record = json.loads(line)
                if "start" in record:
                    record["start"] += shift + (jitter if n % 2 else -jitter)
                moved.append(json.dumps(record))
            lines = moved
        (folder / path.name).write_text("\n".join(lines) + "\n")
    return into


def test_a_clock_offset_between_hosts_is_estimated_and_the_answer_stands(
        job: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    doc = _timeline(capsys, _other_host(job, tmp_path / "shifted", shift=2.5))
    clock = doc["clocks"]
    assert clock["source"] == "step exits"
    # Rank 1's clock reads 2.5 s ahead: its offset is -2.5 s, found from the step exits (which the all-reduce
    # holds together: 7.5 ms apart typically) within 0.2 s, room for a rank preempted at an exit on a loaded
    # machine, and far from what an estimate that missed the shift (2.5 s) or took the lag for it (1 s) reads.
    assert abs(clock["offsets_s"]["rank1"] + 2.5) < 0.2
    (s,) = _step(doc, SLOW_STEP)["stragglers"]
    assert (s["process"], s["segment"]) == ("rank1", "ref") and LOW < s["lag_s"] < HIGH
    (t,) = _step(doc, LATE_STEP)["stragglers"]
    assert (t["process"], t["segment"]) == ("rank1", BEFORE)
    assert _step(doc, LATE_STEP)["alignment"]["straggler"]["waited"][0]["process"] == "rank0"


def test_clocks_too_unsure_name_no_straggler(job: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # A clock that jumps back and forth per step by more than the lag: the uncertainty is past it, nobody is named.
    doc = _timeline(capsys, _other_host(job, tmp_path / "jumpy", shift=2.5, jitter=LAG * 4 / 3))
    late = _step(doc, LATE_STEP)
    assert late["stragglers"] == []
    assert "uncertainty" in late["answer"] and "cannot be told" in late["answer"]


def test_a_nested_role_is_shown_under_its_parent(summary: Summary, job: Path,
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    # generate (a 20 ms sleep) is nested in rollout: one line under it, with the rest of rollout.
    rollout = summary.phase(SLOW_STEP, "rollout")
    assert rollout is not None and set(rollout.nested) == {"generate"}
    assert 0.02 <= rollout.nested["generate"] <= rollout.time_s
    assert summary.phase(SLOW_STEP, "generate") is None  # not a phase of its own: it is inside rollout
    assert main(["summary", str(job)]) == 0
    lines = capsys.readouterr().out.splitlines()
    at = next(i for i, x in enumerate(lines) if x.split()[:2] == [str(SLOW_STEP), "rollout"])
    assert lines[at + 1].split()[0] == "generate" and lines[at + 2].split()[:3] == ["(rest", "of", "rollout)"]
    assert main(["diff", str(job), "--steps", str(SLOW_STEP), str(LATE_STEP), "--json"]) == 0
    roles = {r["role"]: r for r in json.loads(capsys.readouterr().out)["roles"]}
    assert [n["role"] for n in roles["rollout"]["nested"]] == ["generate"]


def test_one_process_and_no_lag_say_so() -> None:
    one = align(1, [Lane("rank 0", "h", 0.0, 1.0)])
    assert one.straggler is None and "one process" in answer(one)
    even = [Lane(f"rank {r}", "h", 10.0, 11.0, 9.9, (("train", 10.0, 11.0),)) for r in range(3)]
    found: StepAlignment = align(2, even, clocks({2: even}))
    assert found.straggler is None and answer(found) == "no process made the others wait"


def test_collectives_across_hosts_give_the_clock_offset_and_split_wait_from_transfer() -> None:
    # Rank 1's clock reads 5 s ahead; it enters actor_update 0.3 s after rank 0 (it was slow in ref); the
    # all_reduce's transfer takes 2 ms after the last arrival, and both end together (on the true clock).
    def lane(rank: int, host: str, shift: float, step: int) -> Lane:
        t = 100.0 * step + shift
        ref = 0.02 if rank == 0 else 0.32
        enter = t + 0.02 + ref
        arrive = enter + 0.001
        end = t + 0.02 + 0.32 + 0.001 + 0.002
        return Lane(f"rank {rank}", host, t, end + 0.001, None,
                    (("rollout", t, t + 0.02), ("ref", t + 0.02, enter), ("actor_update", enter, end + 0.001)),
                    (Collective("gloo:all_reduce", arrive, end, "actor_update"),))
    steps = {s: [lane(0, "a", 0.0, s), lane(1, "b", 5.0, s)] for s in (1, 2, 3)}
    clock = clocks(steps)
    assert clock.source == "collectives" and clock.offsets["rank 1"] == pytest.approx(-5.0)
    found = align(2, steps[2], clock)
    s = found.straggler
    assert s is not None and (s.process, s.segment) == ("rank 1", "ref") and s.lag_s == pytest.approx(0.3)
    update = {p: next(x for x in segs if x.name == "actor_update") for p, segs in found.processes.items()}
    assert update["rank 0"].wait_s == pytest.approx(0.3) and update["rank 0"].transfer_s == pytest.approx(0.002)
    assert update["rank 1"].wait_s == pytest.approx(0.0) and update["rank 1"].transfer_s == pytest.approx(0.002)
    assert "rank 0 waited 300 ms in `actor_update`'s gloo:all_reduce" in answer(found)
