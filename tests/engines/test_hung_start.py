"""An engine whose start hangs: the step it hung in is recorded failed, later steps skipped, training runs on."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from profctx import profile_step
from profctx.engines import VLLMHttpAdapter, attach, stop_all

from .conftest import configure, engine_records
from .doubles.servers import _Server


class HungStartServer(_Server):
    """A vLLM server whose ``/start_profile`` answers only once released (``answered`` counts the answers)."""

    def __init__(self) -> None:
        self.release = threading.Event()
        self.starts = 0
        self.answered = 0
        super().__init__()

    def handle(self, method: str, path: str, body: bytes, headers: dict[str, str]) -> tuple[int, str, str]:
        if path == "/start_profile":
            self.starts += 1
            self.release.wait(600)  # closing releases it: the wait only has to outlast any test
            self.answered += 1
        return 200, "text/plain", ""

    def close(self) -> None:
        self.release.set()
        super().close()


def test_a_hung_start_is_recorded_failed_then_skipped_in_later_steps(tmp_path: Path) -> None:
    server = HungStartServer()
    try:
        configure(tmp_path, steps=[1, 2, 3], engines={"start_timeout": 0.2, "stop_timeout": 30})
        adapter = VLLMHttpAdapter(server.url, version="0.33.0")
        attach(adapter)
        took: list[float] = []
        for step in (1, 2, 3):
            t0 = time.monotonic()
            with profile_step(step), profile_step(role="rollout"):
                pass
            took.append(time.monotonic() - t0)
        assert server.starts == 1  # nothing new was sent while the first start hung
        # All three steps ended while the first start still hung: step 1 waited start_timeout (a
        # lower bound, which load cannot break), the skipped steps 2 and 3 waited for no answer.
        assert server.answered == 0 and took[0] + 0.05 > 0.2
        records: list[dict[str, Any]] = sorted(engine_records(tmp_path), key=lambda r: r["step"])
        assert [(r["step"], r["status"]) for r in records] == [(1, "failed"), (2, "skipped"), (3, "skipped")]
        assert "start_timeout" in records[0]["error"]
        for record in records[1:]:
            assert record["role"] == "rollout" and record["kind"] == "engine"
            assert "start or stop that passed its timeout" in record["reason"]
        server.release.set()  # the start answers at last: profctx stops the engine at once
        stop_all()
        assert not adapter.settling
    finally:
        server.close()
