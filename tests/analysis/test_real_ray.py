"""The analysis of a real Ray worker-group run: torch traces of two workers and the driver, step mode.

The driver draws a ``rollout`` role that calls both workers' ``@profiled(role="generate")`` method;
rank 1 sleeps longer (a straggler). Workers hold each in-window step the driver enters (step
captures), so their roles are ranges inside ``ProfilerStep#N``; the driver's ``rollout`` range holds
no operator (it waits on Ray), which is what its time in no operator says.
"""

from __future__ import annotations

import importlib
import logging
import os
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

import profctx
from profctx.analysis import Summary, summarize

ray = pytest.importorskip("ray")
pray = pytest.importorskip("profctx.ray")
pytest.importorskip("torch")

pytestmark = [pytest.mark.slow, pytest.mark.ray]

HERE = Path(__file__).resolve().parent
SLEEP = 0.03
DELAY = 0.06
#: What the trace's clock and ``perf_counter`` may disagree by on one interval (as in test_real_traces.py).
CLOCKS_S = 5e-5
CLOCKS_REL = 1e-4
#: The workers' timers by (step, rank): (generate's body's seconds, the whole call's seconds).
Timers = dict[tuple[int, int], tuple[float, float]]


@pytest.fixture(scope="module")
def run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Summary, Timers]]:
    save = tmp_path_factory.mktemp("ray")
    path = os.pathsep.join(p for p in (str(HERE), os.environ.get("PYTHONPATH", "")) if p)
    ray.init(num_cpus=2, include_dashboard=False, logging_level=logging.WARNING, log_to_driver=False,
             runtime_env={"env_vars": {"PYTHONPATH": path}})
    try:
        # Imported by its top-level name, as the workers (HERE on their PYTHONPATH) import it back.
        sys.path.insert(0, str(HERE))
        try:
            generator = importlib.import_module("real_actors").Generator
        finally:
            sys.path.remove(str(HERE))
        remote = ray.remote(num_cpus=0)(generator)
        workers = [remote.remote(0.0), remote.remote(DELAY)]
        profctx.configure(steps="2:4", mode="step", ranks="all", save_path=str(save))
        pray.group("gen", workers)
        timers: Timers = {}
        for step in range(1, 5):
            with profctx.profile_step(step), profctx.profile_step(role="rollout"):
                # Each worker times generate's body (inside its range) and the call around it (holding it).
                for rank, (inside, around) in enumerate(pray.fan_out([(w, "timed") for w in workers], (SLEEP,))):
                    timers[(step, rank)] = (inside, around)
        pray.flush()
        profctx.reset()
        yield summarize(save), timers
    finally:
        profctx.reset()
        ray.shutdown()


def test_worker_roles_times_and_straggler(run: tuple[Summary, Timers]) -> None:
    summary, timers = run
    assert summary.steps == [2, 3]
    assert {p.role for p in summary.phases} == {"generate", "rollout"}
    for step in (2, 3):
        generate = summary.phase(step, "generate")
        assert generate is not None and set(generate.per_process) == {"gen rank 0", "gen rank 1"}
        # The range holds its body's timer and lies in the call's: exact bounds whatever the load. The step's
        # capture starts when the worker enters the step, before the call, so a range that counted it
        # would exceed the call's timer.
        for process, seconds in generate.per_process.items():
            inside, around = timers[(step, int(process[-1]))]
            slack = CLOCKS_S + CLOCKS_REL * around
            assert inside - slack <= seconds <= around + slack, (process, inside, around)
        assert generate.straggler == "gen rank 1"
        assert generate.no_op_s is not None and generate.no_op_s >= SLEEP + DELAY
        # The driver's role waits on Ray: its range covers the slowest worker's, and no operator covers it.
        rollout = summary.phase(step, "rollout")
        assert rollout is not None and list(rollout.per_process) == ["driver"]
        assert rollout.time_s >= generate.time_s and rollout.no_op_s is not None
        assert rollout.no_op_s > 0.5 * rollout.time_s
