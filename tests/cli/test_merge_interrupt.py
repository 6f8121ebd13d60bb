"""``profctx merge`` ended by SIGTERM removes its temporary (a real subprocess, stopped mid-write).

The merge is frozen (SIGSTOP) as soon as its temporary appears, sent SIGTERM, then let go
(SIGCONT): the signal lands while the output is being written, whatever the machine's load.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import profctx
from profctx.records._manifest import read

torch = pytest.importorskip("torch")

#: A bound on the subprocess only, so that a regression fails instead of hanging.
BOUND_S = 120


def _big_run(save: Path) -> None:
    """A real one-step torch capture whose trace is then made large (its events repeated)."""
    profctx.configure(steps="1", save_path=save, run_id="big", compress=False, exit_hooks=False, warmup=False,
                      timeline=False)
    x = torch.ones(4)
    for step in (0, 1, 2):
        with profctx.profile_step(step):
            for _ in range(20):
                x = x + 1
    assert profctx.flush(60)
    profctx.reset()
    [record] = read(save)
    path = save / record["files"][0]["path"]
    trace = json.loads(path.read_bytes())
    events = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    trace["traceEvents"] = trace["traceEvents"] + events * (400_000 // max(len(events), 1))
    path.write_text(json.dumps(trace))


def test_a_merge_ended_by_sigterm_leaves_no_temporary(tmp_path: Path) -> None:
    _big_run(tmp_path)
    merged = tmp_path / "merged"
    env = {**os.environ, "PYTHONPATH": str(Path(profctx.__file__).parent.parent)}
    proc = subprocess.Popen([sys.executable, "-m", "profctx", "merge", str(tmp_path)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + BOUND_S
        while not (merged.is_dir() and any(p.name.startswith(".profctx-tmp-") for p in merged.iterdir())):
            assert proc.poll() is None, "the merge ended before its temporary was seen"
            assert time.monotonic() < deadline, "no temporary appeared"
            time.sleep(0.001)
        proc.send_signal(signal.SIGSTOP)
        proc.send_signal(signal.SIGTERM)
        proc.send_signal(signal.SIGCONT)
        _, err = proc.communicate(timeout=BOUND_S)
    finally:
        proc.kill()
    assert proc.returncode == 128 + signal.SIGTERM, err
    assert sorted(p.name for p in merged.iterdir()) == []  # neither the temporary nor a half-written output
