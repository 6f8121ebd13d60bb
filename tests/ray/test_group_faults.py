"""Worker groups under faults on a real local Ray cluster: bounded control waits, lost members, lazy backends,
``@ray.method`` options kept under ``@profiled``."""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path
from typing import Any

import pytest

import profctx
from profctx.records import _manifest

ray = pytest.importorskip("ray")
pray = pytest.importorskip("profctx.ray")
from _fault_actors import KINDS, HangingStart, Member, SlowPrepare, SlowStart, state, wait_for  # noqa: E402 - after the skip

pytestmark = pytest.mark.slow

#: What a step may take beyond the wait it is promised to bound ("a fault costs at most control_timeout + C"):
#: its own Ray calls and capture, tens of ms on a quiet 2-core machine. 30 s leaves a loaded one (load average
#: 30) ample room and still fails for the cost a fault had before (Ray's own 300 s wait, at every call). That
#: the other steps waited for nothing is counted, not timed: the records and calls each test names.
SLACK_S = 30.0


@pytest.fixture(autouse=True)
def _fresh() -> Any:
    yield
    profctx.reset()


def test_ray_method_options_stacked_on_profiled_are_kept(ray_cluster: Any, tmp_path: Path) -> None:
    profctx.configure(steps=[1], mode="role", ranks="all", save_path=tmp_path, tool="recording", warmup=False)
    actors = [make().remote() for make in KINDS.values()]
    try:
        pray.group("actor", actors)
        for actor in actors:
            r1, r2 = actor.pair.remote(7)
            assert ray.get([r1, r2]) == [7, 8]
        with profctx.profile_step(1):
            a1, a2 = actors[2].pair_async.remote(3)
            assert ray.get([a1, a2]) == [3, "pair_async"]  # still profiled: the role is set
    finally:
        for actor in actors:
            ray.kill(actor)


def test_only_members_that_act_import_the_backend_and_get_step_control(ray_cluster: Any, tmp_path: Path) -> None:
    # The driver does not profile; only rank 0 of the group does.
    profctx.configure(steps=[1], mode="step", ranks={"actor": [0]}, save_path=tmp_path, tool="torch")
    actors = [ray.remote(num_cpus=0)(Member).remote() for _ in range(2)]
    try:
        pray.group("actor", actors)
        # The selected member's warm-up is over before it serves a later call: it lands in no step.
        assert [ray.get(a.__ray_call__.remote(state))["warm"] for a in actors] == [True, False]
        assert [ray.get(a.__ray_call__.remote(state))["torch"] for a in actors] == [True, False]
        with profctx.profile_step(1):
            assert [ray.get(a.work.remote()) for a in actors] == [1, None]  # rank 1 is not told
        assert pray.flush() == [True, True]
        assert [ray.get(a.__ray_call__.remote(state))["torch"] for a in actors] == [True, False]
    finally:
        for actor in actors:
            ray.kill(actor)
    records = [r for r in _manifest.read(tmp_path) if r.get("group") == "actor"]
    assert [(r["rank"], r["steps"], r["status"]) for r in records] == [(0, [1], "ok")]


def test_group_returns_with_the_joins_sent_and_members_waits_for_them(ray_cluster: Any, tmp_path: Path) -> None:
    profctx.configure(steps=[1], mode="step", ranks="all", save_path=tmp_path / "run", tool="recording", warmup=False)
    actors = [ray.remote(num_cpus=0)(Member).remote() for _ in range(2)]
    gate = tmp_path / "gate"
    try:
        busy = actors[0].__ray_call__.remote(wait_for, str(gate))  # the join queues behind it
        first = pray.group("actor", actors[:1], timeout=20)
        second = pray.group("critic", actors[1:], timeout=20)  # not held up by the busy member of "actor"
        gate.touch()  # had group() waited for its joins, it would still be waiting: "actor" never joined
        assert ray.get(busy) is True
        assert [m.pid for m in first.members] == [ray.get(actors[0].__ray_call__.remote(state))["pid"]]
        assert second.members[0].pid is not None
        with profctx.profile_step(1):
            assert ray.get([a.work.remote() for a in actors]) == [1, 1]
        assert pray.flush() == [True, True]
    finally:
        for actor in actors:
            ray.kill(actor)


def test_a_member_frozen_before_it_joins_is_waited_for_at_most_the_group_timeout(
        ray_cluster: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    profctx.configure(steps="1:9", mode="step", ranks="all", profile_driver=False, save_path=tmp_path,
                      tool="recording", warmup=False)
    actors = [ray.remote(num_cpus=0)(Member).remote() for _ in range(2)]
    pids = [ray.get(a.__ray_call__.remote(state))["pid"] for a in actors]
    os.kill(pids[1], signal.SIGSTOP)
    try:
        grp = pray.group("actor", actors, timeout=1.0, control_timeout=1.0)
        with profctx.profile_step(1):  # waits for the joins: the frozen one's until the timeout, then goes on
            assert ray.get(actors[0].work.remote()) == 1
        assert [m.pid for m in grp.members] == [pids[0], None]
        assert "rank 1 has not joined within 1.0s" in caplog.text
        assert pray.flush(timeout=1) == [True, False]  # not joined: told of no step, and its flush unanswered
    finally:
        os.kill(pids[1], signal.SIGCONT)
        for actor in actors:
            ray.kill(actor)
    records = _manifest.read(tmp_path)
    assert not [r for r in records if r.get("lost")]  # never told of a step: nothing to lose
    assert [(r["rank"], r["steps"]) for r in records if r.get("group") == "actor"] == [(0, [1])]


def test_a_join_that_answers_after_the_group_timeout_is_adopted(
        ray_cluster: Any, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    # The member's __init__ (a model loading) outlasts group(timeout=): its join answers late. It is told of no
    # step before the driver has read that join, then of every later one, and its files (another disk) are copied.
    run, gate = tmp_path / "run", tmp_path / "gate"
    profctx.configure(steps="1:9", mode="step", ranks="all", profile_driver=False, save_path=run, tool="recording",
                      warmup=False)
    fast = ray.remote(num_cpus=0)(Member).remote()
    slow = ray.remote(num_cpus=0)(SlowStart).options(
        runtime_env={"env_vars": {"PROFCTX_SAVE_PATH": str(tmp_path / "worker-disk")}}).remote(str(gate))
    try:
        ray.get(fast.__ray_call__.remote(state))  # started (rank 0 is not under test: it may join late too)
        grp = pray.group("actor", [fast, slow], timeout=1.0)
        with profctx.profile_step(1):  # waits for the joins at most the timeout, then goes on without rank 1
            ray.get(fast.work.remote())
        assert "rank 1 has not joined within 1.0s" in caplog.text and grp.members[1].pid is None
        gate.touch()
        pid = ray.get(slow.__ray_call__.remote(state), timeout=60)["pid"]  # served after its __init__ and join
        served = {}
        for step in range(2, 8):
            with profctx.profile_step(step):
                served[step] = ray.get([fast.work.remote(), slow.work.remote()])
        adopted = min(s for s, (_, held) in served.items() if held == s)
        assert adopted <= 3 and all(served[s][1] == s for s in range(adopted, 8)), served  # read at the next step
        member = grp.members[1]
        assert (member.pid, member.collect) == (pid, True) and member.actor_id is not None
        assert pray.flush() == [True, True]
    finally:
        for actor in (fast, slow):
            ray.kill(actor)
    records = [r for r in _manifest.read(run) if r.get("group") == "actor"]
    assert sorted(r["steps"][0] for r in records if r["rank"] == 1) == list(range(adopted, 8))
    assert all(r["status"] == "ok" and r["pid"] == pid for r in records if r["rank"] == 1)


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_a_warm_up_still_under_way_is_waited_for_before_the_first_step(ray_cluster: Any, tmp_path: Path,
                                                                         driver: str) -> None:
    # A threaded member runs control calls concurrently: its step entry must not overtake its join.
    profctx.configure(steps=[1], mode="step", ranks="all", profile_driver=False, save_path=tmp_path,
                      tool=SlowPrepare.name)
    actor = KINDS["threaded"]().remote()

    async def step() -> Any:
        async with profctx.profile_step(1):
            return await actor.work.remote()

    try:
        pray.group("actor", [actor])  # returns while the member warms up
        if driver == "sync":
            with profctx.profile_step(1):
                served = ray.get(actor.work.remote())
        else:
            served = asyncio.run(step())
        assert served == 1  # the member held step 1: configured before it was told to enter
        assert pray.flush() == [True]
    finally:
        ray.kill(actor)
    records = [r for r in _manifest.read(tmp_path) if r.get("group") == "actor"]
    assert [(r["steps"], r["status"]) for r in records] == [([1], "ok")]


@pytest.mark.parametrize("driver", ["sync", "async"])
def test_the_members_warm_up_lands_in_no_capture_of_the_driver(ray_cluster: Any, tmp_path: Path,
                                                                driver: str) -> None:
    # group() returns while its members join (and warm up); the driver's first in-window step opens its own
    # capture only once they have: the warm-up lands before the step, never inside the driver's capture.
    profctx.configure(steps=[1], mode="step", ranks="all", save_path=tmp_path, tool=SlowPrepare.name)
    actor = KINDS["sync"]().remote()

    async def step() -> Any:
        async with profctx.profile_step(1):
            return await actor.work.remote()

    try:
        ray.get(actor.work.remote())  # started, not yet a member
        t0 = time.time()  # the records' clock
        pray.group("actor", [actor])
        if driver == "sync":
            with profctx.profile_step(1):
                ray.get(actor.work.remote())
        else:
            asyncio.run(step())
        assert pray.flush() == [True]
    finally:
        ray.kill(actor)
    (mine,) = [r for r in _manifest.read(tmp_path) if r.get("group") is None and r["status"] == "ok"]
    # The capture opened once the warm-up (a sleep of PREPARE_S, never shorter) was over: a lower bound that
    # load only widens, where the capture's length had to stay under PREPARE_S / 2.
    assert mine["start_time"] >= t0 + SlowPrepare.PREPARE_S, (mine, t0)


@pytest.mark.parametrize("kind", ["threaded", "async", "sync"])
def test_a_frozen_member_is_lost_once_then_rejoins(ray_cluster: Any, tmp_path: Path, kind: str) -> None:
    # A sync member is never waited for: its step walls stay under the timeout, which is made 3 s more for it
    # (a sleep of it below, nothing else) so that a loaded machine's slow Ray calls stay far under it too.
    timeout = 5.0 if kind == "sync" else 2.0
    profctx.configure(steps="1:9", mode="step", ranks="all", profile_driver=False, save_path=tmp_path,
                      tool="recording", warmup=False)
    actors = [KINDS[kind]().remote() for _ in range(2)]
    try:
        grp = pray.group("actor", actors, control_timeout=timeout)
        frozen = grp.members[1]
        assert frozen.pid is not None and frozen.main == (kind == "sync")
        os.kill(frozen.pid, signal.SIGSTOP)
        walls = []
        try:
            for step in (1, 2, 3, 4):
                t0 = time.monotonic()
                with profctx.profile_step(step):
                    assert ray.get(actors[0].work.remote()) == step
                walls.append(time.monotonic() - t0)
                if kind == "sync" and step == 1:
                    time.sleep(timeout)  # never waited for: found lost once its answer is overdue
        finally:
            os.kill(frozen.pid, signal.SIGCONT)
        # Step 1 waited the timeout (a wait is never shorter), at most SLACK_S more; a sync member's, not at all.
        # No later step waited (300 s each before): the driver sent the member step 1's entry alone (the member's
        # records below: it missed step 1 only) and found it lost once (one row of the driver's).
        if kind == "sync":
            assert walls[0] < timeout, walls
        else:
            assert timeout <= walls[0] < timeout + SLACK_S, walls
        assert frozen.lost is not None and f"within {timeout:g}s" in frozen.lost
        ray.get(actors[1].__ray_call__.remote(state), timeout=60)  # thawed: it answers again
        back = None
        for step in range(5, 9):  # it answers what it owed, is told to leave step 1, then rejoins
            with profctx.profile_step(step):
                ray.get(actors[0].work.remote())
            if back is None and frozen.lost is None:
                back = step
        assert back is not None, frozen.lost  # within 4 steps of thawing (a loaded machine may need them all)
        assert pray.flush() == [True, True]
        assert ray.get(actors[1].__ray_call__.remote(state))["step"] is None  # it left every step it entered
    finally:
        for actor in actors:
            ray.kill(actor)
    records = _manifest.read(tmp_path)
    lost = [r for r in records if r.get("lost") and r.get("group") is None]  # the driver's rows
    assert [(r["target_group"], r["target_rank"], r["target_pid"]) for r in lost] == [("actor", 1, frozen.pid)]
    assert f"no answer to 'enter step' within {timeout:g}s" in lost[0]["error"]
    steps = sorted((r["rank"], r["steps"][0]) for r in records if r.get("group") == "actor" and r["status"] == "ok")
    assert [s for r, s in steps if r == 0] == [1, 2, 3, 4, 5, 6, 7, 8]
    # Step 1's entry was served after the driver had given up on it: not captured, recorded lost by the member.
    assert [s for r, s in steps if r == 1] == list(range(back, 9))
    missed = [r for r in records if r.get("group") == "actor" and r.get("lost")]
    assert [(r["rank"], r["step"]) for r in missed] == [(1, 1)] and "did not run step 1" in missed[0]["error"]


def test_a_member_frozen_inside_a_step_does_not_capture_the_steps_it_missed(ray_cluster: Any, tmp_path: Path) -> None:
    # The case: frozen while it holds step 2, the driver goes on with steps 3-6; thawed, the member serves
    # their queued control calls back to back: those are recorded lost, not captured as if it had run them.
    timeout = 2.0
    profctx.configure(steps="1:20", mode="step", ranks="all", profile_driver=False, save_path=tmp_path,
                      tool="recording", warmup=False)
    actors = [KINDS["sync"]().remote() for _ in range(2)]
    try:
        grp = pray.group("actor", actors, control_timeout=timeout)
        frozen = grp.members[1]
        with profctx.profile_step(1):
            assert ray.get([a.work.remote() for a in actors]) == [1, 1]
        with profctx.profile_step(2):
            assert ray.get([a.work.remote() for a in actors]) == [2, 2]
            os.kill(frozen.pid, signal.SIGSTOP)  # inside the step it holds
        try:
            for step in (3, 4, 5, 6):
                with profctx.profile_step(step):
                    assert ray.get(actors[0].work.remote()) == step
            time.sleep(1.5 * timeout)  # every call sent so far is served more than the timeout late
        finally:
            os.kill(frozen.pid, signal.SIGCONT)
        # Wait until the thawed member has served its backlog (calls from one caller run in order), so a loaded
        # machine cannot make it miss steps 7-14 too: what they test is that it is current again.
        ray.get(actors[1].__ray_call__.remote(lambda self: None), timeout=300)
        for step in range(7, 15):
            with profctx.profile_step(step):
                assert ray.get(actors[0].work.remote()) == step
        assert pray.flush() == [True, True]
    finally:
        for actor in actors:
            ray.kill(actor)
    records = [r for r in _manifest.read(tmp_path) if r.get("group") == "actor" and r["rank"] == 1]
    captured = {r["steps"][0]: r for r in records if r["status"] == "ok"}
    missed = sorted(r["step"] for r in records if r.get("lost"))
    assert missed == [3, 4, 5, 6] and not set(missed) & set(captured), (missed, sorted(captured))
    assert {1, 2, 14} <= set(captured)  # it captured again once the driver's calls were current
    assert any("left step 2" in note for note in captured[2]["notes"])  # the capture spans the freeze: said so


def test_a_death_through_a_bound_method_target_names_the_worker(ray_cluster: Any, tmp_path: Path) -> None:
    profctx.configure(steps=[1], mode="role", ranks="all", save_path=tmp_path, tool="recording", warmup=False)
    actors = [ray.remote(num_cpus=0, max_restarts=0)(Member).remote() for _ in range(2)]
    try:
        pray.group("actor", actors)
        with profctx.profile_step(1, role="train"):
            out = pray.fan_out([actors[0].work, actors[1].die], return_exceptions=True)
        assert out[0] == 1 and isinstance(out[1], ray.exceptions.RayActorError)
    finally:
        for actor in actors:
            ray.kill(actor)
    (death,) = [r for r in _manifest.read(tmp_path) if r["status"] == "failed"]
    assert (death["target_group"], death["target_rank"], death["role"]) == ("actor", 1, "train/die")


def test_a_member_ray_restarted_joins_again_by_itself(ray_cluster: Any, tmp_path: Path) -> None:
    profctx.configure(steps="1:9", mode="step", ranks="all", profile_driver=False, save_path=tmp_path,
                      tool="recording", warmup=False)
    actor = ray.remote(num_cpus=0, max_restarts=1)(Member).remote()
    try:
        grp = pray.group("actor", [actor])
        first = grp.members[0].pid
        assert first is not None
        with profctx.profile_step(1):
            assert ray.get(actor.work.remote()) == 1
        pray.flush()
        os.kill(first, signal.SIGKILL)
        deadline = time.monotonic() + 60
        while True:  # Ray starts a new process for it
            try:
                ray.get(actor.__ray_call__.remote(state), timeout=10)
                break
            except (ray.exceptions.RayActorError, ray.exceptions.GetTimeoutError):
                assert time.monotonic() < deadline, "the actor was not restarted"
                time.sleep(0.2)
        served = []
        for step in range(2, 7):  # 2: answers unconfigured, joined again at its end; from 3: held
            with profctx.profile_step(step):
                served.append(ray.get(actor.work.remote()))
        assert grp.members[0].pid not in (None, first)
        # The new process's join ran between steps 2 and 3 (waited for before step 3 opened), not in step 3.
        assert served == [None, 3, 4, 5, 6]
        pray.flush()
    finally:
        ray.kill(actor)
    records = [r for r in _manifest.read(tmp_path) if r.get("group") == "actor"]
    assert (first, 1) in {(r["pid"], r["step"]) for r in records}
    assert {r["step"] for r in records if r["pid"] == grp.members[0].pid} == {3, 4, 5, 6}


def test_an_async_driver_awaits_a_frozen_member_at_most_its_timeout(ray_cluster: Any, tmp_path: Path) -> None:
    timeout = 2.0
    profctx.configure(steps="1:9", mode="step", ranks="all", profile_driver=False, save_path=tmp_path,
                      tool="recording", warmup=False)
    actors = [KINDS["threaded"]().remote() for _ in range(2)]

    async def steps() -> list[float]:
        walls = []
        for step in (1, 2, 3):
            t0 = time.monotonic()
            async with profctx.profile_step(step):
                assert await actors[0].work.remote() == step
            walls.append(time.monotonic() - t0)
        return walls

    try:
        grp = asyncio.run(pray.group_async("actor", actors, control_timeout=timeout))
        frozen = grp.members[1]
        assert frozen.pid is not None
        os.kill(frozen.pid, signal.SIGSTOP)
        try:
            walls = asyncio.run(steps())
        finally:
            os.kill(frozen.pid, signal.SIGCONT)
        # Step 1 awaited the timeout (never shorter), at most SLACK_S more; the member is then lost and not
        # called again (the flush below, the one row of the driver's), so no later step awaits it.
        assert timeout <= walls[0] < timeout + SLACK_S, walls
        assert frozen.lost is not None
        assert asyncio.run(pray.flush_async()) == [True, False]  # the lost one is not called
    finally:
        for actor in actors:
            ray.kill(actor)
    assert len([r for r in _manifest.read(tmp_path) if r.get("lost") and r.get("group") is None]) == 1


def test_a_member_hung_in_its_step_entry_costs_one_control_timeout_and_is_recorded(
        ray_cluster: Any, tmp_path: Path) -> None:
    timeout = 2.0
    profctx.configure(steps="1:9", mode="step", ranks="all", profile_driver=False, save_path=tmp_path,
                      tool=HangingStart.name, warmup=False)
    actors = [KINDS["threaded"]().remote() for _ in range(2)]  # rank 1's profiler start hangs for 30 s
    try:
        grp = pray.group("actor", actors, control_timeout=timeout)
        assert None not in [m.pid for m in grp.members]  # joined (actors started): the steps time control calls
        walls = []
        for step in (1, 2, 3):
            t0 = time.monotonic()
            with profctx.profile_step(step):
                assert ray.get(actors[0].work.remote()) == step
            walls.append(time.monotonic() - t0)
        # Waited once, boundedly: step 1 the timeout (never shorter) and at most SLACK_S more; then the member is
        # lost and never called again (the flush below), and rank 0 captured every step (the records below).
        assert timeout <= walls[0] < timeout + SLACK_S, walls
        hung = grp.members[1]
        assert hung.lost is not None and "no answer to 'enter step' within 2s" in hung.lost
        assert pray.flush(timeout=1) == [True, False]  # the hung one is not called again
    finally:
        for actor in actors:
            ray.kill(actor)
    records = _manifest.read(tmp_path)
    (lost,) = [r for r in records if r.get("lost") and r.get("group") is None]
    assert (lost["target_group"], lost["target_rank"], lost["target_pid"], lost["step"]) == ("actor", 1, hung.pid, 1)
    assert sorted(r["steps"][0] for r in records if r.get("group") == "actor" and r["rank"] == 0) == [1, 2, 3]


def test_a_killed_member_is_recorded_lost_once_and_never_waited_for(ray_cluster: Any, tmp_path: Path) -> None:
    profctx.configure(steps="1:9", mode="step", ranks="all", profile_driver=False, save_path=tmp_path,
                      tool="recording", warmup=False)
    actors = [ray.remote(num_cpus=0, max_restarts=0)(Member).remote() for _ in range(2)]
    try:
        # A control timeout far beyond any step a loaded machine runs: a step that waited it out is unmistakable.
        grp = pray.group("actor", actors, control_timeout=SLACK_S)
        killed = grp.members[1]
        assert killed.pid is not None
        with profctx.profile_step(1):
            assert ray.get([a.work.remote() for a in actors]) == [1, 1]
        os.kill(killed.pid, signal.SIGKILL)
        walls = []
        for step in (2, 3, 4):
            t0 = time.monotonic()
            with profctx.profile_step(step):
                assert ray.get(actors[0].work.remote()) == step
                if step == 3:  # the user's own call finds it dead too: still one row, in the step it died in
                    (dead,) = pray.fan_out([(actors[1], "work")], return_exceptions=True)
                    assert isinstance(dead, ray.exceptions.RayActorError)
            walls.append(time.monotonic() - t0)
        assert max(walls) < SLACK_S, walls  # a death is an answer: no step waits out the control timeout
        # flush() waits for the answers still owed (a sync member's are read late): the death is one of them.
        assert pray.flush(timeout=1) == [True, False]
        assert killed.dead and killed.lost is not None and killed.lost.startswith("died")
    finally:
        for actor in actors:
            ray.kill(actor)
    records = _manifest.read(tmp_path)
    lost = [r for r in records if r.get("lost") and r.get("group") is None]
    assert [(r["target_group"], r["target_rank"], r["target_pid"]) for r in lost] == [("actor", 1, killed.pid)]
    # It died after step 1's calls: the first control call it did not answer was step 1's leave or step 2's entry.
    assert "died" in lost[0]["error"] and lost[0]["step"] in (1, 2)
    assert not [r for r in records if r.get("target_rank") == 1 and r is not lost[0]]  # no second row
    assert sorted(r["steps"][0] for r in records if r.get("group") == "actor" and r["rank"] == 1) == [1]
