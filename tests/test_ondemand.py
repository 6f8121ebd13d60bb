"""On-demand capture: the request rules (Hypothesis), configuration, and a live run triggered from another process."""

from __future__ import annotations

import contextlib
import json
import math
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import profctx
from profctx.core._ondemand import (
    MAX_REQUEST_STEPS,
    AutoCapture,
    Request,
    RequestError,
    admit,
    at_step,
    overlapping,
    parse,
)
from profctx.manifest import read
from profctx.process._owner import OWNER

ROOT = Path(__file__).resolve().parents[1]

ROOT = Path(__file__).resolve().parents[1]

# -- the request rules --------------------------------------------------------------------------

names = st.text(alphabet="abcdefghij0123456789._-", min_size=1, max_size=20)
requests = st.builds(
    Request,
    id=names,
    first=st.integers(0, 10**6),
    count=st.integers(1, MAX_REQUEST_STEPS),
    mode=st.sampled_from([None, "step", "role"]),
    roles=st.none() | st.lists(st.sampled_from(["rollout", "actor_*", "a/b"]), min_size=1, max_size=3).map(tuple),
    group=st.none() | names,
    ranks=st.none() | st.lists(st.integers(0, 64), min_size=1, max_size=4).map(tuple),
    origin=st.sampled_from(["trigger", "anomaly"]),
    reason=st.none() | st.text(max_size=50),
    user=st.none() | st.text(max_size=20),
    uid=st.none() | st.integers(0, 2**31),
    pid=st.none() | st.integers(0, 2**22),
    time=st.none() | st.floats(0, 2e9),
)


@given(requests)
def test_a_request_reads_back_from_its_file_form(request: Request) -> None:
    assert parse(json.loads(json.dumps(request.to_dict()))) == request


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=10),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=20)


@given(json_values)
def test_anything_that_is_not_a_request_raises_request_error_only(value: Any) -> None:
    with contextlib.suppress(RequestError):
        parse(value)


@given(requests, st.sampled_from(["first", "count", "id", "mode", "ranks"]),
       st.sampled_from([-1, "3", None, 1.5, [], MAX_REQUEST_STEPS + 1, "../x"]))
def test_a_bad_value_is_refused(request: Request, key: str, value: Any) -> None:
    data = {**request.to_dict(), key: value}
    try:
        parsed = parse(data)
    except RequestError:
        return
    assert getattr(parsed, key) in (value, None, tuple(value) if isinstance(value, list) else value)


@given(requests, st.integers(0, 10**6))
def test_a_relative_request_reads_back_and_gets_its_steps_once_named(request: Request, first: int) -> None:
    relative = request.at(first)
    relative = Request(**{**{k: getattr(relative, k) for k in relative.__dataclass_fields__}, "first": None})
    assert parse(relative.to_dict()) == relative and relative.steps == range(0)
    assert at_step(first, relative, False) == "wait"  # no step of its own until one is named
    named = relative.at(first)
    assert named.steps == range(first, first + request.count) and parse(named.to_dict()) == named


@given(st.integers(0, 1000), st.integers(1, 100), st.integers(0, 1000), st.integers(1, 100))
def test_overlapping_trigger_requests_are_refused_never_merged(a: int, na: int, b: int, nb: int) -> None:
    earlier = Request(id="earlier", first=a, count=na)
    later = Request(id="later", first=b, count=nb)
    overlap = bool(set(earlier.steps) & set(later.steps))
    assert (overlapping(later, [earlier]) is earlier) == overlap
    assert (admit(later, None, 0, 10, False, [earlier]) == "overlap") == overlap
    anomaly_request = Request(id="auto", first=b, count=nb, origin="anomaly")
    assert admit(anomaly_request, None, 0, 10, False, [earlier]) == "schedule"  # the run's own: never refused


@given(requests, st.none() | st.integers(0, 10**6), st.integers(0, 20), st.integers(0, 20), st.booleans())
def test_admission(request: Request, last: int | None, accepted: int, cap: int, known: bool) -> None:
    outcome = admit(request, last, accepted, cap, known)
    if known:
        assert outcome == "known"
    elif last is not None and request.first <= last:
        assert outcome == "passed"
    elif accepted >= cap:
        assert outcome == "cap"
    else:
        assert outcome == "schedule"


@given(requests, st.lists(st.integers(0, 50), min_size=1, max_size=60).map(lambda xs: sorted(set(xs))))
@settings(max_examples=200)
def test_a_request_captures_all_its_steps_or_none(request: Request, entered: list[int]) -> None:
    request = Request(id="r", first=request.first % 40, count=min(request.count, 10))
    started = False
    captured: list[int] = []
    passed = False
    for step in entered:
        what = at_step(step, request, started)
        if what == "start":
            started = True
        if what in ("start", "within"):
            captured.append(step)
        if what == "passed":
            passed = True
            break
        if what == "done":
            break
    wanted = [s for s in entered if s in request.steps]
    if request.first in entered:
        assert captured == wanted and not passed
    else:
        assert captured == [] and passed == any(s > request.first for s in entered)


def test_request_selection() -> None:
    base = Request(id="r", first=5)
    assert base.selects(None, 3, True) and not base.selects(None, 3, False)
    grouped = Request(id="r", first=5, group="actor", ranks=(1,))
    assert grouped.selects("actor", 1, False) and not grouped.selects("actor", 0, True)
    assert not grouped.selects(None, 1, True)
    ranked = Request(id="r", first=5, ranks=(0, 1))
    assert ranked.selects(None, 1, False) and not ranked.selects(None, 2, True)


# -- configuration ------------------------------------------------------------------------------


def test_on_demand_needs_no_window(tmp_path: Path) -> None:
    config = profctx.configure(save_path=tmp_path, on_demand=True, tool="noop")
    assert config is not None and config.active and config.steps is None
    assert config.on_demand_max_captures == 10
    again = profctx.ProfilerConfig.from_mapping(config.to_dict())
    assert again == config


@pytest.mark.parametrize(("fields", "field"), [
    ({"on_demand": "sometimes"}, "on_demand"),
    ({"on_demand": True, "on_demand_max_captures": -1}, "on_demand_max_captures"),
    ({"on_demand": True, "on_demand_max_captures": True}, "on_demand_max_captures"),
    ({"auto_capture": {"factor": 1.0}}, "auto_capture.factor"),
    ({"auto_capture": {"window": 2}}, "auto_capture.window"),
    ({"auto_capture": {"max_captures": 0}}, "auto_capture.max_captures"),
    ({"auto_capture": {"role": "a/b"}}, "auto_capture.role"),
    ({"auto_capture": {"median": 3}}, "auto_capture.median"),
    ({"auto_capture": "yes"}, "auto_capture"),
    ({"auto_capture": {"role": "rollout"}, "timeline": False}, "auto_capture.role"),
])
def test_bad_on_demand_settings_name_the_field(tmp_path: Path, fields: dict[str, Any], field: str) -> None:
    with pytest.raises(profctx.ConfigError) as info:
        profctx.configure(save_path=tmp_path, **fields)
    assert info.value.field == field


def test_on_demand_from_the_environment(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PROFCTX_ON_DEMAND", "1")
    monkeypatch.setenv("PROFCTX_SAVE_PATH", str(tmp_path))
    config = profctx.configure()
    assert config is not None and config.on_demand
    monkeypatch.setenv("PROFCTX_ON_DEMAND", "maybe")
    with pytest.raises(profctx.ConfigError, match="PROFCTX_ON_DEMAND"):
        profctx.configure()


def test_auto_capture_defaults() -> None:
    assert AutoCapture.of(True) == AutoCapture(2.0, 20, 3, None)
    assert AutoCapture.of(None) is None and AutoCapture.of(False) is None
    assert not math.isnan(AutoCapture.of({"factor": 3}).factor)  # type: ignore[union-attr]


# -- a live run, triggered from another process ---------------------------------------------------

#: The live run: loops steps (two roles, small sleeps) until ``SAVE/stop`` appears or the test that started
#: it is gone (no deadline a loaded machine could reach first); configured on demand. With ``LOOP_FOLLOW``, a
#: rank never ends a step before rank 0 ended it (rank 0 notes its steps in ``SAVE/../rank0.step``), as a
#: collective in each step would hold it: ranks with none between them may run ahead of the one that names
#: the steps and skip a request (see profctx.process._ondemand), which is not what these tests check.
LOOP = textwrap.dedent('''
    import json, os, sys, time
    import profctx
    save, fields = sys.argv[1], json.loads(sys.argv[2])
    profctx.configure(save_path=save, on_demand=True, ranks="all", **fields)
    pause = float(os.environ.get("LOOP_SLEEP", "0.02"))
    follow, parent = bool(os.environ.get("LOOP_FOLLOW")), os.getppid()
    mark = os.path.join(os.path.dirname(save), "rank0.step")
    stop = os.path.join(save, "stop")

    def lead():
        try:
            with open(mark) as f:
                return int(f.read())
        except (OSError, ValueError):
            return -1

    step = 0
    while not os.path.exists(stop) and os.getppid() == parent:
        with profctx.profile_step(step):
            with profctx.profile_step(role="rollout"):
                time.sleep(pause)
            with profctx.profile_step(role="train"):
                time.sleep(pause)
        if os.environ.get("RANK") == "0":
            with open(mark + ".tmp", "w") as f:
                f.write(str(step))
            os.replace(mark + ".tmp", mark)
        while follow and lead() < step and not os.path.exists(stop) and os.getppid() == parent:
            time.sleep(0.002)
        step += 1
    print(step, flush=True)
''')


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("PROFCTX_") and k not in ("RANK", "WORLD_SIZE")}
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env.update(extra)
    return env


def start_loop(save: Path, fields: dict[str, Any] | None = None, **env: str) -> subprocess.Popen[str]:
    """Start the live run writing to ``save``."""
    script = save.parent / "loop.py"
    script.write_text(LOOP)
    return subprocess.Popen([sys.executable, str(script), str(save), json.dumps(fields or {})], env=_env(**env),
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def live_steps(save: Path) -> list[int]:
    """Return the step each live process of ``save`` published (its progress files)."""
    found = []
    for path in (save / ".profctx" / "live").glob("*.json"):
        try:
            step = json.loads(path.read_text()).get("step")
        except (OSError, ValueError):
            continue
        if isinstance(step, int):
            found.append(step)
    return found


def wait_for(predicate: Any, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


def trigger(save: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "profctx", "trigger", str(save), *args], env=_env(),
                          capture_output=True, text=True, timeout=60)


def stop(save: Path, *procs: subprocess.Popen[str]) -> list[str]:
    (save / "stop").write_text("")
    errors = []
    for proc in procs:
        _, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        errors.append(err)
    return errors


@pytest.mark.slow
def test_a_live_run_captures_exactly_the_steps_a_trigger_asks_for(tmp_path: Path) -> None:
    # About 15 s: a process importing torch and running real torch.profiler captures, triggered by the
    # real CLI from another process; the other live tests use the noop backend.
    save = tmp_path / "run"
    proc = start_loop(save, {"tool": "torch", "compress": False})
    try:
        wait_for(lambda: any(s >= 3 for s in live_steps(save)), "the run to publish its progress")
        before = max(live_steps(save))
        done = trigger(save, "--steps", "3", "--json", "--wait", "50")
        assert done.returncode == 0, done.stdout + done.stderr
        request = json.loads(done.stdout)
        first = request["answer"]["first"]  # the run named it: the step after the one it entered next
        assert first > before
        wait_for(lambda: any(s > first + 3 for s in live_steps(save)), "the run to pass the requested steps")
    finally:
        errors = stop(save, proc)
    captures = [r for r in read(save) if r.kind == "step"]
    assert [r.steps for r in captures] == [(first,), (first + 1,), (first + 2,)], errors
    for record in captures:
        assert record.status == "ok" and record.files
        trig = record.trigger
        assert trig is not None
        assert trig["id"] == request["id"] and trig["first"] == first and trig["count"] == 3
        assert trig["uid"] == os.getuid() and trig["origin"] == "trigger" and trig["pid"] != record.pid
        assert any(n.startswith(f"on demand: request {request['id']}") for n in record.notes)
        assert all((save / f.path).is_file() for f in record.files)
    listing = subprocess.run([sys.executable, "-m", "profctx", "ls", str(save)], env=_env(), capture_output=True,
                             text=True, timeout=60)
    assert listing.stdout.count(f"on demand: request {request['id']}") == 3, listing.stdout
    assert not list((save / ".profctx" / "live").glob("*.json"))  # the run removed its progress file at exit


def test_two_ranks_capture_the_same_steps(tmp_path: Path) -> None:
    save = tmp_path / "run"
    common = {"PROFCTX_RUN_ID": "two-ranks", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1"}
    # Rank 1 is slower (the ranks are steps apart) and follows rank 0 (LOOP_FOLLOW: never a step ahead of it).
    procs = [start_loop(save, {"tool": "noop"}, RANK=str(rank), LOCAL_RANK=str(rank), **common,
                        LOOP_SLEEP=str(0.02 + 0.01 * rank), **({"LOOP_FOLLOW": "1"} if rank else {}))
             for rank in (0, 1)]
    try:
        wait_for(lambda: len(live_steps(save)) == 2 and min(live_steps(save)) >= 3, "both ranks to publish")
        done = trigger(save, "--steps", "2", "--json", "--wait", "50")
        assert done.returncode == 0, done.stdout + done.stderr
        first = json.loads(done.stdout)["answer"]["first"]
        wait_for(lambda: min(live_steps(save)) > first + 2, "both ranks to pass the requested steps")
    finally:
        errors = stop(save, *procs)
    captures = [r for r in read(save) if r.kind == "step"]
    by_rank = {rank: sorted(r.steps for r in captures if r.rank == rank) for rank in (0, 1)}
    assert by_rank == {0: [(first,), (first + 1,)], 1: [(first,), (first + 1,)]}, errors
    assert all(r.status == "ok" for r in captures)


# -- hostile files, the cap, a request that comes too late (in this process) ---------------------


def _step_loop(until: Any, timeout: float = 30.0, pause: float = 0.01) -> int:
    """Run steps (from the step after the last one) until ``until()`` holds after one; return the last step."""
    owner_step = OWNER.last_step
    step = 0 if owner_step is None else owner_step + 1
    deadline = time.monotonic() + timeout
    while True:  # one step at least
        with profctx.profile_step(step), profctx.profile_step(role="rollout"):
            time.sleep(pause)
        if until():
            return step
        assert time.monotonic() < deadline, "timed out"
        step += 1


def _request(save: Path, ahead: int, *, read: bool = True, **fields: Any) -> Request:
    """Write a request for ``ahead`` steps after the last one; with ``read``, return once the run has read it.

    No step runs until then, so the request's first step is exactly ``ahead`` steps away when the run
    decides on it, however late a loaded machine runs the poll thread.
    """
    from profctx.process._ondemand import write_request

    request = Request(id=fields.pop("id", os.urandom(4).hex()), first=(OWNER.last_step or 0) + ahead, **fields)
    write_request(save, request)
    if read:
        runtime = OWNER.runtime
        assert runtime is not None and runtime.ondemand is not None
        ondemand = runtime.ondemand
        wait_for(lambda: request.id in ondemand.known, f"the run to read request {request.id}")
    return request


def _captured(save: Path, request: Request) -> list[Any]:
    profctx.flush()
    return [r for r in read(save) if (r.trigger or {}).get("id") == request.id]


def test_hostile_request_files_are_ignored_with_one_warning_each(tmp_path: Path,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    profctx.configure(save_path=tmp_path, on_demand=True, tool="noop")
    _step_loop(lambda: True)
    folder = tmp_path / ".profctx" / "requests"
    folder.mkdir(parents=True)
    outside = tmp_path / "elsewhere.json"
    outside.write_text(json.dumps(Request(id="linked", first=10**6).to_dict()))
    (folder / "garbage.json").write_bytes(b"\x00\xff not json")
    (folder / "huge.json").write_text(json.dumps({"profctx_request": 1, "id": "huge", "first": 10**6,
                                                  "reason": "x" * 20_000}))
    (folder / "link.json").symlink_to(outside)
    os.mkfifo(folder / "fifo.json")
    (folder / "schema.json").write_text(json.dumps({"profctx_request": 1, "id": "s", "first": "soon"}))
    (folder / "version.json").write_text(json.dumps({**Request(id="v", first=10**6).to_dict(),
                                                     "profctx_request": 99}))
    (folder / "extra.json").write_text(json.dumps({**Request(id="e", first=10**6).to_dict(), "run": "rm -rf /"}))
    (folder / "list.json").write_text("[1, 2, 3]")
    (folder / "deep.json").write_text("[" * 5000 + "]" * 5000)
    hostile = ["garbage", "huge", "link", "fifo", "schema", "version", "extra", "list", "deep"]
    if os.getuid() == 0:  # another account's file: testable only where files can be given away
        (folder / "theirs.json").write_text(json.dumps(Request(id="theirs", first=10**6).to_dict()))
        os.chown(folder / "theirs.json", 12345, 12345)
        hostile.append("theirs")
    with caplog.at_level("WARNING", logger="profctx"):
        good = _request(tmp_path, 200, count=2)
        _step_loop(lambda: bool(_captured(tmp_path, good)) and (OWNER.last_step or 0)
                   > good.first + 2)
        time.sleep(1.2)  # two more looks at the folder: nothing is warned twice
        _step_loop(lambda: True)
    warned = [m for m in caplog.messages if "ignored the on-demand request file" in m]
    assert sorted(m.split()[6].rstrip(":") for m in warned) == sorted(f"{name}.json" for name in hostile), warned
    assert [r.steps for r in _captured(tmp_path, good)] == [(good.first,), (good.first + 1,)]
    assert "linked" not in json.dumps([r.as_dict() for r in read(tmp_path)])


def test_the_cap_refuses_requests_beyond_it_with_one_warning_and_a_record(tmp_path: Path,
                                                                          caplog: pytest.LogCaptureFixture) -> None:
    profctx.configure(save_path=tmp_path, on_demand=True, on_demand_max_captures=2, tool="noop")
    _step_loop(lambda: (OWNER.last_step or 0) >= 3)
    with caplog.at_level("WARNING", logger="profctx"):
        asked = [_request(tmp_path, 150 + 10 * i, id=f"r{i}") for i in range(4)]
        _request(tmp_path, -1, id="late")  # its first step has passed: recorded, not captured
        _step_loop(lambda: (OWNER.last_step or 0) > asked[-1].first + 2)
    profctx.flush()
    records = {(r.trigger or {}).get("id"): r for r in read(tmp_path)}
    assert sorted(records) == ["late", "r0", "r1", "r2", "r3"]
    assert [records[f"r{i}"].status for i in range(4)].count("ok") == 2
    refused = [records[f"r{i}"] for i in range(4) if records[f"r{i}"].status == "skipped"]
    assert len(refused) == 2 and all("on_demand_max_captures=2" in (r.reason or "") for r in refused)
    assert records["late"].status == "skipped" and "first step" in (records["late"].reason or "")
    assert len([m for m in caplog.messages if "on_demand_max_captures=2 reached" in m]) == 1


def test_reset_ends_the_poll_thread_and_removes_the_progress_file(tmp_path: Path) -> None:
    import threading

    profctx.configure(save_path=tmp_path, on_demand=True, tool="noop")
    _step_loop(lambda: bool(list((tmp_path / ".profctx" / "live").glob("*.json"))))
    assert any(t.name == "profctx-ondemand" for t in threading.enumerate())
    profctx.reset()
    assert not any(t.name == "profctx-ondemand" for t in threading.enumerate())
    assert not list((tmp_path / ".profctx" / "live").glob("*.json"))


def test_a_window_and_requests_combine(tmp_path: Path) -> None:
    profctx.configure(save_path=tmp_path, on_demand=True, steps=[2, 3], mode="step", tool="noop")
    _step_loop(lambda: (OWNER.last_step or 0) >= 5)
    asked = _request(tmp_path, 150, count=2, mode="role", roles=("rollout",))
    _step_loop(lambda: (OWNER.last_step or 0) > asked.first + 3)
    profctx.flush()
    got = [(r.kind, r.steps, r.role, (r.trigger or {}).get("id")) for r in read(tmp_path)]
    assert got == [("step", (2,), None, None), ("step", (3,), None, None),
                   ("role", (asked.first,), "rollout", asked.id), ("role", (asked.first + 1,), "rollout", asked.id)]


def test_a_request_older_than_the_process_is_an_earlier_runs(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    profctx.configure(save_path=tmp_path, on_demand=True, tool="noop")
    _step_loop(lambda: (OWNER.last_step or 0) >= 3)
    with caplog.at_level("WARNING", logger="profctx"):
        old = _request(tmp_path, 100, read=False, id="old", time=time.time() - 3600)  # a restart found it in the folder
        new = _request(tmp_path, 150, id="new", time=time.time())
        _step_loop(lambda: (OWNER.last_step or 0) > new.first + 1)
    profctx.flush()
    assert [(r.steps, (r.trigger or {}).get("id")) for r in read(tmp_path)] == [((new.first,), "new")]
    assert old.first < new.first and not caplog.messages
