"""The ``recording`` backend: remembers every capture and range; writes one small JSON file per capture.

For tests (profctx's and its users'): ``profctx.testing`` re-exports it with ``capture()``.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, ClassVar

from ..util._files import write_file
from ._base import CaptureSpec, Finish


@dataclass
class RecordedCapture:
    """One capture as the recording backend saw it."""

    capture_id: str
    steps: tuple[int, ...]
    roles: tuple[str, ...]
    rank: int
    folder: Path
    ranges: list[str] = field(default_factory=list)
    markers: list[str] = field(default_factory=list)
    started: float = 0.0
    stopped: float | None = None


class RecordingBackend:
    """A backend for tests: records starts, stops and ranges, checks it is never started twice.

    ``RecordingBackend.log`` (class-level, shared by all instances of the process) holds every
    :class:`RecordedCapture`; ``max_live`` is the most captures ever live at once.
    """

    name: ClassVar[str] = "recording"
    log: ClassVar[list[RecordedCapture]] = []
    max_live: ClassVar[int] = 0
    _live: ClassVar[int] = 0
    _lock: ClassVar[threading.Lock] = threading.Lock()

    def __init__(self) -> None:
        self._current: RecordedCapture | None = None

    @classmethod
    def clear(cls) -> None:
        """Forget everything recorded so far."""
        with cls._lock:
            cls.log = []
            cls.max_live = 0
            cls._live = 0

    def prepare(self) -> None:
        """Nothing to prepare."""

    def start(self, spec: CaptureSpec) -> None:
        """Record the start; raise if a capture of this backend is already live in the process."""
        with self._lock:
            if RecordingBackend._live:
                raise RuntimeError("recording backend: a second capture started while one is live")
            RecordingBackend._live += 1
            RecordingBackend.max_live = max(RecordingBackend.max_live, RecordingBackend._live)
            record = RecordedCapture(spec.capture_id, spec.steps, spec.roles, spec.identity.rank, spec.folder,
                                     started=time.time())
            RecordingBackend.log.append(record)
        self._current = record
        self._spec = spec

    def stop(self) -> Finish:
        """Record the stop; the returned writer saves the ranges as ``{stem}.recording.json``."""
        record, spec = self._current, self._spec
        if record is None:
            raise RuntimeError("recording backend: stop() without a live capture")
        self._current = None
        record.stopped = time.time()
        with self._lock:
            RecordingBackend._live -= 1
        ranges, markers = list(record.ranges), list(record.markers)

        def write() -> Sequence[Path]:
            final = spec.folder / f"{spec.stem}.recording.json"
            write_file(final, json.dumps({"metadata": spec.metadata, "ranges": ranges, "markers": markers}).encode(),
                       at=spec.at)
            return (final,)

        return write

    def range(self, name: str) -> Any:
        """Record ``name`` as a range of the live capture."""
        current = self._current
        if current is None:
            raise RuntimeError("recording backend: range() outside a capture")
        current.ranges.append(name)
        return _Null()

    def marker(self, name: str) -> Any:
        """Record ``name`` (a ``step N`` boundary) as a marker of the live capture."""
        current = self._current
        if current is None:
            raise RuntimeError("recording backend: marker() outside a capture")
        current.markers.append(name)
        return _Null()

    def step(self) -> None:
        """Do nothing."""


class _Null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None
