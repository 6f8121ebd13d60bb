"""Hostile environments: configuration from the environment alone, a deleted save_path, a full disk."""

from __future__ import annotations

import json
import logging
import os
import shutil
import subprocess
import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

import profctx
from profctx.records._manifest import MANIFEST_DIR, read


def test_a_program_that_never_calls_configure_is_profiled_from_the_environment(tmp_path: Path) -> None:
    program = textwrap.dedent("""
        import profctx

        @profctx.profiled(role="actor_update")
        def update():
            return profctx.current().path

        for step in range(1, 5):
            with profctx.profile_step(step):
                update()
        print(profctx.is_configured())
    """)
    env = {**os.environ, "PROFCTX_STEPS": "2:4", "PROFCTX_SAVE_PATH": str(tmp_path), "PROFCTX_TOOL": "recording",
           "PROFCTX_MODE": "role"}
    out = subprocess.run([sys.executable, "-c", program], env=env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.split() == ["True"]
    assert [(r["step"], r["role"], r["status"]) for r in read(tmp_path)] == [
        (2, "actor_update", "ok"), (3, "actor_update", "ok")]


def test_without_profctx_variables_nothing_is_configured(tmp_path: Path) -> None:
    with profctx.profile_step(1):
        pass
    assert not profctx.is_configured()


def test_a_bad_variable_is_a_config_error_at_the_first_block(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROFCTX_STEPS", "abc")
    with pytest.raises(profctx.ConfigError, match="PROFCTX_STEPS"), profctx.profile_step(1):
        pass


def test_a_deleted_save_path_is_recreated_and_warned_once(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    save = tmp_path / "profiles"
    profctx.configure(steps="0:10", save_path=save, tool="recording", exit_hooks=False, warmup=False)
    for step in range(3):
        with profctx.profile_step(step):
            pass
    assert profctx.flush(10)
    shutil.rmtree(save)
    with caplog.at_level(logging.WARNING, logger="profctx"):
        for step in range(3, 8):
            with profctx.profile_step(step):
                pass
        assert profctx.flush(10)
    records = read(save)
    assert [r["step"] for r in records] == [3, 4, 5, 6, 7]
    assert all(r["status"] == "ok" for r in records)
    assert sum("was deleted" in m for m in caplog.messages) == 1
    from profctx.cli import main

    assert main(["ls", str(save)]) == 0


@pytest.fixture
def tiny_disk(tmp_path: Path) -> Iterator[Path]:
    """A 2 MiB tmpfs (skipped where mounting is not allowed)."""
    where = tmp_path / f"tmpfs-{uuid.uuid4().hex[:6]}"
    where.mkdir()
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=2m", "tmpfs", str(where)], capture_output=True)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.decode().strip()}")
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], capture_output=True)


def _fill(disk: Path, leave: int) -> Path:
    """Fill ``disk`` up to ``leave`` free bytes; return the filler file."""
    filler = disk / "filler"
    stats = os.statvfs(disk)
    size = max(0, stats.f_bavail * stats.f_frsize - leave)
    with open(filler, "wb") as out:
        out.write(b"\0" * size)
    return filler


def test_a_full_disk_is_recorded_as_such_cuts_no_line_and_profiling_resumes(tiny_disk: Path) -> None:
    torch = pytest.importorskip("torch")
    save = tiny_disk / "profiles"
    profctx.configure(steps="0:100", save_path=save, compress=False, exit_hooks=False, warmup=False)
    x = torch.ones(16, 16)
    with profctx.profile_step(0):
        x = x @ x
    assert profctx.flush(30)
    filler = _fill(tiny_disk, 8 * 1024)
    for step in range(1, 6):
        with profctx.profile_step(step):
            for _ in range(20):
                x = x @ x / 16
    assert profctx.flush(30)
    filler.unlink()
    for step in range(6, 12):
        with profctx.profile_step(step):
            x = x @ x / 16
    assert profctx.flush(30)
    profctx.reset()

    lines = [line for shard in (save / MANIFEST_DIR).glob("*.jsonl") for line in shard.read_text().splitlines()]
    assert lines and all(json.loads(line) for line in lines)  # no line was cut
    records = {r["step"]: r for r in read(save)}
    assert records[0]["status"] == "ok"
    failed = [r for r in records.values() if r["status"] == "failed"]
    assert failed and all("No space left" in r["error"] for r in failed)
    skipped = [r for r in records.values() if r["status"] == "skipped"]
    assert skipped and all("disk is full" in r["reason"] for r in skipped)  # backing off, not retrying each step
    assert [records[s]["status"] for s in range(6, 12)] == ["ok"] * 6  # space is back: all recorded
    assert not [p for p in save.rglob("*") if ".tmp" in p.name]  # no temporaries left behind
