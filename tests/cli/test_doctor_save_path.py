"""``profctx doctor`` checks save_path by really creating and writing, and leaves nothing behind."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from profctx.cli import main


def _save_path_finding(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, dict[str, str]]:
    code = main(["doctor", "--json", "--save-path", *args])
    findings = {f["subject"]: f for f in json.loads(capsys.readouterr().out)}
    return code, findings["save_path"]


def test_a_folder_under_proc_is_reported_as_failing(capsys: pytest.CaptureFixture[str]) -> None:
    # The old check asked os.access about /proc, which says yes to root, and printed "can be created".
    code, finding = _save_path_finding(capsys, "/proc/x")
    assert code == 1 and finding["level"] == "fail"
    assert "can be created" not in finding["message"] and "/proc" in finding["message"]
    assert not Path("/proc/x").exists()


def test_a_folder_that_mkdir_refuses_is_reported_as_failing(tmp_path: Path,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    link = tmp_path / "kernel"
    link.symlink_to("/proc")  # hides /proc from any check of the path's text: only mkdir tells
    code, finding = _save_path_finding(capsys, str(link / "x" / "y"))
    assert code == 1 and finding["level"] == "fail"
    assert "cannot be created" in finding["message"]


def test_a_missing_folder_is_created_written_and_removed_again(tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    target = tmp_path / "a" / "b" / "c"
    code, finding = _save_path_finding(capsys, str(target))
    assert code == 0 and finding["level"] == "ok"
    assert "creating it and writing into it worked" in finding["message"]
    assert list(tmp_path.iterdir()) == []  # every folder the check made is gone again


def test_an_existing_folder_keeps_no_probe_file(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "mine").write_text("kept")
    code, finding = _save_path_finding(capsys, str(tmp_path))
    assert code == 0 and "is writable" in finding["message"]
    assert [p.name for p in tmp_path.iterdir()] == ["mine"]
