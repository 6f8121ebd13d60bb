"""Failures around engines: unreachable servers, concurrency of starts, exit paths."""

from __future__ import annotations

import socket
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from profctx import profile_step
from profctx.engines import SGLangHttpAdapter, VLLMHttpAdapter, attach, stop_all
from profctx.engines._base import Scope

from .conftest import configure, engine_records
from .doubles.servers import VLLMServer, gated


def _closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def test_unreachable_server_training_continues_and_manifest_records_it(tmp_path: Path) -> None:
    port = _closed_port()
    configure(tmp_path, engines={"replicas": "all"})
    attach(VLLMHttpAdapter(f"127.0.0.1:{port}", version="0.33.0"),
           SGLangHttpAdapter(f"http://127.0.0.1:{port}", replica=1))
    steps = []
    for step in (1, 2):
        with profile_step(step), profile_step(role="rollout"):
            steps.append(step)
    assert steps == [1, 2]
    records = engine_records(tmp_path)
    assert sorted((r["replica"], r["status"]) for r in records) == [(0, "failed"), (1, "failed")]
    assert all("unreachable" in r["error"] for r in records)


def test_sync_starts_run_concurrently(tmp_path: Path) -> None:
    # Each server's start answers only once all three were asked: started one after another, the
    # first would wait for the others, which would never be sent, and the barrier breaks (after
    # a minute) so every start fails. Concurrency is what passes; load only makes it slower.
    arrived = threading.Barrier(3, timeout=60)
    servers = [VLLMServer("0.33", str(tmp_path / f"t{i}")) for i in range(3)]
    for server in servers:
        server.engine.start_profile = _after(arrived, server.engine.start_profile)  # type: ignore[method-assign]
    try:
        configure(tmp_path, engines={"replicas": "all"})
        attach(*(VLLMHttpAdapter(s.url, replica=i, version="0.33.0") for i, s in enumerate(servers)))
        with profile_step(1), profile_step(role="rollout"):
            pass
        assert not arrived.broken
        assert sorted((r["replica"], r["status"]) for r in engine_records(tmp_path)) == [(0, "ok"), (1, "ok"),
                                                                                        (2, "ok")]
        assert [s.engine.stop_calls for s in servers] == [1, 1, 1]
    finally:
        for s in servers:
            s.close()


def _after(barrier: threading.Barrier, start: Callable[..., Any]) -> Callable[..., Any]:
    """Return ``start``, called once ``barrier`` has as many waiting as it has parties."""
    def wait_then_start(*args: Any, **kwargs: Any) -> Any:
        barrier.wait()
        return start(*args, **kwargs)

    return wait_then_start


def test_stop_all_stops_what_is_open(tmp_path: Path) -> None:
    server = VLLMServer("0.33", str(tmp_path / "t"))
    try:
        configure(tmp_path)
        adapter = VLLMHttpAdapter(server.url, version="0.33.0")
        attach(adapter)
        assert adapter.start_sync(Scope(1, ("rollout",)))
        stop_all()
        assert server.engine.stop_calls == 1 and not adapter.active
        assert [r["status"] for r in engine_records(tmp_path)] == ["ok"]
    finally:
        server.close()


def test_stop_all_at_exit_stops_a_start_that_answered_late(tmp_path: Path) -> None:
    server = VLLMServer("0.33", str(tmp_path / "t"))
    released = threading.Event()  # the engine's start answers when the test says, after start_timeout
    server.engine.start_profile = gated(released, server.engine.start_profile)  # type: ignore[method-assign]
    try:
        configure(tmp_path, engines={"start_timeout": 0.1})
        adapter = VLLMHttpAdapter(server.url, version="0.33.0")
        attach(adapter)
        assert adapter.start_sync(Scope(1, ("rollout",))) is False
        released.set()
        stop_all()  # what the exit hook runs
        assert not adapter.settling
        assert server.engine.stop_calls == 1 and not server.engine.session_active
        [record] = engine_records(tmp_path)
        assert record["status"] == "failed" and "profctx stopped the engine" in record["error"]
    finally:
        server.close()
