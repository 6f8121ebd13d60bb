"""Logging: one logger, and warnings emitted once per distinct key."""

from __future__ import annotations

import logging
import threading

logger = logging.getLogger("profctx")

_seen: set[str] = set()
_lock = threading.Lock()


def first(key: str) -> bool:
    """Return whether ``key`` is seen for the first time since the last :func:`reset` (and note it)."""
    with _lock:
        new = key not in _seen
        _seen.add(key)
    return new


def warn_once(key: str, message: str, *args: object) -> bool:
    """Log ``message`` at WARNING the first time ``key`` is seen; later ones go to DEBUG.

    Return whether this call logged at WARNING.
    """
    new = first(key)
    logger.log(logging.WARNING if new else logging.DEBUG, message, *args)
    return new


def reset() -> None:
    """Forget which warnings were emitted (``profctx.reset()``)."""
    with _lock:
        _seen.clear()
