"""Reading traces in a process pool: results in order, errors raised, a dead worker's share read here."""

from __future__ import annotations

import json
import os
import threading
from pathlib import Path

import pytest

from profctx.analysis import summarize
from profctx.analysis._parallel import AUTO_MIN_BYTES, Prefetched, cpus, jobs_for, ordered_map
from profctx.cli import main

from .synth import Spec, write_run

PARENT = os.getpid()


def double(x: int) -> int:
    return 2 * x


def fail_on_three(x: int) -> int:
    if x == 3:
        raise ValueError("three")
    return x


def die_in_a_worker(x: int) -> int:
    if x == 3 and os.getpid() != PARENT:
        os._exit(1)  # a worker killed mid-task (out of memory, a signal)
    return 2 * x


def test_results_come_in_input_order() -> None:
    items = list(range(12))
    assert list(ordered_map(double, items, 2)) == [2 * x for x in items]
    assert list(ordered_map(double, items, 1)) == [2 * x for x in items]


def test_an_error_in_a_worker_is_raised_here() -> None:
    with pytest.raises(ValueError, match="three"):
        list(ordered_map(fail_on_three, list(range(6)), 2))


def test_a_dead_worker_leaves_the_rest_to_this_process() -> None:
    assert list(ordered_map(die_in_a_worker, list(range(8)), 2)) == [2 * x for x in range(8)]


def test_jobs_given_are_bounded_by_the_files(tmp_path: Path) -> None:
    files = [tmp_path / f"{i}.json" for i in range(3)]
    for f in files:
        f.write_bytes(b"[]")
    assert jobs_for(files, 8) == 3
    assert jobs_for(files, 0) == 1
    assert jobs_for(files[:1], 4) == 1


def test_automatic_jobs_need_two_files_and_enough_bytes(tmp_path: Path) -> None:
    small = [tmp_path / "a.json", tmp_path / "b.json.gz"]
    for f in small:
        f.write_bytes(b"[]")
    assert jobs_for(small, None) == 1  # a pool would cost more than it saves
    big = tmp_path / "big.json"
    with open(big, "wb") as fh:
        fh.truncate(AUTO_MIN_BYTES)  # sparse: the size is what the estimate reads
    assert jobs_for([big], None) == 1
    assert jobs_for([big, *small], None) == min(cpus(), 3)
    assert jobs_for([*small, tmp_path / "missing.json"], None) == 1


def test_prefetched_hands_out_planned_results_and_computes_the_rest_here() -> None:
    with Prefetched(double, [1, 2, 3, 4], 2) as prefetched:
        assert prefetched(1) == 2
        assert prefetched(9) == 18  # out of the plan: computed here, the plan goes on
        assert prefetched(2) == 4
    # Left before the last planned items were asked for: the pool stops without them.
    with Prefetched(double, list(range(50)), 2) as prefetched:
        assert prefetched(0) == 0


def test_summary_read_by_a_pool_is_the_summary_read_here(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    run = write_run(tmp_path / "run", Spec(ranks=3, steps=(1, 2), events=60, slow={(2, "rollout"): 1.6}))
    alone = summarize(run, jobs=1).to_json()
    pooled = summarize(run, jobs=2).to_json()
    assert pooled == alone
    assert alone["stragglers"] and alone["role_ops"]
    assert main(["summary", str(run), "--json", "--jobs", "2", "--no-progress"]) == 0
    assert json.loads(capsys.readouterr().out)["phases"] == alone["phases"]


def pid_of(_: int) -> int:
    return os.getpid()


def test_with_threads_running_a_pool_starts_only_where_the_caller_allows_a_fork_server() -> None:
    stop = threading.Event()
    helper = threading.Thread(target=stop.wait, daemon=True)
    helper.start()
    try:
        # Forking a process with threads is unsafe, and another start method imports the caller's main
        # module again: by default the items are computed here.
        assert set(ordered_map(pid_of, list(range(4)), 2)) == {PARENT}
        assert PARENT not in set(ordered_map(pid_of, list(range(4)), 2, server=True))
    finally:
        stop.set()
        helper.join()
