"""Engine sessions and process exit: SIGTERM/exit stop open sessions; reset() detaches adapters."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import profctx
from profctx.engines import attached
from profctx.process import _lifecycle
from profctx.records import _manifest

from .conftest import make_kit


def test_finalize_stops_an_open_engine_session(tmp_path: Path) -> None:
    kit = make_kit("vllm-llm-0.33", tmp_path)
    profctx.configure(steps=[1], save_path=tmp_path, tool="noop")
    profctx.attach(kit.adapter)
    inside = threading.Event()
    release = threading.Event()

    def loop() -> None:
        with profctx.profile_step(1), profctx.profile_step(role="rollout"):
            inside.set()
            release.wait(10)

    worker = threading.Thread(target=loop)
    worker.start()
    assert inside.wait(10)
    assert kit.active()
    _lifecycle.finalize(10)  # what SIGTERM and interpreter exit run
    assert not kit.active() and kit.stops() == 1
    release.set()
    worker.join(10)
    assert kit.stops() == 1, "the block's own exit does not stop it a second time"
    engine = [r for r in _manifest.read(tmp_path) if r.get("kind") == "engine"]
    assert [r["status"] for r in engine] == ["ok"]


def test_reset_detaches_adapters(tmp_path: Path) -> None:
    kit = make_kit("vllm-llm-0.33", tmp_path)
    profctx.attach(kit.adapter)
    assert attached() == (kit.adapter,)
    profctx.reset()
    assert attached() == ()
    profctx.configure(steps=[1], save_path=tmp_path, tool="noop")
    with profctx.profile_step(1), profctx.profile_step(role="rollout"):
        pass
    assert kit.starts() == 0


def test_an_engine_capture_made_for_an_on_demand_request_names_the_trigger(tmp_path: Path) -> None:
    from profctx.core._ondemand import Request
    from profctx.process._ondemand import write_request
    from profctx.process._owner import OWNER

    kit = make_kit("vllm-llm-0.33", tmp_path)
    profctx.configure(save_path=tmp_path, on_demand=True, tool="noop")
    profctx.attach(kit.adapter)
    request: Request | None = None
    for step in range(3000):  # the request is read by a poll thread: steps until it has been captured
        with profctx.profile_step(step), profctx.profile_step(role="rollout"):
            time.sleep(0.01)  # as tests/test_ondemand.py's loops: the poll thread reads the request in time
        if request is None and step == 3:
            request = Request(id="feedbeef", first=(OWNER.last_step or 0) + 150)
            write_request(tmp_path, request)
        if request is not None and step > request.first + 1:
            break
    profctx.flush()
    assert request is not None
    engine = [r for r in _manifest.read(tmp_path) if r.get("kind") == "engine"]
    assert [(r["step"], r["status"]) for r in engine] == [(request.first, "ok")]
    assert engine[0]["trigger"]["id"] == "feedbeef"
    assert any(n.startswith("on demand: request feedbeef") for n in engine[0]["notes"])
