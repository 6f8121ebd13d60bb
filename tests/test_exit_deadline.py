"""A hung ``on_capture`` hook never makes a process immune to SIGTERM: the exit is bounded.

Real subprocesses whose hook never returns. A second SIGTERM ends the process at once; the
``exit_timeout`` deadline ends it after the main thread finished. Either way the capture's record
says its hooks were given up on, and why. The subprocess's own timeout is only a generous bound
on a test that would otherwise hang for ever (the bug); nothing asserts on elapsed time.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import profctx
from profctx.records._manifest import read

#: A bound on the whole subprocess, only so that a regression fails instead of hanging the suite.
BOUND_S = 120

SCRIPT = textwrap.dedent("""
    import sys, threading, time
    import profctx

    save, mode, timeout = sys.argv[1], sys.argv[2], float(sys.argv[3])
    profctx.configure(steps="1:2", tool="noop", save_path=save, exit_timeout=timeout, warmup=False,
                      timeline=False)

    @profctx.on_capture
    def hang(record):
        print("hook", flush=True)
        threading.Event().wait()  # never returns

    with profctx.profile_step(1):
        pass
    if mode == "deadline":
        sys.exit(0)  # the main thread ends: the exit waits exit_timeout seconds for the hook, no more
    try:
        while True:
            time.sleep(0.05)
    finally:
        print("unwinding", flush=True)
""")


def _start(save: Path, mode: str, timeout: float) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": str(Path(profctx.__file__).parent.parent)}
    return subprocess.Popen([sys.executable, "-c", SCRIPT, str(save), mode, str(timeout)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)


def _wait_line(proc: subprocess.Popen[str], line: str) -> None:
    assert proc.stdout is not None
    for got in proc.stdout:
        if got.strip() == line:
            return
    pytest.fail(f"the subprocess ended before printing {line!r}: {proc.stderr.read() if proc.stderr else ''}")


def _capture(save: Path) -> dict[str, object]:
    [record] = [r for r in read(save) if r.get("kind") == "step"]
    return record


def test_a_second_sigterm_ends_a_process_whose_hook_hangs(tmp_path: Path) -> None:
    proc = _start(tmp_path, "sigterm", 3600.0)  # the deadline is far away: only the second SIGTERM can end it
    try:
        _wait_line(proc, "hook")
        proc.send_signal(signal.SIGTERM)
        _wait_line(proc, "unwinding")  # the first one was handled: the program is on its way out
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=BOUND_S)
    finally:
        proc.kill()
    assert proc.returncode == -signal.SIGTERM, err  # ended by SIGTERM, as the default action would
    record = _capture(tmp_path)
    assert record["status"] == "ok"  # what was written is recorded as written
    assert record["hooks"] == "abandoned"
    assert any("second SIGTERM" in note and "hang" in note for note in record["notes"]), record["notes"]
    assert "on_capture hooks given up at exit" in err


def test_the_exit_deadline_ends_a_process_whose_hook_hangs(tmp_path: Path) -> None:
    proc = _start(tmp_path, "deadline", 1.0)
    try:
        _, err = proc.communicate(timeout=BOUND_S)
    finally:
        proc.kill()
    assert proc.returncode == 0, err
    record = _capture(tmp_path)
    assert record["status"] == "ok"
    assert record["hooks"] == "abandoned"
    assert any("exit_timeout (1 s)" in note for note in record["notes"]), record["notes"]


@pytest.mark.parametrize("value", [0, -1.0, float("nan"), float("inf"), True, "60", 8 * 24 * 3600.0])
def test_a_bad_exit_timeout_is_refused_at_configure_time(value: object) -> None:
    with pytest.raises(profctx.ConfigError) as caught:
        profctx.configure(steps="1", tool="noop", exit_timeout=value, exit_hooks=False)
    assert "exit_timeout" in str(caught.value)
