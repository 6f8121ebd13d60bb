"""The whole job or a named hole, from the user's seat, on one real Lightning DDP run.

``python lightning_ddp_job.py DIR`` is a ``Trainer(accelerator="cpu", devices=2, strategy="ddp")``
fit started as a script: Lightning starts the script again for rank 1. The run is made once
(module fixture, ~15 s on a quiet machine: two processes importing Lightning); each test copies
its folder and changes the copy as a user's folder gets changed: a shard copied aside, a rank's
files missing, a record naming another's trace.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from profctx.analysis import summarize
from profctx.cli import main
from profctx.manifest import read

pytest.importorskip("lightning")

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]


@pytest.fixture(scope="module")
def lightning_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    save = tmp_path_factory.mktemp("lightning") / "run"
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PROFCTX_", "TORCHELASTIC_", "SLURM_", "PMIX_"))
           and k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "NODE_RANK")}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    done = subprocess.run([sys.executable, str(HERE / "lightning_ddp_job.py"), str(save)], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    return save


def _copy(run: Path, tmp_path: Path) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(run, copy)
    return copy


def _cli(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str, str]:
    """Run a ``profctx`` command in this process; return its exit code, stdout and stderr."""
    code = main(list(args))
    out = capsys.readouterr()
    return code, out.out, out.err


def test_lightning_s_relaunched_rank_shares_the_run_id(lightning_run: Path, capsys: pytest.CaptureFixture[str]) -> None:
    records = read(lightning_run)
    assert {r.run for r in records} == {records[0].run} and str(records[0].run).startswith("lightning-")
    assert sorted((r.rank, r.steps) for r in records) == [(0, (1,)), (0, (2,)), (1, (1,)), (1, (2,))]
    assert len({r.pid for r in records}) == 2
    code, out, err = _cli(capsys, "summary", str(lightning_run))
    assert code == 0 and ", 2 processes, 4 captures" in out and "left out" not in out and "missing" not in out
    code, out, err = _cli(capsys, "timeline", str(lightning_run))
    assert code == 0 and "2 processes (rank0, rank1)" in out and "missing" not in out, err
    code, out, _err = _cli(capsys, "ls", str(lightning_run))
    assert code == 0 and "RUN" not in out.splitlines()[0]  # one run: no run column
    assert sorted(line.split()[2] for line in out.splitlines()[1:5]) == ["0", "0", "1", "1"]


def test_a_copied_shard_is_read_once_and_named(lightning_run: Path, tmp_path: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    run = _copy(lightning_run, tmp_path)
    before = summarize(run).to_json()
    shard = sorted((run / ".profctx").glob("*.rank0-of-2.*.jsonl"))[0]
    shutil.copyfile(shard, shard.with_name(shard.name.replace(".jsonl", ".backup.jsonl")))
    code, out, err = _cli(capsys, "ls", str(run))
    assert code == 0 and "4 captures (4 ok)" in out, out
    assert f"1 duplicate shard ignored: {shard.name.replace('.jsonl', '.backup.jsonl')}" in err
    after = summarize(run).to_json()
    assert after["phases"] == before["phases"] and len(after["captures"]) == 4  # counted once
    assert any("1 duplicate shard ignored" in p for p in after["problems"])
    assert len(read(run)) == 4


def test_a_record_naming_a_file_another_names_is_a_damaged_entry(lightning_run: Path, tmp_path: Path) -> None:
    run = _copy(lightning_run, tmp_path)
    before = summarize(run).to_json()
    shard = sorted((run / ".profctx").glob("*.rank1-of-2.*.jsonl"))[0]
    last = [json.loads(line) for line in shard.read_text().splitlines() if '"finished"' in line][-1]
    with open(shard, "a") as fh:  # a second capture claiming the same trace
        fh.write(json.dumps({**last, "capture": "c0ffee000000"}) + "\n")
    after = summarize(run).to_json()
    assert after["phases"] == before["phases"] and len(after["captures"]) == 4
    assert any("capture c0ffee000000 names" in p and "not counted twice" in p for p in after["problems"])


def test_every_command_names_the_rank_it_expected_and_lacks(lightning_run: Path, tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    run = _copy(lightning_run, tmp_path)
    for path in (run / ".profctx").glob("*.rank1-of-2.*"):  # rank 1's files never reached this folder
        path.unlink()
    line = "missing: 1 expected process has no {} here: {}"
    code, out, err = _cli(capsys, "ls", str(run))
    assert line.format("capture record", "rank 1") in out
    code, out, err = _cli(capsys, "summary", str(run))
    assert line.format("capture record", "rank 1") in out
    code, out, err = _cli(capsys, "summary", str(run), "--json")
    assert json.loads(out)["missing"] == ["rank 1"]
    code, out, err = _cli(capsys, "timeline", str(run))
    assert line.format("timeline", "rank1") in out
    code, out, err = _cli(capsys, "timeline", str(run), "--json")
    assert json.loads(out)["missing"] == ["rank1"]
    code, out, err = _cli(capsys, "diff", str(run), "--steps", "1", "2")
    assert code == 0 and line.format("capture record", "rank 1") in out, err
    report = tmp_path / "report.html"
    _code, out, _err = _cli(capsys, "report", str(run), "-o", str(report))
    assert line.format("capture record", "rank 1") in out and "rank 1" in report.read_text()


def test_a_rank_no_process_selected_is_not_missing(lightning_run: Path, tmp_path: Path,
                                                   capsys: pytest.CaptureFixture[str]) -> None:
    run = _copy(lightning_run, tmp_path)
    for shard in (run / ".profctx").glob("*.jsonl"):  # as if configured with ranks=[0]: rank 1 records nothing
        if ".rank1-of-2." in shard.name:
            shard.unlink()
            continue
        lines: list[dict[str, Any]] = [json.loads(line) for line in shard.read_text().splitlines()]
        shard.write_text("".join(json.dumps({**r, "selected": [0]}) + "\n" for r in lines))
    for index in (run / ".profctx").glob("*.index"):
        index.unlink()
    code, out, _err = _cli(capsys, "ls", str(run))
    assert code == 0 and "missing" not in out
