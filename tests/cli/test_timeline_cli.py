"""``profctx timeline``: a real 2-rank run read back, anomalies and stragglers marked; hostile folders; no timeline."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from profctx.cli import main
from profctx.core._layout import MANIFEST_DIR

STEPS = 30
STRAGGLER_STEP = 12
SLOW_STEP = 25

#: How much longer the injected straggler's train role and the slow step's rollout role sleep (seconds).
#: Large against what the marks compare it with, so that no scheduling delay of a loaded machine flips them:
#: the straggler's train role (0.608 s at least: a sleep is never shorter) is marked while it exceeds 1.5x the
#: other rank's, which would need that rank's 8 ms sleep in that one step to overrun by 0.4 s; the slow step
#: (0.6 s of rollout) is an anomaly while it exceeds 2x the median of the 20 steps before it, which would
#: need more than half of those 20 ms steps to overrun by 0.28 s each.
LAG_S = 0.6

#: One rank of a 2-rank job, launched as torchrun would (RANK, WORLD_SIZE, one run id): 20 ms steps; rank 1 is
#: LAG_S late in step 12's train role (a straggler); both ranks take LAG_S in step 25's rollout (an anomaly).
RANK_LOOP = """
    import os, time, profctx
    rank = int(os.environ["RANK"])
    profctx.configure(save_path={save!r}, steps=[3], tool="noop", warmup=False)
    for step in range(1, {steps} + 1):
        with profctx.profile_step(step):
            with profctx.profile_step(role="rollout"):
                time.sleep({lag} if step == {slow} else 0.012)
            with profctx.profile_step(role="train"):
                time.sleep(0.008 + ({lag} if rank == 1 and step == {straggler} else 0.0))
"""


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory: pytest.TempPathFactory) -> Path:
    save = tmp_path_factory.mktemp("two-ranks")
    code = textwrap.dedent(RANK_LOOP.format(save=str(save), steps=STEPS, lag=LAG_S, slow=SLOW_STEP,
                                            straggler=STRAGGLER_STEP))
    env = {k: v for k, v in os.environ.items() if not k.startswith("PROFCTX_")}
    procs = [subprocess.Popen([sys.executable, "-c", code], env={**env, "RANK": str(rank), "WORLD_SIZE": "2",
                                                                 "TORCHELASTIC_RUN_ID": "tl-two-ranks"},
                              stderr=subprocess.PIPE, text=True) for rank in (0, 1)]
    for proc in procs:
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
    return save


def _run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["timeline", *argv])
    out, err = capsys.readouterr()
    return code, out, err


def test_two_ranks_are_shown_and_the_injected_straggler_and_slow_step_are_marked(
        two_ranks: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, str(two_ranks), "--rows", "0", "--straggler-ratio", "1.5")
    assert code == 0
    lines = out.splitlines()
    assert "30 steps (1-30), 2 processes (rank0, rank1)" in lines[0]
    assert lines[1].split()[:4] == ["STEP", "TIME", "MAX", "SLOWEST"] and "rollout" in lines[1]
    by_step = {line.split()[0]: line for line in lines[2:]}
    assert len(by_step) == STEPS
    assert "straggler rank1" in by_step[str(STRAGGLER_STEP)]
    assert "anomaly" in by_step[str(SLOW_STEP)]


def test_json_document(two_ranks: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, str(two_ranks), "--json", "--straggler-ratio", "1.5")
    assert code == 0
    doc = json.loads(out)
    assert doc["schema"] == "profctx.timeline" and doc["version"] == 1
    assert doc["run"] == "torchrun-tl-two-ranks" and [p["name"] for p in doc["processes"]] == ["rank0", "rank1"]
    assert [p["world_size"] for p in doc["processes"]] == [2, 2]
    assert len(doc["steps"]) == STEPS and sorted(doc["roles"]) == ["rollout", "train"]
    straggling = {row["step"]: row["stragglers"] for row in doc["steps"] if row["stragglers"]}
    assert [s["process"] for s in straggling[STRAGGLER_STEP]] == ["rank1"]
    assert straggling[STRAGGLER_STEP][0]["ratio"] > 1.5  # the rule itself; LAG_S puts it far above (see LAG_S)
    assert SLOW_STEP in doc["anomalies"]
    slow = doc["steps"][SLOW_STEP - 1]
    assert slow["anomaly"]["ratio"] > 2 and slow["anomaly"]["history"] == 20
    assert slow["roles"]["rollout"]["time_s"] >= LAG_S and slow["roles"]["rollout"]["count"] == 2
    assert doc["rules"]["anomaly"]["factor"] == 2.0 and doc["rules"]["straggler"]["ratio"] == 1.5


def test_a_range_of_steps_and_bins_for_long_runs(two_ranks: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = _run(capsys, str(two_ranks), "--steps", "20-29", "--rows", "0")
    assert code == 0 and "10 steps (20-29)" in out
    assert [line.split()[0] for line in out.splitlines()[2:]] == [str(s) for s in range(20, 30)]
    code, out, _ = _run(capsys, str(two_ranks), "--rows", "10")
    assert code == 0
    table = out.split("\n\n")[0].splitlines()[2:]
    assert [line.split()[0] for line in table[:2]] == ["1-3", "4-6"] and len(table) == 11  # 10 bins and the note
    assert "Marked steps" in out and str(SLOW_STEP) in out.split("Marked steps")[1]
    with pytest.raises(SystemExit) as exited:  # argparse refuses it: usage error
        main(["timeline", str(two_ranks), "--steps", "9-3"])
    assert exited.value.code == 2 and "before the first" in capsys.readouterr().err


def test_report_has_a_step_timeline_section(two_ranks: Path, tmp_path: Path,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["report", str(two_ranks), "-o", str(tmp_path / "r.html"), "--ops", "0"]) == 0
    page = (tmp_path / "r.html").read_text()
    assert "<h2 id=step-timeline>Step timeline</h2>" in page
    assert page.count("<rect") >= STEPS and f"step {SLOW_STEP}: " in page


def test_a_folder_without_timelines_says_so_in_one_line_and_exits_1(tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / MANIFEST_DIR).mkdir()
    code, out, err = _run(capsys, str(tmp_path))
    assert code == 1 and out == "" and len(err.strip().splitlines()) == 1 and "no step timeline here" in err
    code, _, err = _run(capsys, str(tmp_path / "missing"))
    assert code == 2 and "no such folder" in err


def test_hostile_timeline_files_are_read_safely(tmp_path: Path, two_ranks: Path) -> None:
    folder = tmp_path / MANIFEST_DIR
    folder.mkdir()
    good = sorted((two_ranks / MANIFEST_DIR).glob("*.timeline"))[0].read_bytes()
    header, *steps = good.splitlines(keepends=True)
    # A huge line (over the reader's 1 MiB limit), a binary line and a control character in a role name,
    # then the good steps and a torn last line.
    hostile = (header + b'{"step": 1, "time_s": 1, "roles": {"' + b"a" * (3 << 20) + b'": [1, 1]}}\n'
               + bytes(range(256)) + b"\n"
               + b'{"step": 2, "time_s": 0.5, "roles": {"r\\u001b[2Jx": [0.1, 1]}}\n'
               + b"".join(steps[2:]) + b'{"step": 99, "time_s"')
    (folder / "a.timeline").write_bytes(hostile)
    (folder / "b.timeline").write_bytes(os.urandom(4096))
    (folder / "c.timeline").symlink_to("/etc/passwd")
    os.mkfifo(folder / "d.timeline")  # a reader that opened it blocking would hang here
    done = subprocess.run([sys.executable, "-m", "profctx", "timeline", str(tmp_path), "--rows", "0"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    rows = [line.split()[0] for line in done.stdout.splitlines()[2:] if not line.startswith("missing:")]
    assert rows == [str(s) for s in range(2, STEPS + 1)]  # step 1's line was too long: skipped unread
    assert "missing: 1 expected process has no timeline here: rank1" in done.stdout  # one rank's file of two
    assert "\x1b" not in done.stdout and "\\u001b[2Jx" in done.stdout
    for expected in ("over 1 MB", "a symbolic link", "a FIFO", "torn", "b.timeline"):
        assert expected in done.stderr, expected
