"""``profctx merge`` ended by SIGTERM removes its temporary (a real subprocess, stopped mid-write).

The merge is frozen (SIGSTOP) as soon as its temporary appears, sent SIGTERM, then let go
(SIGCONT): the signal lands while the output is being written, whatever the machine's load.
"""

from __future__ import annotations

import gzip
import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import profctx
from profctx.records._manifest import read

#: A bound on the subprocess only, so that a regression fails instead of hanging.
BOUND_S = 120


def _big_run(run_dir: Path, save: Path) -> None:
    """A copy of the session's real run, with one trace made large (its events repeated, gzip level 1)."""
    shutil.copytree(run_dir, save, dirs_exist_ok=True)
    records = [r for r in read(save) if r.get("status") == "ok" and r.get("files")]
    path = save / records[0]["files"][0]["path"]
    trace = json.loads(gzip.decompress(path.read_bytes()))
    events = [e for e in trace["traceEvents"] if e.get("ph") == "X"]
    trace["traceEvents"] = trace["traceEvents"] + events * (60_000 // max(len(events), 1))
    path.write_bytes(gzip.compress(json.dumps(trace).encode(), 1))


def test_a_merge_ended_by_sigterm_leaves_no_temporary(run_dir: Path, tmp_path: Path) -> None:
    save = tmp_path / "run"
    _big_run(run_dir, save)
    merged = save / "merged"
    env = {**os.environ, "PYTHONPATH": str(Path(profctx.__file__).parent.parent)}
    proc = subprocess.Popen([sys.executable, "-m", "profctx", "merge", str(save)], env=env,
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
