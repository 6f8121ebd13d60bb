"""A step is what a training loop holds: numpy integers and 0-d tensors work wherever an int does."""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import profctx
from profctx.testing import RecordingBackend

LOOP_VALUES = [np.int64(2), np.int32(2), np.uint8(2), torch.tensor(2), torch.tensor(2, dtype=torch.int32)]


@pytest.mark.parametrize("value", LOOP_VALUES, ids=lambda v: type(v).__name__ + str(getattr(v, "dtype", "")))
def test_an_unconfigured_block_takes_a_numpy_or_tensor_step_as_an_int(value: object) -> None:
    with profctx.profile_step(value) as scope:  # type: ignore[arg-type]
        assert scope.step == 2 and type(scope.step) is int
        assert profctx.current().step == 2


@pytest.mark.parametrize("value", LOOP_VALUES, ids=lambda v: type(v).__name__ + str(getattr(v, "dtype", "")))
def test_a_numpy_or_tensor_step_is_captured_and_filed_like_an_int(value: object, tmp_path: Path) -> None:
    profctx.configure(steps=[2], save_path=str(tmp_path), tool="recording", warmup=False)
    for step in (np.int64(1), value, torch.tensor(3)):  # before, in and after the window
        with profctx.profile_step(step), profctx.profile_step(role="rollout"):  # type: ignore[arg-type]
            pass
    profctx.flush()
    assert [c.steps for c in RecordingBackend.log] == [(2,)]
    records = [json.loads(line) for shard in (tmp_path / ".profctx").glob("*.jsonl") for line in shard.open()]
    assert records and all(r.get("steps", [2]) == [2] for r in records)
    assert (tmp_path / "step000002").is_dir()


def test_a_role_written_where_the_step_goes_says_to_write_role() -> None:
    with pytest.raises(profctx.ConfigError, match=r"profile_step\(role='rollout'\)") as info, \
            profctx.profile_step("rollout"):  # type: ignore[arg-type]
        pass
    assert info.value.field == "step"
    assert profctx.current() == profctx.Scope()


@pytest.mark.parametrize("value", [True, 1.5, np.float64(2.0), torch.tensor([1, 2]), object()])
def test_values_that_are_not_steps_are_refused_with_the_public_error(value: object, tmp_path: Path) -> None:
    for configured in (False, True):
        if configured:
            profctx.configure(steps=[1], save_path=str(tmp_path), tool="noop", warmup=False)
        with pytest.raises(profctx.ConfigError, match="step") as info, profctx.profile_step(value):  # type: ignore[arg-type]
            pass
        assert info.value.field == "step" and info.value.value is value
        assert profctx.current() == profctx.Scope()


def test_the_error_is_named_as_users_import_it_and_crosses_processes_whole() -> None:
    err = profctx.ConfigError("steps", "3:", "an unbounded window is refused")
    assert repr(err).startswith("ConfigError(") and type(err).__module__ == "profctx"
    again = pickle.loads(pickle.dumps(err))
    assert (type(again), again.field, again.value, again.allowed, str(again)) == (
        profctx.ConfigError, "steps", "3:", "an unbounded window is refused", str(err))
    code = "import profctx\nwith profctx.profile_step('rollout'):\n    pass\n"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    last = out.stderr.strip().splitlines()[-1]
    assert last.startswith("profctx.ConfigError: step: 'rollout' is not valid"), out.stderr
    assert "_errors" not in last
