"""Failure policy: profiling never breaks training, failures are logged once and recorded."""

from __future__ import annotations

import errno
import logging
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path
from typing import Any

import pytest

import profctx
from profctx.records._manifest import read

torch = pytest.importorskip("torch")


def loop(steps: range, role: str = "train") -> list[int]:
    out = []
    for step in steps:
        with profctx.profile_step(step), profctx.profile_step(role=role):
            out.append(int((torch.ones(4) * step).sum()))
    return out


def test_unwritable_save_path_is_logged_once_and_training_continues(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    # configure() probes save_path and refuses an unusable one, so the folder breaks afterwards.
    save_path = tmp_path / "profiles"
    profctx.configure(steps="1:4", save_path=save_path)
    shutil.rmtree(save_path)  # the folder and the manifest folder configure() made
    save_path.write_text("a file where the folder should be")
    with caplog.at_level(logging.WARNING, logger="profctx"):
        assert loop(range(1, 5)) == [4, 8, 12, 16]
        assert profctx.flush(30)
    warnings = [r.getMessage() for r in caplog.records if r.levelno >= logging.WARNING]
    assert len([w for w in warnings if "start failed" in w]) == 1
    assert len([w for w in warnings if "cannot write the manifest" in w]) == 1
    # The folder comes back: the records that waited in memory are written at reset (left unwritable,
    # reset would retry them for its whole shutdown timeout).
    save_path.unlink()
    profctx.reset()
    assert sorted(r["step"] for r in read(save_path)) == [1, 2, 3]


def test_unwritable_capture_folder_is_recorded_in_the_manifest(tmp_path: Path) -> None:
    (tmp_path / "step000002").write_text("blocks the capture folder")
    profctx.configure(steps="1:4", save_path=tmp_path)
    assert loop(range(1, 4)) == [4, 8, 12]
    assert profctx.flush(30)
    records = {r["step"]: r for r in read(tmp_path)}
    assert records[1]["status"] == "ok" and records[3]["status"] == "ok"
    assert records[2]["status"] == "failed"
    assert "FileExistsError" in records[2]["error"] or "NotADirectoryError" in records[2]["error"]


def held_open(folder: Path) -> list[str]:
    """Return what this process holds open under ``folder`` (a deleted file shows as ``... (deleted)``)."""
    held = []
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:
            continue
        if target.startswith(str(folder)):
            held.append(target)
    return held


@pytest.mark.parametrize("where", ["compressing", "renaming"])
def test_disk_full_while_writing_is_recorded(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, where: str) -> None:
    import profctx.backends.torch as torch_backend

    def full(*args: object, **kwargs: object) -> None:
        raise OSError(errno.ENOSPC, "No space left on device")

    def full_midway(src: Any, dst: Any, length: int = 0) -> None:
        dst.write(src.read(4096))  # some bytes reach the file, then the disk is full
        full()

    if where == "renaming":
        monkeypatch.setattr(torch_backend.os, "replace", full)
    else:
        monkeypatch.setattr(torch_backend.shutil, "copyfileobj", full_midway)
    profctx.configure(steps=[1], save_path=tmp_path)
    assert loop(range(1, 2)) == [4]
    assert profctx.flush(30)
    (record,) = read(tmp_path)
    assert record["status"] == "failed" and "No space left" in record["error"]
    assert not [p for p in tmp_path.rglob("*.tmp")], "temporary files are cleaned up"
    assert not [p for p in tmp_path.rglob(".profctx-tmp-*")], "temporary files are cleaned up"
    if os.path.isdir("/proc/self/fd"):  # deleting files frees their space only once nothing holds them
        assert [p for p in held_open(tmp_path) if ".profctx/" not in p] == []


def test_on_error_raise_surfaces_failures(tmp_path: Path) -> None:
    (tmp_path / "step000001").write_text("blocks the capture folder")
    profctx.configure(steps=[1], save_path=tmp_path, on_error="raise")
    with pytest.raises(profctx.ProfilingError, match="start failed"), profctx.profile_step(1):
        pass
    assert profctx.current() == profctx.Scope()


def test_user_exception_is_unchanged_and_the_capture_still_written(tmp_path: Path) -> None:
    profctx.configure(steps=[1], mode="role", save_path=tmp_path)
    error = RuntimeError("user bug")

    def train() -> None:
        with profctx.profile_step(1), profctx.profile_step(role="actor_update"):
            torch.ones(3).sum()
            raise error

    with pytest.raises(RuntimeError) as info:
        train()
    assert info.value is error
    assert info.traceback[-1].name == "train"
    assert profctx.flush(30)
    (record,) = read(tmp_path)
    assert record["status"] == "ok" and (tmp_path / record["files"][0]["path"]).exists()


SCRIPT = """
import os, signal, sys, time
import profctx, torch
save, how = sys.argv[1], sys.argv[2]
if how == "sigterm":
    def previous(signum, frame):
        open(os.path.join(save, "previous-handler-ran"), "w").close()
        sys.exit(3)
    signal.signal(signal.SIGTERM, previous)
profctx.configure(steps="1:10", contiguous=True, save_path=save, exit_hooks=(how != "off"))
for step in (1, 2):
    with profctx.profile_step(step):
        torch.ones(8).sum()
        if how == "sigterm" and step == 2:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
"""


@pytest.mark.parametrize("how", ["exit", "sigterm", "off"])
def test_open_capture_is_written_at_exit(tmp_path: Path, how: str) -> None:
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(SCRIPT))
    save = tmp_path / "profiles"
    result = subprocess.run([sys.executable, str(script), str(save), how], capture_output=True, text=True,
                            timeout=120, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    records = read(save)
    assert len(records) == 1
    if how == "off":
        # Opted out: nothing stops the capture (torch itself may then crash at exit).
        assert records[0]["status"] == "open"
        assert not list(save.rglob("*.pt.trace.json*"))
        return
    assert records[0]["status"] == "ok", result.stderr
    assert records[0]["steps"] == list(range(1, 10))
    assert (save / records[0]["files"][0]["path"]).stat().st_size > 0
    if how == "sigterm":
        assert result.returncode == 3
        assert (save / "previous-handler-ran").exists()
    else:
        assert result.returncode == 0
