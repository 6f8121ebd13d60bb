"""A 2-rank gloo job without Ray: on-demand and anomaly captures land on the same steps of every rank.

One real job (two processes, a gloo ``all_reduce`` in every step, as DDP has) serves the trigger
cases: the CLI's clock set 600 s behind the run's, a second request overlapping the first, steps
asked for that the run never reaches. Steps are counted; no assertion reads a wall-clock margin:
the ranks cross a collective in every step, so a rank enters the step after the decider's only
once the decider's step went through it, whatever the load.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import socket
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from profctx.cli import main
from profctx.manifest import read

ROOT = Path(__file__).resolve().parents[2]

#: One rank: a gloo process group, a step of ~50 ms with an all_reduce; stops when SAVE/stop appears (agreed
#: through the all_reduce, so both ranks end at the same step).
RANK = textwrap.dedent('''
    import json, os, sys, time
    import torch, torch.distributed as dist
    import profctx
    save, fields = sys.argv[1], json.loads(sys.argv[2])
    dist.init_process_group("gloo")
    profctx.configure(save_path=save, ranks="all", tool="noop", **fields)
    flag = torch.zeros(1)
    step = 0
    while True:
        with profctx.profile_step(step):
            with profctx.profile_step(role="rollout"):
                time.sleep(0.05)
            flag[0] = float(os.path.exists(os.path.join(save, "stop")) or step >= 2000)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX)
        if flag[0]:
            break
        step += 1
    print(step, flush=True)
    dist.destroy_process_group()
''')


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start(tmp: Path, save: Path, fields: dict[str, Any], **extra: str) -> list[subprocess.Popen[str]]:
    """Start the two ranks writing to ``save``."""
    script = tmp / "rank.py"
    script.write_text(RANK)
    env = {k: v for k, v in os.environ.items() if not k.startswith("PROFCTX_")}
    env.update(PYTHONPATH=str(ROOT) + os.pathsep + env.get("PYTHONPATH", ""), WORLD_SIZE="2",
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(_port()), PROFCTX_RUN_ID=f"agree-{os.urandom(3).hex()}",
               **extra)
    return [subprocess.Popen([sys.executable, str(script), str(save), json.dumps(fields)],
                             env={**env, "RANK": str(rank), "LOCAL_RANK": str(rank)}, stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE, text=True) for rank in (0, 1)]


def steps_of(save: Path) -> list[int]:
    """Return the step each live rank of ``save`` published."""
    found = []
    for path in (save / ".profctx" / "live").glob("*.json"):
        try:
            step = json.loads(path.read_text()).get("step")
        except (OSError, ValueError):
            continue
        if isinstance(step, int):
            found.append(step)
    return found


def wait_for(predicate: Any, what: str, procs: list[subprocess.Popen[str]], timeout: float = 120.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline or any(p.poll() is not None for p in procs):
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.05)


def finish(save: Path, procs: list[subprocess.Popen[str]]) -> list[str]:
    (save / "stop").write_text("")
    errors = []
    for proc in procs:
        _, err = proc.communicate(timeout=120)
        assert proc.returncode == 0, err
        errors.append(err)
    return errors


def trigger(save: Path, *args: str) -> tuple[int, dict[str, Any] | str]:
    """Run ``profctx trigger`` in this process (its clock is the one the fixture sets); return its code and output."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main(["trigger", str(save), *args])
    return code, (json.loads(out.getvalue()) if "--json" in args and code in (0, 1) and out.getvalue().strip()
                  else out.getvalue() + err.getvalue())


@pytest.fixture(scope="module")
def job(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """Run the job once; trigger it twice (the CLI's clock 600 s behind, then 20 s ahead); stop before the end."""
    tmp = tmp_path_factory.mktemp("agree")
    save = tmp / "run"
    procs = start(tmp, save, {"on_demand": True})
    real = time.time
    out: dict[str, Any] = {"save": save}
    with pytest.MonkeyPatch.context() as mp:
        try:
            wait_for(lambda: len(steps_of(save)) == 2 and min(steps_of(save)) >= 3, "both ranks to start", procs)
            mp.setattr(time, "time", lambda: real() - 600.0)  # the CLI's clock, not the run's
            out["first"] = trigger(save, "--steps", "100", "--json", "--wait", "60")
            mp.setattr(time, "time", lambda: real() + 20.0)
            out["second"] = trigger(save, "--steps", "2", "--wait", "60")
            mp.setattr(time, "time", real)
            answer = out["first"][1]["answer"] if isinstance(out["first"][1], dict) else {}
            first = answer.get("first", 0) if isinstance(answer, dict) else 0
            # Stop a few steps into the request (of 100 steps): the rest is never reached.
            wait_for(lambda: min(steps_of(save)) >= first + 3, "the ranks to enter the requested steps", procs)
        finally:
            mp.setattr(time, "time", real)
            out["errors"] = finish(save, procs)
    yield out


def test_the_cli_s_clock_does_not_matter_and_both_ranks_capture_the_steps_named(job: dict[str, Any]) -> None:
    code, first = job["first"]
    assert code == 0 and isinstance(first, dict), first
    answer = first["answer"]
    assert answer["state"] in ("scheduled", "done"), answer
    start, last = answer["first"], answer["last"]
    assert last - start == 99
    captures = [r for r in read(job["save"]) if r.status == "ok" and (r.trigger or {}).get("id") == first["id"]]
    by_rank = {rank: sorted(r.steps[0] for r in captures if r.rank == rank) for rank in (0, 1)}
    assert by_rank[0] and by_rank[0] == by_rank[1], (by_rank, job["errors"])
    assert by_rank[0][0] == start and by_rank[0] == list(range(start, by_rank[0][-1] + 1))


def test_a_second_overlapping_request_is_refused_with_a_record_and_a_message(job: dict[str, Any]) -> None:
    code, text = job["second"]
    assert code == 1, text
    assert "refused" in str(text) and "overlap" in str(text), text
    refused = [r for r in read(job["save"]) if r.status == "skipped" and "overlap" in (r.reason or "")]
    assert [r.rank for r in refused] == [0], refused  # the deciding rank refused it; no rank captured it


def test_requested_steps_the_run_never_reached_are_recorded_and_said_at_exit(job: dict[str, Any]) -> None:
    first = job["first"][1]
    left = [r for r in read(job["save"]) if r.status == "skipped" and (r.trigger or {}).get("id") == first["id"]]
    assert sorted(r.rank or 0 for r in left) == [0, 1] and None not in {r.rank for r in left}
    captured = {r.rank: max(s for c in read(job["save"]) if c.rank == r.rank and c.status == "ok"
                            for s in c.steps) for r in left}
    for record in left:
        assert "the run ended at step" in (record.reason or "")
        assert record.steps[0] == captured[record.rank] + 1 and record.steps[-1] == first["answer"]["last"]
    assert all("the run ended at step" in err for err in job["errors"]), job["errors"]
