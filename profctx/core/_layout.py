"""Where captures go: folder per step and role, file names that never collide."""

from __future__ import annotations

import re
import threading
import time
from pathlib import Path

from ..util._identity import Identity

_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")

#: Folder, under ``save_path``, holding the manifest shards.
MANIFEST_DIR = ".profctx"


def safe(text: str) -> str:
    """Return ``text`` with every run of characters outside ``[A-Za-z0-9._-]`` replaced by ``-``."""
    cleaned = _UNSAFE.sub("-", text).strip("-.")
    return cleaned or "x"


def capture_folder(steps: tuple[int, ...], roles: tuple[str, ...]) -> Path:
    """Return the folder of a capture, relative to ``save_path``.

    ``step000003/actor_update`` for one step and a role; ``step000003-000005/step`` for a
    contiguous step capture; nested roles nest folders.
    """
    first, last = steps[0], steps[-1]
    head = f"step{first:06d}" if first == last else f"step{first:06d}-{last:06d}"
    tail = [safe(r) for r in roles] or ["step"]
    return Path(head, *tail)


def worker_name(identity: Identity) -> str:
    """Return the worker part of file names: ``rank{R}-of-{W}_{host}_{pid}``."""
    return f"{identity.tag}_{safe(identity.host)}_{identity.pid}"


def trace_stem(identity: Identity, span_ms: int) -> str:
    """Return ``{worker}.{span}``: the TensorBoard profiler plugin's ``worker.span`` stem.

    ``span_ms`` is the capture's start in milliseconds; callers keep it unique in the
    process (see :meth:`Spans.next`), so two captures never share a name.
    """
    return f"{worker_name(identity)}.{span_ms}"


class Spans:
    """Hands out span numbers: the wall clock in milliseconds, but never the same one twice."""

    __slots__ = ("_last", "_lock")

    def __init__(self) -> None:
        self._last = 0
        self._lock = threading.Lock()

    def next(self) -> int:
        """Return the current time in ms, or one more than the last span if that is not later."""
        now = time.time_ns() // 1_000_000
        with self._lock:
            self._last = max(now, self._last + 1)
            return self._last

