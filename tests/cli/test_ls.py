"""``profctx ls``: what a user sees for a real two-rank run."""

from __future__ import annotations

import io
import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from profctx.cli import main
from profctx.cli._common import Style


def test_ls_lists_every_capture_with_reasons(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = main(["ls", str(run_dir)])
    out, err = capsys.readouterr()
    assert code == 1  # one capture failed
    lines = out.splitlines()
    assert lines[0].split() == ["STEP", "ROLE", "RANK", "SOURCE", "STATUS", "FILES", "SIZE", "DURATION", "NOTE"]
    assert len(lines) == 1 + 9 + 1
    skipped = next(line for line in lines if " reward " in line)
    assert "skipped" in skipped and "owned by capture" in skipped and "step 2 role rollout" in skipped
    failed = next(line for line in lines if " failed " in line)
    assert "actor_update" in failed and "SessionLostError" in failed
    assert lines[-1].startswith("9 captures (1 failed, 7 ok, 1 skipped), 7 files")
    assert "\x1b[" not in out  # not a terminal: no colour
    assert "unreadable manifest line" in err and "cut by a crash" in err


def test_ls_filters_and_json(run_dir: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["ls", str(run_dir), "--json", "--step", "1", "--rank", "1"]) == 0
    records = json.loads(capsys.readouterr().out)
    assert sorted(r["role"] for r in records) == ["actor_update", "rollout"]
    assert all(r["rank"] == 1 and r["steps"] == [1] and r["status"] == "ok" for r in records)
    assert all(r["files"] and (run_dir / r["files"][0]["path"]).is_file() for r in records)

    assert main(["ls", str(run_dir), "--json", "--role", "roll*", "--status", "ok"]) == 0
    records = json.loads(capsys.readouterr().out)
    assert len(records) == 4 and {r["role"] for r in records} == {"rollout"}

    assert main(["ls", str(run_dir), "--status", "skipped"]) == 0
    assert "reward" in capsys.readouterr().out

    assert main(["ls", str(run_dir), "--step", "7"]) == 0
    assert capsys.readouterr().out.strip() == "no captures match the filters"


def test_ls_missing_and_foreign_folders_say_so(tmp_path: Path, run_dir: Path,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["ls", str(tmp_path / "nope")]) == 2
    assert "no such folder" in capsys.readouterr().err
    assert main(["ls", str(tmp_path)]) == 2
    assert "not a profctx folder" in capsys.readouterr().err
    assert main(["ls", str(run_dir / "step000001")]) == 2
    assert f"inside the profctx run {run_dir}" in capsys.readouterr().err


def test_ls_reads_an_open_capture_from_a_crashed_process(run_dir: Path, tmp_path: Path,
                                                         capsys: pytest.CaptureFixture[str]) -> None:
    copy = tmp_path / "run"
    shutil.copytree(run_dir, copy)
    shard = next((copy / ".profctx").glob("*.rank0-*.jsonl"))
    started = {"v": 1, "run": "clirun", "rank": 0, "world_size": 2, "host": "h", "pid": 1, "capture": "dead",
               "kind": "role", "steps": [3], "step": 3, "role": "rollout", "event": "started", "start_time": 1.0}
    with open(shard, "a", encoding="utf-8") as fh:
        fh.write(json.dumps(started) + "\n")
    main(["ls", str(copy), "--step", "3"])
    out = capsys.readouterr().out
    assert "open" in out and "never finished" in out


def test_command_line_entry_and_help() -> None:
    for command in ("ls", "merge", "report", "doctor", "diff", "check"):
        done = subprocess.run([sys.executable, "-m", "profctx", command, "--help"], capture_output=True, text=True,
                              check=False)
        assert done.returncode == 0 and "usage: profctx " + command in done.stdout
    done = subprocess.run([sys.executable, "-m", "profctx", "merge", "somewhere"], capture_output=True, text=True,
                          check=False)
    assert done.returncode == 2 and "somewhere: no such folder" in done.stderr
    assert "Traceback" not in done.stderr


@pytest.mark.parametrize("window", ["abc", "1,x", ","])
def test_demo_refuses_a_bad_window_with_a_usage_error(window: str) -> None:
    done = subprocess.run([sys.executable, "-m", "profctx", "demo", "--window", window], capture_output=True,
                          text=True, check=False)
    assert done.returncode == 2, done.stderr
    assert "Traceback" not in done.stderr and f"--window {window!r} is not valid" in done.stderr


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_colour_only_on_a_terminal_and_never_with_no_color(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("NO_COLOR", raising=False)
    monkeypatch.setenv("TERM", "xterm-256color")
    assert "\x1b[" in Style(_Terminal()).status("failed")
    assert Style(io.StringIO()).status("failed") == "failed"  # a pipe
    monkeypatch.setenv("NO_COLOR", "1")
    assert Style(_Terminal()).status("failed") == "failed"


def test_ls_shows_one_line_per_error(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    # A Ray error as an engine actor's failure records it: a header line, then the actor's details.
    import profctx
    from profctx.process._owner import OWNER
    from profctx.records._manifest import failed_call

    profctx.configure(save_path=tmp_path, steps=[1], tool="noop")
    error = "ActorDiedError: The actor died unexpectedly before finishing this task.\n\tclass_name: Engine\n\tpid=42"
    assert OWNER.runtime is not None
    OWNER.runtime.record(failed_call(1, "rollout", error, "the engine actor died", kind="engine", engine="vllm"))
    profctx.reset()
    assert main(["ls", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    (row,) = [line for line in out.splitlines() if " failed " in line]
    assert row.rstrip().endswith("The actor died unexpectedly before finishing this task. …"), row
    assert "class_name" not in out and "pid=42" not in out
