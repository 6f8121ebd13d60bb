"""Logging: one logger, and warnings emitted once per distinct key."""

from __future__ import annotations

import logging
import threading

logger = logging.getLogger("profctx")

_seen: set[str] = set()
_lock = threading.Lock()


def warn_once(key: str, message: str, *args: object) -> bool:
    """Log ``message`` at WARNING the first time ``key`` is seen; later ones go to DEBUG.

    Return whether this call logged at WARNING.
    """
    with _lock:
        first = key not in _seen
        _seen.add(key)
    logger.log(logging.WARNING if first else logging.DEBUG, message, *args)
    return first


def reset() -> None:
    """Forget which warnings were emitted (for tests)."""
    with _lock:
        _seen.clear()
