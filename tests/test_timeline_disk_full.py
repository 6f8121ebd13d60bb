"""A timeline that stops fitting on its disk says how many steps are missing from its file: those, no more."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from profctx.analysis._timeline import read

resource = pytest.importorskip("resource")


def test_a_full_disk_counts_only_the_steps_it_dropped(tmp_path: Path) -> None:
    # A file size limit makes the kernel do what a full disk does: the write that crosses it is cut short
    # (whole lines before the cut stay in the file), and every later write fails.
    code = f"""
        import resource, signal, profctx
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (24_000, 24_000))
        profctx.configure(save_path={str(tmp_path)!r}, steps=[10**6], tool="noop", warmup=False,
                          summary_at_exit=True)
        for step in range(1, 1201):
            with profctx.profile_step(step):
                with profctx.profile_step(role="work"):
                    pass
            if step % 50 == 0:
                profctx.flush()
    """
    env = {k: v for k, v in os.environ.items() if k not in ("PROFCTX_STEPS", "PROFCTX_SAVE_PATH", "RANK")}
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=tmp_path, env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    said = re.search(r"(\d+) step\(s\) (?:missing|dropped)", done.stderr)
    assert said is not None, done.stderr
    (process,) = read(tmp_path).processes
    in_file = len(process.steps)
    assert 0 < in_file < 1200
    assert int(said[1]) == 1200 - in_file  # every step the file lacks, and none that it holds
