"""Test helpers for users of profctx: a recording backend and ``capture()``.

Hypothesis strategies live in :mod:`profctx.testing.strategies` (needs ``hypothesis``).
"""

from __future__ import annotations

import contextlib
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from .. import _api, _state
from ._recording import RecordedCapture, RecordingBackend

__all__ = ["Captured", "RecordedCapture", "RecordingBackend", "capture"]


@dataclass
class Captured:
    """What one capture covered, as :func:`capture` reports it."""

    steps: tuple[int, ...]
    role: str | None
    rank: int
    status: str
    ranges: list[str] = field(default_factory=list)
    reason: str | None = None


@contextlib.contextmanager
def capture(**fields: Any) -> Iterator[list[Captured]]:
    """Collect what would have been captured inside the block, with no device profiler.

    ``fields`` are configuration fields (``steps`` at least, unless profctx is configured
    already, whose fields are the starting point). ``tool`` is forced to ``recording`` and
    ``save_path`` defaults to a temporary folder. The yielded list fills as captures end
    (``status`` ``ok``, ``skipped`` or ``failed``); the previous configuration is restored after.
    """
    previous = _state.CONFIG
    base = previous.to_dict() if previous is not None else {}
    base.update(fields)
    base.update(tool="recording", exit_hooks=False, warmup=False)
    results: list[Captured] = []
    with contextlib.ExitStack() as stack:
        if "save_path" not in fields:
            base["save_path"] = stack.enter_context(tempfile.TemporaryDirectory(prefix="profctx-capture-"))
        _api.configure(base)
        runtime = _state.RUNTIME
        by_id: dict[str, RecordedCapture] = {}
        first = len(RecordingBackend.log)

        def listen(record: dict[str, Any]) -> None:
            if record.get("event") != "finished":
                return
            for item in RecordingBackend.log[first:]:
                by_id.setdefault(item.capture_id, item)
            recorded = by_id.get(str(record.get("capture")))
            results.append(Captured(
                steps=tuple(record.get("steps", ())),
                role=record.get("role"),
                rank=int(record.get("rank", 0)),
                status=str(record.get("status")),
                ranges=list(recorded.ranges) if recorded else [],
                reason=record.get("reason") or record.get("error"),
            ))

        if runtime is not None:
            runtime.listeners.append(listen)
        try:
            yield results
        finally:
            _api.flush()
            if previous is not None:
                _api.configure(previous)
            else:
                _api.reset()
