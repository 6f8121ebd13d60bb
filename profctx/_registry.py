"""The capture registry: at most one native capture per process, held by an owner token."""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from ._capture import Capture

_lock = threading.Lock()
_owner: Capture | None = None


def claim(capture: Capture) -> Capture | None:
    """Make ``capture`` the owner and return ``None``; if another capture owns it, return that owner."""
    global _owner
    with _lock:
        if _owner is None:
            _owner = capture
            return None
        return _owner


def release(capture: Capture) -> None:
    """Give up ownership if ``capture`` holds it; otherwise do nothing."""
    global _owner
    with _lock:
        if _owner is capture:
            _owner = None


def owner() -> Capture | None:
    """Return the capture that owns the process's profiler, if any."""
    return _owner
