"""``tool="auto"`` is chosen where a capture can happen: torch_npu is found, not imported, where it is absent."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from profctx.records._manifest import read

pytest.importorskip("torch")

SELECTED_AUTO = """
    import logging, sys, profctx
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    profctx.configure(steps=[1], ranks=[0], rank=0, save_path=sys.argv[1], tool="auto", mode="role", exit_hooks=False)
    with profctx.profile_step(1), profctx.profile_step(role="update"):
        pass
    profctx.flush()
    print("torch_npu" in sys.modules, "torch" in sys.modules)
"""


@pytest.mark.skipif(importlib.util.find_spec("torch_npu") is not None, reason="needs a machine without torch_npu")
def test_a_selected_process_with_auto_captures_with_torch_and_records_why(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(SELECTED_AUTO), str(tmp_path)],
                          capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["False", "True"]  # torch_npu was found absent, never imported; torch ran
    assert "tool='auto' chose 'torch': torch_npu is not installed" in done.stderr
    (record,) = read(tmp_path)
    assert record["status"] == "ok", record
    assert record["backend"] == "torch"
    assert "tool='auto' chose 'torch': torch_npu is not installed" in record["notes"]
