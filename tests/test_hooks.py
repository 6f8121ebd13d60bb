"""``profctx.on_capture``: a hook per finished capture, off the training thread, never raising into training."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Any

import pytest

import profctx
from profctx.manifest import CaptureRecord


def _configure(tmp_path: Path, **fields: Any) -> None:
    profctx.configure(steps="1:3", tool="recording", save_path=str(tmp_path), exit_hooks=False, warmup=False,
                      **fields)


def test_the_hook_gets_each_capture_after_its_files_are_written_off_the_training_thread(tmp_path: Path) -> None:
    seen: list[tuple[CaptureRecord, bool, bool]] = []

    @profctx.on_capture
    def hook(record: CaptureRecord) -> None:
        files = [tmp_path / f.path for f in record.files]
        seen.append((record, bool(files) and all(p.is_file() for p in files),
                     threading.current_thread() is threading.main_thread()))

    _configure(tmp_path, mode="role")
    for step in range(4):
        with profctx.profile_step(step), profctx.profile_step(role="rollout"):
            pass
    assert profctx.flush()
    assert [(r.steps, r.role, r.status) for r, _, _ in seen] == [((1,), "rollout", "ok"), ((2,), "rollout", "ok")]
    assert all(written and not on_main for _, written, on_main in seen)


def test_a_hook_that_raises_is_recorded_and_the_next_one_still_runs(tmp_path: Path,
                                                                    caplog: pytest.LogCaptureFixture) -> None:
    calls: list[int] = []

    def broken(record: CaptureRecord) -> None:
        raise OSError("upload failed")

    profctx.on_capture(broken)
    profctx.on_capture(lambda record: calls.append(record.steps[0]))
    _configure(tmp_path, on_error="raise")  # even so: a hook's failure never reaches training
    for step in (1, 2):
        with profctx.profile_step(step):
            pass
    assert profctx.flush()
    assert calls == [1, 2]
    runtime = profctx.process._owner.OWNER.runtime
    assert runtime is not None and any("capture hook" in e and "upload failed" in e for e in runtime.errors)
    assert "upload failed" in caplog.text


def test_hooks_outlive_configure_and_go_with_reset_or_remove(tmp_path: Path) -> None:
    calls: list[int] = []

    def hook(record: CaptureRecord) -> None:
        calls.append(record.steps[0])

    profctx.on_capture(hook)
    profctx.on_capture(hook)  # once only
    _configure(tmp_path)
    with profctx.profile_step(1):
        pass
    profctx.flush()
    profctx.remove_on_capture(hook)
    with profctx.profile_step(2):
        pass
    profctx.flush()
    profctx.on_capture(hook)
    profctx.reset()
    _configure(tmp_path)
    with profctx.profile_step(1):
        pass
    profctx.flush()
    assert calls == [1]


def test_a_hook_that_is_not_callable_is_refused() -> None:
    with pytest.raises(profctx.ConfigError, match="on_capture"):
        profctx.on_capture("upload")  # type: ignore[type-var]
