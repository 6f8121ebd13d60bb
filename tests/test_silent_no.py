"""No silent no: each case where profctx does nothing says so, or does what the user meant."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import profctx
from profctx.backends import known
from profctx.cli.doctor import diagnose
from profctx.manifest import read

ROOT = Path(__file__).resolve().parents[1]


def _run(code: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("PROFCTX_", "RANK", "WORLD_SIZE",
                                                                       "LOCAL_RANK", "TORCHELASTIC"))}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=120, cwd=ROOT, env={**clean, "PYTHONPATH": str(ROOT), **env})


def test_a_rank_selection_no_process_of_the_run_has_is_said_once_at_exit(tmp_path: Path) -> None:
    done = _run(f"""
        import profctx
        profctx.configure(steps=[2], ranks=[1], save_path={str(tmp_path)!r}, tool="noop")
        for step in range(1, 5):
            with profctx.profile_step(step):
                pass
        profctx.flush()
        print("flushed")
    """)
    assert done.returncode == 0, done.stderr
    said = [line for line in done.stderr.splitlines() if "selects no process" in line]
    assert len(said) == 1, done.stderr
    assert "ranks=[1]" in said[0] and "world size 1" in said[0]
    # Two ranks where rank 1 exists: rank 0 capturing nothing is what was asked, and it says nothing.
    done = _run(f"""
        import profctx
        profctx.configure(steps=[2], ranks=[1], rank=0, world_size=2, save_path={str(tmp_path)!r}, tool="noop")
        with profctx.profile_step(2):
            pass
    """)
    assert done.returncode == 0 and "nothing was captured" not in done.stderr, done.stderr


def test_profiled_on_a_class_is_refused() -> None:
    with pytest.raises(TypeError, match="is a class"):
        @profctx.profiled(role="actor")
        class Actor:
            def update(self) -> None: ...


def test_a_role_block_left_by_an_exception_is_noted_in_its_record(tmp_path: Path) -> None:
    profctx.configure(steps=[1], mode="role", save_path=tmp_path, tool="noop", warmup=False, exit_hooks=False)
    with profctx.profile_step(1):
        with pytest.raises(KeyError), profctx.profile_step(role="reward"):
            raise KeyError("bad sample")
        with profctx.profile_step(role="update"):
            pass
    assert profctx.flush()
    notes = {r.role: r.notes for r in read(tmp_path)}
    assert any("left by an exception: KeyError" in note for note in notes["reward"]), notes
    assert not any("exception" in note for note in notes["update"])


def test_negative_steps_are_accepted_never_captured_nor_in_the_timeline(tmp_path: Path) -> None:
    profctx.configure(steps="0:3", save_path=tmp_path, tool="noop", warmup=False, exit_hooks=False)
    steps = profctx.Steps()
    for step in (-1, 0, -1, 1):  # warm-up and evaluation passes as step -1
        with profctx.profile_step(step):
            assert profctx.current().step == step
            with profctx.profile_step(role="eval" if step < 0 else "train"):
                pass
    steps.begin(-1)
    steps.end()
    assert profctx.flush()
    assert sorted(r.steps for r in read(tmp_path)) == [(0,), (1,)]
    lines = [json.loads(line) for path in (tmp_path / ".profctx").glob("*.timeline")
             for line in path.read_text().splitlines()]
    assert [line["step"] for line in lines if "step" in line] == [0, 1]


def test_doctor_and_configure_agree_on_every_tool(tmp_path: Path) -> None:
    findings = diagnose(str(tmp_path))
    said = {f.subject.removeprefix("tool="): f.level for f in findings if f.subject.startswith("tool=")}
    assert set(said) == set(known())
    for tool in known():
        try:
            profctx.configure(steps=[1], tool=tool, save_path=tmp_path, warmup=False, exit_hooks=False)
            accepted = True
        except profctx.ConfigError:
            accepted = False
        finally:
            profctx.reset()
        assert accepted == (said[tool] == "ok"), (tool, said[tool])
    nsys = next(f for f in findings if f.subject == "nsys")
    if said["nsys"] != "ok":
        assert "can emit ranges" not in nsys.message
