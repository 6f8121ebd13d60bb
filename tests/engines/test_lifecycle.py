"""Engine sessions and process exit: SIGTERM/exit stop open sessions; reset() detaches adapters."""

from __future__ import annotations

import threading
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
